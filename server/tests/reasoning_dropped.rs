//! Clients that drop a reply's reasoning from the history they send back (opencode, Open WebUI)
//! find their conversation in the cache up to each new message: after a reply with reasoning,
//! the server evaluates the reply as such a client sends it back (its content only), forked from
//! the conversation as generated, which stays for clients that keep the reasoning. Per API key,
//! like the rest of the cache, and on disk.
//!
//! The tiny model's vocabulary is one token per byte (plus `<|im_start|>` and `<|im_end|>`), so
//! the tokens a text takes are counted from its bytes. A reasoning budget closes the thinking
//! block the prompt opens after a few tokens, so every reply has reasoning and content.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{start_on, TestServer};
use engine::testing::TinyChatModel;
use serde_json::{json, Value};

/// Qwen3's template with the generation prompt of its thinking models (Qwen3-Thinking-2507):
/// the reply starts inside `<think>`; earlier replies are rendered without their reasoning,
/// whether the client sends it or not.
fn qwen3_thinking() -> String {
    let qwen3 = include_str!("../../engine/tests/fixtures/templates/Qwen-Qwen3-0.6B.jinja");
    let prompt = r"{{- '<|im_start|>assistant\n' }}";
    assert!(qwen3.contains(prompt));
    qwen3.replace(prompt, r"{{- '<|im_start|>assistant\n<think>\n' }}")
}

/// A template that renders every reply's `reasoning_content` (a client that keeps it gets it
/// back in the prompt), with the same generation prompt.
const KEEPING: &str = "{% for m in messages %}<|im_start|>{{ m.role }}\n\
    {% if m.reasoning_content %}<think>\n{{ m.reasoning_content }}\n</think>\n\n{% endif %}\
    {{ m.content }}<|im_end|>\n{% endfor %}\
    {% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}";

/// Starts a server on a tiny model with `template` in `dir`, with `extra` options.
async fn start(dir: &Path, template: &str, extra: &[&str]) -> TestServer {
    let model = dir.join("tiny.gguf");
    if !model.exists() {
        TinyChatModel {
            n_ff: 64,
            template: Some(template.to_owned()),
            ..TinyChatModel::default()
        }
        .write(&model)
        .unwrap();
    }
    let mut argv = vec![
        "-t",
        "1",
        "-c",
        "4096",
        "--kv-unified",
        "--metrics",
        "--reasoning-budget",
        "12",
    ];
    argv.extend_from_slice(extra);
    start_on(&model, &dir.join("cache"), &argv).await
}

/// Tokens `text` takes in the tiny model's vocabulary.
fn n_tokens(text: &str) -> u64 {
    let start = text.matches("<|im_start|>").count() * ("<|im_start|>".len() - 1);
    let end = text.matches("<|im_end|>").count() * ("<|im_end|>".len() - 1);
    (text.len() - start - end) as u64
}

/// What a new turn adds after the last reply's message: the user's message and the
/// generation prompt (the header's `<|im_start|>` comes with the reply's message).
fn new_part(question: &str) -> String {
    format!("user\n{question}<|im_end|>\n<|im_start|>assistant\n<think>\n")
}

/// One answer: its figures and the reply split as the server split it.
#[derive(Debug)]
struct Answer {
    prompt_tokens: u64,
    cache_n: u64,
    prompt_n: u64,
    reasoning: String,
    content: String,
}

/// Asks `messages` with API key `key`, whole or streamed as opencode streams.
async fn ask(srv: &TestServer, key: Option<&str>, messages: &[Value], stream: bool) -> Answer {
    let body = json!({"messages": messages, "max_tokens": 60, "temperature": 0,
                      "ignore_eos": true, "stream": stream});
    let mut req = srv
        .client
        .post(format!("{}/v1/chat/completions", srv.url))
        .json(&body);
    if let Some(k) = key {
        req = req.bearer_auth(k);
    }
    let resp = req.send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let text = resp.text().await.unwrap();
    let (mut reasoning, mut content, mut timings) = (String::new(), String::new(), Value::Null);
    if stream {
        for data in text.split("\n\n").filter_map(|e| e.strip_prefix("data: ")) {
            let Ok(chunk) = serde_json::from_str::<Value>(data) else {
                continue;
            };
            let delta = &chunk["choices"][0]["delta"];
            reasoning.push_str(delta["reasoning_content"].as_str().unwrap_or(""));
            content.push_str(delta["content"].as_str().unwrap_or(""));
            if chunk.get("timings").is_some() {
                timings = chunk["timings"].clone();
            }
        }
    } else {
        let v: Value = serde_json::from_str(&text).unwrap();
        let m = &v["choices"][0]["message"];
        reasoning = m["reasoning_content"].as_str().unwrap_or("").to_owned();
        content = m["content"].as_str().unwrap_or("").to_owned();
        timings = v["timings"].clone();
    }
    let get = |k: &str| {
        timings[k]
            .as_u64()
            .unwrap_or_else(|| panic!("{k} in {text}"))
    };
    let (cache_n, prompt_n) = (get("cache_n"), get("prompt_n"));
    assert!(!reasoning.is_empty() && !content.is_empty(), "{text}");
    Answer {
        prompt_tokens: cache_n + prompt_n,
        cache_n,
        prompt_n,
        reasoning,
        content,
    }
}

/// A counter of `/metrics`, asked with API key `key`.
async fn metric(srv: &TestServer, key: Option<&str>, name: &str) -> u64 {
    let mut req = srv.client.get(format!("{}/metrics", srv.url));
    if let Some(k) = key {
        req = req.bearer_auth(k);
    }
    let text = req.send().await.unwrap().text().await.unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .unwrap_or_else(|| panic!("{name} in {text}")) as u64
}

const WARMED: &str = "llamahdd:cache_replies_warmed_total";
const WARM_TOKENS: &str = "llamahdd:cache_reply_warm_tokens_total";

/// Waits until the server has finished `n` warm-ups (a person reads the reply and types the
/// next message meanwhile; an agent may be faster, and then computes the reply itself).
async fn warmed(srv: &TestServer, key: Option<&str>, n: u64) {
    let until = Instant::now() + Duration::from_secs(20);
    while metric(srv, key, WARMED).await < n {
        assert!(Instant::now() < until, "warm-up {n} never finished");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// How a client sends a reply back in the history.
#[derive(Clone, Copy, Debug)]
enum Client {
    /// Content only (opencode, Open WebUI by default).
    Drops,
    /// `reasoning_content` kept beside the content.
    Keeps,
    /// Open WebUI's `think_tags` replay: the reasoning inlined before the content.
    ThinkTags,
}

impl Client {
    fn message(self, a: &Answer) -> Value {
        match self {
            Client::Drops => json!({"role": "assistant", "content": a.content}),
            Client::Keeps => json!({"role": "assistant", "content": a.content,
                                    "reasoning_content": a.reasoning}),
            Client::ThinkTags => json!({"role": "assistant",
                "content": format!("<think>{}</think>\n{}", a.reasoning, a.content)}),
        }
    }
}

/// A conversation of `turns` questions after `system`; each answer's figures with its question.
/// `warm`: the server warms replies, and the client waits for it before its next message.
async fn converse(
    srv: &TestServer,
    key: Option<&str>,
    client: Client,
    system: &str,
    turns: usize,
    stream: bool,
    warm: bool,
) -> Vec<(String, Answer)> {
    let mut messages = vec![json!({"role": "system", "content": system})];
    let mut out = Vec::new();
    for turn in 0..turns {
        let question = format!("question {turn}: and what comes after that?");
        messages.push(json!({"role": "user", "content": question}));
        let before = metric(srv, key, WARMED).await;
        let a = ask(srv, key, &messages, stream).await;
        if warm {
            warmed(srv, key, before + 1).await;
        }
        messages.push(client.message(&a));
        out.push((question, a));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_drops_reasoning_computes_only_its_new_message_each_turn() {
    let dir = tempfile::tempdir().unwrap();
    let system = "You are a helpful assistant. abcdefgh abcdefgh";
    let srv = start(dir.path(), &qwen3_thinking(), &[]).await;
    let mut warm_tokens = Vec::new();
    let mut messages = vec![json!({"role": "system", "content": system})];
    let mut with = Vec::new();
    for turn in 0..10 {
        let question = format!("question {turn}: and what comes after that?");
        messages.push(json!({"role": "user", "content": question}));
        let before = metric(&srv, None, WARM_TOKENS).await;
        let a = ask(&srv, None, &messages, false).await;
        warmed(&srv, None, turn as u64 + 1).await;
        warm_tokens.push(metric(&srv, None, WARM_TOKENS).await - before);
        messages.push(Client::Drops.message(&a));
        with.push((question, a));
    }
    srv.stop().await;
    let dir = tempfile::tempdir().unwrap();
    let srv = start(dir.path(), &qwen3_thinking(), &["--no-warm-replies"]).await;
    let without = converse(&srv, None, Client::Drops, system, 10, false, false).await;
    assert_eq!(metric(&srv, None, WARMED).await, 0);
    srv.stop().await;

    eprintln!("turn: prompt tokens, computed with the warm-up (+ warmed after), without");
    for k in 0..10 {
        let (w, o) = (&with[k].1, &without[k].1);
        eprintln!(
            "{k}: {} / {} (+{}) / {} of {}",
            w.prompt_tokens, w.prompt_n, warm_tokens[k], o.prompt_n, o.prompt_tokens
        );
        // The warm-up computed the reply's own tokens only: its content, its end and the next
        // header's start (the header before it is the prompt's).
        let reply = format!("{}<|im_end|>\n<|im_start|>", w.content);
        assert_eq!(warm_tokens[k], n_tokens(&reply), "turn {k}: {w:?}");
        if k == 0 {
            continue;
        }
        let new = n_tokens(&new_part(&with[k].0));
        assert_eq!(w.prompt_n, new, "turn {k}: {w:?}");
        assert_eq!(w.cache_n, w.prompt_tokens - new);
        // Without it, the last reply is computed again with the new message (give or take
        // the bytes the reply happens to share with the `<think>\n` it replaced).
        let prev = &without[k - 1].1;
        let again = n_tokens(&format!("{}<|im_end|>\n<|im_start|>", prev.content))
            + n_tokens(&new_part(&without[k].0));
        assert!(
            o.prompt_n <= again && o.prompt_n + 8 >= again,
            "turn {k}: {o:?}, expected about {again}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opencode_and_open_webui_histories_hit_alike() {
    let dir = tempfile::tempdir().unwrap();
    let srv = start(dir.path(), &qwen3_thinking(), &[]).await;
    // opencode streams and sends content only; Open WebUI sends content only, or replays the
    // reasoning inlined in `<think>` tags; another client keeps `reasoning_content`. Qwen3's
    // template renders all of them alike, without the reasoning.
    let shapes = [
        ("opencode", Client::Drops, true),
        ("open-webui", Client::Drops, false),
        ("open-webui think_tags", Client::ThinkTags, false),
        ("reasoning_content kept", Client::Keeps, false),
    ];
    for (name, client, stream) in shapes {
        let system = format!("You are {name}'s assistant.");
        let turns = converse(&srv, None, client, &system, 4, stream, true).await;
        for (k, (question, a)) in turns.iter().enumerate().skip(1) {
            let new = n_tokens(&new_part(question));
            assert_eq!(a.prompt_n, new, "{name}, turn {k}: {a:?}");
        }
    }
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_conversation_as_generated_stays_for_clients_that_keep_reasoning() {
    // A template that renders the reasoning a client sends back: the warm-up's view is not
    // what a keeping client sends, and the conversation it branches from must stay. Memory is
    // the only tier here (`--no-cache`), so what the warm-up took over would be gone.
    let dir = tempfile::tempdir().unwrap();
    let srv = start(dir.path(), KEEPING, &["--no-cache"]).await;
    let keeps = converse(&srv, None, Client::Keeps, "Keep it.", 4, false, true).await;
    for k in 1..keeps.len() {
        let (prev, a) = (&keeps[k - 1].1, &keeps[k].1);
        assert!(
            a.cache_n >= prev.prompt_tokens,
            "turn {k}: {a:?} after {prev:?}"
        );
    }
    let drops = converse(&srv, None, Client::Drops, "Drop it.", 4, false, true).await;
    for (k, (question, a)) in drops.iter().enumerate().skip(1) {
        assert_eq!(a.prompt_n, n_tokens(&new_part(question)), "turn {k}: {a:?}");
    }
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_api_key_does_not_get_the_hit() {
    let dir = tempfile::tempdir().unwrap();
    let keys = ["--api-key", "alpha", "--api-key", "beta"];
    let srv = start(dir.path(), &qwen3_thinking(), &keys).await;
    let alpha = Some("alpha");
    let turns = converse(&srv, alpha, Client::Drops, "A secret.", 3, false, true).await;
    let mut messages = vec![json!({"role": "system", "content": "A secret."})];
    for (question, a) in &turns {
        messages.push(json!({"role": "user", "content": question}));
        messages.push(Client::Drops.message(a));
    }
    messages.push(json!({"role": "user", "content": "question 3?"}));
    // Another key sending the same conversation finds nothing of it.
    let b = ask(&srv, Some("beta"), &messages, false).await;
    assert_eq!(b.cache_n, 0, "{b:?}");
    // Its owner finds it all, up to the new message.
    messages.pop();
    messages.push(json!({"role": "user", "content": "question 3, again?"}));
    let a = ask(&srv, alpha, &messages, false).await;
    assert_eq!(
        a.prompt_n,
        n_tokens(&new_part("question 3, again?")),
        "{a:?}"
    );
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_warmed_reply_is_found_on_disk_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let srv = start(dir.path(), &qwen3_thinking(), &[]).await;
    let turns = converse(&srv, None, Client::Drops, "Remember me.", 2, false, true).await;
    srv.stop().await;
    let srv = start(dir.path(), &qwen3_thinking(), &[]).await;
    let mut messages = vec![json!({"role": "system", "content": "Remember me."})];
    for (question, a) in &turns {
        messages.push(json!({"role": "user", "content": question}));
        messages.push(Client::Drops.message(a));
    }
    messages.push(json!({"role": "user", "content": "and after a restart?"}));
    let a = ask(&srv, None, &messages, false).await;
    assert_eq!(
        a.prompt_n,
        n_tokens(&new_part("and after a restart?")),
        "{a:?}"
    );
    srv.stop().await;
}
