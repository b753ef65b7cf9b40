//! `cargo xtask bench-beyond-ram`: a context past the model's training length whose KV cache
//! does not fit in the memory the process is given.
//!
//! Memory, side by side: our `bench` with `--kv-ram` and llama.cpp's reference harness (`refh
//! bench`, which allocates its whole KV cache at start) each run in a fresh memory cgroup with
//! `--limit` (v1 or v2, whichever holds the memory controller). Per run: the exit status, whether
//! the cgroup's OOM killer struck, the cgroup's peak charge (page cache included), the peak of its
//! anonymous memory (sampled every 50 ms), and the wall time. Ours then runs again without the
//! limit and with every page resident, and its greedy tokens must equal the limited run's.
//!
//! Speed (unless `--skip-speed`), outside any cgroup: ours resident against ours with `--kv-ram`
//! (spilled blocks in the page cache), then with `--evict` (every decoded token reads them from
//! the disk), set against the time the disk takes to read the same bytes.
//!
//! Prints a table, then one JSON line. Fails when ours fails under the limit or its tokens
//! differ from the resident run's.

use std::io::Read;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use clap::Args;
use serde_json::{json, Value};

mod cgroup;

use crate::{cargo, run, target_dir, workspace_root};
use cgroup::Cgroup;

/// The command line of `cargo xtask bench-beyond-ram`.
#[derive(Args, Clone, Debug)]
pub(crate) struct BeyondRamArgs {
    /// llama.cpp's reference harness (`refh`); without it llama.cpp's side is skipped.
    #[arg(long, value_name = "PATH")]
    pub(crate) refh: Option<PathBuf>,
    /// The GGUF both load (relative to the workspace root).
    #[arg(
        long,
        value_name = "PATH",
        default_value = "models/SmolLM2-135M-Instruct.Q4_1.gguf"
    )]
    pub(crate) model: String,
    /// Tokens of the prompt (prefill).
    #[arg(long = "prompt-tokens", value_name = "N", default_value_t = 16384)]
    pub(crate) prompt: usize,
    /// Tokens generated (decode).
    #[arg(long = "gen-tokens", value_name = "N", default_value_t = 32)]
    pub(crate) gen: usize,
    /// The memory cgroup's limit (`256MiB`, `1GiB`).
    #[arg(long, value_name = "SIZE", default_value = "256MiB", value_parser = size)]
    pub(crate) limit: u64,
    /// Our KV pool's RAM budget (`bench --kv-ram`).
    #[arg(long = "kv-ram", value_name = "SIZE", default_value = "64MiB")]
    pub(crate) kv_ram: String,
    /// Threads of both.
    #[arg(long, value_name = "N", default_value_t = 2)]
    pub(crate) threads: usize,
    /// Repetitions of each speed run (`bench --reps`; the median).
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub(crate) reps: usize,
    /// Only the memory comparison.
    #[arg(long = "skip-speed")]
    pub(crate) skip_speed: bool,
}

/// A byte size: a number and an optional unit (`B`, `KB`/`KiB`, `MB`/`MiB`, `GB`/`GiB`).
fn size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let scale: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" => 1000,
        "kib" => 1 << 10,
        "m" | "mb" => 1_000_000,
        "mib" => 1 << 20,
        "g" | "gb" => 1_000_000_000,
        "gib" => 1 << 30,
        _ => return Err(format!("{text:?}: unknown unit (examples: 256MiB, 1GiB)")),
    };
    num.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(scale))
        .ok_or_else(|| format!("{text:?}: not a size (examples: 256MiB, 1GiB)"))
}

/// What one run did.
struct Outcome {
    /// How it ended.
    status: ExitStatus,
    /// Seconds from its start to its end.
    wall_s: f64,
    /// Its standard output.
    stdout: String,
    /// Its standard error.
    stderr: String,
    /// The cgroup's peak charge (with a cgroup).
    peak: Option<u64>,
    /// The highest anonymous memory sampled (with a cgroup).
    anon_peak: Option<u64>,
    /// OOM kills in the cgroup during the run (with a cgroup).
    oom_kills: Option<u64>,
    /// Major page faults in the cgroup (with a cgroup).
    major_faults: Option<u64>,
    /// Bytes the process had read from the disk at its last sample (`/proc/PID/io`
    /// `read_bytes`, every 50 ms: a lower bound).
    disk_read: Option<u64>,
}

impl Outcome {
    /// The last JSON line the program printed.
    fn json(&self) -> Option<Value> {
        let line = self
            .stdout
            .lines()
            .rev()
            .find(|l| l.trim_start().starts_with('{'))?;
        serde_json::from_str(line).ok()
    }

    /// The last `n` lines of its standard error.
    fn stderr_tail(&self, n: usize) -> String {
        let lines: Vec<&str> = self.stderr.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// `0`, `exit 1`, or `SIGKILL` (signal 9).
    fn exit(&self) -> String {
        match (self.status.code(), self.status.signal()) {
            (Some(c), _) => c.to_string(),
            (None, Some(9)) => "SIGKILL".into(),
            (None, Some(s)) => format!("signal {s}"),
            (None, None) => "?".into(),
        }
    }

    /// Killed by signal 9, or the cgroup's OOM counter went up.
    fn oom_killed(&self) -> bool {
        self.status.signal() == Some(9) || self.oom_kills.unwrap_or(0) > 0
    }

    /// The memory side's figures, as JSON.
    fn report(&self) -> Value {
        let j = self.json();
        let get = |k: &str| j.as_ref().map_or(Value::Null, |j| j[k].clone());
        json!({
            "exit": self.exit(),
            "exit_code": self.status.code(),
            "signal": self.status.signal(),
            "oom_killed": self.oom_killed(),
            "oom_kills": self.oom_kills,
            "major_faults": self.major_faults,
            "disk_read_bytes": self.disk_read,
            "spill_bytes_read": get("spill_bytes_read"),
            "wall_s": self.wall_s,
            "cgroup_peak_bytes": self.peak,
            "anon_peak_bytes": self.anon_peak,
            "vm_hwm_kib": get("vm_hwm_kib"),
            "kv_pages_spilled": get("kv_pages_spilled"),
            "prefill_tps": get("prefill_tps"),
            "decode_tps": get("decode_tps"),
            "stderr_tail": if self.status.success() { Value::Null } else { json!(self.stderr_tail(8)) },
        })
    }
}

/// Runs `program args` in the workspace root, inside a fresh cgroup limited to `limit` bytes
/// when given (the child joins it before it execs), and waits for it.
fn measure(program: &Path, args: &[String], limit: Option<(u64, &str)>) -> Result<Outcome, String> {
    eprintln!("$ {} {}", program.display(), args.join(" "));
    let cgroup = limit
        .map(|(bytes, name)| Cgroup::create(name, bytes))
        .transpose()?;
    let mut cmd = match &cgroup {
        Some(c) => {
            let mut cmd = Command::new("sh");
            cmd.arg("-c")
                .arg(r#"echo $$ > "$0" && exec "$@""#)
                .arg(c.procs())
                .arg(program);
            cmd
        }
        None => Command::new(program),
    };
    cmd.args(args)
        .current_dir(workspace_root())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let done = AtomicBool::new(false);
    let start = Instant::now();
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("could not run {}: {e}", program.display()))?;
    let (mut out, mut err) = (child.stdout.take(), child.stderr.take());
    let io = PathBuf::from(format!("/proc/{}/io", child.id()));
    let (status, stdout, stderr, (anon_peak, disk_read)) = std::thread::scope(|s| {
        let sampler = s.spawn(|| {
            let (mut peak, mut read): (Option<u64>, Option<u64>) = (None, None);
            let most = |m: Option<u64>, v: u64| Some(m.map_or(v, |m| m.max(v)));
            while !done.load(Ordering::Relaxed) {
                if let Some(a) = cgroup.as_ref().and_then(Cgroup::anon) {
                    peak = most(peak, a);
                }
                let bytes = std::fs::read_to_string(&io).ok().and_then(|t| {
                    t.lines()
                        .find_map(|l| l.strip_prefix("read_bytes: ")?.trim().parse().ok())
                });
                if let Some(b) = bytes {
                    read = most(read, b);
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            (peak, read)
        });
        let errors = s.spawn(move || {
            let mut text = String::new();
            if let Some(e) = err.as_mut() {
                let _ = e.read_to_string(&mut text);
            }
            text
        });
        let mut stdout = String::new();
        if let Some(o) = out.as_mut() {
            let _ = o.read_to_string(&mut stdout);
        }
        let status = child.wait();
        done.store(true, Ordering::Relaxed);
        let stderr = errors.join().unwrap_or_default();
        let anon = sampler.join().unwrap_or((None, None));
        (status, stdout, stderr, anon)
    });
    let status = status.map_err(|e| format!("{}: {e}", program.display()))?;
    let wall_s = start.elapsed().as_secs_f64();
    let (peak, oom_kills, major_faults) = cgroup.as_ref().map_or((None, None, None), |c| {
        (
            c.peak(),
            c.oom_kills(),
            c.field("memory.stat", "pgmajfault"),
        )
    });
    Ok(Outcome {
        status,
        wall_s,
        stdout,
        stderr,
        peak,
        anon_peak,
        oom_kills,
        major_faults,
        disk_read,
    })
}

/// Drops `path` from the page cache (GNU dd's `nocache`), so that the next run reads it again
/// and its pages are charged to that run's cgroup; a failure only warns.
fn uncache(path: &str) {
    let dropped = Command::new("dd")
        .arg(format!("if={path}"))
        .args(["iflag=nocache", "count=0", "status=none"])
        .current_dir(workspace_root())
        .status()
        .is_ok_and(|s| s.success());
    if !dropped {
        eprintln!("bench-beyond-ram: could not drop {path} from the page cache");
    }
}

/// The bench's arguments: the run's shape, then `extra`.
fn bench_args(o: &BeyondRamArgs, reps: usize, extra: &[&str]) -> Vec<String> {
    let ctx = o.prompt + o.gen + 16;
    let mut v: Vec<String> = [
        "--model",
        &o.model,
        "--prompt-tokens",
        &o.prompt.to_string(),
        "--gen-tokens",
        &o.gen.to_string(),
        "--ctx-size",
        &ctx.to_string(),
        "--threads",
        &o.threads.to_string(),
        "--reps",
        &reps.max(1).to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    v.extend(extra.iter().map(|s| s.to_string()));
    v
}

/// A speed run outside any cgroup; its JSON, or an error with its standard error's tail.
fn speed_run(bench: &Path, args: &[String]) -> Result<Value, String> {
    let load = load_average();
    let r = measure(bench, args, None)?;
    match (r.status.success(), r.json()) {
        (true, Some(mut j)) => {
            j["disk_read_bytes"] = json!(r.disk_read);
            j["wall_s"] = json!(r.wall_s);
            j["load_before"] = json!(load);
            Ok(j)
        }
        _ => Err(format!("bench failed ({}): {}", r.exit(), r.stderr_tail(8))),
    }
}

/// The machine's load average over the last minute (`/proc/loadavg`), if it can be read.
fn load_average() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    text.split_whitespace().next()?.parse().ok()
}

/// Says so on standard error when other work runs and the kernel's autogroup scheduling is
/// on: each session then gets a fair share of the CPUs whatever its nice value, and ggml's
/// spinning threads stall at every barrier a neighbour's process preempts (the speed rows
/// become several times slower, not a little noisier).
fn warn_if_loaded() {
    let autogroup = std::fs::read_to_string("/proc/sys/kernel/sched_autogroup_enabled")
        .is_ok_and(|t| t.trim() == "1");
    match load_average() {
        Some(load) if load > 0.5 && autogroup => eprintln!(
            "bench-beyond-ram: load average {load:.2} with autogroup scheduling on: other work's \
             nice value does not protect these timings; stop it, or turn autogroup off \
             (/proc/sys/kernel/sched_autogroup_enabled) and run it under nice -n 19"
        ),
        Some(load) if load > 0.5 => eprintln!(
            "bench-beyond-ram: load average {load:.2}: other work runs beside these timings"
        ),
        _ => {}
    }
}

/// A file removed when dropped.
struct Removed(PathBuf);

impl Drop for Removed {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A number of a JSON object, NaN when absent.
fn num(v: &Value, key: &str) -> f64 {
    v[key].as_f64().unwrap_or(f64::NAN)
}

/// Bytes divided by `scale`, one decimal; `-` when unknown.
fn opt(bytes: Option<u64>, scale: f64) -> String {
    bytes.map_or("-".to_string(), |b| format!("{:.1}", b as f64 / scale))
}

/// One MiB, as a divisor.
const MIB: f64 = (1u64 << 20) as f64;
/// One GiB, as a divisor.
const GIB: f64 = (1u64 << 30) as f64;

/// The greedy tokens a bench run printed.
fn tokens(v: &Value) -> Option<Vec<Value>> {
    v["generated"].as_array().cloned()
}

/// Entry point of `cargo xtask bench-beyond-ram`.
pub(crate) fn bench_beyond_ram(o: &BeyondRamArgs) -> Result<(), String> {
    if !workspace_root().join(&o.model).exists() {
        return Err(format!(
            "bench-beyond-ram: no model at {} (run `cargo xtask fetch-model`)",
            o.model
        ));
    }
    run(
        &cargo(),
        &["build", "--release", "--quiet", "--example", "bench"],
    )?;
    // Every run of this invocation uses the build just made, even if another build in the same
    // checkout replaces the bench meanwhile.
    let built = target_dir().join("release/examples/bench");
    let copy = Removed(target_dir().join(format!(
        "release/examples/bench-beyond-ram-{}",
        std::process::id()
    )));
    std::fs::copy(&built, &copy.0).map_err(|e| format!("{}: {e}", built.display()))?;
    let bench = copy.0.clone();
    warn_if_loaded();
    let (ours, theirs) = limited(o, &bench)?;
    // All resident, no limit: the tokens to match, and (with the speed side) its speed.
    let reps = if o.skip_speed { 1 } else { o.reps };
    let resident = speed_run(&bench, &bench_args(o, reps, &[]))?;
    let want = tokens(&resident);
    let ours_json = ours.json();
    let identical = ours_json.as_ref().and_then(tokens).is_some()
        && ours_json.as_ref().and_then(tokens) == want;
    let speed = if o.skip_speed {
        None
    } else {
        let spilled = speed_run(&bench, &bench_args(o, reps, &["--kv-ram", &o.kv_ram]))?;
        let evicted = speed_run(
            &bench,
            &bench_args(o, reps, &["--kv-ram", &o.kv_ram, "--evict"]),
        )?;
        Some((spilled, evicted))
    };
    print_memory(o, &ours, theirs.as_ref(), &resident, identical);
    let speed_json = speed.as_ref().map_or(Value::Null, |(spilled, evicted)| {
        print_speed(o, reps, &resident, spilled, evicted)
    });
    let summary = json!({
        "prompt_tokens": o.prompt, "gen_tokens": o.gen, "ctx_size": o.prompt + o.gen + 16,
        "threads": o.threads, "limit_bytes": o.limit, "kv_ram": o.kv_ram,
        "memory": {
            "llama_hdd": ours.report(),
            "llama_cpp": theirs.as_ref().map_or(json!({"skipped": "no --refh"}), Outcome::report),
            "resident": {
                "wall_s": resident["wall_s"], "vm_hwm_kib": resident["vm_hwm_kib"],
                "prefill_tps": resident["prefill_tps"], "decode_tps": resident["decode_tps"],
            },
        },
        "tokens_identical": identical,
        "speed": speed_json,
    });
    println!("{summary}");
    if !ours.status.success() {
        return Err(format!(
            "llama-hdd failed under the {} MiB limit ({})",
            opt(Some(o.limit), MIB),
            ours.exit()
        ));
    }
    if !identical {
        return Err("the limited run's greedy tokens differ from the resident run's".into());
    }
    Ok(())
}

/// The memory side: ours, then llama.cpp's (when `--refh`), each in a fresh cgroup with the
/// limit, the model dropped from the page cache first so that its pages are charged to it.
fn limited(o: &BeyondRamArgs, bench: &Path) -> Result<(Outcome, Option<Outcome>), String> {
    let name = |who: &str| format!("llama-hdd-beyond-ram-{}-{who}", std::process::id());
    uncache(&o.model);
    let ours = measure(
        bench,
        &bench_args(o, 1, &["--kv-ram", &o.kv_ram]),
        Some((o.limit, &name("ours"))),
    )?;
    eprintln!("llama-hdd under the limit: {}", ours.report());
    let Some(refh) = &o.refh else {
        eprintln!("bench-beyond-ram: no --refh given; llama.cpp's side is skipped");
        return Ok((ours, None));
    };
    uncache(&o.model);
    let args: Vec<String> = ["bench".to_string(), o.model.clone()]
        .into_iter()
        .chain([o.prompt, o.gen, o.threads].map(|n| n.to_string()))
        .collect();
    let theirs = measure(refh, &args, Some((o.limit, &name("refh"))))?;
    eprintln!("llama.cpp under the limit: {}", theirs.report());
    Ok((ours, Some(theirs)))
}

/// Prints the memory table: one row per run, whether the tokens matched, how much the limited
/// run read from the disk, and the standard error of a run that failed.
fn print_memory(
    o: &BeyondRamArgs,
    ours: &Outcome,
    theirs: Option<&Outcome>,
    resident: &Value,
    identical: bool,
) {
    println!();
    println!(
        "Memory: prompt {} + {} generated tokens, ctx {}, {} threads, cgroup limit {} MiB",
        o.prompt,
        o.gen,
        o.prompt + o.gen + 16,
        o.threads,
        opt(Some(o.limit), MIB)
    );
    println!(
        "{:<30} {:>7} {:>4} {:>7} {:>8} {:>7} {:>8} {:>8} {:>8}",
        "run", "exit", "oom", "wall s", "prefill", "decode", "peak MiB", "anon MiB", "read GiB"
    );
    let line =
        |label: &str, exit: &str, oom: &str, wall: f64, j: Option<&Value>, peak, anon, read| {
            let tps = |k: &str| {
                j.and_then(|j| j[k].as_f64())
                    .map_or("-".to_string(), |v| format!("{v:.2}"))
            };
            println!(
                "{:<30} {:>7} {:>4} {:>7.1} {:>8} {:>7} {:>8} {:>8} {:>8}",
                label,
                exit,
                oom,
                wall,
                tps("prefill_tps"),
                tps("decode_tps"),
                opt(peak, MIB),
                opt(anon, MIB),
                opt(read, GIB),
            );
        };
    let row = |label: &str, r: &Outcome| {
        let oom = if r.oom_killed() { "yes" } else { "no" };
        let j = r.json();
        line(
            label,
            &r.exit(),
            oom,
            r.wall_s,
            j.as_ref(),
            r.peak,
            r.anon_peak,
            r.disk_read,
        );
    };
    row(&format!("llama-hdd --kv-ram {}", o.kv_ram), ours);
    match theirs {
        Some(r) => row("llama.cpp refh bench", r),
        None => println!("{:<30} skipped (no --refh)", "llama.cpp refh bench"),
    }
    line(
        "llama-hdd resident, no limit",
        "0",
        "-",
        num(resident, "wall_s"),
        Some(resident),
        None,
        None,
        resident["disk_read_bytes"].as_u64(),
    );
    println!(
        "greedy tokens, limited against resident: {} ({} tokens)",
        if identical { "identical" } else { "DIFFERENT" },
        tokens(resident).map_or(0, |t| t.len())
    );
    let spill = ours.json().and_then(|j| j["spill_bytes_read"].as_u64());
    if let (Some(read), Some(spill)) = (ours.disk_read, spill) {
        println!(
            "llama-hdd under the limit read {} GiB from the disk for {} GiB its attention read \
             from block files ({:.1}x)",
            opt(Some(read), GIB),
            opt(Some(spill), GIB),
            read as f64 / spill as f64
        );
    }
    for (label, r) in [("llama-hdd", Some(ours)), ("llama.cpp", theirs)] {
        if let Some(r) = r.filter(|r| !r.status.success()) {
            let tail = r.stderr_tail(8);
            let tail = if tail.trim().is_empty() {
                "(empty)"
            } else {
                &tail
            };
            println!("{label} standard error (tail):\n{tail}");
        }
    }
}

/// Prints the speed table (resident, `--kv-ram`, `--evict`) and returns its JSON.
fn print_speed(
    o: &BeyondRamArgs,
    reps: usize,
    resident: &Value,
    spilled: &Value,
    evicted: &Value,
) -> Value {
    let (rp, rd) = (num(resident, "prefill_tps"), num(resident, "decode_tps"));
    let (sp, sd) = (num(spilled, "prefill_tps"), num(spilled, "decode_tps"));
    let ed = num(evicted, "decode_tps");
    let e = &evicted["evicted"];
    println!();
    println!("Speed (no cgroup, {reps} rep(s), medians)");
    println!(
        "{:<34} {:>12} {:>12} {:>9}",
        "run", "prefill t/s", "decode t/s", "read GiB"
    );
    let kv = format!("llama-hdd --kv-ram {}", o.kv_ram);
    for (label, v) in [
        ("llama-hdd resident".to_string(), resident),
        (kv.clone(), spilled),
        (format!("{kv} --evict"), evicted),
    ] {
        println!(
            "{label:<34} {:>12.1} {:>12.2} {:>9}",
            num(v, "prefill_tps"),
            num(v, "decode_tps"),
            opt(v["disk_read_bytes"].as_u64(), GIB)
        );
    }
    println!(
        "{:<34} {:>12.3} {:>12.3}",
        "--kv-ram against resident",
        sp / rp,
        sd / rd
    );
    println!(
        "--evict: {:.2} ms/token, {} MiB read/token, disk {:.0} MB/s, {:.2}x the disk's read \
         time; decode {:.3}x resident",
        num(e, "decode_ms_per_token"),
        opt(e["bytes_read_per_token"].as_f64().map(|b| b as u64), MIB),
        num(e, "disk_read_mb_s"),
        num(e, "ratio_to_disk_read"),
        ed / rd,
    );
    let want = tokens(resident);
    let same = |v: &Value| tokens(v).is_some() && tokens(v) == want;
    json!({
        "reps": reps,
        "resident": { "prefill_tps": rp, "decode_tps": rd,
                      "disk_read_bytes": resident["disk_read_bytes"] },
        "kv_ram": { "prefill_tps": sp, "decode_tps": sd,
                    "disk_read_bytes": spilled["disk_read_bytes"],
                    "kv_pages_spilled": spilled["kv_pages_spilled"],
                    "spill_bytes_read": spilled["spill_bytes_read"],
                    "tokens_identical": same(spilled) },
        "ratio": { "prefill": sp / rp, "decode": sd / rd },
        "evict": { "decode_tps": ed, "decode_ratio": ed / rd,
                   "disk_read_bytes": evicted["disk_read_bytes"],
                   "tokens_identical": same(evicted), "evicted": e.clone() },
    })
}

#[cfg(test)]
mod tests {
    use super::size;

    /// Sizes as people write them; units case-insensitive, binary and decimal.
    #[test]
    fn sizes() {
        assert_eq!(size("256MiB"), Ok(256 << 20));
        assert_eq!(size("64mib"), Ok(64 << 20));
        assert_eq!(size("1GB"), Ok(1_000_000_000));
        assert_eq!(size("4096"), Ok(4096));
        assert!(size("12 parsecs").is_err());
        assert!(size("MiB").is_err());
    }
}
