//! A streamed chat on the real model (SmolLM2-135M-Instruct), when it is present.

mod common;

use std::path::{Path, PathBuf};

use common::TestServer;
use serde_json::{json, Value};

fn real_model() -> Option<PathBuf> {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    path.is_file().then_some(path)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_chat_on_the_real_model_answers_in_words() {
    let Some(model) = real_model() else {
        eprintln!(
            "skipped: models/SmolLM2-135M-Instruct.Q4_1.gguf is absent (cargo xtask fetch-model)"
        );
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let srv = common::start_on(
        &model,
        &dir.path().join("cache"),
        &["-c", "1024", "-np", "2", "--kv-unified"],
    )
    .await;
    let body = json!({
        "messages": [{"role": "user", "content": "What is the tallest mountain in the world?"}],
        "max_tokens": 24,
        "temperature": 0,
        "stream": true,
    });
    let (status, _, events) = srv.post_stream("/v1/chat/completions", &body).await;
    assert_eq!(status, 200);
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let text: String = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str::<Value>(e).unwrap())
        .filter_map(|c| {
            c["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_owned)
        })
        .collect();
    assert!(text.contains("Everest"), "{text:?}");
    srv.stop().await;
}

/// Starts a server on the real model with `cache` as its cache directory and 8 slots, with no
/// option on evaluation: batch invariance is the default.
async fn real_server(model: &Path, cache: &Path) -> TestServer {
    common::start_on(
        model,
        cache,
        &["-c", "1024", "-np", "8", "--kv-unified", "-t", "2"],
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn greedy_replies_are_the_same_cold_from_memory_and_from_disk() {
    let Some(model) = real_model() else {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must run the real-model tests"
        );
        eprintln!("skipped: the real model is absent (cargo xtask fetch-model)");
        return;
    };
    let words = [
        "river", "stone", "lamp", "orbit", "maple", "quiet", "harbor", "copper",
    ];
    let bodies: Vec<Value> = (0..20)
        .map(|i| {
            let text: Vec<&str> = (0..10 + i * 7)
                .map(|k| words[(k * 5 + i) % words.len()])
                .collect();
            json!({"prompt": format!("Note {i}: {}. Summary:", text.join(" ")),
                   "n_predict": 8, "temperature": 0, "ignore_eos": true, "return_tokens": true})
        })
        .collect();
    let replies = |rs: &[Value]| -> Vec<Value> { rs.iter().map(|r| r["tokens"].clone()).collect() };

    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let srv = real_server(&model, &cache).await;
    let mut cold = Vec::new();
    for b in &bodies {
        cold.push(srv.post("/completion", b).await.1);
    }
    // (The prompts share their first words, so only the first is wholly cold.)
    assert_eq!(cold[0]["timings"]["cache_n"], 0);
    let mut warm = Vec::new();
    for b in &bodies {
        warm.push(srv.post("/completion", b).await.1);
    }
    assert!(warm
        .iter()
        .all(|r| r["timings"]["cache_n"].as_u64() > Some(0)));
    srv.stop().await;
    let srv = real_server(&model, &cache).await;
    let mut restored = Vec::new();
    for b in &bodies {
        restored.push(srv.post("/completion", b).await.1);
    }
    srv.stop().await;
    assert_eq!(replies(&warm), replies(&cold), "from memory");
    assert_eq!(
        replies(&restored),
        replies(&cold),
        "from disk after a restart"
    );

    // Eight at a time on a fresh cache: prompts and replies share every batch.
    let other = dir.path().join("other");
    let srv = real_server(&model, &other).await;
    let mut batched = Vec::new();
    for group in bodies.chunks(8) {
        let mut tasks = Vec::new();
        for b in group {
            let client = srv.client.clone();
            let url = format!("{}/completion", srv.url);
            let b = b.clone();
            tasks.push(tokio::spawn(async move {
                let r = client.post(url).json(&b).send().await.unwrap();
                r.json::<Value>().await.unwrap()
            }));
        }
        for t in tasks {
            batched.push(t.await.unwrap());
        }
    }
    srv.stop().await;
    assert_eq!(replies(&batched), replies(&cold), "in batches of 8");
}
