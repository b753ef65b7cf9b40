//! `cargo xtask compare-llama-cpp --refh PATH`: prefill and decode speed of our engine against
//! llama.cpp's reference harness, run alternately (first one, then the other first) in one script
//! on the same machine, model, prompt and thread count; prints medians, their ratios, the median of
//! the pairs' ratios and how many pairs ours won. With `--sequences N` both decode N sequences
//! together (llama.cpp's `refh batched`, our `bench --sequences N`) and the figures are aggregate
//! tokens per second. `--cache-type q8_0` makes both KV caches q8_0 (llama.cpp's through
//! `REFH_CTK`/`REFH_CTV`, ours through `-ctk`/`-ctv`).

use std::process::Command;

use clap::builder::NonEmptyStringValueParser;
use clap::Args;

use crate::{cargo, run, target_dir, workspace_root};

/// The command line of `cargo xtask compare-llama-cpp`.
#[derive(Args, Clone, Debug)]
pub(crate) struct CompareArgs {
    /// llama.cpp's reference harness (`refh`).
    #[arg(long, value_name = "PATH", value_parser = NonEmptyStringValueParser::new())]
    pub(crate) refh: String,
    /// The GGUF both load (relative to the workspace root).
    #[arg(
        long,
        value_name = "PATH",
        default_value = "models/SmolLM2-135M-Instruct.Q4_1.gguf"
    )]
    pub(crate) model: String,
    /// Tokens of the prompt (prefill).
    #[arg(long = "prompt-tokens", value_name = "N", default_value_t = 512)]
    pub(crate) prompt: usize,
    /// Tokens generated (decode).
    #[arg(long = "gen-tokens", value_name = "N", default_value_t = 128)]
    pub(crate) gen: usize,
    /// Threads of both.
    #[arg(long, value_name = "N", default_value_t = 2)]
    pub(crate) threads: usize,
    /// Pairs of runs, each program first in turn (at least 1).
    #[arg(long, value_name = "N", default_value_t = 5, value_parser = at_least_one)]
    pub(crate) reps: usize,
    /// Sequences decoded together (llama.cpp's `refh batched`, our `bench --sequences`; at
    /// least 1).
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = at_least_one)]
    pub(crate) sequences: usize,
    /// Both KV caches' type: `f16` or `q8_0`.
    #[arg(long, value_name = "TYPE", default_value = "f16")]
    pub(crate) cache_type: String,
    /// Ours with ggml's kernels and llama.cpp's bits (`bench --evaluation llama-cpp`).
    #[arg(long)]
    pub(crate) deterministic: bool,
    /// Our evaluation (`bench --evaluation`): invariant (the default), llama-cpp or fast.
    #[arg(long, value_name = "KIND", default_value = "invariant")]
    pub(crate) evaluation: String,
}

/// Parses a whole number; 0 counts as 1.
fn at_least_one(s: &str) -> Result<usize, String> {
    s.parse::<usize>()
        .map(|n| n.max(1))
        .map_err(|e| e.to_string())
}

fn json_of(
    program: &str,
    args: &[String],
    env: &[(&str, &str)],
) -> Result<serde_json::Value, String> {
    let out = Command::new(program)
        .args(args)
        .envs(env.iter().copied())
        .current_dir(workspace_root())
        .output()
        .map_err(|e| format!("{program}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{program} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'))
        .ok_or(format!("{program} printed no JSON"))?;
    serde_json::from_str(line).map_err(|e| format!("{program}: {e}"))
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Runs the comparison and prints one JSON object.
pub(crate) fn compare(o: &CompareArgs) -> Result<(), String> {
    run(
        &cargo(),
        &["build", "--release", "--quiet", "--example", "bench"],
    )?;
    let ours = target_dir().join("release/examples/bench");
    let ours = ours.to_string_lossy().into_owned();
    let (p, g, t) = (
        o.prompt.to_string(),
        o.gen.to_string(),
        o.threads.to_string(),
    );
    let n = o.sequences.to_string();
    let ref_args: Vec<String> = if o.sequences > 1 {
        vec![
            "batched".into(),
            o.model.clone(),
            n.clone(),
            p.clone(),
            g.clone(),
            t.clone(),
        ]
    } else {
        vec![
            "bench".into(),
            o.model.clone(),
            p.clone(),
            g.clone(),
            t.clone(),
        ]
    };
    let ct = o.cache_type.as_str();
    let ref_env = [("REFH_CTK", ct), ("REFH_CTV", ct)];
    let our_args: Vec<String> = [
        "-ctk",
        ct,
        "-ctv",
        ct,
        "--model",
        &o.model,
        "--prompt-tokens",
        &p,
        "--gen-tokens",
        &g,
        "--threads",
        &t,
        "--reps",
        "1",
        "--sequences",
        &n,
    ]
    .iter()
    .map(|s| s.to_string())
    .chain(["--evaluation".to_string(), o.evaluation.clone()])
    .chain(o.deterministic.then(|| "--deterministic".to_string()))
    .collect();
    let (mut rp, mut rd, mut op, mut od) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for rep in 0..o.reps {
        // Alternate which program runs first, so neither always meets a warmer machine.
        let (r, e) = if rep % 2 == 0 {
            let r = json_of(&o.refh, &ref_args, &ref_env)?;
            (r, json_of(&ours, &our_args, &[])?)
        } else {
            let e = json_of(&ours, &our_args, &[])?;
            (json_of(&o.refh, &ref_args, &ref_env)?, e)
        };
        let f = |v: &serde_json::Value, k: &str| v[k].as_f64().unwrap_or(f64::NAN);
        eprintln!(
            "rep {rep}: llama.cpp prefill {:.1} decode {:.1} | llama-hdd prefill {:.1} decode {:.1} tok/s",
            f(&r, "prefill_tps"),
            f(&r, "decode_tps"),
            f(&e, "prefill_tps"),
            f(&e, "decode_tps")
        );
        rp.push(f(&r, "prefill_tps"));
        rd.push(f(&r, "decode_tps"));
        op.push(f(&e, "prefill_tps"));
        od.push(f(&e, "decode_tps"));
    }
    // Each pair ran back to back, so its ratio is free of the drift between pairs.
    let pair_ratios = |ours: &[f64], theirs: &[f64]| -> Vec<f64> {
        ours.iter().zip(theirs).map(|(a, b)| a / b).collect()
    };
    let (mut prefill_pairs, mut decode_pairs) = (pair_ratios(&op, &rp), pair_ratios(&od, &rd));
    let faster = |v: &[f64]| v.iter().filter(|r| **r > 1.0).count();
    let (prefill_faster, decode_faster) = (faster(&prefill_pairs), faster(&decode_pairs));
    let (rp, rd, op, od) = (
        median(&mut rp),
        median(&mut rd),
        median(&mut op),
        median(&mut od),
    );
    let out = serde_json::json!({
        "prompt_tokens": o.prompt, "gen_tokens": o.gen, "threads": o.threads, "reps": o.reps,
        "sequences": o.sequences, "cache_type": o.cache_type, "deterministic": o.deterministic,
        "evaluation": o.evaluation,
        "llama_cpp": { "prefill_tps": rp, "decode_tps": rd },
        "llama_hdd": { "prefill_tps": op, "decode_tps": od },
        "ratio": { "prefill": op / rp, "decode": od / rd },
        "pair_ratio_median": {
            "prefill": median(&mut prefill_pairs),
            "decode": median(&mut decode_pairs),
        },
        "pairs_faster": { "prefill": prefill_faster, "decode": decode_faster },
    });
    println!("{out}");
    Ok(())
}
