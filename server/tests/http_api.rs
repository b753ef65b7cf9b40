//! The endpoints on a tiny model: chat and completions, streamed and whole, the native
//! `/completion`, tokenize and detokenize, the template, health, models, props, slots and
//! metrics.

mod common;

use common::Env;
use serde_json::{json, Value};

fn greedy_chat(stream: bool) -> Value {
    json!({
        "model": "tiny",
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": [{"type": "text", "text": "Say something."}]}
        ],
        "max_tokens": 12,
        "temperature": 0,
        "stream": stream,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_streamed_and_whole_give_the_same_text() {
    let env = Env::new();
    let srv = env.start(&[]).await;

    let (status, whole) = srv.post("/v1/chat/completions", &greedy_chat(false)).await;
    assert_eq!(status, 200, "{whole}");
    assert_eq!(whole["object"], "chat.completion");
    let content = whole["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(whole["choices"][0]["message"]["role"], "assistant");
    let usage = &whole["usage"];
    let completion = usage["completion_tokens"].as_u64().unwrap();
    assert!(completion <= 12, "{usage}");
    assert_eq!(
        usage["total_tokens"].as_u64().unwrap(),
        usage["prompt_tokens"].as_u64().unwrap() + completion
    );
    let reason = whole["choices"][0]["finish_reason"].as_str().unwrap();
    assert!(
        (reason == "length") == (completion == 12),
        "finish_reason {reason} after {completion} tokens"
    );

    let (status, ctype, events) = srv
        .post_stream("/v1/chat/completions", &greedy_chat(true))
        .await;
    assert_eq!(status, 200);
    assert!(ctype.starts_with("text/event-stream"), "{ctype}");
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    assert!(chunks
        .iter()
        .all(|c| c["object"] == "chat.completion.chunk"));
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let streamed: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(streamed, content);
    // The finish reason in the last chunk with a choice, then the usage in a chunk of its own.
    let finished = &chunks[chunks.len() - 2];
    assert_eq!(finished["choices"][0]["finish_reason"], reason);
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"], json!([]));
    assert_eq!(
        last["usage"]["completion_tokens"].as_u64().unwrap(),
        completion
    );
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_native_and_openai() {
    let env = Env::new();
    let srv = env.start(&["--alias", "tiny-model"]).await;

    let (status, tokens) = srv
        .post(
            "/tokenize",
            &json!({"content": "hello world", "with_pieces": false}),
        )
        .await;
    assert_eq!(status, 200);
    let ids: Vec<u32> = serde_json::from_value(tokens["tokens"].clone()).unwrap();
    assert_eq!(
        ids.len(),
        "hello world".len(),
        "one byte per token in the tiny model"
    );
    let (status, text) = srv.post("/detokenize", &json!({"tokens": ids})).await;
    assert_eq!(status, 200);
    assert_eq!(text["content"], "hello world");

    let (status, native) = srv
        .post(
            "/completion",
            &json!({"prompt": ids, "n_predict": 5, "temperature": 0}),
        )
        .await;
    assert_eq!(status, 200, "{native}");
    assert_eq!(native["stop"], true);
    assert_eq!(native["tokens_evaluated"], ids.len());
    let predicted = native["tokens_predicted"].as_u64().unwrap();
    assert!(predicted <= 5);
    let t = &native["timings"];
    assert_eq!(t["predicted_n"], predicted);
    assert_eq!(
        t["prompt_n"].as_u64().unwrap() + t["cache_n"].as_u64().unwrap(),
        ids.len() as u64
    );

    let (status, _, events) = srv
        .post_stream(
            "/completion",
            &json!({"prompt": "hello world", "n_predict": 5, "temperature": 0, "stream": true}),
        )
        .await;
    assert_eq!(status, 200);
    let chunks: Vec<Value> = events
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    let (last, rest) = chunks.split_last().unwrap();
    assert_eq!(last["stop"], true);
    assert!(rest.iter().all(|c| c["stop"] == false));
    let streamed: String = rest
        .iter()
        .map(|c| c["content"].as_str().unwrap())
        .collect();
    assert_eq!(streamed, native["content"].as_str().unwrap());

    let (status, oai) = srv
        .post(
            "/v1/completions",
            &json!({"model": "x", "prompt": "hello world", "max_tokens": 5, "temperature": 0}),
        )
        .await;
    assert_eq!(status, 200, "{oai}");
    assert_eq!(oai["object"], "text_completion");
    assert_eq!(oai["model"], "tiny-model");
    assert_eq!(oai["choices"][0]["text"], native["content"]);

    let (status, _, events) = srv
        .post_stream(
            "/v1/completions",
            &json!({"prompt": ["hello world"], "max_tokens": 5, "temperature": 0, "stream": true}),
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn info_endpoints_template_slots_and_metrics() {
    let env = Env::new();
    let srv = env
        .start(&["-np", "3", "--metrics", "--alias", "tiny"])
        .await;

    assert_eq!(srv.get("/health").await, (200, json!({"status": "ok"})));
    let (_, models) = srv.get("/v1/models").await;
    assert_eq!(models["data"][0]["id"], "tiny");
    let (_, props) = srv.get("/props").await;
    assert_eq!(props["total_slots"], 3);
    assert_eq!(props["default_generation_settings"]["n_ctx"], 512);

    let (status, tpl) = srv
        .post(
            "/apply-template",
            &json!({"messages": [{"role": "user", "content": "hi"}]}),
        )
        .await;
    assert_eq!(status, 200);
    let prompt = tpl["prompt"].as_str().unwrap();
    assert!(
        prompt.contains("<|im_start|>user\nhi<|im_end|>"),
        "{prompt}"
    );
    assert!(prompt.ends_with("<|im_start|>assistant\n"), "{prompt}");

    let (_, slots) = srv.get("/slots").await;
    assert_eq!(slots.as_array().unwrap().len(), 3);

    // A conversation in slot 1, saved, erased and restored.
    let long = "abcdefgh".repeat(20);
    let (status, done) = srv
        .post(
            "/completion",
            &json!({"prompt": long, "n_predict": 4, "temperature": 0, "id_slot": 1}),
        )
        .await;
    assert_eq!(status, 200, "{done}");
    assert_eq!(done["id_slot"], 1);
    let held =
        done["tokens_evaluated"].as_u64().unwrap() + done["tokens_predicted"].as_u64().unwrap();
    let (status, saved) = srv
        .post("/slots/1?action=save", &json!({"filename": "conv1"}))
        .await;
    assert_eq!(status, 200, "{saved}");
    let n_saved = saved["n_saved"].as_u64().unwrap();
    // The last sampled token is never fed: the slot holds the prompt and all but one reply token.
    assert!(n_saved + 1 == held || n_saved == held, "{saved} vs {held}");
    assert!(saved["n_written"].as_u64().unwrap() > 0);
    let (status, erased) = srv.post("/slots/1?action=erase", &json!({})).await;
    assert_eq!(status, 200);
    assert_eq!(erased["n_erased"], n_saved);
    let (status, restored) = srv
        .post("/slots/2?action=restore", &json!({"filename": "conv1"}))
        .await;
    assert_eq!(status, 200, "{restored}");
    assert_eq!(restored["n_restored"], n_saved);
    let (status, missing) = srv
        .post(
            "/slots/0?action=restore",
            &json!({"filename": "nothing-here"}),
        )
        .await;
    assert_eq!(status, 400, "{missing}");

    let (status, metrics) = srv.get("/metrics").await;
    assert_eq!(status, 200);
    let text = metrics.as_str().unwrap();
    let value = |name: &str| -> u64 {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("llamahdd:{name} ")))
            .unwrap_or_else(|| panic!("{name} missing in\n{text}"))
            .parse()
            .unwrap()
    };
    assert_eq!(
        value("prompt_tokens_total"),
        done["tokens_evaluated"].as_u64().unwrap()
    );
    assert_eq!(value("requests_finished_total"), 1);
    assert!(value("kv_pages_total") > 0);
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_are_off_unless_asked_for() {
    let env = Env::new();
    let srv = env.start(&[]).await;
    let (status, body) = srv.get("/metrics").await;
    assert_eq!(status, 501, "{body}");
    common::assert_error(&body, 501);
    srv.stop().await;
}
