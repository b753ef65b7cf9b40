//! Sixteen clients at once on four slots all get their answers (the rest wait in the queue);
//! a client that leaves mid-stream frees its slot; concurrent requests with one system prompt
//! compute it once.

mod common;

use std::time::{Duration, Instant};

use common::Env;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_concurrent_clients_all_complete() {
    let env = Env::new();
    let srv = env.start(&["-np", "4"]).await;
    let mut tasks = Vec::new();
    for i in 0..16 {
        let client = srv.client.clone();
        let url = srv.url.clone();
        tasks.push(tokio::spawn(async move {
            let stream = i % 2 == 0;
            let body = json!({
                "messages": [{"role": "user", "content": format!("client {i} asks")}],
                "max_tokens": 8,
                "temperature": 0.7,
                "seed": i,
                "stream": stream,
            });
            let resp = client
                .post(format!("{url}/v1/chat/completions"))
                .json(&body)
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status().as_u16(), 200);
            let text = resp.text().await.unwrap();
            if stream {
                assert!(
                    text.trim_end().ends_with("data: [DONE]"),
                    "client {i}: {text}"
                );
            } else {
                let v: serde_json::Value = serde_json::from_str(&text).unwrap();
                assert!(v["usage"]["completion_tokens"].as_u64().unwrap() <= 8);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let (_, slots) = srv.get("/slots").await;
    assert!(slots
        .as_array()
        .unwrap()
        .iter()
        .all(|s| s["is_processing"] == false));
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_frees_its_slot() {
    let env = Env::new();
    let srv = env.start(&["-np", "1", "-c", "4096"]).await;
    let resp = srv.endless_stream(3000).await;
    let (_, slots) = srv.get("/slots").await;
    assert_eq!(slots[0]["is_processing"], true, "{slots}");
    drop(resp);

    // The only slot comes free long before 3000 tokens could have been generated.
    let t0 = Instant::now();
    loop {
        let (_, slots) = srv.get("/slots").await;
        if slots[0]["is_processing"] == false {
            let decoded = slots[0]["n_past"].as_u64().unwrap();
            assert!(decoded < 3000, "{slots}");
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "slot still busy: {slots}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (status, body) = srv
        .post("/completion", &json!({"prompt": "next", "n_predict": 2}))
        .await;
    assert_eq!(status, 200, "{body}");
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_gives_up_on_a_whole_answer_frees_its_slot() {
    let env = Env::new();
    let srv = env.start(&["-np", "1", "-c", "4096"]).await;
    let impatient = srv
        .client
        .post(format!("{}/completion", srv.url))
        .timeout(Duration::from_millis(200))
        .json(&json!({
            "prompt": "go on and on",
            "n_predict": 4000,
            "temperature": 1.0,
            "ignore_eos": true,
        }))
        .send()
        .await;
    assert!(impatient.is_err(), "4000 tokens came back within 200 ms");
    let t0 = Instant::now();
    loop {
        let (_, slots) = srv.get("/slots").await;
        if slots[0]["is_processing"] == false {
            assert!(slots[0]["n_past"].as_u64().unwrap() < 4000, "{slots}");
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "slot still busy: {slots}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_share_the_system_prompt_they_have_in_common() {
    let env = Env::new();
    let srv = env.start(&["-np", "4"]).await;
    let system = "abcdefgh ".repeat(50);
    let body = |i: usize, cache: bool| {
        json!({
            "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": format!("question number {i}")}
            ],
            "max_tokens": 6,
            "temperature": 0,
            "cache_prompt": cache,
        })
    };
    let mut tasks = Vec::new();
    for i in 0..4 {
        let client = srv.client.clone();
        let url = srv.url.clone();
        let b = body(i, true);
        tasks.push(tokio::spawn(async move {
            let resp = client
                .post(format!("{url}/v1/chat/completions"))
                .json(&b)
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status().as_u16(), 200);
            resp.json::<serde_json::Value>().await.unwrap()
        }));
    }
    let mut cached = Vec::new();
    for (i, t) in tasks.into_iter().enumerate() {
        let v = t.await.unwrap();
        let n_prompt = v["usage"]["prompt_tokens"].as_u64().unwrap();
        assert!(
            n_prompt > 4 * 64,
            "the system prompt should span blocks: {n_prompt}"
        );
        cached.push(
            v["usage"]["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap(),
        );
        // Whatever was shared, the reply is the one computed from scratch.
        let (_, alone) = srv.post("/v1/chat/completions", &body(i, false)).await;
        assert_eq!(alone["timings"]["cache_n"], 0);
        assert_eq!(v["choices"], alone["choices"], "request {i}");
    }
    // One request computes the common prefix; the three others take at least its full pages.
    cached.sort_unstable();
    assert!(cached[1] >= 4 * 64, "cached tokens per request: {cached:?}");
    srv.stop().await;
}

/// A short request that arrives while a long prompt is being read is answered first: prefill
/// chunks go to the request with the fewest prompt tokens left (before, the long prompt took
/// every step's budget until it was read).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_request_is_not_held_behind_a_long_prompt() {
    use std::time::Instant;
    let env = common::Env::new();
    let srv = env
        .start(&["-c", "4096", "-np", "2", "-ub", "32", "-b", "32"])
        .await;
    let long: String = (0..3800)
        .map(|i| char::from(b'a' + (i % 26) as u8))
        .collect();
    let mut resp = srv
        .client
        .post(format!("{}/completion", srv.url))
        .json(
            &serde_json::json!({"prompt": long, "n_predict": 1, "stream": true,
                                  "return_progress": true, "cache_prompt": false}),
        )
        .send()
        .await
        .unwrap();
    // Wait until the long prompt is being read (its first progress past the start).
    let mut buf = String::new();
    loop {
        let chunk = resp
            .chunk()
            .await
            .unwrap()
            .expect("the long request ended early");
        buf.push_str(&String::from_utf8_lossy(&chunk));
        if buf.matches("prompt_progress").count() >= 2 {
            break;
        }
    }
    let sent = Instant::now();
    let (status, short) = srv
        .post(
            "/completion",
            &serde_json::json!({"prompt": "zz", "n_predict": 1, "cache_prompt": false}),
        )
        .await;
    let short_done = Instant::now();
    assert_eq!(status, 200, "{short}");
    // The long request is still going when the short one has its answer: its last event
    // (`"stop": true`) comes long after.
    let mut long_done = None;
    while let Some(chunk) = resp.chunk().await.unwrap() {
        buf.push_str(&String::from_utf8_lossy(&chunk));
        if long_done.is_none() && buf.contains("\"stop\":true") {
            long_done = Some(Instant::now());
        }
    }
    let long_done = long_done.expect("the long request answered");
    // About 2 steps against about 110.
    let (short_took, long_took) = (short_done - sent, long_done - sent);
    assert!(
        short_took * 4 < long_took,
        "the short request took {short_took:?}, the long one {long_took:?}: it waited"
    );
    srv.stop().await;
}
