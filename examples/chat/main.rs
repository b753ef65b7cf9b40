//! Interactive chat with a local model.
//!
//! ```text
//! cargo run --release --example chat [-- --model M --threads N --ctx N --temp 0.7 ...]
//! ```
//!
//! Type a message and press Enter; the reply streams as it is generated. Ctrl-C stops a reply
//! (the program keeps running); `/reset` starts over; `/quit` (or Ctrl-D) leaves. The default
//! model is fetched on first use.
//!
//! The conversation is saved as a checkpoint (KV cache, tokens, messages, sampler state) in
//! `--store` under `--session` after every reply; starting again resumes it from disk instead of
//! re-reading it. `--fresh` ignores the saved conversation. A new conversation whose prompt
//! begins like an earlier one (same system prompt, say) reuses the stored KV of that prefix.

use std::io::Write;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Parser;
use engine::chat::Message;
use engine::sampling::{Sampler, SamplerParams};
use engine::store::{CheckpointMeta, SessionStore, StoreConfig};
use engine::{GenerateParams, Model, Session, SessionParams, StopReason};
use rustyline::error::ReadlineError;

const DEFAULT_MODEL: &str = "models/SmolLM2-135M-Instruct.Q4_1.gguf";

#[derive(Parser)]
#[command(about = "Chat with a local llama-family model")]
struct Args {
    /// GGUF model file (the default one is fetched when missing).
    #[arg(long, default_value = DEFAULT_MODEL)]
    model: PathBuf,
    /// Threads for the kernels.
    #[arg(long, default_value_t = std::thread::available_parallelism().map_or(4, |n| n.get()))]
    threads: usize,
    /// Context window in tokens.
    #[arg(long, default_value_t = 4096)]
    ctx: usize,
    /// System prompt.
    #[arg(long)]
    system: Option<String>,
    /// Sampling temperature (0 = greedy).
    #[arg(long, default_value_t = 0.7)]
    temp: f32,
    /// Keep only the k most likely tokens (0 = off).
    #[arg(long, default_value_t = 40)]
    top_k: usize,
    /// Nucleus sampling threshold (1 = off).
    #[arg(long, default_value_t = 0.95)]
    top_p: f32,
    /// Drop tokens less likely than this fraction of the best (0 = off).
    #[arg(long, default_value_t = 0.05)]
    min_p: f32,
    /// Penalty for repeating recent tokens (1 = off).
    #[arg(long, default_value_t = 1.1)]
    repeat_penalty: f32,
    /// Random seed.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Longest reply in tokens.
    #[arg(long, default_value_t = 512)]
    max_tokens: usize,
    /// Directory of saved conversations.
    #[arg(long, default_value = "sessions")]
    store: PathBuf,
    /// Name of this conversation in the store.
    #[arg(long, default_value = "default")]
    session: String,
    /// Start a new conversation even if one is saved under this name.
    #[arg(long)]
    fresh: bool,
}

fn main() -> Result<()> {
    let args = Args::parse();
    ensure_model(&args.model)?;
    let model =
        Model::load(&args.model).with_context(|| format!("loading {}", args.model.display()))?;
    let params = SessionParams {
        n_ctx: args.ctx,
        n_threads: args.threads,
        ..SessionParams::default()
    };
    let mut session = Session::new(model.clone(), params)?;
    let mut sampler = Sampler::new(SamplerParams {
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
        ctrlc::set_handler(move || flag.store(true, Ordering::SeqCst))
            .context("installing the Ctrl-C handler")?;
    }

    let hp = model.hparams();
    eprintln!(
        "llama-hdd chat: {} ({} layers, {} vocab), {} threads, context {}. /reset, /quit; Ctrl-C stops a reply.",
        args.model.display(),
        hp.n_layer,
        hp.n_vocab,
        args.threads,
        session.params().n_ctx
    );
    let store = SessionStore::open(&args.store, &model, StoreConfig::default())
        .with_context(|| format!("opening the conversation store {}", args.store.display()))?;
    let mut messages = initial_messages(&args);
    if !args.fresh && store.exists(&args.session)? {
        let t = Instant::now();
        match store.restore(&mut session, &args.session) {
            Ok(m) => {
                let took = t.elapsed();
                if let Some(json) = m.app.get("messages") {
                    messages = from_json(json)?;
                }
                if let Some(state) = &m.sampler_state {
                    sampler.set_rng_state(state)?;
                }
                eprintln!(
                    "(resumed conversation `{}`: {} messages, {} tokens restored from disk in {:.1} ms)",
                    args.session,
                    messages.len(),
                    session.tokens().len(),
                    took.as_secs_f64() * 1e3
                );
                for msg in &messages {
                    eprintln!("{}: {}", msg.role, msg.content);
                }
            }
            Err(e) => eprintln!(
                "(could not resume `{}`: {e}; starting a new conversation)",
                args.session
            ),
        }
    }
    let mut editor = rustyline::DefaultEditor::new()?;
    loop {
        let line = match editor.readline("> ") {
            Ok(line) => line,
            Err(ReadlineError::Interrupted) => continue,
            Err(ReadlineError::Eof) => break,
            Err(e) => return Err(e.into()),
        };
        let input = line.trim();
        match input {
            "" => continue,
            "/quit" | "/exit" => break,
            "/reset" => {
                messages = initial_messages(&args);
                session.clear();
                if store.exists(&args.session)? {
                    store.delete(&args.session)?;
                }
                eprintln!("(conversation reset)");
                continue;
            }
            _ => {}
        }
        let _ = editor.add_history_entry(input);
        messages.push(Message::new("user", input));

        // Render the whole conversation and feed only what the session does not hold yet.
        let prompt = model.chat_template().render(&messages, true)?;
        let ids = model.tokenizer().encode(&prompt, true, true)?;
        if session.tokens().is_empty() {
            // A new conversation may start like an earlier one (a long system prompt, say):
            // take the KV of the blocks the store already holds instead of computing them.
            let t = Instant::now();
            match store.restore_prefix(&mut session, &ids) {
                Ok(0) => {}
                Ok(n) => eprintln!(
                    "(reused {n} prompt tokens from earlier conversations in {:.1} ms)",
                    t.elapsed().as_secs_f64() * 1e3
                ),
                Err(e) => eprintln!("(could not reuse stored blocks: {e})"),
            }
        }
        let common = session
            .tokens()
            .iter()
            .zip(&ids)
            .take_while(|(a, b)| a == b)
            .count();
        // Keep at least one token to evaluate, so there are fresh logits to sample from.
        let common = common.min(ids.len().saturating_sub(1));
        session.truncate(common);
        if let Err(e) = session.feed(&ids[common..]) {
            messages.pop();
            eprintln!("error: {e}");
            continue;
        }

        interrupted.store(false, Ordering::SeqCst);
        let gen = GenerateParams {
            max_tokens: args.max_tokens,
            stop_strings: Vec::new(),
        };
        let mut out = std::io::stdout();
        let reply = session.generate(&mut sampler, &gen, |piece| {
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
            StopReason::ContextFull => eprintln!("(context full: /reset to start over)"),
            StopReason::MaxTokens => eprintln!("(reply cut at {} tokens)", args.max_tokens),
            _ => {}
        }
        messages.push(Message::new("assistant", reply.text.trim()));

        let t = Instant::now();
        let meta = CheckpointMeta {
            sampler_state: Some(sampler.rng_state()),
            app: [("messages".to_owned(), to_json(&messages))].into(),
            ..CheckpointMeta::default()
        };
        match store.save(&session, &args.session, &meta) {
            Ok(saved) => eprintln!(
                "(saved: {} tokens, {} new blocks, {} reused, {:.1} KiB written in {:.1} ms)",
                session.tokens().len(),
                saved.blocks_written,
                saved.blocks_reused,
                saved.bytes_written as f64 / 1024.0,
                t.elapsed().as_secs_f64() * 1e3
            ),
            Err(e) => eprintln!("(could not save the conversation: {e})"),
        }
    }
    Ok(())
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

fn initial_messages(args: &Args) -> Vec<Message> {
    args.system
        .iter()
        .map(|s| Message::new("system", s.as_str()))
        .collect()
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
