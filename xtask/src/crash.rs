//! `cargo xtask crash-test`: SIGKILL a process that saves conversations, again and again, and
//! check after every kill that each committed checkpoint restores to the exact KV bytes it was
//! saved with (the `crashtest` example does the saving and the checking), and every few kills
//! that `ckpt verify` finds every file of the store sound.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};

use crate::{cargo, model, run, target_dir};

/// The command line of `cargo xtask crash-test`.
#[derive(Args, Clone, Debug)]
pub(crate) struct CrashTestArgs {
    /// How many times the saving process is killed.
    #[arg(long, value_name = "N", default_value_t = 100)]
    pub(crate) kills: usize,
    /// The GGUF the saving process runs.
    #[arg(long, value_name = "PATH", default_value_os_t = model::default_path())]
    pub(crate) model: PathBuf,
    /// Where the store and the journal go (emptied first).
    #[arg(long, value_name = "DIR", default_value_os_t = target_dir().join("crash-test"))]
    pub(crate) dir: PathBuf,
    /// The shortest time a process runs before its kill.
    #[arg(long, value_name = "MS", default_value_t = 0)]
    pub(crate) min_ms: u64,
    /// The longest time a process runs before its kill (above `--min-ms`).
    #[arg(long, value_name = "MS", default_value_t = 1000)]
    pub(crate) max_ms: u64,
    /// Run `ckpt verify` on the store every N kills, and after the last (0 counts as 1).
    #[arg(long, value_name = "N", default_value_t = 10, value_parser = at_least_one)]
    pub(crate) verify_every: usize,
}

/// Parses a whole number; 0 counts as 1.
fn at_least_one(s: &str) -> Result<usize, String> {
    s.parse::<u64>()
        .map(|n| n.max(1) as usize)
        .map_err(|_| format!("`{s}` is not a whole number"))
}

/// What the run needs that the parser cannot check: a window to kill in, and the model.
fn check(o: &CrashTestArgs) -> Result<(), String> {
    if o.min_ms >= o.max_ms {
        return Err("crash-test: --min-ms must be below --max-ms".into());
    }
    if !o.model.is_file() {
        return Err(format!(
            "crash-test: no model at {} (run `cargo xtask fetch-model` or pass --model)",
            o.model.display()
        ));
    }
    Ok(())
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

/// Entry point of `cargo xtask crash-test`: the kills, the checks after each, a JSON summary.
pub(crate) fn crash_test(o: &CrashTestArgs) -> Result<(), String> {
    check(o)?;
    run(
        &cargo(),
        &["build", "--release", "--quiet", "--example", "crashtest"],
    )?;
    crate::build_ckpt()?;
    let bin = target_dir().join("release");
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
