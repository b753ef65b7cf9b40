//! `cargo xtask crash-test`: SIGKILL a process that saves conversations, again and again, and
//! check after every kill that each committed checkpoint restores to the exact KV bytes it was
//! saved with (the `crashtest` example does the saving and the checking), and every few kills
//! that `ckpt verify` finds every file of the store sound.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use indicatif::{ProgressBar, ProgressStyle};

use crate::{cargo, run, workspace_root};

struct Options {
    kills: usize,
    model: String,
    dir: PathBuf,
    min_ms: u64,
    max_ms: u64,
    verify_every: usize,
}

fn parse(args: &[String]) -> Result<Options, String> {
    let root = workspace_root();
    let mut o = Options {
        kills: 100,
        model: root
            .join("models/SmolLM2-135M-Instruct.Q4_1.gguf")
            .to_string_lossy()
            .into_owned(),
        dir: root.join("target/crash-test"),
        min_ms: 0,
        max_ms: 1000,
        verify_every: 10,
    };
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let mut value = || {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{flag} needs a value"))
        };
        let number = |v: String| {
            v.parse::<u64>()
                .map_err(|_| format!("{flag}: `{v}` is not a whole number"))
        };
        match flag.as_str() {
            "--kills" => o.kills = number(value()?)? as usize,
            "--model" => o.model = value()?,
            "--dir" => o.dir = PathBuf::from(value()?),
            "--min-ms" => o.min_ms = number(value()?)?,
            "--max-ms" => o.max_ms = number(value()?)?,
            "--verify-every" => o.verify_every = number(value()?)?.max(1) as usize,
            other => {
                return Err(format!(
                    "crash-test: unknown option `{other}` (options: --kills N, --model PATH, \
                     --dir DIR, --min-ms MS, --max-ms MS, --verify-every N)"
                ))
            }
        }
    }
    if o.min_ms >= o.max_ms {
        return Err("crash-test: --min-ms must be below --max-ms".into());
    }
    if !Path::new(&o.model).is_file() {
        return Err(format!(
            "crash-test: no model at {} (run `cargo xtask fetch-model` or pass --model)",
            o.model
        ));
    }
    Ok(o)
}

/// Totals over the run.
#[derive(Default)]
struct Tally {
    /// Names found in their last completed state.
    old: u64,
    /// Kills that came in the middle of a change (between its intent and its done line).
    interrupted: u64,
    /// Names found in the state a killed change was making.
    new: u64,
    /// Lost or corrupt checkpoints.
    bad: u64,
    verifies: u64,
    verify_failures: u64,
}

pub fn crash_test(args: &[String]) -> Result<(), String> {
    let o = parse(args)?;
    run(
        &cargo(),
        &["build", "--release", "--quiet", "--example", "crashtest"],
    )?;
    crate::build_ckpt()?;
    let bin = workspace_root().join("target/release");
    let child = bin.join("examples/crashtest");
    let ckpt = bin.join("ckpt");
    let _ = std::fs::remove_dir_all(&o.dir);
    std::fs::create_dir_all(&o.dir).map_err(|e| format!("{}: {e}", o.dir.display()))?;
    let store = o.dir.join("store");
    let journal = o.dir.join("journal");
    let common = |mode: &str| {
        let mut c = Command::new(&child);
        c.arg(mode)
            .arg("--model")
            .arg(&o.model)
            .arg("--store")
            .arg(&store)
            .arg("--journal")
            .arg(&journal);
        c
    };
    let mut rng = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64)
        | 1;
    let mut next = move |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n
    };
    let bar = ProgressBar::new(o.kills as u64);
    bar.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} kills {msg} ({elapsed})")
            .map_err(|e| e.to_string())?,
    );
    let started = Instant::now();
    let mut t = Tally::default();
    for kill in 0..o.kills {
        let mut work = common("work")
            .arg("--seed")
            .arg((kill + 1).to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("starting {}: {e}", child.display()))?;
        // The clock starts once the worker has loaded the model and opened the store.
        let mut ready = String::new();
        if let Some(out) = work.stdout.take() {
            BufReader::new(out)
                .read_line(&mut ready)
                .map_err(|e| e.to_string())?;
        }
        if ready.trim() != "ready" {
            let out = work.wait_with_output().map_err(|e| e.to_string())?;
            return Err(format!(
                "the worker did not start:\n{}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let delay = o.min_ms + next(o.max_ms - o.min_ms);
        std::thread::sleep(Duration::from_millis(delay));
        if let Ok(Some(status)) = work.try_wait() {
            let out = work.wait_with_output().map_err(|e| e.to_string())?;
            return Err(format!(
                "the worker stopped by itself ({status}) before its kill:\n{}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        // SIGKILL: no destructor, no flush, nothing of the worker's own runs.
        work.kill().map_err(|e| e.to_string())?;
        let _ = work.wait();
        let out = common("check").output().map_err(|e| e.to_string())?;
        let line = String::from_utf8_lossy(&out.stdout);
        let report: serde_json::Value = serde_json::from_str(line.trim()).map_err(|e| {
            format!(
                "check after kill {kill} gave no report ({e}):\n{line}\n{}",
                String::from_utf8_lossy(&out.stderr)
            )
        })?;
        t.old += report["old"].as_u64().unwrap_or(0);
        t.interrupted += report["interrupted"].as_u64().unwrap_or(0);
        t.new += report["new"].as_u64().unwrap_or(0);
        let bad = report["bad"].as_u64().unwrap_or(0);
        if bad > 0 {
            t.bad += bad;
            bar.println(format!("kill {kill}: {}", report["problems"]));
        }
        if (kill + 1) % o.verify_every == 0 || kill + 1 == o.kills {
            t.verifies += 1;
            let v = Command::new(&ckpt)
                .arg("verify")
                .arg(&store)
                .output()
                .map_err(|e| format!("running {}: {e}", ckpt.display()))?;
            if !v.status.success() {
                t.verify_failures += 1;
                bar.println(format!(
                    "kill {kill}: ckpt verify failed:\n{}",
                    String::from_utf8_lossy(&v.stdout)
                ));
            }
        }
        bar.set_message(format!(
            "mid-change {} old {} new {} bad {} verify failures {}",
            t.interrupted, t.old, t.new, t.bad, t.verify_failures
        ));
        bar.inc(1);
    }
    bar.finish();
    println!(
        "{}",
        serde_json::json!({
            "kills": o.kills,
            "names_checked": t.old + t.new + t.bad,
            "interrupted_changes": t.interrupted,
            "found_old": t.old,
            "found_new": t.new,
            "lost_or_corrupt": t.bad,
            "verify_runs": t.verifies,
            "verify_failures": t.verify_failures,
            "seconds": started.elapsed().as_secs_f64().round(),
        })
    );
    if t.bad > 0 || t.verify_failures > 0 {
        return Err("crash-test found lost or corrupt checkpoints".into());
    }
    Ok(())
}
