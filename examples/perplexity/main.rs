//! Perplexity of a text, and how far another KV cache type or evaluation moves the model from
//! f16 (or from ggml's kernels: `--base-evaluation llama-cpp`).
//!
//! The text is cut into chunks of `--ctx` tokens (the first token of each replaced by BOS where
//! the model adds one); each chunk is evaluated from an empty cache and the second half of its
//! positions is scored, as llama.cpp's `llama-perplexity` does, so the figures compare with its
//! output for the same `-c` and `--chunks`. Two sessions evaluate every chunk: the base one
//! (`--base-ctk/--base-ctv`, f16 by default) and the tested one (`-ctk/-ctv`). Reported: the
//! perplexity of each, the KL divergence of the tested next-token distributions from the base
//! ones (mean and 99th percentile), the fraction of scored positions whose most likely token is
//! the same, and with `--greedy N` the top-1 agreement over the base's N greedy tokens after each
//! chunk (the tested session fed the same tokens).
//!
//! With `--llama-cpp-logits FILE` the base is llama.cpp itself: FILE is what
//! `llama-perplexity -f TEXT -c 512 --kl-divergence-base FILE` saved (its tokens must be ours;
//! see `llama_logits.rs`), only the tested session runs, and each position is measured as
//! llama.cpp's `--kl-divergence` mode measures it.
//!
//! ```text
//! cargo run --release --example perplexity -- --file TEXT [--ctx 512] [--chunks 20] -ctk q8_0 -ctv q8_0 [--greedy 64]
//! cargo run --release --example perplexity -- --file TEXT -ctk f16 -ctv f16 --llama-cpp-logits FILE
//! ```

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context, Result};

#[path = "../common/args.rs"]
mod common_args;
use clap::Parser;
use common_args::ModelArgs;
use engine::{ContextParams, Evaluation, KvType, Model, Session};

mod llama_logits;
use llama_logits::LlamaLogits;

#[derive(Parser)]
#[command(about = "Perplexity of a text and the KL divergence of one KV cache type from another")]
struct Args {
    /// The model, GPU layers, threads.
    #[command(flatten)]
    model: ModelArgs,
    /// The text (UTF-8).
    #[arg(long, short = 'f')]
    file: PathBuf,
    /// Tokens per chunk (llama.cpp's `-c`).
    #[arg(long, default_value_t = 512)]
    ctx: usize,
    /// Chunks to evaluate at most (llama.cpp's `--chunks`; default: all).
    #[arg(long)]
    chunks: Option<usize>,
    /// K cache type of the tested session (llama.cpp's `-ctk`).
    #[arg(long = "cache-type-k", visible_alias = "ctk", default_value = "q8_0")]
    cache_type_k: KvType,
    /// V cache type of the tested session (llama.cpp's `-ctv`).
    #[arg(long = "cache-type-v", visible_alias = "ctv", default_value = "q8_0")]
    cache_type_v: KvType,
    /// K cache type of the base session.
    #[arg(long = "base-ctk", default_value = "f16")]
    base_ctk: KvType,
    /// V cache type of the base session.
    #[arg(long = "base-ctv", default_value = "f16")]
    base_ctv: KvType,
    /// Evaluation of the tested session: invariant (the default), llama-cpp or fast.
    #[arg(long, default_value = "invariant")]
    evaluation: Evaluation,
    /// Evaluation of the base session (`llama-cpp`: ggml's kernels, llama.cpp's sums, to
    /// measure our kernels against them as llama.cpp compares its backends).
    #[arg(long = "base-evaluation", default_value = "invariant")]
    base_evaluation: Evaluation,
    /// Greedy tokens of the base session after each chunk, predicted by the tested one.
    #[arg(long, default_value_t = 0)]
    greedy: usize,
    /// llama.cpp's logits as the base: the file `llama-perplexity --kl-divergence-base` wrote
    /// for this model and text (its `-c` must be `--ctx`).
    #[arg(long = "llama-cpp-logits", value_name = "FILE")]
    llama_cpp_logits: Option<PathBuf>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// Natural-log probabilities of a row of logits (f64 sums).
fn log_softmax(row: &[f32]) -> Vec<f64> {
    let max = row.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x)) as f64;
    let sum: f64 = row.iter().map(|&x| (x as f64 - max).exp()).sum();
    let log_z = max + sum.ln();
    row.iter().map(|&x| x as f64 - log_z).collect()
}

fn argmax(row: &[f32]) -> u32 {
    (0..row.len()).fold(0, |best, i| if row[i] > row[best] { i } else { best }) as u32
}

/// Sums over the scored positions.
#[derive(Default)]
struct Tally {
    nll_base: f64,
    nll_test: f64,
    kld: Vec<f64>,
    same_top: usize,
    greedy_same: usize,
    greedy_total: usize,
}

impl Tally {
    fn ppl(nll: f64, n: usize) -> f64 {
        (nll / n as f64).exp()
    }

    fn add(&mut self, nll_base: f64, nll_test: f64, kld: f64, same_top: bool) {
        self.nll_base += nll_base;
        self.nll_test += nll_test;
        self.kld.push(kld);
        self.same_top += usize::from(same_top);
    }

    /// One line on stderr after chunk `c` (counted from 1) of `n_chunks`.
    fn progress(&self, c: usize, n_chunks: usize) {
        let n = self.kld.len();
        eprintln!(
            "[{c}/{n_chunks}] ppl base {:.4} test {:.4}  mean KLD {:.6}  same top {:.2}%",
            Tally::ppl(self.nll_base, n),
            Tally::ppl(self.nll_test, n),
            self.kld.iter().sum::<f64>() / n as f64,
            100.0 * self.same_top as f64 / n as f64
        );
    }
}

/// What was compared with what, for the report.
struct Run {
    chunks: usize,
    ctx: usize,
    base: String,
    test: String,
}

fn types(k: KvType, v: KvType, e: Evaluation) -> String {
    format!("K {k} V {v} {e}")
}

fn session(
    args: &Args,
    model: &Arc<Model>,
    k: KvType,
    v: KvType,
    e: Evaluation,
) -> Result<Session> {
    Ok(Session::new(
        model.clone(),
        ContextParams {
            n_ctx: args.ctx + args.greedy,
            n_threads: args.model.threads,
            type_k: k,
            type_v: v,
            evaluation: e,
            ..ContextParams::default()
        },
    )?)
}

/// Chunk `c` of `tokens`, its first token replaced by BOS where the model adds one.
fn chunk_of(model: &Model, tokens: &[u32], ctx: usize, c: usize) -> Vec<u32> {
    let mut chunk = tokens[c * ctx..(c + 1) * ctx].to_vec();
    let tok = model.tokenizer();
    if let (true, Some(bos)) = (tok.add_bos(), tok.bos()) {
        chunk[0] = bos;
    }
    chunk
}

/// Both sessions ours: the base (`--base-*`) against the tested one.
fn against_ours(args: &Args, model: &Arc<Model>, tokens: &[u32], t: &mut Tally) -> Result<Run> {
    let available = tokens.len() / args.ctx;
    let n_chunks = args.chunks.map_or(available, |c| c.min(available));
    if n_chunks == 0 {
        bail!(
            "the text has {} tokens: fewer than one chunk of {}",
            tokens.len(),
            args.ctx
        );
    }
    let mut base = session(
        args,
        model,
        args.base_ctk,
        args.base_ctv,
        args.base_evaluation,
    )?;
    let mut test = session(
        args,
        model,
        args.cache_type_k,
        args.cache_type_v,
        args.evaluation,
    )?;
    let n_vocab = model.hparams().n_vocab;
    let first = args.ctx / 2;
    for c in 0..n_chunks {
        let chunk = chunk_of(model, tokens, args.ctx, c);
        base.clear();
        test.clear();
        let lb = base.feed_all_logits(&chunk)?;
        let lt = test.feed_all_logits(&chunk)?;
        for i in first..args.ctx - 1 {
            let (rb, rt) = (
                &lb[i * n_vocab..(i + 1) * n_vocab],
                &lt[i * n_vocab..(i + 1) * n_vocab],
            );
            let (pb, pt) = (log_softmax(rb), log_softmax(rt));
            let target = chunk[i + 1] as usize;
            let kld = pb.iter().zip(&pt).map(|(a, b)| a.exp() * (a - b)).sum();
            t.add(-pb[target], -pt[target], kld, argmax(rb) == argmax(rt));
        }
        if args.greedy > 0 {
            let last = |l: &[f32]| argmax(&l[(args.ctx - 1) * n_vocab..]);
            let mut next = last(&lb);
            let mut greedy = Vec::with_capacity(args.greedy);
            for _ in 0..args.greedy {
                greedy.push(next);
                next = argmax(base.feed(&[next])?);
            }
            let mut predicted = vec![last(&lt)];
            let rest = test.feed_all_logits(&greedy[..args.greedy - 1])?;
            predicted.extend(rest.chunks(n_vocab).map(argmax));
            t.greedy_same += predicted
                .iter()
                .zip(&greedy)
                .filter(|(a, b)| a == b)
                .count();
            t.greedy_total += args.greedy;
        }
        if !args.json {
            t.progress(c + 1, n_chunks);
        }
    }
    Ok(Run {
        chunks: n_chunks,
        ctx: args.ctx,
        base: types(args.base_ctk, args.base_ctv, args.base_evaluation),
        test: types(args.cache_type_k, args.cache_type_v, args.evaluation),
    })
}

/// The tested session against llama.cpp's logits saved in `path`.
fn against_llama_cpp(
    args: &Args,
    model: &Arc<Model>,
    tokens: &[u32],
    path: &Path,
    t: &mut Tally,
) -> Result<Run> {
    let mut file = LlamaLogits::open(path)?;
    let n_vocab = model.hparams().n_vocab;
    if file.n_vocab != n_vocab {
        bail!(
            "{}: a vocabulary of {}, the model's is {n_vocab}",
            path.display(),
            file.n_vocab
        );
    }
    if file.n_ctx != args.ctx {
        bail!(
            "{} was computed with -c {}: pass --ctx {}",
            path.display(),
            file.n_ctx,
            file.n_ctx
        );
    }
    if args.greedy > 0 {
        bail!("--greedy needs our own base session, not --llama-cpp-logits");
    }
    llama_logits::check_tokens(&file.tokens, tokens)
        .with_context(|| format!("{} against our tokens of --file", path.display()))?;
    let n_chunks = args.chunks.map_or(file.n_chunk, |c| c.min(file.n_chunk));
    let mut test = session(
        args,
        model,
        args.cache_type_k,
        args.cache_type_v,
        args.evaluation,
    )?;
    let first = args.ctx / 2;
    let mut rows = Vec::new();
    for c in 0..n_chunks {
        let chunk = chunk_of(model, &file.tokens, args.ctx, c);
        file.read_chunk(&mut rows)?;
        test.clear();
        let lt = test.feed_all_logits(&chunk)?;
        for (r, i) in (first..args.ctx - 1).enumerate() {
            let row = file.row(&rows, r);
            let s = llama_logits::score(
                row,
                &lt[i * n_vocab..(i + 1) * n_vocab],
                chunk[i + 1] as usize,
            );
            t.add(s.nll_base, s.nll_test, s.kld, s.same_top);
        }
        if !args.json {
            t.progress(c + 1, n_chunks);
        }
    }
    Ok(Run {
        chunks: n_chunks,
        ctx: args.ctx,
        base: format!("llama.cpp ({})", path.display()),
        test: types(args.cache_type_k, args.cache_type_v, args.evaluation),
    })
}

/// The value at `fraction` of the sorted `values`, interpolated between neighbours (as
/// llama.cpp's percentiles are).
fn percentile(sorted: &[f64], fraction: f64) -> f64 {
    let p = fraction * (sorted.len() - 1) as f64;
    let i = p as usize;
    let w = p - i as f64;
    (1.0 - w) * sorted[i] + w * sorted[(i + 1).min(sorted.len() - 1)]
}

fn main() -> Result<()> {
    let args = Args::parse_from(engine::expand_llama_cpp_flags(std::env::args_os()));
    if args.ctx < 4 {
        bail!("--ctx must be at least 4");
    }
    let model = args.model.load()?;
    let text = std::fs::read_to_string(&args.file)
        .with_context(|| format!("reading {}", args.file.display()))?;
    let tokens = model.tokenizer().encode(&text, true, false)?;
    let start = std::time::Instant::now();
    let mut t = Tally::default();
    let run = match &args.llama_cpp_logits {
        Some(path) => against_llama_cpp(&args, &model, &tokens, path, &mut t)?,
        None => against_ours(&args, &model, &tokens, &mut t)?,
    };
    let n = t.kld.len();
    let mean_kld = t.kld.iter().sum::<f64>() / n as f64;
    let mut sorted = t.kld.clone();
    sorted.sort_by(f64::total_cmp);
    let p99 = percentile(&sorted, 0.99);
    let same_top = t.same_top as f64 / n as f64;
    let greedy = (t.greedy_total > 0).then(|| t.greedy_same as f64 / t.greedy_total as f64);
    let (ppl_base, ppl_test) = (Tally::ppl(t.nll_base, n), Tally::ppl(t.nll_test, n));
    let ppl_diff = 100.0 * (ppl_test / ppl_base - 1.0);
    if args.json {
        let out = serde_json::json!({
            "text_tokens": tokens.len(),
            "ctx": run.ctx,
            "chunks": run.chunks,
            "scored": n,
            "base": run.base,
            "test": run.test,
            "ppl_base": ppl_base,
            "ppl_test": ppl_test,
            "ppl_diff_percent": ppl_diff,
            "kld_mean": mean_kld,
            "kld_p99": p99,
            "same_top": same_top,
            "greedy_agreement": greedy,
            "greedy_tokens": t.greedy_total,
            "seconds": start.elapsed().as_secs_f64(),
            "cpu_path": engine::cpu_path().name,
        });
        println!("{out}");
        return Ok(());
    }
    println!(
        "{} chunks of {} tokens, {n} scored positions (CPU path {})",
        run.chunks,
        run.ctx,
        engine::cpu_path().name
    );
    println!(
        "perplexity: {} {ppl_base:.4}, {} {ppl_test:.4} ({ppl_diff:+.3}%)",
        run.base, run.test
    );
    if args.llama_cpp_logits.is_some() {
        println!("  (llama.cpp's from its stored rows, clamped 16 nats below the top: compare ours with the Final estimate of the run that saved them)");
    }
    println!("KL divergence: mean {mean_kld:.6}, 99th percentile {p99:.6}");
    println!("same most likely token: {:.2}%", 100.0 * same_top);
    if let Some(g) = greedy {
        println!(
            "greedy agreement over {} tokens: {:.2}%",
            t.greedy_total,
            100.0 * g
        );
    }
    Ok(())
}
