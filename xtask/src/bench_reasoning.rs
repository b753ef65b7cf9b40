//! `cargo xtask bench-server --workload reasoning`: a reasoning conversation whose client drops
//! `reasoning_content` from the history it sends back (as opencode and Open WebUI do), played
//! against our server and llama.cpp's `llama-server`.
//!
//! Neither model we ship reasons, so both servers get a template of this module's own in the
//! style of Qwen3's (`--chat-template-file`, `--jinja`, `--reasoning-format deepseek`): the
//! generation prompt opens `<think>\n`, and an assistant message's reasoning is rendered only
//! after the last user message, never in earlier turns. Every request carries the same GBNF
//! `grammar`, which makes the model write a thought of 32 to 160 characters, `\n</think>\n\n`,
//! then an answer of 32 to 240 characters; each server splits the reply into `reasoning_content`
//! and `content` with its own parser, and the report counts the turns where it did.
//!
//! The conversation: a system prompt of about `--system-tokens` tokens (default 200), then
//! `--turns` (default 10) user messages of 45 to 75 words (about 60 to 100 tokens), fixed up
//! front from a seed. Each request sends the whole history, each earlier reply as its `content`
//! alone, greedy, `max_tokens` `--gen-tokens` (default 128), streamed. Configurations, each on a
//! fresh server (`-np 1 -c 4096`) and cache directory, `--repeats` rounds (default 1):
//! - ours, the client waiting between turns until the reply's warm-up is done (polling
//!   `/metrics` until `llamahdd:cache_replies_warmed_total` counts every reply so far: a person
//!   reading, or an agent running tools);
//! - ours, the next turn sent as soon as the reply has ended;
//! - ours with `--no-warm-replies`;
//! - llama-server (nothing to wait for: it does no work between requests).
//!
//! Per turn: the prompt's tokens (`usage.prompt_tokens`, the whole history), the tokens computed
//! for it (`timings.prompt_n`) and taken from the cache (`timings.cache_n`), for ours the
//! tokens warm-ups computed since the previous request was sent (the difference of
//! `llamahdd:cache_reply_warm_tokens_total`, read just before each request), the time to the
//! first streamed token of reasoning or content, and `timings.prompt_ms`. After the
//! conversation, its prompts are rendered (`/apply-template`) and tokenized (`/tokenize`) by the
//! same server to give each turn's **new** tokens (its user message, from the header's
//! `<|im_start|>`, and the generation prompt) and its **ideal**: the tokens after the longest
//! prefix it shares with the previous turn's prompt (the last reply as sent back plus the new
//! message), the least a cache holding the conversation as generated must compute. Per turn,
//! the warm-up tokens are those of the last reply only when the client waits; when it does not,
//! a warm-up ends during a later request and is counted there, so only the totals compare.
//! Printed: a per-turn table on stderr, a JSON report on stdout.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::bench_args::Options;
use crate::bench_server::{self, percentile, Kind, Server, Words};

/// A Qwen3-style template: ChatML turns; an assistant message's reasoning (`reasoning_content`,
/// or a `<think>` block inside its content) is rendered only after the last user message; the
/// generation prompt opens a thinking block.
const TEMPLATE: &str = r#"{%- if messages[0].role == 'system' %}
{{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- set ns = namespace(last_user=-1) %}
{%- for m in messages %}{%- if m.role == 'user' %}{%- set ns.last_user = loop.index0 %}{%- endif %}{%- endfor %}
{%- for m in messages %}
{%- if m.role == 'assistant' %}
{%- set text = m.content if m.content else '' %}
{%- set thought = m.reasoning_content if m.reasoning_content else '' %}
{%- if '</think>' in text %}
{%- set thought = text.split('</think>')[0].split('<think>')[-1].strip('\n') %}
{%- set text = text.split('</think>')[-1].lstrip('\n') %}
{%- endif %}
{%- if loop.index0 > ns.last_user and thought %}
{{- '<|im_start|>assistant\n<think>\n' + thought.strip('\n') + '\n</think>\n\n' + text.lstrip('\n') + '<|im_end|>\n' }}
{%- else %}
{{- '<|im_start|>assistant\n' + text + '<|im_end|>\n' }}
{%- endif %}
{%- elif m.role != 'system' or not loop.first %}
{{- '<|im_start|>' + m.role + '\n' + m.content + '<|im_end|>\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n<think>\n' }}{%- endif %}
"#;

/// The reply's shape, the same for both servers: a thought, the thinking block's end, an answer
/// (the generation prompt has opened the block). No `<` inside, so neither can close it early.
const GRAMMAR: &str = "root ::= thought \"\\n</think>\\n\\n\" answer\n\
                       thought ::= [^<\\n]{32,160}\n\
                       answer ::= [^<]{32,240}\n";

/// Counters of our `/metrics`.
const WARMED: &str = "llamahdd:cache_replies_warmed_total";
const WARM_TOKENS: &str = "llamahdd:cache_reply_warm_tokens_total";

/// How long a client waits for a warm-up before the run is called failed.
const WARM_TIMEOUT: Duration = Duration::from_secs(120);

/// One configuration: which server, its options beyond the common ones, and whether the client
/// waits for the warm-ups between turns.
struct Config {
    kind: Kind,
    bin: PathBuf,
    label: &'static str,
    warm_replies: bool,
    waits: bool,
}

/// What one turn gave.
struct Turn {
    /// The request's messages (for the token counts worked out after the conversation).
    messages: Value,
    /// `usage.prompt_tokens`: the whole history.
    prompt_tokens: u64,
    /// `timings.prompt_n`.
    computed: u64,
    /// `timings.cache_n`.
    cached: u64,
    /// Our warm-ups' tokens computed between the previous request and this one.
    warmed_before: u64,
    /// From sending the request to the first streamed token of reasoning or content.
    ttft_ms: f64,
    /// `timings.prompt_ms`.
    prompt_ms: f64,
    /// The reply's tokens.
    completion_tokens: u64,
    reasoning: String,
    content: String,
    /// Worked out after the conversation: this turn's new tokens and its ideal (see the module
    /// docs), and its prompt's tokens as `/tokenize` counts them.
    new: u64,
    ideal: u64,
    tokenized: u64,
}

/// One conversation on one configuration.
struct Run {
    turns: Vec<Turn>,
    /// Warm-up tokens after the last request (the last reply's, which no turn takes).
    warmed_after: u64,
}

/// Entry point of `cargo xtask bench-server --workload reasoning`.
pub(crate) fn bench_reasoning(o: &Options) -> Result<(), String> {
    let servers = bench_server::servers(o)?;
    std::fs::create_dir_all(&o.dir).map_err(|e| format!("{}: {e}", o.dir.display()))?;
    let template = o.dir.join("reasoning-chat-template.jinja");
    std::fs::write(&template, TEMPLATE).map_err(|e| format!("{}: {e}", template.display()))?;
    let mut configs = Vec::new();
    for (kind, bin) in servers {
        let c = |label, warm_replies, waits| Config {
            kind,
            bin: bin.clone(),
            label,
            warm_replies,
            waits,
        };
        match kind {
            Kind::Ours => configs.extend([
                c("ours, client waits for warm-ups", true, true),
                c("ours, next turn at once", true, false),
                c("ours --no-warm-replies", false, false),
            ]),
            Kind::Llama => configs.push(c("llama-server", false, false)),
        }
    }
    let mut script: Option<(String, Vec<String>)> = None;
    // runs[config][round]
    let mut runs: Vec<Vec<Run>> = configs.iter().map(|_| Vec::new()).collect();
    for round in 0..o.repeats {
        for (i, c) in configs.iter().enumerate() {
            let run = play(c, o, &template, round, &mut script)
                .map_err(|e| format!("{}, round {}: {e}", c.label, round + 1))?;
            eprintln!(
                "round {} {}: computed {} (+{} warmed) over turns 2..{}, ideal {}",
                round + 1,
                c.label,
                sum(&run.turns[1..], |t| t.computed),
                sum(&run.turns[1..], |t| t.warmed_before),
                run.turns.len(),
                sum(&run.turns[1..], |t| t.ideal),
            );
            runs[i].push(run);
        }
    }
    print_table(&configs, &runs);
    let mut report = serde_json::Map::new();
    report.insert(
        "settings".into(),
        json!({
            "turns": o.turns, "system_tokens": o.system_tokens, "max_tokens": o.gen_tokens,
            "rounds": o.repeats, "grammar": GRAMMAR,
            "chat_template": template.display().to_string(),
        }),
    );
    for (c, rounds) in configs.iter().zip(&runs) {
        report.insert(c.label.into(), summary(rounds));
    }
    let out = serde_json::to_string_pretty(&Value::Object(report)).unwrap_or_default();
    let _ = writeln!(std::io::stdout(), "{out}");
    Ok(())
}

/// `f` summed over `turns`.
fn sum(turns: &[Turn], f: impl Fn(&Turn) -> u64) -> u64 {
    turns.iter().map(f).sum()
}

/// Plays the conversation on a fresh server of configuration `c`.
fn play(
    c: &Config,
    o: &Options,
    template: &Path,
    round: usize,
    script: &mut Option<(String, Vec<String>)>,
) -> Result<Run, String> {
    let slug: String = c
        .label
        .chars()
        .map(|ch| if ch.is_ascii_alphanumeric() { ch } else { '-' })
        .collect();
    let dir = o.dir.join(format!("reasoning-{slug}-{round}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut extra: Vec<String> = [
        "--jinja",
        "--chat-template-file",
        &template.display().to_string(),
        "--reasoning-format",
        "deepseek",
        "--metrics",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    if c.kind == Kind::Ours && !c.warm_replies {
        extra.push("--no-warm-replies".into());
    }
    let server = Server::start(
        c.kind,
        &c.bin,
        o,
        1,
        4096,
        &dir.join("cache"),
        &dir.join("server.log"),
        &extra,
    )?;
    if script.is_none() {
        let mut words = Words(0x5EED_7A1C_0FFE_E123);
        let system = format!(
            "You are a careful assistant. Think the question through before you answer. {}",
            words.text_of_tokens(&server.base, o.system_tokens.saturating_sub(20).max(1))?
        );
        let users = (0..o.turns)
            .map(|_| {
                let n = 45 + (words.next() % 31) as usize;
                format!("{} What do you make of this?", words.text(n))
            })
            .collect();
        *script = Some((system, users));
    }
    let Some((system, users)) = script.as_ref() else {
        return Err("no script".into());
    };
    let ours = c.kind == Kind::Ours;
    let mut messages = vec![json!({"role": "system", "content": system})];
    let mut turns: Vec<Turn> = Vec::new();
    let mut warm_tokens = if ours {
        metric(&server.base, WARM_TOKENS)?
    } else {
        0
    };
    for (k, user) in users.iter().enumerate() {
        messages.push(json!({"role": "user", "content": user}));
        let now = if ours {
            metric(&server.base, WARM_TOKENS)?
        } else {
            0
        };
        let mut t = send(&server.base, &Value::Array(messages.clone()), o.gen_tokens)
            .map_err(|e| format!("turn {}: {e}", k + 1))?;
        t.warmed_before = now - warm_tokens;
        warm_tokens = now;
        if ours && c.warm_replies && c.waits {
            wait_warmed(&server.base, k as u64 + 1)?;
        }
        // The client sends the reply back without its reasoning.
        messages.push(json!({"role": "assistant", "content": t.content}));
        turns.push(t);
    }
    if ours && c.warm_replies {
        wait_warmed(&server.base, o.turns as u64)?;
    }
    let warmed_after = if ours {
        metric(&server.base, WARM_TOKENS)? - warm_tokens
    } else {
        0
    };
    count_ideal(&server.base, &mut turns)?;
    server.stop()?;
    Ok(Run {
        turns,
        warmed_after,
    })
}

/// Polls our `/metrics` until `n` replies have been warmed.
fn wait_warmed(base: &str, n: u64) -> Result<(), String> {
    let deadline = Instant::now() + WARM_TIMEOUT;
    while metric(base, WARMED)? < n {
        if Instant::now() > deadline {
            return Err(format!(
                "warm-up {n} did not finish within {} s",
                WARM_TIMEOUT.as_secs()
            ));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(())
}

/// A counter of `/metrics`.
fn metric(base: &str, name: &str) -> Result<u64, String> {
    let text = ureq::get(&format!("{base}/metrics"))
        .call()
        .map_err(|e| format!("/metrics: {e}"))?
        .into_string()
        .map_err(|e| format!("/metrics: {e}"))?;
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map(|v| v as u64)
        .ok_or_else(|| format!("no {name} in /metrics"))
}

/// Sends one streamed chat request with the grammar and reads it to the end.
fn send(base: &str, messages: &Value, max_tokens: usize) -> Result<Turn, String> {
    let body = json!({
        "messages": messages,
        "grammar": GRAMMAR,
        "temperature": 0.0,
        "max_tokens": max_tokens,
        "stream": true,
        "stream_options": {"include_usage": true},
        "cache_prompt": true,
    });
    let start = Instant::now();
    let resp = ureq::post(&format!("{base}/v1/chat/completions"))
        .set("Content-Type", "application/json")
        .timeout(Duration::from_secs(600))
        .send_string(&body.to_string())
        .map_err(|e| match e {
            ureq::Error::Status(code, r) => {
                format!("{code}: {}", r.into_string().unwrap_or_default())
            }
            e => format!("chat request failed: {e}"),
        })?;
    let mut t = Turn {
        messages: messages.clone(),
        prompt_tokens: 0,
        computed: 0,
        cached: 0,
        warmed_before: 0,
        ttft_ms: f64::NAN,
        prompt_ms: f64::NAN,
        completion_tokens: 0,
        reasoning: String::new(),
        content: String::new(),
        new: 0,
        ideal: 0,
        tokenized: 0,
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
        if !chunk["error"].is_null() {
            return Err(format!("the stream carried an error: {}", chunk["error"]));
        }
        let delta = &chunk["choices"][0]["delta"];
        for (key, into) in [
            ("reasoning_content", &mut t.reasoning),
            ("content", &mut t.content),
        ] {
            if let Some(s) = delta[key].as_str().filter(|s| !s.is_empty()) {
                if t.ttft_ms.is_nan() {
                    t.ttft_ms = start.elapsed().as_secs_f64() * 1e3;
                }
                into.push_str(s);
            }
        }
        let get = |v: &Value| v.as_u64();
        if let Some(n) = get(&chunk["usage"]["prompt_tokens"]) {
            t.prompt_tokens = n;
        }
        if let Some(n) = get(&chunk["usage"]["completion_tokens"]) {
            t.completion_tokens = n;
        }
        if let Some(n) = get(&chunk["timings"]["prompt_n"]) {
            t.computed = n;
        }
        if let Some(n) = get(&chunk["timings"]["cache_n"]) {
            t.cached = n;
        }
        if let Some(ms) = chunk["timings"]["prompt_ms"].as_f64() {
            t.prompt_ms = ms;
        }
    }
    if t.ttft_ms.is_nan() {
        return Err("the stream carried no token".into());
    }
    Ok(t)
}

/// The server's tokens of its own rendering of `messages` with the generation prompt, and the
/// rendered text.
fn prompt_tokens(base: &str, messages: &Value) -> Result<(String, Vec<u64>), String> {
    let post = |path: &str, body: Value| -> Result<Value, String> {
        let resp = ureq::post(&format!("{base}{path}"))
            .set("Content-Type", "application/json")
            .send_string(&body.to_string())
            .map_err(|e| format!("{path}: {e}"))?;
        serde_json::from_reader(resp.into_reader()).map_err(|e| format!("{path}: {e}"))
    };
    let tokenize = |text: &str| -> Result<Vec<u64>, String> {
        let v = post("/tokenize", json!({ "content": text }))?;
        v["tokens"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_u64).collect())
            .ok_or_else(|| format!("/tokenize answered {v}"))
    };
    let body = json!({"messages": messages, "add_generation_prompt": true});
    let v = post("/apply-template", body)?;
    let text = v["prompt"]
        .as_str()
        .ok_or_else(|| format!("/apply-template answered {v}"))?
        .to_string();
    let tokens = tokenize(&text)?;
    Ok((text, tokens))
}

/// Fills in each turn's new tokens, ideal and tokenized prompt (see the module docs).
fn count_ideal(base: &str, turns: &mut [Turn]) -> Result<(), String> {
    let mut previous: Option<Vec<u64>> = None;
    for t in turns.iter_mut() {
        let (text, tokens) = prompt_tokens(base, &t.messages)?;
        // The new message starts at the last user header; a special token splits the text
        // cleanly, so the tokens before it are those of the text before it.
        let header = text
            .rfind("<|im_start|>user")
            .ok_or("no user message in the rendered prompt")?;
        let before = bench_server::count_tokens(base, &text[..header])? as u64;
        let n = tokens.len() as u64;
        t.tokenized = n;
        t.new = n.saturating_sub(before);
        t.ideal = match &previous {
            Some(p) => n - p.iter().zip(&tokens).take_while(|(a, b)| a == b).count() as u64,
            None => n,
        };
        previous = Some(tokens);
    }
    Ok(())
}

/// One configuration's report over its rounds: per-turn figures of the first round with the
/// median times over all of them, and the totals of every round.
fn summary(rounds: &[Run]) -> Value {
    let Some(first) = rounds.first() else {
        return Value::Null;
    };
    let turns = &first.turns;
    let per_turn = |f: &dyn Fn(&Turn) -> Value| Value::Array(turns.iter().map(f).collect());
    let median_turn = |i: usize, f: &dyn Fn(&Turn) -> f64| {
        let v: Vec<f64> = rounds
            .iter()
            .filter_map(|r| r.turns.get(i))
            .map(f)
            .collect();
        round1(percentile(&v, 50.0))
    };
    let totals: Vec<Value> = rounds.iter().map(totals).collect();
    let steady: Vec<f64> = rounds
        .iter()
        .map(|r| {
            let v: Vec<f64> = r.turns.iter().skip(1).map(|t| t.ttft_ms).collect();
            percentile(&v, 50.0)
        })
        .collect();
    json!({
        "prompt_tokens": per_turn(&|t| json!(t.prompt_tokens)),
        "tokenized_prompt_tokens": per_turn(&|t| json!(t.tokenized)),
        "computed": per_turn(&|t| json!(t.computed)),
        "cached": per_turn(&|t| json!(t.cached)),
        "warmed_before": per_turn(&|t| json!(t.warmed_before)),
        "new": per_turn(&|t| json!(t.new)),
        "ideal": per_turn(&|t| json!(t.ideal)),
        "completion_tokens": per_turn(&|t| json!(t.completion_tokens)),
        "reasoning_split": per_turn(&|t| json!(split(t))),
        "ttft_ms_median": (0..turns.len()).map(|i| median_turn(i, &|t| t.ttft_ms)).collect::<Vec<_>>(),
        "prompt_ms_median": (0..turns.len()).map(|i| median_turn(i, &|t| t.prompt_ms)).collect::<Vec<_>>(),
        "ttft_ms_median_turns_2_on": round1(percentile(&steady, 50.0)),
        "rounds": totals,
    })
}

/// Whether the server split the reply: reasoning apart, no thinking tag left in the content.
fn split(t: &Turn) -> bool {
    !t.reasoning.trim().is_empty()
        && !t.content.contains("<think>")
        && !t.content.contains("</think>")
}

/// One round's totals over turns 2 to N, the counts the goal is stated in.
fn totals(r: &Run) -> Value {
    let later = &r.turns[1.min(r.turns.len())..];
    let computed = sum(later, |t| t.computed);
    let warmed = sum(later, |t| t.warmed_before);
    let ideal = sum(later, |t| t.ideal);
    let over: Vec<u64> = later
        .iter()
        .filter(|t| t.computed + t.warmed_before > t.ideal)
        .map(|t| t.computed + t.warmed_before - t.ideal)
        .collect();
    let steady: Vec<f64> = later.iter().map(|t| t.ttft_ms).collect();
    json!({
        "computed_turns_2_on": computed,
        "warmed_turns_2_on": warmed,
        "warmed_after_last": r.warmed_after,
        "computed_and_warmed_turns_2_on": computed + warmed,
        "new_turns_2_on": sum(later, |t| t.new),
        "ideal_turns_2_on": ideal,
        "whole_history_turns_2_on": sum(later, |t| t.prompt_tokens),
        "turns_over_ideal": over.len(),
        "tokens_over_ideal": over.iter().sum::<u64>(),
        "turns_with_reasoning_split": r.turns.iter().filter(|t| split(t)).count(),
        "turn_1_computed": r.turns.first().map(|t| t.computed),
        "ttft_ms_median_turns_2_on": round1(percentile(&steady, 50.0)),
        "prompt_ms_turns_2_on": round1(later.iter().map(|t| t.prompt_ms).sum::<f64>()),
    })
}

/// `x` to 0.1; NaN stays NaN (JSON `null`).
fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

/// The per-turn table on stderr: the first round's counts, the median time to first token over
/// the rounds.
fn print_table(configs: &[Config], runs: &[Vec<Run>]) {
    let Some(base) = runs.iter().find_map(|r| r.first()) else {
        return;
    };
    eprintln!(
        "\nper turn: whole history (prompt tokens), new, ideal (last reply + new); then per \
         configuration: computed+warmed, ttft ms (median of {} rounds)",
        runs.first().map_or(0, Vec::len)
    );
    let mut head = format!("{:>4} {:>6} {:>4} {:>5}", "turn", "whole", "new", "ideal");
    for c in configs {
        head.push_str(&format!(" | {:<34}", c.label));
    }
    eprintln!("{head}");
    for i in 0..base.turns.len() {
        let t = &base.turns[i];
        let mut line = format!(
            "{:>4} {:>6} {:>4} {:>5}",
            i + 1,
            t.prompt_tokens,
            t.new,
            t.ideal
        );
        for rounds in runs {
            let Some(r) = rounds.first().and_then(|r| r.turns.get(i)) else {
                continue;
            };
            let v: Vec<f64> = rounds
                .iter()
                .filter_map(|r| r.turns.get(i))
                .map(|t| t.ttft_ms)
                .collect();
            line.push_str(&format!(
                " | {:>5}+{:<4} (ideal {:>4}) {:>9.1}",
                r.computed,
                r.warmed_before,
                r.ideal,
                percentile(&v, 50.0)
            ));
        }
        eprintln!("{line}");
    }
    eprintln!();
}
