//! `cargo xtask bench-server`: our server and llama.cpp's `llama-server`, side by side, on the
//! same model, threads and machine, one after the other.
//!
//! Two measurements, each reported per server:
//! - **Time to first token** of a chat prompt of about `--prompt-tokens` tokens: the first request,
//!   the same request again (`--repeats` times, the median), and the same request after the
//!   server was stopped (SIGTERM) and started again on the same cache directory. Streaming,
//!   measured at the client from sending the request to the first chunk carrying text.
//! - **An agent-like trace**: `--conversations` conversations of `--turns` turns each, sharing one
//!   system prompt of about `--system-tokens` tokens, driven by `--clients` concurrent clients
//!   (each takes the next conversation and plays its turns in order, sending back the reply it
//!   got). Reported: prompt tokens computed (the servers' own `timings.prompt_n`), mean and p99
//!   time to first token, and aggregate generated tokens per second over the trace.
//!
//! - With `--workload agent`, instead: one tool-calling conversation with a restart in the middle
//!   (see `bench_agent`); `--workload reasoning`: a reasoning conversation whose client drops
//!   `reasoning_content` (see `bench_reasoning`).
//!
//! The texts are generated from a fixed seed, so both servers see the same requests.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::bench_args::{BenchServerArgs, Only, Options, Plan};
use crate::{cargo, run, target_dir};

/// Which server, and how to start it.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// `llama-hdd-server`.
    Ours,
    /// llama.cpp's `llama-server`.
    Llama,
}

impl Kind {
    /// The server's binary name, as reports and directories name it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::Ours => "llama-hdd-server",
            Kind::Llama => "llama-server",
        }
    }
}

/// A running server process.
pub(crate) struct Server {
    child: Child,
    /// `http://127.0.0.1:PORT`.
    pub(crate) base: String,
}

impl Server {
    /// Starts `bin` with `parallel` slots of `ctx` positions each, and `extra` arguments after
    /// the common ones, and waits until it is ready.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn start(
        kind: Kind,
        bin: &Path,
        o: &Options,
        parallel: usize,
        ctx: usize,
        cache: &Path,
        log: &Path,
        extra: &[String],
    ) -> Result<Server, String> {
        let mut args: Vec<String> = vec!["-m".into(), o.model.display().to_string()];
        args.extend(["-t".into(), o.threads.to_string()]);
        args.extend(["-np".into(), parallel.to_string()]);
        // Both split `-c` among the slots, as llama-server does.
        args.extend(["-c".into(), (ctx * parallel).to_string()]);
        if let Kind::Ours = kind {
            args.extend(["--cache-dir".into(), cache.display().to_string()]);
        }
        args.extend(extra.iter().cloned());
        Server::launch(kind, bin, &args, log)
    }

    /// Starts `bin` on a free loopback port with `args` (no other options), its output in
    /// `log`, and waits until `/health` answers.
    pub(crate) fn launch(
        kind: Kind,
        bin: &Path,
        args: &[String],
        log: &Path,
    ) -> Result<Server, String> {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("no free port: {e}"))?
            .port();
        let mut c = Command::new(bin);
        c.args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(args);
        let out = std::fs::File::create(log).map_err(|e| format!("{}: {e}", log.display()))?;
        let err = out.try_clone().map_err(|e| e.to_string())?;
        let child = c
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .spawn()
            .map_err(|e| format!("could not start {}: {e}", bin.display()))?;
        let mut server = Server {
            child,
            base: format!("http://127.0.0.1:{port}"),
        };
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if let Ok(Some(status)) = server.child.try_wait() {
                return Err(format!(
                    "{} exited while starting ({status}); log: {}",
                    kind.name(),
                    log.display()
                ));
            }
            let ok = ureq::get(&format!("{}/health", server.base))
                .timeout(Duration::from_secs(2))
                .call()
                .is_ok_and(|r| r.status() == 200);
            if ok {
                return Ok(server);
            }
            if Instant::now() > deadline {
                server.kill();
                return Err(format!(
                    "{} did not become ready; log: {}",
                    kind.name(),
                    log.display()
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGTERM, then waits for the process to end (its cache flushed).
    pub(crate) fn stop(mut self) -> Result<(), String> {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.kill();
        Err("the server did not stop within 60 s of SIGTERM".into())
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.kill();
        }
    }
}

/// What one streamed chat request gave.
pub(crate) struct Reply {
    pub(crate) ttft_ms: f64,
    pub(crate) text: String,
    pub(crate) completion_tokens: u64,
    pub(crate) prompt_tokens: u64,
    pub(crate) prompt_computed: u64,
}

/// Sends a streaming chat completion and reads it to the end.
pub(crate) fn chat(base: &str, messages: &Value, max_tokens: usize) -> Result<Reply, String> {
    let body = json!({
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": true,
        "stream_options": {"include_usage": true},
        "cache_prompt": true,
    });
    let start = Instant::now();
    let resp = ureq::post(&format!("{base}/v1/chat/completions"))
        .set("Content-Type", "application/json")
        .timeout(Duration::from_secs(600))
        .send_string(&body.to_string())
        .map_err(|e| format!("chat request failed: {e}"))?;
    let mut reply = Reply {
        ttft_ms: f64::NAN,
        text: String::new(),
        completion_tokens: 0,
        prompt_tokens: 0,
        prompt_computed: 0,
    };
    for line in BufReader::new(resp.into_reader()).lines() {
        let line = line.map_err(|e| format!("reading the stream: {e}"))?;
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        if data.trim() == "[DONE]" {
            break;
        }
        let chunk: Value =
            serde_json::from_str(data).map_err(|e| format!("bad chunk {data:?}: {e}"))?;
        if let Some(text) = chunk["choices"][0]["delta"]["content"].as_str() {
            if !text.is_empty() && reply.ttft_ms.is_nan() {
                reply.ttft_ms = start.elapsed().as_secs_f64() * 1e3;
            }
            reply.text.push_str(text);
        }
        if let Some(n) = chunk["usage"]["completion_tokens"].as_u64() {
            reply.completion_tokens = n;
        }
        if let Some(n) = chunk["usage"]["prompt_tokens"].as_u64() {
            reply.prompt_tokens = n;
        }
        if let Some(n) = chunk["timings"]["prompt_n"].as_u64() {
            reply.prompt_computed = n;
        }
    }
    if reply.ttft_ms.is_nan() {
        return Err("the reply carried no text".into());
    }
    Ok(reply)
}

/// Tokens of `text` as the server counts them.
pub(crate) fn count_tokens(base: &str, text: &str) -> Result<usize, String> {
    let resp = ureq::post(&format!("{base}/tokenize"))
        .set("Content-Type", "application/json")
        .send_string(&json!({ "content": text }).to_string())
        .map_err(|e| format!("tokenize failed: {e}"))?;
    let v: Value = serde_json::from_reader(resp.into_reader()).map_err(|e| e.to_string())?;
    v["tokens"]
        .as_array()
        .map(Vec::len)
        .ok_or_else(|| format!("tokenize answered {v}"))
}

/// Deterministic English-like text: sentences of common words from a seeded generator.
pub(crate) struct Words(pub(crate) u64);

impl Words {
    const LIST: &'static [&'static str] = &[
        "the",
        "system",
        "file",
        "value",
        "request",
        "server",
        "memory",
        "disk",
        "cache",
        "model",
        "token",
        "user",
        "answer",
        "question",
        "data",
        "table",
        "record",
        "field",
        "error",
        "result",
        "function",
        "module",
        "test",
        "build",
        "change",
        "review",
        "branch",
        "commit",
        "report",
        "time",
        "page",
        "block",
        "index",
        "query",
        "order",
        "number",
        "list",
        "name",
        "path",
        "write",
        "read",
        "open",
        "close",
        "check",
        "return",
        "input",
        "output",
        "option",
        "config",
        "thread",
        "process",
        "queue",
        "client",
        "network",
        "message",
        "document",
        "section",
        "example",
        "project",
        "release",
        "version",
        "update",
        "feature",
        "issue",
        "always",
        "never",
        "often",
        "quickly",
        "carefully",
        "every",
        "some",
        "many",
        "small",
        "large",
        "new",
        "old",
        "first",
        "last",
        "next",
        "other",
        "same",
        "different",
        "simple",
        "and",
        "or",
        "but",
        "with",
        "without",
        "before",
        "after",
        "when",
        "while",
        "because",
        "is",
        "was",
        "will",
        "should",
        "must",
        "can",
        "runs",
        "keeps",
        "holds",
        "sends",
    ];

    /// The next number of the xorshift sequence.
    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// About `words` words, in sentences.
    pub(crate) fn text(&mut self, words: usize) -> String {
        let mut s = String::new();
        let mut in_sentence = 0;
        for _ in 0..words {
            let w = Self::LIST[(self.next() % Self::LIST.len() as u64) as usize];
            if in_sentence == 0 {
                let mut c = w.chars();
                if let Some(first) = c.next() {
                    s.extend(first.to_uppercase());
                    s.push_str(c.as_str());
                }
            } else {
                s.push(' ');
                s.push_str(w);
            }
            in_sentence += 1;
            if in_sentence >= 8 + (self.next() % 10) as usize {
                s.push_str(". ");
                in_sentence = 0;
            }
        }
        s.push('.');
        s
    }

    /// Text of about `tokens` tokens as `base` counts them (grown a sentence at a time).
    pub(crate) fn text_of_tokens(&mut self, base: &str, tokens: usize) -> Result<String, String> {
        let mut s = self.text(tokens * 3 / 4);
        while count_tokens(base, &s)? < tokens {
            s.push(' ');
            s.push_str(&self.text(12));
        }
        Ok(s)
    }
}

/// The `p`th percentile of `v` (nearest rank); NaN when `v` is empty.
pub(crate) fn percentile(v: &[f64], p: f64) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return f64::NAN;
    }
    let i = ((p / 100.0) * (v.len() - 1) as f64).round() as usize;
    v[i.min(v.len() - 1)]
}

/// First request, repeated request, first request after a restart: `reps` times each, on a
/// fresh cache directory each time.
fn ttft(kind: Kind, bin: &Path, o: &Options) -> Result<Value, String> {
    let mut first = Vec::new();
    let mut repeat = Vec::new();
    let mut restarted = Vec::new();
    let mut details = Vec::new();
    for rep in 0..o.reps {
        let dir = o.dir.join(format!("{}-ttft-{rep}", kind.name()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let cache = dir.join("cache");
        let log = dir.join("server.log");
        let server = Server::start(kind, bin, o, 1, 4096, &cache, &log, &[])?;
        // Another text each repetition, so no earlier run's cache could serve it.
        let mut words = Words(0x9E37_79B9_7F4A_7C15 ^ (rep as u64 + 1));
        let system = words.text_of_tokens(&server.base, o.prompt_tokens - 40)?;
        let messages = json!([
            {"role": "system", "content": system},
            {"role": "user", "content": "Summarize the text above in one sentence."},
        ]);
        let a = chat(&server.base, &messages, 8)?;
        let mut again = Vec::new();
        for _ in 0..o.repeats {
            again.push(chat(&server.base, &messages, 8)?);
        }
        let repeat_ms: Vec<f64> = again.iter().map(|r| r.ttft_ms).collect();
        let b = again.swap_remove(0);
        server.stop()?;
        let server = Server::start(
            kind,
            bin,
            o,
            1,
            4096,
            &cache,
            &log.with_extension("2.log"),
            &[],
        )?;
        let c = chat(&server.base, &messages, 8)?;
        server.stop()?;
        if a.text != b.text || a.text != c.text {
            eprintln!(
                "warning: {}: greedy replies differ: {:?} / {:?} / {:?}",
                kind.name(),
                a.text,
                b.text,
                c.text
            );
        }
        eprintln!(
            "{} rep {rep}: prompt {} tokens; first {:.1} ms ({} computed), repeat {:.1} ms ({} \
             computed; median of {}), after restart {:.1} ms ({} computed)",
            kind.name(),
            a.prompt_tokens,
            a.ttft_ms,
            a.prompt_computed,
            percentile(&repeat_ms, 50.0),
            b.prompt_computed,
            repeat_ms.len(),
            c.ttft_ms,
            c.prompt_computed
        );
        details.push(json!({
            "prompt_tokens": a.prompt_tokens,
            "first_ms": a.ttft_ms, "first_computed": a.prompt_computed,
            "repeat_ms": percentile(&repeat_ms, 50.0), "repeat_computed": b.prompt_computed,
            "repeat_runs_ms": repeat_ms,
            "restart_ms": c.ttft_ms, "restart_computed": c.prompt_computed,
        }));
        first.push(a.ttft_ms);
        repeat.push(percentile(&repeat_ms, 50.0));
        restarted.push(c.ttft_ms);
    }
    Ok(json!({
        "first_ms_median": percentile(&first, 50.0),
        "repeat_ms_median": percentile(&repeat, 50.0),
        "restart_ms_median": percentile(&restarted, 50.0),
        "runs": details,
    }))
}

/// The agent-like trace on a fresh server with `--clients` slots.
fn trace(kind: Kind, bin: &Path, o: &Options) -> Result<Value, String> {
    let dir = o.dir.join(format!("{}-trace", kind.name()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let server = Server::start(
        kind,
        bin,
        o,
        o.clients,
        4096,
        &dir.join("cache"),
        &dir.join("server.log"),
        &[],
    )?;
    let mut words = Words(0xD1B5_4A32_D192_ED03);
    let system = words.text_of_tokens(&server.base, o.system_tokens)?;
    // Each conversation's user turns, fixed up front.
    let turns: Vec<Vec<String>> = (0..o.conversations)
        .map(|_| {
            (0..o.turns)
                .map(|_| {
                    let n = 30 + (words.next() % 50) as usize;
                    format!("{} What should happen next?", words.text(n))
                })
                .collect()
        })
        .collect();
    let next = AtomicUsize::new(0);
    let samples: Mutex<Vec<(f64, u64, u64)>> = Mutex::new(Vec::new());
    let failures: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let start = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..o.clients {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                let Some(user_turns) = turns.get(i) else {
                    break;
                };
                let mut messages = vec![json!({"role": "system", "content": system})];
                for user in user_turns {
                    messages.push(json!({"role": "user", "content": user}));
                    match chat(&server.base, &Value::Array(messages.clone()), o.gen_tokens) {
                        Ok(r) => {
                            samples.lock().unwrap_or_else(|p| p.into_inner()).push((
                                r.ttft_ms,
                                r.prompt_computed,
                                r.completion_tokens,
                            ));
                            messages.push(json!({"role": "assistant", "content": r.text}));
                        }
                        Err(e) => {
                            failures.lock().unwrap_or_else(|p| p.into_inner()).push(e);
                            break;
                        }
                    }
                }
            });
        }
    });
    let wall = start.elapsed().as_secs_f64();
    server.stop()?;
    let failures = failures.into_inner().unwrap_or_else(|p| p.into_inner());
    if let Some(e) = failures.first() {
        return Err(format!(
            "{}: {} requests failed, first: {e}",
            kind.name(),
            failures.len()
        ));
    }
    let samples = samples.into_inner().unwrap_or_else(|p| p.into_inner());
    let ttfts: Vec<f64> = samples.iter().map(|s| s.0).collect();
    let computed: u64 = samples.iter().map(|s| s.1).sum();
    let generated: u64 = samples.iter().map(|s| s.2).sum();
    let out = json!({
        "requests": samples.len(),
        "prompt_tokens_computed": computed,
        "generated_tokens": generated,
        "ttft_mean_ms": ttfts.iter().sum::<f64>() / ttfts.len().max(1) as f64,
        "ttft_p50_ms": percentile(&ttfts, 50.0),
        "ttft_p99_ms": percentile(&ttfts, 99.0),
        "wall_s": wall,
        "generated_tps": generated as f64 / wall,
    });
    eprintln!("{} trace: {out}", kind.name());
    Ok(out)
}

/// Entry point of `cargo xtask bench-server`; each `--workload` goes to its own module.
pub(crate) fn bench_server(args: &BenchServerArgs) -> Result<(), String> {
    let o = match args.plan()? {
        Plan::Default(o) => o,
        Plan::Agent(o, a) => return crate::bench_agent::bench_agent(&o, &a),
        Plan::MultiRound(o, m) => return crate::bench_multiround::bench_multiround(&o, &m),
        Plan::Growth(o, sizes) => return crate::bench_growth::bench_growth(&o, &sizes),
        Plan::Spec(o, s) => return crate::bench_spec::bench_spec(&o, &s),
        Plan::Reasoning(o) => return crate::bench_reasoning::bench_reasoning(&o),
        Plan::Router(o) => return crate::bench_router::bench_router(&o),
    };
    let servers = servers(&o)?;
    let mut report = serde_json::Map::new();
    for (kind, bin) in &servers {
        let mut r = serde_json::Map::new();
        if !o.skip_ttft {
            r.insert("ttft".into(), ttft(*kind, bin, &o)?);
        }
        if !o.skip_trace {
            r.insert("trace".into(), trace(*kind, bin, &o)?);
        }
        report.insert(kind.name().into(), Value::Object(r));
    }
    let out = Value::Object(report);
    let mut stdout = std::io::stdout();
    let _ = writeln!(
        stdout,
        "{}",
        serde_json::to_string_pretty(&out).unwrap_or_default()
    );
    Ok(())
}

/// The servers to measure, ours first: ours (built when `--ours` is not given) and llama-server
/// when given, `--only` applied; an error when the model is missing.
pub(crate) fn servers(o: &Options) -> Result<Vec<(Kind, PathBuf)>, String> {
    if !o.model.exists() {
        return Err(format!(
            "bench-server: no model at {} (run `cargo xtask fetch-model`)",
            o.model.display()
        ));
    }
    let ours = match &o.ours {
        Some(p) => p.clone(),
        None => {
            run(&cargo(), &["build", "--release", "--quiet", "-p", "server"])?;
            target_dir().join("release/llama-hdd-server")
        }
    };
    let mut servers = vec![(Kind::Ours, ours)];
    match &o.llama {
        Some(p) => servers.push((Kind::Llama, p.clone())),
        None => eprintln!(
            "bench-server: no llama-server given (--llama-server PATH or LLAMA_SERVER); \
             measuring ours alone"
        ),
    }
    if let Some(only) = o.only {
        servers.retain(|(k, _)| (only == Only::Ours) == (*k == Kind::Ours));
    }
    Ok(servers)
}
