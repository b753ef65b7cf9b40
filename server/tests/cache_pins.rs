//! Pinned prompts: `POST /cache/pin` keeps a prompt's full blocks through a disk budget filled
//! by other traffic and a restart; a pin expires after its `ttl_seconds`; `DELETE` removes one;
//! `GET /cache` lists them; all behind the API key.

mod common;

use std::time::{Duration, Instant};

use common::{Env, TestServer};
use serde_json::{json, Value};

fn pinned_text() -> String {
    format!("pinned {}", "abcdefgh".repeat(30))
}

fn other_text(i: usize) -> String {
    format!("{i} {}", "zyxwvuts".repeat(30))
}

async fn cached(srv: &TestServer, text: &str) -> u64 {
    let (status, body) = srv
        .post("/completion", &json!({"prompt": text, "n_predict": 1}))
        .await;
    assert_eq!(status, 200, "{body}");
    body["timings"]["cache_n"].as_u64().unwrap()
}

async fn pins(srv: &TestServer) -> Vec<Value> {
    let (status, body) = srv.get("/cache").await;
    assert_eq!(status, 200, "{body}");
    body["pins"].as_array().unwrap().clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pinned_prompt_survives_a_full_disk_budget_and_a_restart() {
    let env = Env::new();
    let srv = env.start(&["--cache-disk", "120KiB"]).await;
    let (status, pin) = srv
        .post("/cache/pin", &json!({"prompt": pinned_text()}))
        .await;
    assert_eq!(status, 200, "{pin}");
    let n = pin["tokens"].as_u64().unwrap();
    assert!(n >= 192, "three blocks or more: {pin}");
    assert_eq!(pins(&srv).await.len(), 1);
    // Other prompts, several times what the budget holds.
    for i in 0..10 {
        cached(&srv, &other_text(i)).await;
    }
    srv.stop().await;

    let srv = env.start(&[]).await;
    assert_eq!(
        cached(&srv, &other_text(0)).await,
        0,
        "the budget made the oldest unpinned prompt give way"
    );
    assert!(
        cached(&srv, &pinned_text()).await >= n,
        "the pinned blocks come from disk"
    );
    let listed = pins(&srv).await;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0]["id"], pin["id"]);
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pins_expire_and_are_deleted_and_need_the_key() {
    let env = Env::new();
    let srv = env.start(&["--api-key", "k"]).await;
    let post = |path: &'static str, body: Value, key: Option<&'static str>| {
        let mut req = srv.client.post(format!("{}{path}", srv.url)).json(&body);
        if let Some(k) = key {
            req = req.bearer_auth(k);
        }
        async move {
            let resp = req.send().await.unwrap();
            (resp.status().as_u16(), resp.json::<Value>().await.unwrap())
        }
    };
    let (status, _) = post("/cache/pin", json!({"prompt": pinned_text()}), None).await;
    assert_eq!(status, 401);
    let list = |srv: &TestServer| {
        let req = srv
            .client
            .get(format!("{}/cache", srv.url))
            .bearer_auth("k");
        async move {
            let v: Value = req.send().await.unwrap().json().await.unwrap();
            let mut ids: Vec<String> = v["pins"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| p["id"].as_str().unwrap().to_owned())
                .collect();
            ids.sort();
            ids
        }
    };
    // Listed until its time is up (three seconds: on a loaded machine the next pin's prefill
    // outlasted one).
    let (status, short) = post(
        "/cache/pin",
        json!({"prompt": pinned_text(), "ttl_seconds": 3, "id": "short"}),
        Some("k"),
    )
    .await;
    assert_eq!(status, 200, "{short}");
    let pinned_at = Instant::now();
    assert_eq!(list(&srv).await, ["short"]);
    let (status, kept) = post(
        "/cache/pin",
        json!({"prompt": other_text(1), "id": "kept"}),
        Some("k"),
    )
    .await;
    assert_eq!(status, 200, "{kept}");
    assert!(list(&srv).await.contains(&"kept".to_owned()));

    // Past its time, the next writer round removes it.
    tokio::time::sleep(Duration::from_millis(3100).saturating_sub(pinned_at.elapsed())).await;
    let started = Instant::now();
    let mut i = 10;
    while list(&srv).await != ["kept"] {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the expired pin stays"
        );
        post(
            "/completion",
            json!({"prompt": other_text(i), "n_predict": 1}),
            Some("k"),
        )
        .await;
        i += 1;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    let delete = |id: &'static str| {
        let req = srv
            .client
            .delete(format!("{}/cache/pin/{id}", srv.url))
            .bearer_auth("k");
        async move { req.send().await.unwrap().status().as_u16() }
    };
    assert_eq!(delete("kept").await, 200);
    assert_eq!(delete("kept").await, 404);
    assert!(list(&srv).await.is_empty());
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prompt_with_cache_ttl_is_not_kept_past_it() {
    let env = Env::new();
    let srv = env.start(&[]).await;
    let ask = |i: usize, ttl: Option<u64>| {
        let mut body = json!({"prompt": other_text(i), "n_predict": 1});
        if let Some(t) = ttl {
            body["cache_ttl"] = json!(t);
        }
        body
    };
    let (status, _) = srv.post("/completion", &ask(0, Some(1))).await;
    assert_eq!(status, 200);
    let (status, _) = srv.post("/completion", &ask(1, None)).await;
    assert_eq!(status, 200);
    let (status, bad) = srv.post("/completion", &ask(2, Some(0))).await;
    assert_eq!(status, 400, "{bad}");
    // The Messages and Responses APIs take it too, and refuse a bad one alike.
    let (status, bad) = srv
        .post(
            "/v1/messages",
            &json!({"max_tokens": 1, "cache_ttl": 0,
                    "messages": [{"role": "user", "content": "hi"}]}),
        )
        .await;
    assert_eq!(status, 400, "{bad}");
    assert!(bad.to_string().contains("cache_ttl"), "{bad}");
    let (status, bad) = srv
        .post(
            "/v1/responses",
            &json!({"input": "hi", "cache_ttl": "soon"}),
        )
        .await;
    assert_eq!(status, 400, "{bad}");
    // Past the time, another request's writer round collects it.
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let (status, _) = srv.post("/completion", &ask(3, None)).await;
    assert_eq!(status, 200);
    srv.stop().await;

    let srv = env.start(&[]).await;
    assert_eq!(
        cached(&srv, &other_text(0)).await,
        0,
        "expired with its blocks"
    );
    assert!(cached(&srv, &other_text(1)).await > 0, "kept");
    srv.stop().await;
}
