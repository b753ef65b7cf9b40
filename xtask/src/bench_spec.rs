//! `cargo xtask bench-server --workload spec`: speculative decoding with n-gram drafts against
//! plain decoding, ours and llama.cpp's `llama-server`, on the same model, threads and machine.
//!
//! Configurations, each a fresh server with one slot (`-np 1`, `-c 4096`), one after the other:
//! ours plain and with `--spec-type ngram-simple`; llama-server plain and with each of
//! `--spec-type ngram-simple`, `ngram-map-k` and `ngram-mod` (a configuration of llama-server
//! that fails, at start or later, is reported with its error and the others go on). Each plays
//! three tasks through `POST /completion` (`temperature: 0`), every prompt once:
//! - **editing**: three Python functions of about 600 tokens (blocks of fixed templates, added
//!   until the first server's `/tokenize` counts enough), each to be written out again with one
//!   variable renamed; `n_predict` 640. The reply copies most of its prompt.
//! - **agent tool loop**: three transcripts of a coding agent in which one tool output (a file
//!   listing, a JSON record, a test report) comes twice, then the user asks for it verbatim;
//!   `n_predict` 256.
//! - **no repetition**: three short-story prompts, `n_predict` 256: the control, where drafts
//!   find little and should cost little (the goal: within 3% of plain decoding).
//!
//! Per configuration and task: generated tokens and their time as the server measured them
//! (`timings.predicted_n`, `timings.predicted_ms`), the decode rate (the quotient of their sums,
//! one formula for both servers), drafted and accepted tokens (`timings.draft_n`,
//! `timings.draft_n_accepted`; absent: none), and for a speculative configuration
//! `same_output`: whether every greedy reply equals its server's plain one. `--repeats N` plays N
//! rounds, every server started afresh in each (no draft comes from an earlier round's replies),
//! and sums them; `--gen-tokens N` caps every `n_predict` (a smoke run). Printed: a table and the
//! ratios on stderr (ours n-gram over ours plain per task and over llama-server's best n-gram
//! kind on editing; ours plain over llama-server plain), a JSON report on stdout.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Value};

use crate::bench_args::{Options, Spec};
use crate::bench_server::{self, count_tokens, Kind, Server, Words};

/// `-c` of every server: the longest prompt (under 2,000 tokens) and its reply fit.
const CTX: usize = 4096;

/// Our n-gram kind.
const OURS_NGRAM: &str = "ngram-simple";

/// llama-server's n-gram kinds, each measured on a server of its own.
const LLAMA_NGRAMS: [&str; 3] = ["ngram-simple", "ngram-map-k", "ngram-mod"];

/// A configuration as [`Results::rate`] looks it up: the server, and the n-gram kind.
type Which = (Kind, Option<&'static str>);

/// Our plain configuration.
const OURS_PLAIN: Which = (Kind::Ours, None);
/// Ours with n-gram drafts.
const OURS_SPEC: Which = (Kind::Ours, Some(OURS_NGRAM));
/// llama-server's plain configuration.
const LLAMA_PLAIN: Which = (Kind::Llama, None);

/// Tokens of each function of the editing task, at least.
const FUNCTION_TOKENS: usize = 600;

/// The editing task's index in the tasks (the one llama-server's best n-gram kind is chosen on).
const EDITING: usize = 0;

/// One server configuration: which server, and which n-gram kind drafts (`None`: plain).
struct Config {
    kind: Kind,
    bin: PathBuf,
    ngram: Option<&'static str>,
}

impl Config {
    /// The name the reports give it: the server's, then the n-gram kind.
    fn label(&self) -> String {
        match self.ngram {
            Some(t) => format!("{} {t}", self.kind.name()),
            None => self.kind.name().to_string(),
        }
    }

    /// The server's arguments beyond the common ones.
    fn args(&self) -> Vec<String> {
        self.ngram
            .map(|t| vec!["--spec-type".to_string(), t.to_string()])
            .unwrap_or_default()
    }
}

/// A task: its prompts, each sent once per configuration and round.
struct Task {
    /// The name the reports give it.
    name: &'static str,
    /// `n_predict` of each request.
    n_predict: usize,
    /// The prompts, in the order they are sent.
    prompts: Vec<String>,
    /// Tokens of each prompt, as the first server counts them.
    prompt_tokens: Vec<usize>,
}

/// Generated and drafted tokens, and the time generating took: one request's, or a sum.
#[derive(Clone, Copy, Default)]
struct Figures {
    predicted_n: u64,
    predicted_ms: f64,
    draft_n: u64,
    accepted: u64,
}

impl Figures {
    /// `self` and `x` added up.
    fn plus(self, x: &Figures) -> Figures {
        Figures {
            predicted_n: self.predicted_n + x.predicted_n,
            predicted_ms: self.predicted_ms + x.predicted_ms,
            draft_n: self.draft_n + x.draft_n,
            accepted: self.accepted + x.accepted,
        }
    }

    /// Generated tokens per second of decoding.
    fn tps(&self) -> f64 {
        self.predicted_n as f64 * 1e3 / self.predicted_ms
    }

    /// As the report gives them.
    fn json(&self) -> Value {
        json!({
            "predicted_n": self.predicted_n, "predicted_ms": round3(self.predicted_ms),
            "decode_tps": round3(self.tps()),
            "draft_n": self.draft_n, "draft_n_accepted": self.accepted,
        })
    }
}

/// One request's figures and reply.
struct Sample {
    f: Figures,
    content: String,
}

/// What a configuration gave: per task, its samples in prompt order (round after round), or
/// the error that stopped it.
type Outcome = Result<Vec<Vec<Sample>>, String>;

/// Entry point of `cargo xtask bench-server --workload spec`.
pub(crate) fn bench_spec(o: &Options, s: &Spec) -> Result<(), String> {
    let servers = bench_server::servers(o)?;
    std::fs::create_dir_all(&o.dir).map_err(|e| format!("{}: {e}", o.dir.display()))?;
    let configs = configs(&servers);
    let mut tasks = None;
    let mut outcomes: Vec<Outcome> = configs.iter().map(|_| Ok(Vec::new())).collect();
    for round in 0..o.repeats {
        for (c, outcome) in configs.iter().zip(outcomes.iter_mut()) {
            let Ok(so_far) = outcome else { continue };
            match play(c, o, s, round, &mut tasks) {
                Ok(samples) => {
                    so_far.resize_with(samples.len(), Vec::new);
                    for (a, b) in so_far.iter_mut().zip(samples) {
                        a.extend(b);
                    }
                }
                Err(e) if c.kind == Kind::Llama => {
                    eprintln!("{}: {e}; going on without it", c.label());
                    *outcome = Err(e);
                }
                Err(e) => return Err(e),
            }
        }
    }
    let Some(tasks) = tasks else {
        return Err("bench-server: no server started, so no prompts were made".into());
    };
    let results = Results {
        configs,
        tasks,
        outcomes,
    };
    results.print_table();
    let out = serde_json::to_string_pretty(&results.report(o)).unwrap_or_default();
    let _ = writeln!(std::io::stdout(), "{out}");
    Ok(())
}

/// The configurations of `servers`, each server's plain one first.
fn configs(servers: &[(Kind, PathBuf)]) -> Vec<Config> {
    let ngrams = |k: Kind| match k {
        Kind::Ours => &[OURS_NGRAM][..],
        Kind::Llama => &LLAMA_NGRAMS[..],
    };
    (servers.iter())
        .flat_map(|(kind, bin)| {
            (std::iter::once(None).chain(ngrams(*kind).iter().map(|&t| Some(t)))).map(|ngram| {
                let (kind, bin) = (*kind, bin.clone());
                Config { kind, bin, ngram }
            })
        })
        .collect()
}

/// Starts `c`'s server afresh, makes the tasks if no server has yet, and sends every prompt:
/// the samples per task.
fn play(
    c: &Config,
    o: &Options,
    s: &Spec,
    round: usize,
    tasks: &mut Option<Vec<Task>>,
) -> Result<Vec<Vec<Sample>>, String> {
    let dir = o
        .dir
        .join(format!("spec-{}-{round}", c.label().replace(' ', "-")));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let log = dir.join("server.log");
    let cache = dir.join("cache");
    let server = Server::start(c.kind, &c.bin, o, 1, CTX, &cache, &log, &c.args())
        .map_err(|e| format!("{e}{}", log_tail(&log)))?;
    if tasks.is_none() {
        *tasks = Some(make_tasks(&server.base, s)?);
    }
    let Some(tasks) = tasks.as_ref() else {
        return Err("no tasks".into());
    };
    // Not measured: a fresh process's first decoding steps.
    complete(&server.base, "The weather today is", 8)?;
    let mut out = Vec::new();
    for t in tasks {
        let mut samples = Vec::new();
        for (i, p) in t.prompts.iter().enumerate() {
            let x = complete(&server.base, p, t.n_predict)
                .map_err(|e| format!("{} {} prompt {i}: {e}", c.label(), t.name))?;
            eprintln!(
                "{} {} {i}, round {round}: {}",
                c.label(),
                t.name,
                x.f.json()
            );
            samples.push(x);
        }
        out.push(samples);
    }
    server.stop()?;
    Ok(out)
}

/// What a server's log says of why it stopped: its last line naming an error, or else its
/// last line.
fn log_tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let error = lines
        .iter()
        .rev()
        .find(|l| l.to_lowercase().contains("error"));
    (error.or(lines.last())).map_or(String::new(), |l| format!("; it said: {l}"))
}

/// Sends one greedy `POST /completion` and reads its figures.
fn complete(base: &str, prompt: &str, n_predict: usize) -> Result<Sample, String> {
    let body = json!({
        "prompt": prompt,
        "n_predict": n_predict,
        "temperature": 0.0,
        "stream": false,
    });
    let resp = ureq::post(&format!("{base}/completion"))
        .set("Content-Type", "application/json")
        .timeout(Duration::from_secs(600))
        .send_string(&body.to_string())
        .map_err(|e| format!("completion request failed: {e}"))?;
    let v: Value = serde_json::from_reader(resp.into_reader())
        .map_err(|e| format!("unreadable completion: {e}"))?;
    let t = &v["timings"];
    let (Some(predicted_n), Some(predicted_ms)) =
        (t["predicted_n"].as_u64(), t["predicted_ms"].as_f64())
    else {
        return Err(format!("no timings.predicted_n and _ms in the reply: {t}"));
    };
    let f = Figures {
        predicted_n,
        predicted_ms,
        draft_n: t["draft_n"].as_u64().unwrap_or(0),
        accepted: t["draft_n_accepted"].as_u64().unwrap_or(0),
    };
    let content = v["content"].as_str().unwrap_or_default().to_string();
    Ok(Sample { f, content })
}

/// The three tasks' prompts, the functions sized with `base`'s tokenizer.
fn make_tasks(base: &str, s: &Spec) -> Result<Vec<Task>, String> {
    let mut editing = Vec::new();
    for e in &EDITS {
        let code = function_of_tokens(base, e)?;
        let (old, new) = e.rename;
        editing.push(format!(
            "Rename the variable `{old}` to `{new}` in this function and output the whole \
             function.\n\n```python\n{code}\n```\n\nHere is the function with `{old}` renamed to \
             `{new}`:\n\n```python\n"
        ));
    }
    let stories = STORIES
        .iter()
        .map(|t| format!("Write a short story about {t}.\n\n"))
        .collect();
    let cap = |n: usize| s.max_predict.map_or(n, |m| m.min(n));
    [
        ("editing", 640, editing),
        ("agent_tool_loop", 256, agent_prompts()),
        ("no_repetition", 256, stories),
    ]
    .into_iter()
    .map(|(name, n, prompts)| {
        let prompt_tokens = prompts
            .iter()
            .map(|p| count_tokens(base, p))
            .collect::<Result<_, _>>()?;
        Ok(Task {
            name,
            n_predict: cap(n),
            prompts,
            prompt_tokens,
        })
    })
    .collect()
}

/// One function of the editing task: its names, and the variable to rename.
struct Edit {
    /// The function's name and parameters.
    signature: &'static str,
    /// Its docstring.
    doc: &'static str,
    /// The parameter it walks, and the name of one of its elements.
    items: (&'static str, &'static str),
    /// The keys of the elements.
    fields: [&'static str; 4],
    /// The variable renamed, and its new name.
    rename: (&'static str, &'static str),
    /// The seed of the blocks' choices.
    seed: u64,
}

/// The editing task's functions.
const EDITS: [Edit; 3] = [
    Edit {
        signature: "summarize_orders(orders, tax_rate=0.2, currency=\"EUR\")",
        doc: "Add up the orders' amounts, with tax, and gather statistics per region.",
        items: ("orders", "order"),
        fields: ["price", "quantity", "discount", "region"],
        rename: ("total", "subtotal"),
        seed: 0x51A7_3C0F_E2D4_9B61,
    },
    Edit {
        signature: "merge_inventory(records, warehouse, min_stock=5)",
        doc: "Merge the inventory records of one warehouse and count the items per shelf.",
        items: ("records", "record"),
        fields: ["stock", "reserved", "shelf", "sku"],
        rename: ("count", "item_count"),
        seed: 0x2F6B_91D3_0C48_A7E5,
    },
    Edit {
        signature: "score_requests(requests, threshold, window=60)",
        doc: "Score the requests of a log by latency and status, and note the slow services.",
        items: ("requests", "request"),
        fields: ["latency", "retries", "status", "service"],
        rename: ("score", "risk_score"),
        seed: 0x7C15_D2E8_4B93_06AF,
    },
];

/// The stories of the no-repetition task are about these.
const STORIES: [&str; 3] = [
    "a lighthouse keeper who finds a map in a bottle",
    "two rival bakers in a small mountain town",
    "a robot that learns to paint the sea",
];

/// The opening of each function of the editing task, `$signature`, `$doc` and `$old` to fill in.
const HEAD: &str = r#"def $signature:
    """$doc"""
    $old = 0
    skipped = 0
    stats = {}
    notes = []
"#;

/// The end of each function of the editing task.
const TAIL: &str = r#"    stats["skipped"] = skipped
    stats["final"] = $old
    return stats, notes"#;

/// The kinds of blocks of the editing task's functions, taken in turn: `$n` (the step), `$f`
/// (a key), `$k`, `$big` (numbers), `$items`, `$item` and `$old` (the variable renamed) to fill.
const BLOCKS: [&str; 5] = [
    r#"    # Step $n: the mean per entry.
    try:
        ratio = $old / max(len($items), 1)
    except ZeroDivisionError:
        ratio = 0.0
    stats["$f_ratio_$n"] = round(ratio, 2)
    if ratio > $k:
        notes.append(("$f", ratio))
"#,
    r#"    # Step $n: add up the $f of every $item.
    for $item in $items:
        if $item.get("$f") is None:
            skipped += 1
            continue
        $old += $item["$f"] * $k
"#,
    r#"    # Step $n: keep the running value between 0 and $big.
    if $old > $big:
        notes.append(("$f", $old - $big))
        $old = $big
    elif $old < 0:
        notes.append(("$f", $old))
        $old = 0
"#,
    r#"    # Step $n: the largest $f, every $kth entry.
    index = 0
    while index < len($items):
        value = $items[index]
        if isinstance(value, dict) and "$f" in value:
            $old = max($old, value["$f"])
        index += $k
"#,
    r#"    # Step $n: group by $f and weigh each group.
    groups = {}
    for $item in $items:
        key = $item.get("$f", "unknown")
        groups.setdefault(key, []).append($item)
    for key, group in sorted(groups.items()):
        stats[key] = len(group)
        $old += len(group) * $k
"#,
];

/// `e`'s function, blocks added until `base` counts at least [`FUNCTION_TOKENS`] tokens.
fn function_of_tokens(base: &str, e: &Edit) -> Result<String, String> {
    let head = HEAD
        .replace("$signature", e.signature)
        .replace("$doc", e.doc)
        .replace("$old", e.rename.0);
    let tail = TAIL.replace("$old", e.rename.0);
    let mut words = Words(e.seed);
    let mut body = String::new();
    for n in 1..=100 {
        body.push_str(&block(e, n, &mut words));
        let code = format!("{head}{body}{tail}");
        if count_tokens(base, &code)? >= FUNCTION_TOKENS {
            return Ok(code);
        }
    }
    Err(format!(
        "{}: 100 blocks are under {FUNCTION_TOKENS} tokens",
        e.signature
    ))
}

/// Block `n` of `e`'s function: the kind [`BLOCKS`]`[n % 5]`, its key and numbers from `r`.
fn block(e: &Edit, n: usize, r: &mut Words) -> String {
    let f = e.fields[(r.next() % 4) as usize];
    let k = 2 + r.next() % 9;
    let big = 100 * (1 + r.next() % 50);
    BLOCKS[n % 5]
        .replace("$n", &n.to_string())
        .replace("$f", f)
        .replace("$k", &k.to_string())
        .replace("$big", &big.to_string())
        .replace("$items", e.items.0)
        .replace("$item", e.items.1)
        .replace("$old", e.rename.0)
}

/// The agent tool loop's transcripts, but for the repeated tool output: the user's question,
/// the repeated call, another call and its output, the user's request for the output again.
const AGENT: [[&str; 5]; 3] = [
    [
        "Which configuration files does the project have, and how large are they?",
        r#"{"name": "list_files", "arguments": {"path": "."}}"#,
        r#"{"name": "read_file", "arguments": {"path": "config/settings.toml"}}"#,
        "[server]\nport = 8080\nworkers = 4\n\n[cache]\npath = \"/var/cache/app\"\nsize_mb = 512",
        "Copy the last file listing exactly as the tool printed it.",
    ],
    [
        "What is the state of issue 4812, and who is working on it?",
        r#"{"name": "get_issue", "arguments": {"id": 4812}}"#,
        r#"{"name": "search", "arguments": {"query": "fn flush"}}"#,
        "src/cache.rs:212: pub fn flush(&mut self) {\nsrc/server.rs:431: cache.flush()?;",
        "Repeat the issue record exactly as the tool returned it.",
    ],
    [
        "Run the tests and tell me which ones fail.",
        r#"{"name": "run_tests", "arguments": {}}"#,
        r#"{"name": "read_file", "arguments": {"path": "tests/test_cache.py", "end_line": 3}}"#,
        "1 import pytest\n2 from app.cache import Cache\n3 def test_flush_writes(tmp_path):",
        "Repeat the test report exactly as the tool printed it.",
    ],
];

/// The agent tool loop's transcripts: in each, one tool output (a file listing, a JSON record,
/// a test report) comes twice, another call between, and the user then asks for it verbatim.
fn agent_prompts() -> Vec<String> {
    let mut r = Words(0x2545_F491_4F6C_DD1D);
    let outputs = [
        file_listing(&mut r),
        issue_record(&mut r),
        test_report(&mut r),
    ];
    (AGENT.iter().zip(outputs))
        .map(|([question, call, other, other_output, ask], output)| {
            let turn = |intro: &str, call: &str, out: &str| {
                format!(
                    "Assistant: {intro}\n<tool_call>{call}</tool_call>\n\nTool output:\n{out}\n\n"
                )
            };
            format!(
                "The following is a transcript of a coding agent working in a repository. The \
                 agent calls tools; each tool's output follows its call.\n\nUser: {question}\n\n\
                 {}{}{}User: {ask}\n\nAssistant: Here it is, exactly as the tool printed it:\n\n",
                turn("I will look first.", call, &output),
                turn("Let me check one more thing.", other, other_output),
                turn(
                    "I will call it again, to be sure nothing changed.",
                    call,
                    &output
                ),
            )
        })
        .collect()
}

/// A long-format listing of 14 files.
fn file_listing(r: &mut Words) -> String {
    const PATHS: [&str; 4] = ["src/$.py", "config/$.toml", "tests/test_$.py", "docs/$.md"];
    const NAMES: [&str; 6] = ["server", "cache", "index", "client", "router", "worker"];
    let lines: Vec<String> = (0..14)
        .map(|_| {
            let path = PATHS[(r.next() % 4) as usize].replace('$', NAMES[(r.next() % 6) as usize]);
            let (size, month, day) = (200 + r.next() % 40000, 1 + r.next() % 12, 1 + r.next() % 28);
            let (h, m) = (r.next() % 24, r.next() % 60);
            format!("-rw-r--r-- 1 dev dev {size:>6} 2024-{month:02}-{day:02} {h:02}:{m:02} {path}")
        })
        .collect();
    lines.join("\n")
}

/// An issue tracker's record of an issue with three comments, as pretty-printed JSON.
fn issue_record(r: &mut Words) -> String {
    let comments: Vec<Value> = ["mira", "tomas", "ana"]
        .iter()
        .enumerate()
        .map(|(i, who)| {
            let (h, m) = (r.next() % 24, r.next() % 60);
            let at = format!("2024-03-{:02}T{h:02}:{m:02}:00Z", 10 + i);
            json!({"author": who, "created_at": at, "body": r.text(24)})
        })
        .collect();
    let issue = json!({
        "id": 4812,
        "title": "Prompt cache is not written to disk when the server stops",
        "state": "open",
        "labels": ["bug", "cache", "priority: high"],
        "author": "jonas",
        "assignees": ["mira", "tomas"],
        "created_at": "2024-03-09T16:42:00Z",
        "body": r.text(30),
        "comments": comments,
    });
    serde_json::to_string_pretty(&issue).unwrap_or_default()
}

/// A pytest run's report: 18 tests, some failing, and the summary.
fn test_report(r: &mut Words) -> String {
    const TESTS: [&str; 6] = [
        "flush", "restart", "evict", "bad_path", "timeout", "headers",
    ];
    let (mut lines, mut failed) = (Vec::new(), Vec::new());
    for i in 0..18 {
        let file = ["cache", "server", "router"][i % 3];
        let name = format!(
            "tests/test_{file}.py::test_{}_{i}",
            TESTS[(r.next() % 6) as usize]
        );
        let fails = r.next().is_multiple_of(5);
        let status = if fails { "FAILED" } else { "PASSED" };
        lines.push(format!("{name} {status} [{:>3}%]", (i + 1) * 100 / 18));
        if fails {
            let (a, b) = (r.next() % 1000, r.next() % 1000);
            failed.push(format!("FAILED {name} - AssertionError: assert {a} == {b}"));
        }
    }
    let (n, secs) = (failed.len(), (200 + r.next() % 800) as f64 / 100.0);
    let summary = format!("==== {n} failed, {} passed in {secs:.2}s ====", 18 - n);
    format!("{}\n\n{}\n{summary}", lines.join("\n"), failed.join("\n"))
}

/// Everything measured, for the table and the report.
struct Results {
    configs: Vec<Config>,
    tasks: Vec<Task>,
    outcomes: Vec<Outcome>,
}

impl Results {
    /// Configuration `i`'s samples of task `t`, if it ran.
    fn samples(&self, i: usize, t: usize) -> Option<&[Sample]> {
        self.outcomes[i].as_ref().ok()?.get(t).map(Vec::as_slice)
    }

    /// Configuration `i`'s sums over task `t`, if it ran.
    fn sums(&self, i: usize, t: usize) -> Option<Figures> {
        let samples = self.samples(i, t)?;
        Some(samples.iter().fold(Figures::default(), |s, x| s.plus(&x.f)))
    }

    /// The index of configuration `w`.
    fn find(&self, w: Which) -> Option<usize> {
        self.configs.iter().position(|c| (c.kind, c.ngram) == w)
    }

    /// The decode rate of configuration `w` on task `t`, if it ran.
    fn rate(&self, w: Which, t: usize) -> Option<f64> {
        self.sums(self.find(w)?, t).map(|s| s.tps())
    }

    /// Whether speculative configuration `i` replied to every prompt of task `t` as its
    /// server's plain configuration did; `None` for a plain one or when either did not run.
    fn same_output(&self, i: usize, t: usize) -> Option<bool> {
        let c = &self.configs[i];
        c.ngram?;
        let plain = self.find((c.kind, None))?;
        let (a, b) = (self.samples(i, t)?, self.samples(plain, t)?);
        Some(a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.content == y.content))
    }

    /// llama-server's n-gram kind with the highest decode rate on editing, and that rate.
    fn best_llama_ngram(&self) -> Option<(&'static str, f64)> {
        LLAMA_NGRAMS
            .iter()
            .filter_map(|&t| Some((t, self.rate((Kind::Llama, Some(t)), EDITING)?)))
            .max_by(|a, b| a.1.total_cmp(&b.1))
    }

    /// The decode rate of `a` over that of `b`, per task.
    fn per_task(&self, a: Which, b: Which) -> Vec<Option<f64>> {
        (0..self.tasks.len())
            .map(|t| Some(self.rate(a, t)? / self.rate(b, t)?))
            .collect()
    }

    /// Ours with n-grams over llama-server's best n-gram kind on editing, and that kind.
    fn over_best(&self) -> Option<(&'static str, f64)> {
        let (kind, best) = self.best_llama_ngram()?;
        Some((kind, self.rate(OURS_SPEC, EDITING)? / best))
    }

    /// The ratios of the decode rates the goals are stated in.
    fn ratios(&self) -> Value {
        let by_task = |v: Vec<Option<f64>>| {
            let m: serde_json::Map<String, Value> = self
                .tasks
                .iter()
                .zip(v)
                .map(|(t, r)| (t.name.to_string(), json!(r.map(round3))))
                .collect();
            Value::Object(m)
        };
        json!({
            "ours_ngram_over_ours_plain": by_task(self.per_task(OURS_SPEC, OURS_PLAIN)),
            "ours_plain_over_llama_plain": by_task(self.per_task(OURS_PLAIN, LLAMA_PLAIN)),
            "llama_best_ngram": self.best_llama_ngram().map(|b| b.0),
            "ours_ngram_over_llama_best_ngram_editing": self.over_best().map(|b| round3(b.1)),
        })
    }

    /// The JSON report: the settings, each configuration's figures per task, the ratios.
    fn report(&self, o: &Options) -> Value {
        let tasks: Vec<Value> = (self.tasks.iter())
            .map(|t| json!({"name": t.name, "n_predict": t.n_predict, "tokens": t.prompt_tokens}))
            .collect();
        let mut configs = serde_json::Map::new();
        for (i, c) in self.configs.iter().enumerate() {
            let mut v = json!({"server": c.kind.name(), "args": c.args()});
            match &self.outcomes[i] {
                Err(e) => v["error"] = json!(e),
                Ok(_) => {
                    let mut per = serde_json::Map::new();
                    for (t, task) in self.tasks.iter().enumerate() {
                        per.insert(task.name.into(), self.task_figures(i, t));
                    }
                    v["tasks"] = Value::Object(per);
                }
            }
            configs.insert(c.label(), v);
        }
        json!({
            "settings": {
                "model": o.model.display().to_string(), "threads": o.threads, "ctx": CTX,
                "rounds": o.repeats, "tasks": tasks,
            },
            "configurations": configs,
            "ratios": self.ratios(),
        })
    }

    /// Configuration `i`'s figures on task `t`.
    fn task_figures(&self, i: usize, t: usize) -> Value {
        let samples = self.samples(i, t).unwrap_or_default();
        let s = self.sums(i, t).unwrap_or_default();
        let mut v = s.json();
        v["requests"] = json!(samples.len());
        v["acceptance"] =
            json!((s.draft_n > 0).then(|| round3(s.accepted as f64 / s.draft_n as f64)));
        if let Some(same) = self.same_output(i, t) {
            v["same_output"] = json!(same);
        }
        v["runs"] = samples.iter().map(|x| x.f.json()).collect();
        v
    }

    /// The table on stderr: decode rates (accepted of drafted tokens), then the ratios.
    fn print_table(&self) {
        let mut err = std::io::stderr();
        let _ = write!(err, "\ndecode tok/s (accepted/drafted)\n{:<30}", "");
        for t in &self.tasks {
            let _ = write!(err, "{:<24}", t.name);
        }
        for (i, c) in self.configs.iter().enumerate() {
            let _ = write!(err, "\n{:<30}", c.label());
            if let Err(e) = &self.outcomes[i] {
                let _ = write!(err, "error: {e}");
                continue;
            }
            for t in 0..self.tasks.len() {
                let s = self.sums(i, t).unwrap_or_default();
                let mut cell = format!("{:.1}", s.tps());
                if s.draft_n > 0 {
                    cell.push_str(&format!(" ({}/{})", s.accepted, s.draft_n));
                }
                if self.same_output(i, t) == Some(false) {
                    cell.push_str(" differs");
                }
                let _ = write!(err, "{cell:<24}");
            }
        }
        let row = |name: &str, v: Vec<Option<f64>>| {
            let mut line = format!("\n{name:<30}");
            for r in v {
                let cell = r.map_or("-".to_string(), |r| format!("{r:.3}"));
                line.push_str(&format!("{cell:<24}"));
            }
            line
        };
        let (a, b) = (
            self.per_task(OURS_SPEC, OURS_PLAIN),
            self.per_task(OURS_PLAIN, LLAMA_PLAIN),
        );
        let _ = write!(err, "{}", row("ours n-gram / ours plain", a));
        let _ = write!(err, "{}", row("ours plain / llama plain", b));
        if let Some((kind, r)) = self.over_best() {
            let _ = write!(
                err,
                "\nours n-gram / llama-server {kind} (best) on editing: {r:.3}"
            );
        }
        let _ = writeln!(err);
    }
}

/// `x` to three decimals.
fn round3(x: f64) -> f64 {
    (x * 1e3).round() / 1e3
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every block of every function uses the variable to rename, and the same seed gives the
    /// same blocks.
    #[test]
    fn blocks_use_the_renamed_variable() {
        for e in &EDITS {
            let (mut a, mut b) = (Words(e.seed), Words(e.seed));
            for n in 1..=10 {
                let block_a = block(e, n, &mut a);
                assert!(block_a.contains(&format!("{} ", e.rename.0)), "{block_a}");
                assert_eq!(block_a, block(e, n, &mut b));
            }
        }
    }
}
