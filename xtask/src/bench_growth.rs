//! `cargo xtask bench-server --workload growth`: does the cache slow down as it fills? For each
//! count in `--sizes` (default 10,1000,10000), a fresh cache directory gets that many other
//! cached conversations (`bench --fill-store`: a shared block and a tail each, as a server
//! leaves them), and our server runs on it with a disk budget it fills: what the directory
//! holds, plus a 2,000-token prompt and one 300-token prompt, plus 2 MiB.
//!
//! Per count: the 2,000-token prompt is computed and stored by one server process; then, in
//! each of `--reps` (default 3) fresh processes, it is asked again (time to first token, its
//! blocks read from disk) and three new 300-token prompts follow, whose writes make room under
//! the full budget; the write-behind thread's time per round comes from `/metrics`
//! (`cache_writer_microseconds_total / cache_writer_rounds_total`). Reported: medians per
//! count, and the largest over the smallest across counts (the goal: at most 1.3).

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::bench_args::Options;
use crate::bench_server::{self, percentile, Kind, Server};
use crate::{cargo, run, target_dir};

/// Tokens of the measured prompt.
const PROMPT_TOKENS: usize = 2000;

/// Entry point of `cargo xtask bench-server --workload growth`.
pub(crate) fn bench_growth(o: &Options, sizes: &[usize]) -> Result<(), String> {
    let servers = bench_server::servers(o)?;
    let Some((_, ours)) = servers.iter().find(|(k, _)| *k == Kind::Ours) else {
        return Err("growth measures our server only".into());
    };
    run(
        &cargo(),
        &["build", "--release", "--quiet", "--example", "bench"],
    )?;
    let mut rows = Vec::new();
    for &n in sizes {
        let row = one_size(ours, o, n)?;
        eprintln!("{n} conversations: {row}");
        rows.push((n, row));
    }
    let spread = |key: &str| {
        let v: Vec<f64> = rows.iter().filter_map(|(_, r)| r[key].as_f64()).collect();
        let max = v.iter().copied().fold(f64::NAN, f64::max);
        let min = v.iter().copied().fold(f64::NAN, f64::min);
        max / min
    };
    let mut report = serde_json::Map::new();
    for (n, row) in &rows {
        report.insert(n.to_string(), row.clone());
    }
    report.insert(
        "largest_over_smallest".into(),
        json!({"ttft": spread("ttft_ms"), "writer_round": spread("writer_round_ms")}),
    );
    let out = serde_json::to_string_pretty(&Value::Object(report)).unwrap_or_default();
    let _ = writeln!(std::io::stdout(), "{out}");
    Ok(())
}

fn bytes_under(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => bytes_under(&e.path()),
            Ok(_) => e.metadata().map_or(0, |m| m.len()),
            Err(_) => 0,
        })
        .sum()
}

/// A prompt of token ids, `tokens` long, unlike those of any other `seed`.
fn prompt(seed: u64, tokens: usize) -> Vec<u64> {
    (0..tokens as u64)
        .map(|i| 300 + (i * 7907 + seed * 104_729) % 40_000)
        .collect()
}

/// Posts a streamed completion of `prompt`; the time to its first token, in ms, and `cache_n`.
fn complete(base: &str, prompt: &[u64]) -> Result<(f64, u64), String> {
    let body = json!({"prompt": prompt, "n_predict": 4, "temperature": 0, "stream": true,
                      "cache_prompt": true});
    let start = Instant::now();
    let resp = ureq::post(&format!("{base}/completion"))
        .set("Content-Type", "application/json")
        .timeout(Duration::from_secs(600))
        .send_string(&body.to_string())
        .map_err(|e| format!("completion failed: {e}"))?;
    let mut ttft = f64::NAN;
    let mut cache_n = 0;
    for line in BufReader::new(resp.into_reader()).lines() {
        let line = line.map_err(|e| e.to_string())?;
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        let v: Value = serde_json::from_str(data).map_err(|e| format!("{data}: {e}"))?;
        if ttft.is_nan() && v["content"].as_str().is_some_and(|c| !c.is_empty()) {
            ttft = start.elapsed().as_secs_f64() * 1e3;
        }
        if let Some(n) = v["timings"]["cache_n"].as_u64() {
            cache_n = n;
        }
    }
    Ok((ttft, cache_n))
}

fn metric(base: &str, name: &str) -> Result<f64, String> {
    let text = ureq::get(&format!("{base}/metrics"))
        .call()
        .map_err(|e| format!("/metrics: {e}"))?
        .into_string()
        .map_err(|e| e.to_string())?;
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("llamahdd:{name} ")))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| format!("/metrics has no {name}"))
}

/// Waits until the writer has had no new round for 1.5 s (or 30 s passed).
fn writer_settled(base: &str) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last = metric(base, "cache_writer_rounds_total")?;
    loop {
        std::thread::sleep(Duration::from_millis(1500));
        let now = metric(base, "cache_writer_rounds_total")?;
        if now == last || Instant::now() > deadline {
            return Ok(());
        }
        last = now;
    }
}

fn one_size(ours: &Path, o: &Options, n: usize) -> Result<Value, String> {
    let dir = o.dir.join(format!("growth-{n}"));
    let _ = std::fs::remove_dir_all(&dir);
    let cache = dir.join("cache");
    std::fs::create_dir_all(&cache).map_err(|e| format!("{}: {e}", cache.display()))?;
    let bench = target_dir().join("release/examples/bench");
    let fill = std::process::Command::new(&bench)
        .arg("--model")
        .arg(&o.model)
        .args(["--threads", "2", "--fill-store"])
        .arg(&cache)
        .args(["--conversations", &n.to_string()])
        .output()
        .map_err(|e| format!("{}: {e}", bench.display()))?;
    if !fill.status.success() {
        return Err(format!(
            "filling the store failed: {}",
            String::from_utf8_lossy(&fill.stderr)
        ));
    }
    let filled = bytes_under(&cache);
    let report: Value = serde_json::from_slice(&fill.stdout)
        .map_err(|e| format!("bench --fill-store printed no JSON: {e}"))?;
    let per_token = report["kv_bytes_per_token"]
        .as_u64()
        .ok_or("bench --fill-store did not say the KV bytes a token")?;
    // Room for the measured prompt and one of the later ones: the other two make room by
    // evicting.
    let budget = filled + (PROMPT_TOKENS as u64 + 64 + 300 + 64) * per_token + (2 << 20);
    let extra = vec![
        "--cache-disk".to_string(),
        format!("{}KiB", budget / 1024),
        "--metrics".to_string(),
    ];
    let start =
        |log: &str| Server::start(Kind::Ours, ours, o, 1, 4096, &cache, &dir.join(log), &extra);
    let measured = prompt(1, PROMPT_TOKENS);
    let server = start("first.log")?;
    complete(&server.base, &measured)?;
    writer_settled(&server.base)?;
    server.stop()?;
    let (mut ttfts, mut rounds) = (Vec::new(), Vec::new());
    for rep in 0..o.reps {
        let server = start(&format!("rep{rep}.log"))?;
        let (ttft, cache_n) = complete(&server.base, &measured)?;
        if cache_n + 1 < PROMPT_TOKENS as u64 {
            return Err(format!(
                "{n} conversations, rep {rep}: the prompt came back with cache_n {cache_n} only"
            ));
        }
        ttfts.push(ttft);
        writer_settled(&server.base)?;
        let (r0, us0) = (
            metric(&server.base, "cache_writer_rounds_total")?,
            metric(&server.base, "cache_writer_microseconds_total")?,
        );
        for k in 0..3 {
            complete(&server.base, &prompt(1000 + rep as u64 * 10 + k, 300))?;
            writer_settled(&server.base)?;
        }
        let (r1, us1) = (
            metric(&server.base, "cache_writer_rounds_total")?,
            metric(&server.base, "cache_writer_microseconds_total")?,
        );
        if r1 > r0 {
            rounds.push((us1 - us0) / (r1 - r0) / 1e3);
        }
        server.stop()?;
    }
    Ok(json!({
        "conversations": n,
        "store_bytes_before": filled,
        "disk_budget": budget,
        "ttft_ms": percentile(&ttfts, 50.0),
        "ttft_ms_each": ttfts,
        "writer_round_ms": percentile(&rounds, 50.0),
        "writer_round_ms_each": rounds,
    }))
}
