//! `cargo xtask bench-remote`: the prompt cache's remote tier (Redis) against a local disk hit
//! and against computing, side by side in one run, on one machine.
//!
//! - **Time to first token** of a chat prompt of about `--prompt-tokens` (2,000) tokens, `--reps`
//!   times on a fresh text each: computed by replica A (the cache empty: the recompute figure);
//!   then asked of replica B, a fresh cache directory of its own and A's blocks in Redis (the
//!   remote hit); then asked of A again, restarted on its directory without Redis (the local
//!   disk hit: blocks read from files).
//! - **Read throughput** of the tier (`ckpt bench-remote`: one prompt's block records in one
//!   call, raw and then verified into RAM) against `redis-benchmark` GETs of values of the same
//!   size, pipelined like ours and not, on the same Redis.
//! - **Fleet scaling**: `--replicas` (1,2,4,8) processes on one Redis serve `--users` users'
//!   conversations of `--fleet-turns` turns over one shared system prompt, each turn sent to
//!   another replica than the last (a load balancer without affinity); prompt tokens computed
//!   fleet-wide, against one replica's.
//!
//! - With `--netns`: two replicas in network namespaces of their own (`ip netns`, a veth pair
//!   each) reach the Redis on the host: one computes a prompt, the other reads it.
//!
//! Goals (the remote-tier issue): a remote hit within 1.5x a local disk hit and at least 30x
//! faster than computing; read throughput at least 0.7x redis-benchmark's; the fleet within
//! 1.1x of one replica's computed tokens.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::bench_args::{BenchRemoteArgs, Options};
use crate::bench_server::{self, chat, percentile, Kind, Server, Words};
use crate::target_dir;

/// A `redis-server` of the benchmark's own, without persistence.
struct Redis {
    child: Child,
    port: u16,
}

impl Redis {
    /// `bind`: `--bind` and its addresses, and whatever else the run needs.
    fn start(dir: &Path, bind: &[&str]) -> Result<Redis, String> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| e.to_string())?
            .port();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string()])
            .args(bind)
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(dir)
            .stdout(Stdio::null())
            .spawn()
            .map_err(|e| format!("redis-server: {e} (install Debian's redis-server package)"))?;
        let redis = Redis { child, port };
        let deadline = Instant::now() + Duration::from_secs(10);
        while redis.cli(&["PING"]).as_deref() != Some("PONG") {
            if Instant::now() > deadline {
                return Err("redis-server did not start".into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(redis)
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    fn cli(&self, args: &[&str]) -> Option<String> {
        let out = Command::new("redis-cli")
            .args(["-p", &self.port.to_string()])
            .args(args)
            .output()
            .ok()?;
        Some(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A counter of our server's `/metrics`.
fn metric(base: &str, name: &str) -> u64 {
    ureq::get(&format!("{base}/metrics"))
        .call()
        .ok()
        .and_then(|r| r.into_string().ok())
        .and_then(|text| {
            text.lines()
                .find_map(|l| l.strip_prefix(&format!("llamahdd:{name} ")))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// Waits until `base`'s writer has put `blocks` blocks and a tail into Redis.
fn wait_pushed(base: &str, blocks: u64) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while metric(base, "cache_remote_blocks_written_total") < blocks
        || metric(base, "cache_remote_manifests_written_total") < 1
    {
        if Instant::now() > deadline {
            return Err("the writer never reached Redis".into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// Our server on `cache`, with `extra` options and `/metrics`.
fn replica(
    bin: &Path,
    o: &Options,
    cache: &Path,
    log: &Path,
    extra: &[&str],
) -> Result<Server, String> {
    let mut args: Vec<String> = vec!["--metrics".into()];
    args.extend(extra.iter().map(|s| (*s).to_owned()));
    Server::start(Kind::Ours, bin, o, 1, 4096, cache, log, &args)
}

fn ttft(bin: &Path, o: &Options, redis: &Redis) -> Result<Value, String> {
    let url = redis.url();
    let remote = ["--cache-remote", url.as_str()];
    let (mut computed, mut from_remote, mut from_disk, mut runs) = (vec![], vec![], vec![], vec![]);
    for rep in 0..o.reps {
        let dir = o.dir.join(format!("remote-ttft-{rep}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        redis.cli(&["FLUSHALL"]);
        let (cache_a, cache_b) = (dir.join("a"), dir.join("b"));
        let a = replica(bin, o, &cache_a, &dir.join("a.log"), &remote)?;
        let mut words = Words(0x5EED_0000 ^ (rep as u64 + 1));
        let system = words.text_of_tokens(&a.base, o.prompt_tokens - 40)?;
        let messages = json!([
            {"role": "system", "content": system},
            {"role": "user", "content": "Summarize the text above in one sentence."},
        ]);
        let cold = chat(&a.base, &messages, 8)?;
        wait_pushed(&a.base, cold.prompt_tokens / 64)?;
        a.stop()?;
        let b = replica(bin, o, &cache_b, &dir.join("b.log"), &remote)?;
        let hit = chat(&b.base, &messages, 8)?;
        let hits = metric(&b.base, "cache_remote_hits_total");
        b.stop()?;
        let a2 = replica(bin, o, &cache_a, &dir.join("a2.log"), &[])?;
        let disk = chat(&a2.base, &messages, 8)?;
        a2.stop()?;
        if cold.text != hit.text || cold.text != disk.text {
            eprintln!(
                "warning: greedy replies differ: {:?} / {:?} / {:?}",
                cold.text, hit.text, disk.text
            );
        }
        eprintln!(
            "rep {rep}: prompt {} tokens; computed {:.1} ms ({} computed), remote hit {:.1} ms \
             ({} computed, {hits} blocks from Redis), local disk hit {:.1} ms ({} computed)",
            cold.prompt_tokens,
            cold.ttft_ms,
            cold.prompt_computed,
            hit.ttft_ms,
            hit.prompt_computed,
            disk.ttft_ms,
            disk.prompt_computed
        );
        runs.push(json!({
            "prompt_tokens": cold.prompt_tokens,
            "computed_ms": cold.ttft_ms, "remote_ms": hit.ttft_ms, "disk_ms": disk.ttft_ms,
            "remote_computed": hit.prompt_computed, "disk_computed": disk.prompt_computed,
            "remote_blocks": hits,
        }));
        computed.push(cold.ttft_ms);
        from_remote.push(hit.ttft_ms);
        from_disk.push(disk.ttft_ms);
        let _ = std::fs::remove_dir_all(&dir);
    }
    let (c, r, d) = (
        percentile(&computed, 50.0),
        percentile(&from_remote, 50.0),
        percentile(&from_disk, 50.0),
    );
    Ok(json!({
        "computed_ms_median": c,
        "remote_ms_median": r,
        "disk_ms_median": d,
        "remote_over_disk": r / d,
        "computed_over_remote": c / r,
        "runs": runs,
    }))
}

/// Requests per second of `redis-benchmark` GETs of `bytes`-byte values, `pipeline` at a time.
fn redis_benchmark(redis: &Redis, bytes: usize, pipeline: usize) -> Result<f64, String> {
    let out = Command::new("redis-benchmark")
        .args([
            "-p",
            &redis.port.to_string(),
            "-t",
            "set,get",
            "-c",
            "1",
            "-q",
        ])
        .args([
            "-d",
            &bytes.to_string(),
            "-n",
            "310",
            "-P",
            &pipeline.to_string(),
        ])
        .output()
        .map_err(|e| format!("redis-benchmark: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.split('\r')
        .flat_map(|l| l.lines())
        .filter_map(|l| l.trim().strip_prefix("GET: "))
        .filter_map(|l| l.split(" requests per second").next())
        .filter_map(|n| n.trim().parse::<f64>().ok())
        .next_back()
        .ok_or_else(|| format!("no GET figure in redis-benchmark's output: {text}"))
}

fn throughput(o: &Options, redis: &Redis) -> Result<Value, String> {
    redis.cli(&["FLUSHALL"]);
    let ckpt = target_dir().join("release/ckpt");
    let out = Command::new(&ckpt)
        .args([
            "bench-remote",
            "--url",
            &redis.url(),
            "--reps",
            &o.reps.max(5).to_string(),
        ])
        .output()
        .map_err(|e| format!("{}: {e}", ckpt.display()))?;
    let ours: Value = serde_json::from_slice(&out.stdout).map_err(|e| {
        format!(
            "ckpt bench-remote: {e}: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })?;
    let bytes = ours["record_bytes"].as_u64().unwrap_or(0) as usize;
    let blocks = ours["blocks"].as_u64().unwrap_or(31) as usize;
    let mut plain = Vec::new();
    let mut piped = Vec::new();
    for _ in 0..3 {
        redis.cli(&["FLUSHALL"]);
        plain.push(redis_benchmark(redis, bytes, 1)? * bytes as f64 / 1e6);
        piped.push(redis_benchmark(redis, bytes, blocks)? * bytes as f64 / 1e6);
    }
    let reference = percentile(&plain, 50.0).max(percentile(&piped, 50.0));
    let get = ours["get_many_mb_s"].as_f64().unwrap_or(f64::NAN);
    let fetch = ours["fetch_remote_mb_s"].as_f64().unwrap_or(f64::NAN);
    eprintln!(
        "read throughput: tier {get:.0} MB/s raw, {fetch:.0} MB/s verified into RAM; \
         redis-benchmark GET {:.0} MB/s (-P 1), {:.0} MB/s (-P {blocks})",
        percentile(&plain, 50.0),
        percentile(&piped, 50.0)
    );
    Ok(json!({
        "value_bytes": bytes,
        "tier_get_mb_s": get,
        "tier_fetch_verified_mb_s": fetch,
        "redis_benchmark_get_mb_s": percentile(&plain, 50.0),
        "redis_benchmark_get_pipelined_mb_s": percentile(&piped, 50.0),
        "tier_over_redis_benchmark": get / reference,
        "verified_over_redis_benchmark": fetch / reference,
        "ours": ours,
    }))
}

fn fleet(
    bin: &Path,
    o: &Options,
    redis: &Redis,
    sizes: &[usize],
    users: usize,
    turns: usize,
) -> Result<Value, String> {
    let url = redis.url();
    let mut rows = Vec::new();
    for &n in sizes {
        redis.cli(&["FLUSHALL"]);
        let dir = o.dir.join(format!("remote-fleet-{n}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let replicas: Vec<Server> = (0..n)
            .map(|i| {
                replica(
                    bin,
                    o,
                    &dir.join(format!("cache-{i}")),
                    &dir.join(format!("replica-{i}.log")),
                    &["--cache-remote", &url],
                )
            })
            .collect::<Result<_, _>>()?;
        let mut words = Words(0xF1EE7);
        let system = words.text_of_tokens(&replicas[0].base, o.system_tokens)?;
        let mut chats: Vec<Vec<Value>> = (0..users)
            .map(|_| vec![json!({"role": "system", "content": system})])
            .collect();
        let (mut prompt, mut computed) = (0u64, 0u64);
        let started = Instant::now();
        for t in 0..turns {
            for (u, messages) in chats.iter_mut().enumerate() {
                messages.push(json!({"role": "user", "content": words.text(30)}));
                let r = &replicas[(u + t) % n];
                let reply = chat(&r.base, &Value::Array(messages.clone()), o.gen_tokens)?;
                prompt += reply.prompt_tokens;
                computed += reply.prompt_computed;
                messages.push(json!({"role": "assistant", "content": reply.text}));
            }
        }
        let secs = started.elapsed().as_secs_f64();
        let remote_hits: u64 = replicas
            .iter()
            .map(|r| metric(&r.base, "cache_remote_hits_total"))
            .sum();
        for r in replicas {
            r.stop()?;
        }
        eprintln!(
            "fleet of {n}: {computed} of {prompt} prompt tokens computed, {remote_hits} blocks \
             and tails from Redis, {secs:.1} s"
        );
        rows.push(json!({
            "replicas": n, "prompt_tokens": prompt, "computed": computed,
            "remote_hits": remote_hits, "seconds": secs,
        }));
        let _ = std::fs::remove_dir_all(&dir);
    }
    let one = rows
        .iter()
        .find(|r| r["replicas"] == 1)
        .and_then(|r| r["computed"].as_f64());
    let worst = rows
        .iter()
        .filter_map(|r| r["computed"].as_f64())
        .fold(0.0f64, f64::max);
    Ok(json!({
        "users": users,
        "turns": turns,
        "rows": rows,
        "worst_over_one_replica": one.map(|one| worst / one),
    }))
}

/// Two network namespaces, each joined to the host by a veth pair: `10.231.N.2` inside
/// namespace `llama-hdd-bench-N`, `10.231.N.1` on the host. Removed on drop.
struct Hosts(Vec<String>);

impl Hosts {
    fn create(n: usize) -> Result<Hosts, String> {
        let sh = |args: &[&str]| -> Result<(), String> {
            let out = Command::new("ip")
                .args(args)
                .output()
                .map_err(|e| format!("ip: {e}"))?;
            if out.status.success() {
                Ok(())
            } else {
                Err(format!(
                    "`ip {}` failed: {}",
                    args.join(" "),
                    String::from_utf8_lossy(&out.stderr).trim()
                ))
            }
        };
        let mut hosts = Hosts(Vec::new());
        for i in 1..=n {
            let ns = format!("llama-hdd-bench-{i}");
            let _ = Command::new("ip").args(["netns", "del", &ns]).output();
            sh(&["netns", "add", &ns])?;
            hosts.0.push(ns.clone());
            let (outer, inner) = (format!("lhb{i}"), format!("lhb{i}p"));
            // A pair left by an interrupted run.
            let _ = Command::new("ip").args(["link", "del", &outer]).output();
            sh(&[
                "link", "add", &outer, "type", "veth", "peer", "name", &inner,
            ])?;
            sh(&["link", "set", &inner, "netns", &ns])?;
            sh(&["addr", "add", &format!("10.231.{i}.1/24"), "dev", &outer])?;
            sh(&["link", "set", &outer, "up"])?;
            let inside = |args: &[&str]| {
                let mut all = vec!["netns", "exec", ns.as_str(), "ip"];
                all.extend_from_slice(args);
                sh(&all)
            };
            inside(&["addr", "add", &format!("10.231.{i}.2/24"), "dev", &inner])?;
            inside(&["link", "set", &inner, "up"])?;
            inside(&["link", "set", "lo", "up"])?;
        }
        Ok(hosts)
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        for ns in &self.0 {
            // Deleting the namespace deletes its end of the veth pair, and so the pair.
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
        }
    }
}

/// A replica started inside namespace `ns`, listening on `ip`.
fn replica_in(
    bin: &Path,
    o: &Options,
    ns: &str,
    ip: &str,
    cache: &Path,
    log: &Path,
    redis_url: &str,
) -> Result<(Child, String), String> {
    let port = 18_000 + (std::process::id() % 1000) as u16;
    let out = std::fs::File::create(log).map_err(|e| e.to_string())?;
    let mut child = Command::new("ip")
        .args(["netns", "exec", ns])
        .arg(bin)
        .arg("-m")
        .arg(&o.model)
        .args([
            "--host",
            ip,
            "--port",
            &port.to_string(),
            "-t",
            &o.threads.to_string(),
        ])
        .args([
            "-np",
            "1",
            "-c",
            "4096",
            "--metrics",
            "--cache-remote",
            redis_url,
        ])
        .arg("--cache-dir")
        .arg(cache)
        .stdout(Stdio::null())
        .stderr(Stdio::from(out))
        .spawn()
        .map_err(|e| format!("ip netns exec: {e}"))?;
    let base = format!("http://{ip}:{port}");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !ureq::get(&format!("{base}/health"))
        .call()
        .is_ok_and(|r| r.status() == 200)
    {
        if Instant::now() > deadline || matches!(child.try_wait(), Ok(Some(_))) {
            let _ = child.kill();
            return Err(format!(
                "the replica in {ns} did not start; log: {}",
                log.display()
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok((child, base))
}

/// Two replicas in network namespaces of their own reach a Redis on the host across veth
/// pairs: what one computed, the other reads.
fn netns(bin: &Path, o: &Options, redis: &Redis, hosts: Hosts) -> Result<Value, String> {
    let dir = o.dir.join("remote-netns");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    redis.cli(&["FLUSHALL"]);
    let mut replicas = Vec::new();
    for (i, ns) in hosts.0.iter().enumerate() {
        let n = i + 1;
        let url = format!("redis://10.231.{n}.1:{}", redis.port);
        replicas.push(replica_in(
            bin,
            o,
            ns,
            &format!("10.231.{n}.2"),
            &dir.join(format!("cache-{n}")),
            &dir.join(format!("replica-{n}.log")),
            &url,
        )?);
    }
    let mut words = Words(0xAE75);
    let system = words.text_of_tokens(&replicas[0].1, o.prompt_tokens - 40)?;
    let messages = json!([
        {"role": "system", "content": system},
        {"role": "user", "content": "Summarize the text above in one sentence."},
    ]);
    let cold = chat(&replicas[0].1, &messages, 8)?;
    wait_pushed(&replicas[0].1, cold.prompt_tokens / 64)?;
    let hit = chat(&replicas[1].1, &messages, 8)?;
    let hits = metric(&replicas[1].1, "cache_remote_hits_total");
    for (mut child, _) in replicas {
        let _ = child.kill();
        let _ = child.wait();
    }
    drop(hosts);
    let _ = std::fs::remove_dir_all(&dir);
    eprintln!(
        "network namespaces: replica 1 computed {} tokens in {:.1} ms; replica 2 computed {}          ({hits} blocks and tails over the veth pair) in {:.1} ms",
        cold.prompt_computed, cold.ttft_ms, hit.prompt_computed, hit.ttft_ms
    );
    Ok(json!({
        "prompt_tokens": cold.prompt_tokens,
        "computed_ms": cold.ttft_ms,
        "remote_ms": hit.ttft_ms,
        "remote_computed": hit.prompt_computed,
        "remote_hits": hits,
    }))
}

/// Entry point of `cargo xtask bench-remote`.
pub(crate) fn bench_remote(args: &BenchRemoteArgs) -> Result<(), String> {
    let o = args.options();
    let servers = bench_server::servers(&o)?;
    let bin: PathBuf = servers
        .into_iter()
        .find(|(k, _)| *k == Kind::Ours)
        .map(|(_, b)| b)
        .ok_or("bench-remote measures our server")?;
    crate::build_ckpt()?;
    std::fs::create_dir_all(&o.dir).map_err(|e| e.to_string())?;
    // With --netns, Redis listens on the host's ends of the veth pairs too (created first).
    let hosts = if args.netns {
        Some(Hosts::create(2)?)
    } else {
        None
    };
    let mut bind = vec!["--bind", "127.0.0.1"];
    if hosts.is_some() {
        bind.extend(["10.231.1.1", "10.231.2.1", "--protected-mode", "no"]);
    }
    let redis = Redis::start(&o.dir, &bind)?;
    let mut report = serde_json::Map::new();
    if !o.skip_ttft {
        report.insert("ttft".into(), ttft(&bin, &o, &redis)?);
    }
    if !args.skip_throughput {
        report.insert("throughput".into(), throughput(&o, &redis)?);
    }
    if !args.skip_fleet {
        report.insert(
            "fleet".into(),
            fleet(
                &bin,
                &o,
                &redis,
                &args.replicas,
                args.users,
                args.fleet_turns,
            )?,
        );
    }
    if let Some(hosts) = hosts {
        report.insert("netns".into(), netns(&bin, &o, &redis, hosts)?);
    }
    let _ = writeln!(
        std::io::stdout(),
        "{}",
        serde_json::to_string_pretty(&Value::Object(report)).unwrap_or_default()
    );
    Ok(())
}
