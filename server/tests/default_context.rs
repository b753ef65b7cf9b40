//! Slots and context as llama-server gives them: without `-np` it takes 4 slots over one
//! unified context, so any one request may use the whole `-c`; with `-np N` each slot gets
//! `-c / N` unless `--kv-unified`. `/props` reports `total_slots` and the context one request
//! may use (`default_generation_settings.n_ctx`), as llama-server's does.

mod common;

use common::{start_on, Env};
use serde_json::{json, Value};

/// A text of `n` bytes (the tiny model's vocabulary is bytes: about one token each).
fn text_of(n: usize) -> String {
    let words = [
        "river ", "stone ", "lantern ", "orchard ", "copper ", "meadow ",
    ];
    let mut s = String::new();
    let mut i = 0usize;
    while s.len() < n {
        s.push_str(words[i % words.len()]);
        i = i.wrapping_mul(31).wrapping_add(7) % 1009;
    }
    s.truncate(n);
    s
}

/// `/props`' slot count and per-request context.
async fn slots_and_context(srv: &common::TestServer) -> (u64, u64) {
    let (status, props) = srv.get("/props").await;
    assert_eq!(status, 200, "{props}");
    (
        props["total_slots"].as_u64().unwrap(),
        props["default_generation_settings"]["n_ctx"]
            .as_u64()
            .unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_np_one_request_may_use_the_whole_context() {
    let env = Env::new();
    let srv = start_on(&env.model, &env.cache(), &["-t", "2", "-c", "4096"]).await;

    let prompt = text_of(2858);
    let (status, tokens) = srv.post("/tokenize", &json!({ "content": prompt })).await;
    assert_eq!(status, 200, "{tokens}");
    let n_prompt = tokens["tokens"].as_array().unwrap().len();
    assert!(
        (2858..2900).contains(&n_prompt),
        "{n_prompt} tokens: more than a slot's share (1,024) of -c 4096"
    );
    let (status, body) = srv
        .post(
            "/completion",
            &json!({ "prompt": prompt, "n_predict": 4, "temperature": 0 }),
        )
        .await;
    assert_eq!(status, 200, "answered, not refused: {body}");
    assert!(body["content"].is_string(), "{body}");
    assert!(
        body["tokens_evaluated"].as_u64().unwrap() >= 2858,
        "the whole prompt was read: {body}"
    );
    assert_eq!(slots_and_context(&srv).await, (4, 4096));
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn props_agree_with_llama_server_on_each_launch_line() {
    let env = Env::new();
    // The tiny model's trained context is 4,096: no `-c` takes it.
    let lines: [(&[&str], (u64, u64)); 5] = [
        (&["-c", "4096"], (4, 4096)),
        (&["-c", "4096", "-np", "2"], (2, 2048)),
        (&["-c", "4096", "-np", "4", "--kv-unified"], (4, 4096)),
        // Auto slots are unified whatever `--no-kv-unified` says (llama-server sets both).
        (&["-c", "4096", "-no-kvu"], (4, 4096)),
        (&[], (4, 4096)),
    ];
    for (extra, want) in lines {
        let mut argv = vec!["-t", "1", "--no-warmup"];
        argv.extend_from_slice(extra);
        let srv = start_on(&env.model, &env.cache(), &argv).await;
        assert_eq!(slots_and_context(&srv).await, want, "{extra:?}");
        srv.stop().await;
    }
    // A split context refuses what one slot's share cannot hold.
    let srv = start_on(
        &env.model,
        &env.cache(),
        &["-t", "1", "-c", "4096", "-np", "4"],
    )
    .await;
    assert_eq!(slots_and_context(&srv).await, (4, 1024));
    let (status, body) = srv
        .post(
            "/completion",
            &json!({ "prompt": text_of(1500), "n_predict": 4 }),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(
        body["error"]["type"],
        Value::from("exceed_context_size_error"),
        "{body}"
    );
    srv.stop().await;
}
