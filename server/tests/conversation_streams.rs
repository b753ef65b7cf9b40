//! Resumable conversation streams (`X-Conversation-Id`, `/v1/stream`), as llama-server's web
//! page uses them: a client that leaves mid-reply finds the whole reply again, a finished reply
//! replays from its start, a stop ends the generation, and one key never reaches another's.

mod common;

use std::time::{Duration, Instant};

use common::Env;
use serde_json::{json, Value};

const HEADER: &str = "X-Conversation-Id";

/// A chat of `n` tokens at temperature 0 that an end of generation does not stop.
fn chat(n: u64) -> Value {
    json!({
        "messages": [{"role": "user", "content": "Tell me a long story."}],
        "max_tokens": n,
        "temperature": 0.0,
        "ignore_eos": true,
        "stream": true,
    })
}

/// The `data:` payloads of a server-sent event stream.
fn events(text: &str) -> Vec<&str> {
    text.split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .collect()
}

/// The chat chunks' content, joined.
fn content(text: &str) -> String {
    events(text)
        .into_iter()
        .filter(|e| *e != "[DONE]")
        .filter_map(|e| {
            let v: Value = serde_json::from_str(e).unwrap();
            v["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_owned)
        })
        .collect()
}

/// Sends `method` to `path` with `key` (when given), `body` (when given) and the conversation
/// header (when `conv` is given).
async fn send(
    srv: &common::TestServer,
    method: reqwest::Method,
    path: &str,
    key: Option<&str>,
    conv: Option<&str>,
    body: Option<&Value>,
) -> reqwest::Response {
    let mut req = srv.client.request(method, format!("{}{path}", srv.url));
    if let Some(k) = key {
        req = req.bearer_auth(k);
    }
    if let Some(c) = conv {
        req = req.header(HEADER, c);
    }
    if let Some(b) = body {
        req = req.json(b);
    }
    req.send().await.unwrap()
}

/// `GET /v1/stream` of `conv` from `from`: the status and the whole body.
async fn resume(
    srv: &common::TestServer,
    key: Option<&str>,
    conv: &str,
    from: usize,
) -> (u16, String) {
    let path = format!("/v1/stream?conv_id={conv}&from={from}");
    let resp = send(srv, reqwest::Method::GET, &path, key, None, None).await;
    let status = resp.status().as_u16();
    (status, resp.text().await.unwrap())
}

/// Whether the one slot is generating.
async fn busy(srv: &common::TestServer) -> bool {
    let (_, slots) = srv.get("/slots").await;
    slots[0]["is_processing"] == true
}

/// Waits, up to 30 s, until the one slot is free.
async fn until_idle(srv: &common::TestServer) {
    let t0 = Instant::now();
    while busy(srv).await {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the slot stays busy"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// llama-server's `tokens_predicted_total`.
async fn tokens_predicted(srv: &common::TestServer) -> u64 {
    let text = srv
        .client
        .get(format!("{}/metrics", srv.url))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix("llamacpp:tokens_predicted_total "))
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap() as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_mid_reply_resumes_the_whole_reply() {
    let env = Env::new();
    let srv = env.start(&["-np", "1", "-c", "4096"]).await;
    let n = 1000;
    let (status, plain) = srv.post_text("/v1/chat/completions", &chat(n)).await;
    assert_eq!(status, 200, "{plain}");
    let expected = content(&plain);
    assert!(!expected.is_empty());

    let post = chat(n);
    let mut resp = send(
        &srv,
        reqwest::Method::POST,
        "/v1/chat/completions",
        None,
        Some("page-1"),
        Some(&post),
    )
    .await;
    assert_eq!(resp.status().as_u16(), 200);
    assert!(resp.chunk().await.unwrap().is_some());
    drop(resp);
    // The client left before the reply's end: the generation goes on without it.
    assert!(busy(&srv).await, "the reply ended before its client left");

    let (status, replay) = resume(&srv, None, "page-1", 0).await;
    assert_eq!(status, 200, "{replay}");
    assert_eq!(content(&replay), expected);
    assert_eq!(events(&replay).last(), Some(&"[DONE]"));
    until_idle(&srv).await;
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_reply_replays_from_any_offset() {
    let env = Env::new();
    let srv = env.start(&["-np", "1"]).await;
    let resp = send(
        &srv,
        reqwest::Method::POST,
        "/v1/chat/completions",
        None,
        Some("done-1"),
        Some(&chat(24)),
    )
    .await;
    assert_eq!(resp.status().as_u16(), 200);
    let whole = resp.text().await.unwrap();
    assert_eq!(events(&whole).last(), Some(&"[DONE]"));

    let (status, replay) = resume(&srv, None, "done-1", 0).await;
    assert_eq!(status, 200);
    assert_eq!(replay, whole, "the replay is the stream byte for byte");
    let second = whole.find("\n\n").unwrap() + 2;
    let (status, tail) = resume(&srv, None, "done-1", second).await;
    assert_eq!(status, 200);
    assert_eq!(tail, whole[second..]);

    let (status, found) = srv
        .post(
            "/v1/streams/lookup",
            &json!({"conversation_ids": ["done-1", "nothing"]}),
        )
        .await;
    assert_eq!(status, 200, "{found}");
    assert_eq!(found.as_array().unwrap().len(), 1, "{found}");
    assert_eq!(found[0]["conversation_id"], "done-1");
    assert_eq!(found[0]["is_done"], true);
    assert_eq!(found[0]["total_bytes"], whole.len());

    // `/completion` streams are recorded too, as they are sent.
    let native = json!({"prompt": "Once", "n_predict": 8, "stream": true});
    let resp = send(
        &srv,
        reqwest::Method::POST,
        "/completion",
        None,
        Some("native"),
        Some(&native),
    )
    .await;
    let whole = resp.text().await.unwrap();
    assert_eq!(resume(&srv, None, "native", 0).await, (200, whole));

    // Unknown ids, a missing id, a bad offset.
    let (status, body) = resume(&srv, None, "nobody", 0).await;
    assert_eq!(status, 404);
    let body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["error"]["type"], "not_found_error");
    assert_eq!(srv.get("/v1/stream").await.0, 400);
    assert_eq!(srv.get("/v1/stream?conv_id=done-1&from=x").await.0, 400);

    // A request that fails, or that does not stream, leaves no session.
    let bad = json!({"max_tokens": 4, "stream": true});
    let resp = send(
        &srv,
        reqwest::Method::POST,
        "/v1/chat/completions",
        None,
        Some("failed"),
        Some(&bad),
    )
    .await;
    assert_eq!(resp.status().as_u16(), 400);
    assert_eq!(resume(&srv, None, "failed", 0).await.0, 404);
    let mut whole = chat(4);
    whole["stream"] = false.into();
    let resp = send(
        &srv,
        reqwest::Method::POST,
        "/v1/chat/completions",
        None,
        Some("whole"),
        Some(&whole),
    )
    .await;
    assert_eq!(resp.status().as_u16(), 200);
    assert_eq!(resume(&srv, None, "whole", 0).await.0, 404);
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_ends_the_generation_and_forgets_the_stream() {
    let env = Env::new();
    let srv = env.start(&["-np", "1", "-c", "4096", "--metrics"]).await;
    let before = tokens_predicted(&srv).await;
    let n = 3000;
    let body = json!({
        "prompt": "go on and on",
        "n_predict": n,
        "stream": true,
        "temperature": 1.0,
        "ignore_eos": true,
    });
    let mut resp = send(
        &srv,
        reqwest::Method::POST,
        "/completion",
        None,
        Some("long"),
        Some(&body),
    )
    .await;
    assert_eq!(resp.status().as_u16(), 200);
    assert!(resp.chunk().await.unwrap().is_some());
    assert!(busy(&srv).await);

    let stopped = send(
        &srv,
        reqwest::Method::DELETE,
        "/v1/stream?conv_id=long",
        None,
        None,
        None,
    )
    .await;
    assert_eq!(stopped.status().as_u16(), 204);
    // The client still connected sees its stream end, short of its tokens.
    let t0 = Instant::now();
    while resp.chunk().await.unwrap().is_some() {
        assert!(t0.elapsed() < Duration::from_secs(30), "the stream goes on");
    }
    until_idle(&srv).await;
    let generated = tokens_predicted(&srv).await - before;
    assert!(generated < n, "{generated} tokens generated after the stop");
    assert_eq!(resume(&srv, None, "long", 0).await.0, 404);
    // A stop of what is not there is answered as llama-server answers it.
    let again = send(
        &srv,
        reqwest::Method::DELETE,
        "/v1/stream?conv_id=long",
        None,
        None,
        None,
    )
    .await;
    assert_eq!(again.status().as_u16(), 204);
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_key_never_reaches_another_keys_stream() {
    let env = Env::new();
    let srv = env
        .start(&["-np", "1", "--api-key", "alpha", "--api-key", "beta"])
        .await;
    let (a, b) = (Some("alpha"), Some("beta"));
    let post = |key, body: Value| {
        let srv = &srv;
        async move {
            let resp = send(
                srv,
                reqwest::Method::POST,
                "/v1/chat/completions",
                key,
                Some("shared-id"),
                Some(&body),
            )
            .await;
            assert_eq!(resp.status().as_u16(), 200);
            resp.text().await.unwrap()
        }
    };
    let alphas = post(a, chat(16)).await;

    assert_eq!(resume(&srv, b, "shared-id", 0).await.0, 404);
    let (status, found) = srv
        .send_as(
            "beta",
            reqwest::Method::POST,
            "/v1/streams/lookup",
            Some(&json!({"conversation_ids": ["shared-id"]})),
        )
        .await;
    assert_eq!((status, found), (200, json!([])));
    // Beta's stop and beta's own stream of the same id leave alpha's as it was.
    let (status, _) = srv
        .send_as(
            "beta",
            reqwest::Method::DELETE,
            "/v1/stream?conv_id=shared-id",
            None,
        )
        .await;
    assert_eq!(status, 204);
    let betas = post(b, chat(8)).await;
    assert_eq!(resume(&srv, a, "shared-id", 0).await, (200, alphas));
    assert_eq!(resume(&srv, b, "shared-id", 0).await, (200, betas));
    // Without a key, nothing at all.
    assert_eq!(resume(&srv, None, "shared-id", 0).await.0, 401);
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_request_of_a_conversation_replaces_its_stream() {
    let env = Env::new();
    let srv = env.start(&["-np", "2", "-c", "4096"]).await;
    let long = json!({
        "prompt": "go on and on",
        "n_predict": 3000,
        "stream": true,
        "ignore_eos": true,
    });
    let mut first = send(
        &srv,
        reqwest::Method::POST,
        "/completion",
        None,
        Some("again"),
        Some(&long),
    )
    .await;
    assert!(first.chunk().await.unwrap().is_some());
    let resp = send(
        &srv,
        reqwest::Method::POST,
        "/v1/chat/completions",
        None,
        Some("again"),
        Some(&chat(8)),
    )
    .await;
    let second = resp.text().await.unwrap();
    // The older generation was stopped: its client's stream ends short of its end.
    let mut rest = Vec::new();
    while let Some(c) = first.chunk().await.unwrap() {
        rest.extend_from_slice(&c);
    }
    let rest = String::from_utf8_lossy(&rest);
    assert!(
        !rest.contains("\"stop\":true"),
        "the replaced generation ran to its end"
    );
    assert_eq!(resume(&srv, None, "again", 0).await, (200, second));
    srv.stop().await;
}
