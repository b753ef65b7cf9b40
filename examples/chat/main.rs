//! Interactive chat with a local model.
//!
//! ```text
//! cargo run --release --example chat [-- --model M --threads N --ctx N --temp 0.7 ...]
//! printf 'hi\n/quit\n' | cargo run --release --example chat -- --store DIR --session NAME
//! ```
//!
//! Type a message and press Enter; the reply streams as it is generated (on standard output;
//! status lines go to standard error). Ctrl-C stops a reply (the program keeps running);
//! `/help` lists the commands; `/quit` (or Ctrl-D, or the end of piped input) leaves. The
//! default model is fetched on first use.
//!
//! The conversation is saved as a checkpoint (KV cache, tokens, messages, sampler state) in
//! `--store` (by default `chat/` in the user's cache directory; an existing `./store`, the
//! earlier default, is offered on a terminal) under `--session` after every reply; starting again resumes it from disk instead of
//! re-reading it. Nothing is deleted unless asked (`/delete`): `--fresh`, `/reset`, a
//! conversation that cannot be resumed and a name another chat has open all lead to a new name
//! (`NAME-2`, `NAME-3`, ...), the old conversation kept as it is. A new conversation whose
//! prompt begins like an earlier one (same system prompt, say) reuses the stored KV of that
//! prefix.

mod args;
mod chat;
#[path = "../common/args.rs"]
mod common_args;
mod input;

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::Parser;
use engine::sampling::{Sampler, SamplerParams};
use engine::store::{SessionStore, StoreConfig};
use engine::{GenerateParams, Session};
use kvstore::legacy::{self, Layout};

use crate::args::{default_store, Args, DEFAULT_MODEL, EARLIER_STORE};
use crate::chat::{claim_name, claim_new_name, why, Chat, Step};
use crate::input::Input;

/// Where earlier versions saved conversations (a bare checkpoint directory).
const LEGACY_STORE: &str = "sessions";

/// Written into a store once a legacy directory's conversations were copied into it.
const MIGRATED_MARKER: &str = "migrated-from-legacy";

fn main() -> Result<()> {
    // Model files are untrusted: their chat templates render in a child process with limits.
    engine::chat::sandbox::init();
    let args = Args::parse_from(engine::expand_llama_cpp_flags(std::env::args_os()));
    ensure_model(&args.model.path)?;
    let store_dir = match &args.store {
        Some(dir) => dir.clone(),
        None => choose_default_store()?,
    };
    migrate_legacy(&store_dir, args.store.is_none());

    let model = args.model.load()?;
    // Before the session, which needs it: unchanged since the last start, the file is not
    // hashed again.
    model.remember_fingerprint(&store_dir);
    let params = engine::ContextParams {
        kv_ram: args.kv_ram.map_or(0, |b| b as usize),
        ..args.kv.context(&args.model, args.ctx)
    };
    let mut session = Session::new(model.clone(), params)?;
    let sampler = Sampler::new(SamplerParams {
        temperature: args.temp,
        top_k: args.top_k,
        top_p: args.top_p,
        min_p: args.min_p,
        repeat_penalty: args.repeat_penalty,
        seed: args.seed,
        ..SamplerParams::default()
    });

    let interrupted = Arc::new(AtomicBool::new(false));
    {
        let flag = interrupted.clone();
        ctrlc::set_handler(move || flag.store(true, std::sync::atomic::Ordering::SeqCst))
            .context("installing the Ctrl-C handler")?;
    }

    let hp = model.hparams();
    eprintln!(
        "llama-hdd chat: {} ({} layers, {} vocab), {} threads, context {}. /help lists the commands; Ctrl-C stops a reply.",
        args.model.path.display(),
        hp.n_layer,
        hp.n_vocab,
        args.model.threads,
        session.params().n_ctx
    );
    let store = open_store(&args, &store_dir, &model)?;
    if args.kv_ram.is_some() {
        // Pages past the budget go to the conversation store.
        session
            .context_mut()
            .spill_to(&store)
            .context("giving the KV cache the store to spill to")?;
    }

    // The name: the one asked for, unless it is taken (another chat has it open, or --fresh
    // and a conversation is saved under it).
    let requested = args.session.as_str();
    let (claim, resume, announced) = match claim_name(&store, requested) {
        Ok(claim) => {
            let exists = store.exists(requested)?;
            if args.fresh && exists {
                let claim = claim_new_name(&store, requested)?;
                eprintln!(
                    "(new conversation `{}`; `{requested}` is kept: /load {requested} to go back)",
                    claim.name()
                );
                (claim, false, true)
            } else {
                (claim, exists, false)
            }
        }
        Err(msg) => {
            let claim = claim_new_name(&store, requested)?;
            eprintln!(
                "({msg}; this chat goes on as `{}`, and leaves `{requested}` to it)",
                claim.name()
            );
            (claim, false, true)
        }
    };
    let gen = GenerateParams {
        max_tokens: args.max_tokens,
        stop_strings: Vec::new(),
    };
    let mut chat = Chat::new(
        model,
        session,
        sampler,
        store,
        claim,
        args.system.clone(),
        gen,
    );
    if resume {
        if let Err(e) = chat.restore(requested) {
            let claim = claim_new_name(&chat.store, requested)?;
            eprintln!(
                "(could not resume `{requested}`: {}; it is kept as it is. This chat goes on as `{}`)",
                why(e),
                claim.name()
            );
            chat.rename(claim);
        }
    } else if !announced {
        eprintln!("(new conversation `{}`)", chat.name());
    }

    let mut input = Input::from_stdin()?;
    while let Some(line) = input.next_line()? {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        input.remember(line);
        if line.starts_with('/') {
            match chat.command(line)? {
                Step::Quit => break,
                Step::Continue => continue,
            }
        }
        chat.turn(line, &interrupted)?;
    }
    if chat.fallbacks() > 0 {
        eprintln!(
            "({} turns re-tokenized the whole conversation: the chat template does not extend earlier prompts)",
            chat.fallbacks()
        );
    }
    chat.store.flush()?;
    Ok(())
}

/// The conversation store at `store_dir` for `model`, with the options' budgets, cache types
/// and remote tier; a conversation saved elsewhere under `--session` is fetched from the
/// remote tier.
fn open_store(args: &Args, store_dir: &Path, model: &engine::Model) -> Result<SessionStore> {
    let base = StoreConfig {
        ram_bytes: args.cache_ram,
        disk_bytes: args.cache_disk,
        remote: args
            .remote
            .config()
            .map_err(|(option, reason)| anyhow::anyhow!("{option}: {reason}"))?,
        ..StoreConfig::default()
    };
    let config = args.kv.store(args.cache_type_stored, base);
    let store = SessionStore::open(store_dir, model, config).map_err(|e| {
        let hint = match &e {
            // `--cache-type-stored` sets K and V alike.
            engine::Error::KvTypeMismatch {
                stored_k, stored_v, ..
            } if stored_k == stored_v => format!(
                " (use the store's cache types, or --cache-type-stored {stored_k} to convert)"
            ),
            engine::Error::KvTypeMismatch { .. } => " (use the store's cache types)".to_owned(),
            _ => String::new(),
        };
        anyhow::Error::new(e).context(format!(
            "opening the conversation store {}{hint}",
            store_dir.display()
        ))
    })?;
    if let Some(old) = store.legacy_store() {
        eprintln!("note: {old}");
    }
    store.set_remote_log(|line| eprintln!("{line}"));
    // A conversation saved on another machine sharing the remote tier resumes here too.
    store.fetch_remote_checkpoint(&args.session);
    Ok(store)
}

/// The store without `--store`: [`default_store`], or `./store` (where earlier versions saved
/// conversations) when it exists and the user, asked on the terminal, takes it. Never silently:
/// without a terminal to ask on, the chat says how to use `./store` and goes on with the
/// default.
fn choose_default_store() -> Result<PathBuf> {
    let default = default_store();
    if !Path::new(EARLIER_STORE).is_dir() {
        return Ok(default);
    }
    let stdin = std::io::stdin();
    if !stdin.is_terminal() {
        eprintln!(
            "(./{EARLIER_STORE} exists (earlier versions saved conversations there); \
             `--store {EARLIER_STORE}` uses it. This chat uses {})",
            default.display()
        );
        return Ok(default);
    }
    eprint!(
        "./{EARLIER_STORE} exists (earlier versions saved conversations there); the default \
         store is now {}. Use ./{EARLIER_STORE}? [Y/n] ",
        default.display()
    );
    let mut answer = String::new();
    stdin.read_line(&mut answer).context("reading the answer")?;
    Ok(if answer.trim().to_lowercase().starts_with('n') {
        default
    } else {
        PathBuf::from(EARLIER_STORE)
    })
}

/// Copies the conversations of a bare checkpoint directory written by earlier versions into the
/// store at `store`: the directory itself when it is one (the old files stay beside the new
/// layout), or `sessions/` when the default store is used. Runs once per store; problems are
/// reported, and the chat goes on.
fn migrate_legacy(store: &Path, default_store: bool) {
    let in_place = legacy::holds_legacy(store);
    let source = if in_place {
        store.to_path_buf()
    } else if default_store
        && legacy::detect_local(Path::new(LEGACY_STORE)) == Layout::LegacyCkptfmt
    {
        PathBuf::from(LEGACY_STORE)
    } else {
        return;
    };
    let marker = store.join(MIGRATED_MARKER);
    if marker.exists() {
        return;
    }
    eprintln!(
        "({} holds conversations saved by an earlier version; copying them into {} ...)",
        source.display(),
        store.display()
    );
    let run = || -> Result<legacy::MigrationReport> {
        let kv = kvstore::KvStore::open(store, kvstore::Config::default())?;
        let report = legacy::migrate(&source, &kv)?;
        kv.close()?;
        std::fs::write(&marker, report.migrated.join("\n") + "\n")
            .with_context(|| format!("writing {}", marker.display()))?;
        Ok(report)
    };
    match run() {
        Ok(report) => {
            eprintln!(
                "(migrated {} conversations: {})",
                report.migrated.len(),
                report.migrated.join(", ")
            );
            for (name, reason) in &report.skipped {
                eprintln!("(not migrated: `{name}`: {reason})");
            }
            let old = if in_place {
                format!(
                    "the old files of {} (store.ckpt, blocks/, manifests/)",
                    source.display()
                )
            } else {
                source.display().to_string()
            };
            eprintln!(
                "({old} are left as they were; delete them once satisfied. Conversations of another model or an earlier KV layout cannot be resumed with this one.)"
            );
        }
        Err(e) => eprintln!(
            "(could not migrate {}: {}; it is left as it was, and the next start tries again)",
            source.display(),
            why(e)
        ),
    }
}

/// Fetches the default model with `cargo xtask fetch-model` when it is missing.
fn ensure_model(path: &Path) -> Result<()> {
    if path.exists() {
        return Ok(());
    }
    if path != Path::new(DEFAULT_MODEL) {
        bail!("model file {} not found", path.display());
    }
    eprintln!(
        "{} is missing; fetching it (about 90 MB)...",
        path.display()
    );
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = std::process::Command::new(cargo)
        .args(["xtask", "fetch-model"])
        .status()
        .context("running `cargo xtask fetch-model`")?;
    if !status.success() || !path.exists() {
        bail!("could not fetch the model; run `cargo xtask fetch-model` from the repository root");
    }
    Ok(())
}
