//! A streamed chat on the real model (SmolLM2-135M-Instruct), when it is present.

mod common;

use std::path::PathBuf;

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
    let model = model.display().to_string();
    let cache = dir.path().join("cache").display().to_string();
    let srv = TestServer::start(&[
        "llama-hdd-server",
        "-m",
        &model,
        "--port",
        "0",
        "--cache-dir",
        &cache,
        "-c",
        "1024",
        "-np",
        "2",
        "--kv-unified",
    ])
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
