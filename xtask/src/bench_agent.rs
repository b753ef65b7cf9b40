//! `cargo xtask bench-server --workload agent`: one agent conversation with tool calls, played
//! against our server and llama.cpp's `llama-server` in turn, with a restart in the middle.
//!
//! The conversation: a system prompt of about `--system-tokens` tokens (default 3000: four tool
//! definitions, rendered by the chat template, and project notes), a first user message, then
//! `--turns` (default 20) requests. Every request sends the `tools`, `tool_choice: "required"`,
//! `temperature: 0` and `max_tokens` `--gen-tokens` (default 64), streamed. The reply's tool call
//! is sent back as the assistant message, followed by a `tool` message of 40 to 80 tokens of
//! generated text; a reply without a tool call is sent back as text, followed by the same text
//! as a user message (and counted). After turn `--restart-after` (default 10) the server is
//! stopped (SIGTERM) and started again on the same cache directory; llama-server keeps nothing
//! across a restart, ours keeps its prompt cache on disk.
//!
//! Both servers get the same command line (`-t`, `-c --ctx` (default 8192), `-np 1`, `--jinja`,
//! `--chat-template-file`) and, by default, the same chat template, written by this module: the
//! model's ChatML turns plus Hermes-style `<tool_call>` tool calls and a tool list in the system
//! turn (SmolLM2's own template has no tools; `--chat-template-file PATH` uses another). The
//! texts come from a fixed seed and are generated once, so both servers get the same requests
//! as long as their replies agree.
//!
//! Per turn and server: prompt tokens (`usage.prompt_tokens`), prompt tokens computed
//! (`timings.prompt_n`) and taken from the cache (`timings.cache_n`), the new tokens (the prompt
//! less the previous turn's prompt and reply: what no cache can spare a server from computing)
//! and the time to first token (see [`Reply::ttft_ms`]). Printed: a per-turn table on stderr,
//! a JSON report on stdout with, when both servers ran, the `ratios` the goals are stated in.
//! Each server's requests are kept in `--dir`, as `<server>-agent/requests.jsonl` (one line per
//! turn), beside its logs.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::bench_args::{Agent, Options};
use crate::bench_server::{self, count_tokens, percentile, Kind, Server, Words};

/// The chat template both servers use unless `--chat-template-file` names another: ChatML, a
/// tool list in the system turn, calls as `<tool_call>` JSON, results as `<tool_response>`.
const TEMPLATE: &str = r#"{%- if tools %}
{{- '<|im_start|>system\n' }}
{%- if messages[0].role == 'system' %}{{- messages[0].content + '\n\n' }}{%- endif %}
{{- '## Functions\n\nTo call a function, write a JSON object with its name and arguments between <tool_call> and </tool_call>. The functions, as JSON schemas:\n<tools>' }}
{%- for tool in tools %}{{- '\n' + (tool | tojson) }}{%- endfor %}
{{- '\n</tools>\n\nExample:\n<tool_call>\n{"name": "function name", "arguments": {"argument": "value"}}\n</tool_call><|im_end|>\n' }}
{%- elif messages[0].role == 'system' %}
{{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'system' %}
{%- elif message.role == 'assistant' %}
{{- '<|im_start|>assistant' }}
{%- if message.content %}{{- '\n' + message.content }}{%- endif %}
{%- if message.tool_calls %}{%- for call in message.tool_calls %}
{%- if call.function is defined %}{%- set f = call.function %}{%- else %}{%- set f = call %}{%- endif %}
{{- '\n<tool_call>\n{"name": "' + f.name + '", "arguments": ' }}
{%- if f.arguments is string %}{{- f.arguments }}{%- else %}{{- f.arguments | tojson }}{%- endif %}
{{- '}\n</tool_call>' }}
{%- endfor %}{%- endif %}
{{- '<|im_end|>\n' }}
{%- elif message.role == 'tool' %}
{{- '<|im_start|>user\n<tool_response>\n' + message.content + '\n</tool_response><|im_end|>\n' }}
{%- else %}
{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}
"#;

/// Tokens the built-in template adds to the system turn around the tool list (about 60), for a
/// server that cannot render a chat without answering it (no `/apply-template`).
const TEMPLATE_OVERHEAD: usize = 60;

/// Entry point of `cargo xtask bench-server --workload agent`.
pub(crate) fn bench_agent(o: &Options, a: &Agent) -> Result<(), String> {
    let servers = bench_server::servers(o)?;
    std::fs::create_dir_all(&o.dir).map_err(|e| format!("{}: {e}", o.dir.display()))?;
    let template = match &a.template {
        Some(p) => p.clone(),
        None => {
            let p = o.dir.join("agent-chat-template.jinja");
            std::fs::write(&p, TEMPLATE).map_err(|e| format!("{}: {e}", p.display()))?;
            p
        }
    };
    let mut script = None;
    let mut runs = Vec::new();
    for (kind, bin) in &servers {
        let turns = play(*kind, bin, o, a, &template, &mut script)?;
        runs.push((*kind, turns));
    }
    print_table(&runs, a.restart_after);
    let mut report = serde_json::Map::new();
    report.insert(
        "settings".into(),
        json!({
            "turns": o.turns, "restart_after": a.restart_after, "system_tokens": o.system_tokens,
            "max_tokens": o.gen_tokens, "ctx": a.ctx, "chat_template": template.display().to_string(),
        }),
    );
    for (kind, turns) in &runs {
        report.insert(kind.name().into(), summary(turns, a.restart_after));
    }
    let find = |k: Kind| runs.iter().find(|r| r.0 == k).map(|r| &r.1);
    if let (Some(ours), Some(llama)) = (find(Kind::Ours), find(Kind::Llama)) {
        report.insert("ratios".into(), ratios(ours, llama, a.restart_after));
    }
    let out = serde_json::to_string_pretty(&Value::Object(report)).unwrap_or_default();
    let _ = writeln!(std::io::stdout(), "{out}");
    Ok(())
}

/// The texts of the conversation, generated once (with the first server's tokenizer) and sent
/// to every server.
struct Script {
    system: String,
    tools: Value,
    user: String,
    /// The tool result sent after each turn's reply.
    results: Vec<String>,
}

/// Four coding-agent tools as OpenAI function definitions.
fn tools() -> Value {
    let function = |name: &str, description: &str, parameters: Value| {
        json!({"type": "function", "function": {
            "name": name, "description": description, "parameters": parameters,
        }})
    };
    json!([
        function(
            "read_file",
            "Read a file of the repository and return its lines, numbered. Use it before \
             changing a file, and to follow a function to its definition.",
            json!({"type": "object", "properties": {
                "path": {"type": "string", "description": "Path from the repository root."},
                "start_line": {"type": "integer", "description": "First line to return."},
                "end_line": {"type": "integer", "description": "Last line to return."},
            }, "required": ["path"]}),
        ),
        function(
            "search",
            "Search the repository for a regular expression and return the matching lines \
             with their paths and line numbers, at most fifty.",
            json!({"type": "object", "properties": {
                "query": {"type": "string", "description": "The regular expression."},
                "path": {"type": "string", "description": "A folder to search in."},
            }, "required": ["query"]}),
        ),
        function(
            "run_tests",
            "Run the test suite, or the tests whose names contain a filter, and return the \
             summary and the output of the failing tests.",
            json!({"type": "object", "properties": {
                "filter": {"type": "string", "description": "Part of the test names to run."},
                "timeout_s": {"type": "integer", "description": "Give up after this long."},
            }}),
        ),
        function(
            "write_file",
            "Replace the whole content of a file of the repository, creating it if needed. \
             Read the file first and write it back complete.",
            json!({"type": "object", "properties": {
                "path": {"type": "string", "description": "Path from the repository root."},
                "content": {"type": "string", "description": "The new content."},
            }, "required": ["path", "content"]}),
        ),
    ])
}

impl Script {
    /// The conversation's texts: the notes sized so that the rendered system turn (the
    /// instructions, the tool list, the notes) comes to about `--system-tokens` as `base`
    /// renders (`/apply-template`) and counts them.
    fn new(base: &str, o: &Options) -> Result<Script, String> {
        let mut words = Words(0xA6E7_5C21_3B9D_04F1);
        let tools = tools();
        let intro = "You are a coding agent working in a Rust repository. Answer every message \
                     with one function call: read and search before you change anything, and run \
                     the tests after every change.\n\nProject notes:\n";
        let framed = json!({
            "messages": [{"role": "system", "content": intro}],
            "tools": tools,
            "add_generation_prompt": false,
        });
        let frame = match ureq::post(&format!("{base}/apply-template"))
            .set("Content-Type", "application/json")
            .send_string(&framed.to_string())
            .ok()
            .and_then(|r| serde_json::from_reader::<_, Value>(r.into_reader()).ok())
            .and_then(|v| v["prompt"].as_str().map(str::to_string))
        {
            Some(prompt) => count_tokens(base, &prompt)?,
            None => {
                count_tokens(base, &tools.to_string())?
                    + TEMPLATE_OVERHEAD
                    + count_tokens(base, intro)?
            }
        };
        let budget = o.system_tokens.saturating_sub(frame);
        let system = format!("{intro}{}", words.text_of_tokens(base, budget.max(1))?);
        let results = (0..o.turns)
            .map(|_| {
                let n = 35 + (words.next() % 35) as usize;
                words.text(n)
            })
            .collect();
        Ok(Script {
            system,
            tools,
            user: "The prompt cache is not written to disk when the server stops. Find where it \
                   is flushed, fix it, and run the tests."
                .into(),
            results,
        })
    }
}

/// One tool call of a reply, put together from its streamed pieces.
#[derive(Default)]
struct Call {
    id: String,
    name: String,
    arguments: String,
}

/// What one turn's streamed reply gave.
struct Reply {
    /// Time to first token: from just before the request is sent to the arrival of the first
    /// stream chunk whose choice carries a `delta`. Both servers send that chunk (the one with
    /// `role: assistant`) as soon as the first token is sampled, whatever the token, so this
    /// covers queueing, prompt processing (or loading from a cache) and one decoding step.
    ttft_ms: f64,
    /// From the request to the first chunk carrying content or tool-call data (later than
    /// `ttft_ms` when a server holds back the opening of a tool call).
    data_ms: f64,
    /// The whole reply, from the request to the end of the stream.
    total_ms: f64,
    /// `usage.prompt_tokens`.
    prompt_tokens: u64,
    /// `timings.prompt_n`: prompt tokens computed.
    computed: u64,
    /// `timings.cache_n`: prompt tokens taken from a cache.
    cached: u64,
    /// `timings.prompt_ms`, as the server measured it.
    prompt_ms: f64,
    /// `usage.completion_tokens`.
    completion_tokens: u64,
    content: String,
    calls: Vec<Call>,
    finish: String,
}

/// Sends one streamed chat request and reads the reply to the end.
fn send(base: &str, body: &Value) -> Result<Reply, String> {
    let start = Instant::now();
    let resp = ureq::post(&format!("{base}/v1/chat/completions"))
        .set("Content-Type", "application/json")
        .timeout(Duration::from_secs(600))
        .send_string(&body.to_string())
        .map_err(|e| match e {
            ureq::Error::Status(code, r) => {
                format!(
                    "chat request: {code}: {}",
                    r.into_string().unwrap_or_default()
                )
            }
            e => format!("chat request failed: {e}"),
        })?;
    let mut r = Reply {
        ttft_ms: f64::NAN,
        data_ms: f64::NAN,
        total_ms: f64::NAN,
        prompt_tokens: 0,
        computed: 0,
        cached: 0,
        prompt_ms: f64::NAN,
        completion_tokens: 0,
        content: String::new(),
        calls: Vec::new(),
        finish: String::new(),
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
        let ms = start.elapsed().as_secs_f64() * 1e3;
        let choice = &chunk["choices"][0];
        let delta = &choice["delta"];
        if delta.is_object() && r.ttft_ms.is_nan() {
            r.ttft_ms = ms;
        }
        if let Some(text) = delta["content"].as_str() {
            if !text.is_empty() && r.data_ms.is_nan() {
                r.data_ms = ms;
            }
            r.content.push_str(text);
        }
        for piece in delta["tool_calls"].as_array().into_iter().flatten() {
            if r.data_ms.is_nan() {
                r.data_ms = ms;
            }
            let i = piece["index"].as_u64().unwrap_or(0) as usize;
            if r.calls.len() <= i {
                r.calls.resize_with(i + 1, Call::default);
            }
            let call = &mut r.calls[i];
            if let Some(id) = piece["id"].as_str() {
                call.id = id.to_string();
            }
            call.name
                .push_str(piece["function"]["name"].as_str().unwrap_or(""));
            call.arguments
                .push_str(piece["function"]["arguments"].as_str().unwrap_or(""));
        }
        if let Some(f) = choice["finish_reason"].as_str() {
            r.finish = f.to_string();
        }
        let number = |v: &Value| v.as_u64();
        if let Some(n) = number(&chunk["usage"]["prompt_tokens"]) {
            r.prompt_tokens = n;
        }
        if let Some(n) = number(&chunk["usage"]["completion_tokens"]) {
            r.completion_tokens = n;
        }
        if let Some(n) = number(&chunk["timings"]["prompt_n"]) {
            r.computed = n;
        }
        if let Some(n) = number(&chunk["timings"]["cache_n"]) {
            r.cached = n;
        }
        if let Some(t) = chunk["timings"]["prompt_ms"].as_f64() {
            r.prompt_ms = t;
        }
    }
    r.total_ms = start.elapsed().as_secs_f64() * 1e3;
    if r.ttft_ms.is_nan() {
        return Err("the stream carried no token".into());
    }
    Ok(r)
}

/// One turn's figures, as kept for the report.
struct TurnFigures {
    reply: Reply,
    /// The call's name, when the reply was a tool call.
    tool: Option<String>,
    /// The call's arguments were not JSON (cut by `max_tokens`): `{}` was sent back instead.
    invalid_arguments: bool,
}

/// Plays the conversation against one server, restarting it after turn `restart_after`.
fn play(
    kind: Kind,
    bin: &Path,
    o: &Options,
    a: &Agent,
    template: &Path,
    script: &mut Option<Script>,
) -> Result<Vec<TurnFigures>, String> {
    let dir = o.dir.join(format!("{}-agent", kind.name()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let cache = dir.join("cache");
    let extra: Vec<String> = vec![
        "--jinja".into(),
        "--chat-template-file".into(),
        template.display().to_string(),
    ];
    let start = |log: &str| Server::start(kind, bin, o, 1, a.ctx, &cache, &dir.join(log), &extra);
    let mut server = start("server.log")?;
    if script.is_none() {
        *script = Some(Script::new(&server.base, o)?);
    }
    let Some(s) = script.as_ref() else {
        return Err("no script".into());
    };
    let mut messages = vec![
        json!({"role": "system", "content": s.system}),
        json!({"role": "user", "content": s.user}),
    ];
    // Every request, one JSON line per turn, to replay a turn by hand.
    let requests = dir.join("requests.jsonl");
    let mut saved =
        std::fs::File::create(&requests).map_err(|e| format!("{}: {e}", requests.display()))?;
    let mut figures = Vec::new();
    for turn in 1..=o.turns {
        if turn == a.restart_after + 1 {
            server.stop()?;
            server = start("server.2.log")?;
        }
        let body = json!({
            "messages": messages,
            "tools": s.tools,
            "tool_choice": "required",
            "parallel_tool_calls": false,
            "temperature": 0.0,
            "max_tokens": o.gen_tokens,
            "stream": true,
            "stream_options": {"include_usage": true},
            "cache_prompt": true,
        });
        writeln!(saved, "{body}").map_err(|e| format!("{}: {e}", requests.display()))?;
        let reply =
            send(&server.base, &body).map_err(|e| format!("{} turn {turn}: {e}", kind.name()))?;
        let result = &s.results[turn - 1];
        let mut invalid_arguments = false;
        let tool = match reply.calls.first() {
            Some(call) => {
                let arguments = if serde_json::from_str::<Value>(&call.arguments).is_ok() {
                    call.arguments.clone()
                } else {
                    invalid_arguments = true;
                    "{}".to_string()
                };
                let id = if call.id.is_empty() {
                    format!("call_{turn}")
                } else {
                    call.id.clone()
                };
                messages.push(
                    json!({"role": "assistant", "content": reply.content, "tool_calls": [{
                        "id": id, "type": "function",
                        "function": {"name": call.name, "arguments": arguments},
                    }]}),
                );
                messages.push(json!({"role": "tool", "tool_call_id": id, "content": result}));
                Some(call.name.clone())
            }
            None => {
                messages.push(json!({"role": "assistant", "content": reply.content}));
                messages.push(json!({"role": "user", "content": result}));
                None
            }
        };
        eprintln!(
            "{} turn {turn:>2}: prompt {:>5}, computed {:>5}, cached {:>5}, ttft {:>8.1} ms, \
             server prompt {:>8.1} ms, {} generated, {}",
            kind.name(),
            reply.prompt_tokens,
            reply.computed,
            reply.cached,
            reply.ttft_ms,
            reply.prompt_ms,
            reply.completion_tokens,
            match &tool {
                Some(name) => format!("tool call {name}"),
                None => format!("no tool call ({})", reply.finish),
            }
        );
        figures.push(TurnFigures {
            reply,
            tool,
            invalid_arguments,
        });
    }
    server.stop()?;
    Ok(figures)
}

/// Sum of the computed prompt tokens of turns 2 to N.
fn computed_after_first(turns: &[TurnFigures]) -> u64 {
    turns.iter().skip(1).map(|t| t.reply.computed).sum()
}

/// Turn `i`'s (0-based) tokens that no earlier request sent or generated: its prompt less the
/// previous turn's prompt and reply (the reply's last token was sampled, never evaluated). No
/// cache can compute fewer: the longest prefix it could hold is the previous turn's sequence.
/// Turn 1: its whole prompt.
fn new_tokens(turns: &[TurnFigures], i: usize) -> u64 {
    let now = turns[i].reply.prompt_tokens;
    match i.checked_sub(1).map(|j| &turns[j].reply) {
        Some(prev) => {
            now.saturating_sub((prev.prompt_tokens + prev.completion_tokens).saturating_sub(1))
        }
        None => now,
    }
}

/// Sum of [`new_tokens`] over turns 2 to N: the fewest prompt tokens a perfect cache computes.
fn floor_after_first(turns: &[TurnFigures]) -> u64 {
    (1..turns.len()).map(|i| new_tokens(turns, i)).sum()
}

/// Median time to first token over turns 2 to N, the turn after the restart aside.
fn steady_ttft(turns: &[TurnFigures], restart_after: usize) -> f64 {
    let v: Vec<f64> = turns
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != 0 && *i != restart_after)
        .map(|(_, t)| t.reply.ttft_ms)
        .collect();
    percentile(&v, 50.0)
}

/// One server's report: per-turn arrays and the sums the goals use.
fn summary(turns: &[TurnFigures], restart_after: usize) -> Value {
    let arr = |f: &dyn Fn(&TurnFigures) -> Value| Value::Array(turns.iter().map(f).collect());
    let restart = turns.get(restart_after);
    json!({
        "prompt_tokens": arr(&|t| json!(t.reply.prompt_tokens)),
        "prompt_computed": arr(&|t| json!(t.reply.computed)),
        "prompt_cached": arr(&|t| json!(t.reply.cached)),
        "ttft_ms": arr(&|t| json!(round(t.reply.ttft_ms))),
        "first_data_ms": arr(&|t| json!(round(t.reply.data_ms))),
        "server_prompt_ms": arr(&|t| json!(round(t.reply.prompt_ms))),
        "reply_ms": arr(&|t| json!(round(t.reply.total_ms))),
        "completion_tokens": arr(&|t| json!(t.reply.completion_tokens)),
        "tool_calls": arr(&|t| json!(t.tool)),
        "turns_without_tool_call": turns.iter().filter(|t| t.tool.is_none()).count(),
        "invalid_arguments": turns.iter().filter(|t| t.invalid_arguments).count(),
        "computed_turn_1": turns.first().map(|t| t.reply.computed),
        "computed_after_turn_1": computed_after_first(turns),
        "new_tokens": (0..turns.len()).map(|i| new_tokens(turns, i)).collect::<Vec<_>>(),
        "new_tokens_after_turn_1": floor_after_first(turns),
        "restart_turn": restart_after + 1,
        "restart_ttft_ms": restart.map(|t| round(t.reply.ttft_ms)),
        "restart_computed": restart.map(|t| t.reply.computed),
        "ttft_median_ms_steady": round(steady_ttft(turns, restart_after)),
    })
}

/// The goals' ratios between the two servers.
fn ratios(ours: &[TurnFigures], llama: &[TurnFigures], restart_after: usize) -> Value {
    let computed = computed_after_first(ours) as f64 / computed_after_first(llama) as f64;
    let ttft = |t: &[TurnFigures]| t.get(restart_after).map_or(f64::NAN, |t| t.reply.ttft_ms);
    let restart = ttft(llama) / ttft(ours);
    let steady = steady_ttft(llama, restart_after) / steady_ttft(ours, restart_after);
    // The best ratio any cache could reach on our turns: only their new tokens computed.
    let new = floor_after_first(ours) as f64;
    json!({
        "computed_after_turn_1_ours_over_llama": round3(computed),
        "new_tokens_after_turn_1_ours_over_llama_computed": round3(
            new / computed_after_first(llama) as f64
        ),
        "computed_over_new_tokens_ours": round3(computed_after_first(ours) as f64 / new),
        "computed_goal_at_most": 0.2,
        "computed_goal_met": computed <= 0.2,
        "restart_ttft_llama_over_ours": round3(restart),
        "restart_goal_at_least": 30.0,
        "restart_goal_met": restart >= 30.0,
        "steady_ttft_median_llama_over_ours": round3(steady),
    })
}

/// `x` to 0.1 (milliseconds); NaN stays NaN (JSON `null`).
fn round(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

/// `x` to 0.001 (ratios).
fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// The per-turn table, the servers side by side, on stderr.
fn print_table(runs: &[(Kind, Vec<TurnFigures>)], restart_after: usize) {
    const GROUP: usize = 48;
    let mut names = String::from("    ");
    let mut head = String::from("turn");
    for (kind, _) in runs {
        names.push_str(&format!(" | {:<GROUP$}", kind.name()));
        head.push_str(&format!(
            " | {:>6} {:>5} {:>5} {:>6} {:>9} {:<12}",
            "prompt", "new", "comp", "cached", "ttft_ms", "tool call"
        ));
    }
    eprintln!("\n{names}\n{head}");
    let n = runs.iter().map(|r| r.1.len()).max().unwrap_or(0);
    for i in 0..n {
        let mark = if i == restart_after { "*" } else { " " };
        let mut line = format!("{:>3}{mark}", i + 1);
        for (_, turns) in runs {
            let Some(t) = turns.get(i) else { continue };
            line.push_str(&format!(
                " | {:>6} {:>5} {:>5} {:>6} {:>9.1} {:<12}",
                t.reply.prompt_tokens,
                new_tokens(turns, i),
                t.reply.computed,
                t.reply.cached,
                t.reply.ttft_ms,
                t.tool.as_deref().unwrap_or("-")
            ));
        }
        eprintln!("{line}");
    }
    let mut foot = String::from("computed over turns 2..N:");
    for (kind, turns) in runs {
        foot.push_str(&format!(
            " {} {} (new {});",
            kind.name(),
            computed_after_first(turns),
            floor_after_first(turns)
        ));
    }
    eprintln!(
        "{foot} * the turn after the restart; new: tokens no earlier request sent or \
         generated (no cache computes fewer)\n"
    );
}
