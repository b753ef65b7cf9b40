//! The conversations the server finished, per tenant, as the web page lists them: each chat's
//! messages with its last reply, how many tokens it came to, when it started and when it was
//! last continued, and the last turn's cache figures.
//!
//! A turn whose messages start with a known conversation's messages (its reply included)
//! continues that conversation: the entry is replaced and keeps its id. Each entry is also a
//! small file (`conversations/<model>/<id>.json` in the cache directory, written whole then
//! renamed into place) so the list survives a restart; an unreadable file is skipped and
//! removed. The files are written by a thread of the list's own, in the order of the changes,
//! so no caller waits on the disk. Like the text index, this is a convenience beside the
//! prompt cache, not part of it: a conversation listed here may have been evicted from the
//! cache, and forgetting one here deletes no block.

use std::path::PathBuf;
use std::sync::mpsc;
use std::thread::JoinHandle;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The figures of a conversation's last turn, as its reply's `timings` said them.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct TurnFigures {
    /// Prompt tokens whose KV came from a cache (RAM or disk).
    pub cache_n: usize,
    /// Prompt tokens evaluated.
    pub prompt_n: usize,
    /// Time from admission to the first token (restoring and evaluating the prompt).
    pub prompt_ms: f64,
    /// Tokens generated.
    pub predicted_n: usize,
    /// Time spent generating them.
    pub predicted_ms: f64,
}

/// One conversation, as stored and listed.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Conversation {
    /// Its id, kept while the conversation goes on.
    pub id: String,
    /// The tenant it belongs to (`None`: the server has no keys, or shares one cache).
    pub owner: Option<String>,
    /// OpenAI-style messages, the last reply included.
    pub messages: Vec<Value>,
    /// Tokens of prompt and reply at its last turn.
    pub tokens: usize,
    /// When it started (Unix seconds).
    pub created_unix: u64,
    /// When its last turn finished (Unix seconds).
    pub last_used_unix: u64,
    /// The last turn's figures.
    pub last: TurnFigures,
}

/// The list (see the module docs).
#[derive(Debug)]
pub struct Conversations {
    entries: Vec<Conversation>,
    capacity: usize,
    files: Option<Writer>,
}

impl Conversations {
    /// A list of at most `capacity` conversations (least recently used dropped first), kept in
    /// memory only.
    pub fn new(capacity: usize) -> Conversations {
        Conversations {
            entries: Vec::new(),
            capacity,
            files: None,
        }
    }

    /// A list kept in `dir` as well (created when missing), read back from it.
    pub fn open(dir: PathBuf, capacity: usize) -> Conversations {
        let mut list = Conversations::new(capacity);
        let _ = std::fs::create_dir_all(&dir);
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.extension().is_none_or(|x| x != "json") {
                continue;
            }
            let read = std::fs::read(&path)
                .ok()
                .and_then(|b| serde_json::from_slice::<Conversation>(&b).ok())
                .filter(|c| id_ok(&c.id) && path.file_stem() == Some(c.id.as_ref()));
            match read {
                Some(c) => list.entries.push(c),
                None => {
                    let _ = std::fs::remove_file(&path);
                }
            }
        }
        list.entries.sort_by_key(|c| c.last_used_unix);
        list.files = Writer::start(dir);
        while list.entries.len() > capacity {
            let old = list.entries.remove(0);
            list.send(Op::Remove(old.id));
        }
        list
    }

    /// Records a finished turn of `owner`'s: `messages` (the reply last) came to `tokens`
    /// tokens. It continues the longest known conversation of the same owner whose messages
    /// it starts with. Returns the conversation's id.
    pub fn record(
        &mut self,
        owner: Option<&str>,
        messages: Vec<Value>,
        tokens: usize,
        last: TurnFigures,
        now_unix: u64,
    ) -> String {
        let continued = self
            .entries
            .iter()
            .enumerate()
            .filter(|(_, c)| c.owner.as_deref() == owner && starts_with(&messages, &c.messages))
            .max_by_key(|(_, c)| c.messages.len())
            .map(|(i, _)| i);
        let (id, created_unix) = match continued {
            Some(i) => {
                let old = self.entries.remove(i);
                (old.id, old.created_unix)
            }
            None => (new_id(owner, &messages), now_unix),
        };
        if self.entries.len() >= self.capacity && !self.entries.is_empty() {
            let old = self.entries.remove(0);
            self.send(Op::Remove(old.id));
        }
        let c = Conversation {
            id: id.clone(),
            owner: owner.map(str::to_owned),
            messages,
            tokens,
            created_unix,
            last_used_unix: now_unix,
            last,
        };
        if let Ok(body) = serde_json::to_vec(&c) {
            self.send(Op::Write(id.clone(), body));
        }
        self.entries.push(c);
        id
    }

    /// `owner`'s conversations, the most recently continued first.
    pub fn list(&self, owner: Option<&str>) -> Vec<Conversation> {
        self.entries
            .iter()
            .rev()
            .filter(|c| c.owner.as_deref() == owner)
            .cloned()
            .collect()
    }

    /// Forgets `owner`'s conversation `id` (its cached prompt stays); false when `owner` has
    /// no such conversation.
    pub fn forget(&mut self, owner: Option<&str>, id: &str) -> bool {
        let Some(i) = self
            .entries
            .iter()
            .position(|c| c.id == id && c.owner.as_deref() == owner)
        else {
            return false;
        };
        let old = self.entries.remove(i);
        self.send(Op::Remove(old.id));
        true
    }

    fn send(&self, op: Op) {
        if let Some(w) = &self.files {
            w.send(op);
        }
    }
}

/// Whether `messages` starts with every message of `known` (compared by role and text, so a
/// client that sends a reply back without its reasoning or with its spaces trimmed still
/// continues it).
fn starts_with(messages: &[Value], known: &[Value]) -> bool {
    known.len() <= messages.len()
        && known
            .iter()
            .zip(messages)
            .all(|(a, b)| role(a) == role(b) && text(a).trim() == text(b).trim())
}

fn role(m: &Value) -> &str {
    m.get("role").and_then(Value::as_str).unwrap_or("")
}

/// A message's text: its string content, or its text parts joined.
pub fn text(m: &Value) -> String {
    match m.get("content") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect(),
        _ => String::new(),
    }
}

/// A fresh id: 24 hexadecimal digits from the owner, the messages and the time.
fn new_id(owner: Option<&str>, messages: &[Value]) -> String {
    let mut h = blake3::Hasher::new();
    h.update(owner.unwrap_or("").as_bytes());
    h.update(&kvstore::since_epoch().as_nanos().to_le_bytes());
    for m in messages {
        h.update(m.to_string().as_bytes());
    }
    h.finalize().to_hex()[..24].to_owned()
}

/// Whether `id` can be a file name of ours (what [`new_id`] makes).
pub fn id_ok(id: &str) -> bool {
    id.len() == 24 && id.bytes().all(|b| b.is_ascii_hexdigit())
}

/// A change to the list's files.
#[derive(Debug)]
enum Op {
    Write(String, Vec<u8>),
    Remove(String),
}

/// The thread that applies [`Op`]s in order; dropping it waits for those sent.
#[derive(Debug)]
struct Writer {
    tx: Option<mpsc::Sender<Op>>,
    thread: Option<JoinHandle<()>>,
}

impl Writer {
    /// A writer into `dir`, or `None` (the list stays in memory) when no thread can start.
    fn start(dir: PathBuf) -> Option<Writer> {
        let (tx, rx) = mpsc::channel::<Op>();
        let thread = std::thread::Builder::new()
            .name("conversations".into())
            .spawn(move || {
                for op in rx {
                    match op {
                        Op::Write(id, body) => {
                            let path = dir.join(format!("{id}.json"));
                            let tmp = path.with_extension(format!("tmp{}", std::process::id()));
                            if std::fs::write(&tmp, body).is_err()
                                || std::fs::rename(&tmp, &path).is_err()
                            {
                                let _ = std::fs::remove_file(&tmp);
                            }
                        }
                        Op::Remove(id) => {
                            let _ = std::fs::remove_file(dir.join(format!("{id}.json")));
                        }
                    }
                }
            })
            .ok()?;
        Some(Writer {
            tx: Some(tx),
            thread: Some(thread),
        })
    }

    fn send(&self, op: Op) {
        if let Some(tx) = &self.tx {
            let _ = tx.send(op);
        }
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        drop(self.tx.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn msg(role: &str, text: &str) -> Value {
        json!({ "role": role, "content": text })
    }

    #[test]
    fn a_turn_continues_its_conversation_and_owners_stay_apart() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c");
        let mut list = Conversations::open(path.clone(), 8);
        let first = vec![msg("user", "hi"), msg("assistant", "hello ")];
        let a = list.record(Some("t1"), first.clone(), 10, TurnFigures::default(), 100);
        let b = list.record(Some("t2"), first.clone(), 10, TurnFigures::default(), 101);
        assert_ne!(a, b);
        let mut next = first.clone();
        next[1] = json!({ "role": "assistant", "content": [{ "type": "text", "text": "hello" }] });
        next.extend([msg("user", "more"), msg("assistant", "sure")]);
        let figures = TurnFigures {
            cache_n: 9,
            ..TurnFigures::default()
        };
        assert_eq!(list.record(Some("t1"), next, 20, figures, 102), a);
        assert_eq!(list.list(Some("t1")).len(), 1);
        assert_eq!(list.list(Some("t2")).len(), 1);
        assert!(list.list(None).is_empty());
        assert!(
            !list.forget(Some("t2"), &a),
            "another owner's id is unknown"
        );
        drop(list);
        std::fs::write(path.join("0123456789abcdef01234567.json"), b"{").unwrap();
        let mut list = Conversations::open(path.clone(), 8);
        let t1 = list.list(Some("t1"));
        assert_eq!((t1.len(), t1[0].tokens, t1[0].last), (1, 20, figures));
        assert_eq!(t1[0].created_unix, 100);
        assert!(list.forget(Some("t2"), &b));
        drop(list);
        assert_eq!(std::fs::read_dir(&path).unwrap().count(), 1);
    }

    #[test]
    fn the_least_recently_used_goes_past_capacity() {
        let mut list = Conversations::new(2);
        for (i, t) in ["a", "b", "c"].iter().enumerate() {
            list.record(
                None,
                vec![msg("user", t)],
                1,
                TurnFigures::default(),
                i as u64,
            );
        }
        let texts: Vec<String> = list
            .list(None)
            .iter()
            .map(|c| text(&c.messages[0]))
            .collect();
        assert_eq!(texts, ["c", "b"]);
    }
}
