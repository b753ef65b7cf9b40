//! The two halves of the kill harness (`cargo xtask crash-test`).
//!
//! `work` saves conversations through the chat's save path ([`SessionStore::save`]) forever:
//! now and then it restores a stored conversation or adds a few tokens to the one it holds, and
//! it saves that conversation under one of a few names again and again, sometimes deleting a
//! name instead. It prints `ready` once it has started. Before each change it appends an intent
//! line to a journal and syncs it; after the change returns it appends a done line. It is meant
//! to be killed (SIGKILL) at any moment.
//!
//! `check` runs after a kill. Every name must hold exactly the state its last done line records
//! (`old`), or the state its intent after that records (`new`: the kill came after the commit
//! but before the done line): anything else is a lost or corrupt checkpoint. A state is the
//! token count and a BLAKE3 digest of every K and V byte restored. The journal is then rewritten
//! (atomically) to what the store holds, and one JSON line reports the tally; the exit status is
//! 1 when anything was lost or corrupt.
//!
//! ```text
//! crashtest work  --model M --store DIR --journal FILE --seed S
//! crashtest check --model M --store DIR --journal FILE
//! ```

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context as _, Result};
use clap::{Parser, Subcommand};
use engine::store::{CheckpointMeta, SessionStore, StoreConfig};
use engine::{ContextParams, Model, Session};

#[derive(Parser)]
#[command(about = "Save conversations until killed, or check a store after a kill")]
struct Args {
    #[command(subcommand)]
    mode: Mode,
}

#[derive(Subcommand)]
enum Mode {
    /// Save, restore and delete conversations until killed.
    Work {
        #[command(flatten)]
        common: Common,
        /// Seed of the random choices.
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// Check every conversation against the journal; rewrite the journal to what was found.
    Check {
        #[command(flatten)]
        common: Common,
    },
}

#[derive(clap::Args)]
struct Common {
    /// GGUF model file.
    #[arg(long, default_value = "models/SmolLM2-135M-Instruct.Q4_1.gguf")]
    model: PathBuf,
    /// Store directory.
    #[arg(long)]
    store: PathBuf,
    /// Journal of intents and completions.
    #[arg(long)]
    journal: PathBuf,
}

/// Conversation names the worker cycles through.
const NAMES: usize = 4;
/// Context of each conversation; a conversation that would outgrow it starts afresh.
const N_CTX: usize = 512;
/// Disk budget: above what the conversations can reference, so gc runs but never evicts.
const DISK_BYTES: u64 = 256 << 20;

/// What a name holds: nothing, or a conversation of `tokens` tokens whose KV bytes digest to
/// `digest`.
#[derive(Clone, Debug, PartialEq, Eq)]
enum State {
    Absent,
    Present { tokens: usize, digest: String },
}

impl State {
    fn line(&self, kind: &str, name: &str) -> String {
        match self {
            State::Absent => format!("{kind} {name} -\n"),
            State::Present { tokens, digest } => format!("{kind} {name} {tokens} {digest}\n"),
        }
    }
}

fn params() -> ContextParams {
    ContextParams {
        n_ctx: N_CTX,
        n_threads: 1,
        ..ContextParams::default()
    }
}

fn open(c: &Common) -> Result<(Arc<Model>, SessionStore)> {
    let model = Model::load(&c.model).with_context(|| format!("loading {}", c.model.display()))?;
    let store = SessionStore::open(
        &c.store,
        &model,
        StoreConfig {
            disk_bytes: Some(DISK_BYTES),
            ..StoreConfig::default()
        },
    )?;
    Ok((model, store))
}

/// Token count and BLAKE3 of every K and V byte the session holds, layer by layer.
fn state_of(session: &Session) -> Result<State> {
    let n = session.tokens().len();
    let mut hasher = blake3::Hasher::new();
    hasher.update(token_bytes(session.tokens()).as_slice());
    hasher.update(&session.kv_bytes()?);
    Ok(State::Present {
        tokens: n,
        digest: hasher.finalize().to_hex().to_string(),
    })
}

fn token_bytes(tokens: &[u32]) -> Vec<u8> {
    tokens.iter().flat_map(|t| t.to_le_bytes()).collect()
}

/// Appends `line` to the journal and makes it durable before going on.
fn append(journal: &mut File, line: &str) -> Result<()> {
    journal.write_all(line.as_bytes())?;
    journal.sync_data()?;
    Ok(())
}

/// A small deterministic generator (xorshift64*), enough for choosing names and tokens.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }
}

fn work(c: &Common, seed: u64) -> Result<()> {
    let (model, store) = open(c)?;
    let n_vocab = model.hparams().n_vocab as u64;
    let mut journal = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&c.journal)?;
    let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let mut session = Session::new(model.clone(), params())?;
    // The harness starts its clock here, so kills land in the loop, not in the start-up.
    println!("ready");
    std::io::stdout().flush()?;
    let mut state = state_of(&session)?;
    loop {
        let name = format!("c{}", rng.below(NAMES as u64));
        match rng.below(10) {
            0 => {
                append(&mut journal, &State::Absent.line("I", &name))?;
                if store.exists(&name)? {
                    store.delete(&name)?;
                }
                append(&mut journal, &State::Absent.line("D", &name))?;
                continue;
            }
            // Continue from a stored conversation.
            1 if store.exists(&name)? => {
                store.restore(&mut session, &name)?;
                state = state_of(&session)?;
            }
            // A few tokens more (or a new conversation when this one is full).
            2..=4 => {
                let add = 1 + rng.below(24) as usize;
                if session.tokens().len() + add > N_CTX {
                    session.clear();
                }
                let tokens: Vec<u32> = (0..add)
                    .map(|_| (100 + rng.below(n_vocab - 200)) as u32)
                    .collect();
                session.feed(&tokens)?;
                state = state_of(&session)?;
            }
            // Otherwise the conversation is saved as it is: most of the time goes to saving.
            _ => {}
        }
        append(&mut journal, &state.line("I", &name))?;
        store.save(&session, &name, &CheckpointMeta::default())?;
        append(&mut journal, &state.line("D", &name))?;
    }
}

/// Per name: the state last completed and the one begun after it, if any.
fn read_journal(path: &Path) -> Result<BTreeMap<String, (State, Option<State>)>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let mut names: BTreeMap<String, (State, Option<State>)> = BTreeMap::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        let state = match f.as_slice() {
            [_, _, "-"] => State::Absent,
            [_, _, tokens, digest] => State::Present {
                tokens: tokens.parse()?,
                digest: (*digest).to_owned(),
            },
            // A line cut short by the kill: its change had not begun.
            _ => continue,
        };
        let entry = names
            .entry(f[1].to_owned())
            .or_insert((State::Absent, None));
        match f[0] {
            "I" => entry.1 = Some(state),
            "D" => *entry = (state, None),
            _ => continue,
        }
    }
    Ok(names)
}

fn check(c: &Common) -> Result<bool> {
    let (model, store) = open(c)?;
    let expected = read_journal(&c.journal)?;
    let (mut old, mut new, mut bad) = (0, 0, Vec::new());
    let interrupted = expected
        .values()
        .filter(|(_, begun)| begun.is_some())
        .count();
    let mut found = BTreeMap::new();
    for (name, (done, begun)) in &expected {
        let actual = if store.exists(name)? {
            let mut session = Session::new(model.clone(), params())?;
            match store.restore(&mut session, name) {
                Ok(_) => state_of(&session)?,
                Err(e) => {
                    bad.push(format!("{name}: restore failed: {e}"));
                    continue;
                }
            }
        } else {
            State::Absent
        };
        if actual == *done {
            old += 1;
        } else if Some(&actual) == begun.as_ref() {
            new += 1;
        } else {
            bad.push(format!(
                "{name}: holds {actual:?}, expected {done:?} or {begun:?}"
            ));
        }
        found.insert(name.clone(), actual);
    }
    // The journal from now on: what the store holds.
    let tmp = c.journal.with_extension("tmp");
    let mut f = File::create(&tmp)?;
    for (name, state) in &found {
        f.write_all(state.line("D", name).as_bytes())?;
    }
    f.sync_all()?;
    std::fs::rename(&tmp, &c.journal)?;
    println!(
        "{}",
        serde_json::json!({
            "interrupted": interrupted, "old": old, "new": new, "bad": bad.len(), "problems": bad
        })
    );
    Ok(bad.is_empty())
}

fn main() -> Result<std::process::ExitCode> {
    let args = Args::parse();
    match args.mode {
        Mode::Work { common, seed } => {
            work(&common, seed)?;
            Ok(std::process::ExitCode::SUCCESS)
        }
        Mode::Check { common } => Ok(if check(&common)? {
            std::process::ExitCode::SUCCESS
        } else {
            std::process::ExitCode::FAILURE
        }),
    }
}
