//! Scriptable generation: golden-file mode (one JSON line per prompt with the prompt's token ids,
//! the ten largest logits after it and the greedy continuation) or a plain prompt.
//!
//! ```text
//! cargo run --release --example generate -- --model M --golden FILE.jsonl [-n 32]
//! cargo run --release --example generate -- --model M --prompt "Once upon a time" [-n 64]
//! ```

use std::io::{BufRead, Write};
use std::ops::ControlFlow;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Parser;
use engine::sampling::{Sampler, SamplerParams};
use engine::{GenerateParams, Model, Session, SessionParams};

#[derive(Parser)]
#[command(about = "Generate text or reproduce golden outputs")]
struct Args {
    /// GGUF model file.
    #[arg(long, default_value = "models/SmolLM2-135M-Instruct.Q4_1.gguf")]
    model: PathBuf,
    /// JSON lines with a `prompt` field (special tokens are parsed; BOS as the model says).
    #[arg(long, conflicts_with = "prompt")]
    golden: Option<PathBuf>,
    /// A plain prompt.
    #[arg(long)]
    prompt: Option<String>,
    /// Tokens to generate (greedy in golden mode).
    #[arg(short = 'n', long, default_value_t = 32)]
    n_gen: usize,
    /// Threads.
    #[arg(long, default_value_t = std::thread::available_parallelism().map_or(4, |n| n.get()))]
    threads: usize,
    /// Context size.
    #[arg(long, default_value_t = 2048)]
    ctx: usize,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let model =
        Model::load(&args.model).with_context(|| format!("loading {}", args.model.display()))?;
    let params = SessionParams {
        n_ctx: args.ctx,
        n_threads: args.threads,
        ..SessionParams::default()
    };
    if let Some(golden) = &args.golden {
        let file = std::fs::File::open(golden).with_context(|| golden.display().to_string())?;
        let stdout = std::io::stdout();
        for line in std::io::BufReader::new(file).lines() {
            let line = line?;
            if line.trim().is_empty() {
                continue;
            }
            let v: serde_json::Value = serde_json::from_str(&line)?;
            let prompt = v["prompt"]
                .as_str()
                .context("a golden line without a `prompt`")?;
            let ids = model.tokenizer().encode(prompt, true, true)?;
            let mut session = Session::new(model.clone(), params.clone())?;
            let logits = session.feed(&ids)?.to_vec();
            let mut order: Vec<usize> = (0..logits.len()).collect();
            order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
            let top10: Vec<(usize, f32)> = order[..10].iter().map(|&i| (i, logits[i])).collect();
            let mut greedy = Vec::with_capacity(args.n_gen);
            for _ in 0..args.n_gen {
                let logits = session.logits()?;
                let next = argmax(logits);
                greedy.push(next);
                // Like llama.cpp's reference run: an end-of-generation token ends the list.
                if model.tokenizer().is_eog(next) {
                    break;
                }
                session.feed(&[next])?;
            }
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
