//! `cargo xtask bench-server --workload multi-round`: multi-round question answering over
//! private documents, played against our server and llama.cpp's `llama-server` in turn.
//!
//! `--users` U (default 8) users share a system prompt of `--system-tokens` (default 1000) and
//! each has a private document of `--doc-tokens` (default 1500). Round 1 asks a question about
//! the document; each later round appends the reply and a new question, so every request's
//! prompt continues that user's previous one. Requests go round-robin (user 1..U of round 1,
//! then of round 2, ...) over `--rounds` R (default 4) rounds, `--clients` C (default 4) at a
//! time; a user's next round waits for its previous reply. Both servers get `-np C`, `-c` of
//! `--ctx` (default 4096) per slot and the same `--cache-ram` in MiB (`--cache-ram-mib`,
//! default 32): the prompts of all users do not fit, so what the server keeps beyond its RAM
//! decides how much each round recomputes.
//!
//! Measured per request: time to first token (first streamed content), prompt tokens computed
//! (`timings.prompt_n`); per server: p50 and p99 time to first token, generated tokens per
//! second over the whole run. Printed: a JSON report with the `ratios` (ours / llama-server).

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::bench_args::{MultiRound, Options};
use crate::bench_server::{self, chat, percentile, Kind, Server, Words};

/// The texts, generated once so both servers get the same requests.
struct Script {
    system: String,
    docs: Vec<String>,
    /// `questions[user][round]`.
    questions: Vec<Vec<String>>,
}

/// One request's figures.
#[derive(Clone, Copy)]
struct Figures {
    ttft_ms: f64,
    computed: u64,
    generated: u64,
}

/// Entry point of `cargo xtask bench-server --workload multi-round`.
pub(crate) fn bench_multiround(o: &Options, m: &MultiRound) -> Result<(), String> {
    let servers = bench_server::servers(o)?;
    std::fs::create_dir_all(&o.dir).map_err(|e| format!("{}: {e}", o.dir.display()))?;
    let mut script = None;
    let mut report = serde_json::Map::new();
    report.insert(
        "settings".into(),
        json!({
            "users": m.users, "rounds": m.rounds, "clients": o.clients,
            "system_tokens": o.system_tokens, "doc_tokens": m.doc_tokens,
            "max_tokens": o.gen_tokens, "ctx": m.ctx, "cache_ram_mib": m.cache_ram_mib,
        }),
    );
    let mut summaries = Vec::new();
    for (kind, bin) in &servers {
        let (figures, wall) = play(*kind, bin, o, m, &mut script)?;
        let s = summary(&figures, wall);
        eprintln!("{}: {s}", kind.name());
        summaries.push((*kind, s.clone()));
        report.insert(kind.name().into(), s);
    }
    let find = |k: Kind| summaries.iter().find(|s| s.0 == k).map(|s| &s.1);
    if let (Some(ours), Some(llama)) = (find(Kind::Ours), find(Kind::Llama)) {
        let r =
            |k: &str| ours[k].as_f64().unwrap_or(f64::NAN) / llama[k].as_f64().unwrap_or(f64::NAN);
        report.insert(
            "ratios".into(),
            json!({
                "ttft_p50": r("ttft_p50_ms"), "ttft_p99": r("ttft_p99_ms"),
                "throughput": r("generated_tps"), "prompt_tokens_computed": r("prompt_tokens_computed"),
            }),
        );
    }
    let out = serde_json::to_string_pretty(&Value::Object(report)).unwrap_or_default();
    println!("{out}");
    Ok(())
}

impl Script {
    fn new(base: &str, o: &Options, m: &MultiRound) -> Result<Script, String> {
        let mut words = Words(0x9e37_79b9_7f4a_7c15);
        let system = format!(
            "You answer questions about the document the user gives. {}",
            words.text_of_tokens(base, o.system_tokens)?
        );
        let mut docs = Vec::new();
        let mut questions = Vec::new();
        for u in 0..m.users {
            docs.push(format!(
                "Document {}: {}",
                u + 1,
                words.text_of_tokens(base, m.doc_tokens)?
            ));
            questions.push(
                (0..m.rounds)
                    .map(|r| {
                        format!(
                            "Question {}: what does it say about {}?",
                            r + 1,
                            words.text(6)
                        )
                    })
                    .collect(),
            );
        }
        Ok(Script {
            system,
            docs,
            questions,
        })
    }
}

/// Plays the workload against one server: its figures in request order, and the wall time.
fn play(
    kind: Kind,
    bin: &std::path::Path,
    o: &Options,
    m: &MultiRound,
    script: &mut Option<Script>,
) -> Result<(Vec<Figures>, f64), String> {
    let dir = o.dir.join(format!("{}-multi-round", kind.name()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let extra = vec!["--cache-ram".to_string(), m.cache_ram_mib.to_string()];
    let server = Server::start(
        kind,
        bin,
        o,
        o.clients,
        m.ctx,
        &dir.join("cache"),
        &dir.join("server.log"),
        &extra,
    )?;
    if script.is_none() {
        *script = Some(Script::new(&server.base, o, m)?);
    }
    let Some(s) = script.as_ref() else {
        return Err("no script".into());
    };
    // Each user's conversation so far, and how many rounds of it are answered.
    let conversations: Vec<Mutex<Vec<Value>>> = (0..m.users)
        .map(|u| {
            Mutex::new(vec![
                json!({"role": "system", "content": s.system}),
                json!({"role": "user", "content": format!("{}\n\n{}", s.docs[u], s.questions[u][0])}),
            ])
        })
        .collect();
    let answered = Arc::new((Mutex::new(vec![0usize; m.users]), Condvar::new()));
    let next = Mutex::new(0usize);
    let figures = Mutex::new(vec![None::<Figures>; m.users * m.rounds]);
    let failure = Mutex::new(None::<String>);
    let start = Instant::now();
    std::thread::scope(|scope| {
        for _ in 0..o.clients {
            scope.spawn(|| loop {
                let i = {
                    let mut n = next.lock().unwrap_or_else(|e| e.into_inner());
                    if *n >= m.users * m.rounds || failure.lock().is_ok_and(|f| f.is_some()) {
                        return;
                    }
                    *n += 1;
                    *n - 1
                };
                let (round, user) = (i / m.users, i % m.users);
                // The user's previous round first.
                {
                    let (lock, cv) = &*answered;
                    let mut done = lock.lock().unwrap_or_else(|e| e.into_inner());
                    while done[user] < round {
                        done = cv
                            .wait_timeout(done, Duration::from_millis(100))
                            .map(|r| r.0)
                            .unwrap_or_else(|e| e.into_inner().0);
                    }
                }
                let messages = Value::Array(
                    conversations[user]
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .clone(),
                );
                match chat(&server.base, &messages, o.gen_tokens) {
                    Ok(reply) => {
                        let mut c = conversations[user]
                            .lock()
                            .unwrap_or_else(|e| e.into_inner());
                        c.push(json!({"role": "assistant", "content": reply.text}));
                        if let Some(q) = s.questions[user].get(round + 1) {
                            c.push(json!({"role": "user", "content": q}));
                        }
                        drop(c);
                        if let Ok(mut f) = figures.lock() {
                            f[i] = Some(Figures {
                                ttft_ms: reply.ttft_ms,
                                computed: reply.prompt_computed,
                                generated: reply.completion_tokens,
                            });
                        }
                    }
                    Err(e) => {
                        if let Ok(mut f) = failure.lock() {
                            *f = Some(format!("{} request {i}: {e}", kind.name()));
                        }
                        return;
                    }
                }
                let (lock, cv) = &*answered;
                lock.lock().unwrap_or_else(|e| e.into_inner())[user] = round + 1;
                cv.notify_all();
            });
        }
    });
    let wall = start.elapsed().as_secs_f64();
    server.stop()?;
    if let Some(e) = failure.into_inner().unwrap_or_else(|e| e.into_inner()) {
        return Err(e);
    }
    let figures: Vec<Figures> = figures
        .into_inner()
        .unwrap_or_else(|e| e.into_inner())
        .into_iter()
        .flatten()
        .collect();
    Ok((figures, wall))
}

fn summary(figures: &[Figures], wall: f64) -> Value {
    let ttfts: Vec<f64> = figures.iter().map(|f| f.ttft_ms).collect();
    let generated: u64 = figures.iter().map(|f| f.generated).sum();
    let computed: u64 = figures.iter().map(|f| f.computed).sum();
    json!({
        "requests": figures.len(),
        "ttft_p50_ms": percentile(&ttfts, 50.0),
        "ttft_p99_ms": percentile(&ttfts, 99.0),
        "ttft_max_ms": percentile(&ttfts, 100.0),
        "prompt_tokens_computed": computed,
        "generated_tokens": generated,
        "wall_s": wall,
        "generated_tps": generated as f64 / wall,
        "ttft_ms_in_request_order": ttfts.iter().map(|t| t.round()).collect::<Vec<_>>(),
    })
}
