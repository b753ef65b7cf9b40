//! Scriptable generation: golden-file mode (one JSON line per prompt with the prompt's token ids,
//! the ten largest logits after it and the greedy continuation) or a plain prompt.
//!
//! ```text
//! cargo run --release --example generate -- --model M --golden FILE.jsonl [-n 32] [--together]
//! cargo run --release --example generate -- --model M --prompt "Once upon a time" [-n 64]
//! ```

use std::io::{BufRead, Write};
use std::ops::ControlFlow;
use std::path::PathBuf;

use anyhow::{Context, Result};

#[path = "../common/args.rs"]
mod common_args;
use clap::Parser;
use common_args::{KvArgs, ModelArgs};
use engine::sampling::{Sampler, SamplerParams};
use engine::{Batch, Context as EngineContext, ContextParams, GenerateParams, Logits, Session};

#[derive(Parser)]
#[command(about = "Generate text or reproduce golden outputs")]
struct Args {
    /// The model, GPU layers, threads.
    #[command(flatten)]
    model: ModelArgs,
    /// JSON lines with a `prompt` field (special tokens are parsed; BOS as the model says).
    #[arg(long, conflicts_with = "prompt")]
    golden: Option<PathBuf>,
    /// A plain prompt.
    #[arg(long)]
    prompt: Option<String>,
    /// Tokens to generate (greedy in golden mode).
    #[arg(short = 'n', long, default_value_t = 32)]
    n_gen: usize,
    /// Context size.
    #[arg(long, default_value_t = 2048)]
    ctx: usize,
    /// Golden mode: evaluate every prompt of the file in one batch (and decode them together)
    /// instead of one after the other. The output is the same.
    #[arg(long, requires = "golden")]
    together: bool,
    /// The KV cache's element types.
    #[command(flatten)]
    kv: KvArgs,
}

/// The ten largest logits after a prompt (id, logit) and its greedy continuation.
type GoldenResult = (Vec<(usize, f32)>, Vec<u32>);

/// The ten largest logits after each prompt and its greedy continuation, for `prompts`
/// prefilled in one batch and decoded together.
fn golden_batch(
    ctx: &mut EngineContext,
    prompts: &[Vec<u32>],
    n_gen: usize,
) -> Result<Vec<GoldenResult>> {
    let seqs: Vec<_> = prompts.iter().map(|_| ctx.new_sequence()).collect();
    let mut batch = Batch::new();
    for (ids, &seq) in prompts.iter().zip(&seqs) {
        batch.add(seq, ids, Logits::Last);
    }
    ctx.decode(&batch)?;
    let mut results: Vec<GoldenResult> = Vec::new();
    for &seq in &seqs {
        let logits = ctx.logits(seq)?;
        let mut order: Vec<usize> = (0..logits.len()).collect();
        order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
        results.push((
            order[..10].iter().map(|&i| (i, logits[i])).collect(),
            Vec::new(),
        ));
    }
    let mut live: Vec<usize> = if n_gen == 0 {
        Vec::new()
    } else {
        (0..prompts.len()).collect()
    };
    while !live.is_empty() {
        let mut batch = Batch::new();
        let mut still = Vec::new();
        for &i in &live {
            let next = argmax(ctx.logits(seqs[i])?);
            let greedy = &mut results[i].1;
            greedy.push(next);
            // Like llama.cpp's reference run: an end-of-generation token ends the list.
            if greedy.len() < n_gen && !ctx.model().tokenizer().is_eog(next) {
                batch.add(seqs[i], &[next], Logits::Last);
                still.push(i);
            }
        }
        if !batch.is_empty() {
            ctx.decode(&batch)?;
        }
        live = still;
    }
    for seq in seqs {
        ctx.remove_sequence(seq)?;
    }
    Ok(results)
}

fn main() -> Result<()> {
    let args = Args::parse_from(engine::expand_llama_cpp_flags(std::env::args_os()));
    let model = args.model.load()?;
    let params = args.kv.context(&args.model, args.ctx);
    if let Some(golden) = &args.golden {
        let file = std::fs::File::open(golden).with_context(|| golden.display().to_string())?;
        let mut prompts = Vec::new();
        for line in std::io::BufReader::new(file).lines() {
            let line = line?;
            if line.trim().is_empty() {
                continue;
            }
            let v: serde_json::Value = serde_json::from_str(&line)?;
            let prompt = v["prompt"]
                .as_str()
                .context("a golden line without a `prompt`")?
                .to_owned();
            let ids = model.tokenizer().encode(&prompt, true, true)?;
            prompts.push((prompt, ids));
        }
        let n_prompt: usize = prompts.iter().map(|p| p.1.len()).sum();
        let n_seq = if args.together { prompts.len() } else { 1 };
        let mut ctx = EngineContext::new(
            model.clone(),
            ContextParams {
                kv_tokens: n_seq * (n_prompt + args.n_gen),
                n_batch: n_prompt.max(prompts.len()),
                ..params.clone()
            },
        )?;
        let ids: Vec<Vec<u32>> = prompts.iter().map(|p| p.1.clone()).collect();
        let results = if args.together {
            golden_batch(&mut ctx, &ids, args.n_gen)?
        } else {
            let mut all = Vec::new();
            for one in ids.chunks(1) {
                all.extend(golden_batch(&mut ctx, one, args.n_gen)?);
            }
            all
        };
        let stdout = std::io::stdout();
        for ((prompt, ids), (top10, greedy)) in prompts.iter().zip(results) {
            let out = serde_json::json!({
                "prompt": prompt,
                "prompt_ids": ids,
                "top10": top10,
                "greedy": greedy,
                "greedy_text": model.tokenizer().decode(&greedy),
            });
            writeln!(stdout.lock(), "{out}")?;
        }
        return Ok(());
    }
    let prompt = args.prompt.context("give --golden FILE or --prompt TEXT")?;
    let mut session = Session::new(model, params)?;
    session.feed_text(&prompt)?;
    let mut sampler = Sampler::new(SamplerParams::greedy());
    let gen = GenerateParams {
        max_tokens: args.n_gen,
        ..GenerateParams::default()
    };
    print!("{prompt}");
    session.generate(&mut sampler, &gen, |piece| {
        print!("{piece}");
        let _ = std::io::stdout().flush();
        ControlFlow::Continue(())
    })?;
    println!();
    Ok(())
}

fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, v) in logits.iter().enumerate() {
        if *v > logits[best] {
            best = i;
        }
    }
    best as u32
}
