//! `--sleep-idle-seconds`: an idle server releases its KV pool, says so in `/props`, answers
//! the read-only endpoints asleep, and wakes for any other request (as llama-server does: token
//! counting and `/tokenize` too), whose prompt it still finds in the cache (handed to the store
//! before sleeping). `/metrics` asleep reports the last window's throughput once.

mod common;

use std::time::{Duration, Instant};

use common::{Env, TestServer};
use serde_json::json;

async fn is_sleeping(srv: &TestServer) -> bool {
    let (status, props) = srv.get("/props").await;
    assert_eq!(status, 200, "{props}");
    props["is_sleeping"].as_bool().unwrap()
}

/// Polls `/props` until the server sleeps (within 10 s of its last request).
async fn wait_for_sleep(srv: &TestServer) {
    let t = Instant::now();
    while !is_sleeping(srv).await {
        assert!(t.elapsed() < Duration::from_secs(10), "never slept");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The `llamacpp:` gauges `prompt_tokens_seconds` and `predicted_tokens_seconds` of one scrape.
async fn rates(srv: &TestServer) -> (f64, f64) {
    let text = srv
        .client
        .get(format!("{}/metrics", srv.url))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let gauge = |name: &str| {
        let prefix = format!("llamacpp:{name} ");
        let line = text.lines().find(|l| l.starts_with(&prefix)).unwrap();
        line[prefix.len()..].parse::<f64>().unwrap()
    };
    (
        gauge("prompt_tokens_seconds"),
        gauge("predicted_tokens_seconds"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_server_sleeps_and_a_request_wakes_it() {
    let env = Env::new();
    let srv = env.start(&["--sleep-idle-seconds", "1", "--metrics"]).await;
    let prompt = format!("remember this {}", "abcdefgh ".repeat(20));
    let body = json!({"prompt": prompt, "n_predict": 2, "temperature": 0});
    let (status, first) = srv.post("/completion", &body).await;
    assert_eq!(status, 200, "{first}");
    let (_, props) = srv.get("/props").await;
    assert_eq!(props["is_sleeping"], false);

    wait_for_sleep(&srv).await;
    // The read-only endpoints answer without waking it.
    for path in ["/health", "/v1/models", "/metrics", "/props"] {
        let (status, r) = srv.get(path).await;
        assert_eq!(status, 200, "{path}: {r}");
    }
    assert!(is_sleeping(&srv).await);

    // A generation wakes it; the prompt comes from the store (the pool was released), and
    // the greedy reply is the same.
    let (status, again) = srv.post("/completion", &body).await;
    assert_eq!(status, 200, "{again}");
    assert!(
        again["timings"]["cache_n"].as_u64().unwrap() >= 128,
        "{again}"
    );
    assert_eq!(again["content"], first["content"]);
    let (_, props) = srv.get("/props").await;
    assert_eq!(props["is_sleeping"], false);
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_counting_and_tokenize_wake_it() {
    let env = Env::new();
    let srv = env.start(&["--sleep-idle-seconds", "1"]).await;
    let messages = json!([{"role": "user", "content": "Hello world"}]);
    let requests = [
        (
            "/chat/completions/input_tokens",
            json!({"messages": messages}),
        ),
        (
            "/v1/responses/input_tokens",
            json!({"input": "Hello world"}),
        ),
        ("/v1/messages/count_tokens", json!({"messages": messages})),
        ("/tokenize", json!({"content": "Hello"})),
        ("/detokenize", json!({"tokens": [1, 2]})),
        ("/apply-template", json!({"messages": messages})),
    ];
    for (path, body) in requests {
        wait_for_sleep(&srv).await;
        let (status, res) = srv.post(path, &body).await;
        assert_eq!(status, 200, "{path}: {res}");
        if path.contains("tokens") {
            assert!(res["input_tokens"].as_u64().unwrap() > 0, "{path}: {res}");
        }
        assert!(!is_sleeping(&srv).await, "{path} did not wake it");
    }
    let (_, res) = srv
        .post(
            "/v1/responses/input_tokens",
            &json!({"input": "Hello world"}),
        )
        .await;
    assert_eq!(res["object"], "response.input_tokens");
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throughput_gauges_cover_the_window_since_the_last_scrape() {
    let env = Env::new();
    let srv = env.start(&["--sleep-idle-seconds", "1", "--metrics"]).await;
    let body = json!({"prompt": "Hello", "n_predict": 8, "ignore_eos": true});
    let (status, res) = srv.post("/completion", &body).await;
    assert_eq!(status, 200, "{res}");
    wait_for_sleep(&srv).await;
    // The first scrape asleep reports the last generation, the next ones an empty window.
    let (prompt, predicted) = rates(&srv).await;
    assert!(prompt > 0.0 && predicted > 0.0, "{prompt} {predicted}");
    assert_eq!(rates(&srv).await, (0.0, 0.0));
    assert!(is_sleeping(&srv).await);
    // Waking does not report the window again.
    let (status, _) = srv.post("/tokenize", &json!({"content": "Hello"})).await;
    assert_eq!(status, 200);
    assert!(!is_sleeping(&srv).await);
    assert_eq!(rates(&srv).await, (0.0, 0.0));
    // Awake, a scrape reports what finished since the one before.
    srv.post("/completion", &body).await;
    assert!(rates(&srv).await.1 > 0.0);
    assert_eq!(rates(&srv).await, (0.0, 0.0));
    srv.stop().await;
}
