//! `cargo xtask compare-llama-cpp --refh PATH`: prefill and decode speed of our engine against
//! llama.cpp's reference harness, run alternately (first one, then the other first) in one script
//! on the same machine, model, prompt and thread count; prints medians, their ratios, the median of
//! the pairs' ratios and how many pairs ours won. With `--sequences N` both decode N sequences
//! together (llama.cpp's `refh batched`, our `bench --sequences N`) and the figures are aggregate
//! tokens per second. `--cache-type q8_0` makes both KV caches q8_0 (llama.cpp's through
//! `REFH_CTK`/`REFH_CTV`, ours through `-ctk`/`-ctv`).

use std::process::Command;

use crate::{cargo, run, workspace_root};

struct Options {
    refh: String,
    model: String,
    prompt: usize,
    gen: usize,
    threads: usize,
    reps: usize,
    sequences: usize,
    cache_type: String,
    /// Ours with batch-invariant evaluation (`bench --deterministic`).
    deterministic: bool,
}

fn parse(args: &[String]) -> Result<Options, String> {
    let mut o = Options {
        refh: String::new(),
        model: "models/SmolLM2-135M-Instruct.Q4_1.gguf".into(),
        prompt: 512,
        gen: 128,
        threads: 2,
        reps: 5,
        sequences: 1,
        cache_type: "f16".into(),
        deterministic: false,
    };
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        if flag == "--deterministic" {
            o.deterministic = true;
            continue;
        }
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let num = || {
            value
                .parse::<usize>()
                .map_err(|e| format!("{flag} {value}: {e}"))
        };
        match flag.as_str() {
            "--refh" => o.refh = value.clone(),
            "--model" => o.model = value.clone(),
            "--prompt-tokens" => o.prompt = num()?,
            "--gen-tokens" => o.gen = num()?,
            "--threads" => o.threads = num()?,
            "--reps" => o.reps = num()?.max(1),
            "--sequences" => o.sequences = num()?.max(1),
            "--cache-type" => o.cache_type = value.clone(),
            other => return Err(format!("unknown option {other}")),
        }
    }
    if o.refh.is_empty() {
        return Err("--refh PATH (llama.cpp's reference harness) is required".into());
    }
    Ok(o)
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
pub fn compare(args: &[String]) -> Result<(), String> {
    let o = parse(args)?;
    run(
        &cargo(),
        &["build", "--release", "--quiet", "--example", "bench"],
    )?;
    let ours = workspace_root().join("target/release/examples/bench");
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
