//! The conversation: its messages, its session and its name in the store, the turn loop's
//! prompt building (only the template's delta is tokenized), and the commands.

use std::io::Write;
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use engine::chat::Message;
use engine::sampling::Sampler;
use engine::store::{CheckpointMeta, Claim, SessionStore, OWNER_CHAT};
use engine::{GenerateParams, Model, Session, StopReason, StoreErrorKind};

use crate::args::check_session_name;

/// The application key under which the messages are kept in a checkpoint.
const MESSAGES_KEY: &str = "messages";

/// Commands, as `/help` lists them.
pub const HELP: &str = "\
/save NAME     save this conversation under NAME too (and go on under the current name)
/load NAME     switch to the conversation saved under NAME
/list          saved conversations: name, tokens, bytes it alone holds, last use
/branch NAME   go on from here under a new name NAME; the current one is kept as it is
/undo          take back the last turn (your message and the reply)
/delete NAME   delete the conversation NAME (not the current one)
/reset         start a new conversation under a new name; the current one is kept
/help          this list
/quit          leave (Ctrl-D too); Ctrl-C stops a reply";

/// What a line asked for.
pub enum Step {
    /// Go on reading lines.
    Continue,
    /// Leave.
    Quit,
}

/// One conversation in progress.
pub struct Chat {
    pub model: Arc<Model>,
    pub session: Session,
    pub sampler: Sampler,
    pub store: SessionStore,
    /// This process's claim on the conversation's name.
    claim: Claim,
    pub messages: Vec<Message>,
    /// Token counts at the end of each turn.
    turns: Vec<usize>,
    parent: Option<String>,
    system: Option<String>,
    gen: GenerateParams,
    /// Turns whose prompt was re-tokenized whole because the template did not extend the
    /// previous one.
    fallbacks: usize,
}

/// Why an error happened, with every cause whose text the message does not already hold.
pub fn why(e: impl Into<anyhow::Error>) -> String {
    let e = e.into();
    let mut text = String::new();
    for cause in e.chain() {
        let s = cause.to_string();
        if !text.contains(&s) {
            if !text.is_empty() {
                text.push_str(": ");
            }
            text.push_str(&s);
        }
    }
    text
}

/// "pid 123" or "another process", for a refused claim.
fn holder(e: &engine::Error) -> Option<String> {
    match e.busy_pids()? {
        [] => Some("another process".into()),
        pids => Some(format!(
            "pid {}",
            pids.iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}

/// The part of `name` a new name is made from: without a `-N` suffix.
fn base_name(name: &str) -> &str {
    match name.rsplit_once('-') {
        Some((base, n)) if !base.is_empty() && n.parse::<u32>().is_ok() => base,
        _ => name,
    }
}

/// Claims the first of `BASE-2`, `BASE-3`, ... that no checkpoint and no live process uses.
pub fn claim_new_name(store: &SessionStore, like: &str) -> Result<Claim> {
    let base = base_name(like);
    for k in 2..100_000u32 {
        let name = format!("{base}-{k}");
        if store.exists(&name)? {
            continue;
        }
        match store.claim(&name) {
            Ok(c) => return Ok(c),
            Err(e) if e.store_kind() == Some(StoreErrorKind::Busy) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    anyhow::bail!("no free conversation name like {base:?}")
}

/// Claims `name`, or says who holds it.
pub fn claim_name(store: &SessionStore, name: &str) -> Result<Claim, String> {
    store.claim(name).map_err(|e| match holder(&e) {
        Some(who) => format!("`{name}` is open in another chat ({who})"),
        None => format!("cannot claim `{name}`: {}", why(e)),
    })
}

impl Chat {
    /// A chat with an empty conversation named by `claim`.
    pub fn new(
        model: Arc<Model>,
        session: Session,
        sampler: Sampler,
        store: SessionStore,
        claim: Claim,
        system: Option<String>,
        gen: GenerateParams,
    ) -> Chat {
        let mut chat = Chat {
            model,
            session,
            sampler,
            store,
            claim,
            messages: Vec::new(),
            turns: Vec::new(),
            parent: None,
            system,
            gen,
            fallbacks: 0,
        };
        chat.messages = chat.initial_messages();
        chat
    }

    /// The conversation's name.
    pub fn name(&self) -> &str {
        self.claim.name()
    }

    /// How many turns re-tokenized the whole conversation.
    pub fn fallbacks(&self) -> usize {
        self.fallbacks
    }

    fn initial_messages(&self) -> Vec<Message> {
        self.system
            .iter()
            .map(|s| Message::new("system", s.as_str()))
            .collect()
    }

    /// Replaces the conversation with checkpoint `name` (the session is left as it was when
    /// this fails). Does not change the name.
    pub fn restore(&mut self, name: &str) -> Result<()> {
        // Another program's checkpoint (a server's `/slots` save) is not taken over: the chat's
        // next autosave would replace it.
        let (_, saved) = self.store.read_checkpoint(name)?;
        if let Some(owner) = saved.owner.filter(|o| o != OWNER_CHAT) {
            anyhow::bail!("`{name}` was saved by `{owner}`, not by the chat, and is left to it");
        }
        let t = Instant::now();
        let meta = self.store.restore(&mut self.session, name)?;
        let took = t.elapsed();
        self.messages = match meta.app.get(MESSAGES_KEY) {
            Some(json) => from_json(json).unwrap_or_else(|e| {
                eprintln!("(the messages of `{name}` are unreadable ({e}); its KV is restored)");
                self.initial_messages()
            }),
            None => self.initial_messages(),
        };
        if let Some(state) = &meta.sampler_state {
            self.sampler
                .set_rng_state(state)
                .context("the saved sampler state")?;
        }
        self.turns = meta.turns;
        self.parent = meta.parent;
        eprintln!(
            "(resumed `{name}`: {} messages, {} tokens restored from disk in {:.1} ms)",
            self.messages.len(),
            self.session.tokens().len(),
            took.as_secs_f64() * 1e3
        );
        for msg in &self.messages {
            eprintln!("{}: {}", msg.role, msg.content);
        }
        Ok(())
    }

    /// Moves this chat to another name (the old one's claim is released).
    pub fn rename(&mut self, claim: Claim) {
        self.claim = claim;
    }

    fn meta(&self) -> CheckpointMeta {
        CheckpointMeta {
            sampler_state: Some(self.sampler.rng_state()),
            turns: self.turns.clone(),
            app: [(MESSAGES_KEY.to_owned(), to_json(&self.messages))].into(),
            parent: self.parent.clone(),
            owner: Some(OWNER_CHAT.to_owned()),
            ..CheckpointMeta::default()
        }
    }

    /// Saves the conversation under `name`, and says so.
    fn save_as(&self, name: &str) -> Result<()> {
        let t = Instant::now();
        let saved = self.store.save(&self.session, name, &self.meta())?;
        eprintln!(
            "(saved `{name}`: {} tokens, {} new blocks, {} reused, {:.1} KiB written in {:.1} ms)",
            self.session.tokens().len(),
            saved.blocks_written,
            saved.blocks_reused,
            saved.bytes_written as f64 / 1024.0,
            t.elapsed().as_secs_f64() * 1e3
        );
        if !saved.evicted.is_empty() {
            eprintln!(
                "(disk budget: dropped the least recently used conversations {})",
                saved.evicted.join(", ")
            );
        }
        Ok(())
    }

    /// Saves under the current name; a failure is reported, not fatal.
    fn autosave(&self) {
        if let Err(e) = self.save_as(self.name()) {
            eprintln!("(could not save `{}`: {})", self.name(), why(e));
        }
    }

    /// The text the session's tokens stand for, when the conversation ends with a reply:
    /// the prompt that reply answered and the reply as generated.
    fn held_text(&self) -> Result<Option<String>> {
        match self.messages.split_last() {
            Some((last, before)) if last.role == "assistant" => {
                let prompt = self.model.chat_template().render(before, true)?;
                Ok(Some(prompt + &last.content))
            }
            _ => Ok(None),
        }
    }

    /// Adds the user's message to the session: only the tokens of the text the template adds
    /// after what the session holds (the reply's tokens stay as they were sampled). When the
    /// template does not extend its previous rendering, the whole prompt is tokenized again and
    /// the session kept up to the common prefix.
    fn feed_user(&mut self, text: &str) -> Result<()> {
        let held = if self.session.tokens().is_empty() {
            None
        } else {
            self.held_text()?
        };
        self.messages.push(Message::new("user", text));
        let prompt = self.model.chat_template().render(&self.messages, true)?;
        let tok = self.model.tokenizer();
        let before = self.session.tokens().len();
        let delta = held.as_deref().and_then(|h| prompt.strip_prefix(h));
        let (kept, ids) = if before == 0 {
            let ids = tok.encode(&prompt, true, true)?;
            // A new conversation may start like an earlier one (a long system prompt, say):
            // take the KV of the blocks the store already holds instead of computing them.
            let t = Instant::now();
            let reused = match self.store.restore_prefix(&mut self.session, &ids) {
                Ok(0) => 0,
                Ok(n) => {
                    eprintln!(
                        "(reused {n} prompt tokens from earlier conversations in {:.1} ms)",
                        t.elapsed().as_secs_f64() * 1e3
                    );
                    n
                }
                Err(e) => {
                    eprintln!("(could not reuse stored blocks: {})", why(e));
                    0
                }
            };
            (reused, ids[reused..].to_vec())
        } else if let Some(delta) = delta {
            (before, tok.encode(delta, false, true)?)
        } else {
            self.fallbacks += 1;
            eprintln!(
                "(the chat template does not extend the previous prompt: re-tokenizing the conversation)"
            );
            let ids = tok.encode(&prompt, true, true)?;
            let common = engine::common_prefix_len(self.session.tokens(), &ids)
                .min(ids.len().saturating_sub(1));
            self.session.truncate(common)?;
            (common, ids[common..].to_vec())
        };
        eprintln!("(prompt: {kept} tokens kept, {} new)", ids.len());
        self.session.feed(&ids)?;
        Ok(())
    }

    /// One turn: the user's `text`, the streamed reply, the autosave.
    pub fn turn(&mut self, text: &str, interrupted: &AtomicBool) -> Result<()> {
        let n_messages = self.messages.len();
        if let Err(e) = self.feed_user(text) {
            self.messages.truncate(n_messages);
            eprintln!("error: {}", why(e));
            return Ok(());
        }
        interrupted.store(false, Ordering::SeqCst);
        let mut out = std::io::stdout();
        let reply = self
            .session
            .generate(&mut self.sampler, &self.gen, |piece| {
                let _ = out.write_all(piece.as_bytes());
                let _ = out.flush();
                if interrupted.load(Ordering::SeqCst) {
                    ControlFlow::Break(())
                } else {
                    ControlFlow::Continue(())
                }
            })?;
        println!();
        match reply.stop {
            StopReason::Cancelled => eprintln!("(stopped)"),
            StopReason::ContextFull => {
                eprintln!("(context full: /undo, /reset or a larger --ctx to go on)")
            }
            StopReason::MaxTokens => eprintln!("(reply cut at {} tokens)", self.gen.max_tokens),
            _ => {}
        }
        // Kept as generated (not trimmed), so the next prompt extends exactly what the session
        // holds.
        self.messages.push(Message::new("assistant", reply.text));
        self.turns.push(self.session.tokens().len());
        self.autosave();
        Ok(())
    }

    /// Runs one command line (starting with `/`).
    pub fn command(&mut self, line: &str) -> Result<Step> {
        let (cmd, arg) = match line.split_once(char::is_whitespace) {
            Some((c, a)) => (c, a.trim()),
            None => (line, ""),
        };
        let needs_name = matches!(cmd, "/save" | "/load" | "/branch" | "/delete");
        if needs_name {
            if arg.is_empty() {
                eprintln!("(usage: {cmd} NAME)");
                return Ok(Step::Continue);
            }
            if let Err(e) = check_session_name(arg) {
                eprintln!("({e})");
                return Ok(Step::Continue);
            }
        }
        match cmd {
            "/quit" | "/exit" => return Ok(Step::Quit),
            "/help" => println!("{HELP}"),
            "/list" => self.list()?,
            "/save" => self.save_copy(arg, false)?,
            "/branch" => self.save_copy(arg, true)?,
            "/load" => self.load(arg)?,
            "/delete" => self.delete(arg)?,
            "/undo" => self.undo()?,
            "/reset" => self.reset()?,
            _ => eprintln!("(unknown command {cmd}; /help lists them)"),
        }
        Ok(Step::Continue)
    }

    fn list(&self) -> Result<()> {
        let mut all = self.store.checkpoints()?;
        all.sort_by(|a, b| {
            b.last_used_unix
                .cmp(&a.last_used_unix)
                .then(a.name.cmp(&b.name))
        });
        if all.is_empty() {
            println!("(no saved conversations)");
        }
        let now = kvstore::unix_now();
        for c in all {
            let mark = if c.name == self.name() { '*' } else { ' ' };
            println!(
                "{mark} {:<24} {:>7} tokens {:>10} own  {}",
                c.name,
                c.tokens,
                human_bytes(c.own_bytes),
                age(now.saturating_sub(c.last_used_unix))
            );
        }
        Ok(())
    }

    /// `/save NAME` (`switch` false) and `/branch NAME` (`switch` true).
    fn save_copy(&mut self, name: &str, switch: bool) -> Result<()> {
        if name == self.name() {
            eprintln!("(this conversation is `{name}` already)");
            return Ok(());
        }
        if self.store.exists(name)? {
            eprintln!("(`{name}` exists; /delete {name} first, or choose another name)");
            return Ok(());
        }
        let claim = match claim_name(&self.store, name) {
            Ok(c) => c,
            Err(msg) => {
                eprintln!("({msg})");
                return Ok(());
            }
        };
        let old = self.name().to_owned();
        if self.session.tokens().is_empty() {
            if switch {
                self.rename(claim);
                eprintln!("(nothing said yet; this conversation is now `{name}`)");
            } else {
                eprintln!("(nothing to save yet)");
            }
            return Ok(());
        }
        let parent = self.parent.replace(old.clone());
        let saved = self.save_as(name);
        if !switch || saved.is_err() {
            self.parent = parent;
        }
        if let Err(e) = saved {
            eprintln!("(could not save `{name}`: {})", why(e));
            return Ok(());
        }
        if switch {
            self.rename(claim);
            eprintln!("(now on `{name}`, branched from `{old}`, which is kept as it is)");
        }
        Ok(())
    }

    fn load(&mut self, name: &str) -> Result<()> {
        if name == self.name() {
            eprintln!("(this conversation is `{name}` already)");
            return Ok(());
        }
        if !self.store.exists(name)? {
            eprintln!("(no conversation `{name}`; /list shows them)");
            return Ok(());
        }
        let claim = match claim_name(&self.store, name) {
            Ok(c) => c,
            Err(msg) => {
                eprintln!("({msg})");
                return Ok(());
            }
        };
        match self.restore(name) {
            Ok(()) => {
                let old = self.name().to_owned();
                self.rename(claim);
                eprintln!("(now on `{name}`; `{old}` is kept)");
            }
            Err(e) => eprintln!(
                "(could not load `{name}`: {}; it is kept as it is, and `{}` goes on)",
                why(e),
                self.name()
            ),
        }
        Ok(())
    }

    fn delete(&mut self, name: &str) -> Result<()> {
        if name == self.name() {
            eprintln!("(`{name}` is the conversation in use; /reset or /load another first)");
            return Ok(());
        }
        if !self.store.exists(name)? {
            eprintln!("(no conversation `{name}`)");
            return Ok(());
        }
        match claim_name(&self.store, name) {
            Ok(_claim) => {
                self.store.delete(name)?;
                eprintln!("(deleted `{name}`)");
            }
            Err(msg) => eprintln!("({msg}; not deleted)"),
        }
        Ok(())
    }

    fn undo(&mut self) -> Result<()> {
        let Some(_) = self.turns.pop() else {
            eprintln!("(nothing to undo)");
            return Ok(());
        };
        let keep = self.turns.last().copied().unwrap_or(0);
        self.session.truncate(keep)?;
        // Drop the reply and the message it answered.
        while let Some(m) = self.messages.pop() {
            if m.role == "user" {
                break;
            }
        }
        eprintln!(
            "(took back the last turn: {} tokens, {} messages)",
            self.session.tokens().len(),
            self.messages.len()
        );
        self.autosave();
        Ok(())
    }

    fn reset(&mut self) -> Result<()> {
        let claim = claim_new_name(&self.store, self.name())?;
        let old = self.name().to_owned();
        self.rename(claim);
        self.session.clear();
        self.messages = self.initial_messages();
        self.turns.clear();
        self.parent = None;
        eprintln!(
            "(new conversation `{}`; `{old}` is kept: /load {old} to go back)",
            self.name()
        );
        Ok(())
    }
}

/// Bytes for people: `512 B`, `12.5 KiB`, `3.0 MiB`.
fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1} {}", UNITS[unit])
}

/// Seconds ago, for people.
fn age(secs: u64) -> String {
    match secs {
        0..=9 => "just now".into(),
        10..=119 => format!("{secs} s ago"),
        120..=7199 => format!("{} min ago", secs / 60),
        7200..=172_799 => format!("{} h ago", secs / 3600),
        _ => format!("{} days ago", secs / 86_400),
    }
}

fn to_json(messages: &[Message]) -> String {
    let list: Vec<_> = messages
        .iter()
        .map(|m| serde_json::json!({"role": m.role, "content": m.content}))
        .collect();
    serde_json::Value::Array(list).to_string()
}

fn from_json(json: &str) -> Result<Vec<Message>> {
    let value: serde_json::Value = serde_json::from_str(json).context("saved messages")?;
    let list = value.as_array().context("saved messages are not a list")?;
    list.iter()
        .map(|m| {
            let field = |k: &str| {
                m[k].as_str()
                    .map(str::to_owned)
                    .context("a saved message lacks a field")
            };
            Ok(Message::new(field("role")?, field("content")?))
        })
        .collect()
}
