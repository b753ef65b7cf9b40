//! Prefill and decode speed on a synthetic prompt, as JSON.
//!
//! The prompt is the one llama.cpp's reference harness uses: token `i` is
//! `100 + (i * 7919) mod (n_vocab - 200)`, so both programs evaluate the same tokens. Decoding is
//! greedy and continues from the prompt.
//!
//! ```text
//! cargo run --release --example bench -- --model M --prompt-tokens 512 --gen-tokens 128 --threads 2
//! ```

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Result;
use clap::Parser;
use engine::{Model, Session, SessionParams};

#[derive(Parser)]
#[command(about = "Measure prefill and decode tokens per second")]
struct Args {
    /// GGUF model file.
    #[arg(long, default_value = "models/SmolLM2-135M-Instruct.Q4_1.gguf")]
    model: PathBuf,
    /// Prompt length in tokens.
    #[arg(long, default_value_t = 512)]
    prompt_tokens: usize,
    /// Tokens to decode after the prompt.
    #[arg(long, default_value_t = 128)]
    gen_tokens: usize,
    /// Threads.
    #[arg(long, default_value_t = std::thread::available_parallelism().map_or(4, |n| n.get()))]
    threads: usize,
    /// Compute attention without ggml's fused flash-attention kernel.
    #[arg(long)]
    no_flash_attn: bool,
    /// Repetitions; the median is reported.
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// Also save the prefilled session as a checkpoint in this directory and restore it into a
    /// fresh session, reporting both times against the prefill time.
    #[arg(long)]
    checkpoint: Option<PathBuf>,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let model = Model::load(&args.model)?;
    let n_vocab = model.hparams().n_vocab;
    let prompt: Vec<u32> = (0..args.prompt_tokens)
        .map(|i| (100 + (i * 7919) % (n_vocab - 200)) as u32)
        .collect();
    let params = SessionParams {
        n_ctx: args.prompt_tokens + args.gen_tokens + 16,
        n_threads: args.threads,
        flash_attn: !args.no_flash_attn,
        ..SessionParams::default()
    };
    let mut prefill = Vec::new();
    let mut decode = Vec::new();
    let (mut save_ms, mut restore_ms, mut saved_bytes) = (Vec::new(), Vec::new(), 0u64);
    for rep in 0..args.reps.max(1) {
        let mut session = Session::new(model.clone(), params.clone())?;
        let t = Instant::now();
        session.feed(&prompt)?;
        prefill.push(args.prompt_tokens as f64 / t.elapsed().as_secs_f64());
        if let Some(dir) = &args.checkpoint {
            // A fresh directory per repetition, so every save writes all blocks.
            let dir = dir.join(format!("rep{rep}"));
            let _ = std::fs::remove_dir_all(&dir);
            let store = engine::checkpoint::open_store(&dir, &session)?;
            let t = Instant::now();
            let saved = session.save_checkpoint(&store, "bench", Vec::new(), None)?;
            save_ms.push(t.elapsed().as_secs_f64() * 1e3);
            saved_bytes = saved.bytes_written;
            let mut fresh = Session::new(model.clone(), params.clone())?;
            let t = Instant::now();
            fresh.restore_checkpoint(&store, "bench")?;
            restore_ms.push(t.elapsed().as_secs_f64() * 1e3);
            anyhow::ensure!(fresh.tokens() == session.tokens(), "restore lost tokens");
        }
        let t = Instant::now();
        for _ in 0..args.gen_tokens {
            let logits = session.logits()?;
            let next = logits
                .iter()
                .enumerate()
                .max_by(|a, b| a.1.total_cmp(b.1))
                .map_or(0, |(i, _)| i) as u32;
            session.feed(&[next])?;
        }
        decode.push(args.gen_tokens as f64 / t.elapsed().as_secs_f64());
    }
    let prefill_tps = median(&mut prefill);
    let mut out = serde_json::json!({
        "prefill_tps": prefill_tps,
        "decode_tps": median(&mut decode),
        "n_prompt": args.prompt_tokens,
        "n_gen": args.gen_tokens,
        "threads": args.threads,
        "reps": args.reps,
    });
    if !save_ms.is_empty() {
        let prefill_ms = args.prompt_tokens as f64 / prefill_tps * 1e3;
        out["checkpoint"] = serde_json::json!({
            "save_ms": median(&mut save_ms),
            "restore_ms": median(&mut restore_ms),
            "bytes": saved_bytes,
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
