//! Conversations as text with the tokens the model saw, kept beside the prompt cache.
//!
//! A chat's next turn repeats the earlier turns as text, and tokenizing a sampled reply again
//! may give other tokens than those sampled (which would end the cached prefix at the reply).
//! A prompt that starts with a known text takes its tokens from here and tokenizes only the
//! rest. Each entry is also a small file (`texts/<model>/<hash>.json` in the cache directory,
//! written whole then renamed into place), so after a restart the blocks stored under the
//! sampled tokens are found again; an unreadable file is skipped, never trusted. The files are
//! written and removed by a thread of the index's own, in the order of the changes, so that
//! no caller (a server's async worker) waits on the disk.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::thread::JoinHandle;

use serde::{Deserialize, Serialize};

/// One conversation's text and tokens, as stored.
#[derive(Serialize, Deserialize)]
struct Stored {
    text: String,
    tokens: Vec<u32>,
}

/// The index (see the module docs).
#[derive(Debug)]
pub struct TextIndex {
    entries: VecDeque<(String, Vec<u32>)>,
    capacity: usize,
    /// The thread that keeps entries as files (`None`: in memory only).
    files: Option<FileWriter>,
    /// Lookups that found an entry.
    pub hits: u64,
    /// Lookups where the entry's tokens differ from the text tokenized again.
    pub retokenize_mismatches: u64,
    /// Entries found in the remote tier (another replica's conversations).
    pub remote_hits: u64,
    /// Entries read back from disk at start.
    pub loaded: usize,
}

impl TextIndex {
    /// An index of at most `capacity` conversations (oldest dropped first), in memory only.
    pub fn new(capacity: usize) -> TextIndex {
        TextIndex {
            entries: VecDeque::new(),
            capacity,
            files: None,
            hits: 0,
            retokenize_mismatches: 0,
            remote_hits: 0,
            loaded: 0,
        }
    }

    /// An index kept in `dir` as well (created when missing): the newest `capacity` entries
    /// found there are read back; older ones are removed.
    pub fn open(dir: PathBuf, capacity: usize) -> TextIndex {
        let mut index = TextIndex::new(capacity);
        let _ = std::fs::create_dir_all(&dir);
        let mut files: Vec<(std::time::SystemTime, PathBuf)> = std::fs::read_dir(&dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
            .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
            .collect();
        // Newest first: the newest `capacity` readable entries stay, the rest go.
        files.sort_by(|a, b| b.cmp(a));
        for (_, path) in &files {
            let read = (index.entries.len() < capacity)
                .then(|| std::fs::read(path).ok())
                .flatten()
                .and_then(|b| serde_json::from_slice::<Stored>(&b).ok());
            match read {
                Some(s) if !s.text.is_empty() && !s.tokens.is_empty() => {
                    index.entries.push_front((s.text, s.tokens));
                }
                _ => {
                    let _ = std::fs::remove_file(path);
                }
            }
        }
        index.loaded = index.entries.len();
        index.files = FileWriter::start(dir);
        index
    }

    /// Remembers that `text` was evaluated as `tokens`; the entries it extends are dropped.
    pub fn insert(&mut self, text: String, tokens: Vec<u32>) {
        if text.is_empty() || tokens.is_empty() {
            return;
        }
        let files = self.files.as_ref();
        let forget = |t: &str| {
            if let Some(f) = files {
                f.send(FileOp::Remove(t.to_owned()));
            }
        };
        self.entries.retain(|(t, _)| {
            let extended = text.starts_with(t.as_str());
            if extended {
                forget(t);
            }
            !extended
        });
        if self.entries.len() >= self.capacity {
            if let Some((old, _)) = self.entries.pop_front() {
                forget(&old);
            }
        }
        if let Some(f) = &self.files {
            f.send(FileOp::Write(text.clone(), tokens.clone()));
        }
        self.entries.push_back((text, tokens));
    }

    /// The longest known text that `text` starts with: its length in bytes and its tokens.
    pub fn longest_prefix(&mut self, text: &str) -> Option<(usize, Vec<u32>)> {
        let (i, _) = self
            .entries
            .iter()
            .enumerate()
            .filter(|(_, (t, _))| text.starts_with(t.as_str()))
            .max_by_key(|(_, (t, _))| t.len())?;
        let entry = self.entries.remove(i)?;
        let found = (entry.0.len(), entry.1.clone());
        self.entries.push_back(entry);
        self.hits += 1;
        Some(found)
    }
}

/// A change to the index's files.
#[derive(Debug)]
enum FileOp {
    Write(String, Vec<u32>),
    Remove(String),
}

/// The thread that applies [`FileOp`]s in order; dropping it waits for those sent.
#[derive(Debug)]
struct FileWriter {
    tx: Option<mpsc::Sender<FileOp>>,
    thread: Option<JoinHandle<()>>,
}

impl FileWriter {
    /// A writer into `dir`, or `None` (the index stays in memory) when no thread can start.
    fn start(dir: PathBuf) -> Option<FileWriter> {
        let (tx, rx) = mpsc::channel::<FileOp>();
        let thread = std::thread::Builder::new()
            .name("text-index".into())
            .spawn(move || {
                for op in rx {
                    match op {
                        FileOp::Write(text, tokens) => write(&dir, &text, &tokens),
                        FileOp::Remove(text) => {
                            let _ = std::fs::remove_file(file_of(&dir, &text));
                        }
                    }
                }
            })
            .ok()?;
        Some(FileWriter {
            tx: Some(tx),
            thread: Some(thread),
        })
    }

    fn send(&self, op: FileOp) {
        if let Some(tx) = &self.tx {
            let _ = tx.send(op);
        }
    }
}

impl Drop for FileWriter {
    fn drop(&mut self) {
        drop(self.tx.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Kind of the remote tier's values that hold entries
/// ([`engine::store::SessionStore::push_remote_values`]).
pub const REMOTE_KIND: &str = "text";

/// The remote tier's name and value of the entry for `text`: replicas that share a Redis find
/// a conversation's tokens wherever its last turn was served.
pub fn remote_entry(text: &str, tokens: &[u32]) -> Option<(String, Vec<u8>)> {
    let body = serde_json::to_vec(&Stored {
        text: text.to_owned(),
        tokens: tokens.to_vec(),
    })
    .ok()?;
    Some((remote_name(text), body))
}

/// The remote tier's name of the entry for `text`.
pub fn remote_name(text: &str) -> String {
    blake3::hash(text.as_bytes()).to_hex().to_string()
}

/// The tokens in a remote entry, when it is the entry of exactly `text` (a value that does not
/// parse or names another text is not used).
pub fn remote_tokens(text: &str, value: &[u8]) -> Option<Vec<u32>> {
    let stored: Stored = serde_json::from_slice(value).ok()?;
    (stored.text == text && !stored.tokens.is_empty()).then_some(stored.tokens)
}

/// The file of the entry for `text`.
fn file_of(dir: &Path, text: &str) -> PathBuf {
    let hash = blake3::hash(text.as_bytes()).to_hex();
    dir.join(format!("{}.json", &hash[..32]))
}

/// Writes the entry whole to a temporary file, then renames it into place (a cache: no sync;
/// a torn file fails to parse and is skipped at the next start).
fn write(dir: &Path, text: &str, tokens: &[u32]) {
    let path = file_of(dir, text);
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let body = serde_json::to_vec(&Stored {
        text: text.to_owned(),
        tokens: tokens.to_vec(),
    });
    if let Ok(body) = body {
        if std::fs::write(&tmp, body).is_ok() && std::fs::rename(&tmp, &path).is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_survive_a_reopen_and_extended_ones_are_forgotten() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("texts");
        let mut a = TextIndex::open(path.clone(), 2);
        a.insert("hello".into(), vec![1, 2]);
        a.insert("hello world".into(), vec![1, 2, 3]);
        a.insert("other".into(), vec![9]);
        drop(a);
        let files = std::fs::read_dir(&path).unwrap().count();
        assert_eq!(files, 2, "the extended entry's file is gone");
        // A torn file is skipped and removed.
        std::fs::write(path.join("0000.json"), b"{\"text\": \"x").unwrap();
        let mut b = TextIndex::open(path.clone(), 2);
        assert_eq!(b.loaded, 2);
        assert_eq!(
            b.longest_prefix("hello world, again"),
            Some((11, vec![1, 2, 3]))
        );
        assert_eq!(b.longest_prefix("other one"), Some((5, vec![9])));
        assert!(!path.join("0000.json").exists());
        // Capacity: the oldest goes, file and all.
        b.insert("third".into(), vec![4]);
        drop(b);
        let c = TextIndex::open(path, 2);
        assert_eq!(c.loaded, 2);
    }
}
