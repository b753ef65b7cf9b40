//! `--sleep-idle-seconds`: an idle server releases its KV pool, says so in `/props`, answers
//! the endpoints that need no model, and wakes for a request, whose prompt it still finds in
//! the cache (handed to the store before sleeping).

mod common;

use std::time::{Duration, Instant};

use common::Env;
use serde_json::json;

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

    // Asleep within a few seconds of the last request.
    let t = Instant::now();
    loop {
        let (_, props) = srv.get("/props").await;
        if props["is_sleeping"] == true {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "never slept: {props}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Endpoints that need no context answer without waking it.
    for path in ["/health", "/v1/models", "/metrics", "/props"] {
        let (status, r) = srv.get(path).await;
        assert_eq!(status, 200, "{path}: {r}");
    }
    let (status, _) = srv.post("/tokenize", &json!({"content": "hi"})).await;
    assert_eq!(status, 200);
    let (_, props) = srv.get("/props").await;
    assert_eq!(props["is_sleeping"], true);

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
