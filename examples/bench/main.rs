//! Prefill and decode speed on a synthetic prompt, as JSON.
//!
//! The prompt is the one llama.cpp's reference harness uses: token `i` is
//! `100 + (i * 7919) mod (n_vocab - 200)`, so both programs evaluate the same tokens. Decoding is
//! greedy and continues from the prompt.
//!
//! With `--sequences N`, N sequences each get their own synthetic prompt (sequence `s` shifts
//! the formula by `s * 131`, as llama.cpp's batched harness does), are prefilled one after the
//! other and then decoded together, one token per sequence per step, in one batch; the figures
//! are aggregate tokens per second. `--shared-prefix P` puts a common prefix of P tokens before
//! every sequence's own prompt: the first sequence computes it and the others share its pages.
//! The JSON then also reports the KV pages in use, with and without that sharing.
//!
//! ```text
//! cargo run --release --example bench -- --model M --prompt-tokens 512 --gen-tokens 128 --threads 2
//! cargo run --release --example bench -- --sequences 8 --prompt-tokens 128 --gen-tokens 64
//! cargo run --release --example bench -- --sequences 8 --shared-prefix 1024 --prompt-tokens 64
//! ```

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Result;

#[path = "../common/args.rs"]
mod common_args;
use clap::Parser;
use common_args::{KvArgs, ModelArgs};
use engine::store::{CheckpointMeta, SessionStore, StoreConfig};
use engine::{Batch, Context, ContextParams, Logits, Model, Session, PAGE_TOKENS};

#[derive(Parser)]
#[command(about = "Measure prefill and decode tokens per second")]
struct Args {
    /// The model, GPU layers, threads.
    #[command(flatten)]
    model: ModelArgs,
    /// Prompt length in tokens.
    #[arg(long, default_value_t = 512)]
    prompt_tokens: usize,
    /// Tokens to decode after the prompt.
    #[arg(long, default_value_t = 128)]
    gen_tokens: usize,
    /// Compute attention without ggml's fused flash-attention kernel.
    #[arg(long)]
    no_flash_attn: bool,
    /// Which kernels evaluate (`ContextParams::evaluation`, the server's `--evaluation`):
    /// invariant (the default), llama-cpp or fast.
    #[arg(long, default_value = "invariant")]
    evaluation: engine::Evaluation,
    /// `--evaluation llama-cpp` (the server's `--deterministic` before invariant evaluation
    /// became the default).
    #[arg(long)]
    deterministic: bool,
    /// Repacked weights (`ModelParams::repack`, llama.cpp's default; off by default here).
    #[arg(long)]
    repack: bool,
    /// The KV cache's element types.
    #[command(flatten)]
    kv: KvArgs,
    /// Element type of K and V in the checkpoint store (`--checkpoint`), converted on save
    /// and restore when it differs from the cache types; with `--kv-ram`, the spilled pages'
    /// type at rest (q8_0: widened while attended to).
    #[arg(long = "cache-type-stored", value_name = "TYPE")]
    cache_type_stored: Option<engine::KvType>,
    /// Repetitions; the median is reported.
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// Also save the prefilled session as a checkpoint in this directory and restore it into a
    /// fresh session, reporting both times against the prefill time.
    #[arg(long, conflicts_with_all = ["sequences", "shared_prefix"])]
    checkpoint: Option<PathBuf>,
    /// With `--checkpoint`: restores of the saved checkpoint per repetition (each into a fresh
    /// session through a fresh store handle); the median is reported.
    #[arg(long, default_value_t = 1, requires = "checkpoint")]
    restore_reps: usize,
    /// Sequences decoded together.
    #[arg(long, default_value_t = 1)]
    sequences: usize,
    /// Tokens of a prefix common to every sequence, computed once and shared.
    #[arg(long, default_value_t = 0)]
    shared_prefix: usize,
    /// Fills this store directory (a server's `--cache-dir`) with `--conversations` cached
    /// prompts, as a server leaves them, for the growth benchmark (see `fill_store`). Prints
    /// the count and the time taken.
    #[arg(long, value_name = "DIR", conflicts_with_all = ["checkpoint", "sequences", "shared_prefix"])]
    fill_store: Option<PathBuf>,
    /// With `--fill-store`: how many.
    #[arg(long, default_value_t = 1000, requires = "fill_store")]
    conversations: usize,
    /// Positions of the context (default: the prompt, the generated tokens and 16 more). May
    /// exceed the model's training length: figures past it hold for speed and memory, not for
    /// quality.
    #[arg(long = "ctx-size", value_name = "N")]
    ctx_size: Option<usize>,
    /// RAM budget of the KV pool (`64MiB`, `50MB`): full pages past it are written to
    /// `--spill-dir` and attended to from their files (`ContextParams::kv_ram`).
    #[arg(long = "kv-ram", value_name = "SIZE", value_parser = size,
          conflicts_with_all = ["checkpoint", "sequences", "shared_prefix"])]
    kv_ram: Option<u64>,
    /// With `--kv-ram`: the store pages spill to (default: a new directory in the system's
    /// temporary directory, removed at the end).
    #[arg(long = "spill-dir", value_name = "DIR", requires = "kv_ram")]
    spill_dir: Option<PathBuf>,
    /// With `--kv-ram`: before every decoded token, drop the spilled blocks from memory and
    /// the page cache (untimed), so each token reads them from the disk; then read the same
    /// files whole, dd-style, for the disk's sequential speed, and report the decode time
    /// against the time to read a token's bytes at that speed.
    #[arg(long, requires = "kv_ram")]
    evict: bool,
    /// Measures the model fingerprint instead (see `fingerprint.rs`), with this many
    /// repetitions: hashing every byte of the file against reading it, and a start that finds
    /// it remembered.
    #[arg(long, value_name = "REPS")]
    fingerprint: Option<usize>,
}

impl Args {
    /// `--evaluation`, or llama.cpp's bits with `--deterministic`.
    fn evaluation(&self) -> engine::Evaluation {
        if self.deterministic {
            engine::Evaluation::LlamaCpp
        } else {
            self.evaluation
        }
    }
}

fn argmax(logits: &[f32]) -> u32 {
    logits
        .iter()
        .enumerate()
        .max_by(|a, b| a.1.total_cmp(b.1))
        .map_or(0, |(i, _)| i) as u32
}

/// `--sequences N` / `--shared-prefix P`: aggregate prefill and decode speed of N sequences in
/// one context, and the pages they hold.
fn batched(args: &Args, model: &std::sync::Arc<Model>) -> Result<serde_json::Value> {
    let n_vocab = model.hparams().n_vocab;
    let (ns, np, ng, pre) = (
        args.sequences.max(1),
        args.prompt_tokens,
        args.gen_tokens,
        args.shared_prefix,
    );
    let token = |i: usize| (100 + (i * 7919) % (n_vocab - 200)) as u32;
    let prefix: Vec<u32> = (0..pre).map(|i| token(i + 1_000_003)).collect();
    let prompts: Vec<Vec<u32>> = (0..ns)
        .map(|s| {
            let own = (0..np).map(|i| token(i + s * 131));
            prefix.iter().copied().chain(own).collect()
        })
        .collect();
    let per_seq = pre + np + ng + 16;
    let mut prefill = Vec::new();
    let mut decode = Vec::new();
    let mut stats = Default::default();
    let mut attached = 0;
    for _ in 0..args.reps.max(1) {
        let mut ctx = Context::new(
            model.clone(),
            ContextParams {
                n_ctx: per_seq,
                // Every sequence rounds up to whole pages.
                kv_tokens: ns * per_seq.div_ceil(PAGE_TOKENS) * PAGE_TOKENS,
                n_threads: args.model.threads,
                n_batch: 512.max(ns),
                flash_attn: !args.no_flash_attn,
                type_k: args.kv.cache_type_k,
                type_v: args.kv.cache_type_v,
                evaluation: args.evaluation(),
                ..ContextParams::default()
            },
        )?;
        let seqs: Vec<_> = (0..ns).map(|_| ctx.new_sequence()).collect();
        let t = Instant::now();
        attached = 0;
        for (&seq, prompt) in seqs.iter().zip(&prompts) {
            // The shared prefix's full pages are found by block id once the first sequence
            // holds them (keep at least one token to evaluate for logits).
            let n = ctx.attach_prefix(seq, &prompt[..prompt.len() - 1])?;
            attached += n;
            ctx.feed(seq, &prompt[n..], Logits::Last)?;
        }
        prefill.push((ns * (pre + np) - attached) as f64 / t.elapsed().as_secs_f64());
        let mut next: Vec<u32> = seqs
            .iter()
            .map(|&s| ctx.logits(s).map(argmax))
            .collect::<engine::Result<_>>()?;
        let t = Instant::now();
        for _ in 0..ng {
            let mut batch = Batch::new();
            for (&seq, &tok) in seqs.iter().zip(&next) {
                batch.add(seq, &[tok], Logits::Last);
            }
            let out = ctx.decode(&batch)?;
            for (i, tok) in next.iter_mut().enumerate() {
                *tok = argmax(out.logits(i));
            }
        }
        if ng > 0 {
            decode.push((ns * ng) as f64 / t.elapsed().as_secs_f64());
        }
        stats = ctx.stats();
    }
    let stats: engine::KvStats = stats;
    Ok(serde_json::json!({
        "sequences": ns,
        "shared_prefix": pre,
        "n_prompt": np,
        "n_gen": ng,
        "threads": args.model.threads,
        "cpu_path": engine::cpu_path().name,
        "evaluation": args.evaluation().to_string(),
        "repack": args.repack,
        "reps": args.reps,
        "prefill_tps": median(&mut prefill),
        "decode_tps": if decode.is_empty() { 0.0 } else { median(&mut decode) },
        "tokens_attached": attached,
        "kv_pages_used": stats.pages_used,
        "kv_pages_shared": stats.pages_shared,
        "kv_pages_without_sharing": stats.pages_referenced,
        "page_tokens": PAGE_TOKENS,
    }))
}

/// `--fill-store DIR --conversations N`: N cached prompts as a server leaves them (a full block
/// and a two-token tail each, under the ids of their own tokens), written through the store.
/// Their KV bytes are a filler pattern, not computed: they stand for other users' prompts in
/// the growth benchmark, which measures what the store's size costs, and nobody asks for them.
fn fill_store(
    model: &std::sync::Arc<Model>,
    dir: &std::path::Path,
    n: usize,
) -> Result<serde_json::Value> {
    use engine::store::BlockCopy;
    use promptcache::{StoreExt as _, TailBlock};
    let started = Instant::now();
    let store = SessionStore::open(dir, model, StoreConfig::default())?;
    let layout =
        engine::KvLayout::with_types(model.hparams(), engine::KvType::F16, engine::KvType::F16)?;
    let per_token = layout.bytes_per_token();
    let fingerprint = kvstore::Fingerprint(model.fingerprint());
    let n_vocab = model.hparams().n_vocab as u64;
    for c in 0..n as u64 {
        let tokens: Vec<u32> = (0..PAGE_TOKENS as u64 + 2)
            .map(|i| (100 + (c * 131 + i * 7919) % (n_vocab - 200)) as u32)
            .collect();
        let block = &tokens[..PAGE_TOKENS];
        let id = kvstore::BlockId::chain(&fingerprint, None, block);
        let fill = (c % 251) as u8;
        store.put_blocks(vec![BlockCopy {
            prev: None,
            id,
            tokens: block.to_vec(),
            kv: vec![fill; PAGE_TOKENS * per_token],
            state: None,
        }])?;
        store.prompt_cache().put_tail(TailBlock {
            tokens,
            kv: vec![fill; 2 * per_token],
            last_block: id,
            namespace: None,
            expires_unix: None,
            state: None,
        })?;
    }
    store.flush()?;
    Ok(serde_json::json!({
        "conversations": n,
        "kv_bytes_per_token": per_token,
        "seconds": started.elapsed().as_secs_f64(),
    }))
}

mod beyond;
mod fingerprint;

/// A byte size as people write it (`64MiB`, `50MB`).
fn size(s: &str) -> std::result::Result<u64, String> {
    kvstore::parse_size(s).map_err(|e| e.to_string())
}

fn main() -> Result<()> {
    let args = Args::parse_from(engine::expand_llama_cpp_flags(std::env::args_os()));
    if let Some(reps) = args.fingerprint {
        println!("{}", fingerprint::fingerprint_cost(&args.model.path, reps)?);
        return Ok(());
    }
    let store_config = args
        .kv
        .store(args.cache_type_stored, StoreConfig::default());
    let model = args.model.load_with(&engine::ModelParams {
        repack: args.repack,
        ..args.model.params()
    })?;
    if let Some(dir) = &args.fill_store {
        println!("{}", fill_store(&model, dir, args.conversations)?);
        return Ok(());
    }
    if args.sequences > 1 || args.shared_prefix > 0 {
        println!("{}", batched(&args, &model)?);
        return Ok(());
    }
    let n_vocab = model.hparams().n_vocab;
    let prompt: Vec<u32> = (0..args.prompt_tokens)
        .map(|i| (100 + (i * 7919) % (n_vocab - 200)) as u32)
        .collect();
    let params = ContextParams {
        n_ctx: args
            .ctx_size
            .unwrap_or(args.prompt_tokens + args.gen_tokens.max(64) + 16),
        past_train: args.ctx_size.is_some(),
        kv_ram: args.kv_ram.map_or(0, |b| b as usize),
        n_threads: args.model.threads,
        flash_attn: !args.no_flash_attn,
        type_k: args.kv.cache_type_k,
        type_v: args.kv.cache_type_v,
        evaluation: args.evaluation(),
        ..ContextParams::default()
    };
    let mut prefill = Vec::new();
    let mut decode = Vec::new();
    let (mut save_ms, mut restore_ms, mut saved_bytes) = (Vec::new(), Vec::new(), 0u64);
    let (mut turn_ms, mut turn_bytes) = (Vec::new(), 0u64);
    let mut spill = beyond::SpillRun::new(&args, &model, &store_config)?;
    for rep in 0..args.reps.max(1) {
        let mut session = Session::new(model.clone(), params.clone())?;
        spill.attach(&mut session, rep)?;
        let t = Instant::now();
        session.feed(&prompt)?;
        prefill.push(args.prompt_tokens as f64 / t.elapsed().as_secs_f64());
        if let Some(dir) = &args.checkpoint {
            // A fresh directory per repetition, so every save writes all blocks.
            let dir = dir.join(format!("rep{rep}"));
            let _ = std::fs::remove_dir_all(&dir);
            let store = SessionStore::open(&dir, &model, store_config.clone())?;
            let t = Instant::now();
            let saved = store.save(&session, "bench", &CheckpointMeta::default())?;
            save_ms.push(t.elapsed().as_secs_f64() * 1e3);
            saved_bytes = saved.bytes_written;
            // Another process restores it: a fresh store handle (empty RAM tier, so every
            // block is read from its file and verified) and a fresh session.
            drop(store);
            for _ in 0..args.restore_reps.max(1) {
                let store = SessionStore::open(&dir, &model, store_config.clone())?;
                let mut fresh = Session::new(model.clone(), params.clone())?;
                let t = Instant::now();
                store.restore(&mut fresh, "bench")?;
                restore_ms.push(t.elapsed().as_secs_f64() * 1e3);
                anyhow::ensure!(fresh.tokens() == session.tokens(), "restore lost tokens");
            }
            // One more turn: 64 tokens more, saved again under the same name; only the new
            // full block and the manifest (with the partial last block) are written.
            let turn: Vec<u32> = (0..64)
                .map(|i| (100 + ((i + args.prompt_tokens) * 7919) % (n_vocab - 200)) as u32)
                .collect();
            session.feed(&turn)?;
            let store = SessionStore::open(&dir, &model, store_config.clone())?;
            let t = Instant::now();
            let saved = store.save(&session, "bench", &CheckpointMeta::default())?;
            turn_ms.push(t.elapsed().as_secs_f64() * 1e3);
            turn_bytes = saved.bytes_written;
            session.truncate(args.prompt_tokens)?;
        }
        // After the checkpoint's extra turn was cut off again, the logits are recomputed here,
        // outside the timing.
        session.ensure_logits()?;
        let mut elapsed = std::time::Duration::ZERO;
        let mut generated = Vec::with_capacity(args.gen_tokens);
        for _ in 0..args.gen_tokens {
            let next = argmax(session.logits()?);
            generated.push(next);
            spill.before_token(&session);
            let t = Instant::now();
            session.feed(&[next])?;
            elapsed += t.elapsed();
        }
        decode.push(args.gen_tokens as f64 / elapsed.as_secs_f64());
        spill.after_rep(&session, generated, elapsed, args.gen_tokens)?;
    }
    let prefill_tps = median(&mut prefill);
    let mut out = serde_json::json!({
        "prefill_tps": prefill_tps,
        "decode_tps": median(&mut decode),
        "n_prompt": args.prompt_tokens,
        "n_gen": args.gen_tokens,
        "threads": args.model.threads,
        "cpu_path": engine::cpu_path().name,
        "evaluation": args.evaluation().to_string(),
        "repack": args.repack,
        "reps": args.reps,
    });
    spill.report(&mut out)?;
    if !save_ms.is_empty() {
        let prefill_ms = args.prompt_tokens as f64 / prefill_tps * 1e3;
        out["checkpoint"] = serde_json::json!({
            "save_ms": median(&mut save_ms),
            "restore_ms": median(&mut restore_ms),
            "bytes": saved_bytes,
            "save_turn_ms": median(&mut turn_ms),
            "save_turn_bytes": turn_bytes,
            "prefill_ms": prefill_ms,
        });
    }
    println!("{out}");
    Ok(())
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}
