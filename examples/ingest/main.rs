//! Reads a long document into a model, resumably, then chats about it.
//!
//! ```text
//! cargo run --release --example ingest -- FILE [--store DIR --ctx N --interval N --no-chat]
//! ```
//!
//! The document is evaluated in micro-batches with a durable checkpoint every `--interval`
//! tokens in `--store`; a progress bar shows tokens, tokens/s and the time left. Ctrl-C stops
//! after the current micro-batch with everything read so far saved (exit status 130); running
//! the same command again resumes from the last checkpoint (the longest stored prefix of the
//! document, or the shifted checkpoint), so a crash or a kill costs at most one interval. A
//! document that changed resumes up to where it changed. A document longer than `--ctx` is read
//! to its end with context shifts (`--help` says what is kept). A failed save (a full disk)
//! stops the reading with an error and exit status 1; what was saved before stays resumable. Then, unless `--no-chat`, questions about the document are read from standard input,
//! one a line, and answered on standard output. The last line on standard output is JSON:
//! `{"tokens": total, "restored": from the store, "computed": evaluated, "shifts": shifts}`.

use std::io::{BufRead, IsTerminal, Write};
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

#[path = "../common/args.rs"]
mod common_args;
use clap::Parser;
use common_args::{positive, ModelArgs};
use engine::chat::Message;
use engine::ingest::{checkpoint_name, ingest, IngestParams, IngestReport, ShiftPolicy};
use engine::sampling::{Sampler, SamplerParams};
use engine::store::{SessionStore, StoreConfig};
use engine::{ContextParams, GenerateParams, Session};
use indicatif::{ProgressBar, ProgressStyle};

/// Exit status after Ctrl-C stopped the ingestion (everything read so far is saved).
const EXIT_INTERRUPTED: i32 = 130;

#[derive(Parser, Debug)]
#[command(
    args_override_self = true,
    about = "Read a long document into a model (resumably), then chat about it",
    long_about = "Read a long document into a model (resumably), then chat about it.\n\n\
        The document is evaluated in micro-batches with a durable checkpoint every --interval \
        tokens. Ctrl-C stops cleanly, keeping everything read so far; running the same command \
        again resumes from the longest stored prefix of the document's tokens.\n\n\
        Context shift: when the next micro-batch does not fit in --ctx, the first --keep tokens \
        stay, the oldest --discard tokens after them are dropped (half of them by default, as \
        llama.cpp's --context-shift) and the rest are moved down without being evaluated again. \
        Checkpoints go on across shifts, and a rerun resumes from the last one, shifting at \
        the same places again. --no-shift refuses a document longer than --ctx instead.\n\n\
        The last line on standard output is JSON: {\"tokens\",\"restored\",\"computed\",\"shifts\"}."
)]
struct Args {
    /// The document: a UTF-8 text file.
    file: PathBuf,
    /// The model, GPU layers, threads.
    #[command(flatten)]
    model: ModelArgs,
    /// Directory of checkpoints (shared with the chat).
    #[arg(long, default_value = "store")]
    store: PathBuf,
    /// Context window in tokens.
    #[arg(long, value_parser = positive, default_value_t = 4096)]
    ctx: usize,
    /// Tokens between durable checkpoints (rounded up to whole pages of 64).
    #[arg(long, value_parser = positive, default_value_t = 512)]
    interval: usize,
    /// Largest micro-batch, in tokens.
    #[arg(long, value_parser = positive, default_value_t = 512)]
    ubatch: usize,
    /// Checkpoint name [default: derived from the file's path].
    #[arg(long)]
    name: Option<String>,
    /// Tokens kept at the start at a context shift (the BOS token is kept besides).
    #[arg(long, default_value_t = 0)]
    keep: usize,
    /// Tokens discarded per context shift [default: half of those after --keep].
    #[arg(long, value_parser = positive)]
    discard: Option<usize>,
    /// RAM budget of the KV cache (e.g. 64MiB): past it, full pages go to the store and
    /// attention reads them from their files, with the same results, so a whole book fits in
    /// one context (`--ctx`, up to the model's trained length) in little memory. No budget
    /// when absent.
    #[arg(long = "kv-ram", value_name = "SIZE", value_parser = size)]
    kv_ram: Option<u64>,
    /// Refuse a document longer than --ctx instead of shifting the context.
    #[arg(long)]
    no_shift: bool,
    /// Benchmark reference: evaluate the document by plain prefill (no store, no checkpoint,
    /// no chat) and report the same JSON.
    #[arg(long)]
    plain: bool,
    /// Skip the chat after reading.
    #[arg(long)]
    no_chat: bool,
    /// Longest answer in tokens.
    #[arg(long, value_parser = positive, default_value_t = 256)]
    max_tokens: usize,
    /// A remote tier (Redis) shared with other machines.
    #[command(flatten)]
    remote: kvstore::remote::RemoteArgs,
    /// Sampling temperature for answers (0 = greedy).
    #[arg(long, default_value_t = 0.7)]
    temp: f32,
}

/// A byte size as people write it (`64MiB`, `50MB`).
fn size(s: &str) -> std::result::Result<u64, String> {
    kvstore::parse_size(s).map_err(|e| e.to_string())
}

/// Under `--kv-ram`, the store the session's pages spill to (even with `--plain`): the
/// document's store.
fn spill_store(
    args: &Args,
    model: &std::sync::Arc<engine::Model>,
    config: &StoreConfig,
    session: &mut Session,
) -> Result<Option<SessionStore>> {
    if args.kv_ram.is_none() {
        return Ok(None);
    }
    let store = SessionStore::open(&args.store, model, config.clone())
        .with_context(|| format!("opening the store {}", args.store.display()))?;
    session.context_mut().spill_to(&store)?;
    Ok(Some(store))
}

fn main() -> Result<()> {
    // Model files are untrusted: their chat templates render in a child process with limits.
    engine::chat::sandbox::init();
    let args = Args::parse_from(engine::expand_llama_cpp_flags(std::env::args_os()));
    let text = read_document(&args.file)?;
    let model = args.model.load()?;
    let tokens = model
        .tokenizer()
        .encode(&text, true, false)
        .with_context(|| format!("tokenizing {}", args.file.display()))?;
    let name = match &args.name {
        Some(n) => n.clone(),
        None => {
            let path = std::fs::canonicalize(&args.file).unwrap_or_else(|_| args.file.clone());
            checkpoint_name(&path.to_string_lossy())
        }
    };
    let params = ContextParams {
        n_ctx: args.ctx,
        n_threads: args.model.threads,
        n_batch: args.ubatch,
        kv_ram: args.kv_ram.map_or(0, |b| b as usize),
        ..ContextParams::default()
    };
    let mut session = Session::new(model.clone(), params)?;
    let config = StoreConfig {
        remote: args
            .remote
            .config()
            .map_err(|(option, reason)| anyhow::anyhow!("{option}: {reason}"))?,
        // Under a RAM budget the store's RAM tier keeps within it too.
        ram_bytes: args.kv_ram.map_or(StoreConfig::default().ram_bytes, |b| {
            b.min(StoreConfig::default().ram_bytes)
        }),
        ..StoreConfig::default()
    };
    let spill_store = spill_store(&args, &model, &config, &mut session)?;
    if args.kv_ram.is_some() && tokens.len() > session.params().n_ctx {
        // A context shift rewrites every cached row, spilled ones too: not done from disk.
        bail!(
            "{} is {} tokens long, more than the context of {} (--ctx), which --kv-ram does not shift",
            args.file.display(),
            tokens.len(),
            session.params().n_ctx
        );
    }
    if args.no_shift && tokens.len() > session.params().n_ctx {
        bail!(
            "{} is {} tokens long, more than the context of {} (--ctx) and --no-shift is set",
            args.file.display(),
            tokens.len(),
            session.params().n_ctx
        );
    }
    if args.plain {
        let started = Instant::now();
        session.feed(&tokens)?;
        let report = IngestReport {
            tokens: tokens.len(),
            computed: tokens.len(),
            finished: true,
            ..IngestReport::default()
        };
        print_report(&report, started.elapsed());
        return Ok(());
    }
    let store = match spill_store {
        Some(store) => store,
        None => SessionStore::open(&args.store, &model, config)
            .with_context(|| format!("opening the store {}", args.store.display()))?,
    };
    store.set_remote_log(|line| eprintln!("{line}"));
    // An ingestion another machine saved (all of it, or as far as it went) resumes here.
    store.fetch_remote_checkpoint(&name);
    let _claim = store.claim(&name).with_context(|| {
        format!("claiming checkpoint `{name}` (is another ingestion of it running?)")
    })?;

    let interrupted = Arc::new(AtomicBool::new(false));
    {
        let flag = interrupted.clone();
        ctrlc::set_handler(move || flag.store(true, Ordering::SeqCst))
            .context("installing the Ctrl-C handler")?;
    }

    eprintln!(
        "reading {} ({} tokens) into checkpoint `{name}` of {}, a checkpoint every {} tokens",
        args.file.display(),
        tokens.len(),
        args.store.display(),
        args.interval
    );
    let bar = ProgressBar::new(tokens.len() as u64);
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} tokens {msg}")
            .context("progress bar template")?,
    );
    let ingest_params = IngestParams {
        name: name.clone(),
        interval: args.interval,
        shift: (!args.no_shift).then(|| ShiftPolicy {
            n_keep: args.keep + usize::from(model.tokenizer().add_bos()),
            n_discard: args.discard,
        }),
    };
    let started = Instant::now();
    let report = ingest(&mut session, &store, &tokens, &ingest_params, |p| {
        bar.set_position(p.done as u64);
        if p.computed > 0 && p.tokens_per_s > 0.0 {
            let left = (p.total - p.done) as f64 / p.tokens_per_s;
            bar.set_message(format!(
                "{:.0} tokens/s, ETA {}",
                p.tokens_per_s,
                indicatif::HumanDuration(Duration::from_secs_f64(left))
            ));
        } else if p.restored > 0 {
            bar.set_message(format!("{} restored", p.restored));
        }
        if interrupted.load(Ordering::SeqCst) {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    })
    .with_context(|| format!("reading {}", args.file.display()))?;
    let elapsed = started.elapsed();
    bar.finish_and_clear();

    if !report.finished {
        eprintln!(
            "stopped at {} of {} tokens, all of them saved; run the same command again to resume",
            report.restored + report.computed,
            report.tokens
        );
        print_report(&report, elapsed);
        std::process::exit(EXIT_INTERRUPTED);
    }
    eprintln!(
        "read {} tokens: {} from the store, {} evaluated, {} checkpoints, {} context shifts",
        report.tokens, report.restored, report.computed, report.checkpoints, report.shifts
    );
    if !args.no_chat {
        interrupted.store(false, Ordering::SeqCst);
        chat(&mut session, &args, &interrupted)?;
    }
    print_report(&report, elapsed);
    Ok(())
}

/// The document's text: an unreadable, non-UTF-8 or empty file is an error naming it.
fn read_document(path: &Path) -> Result<String> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let text = match String::from_utf8(bytes) {
        Ok(text) => text,
        Err(e) => bail!(
            "{} is not UTF-8 text (invalid byte at offset {})",
            path.display(),
            e.utf8_error().valid_up_to()
        ),
    };
    if text.trim().is_empty() {
        bail!("{} is empty: nothing to read", path.display());
    }
    Ok(text)
}

/// Answers questions read from standard input, one a line, until its end.
fn chat(session: &mut Session, args: &Args, interrupted: &AtomicBool) -> Result<()> {
    let mut sampler = Sampler::new(SamplerParams {
        temperature: args.temp,
        ..SamplerParams::default()
    });
    let gen = GenerateParams {
        max_tokens: args.max_tokens,
        stop_strings: Vec::new(),
    };
    let stdin = std::io::stdin();
    let terminal = stdin.is_terminal();
    if terminal {
        eprintln!("Ask about the document (Ctrl-D to end, Ctrl-C stops an answer).");
    }
    let mut stdout = std::io::stdout();
    for line in stdin.lock().lines() {
        let line = line.context("reading standard input")?;
        let question = line.trim();
        if question.is_empty() {
            continue;
        }
        let rendered = session
            .model()
            .chat_template()
            .render(&[Message::new("user", question)], true)?;
        let ids = session
            .model()
            .tokenizer()
            .encode(&format!("\n\n{rendered}"), false, true)?;
        if let Err(e) = session.feed(&ids) {
            eprintln!("({e}; the chat ends here)");
            break;
        }
        interrupted.store(false, Ordering::SeqCst);
        let out = session.generate(&mut sampler, &gen, |piece| {
            let _ = stdout.write_all(piece.as_bytes());
            let _ = stdout.flush();
            if interrupted.load(Ordering::SeqCst) {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        })?;
        writeln!(stdout)?;
        if out.stop == engine::StopReason::ContextFull {
            eprintln!("(the context is full; the chat ends here)");
            break;
        }
    }
    Ok(())
}

/// The last line on standard output (`seconds`: the time spent reading, model loading aside).
fn print_report(report: &IngestReport, elapsed: Duration) {
    println!(
        "{}",
        serde_json::json!({
            "tokens": report.tokens,
            "restored": report.restored,
            "computed": report.computed,
            "shifts": report.shifts,
            "seconds": elapsed.as_secs_f64(),
        })
    );
}
