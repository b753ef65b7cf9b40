//! `cargo xtask bench-server --workload router`: several models behind one server, ours and
//! llama.cpp's `llama-server`, both in router mode (no `-m`, `--models-dir` of two models:
//! the benchmark's model as `a` and Gemma 3 270M, found beside it, as `b`), with
//! `--models-max 1`, one slot and `-c 4096`.
//!
//! Each round starts both routers afresh (ours with an empty cache directory) and plays, through
//! `POST /completion` (`temperature: 0`, `n_predict` 16):
//! 1. `a` with a long prompt (about 1,500 tokens): the model is loaded, the prompt computed;
//! 2. `a` with it again: the cached prompt in the same process;
//! 3. `b` with a short prompt: `a` is unloaded to make room;
//! 4. `a` with the long prompt again: `a` is loaded again, and its prompt is either read back
//!    from disk (`cache_n`) or computed again.
//!
//! Per step: the client's wall time (load included) and the server's `prompt_n` and `cache_n`.
//! Then the proxy's cost, on each server: the same short request (`n_predict` 1, its prompt
//! cached) 40 times to a model process directly (`-m`) and through the router, and one reply of
//! 128 tokens each way; medians. `--repeats N` plays N rounds. A table goes to stderr, a JSON
//! report to stdout.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::bench_args::Options;
use crate::bench_server::{self, percentile, Kind, Server};

/// `-c` of every model process.
const CTX: usize = 4096;

/// Starts `bin` with the workload's common options and `args`; waits for `/health`.
fn start(
    kind: Kind,
    bin: &Path,
    o: &Options,
    args: &[String],
    log: &Path,
) -> Result<Server, String> {
    let mut all = vec![
        "-t".to_owned(),
        o.threads.to_string(),
        "-np".to_owned(),
        "1".to_owned(),
        "-c".to_owned(),
        CTX.to_string(),
    ];
    all.extend(args.iter().cloned());
    Server::launch(kind, bin, &all, log)
}

/// One `/completion`: the client's wall time (ms) and the reply.
fn complete(
    base: &str,
    model: &str,
    prompt: &str,
    n_predict: usize,
) -> Result<(f64, Value), String> {
    let t = Instant::now();
    let body = json!({
        "model": model, "prompt": prompt, "n_predict": n_predict,
        "temperature": 0, "cache_prompt": true,
    });
    let resp = ureq::post(&format!("{base}/completion"))
        .set("Content-Type", "application/json")
        .timeout(Duration::from_secs(600))
        .send_string(&body.to_string())
        .map_err(|e| format!("{model}: {e}"))?;
    let reply: Value = serde_json::from_reader(resp.into_reader()).map_err(|e| e.to_string())?;
    Ok((t.elapsed().as_secs_f64() * 1e3, reply))
}

fn step(name: &str, (ms, r): (f64, Value)) -> Value {
    json!({
        "step": name,
        "wall_ms": ms,
        "prompt_n": r["timings"]["prompt_n"],
        "cache_n": r["timings"]["cache_n"],
    })
}

/// A folder with `a.gguf` and `b.gguf` linked to the two models.
fn models_dir(dir: &Path, a: &Path, b: &Path) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    for (name, target) in [("a.gguf", a), ("b.gguf", b)] {
        let link = dir.join(name);
        let _ = std::fs::remove_file(&link);
        let target =
            std::fs::canonicalize(target).map_err(|e| format!("{}: {e}", target.display()))?;
        std::os::unix::fs::symlink(target, &link).map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// Entry point of the `router` workload.
pub(crate) fn bench_router(o: &Options) -> Result<(), String> {
    let servers = bench_server::servers(o)?;
    let second = o
        .model
        .parent()
        .unwrap_or(Path::new("."))
        .join("gemma-3-270m-q4_k_m.gguf");
    if !second.exists() {
        return Err(format!(
            "bench-server --workload router: no second model at {} (run `cargo xtask fetch-model`)",
            second.display()
        ));
    }
    let work: PathBuf = std::env::temp_dir().join(format!("bench-router-{}", std::process::id()));
    let dir = work.join("models");
    models_dir(&dir, &o.model, &second)?;
    let mut words = bench_server::Words(7);
    let mut report = serde_json::Map::new();
    for (kind, bin) in &servers {
        let mut rounds = Vec::new();
        for round in 0..o.repeats.max(1) {
            let cache = work.join(format!("cache-{}-{round}", kind.name()));
            let _ = std::fs::remove_dir_all(&cache);
            let mut args = vec!["--models-dir".to_owned(), dir.display().to_string()];
            args.extend(["--models-max".to_owned(), "1".to_owned()]);
            if *kind == Kind::Ours {
                args.extend(["--cache-dir".to_owned(), cache.display().to_string()]);
            }
            let log = work.join(format!("{}-router-{round}.log", kind.name()));
            let router = start(*kind, bin, o, &args, &log)?;
            // About 1,500 tokens, different in each round.
            let long = words.text(1100);
            let steps = vec![
                step("a cold", complete(&router.base, "a", &long, 16)?),
                step("a again", complete(&router.base, "a", &long, 16)?),
                step(
                    "b (a unloaded)",
                    complete(&router.base, "b", "Hello there.", 16)?,
                ),
                step("a reloaded", complete(&router.base, "a", &long, 16)?),
            ];
            eprintln!(
                "{} round {round}: {}",
                kind.name(),
                Value::Array(steps.clone())
            );
            rounds.push(Value::Array(steps));
            router.stop()?;
        }
        let overhead = proxy_cost(*kind, bin, o, &dir, &work)?;
        report.insert(
            kind.name().into(),
            json!({ "rounds": rounds, "proxy": overhead }),
        );
    }
    let _ = std::fs::remove_dir_all(&work);
    let out = Value::Object(report);
    let mut stdout = std::io::stdout();
    let _ = writeln!(
        stdout,
        "{}",
        serde_json::to_string_pretty(&out).unwrap_or_default()
    );
    Ok(())
}

/// The same short request and one 128-token reply, to a model process started with `-m` and
/// through a router: medians in ms.
fn proxy_cost(
    kind: Kind,
    bin: &Path,
    o: &Options,
    dir: &Path,
    work: &Path,
) -> Result<Value, String> {
    let prompt = "The quick brown fox jumps over the lazy dog.";
    let measure = |base: &str, model: &str| -> Result<(f64, f64), String> {
        complete(base, model, prompt, 1)?; // load and cache
        let mut short = Vec::new();
        for _ in 0..40 {
            short.push(complete(base, model, prompt, 1)?.0);
        }
        let mut long = Vec::new();
        for _ in 0..3 {
            long.push(complete(base, model, prompt, 128)?.0);
        }
        Ok((percentile(&short, 50.0), percentile(&long, 50.0)))
    };
    let cache = work.join(format!("cache-{}-proxy", kind.name()));
    let mut direct_args = vec!["-m".to_owned(), o.model.display().to_string()];
    let mut router_args = vec!["--models-dir".to_owned(), dir.display().to_string()];
    if kind == Kind::Ours {
        for a in [&mut direct_args, &mut router_args] {
            a.extend(["--cache-dir".to_owned(), cache.display().to_string()]);
        }
    }
    let direct = start(
        kind,
        bin,
        o,
        &direct_args,
        &work.join(format!("{}-direct.log", kind.name())),
    )?;
    let d = measure(&direct.base, "a")?;
    direct.stop()?;
    let router = start(
        kind,
        bin,
        o,
        &router_args,
        &work.join(format!("{}-proxy.log", kind.name())),
    )?;
    let r = measure(&router.base, "a")?;
    router.stop()?;
    eprintln!(
        "{}: a 1-token request {:.1} ms direct, {:.1} ms through the router; 128 tokens {:.0} ms and {:.0} ms",
        kind.name(),
        d.0,
        r.0,
        d.1,
        r.1
    );
    Ok(json!({
        "short_direct_ms": d.0, "short_router_ms": r.0,
        "reply128_direct_ms": d.1, "reply128_router_ms": r.1,
    }))
}
