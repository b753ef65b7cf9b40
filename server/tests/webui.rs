//! The web page's HTTP side: the page is served without a key and needs nothing from
//! elsewhere, `GET /cache/conversations` lists a finished chat with its tokens, bytes and
//! figures after a restart and a continued chat keeps its id, and an API key never sees,
//! nor deletes, another key's conversations. (`server/tests/clients/webui_browser.py` drives
//! the page itself in a browser.)

mod common;

use common::{Env, TestServer};
use reqwest::Method;
use serde_json::{json, Value};

const KEYS: [&str; 4] = ["--api-key", "alpha", "--api-key", "beta"];

/// A streamed chat turn of `messages` as `key` (none: no header): the reply's text and the
/// last chunk's `timings`.
async fn chat(srv: &TestServer, key: Option<&str>, messages: &Value) -> (String, Value) {
    let body = json!({ "messages": messages, "stream": true, "max_tokens": 8, "temperature": 0 });
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
    let mut reply = String::new();
    let mut timings = Value::Null;
    for data in text.split("\n\n").filter_map(|e| e.strip_prefix("data: ")) {
        if data == "[DONE]" {
            continue;
        }
        let chunk: Value = serde_json::from_str(data).unwrap();
        if let Some(c) = chunk["choices"][0]["delta"]["content"].as_str() {
            reply.push_str(c);
        }
        if chunk.get("timings").is_some() {
            timings = chunk["timings"].clone();
        }
    }
    assert!(timings.is_object(), "the stream ends with timings: {text}");
    (reply, timings)
}

/// The conversations `key` sees.
async fn conversations(srv: &TestServer, key: Option<&str>) -> Vec<Value> {
    let (status, body) = match key {
        Some(k) => {
            srv.send_as(k, Method::GET, "/cache/conversations", None)
                .await
        }
        None => srv.get("/cache/conversations").await,
    };
    assert_eq!(status, 200, "{body}");
    body["conversations"].as_array().unwrap().clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_is_public_and_self_contained() {
    let env = Env::new();
    let srv = env.start(&KEYS).await;
    let resp = srv
        .client
        .get(format!("{}/", srv.url))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let ctype = resp.headers()["content-type"].to_str().unwrap().to_owned();
    assert!(ctype.starts_with("text/html"), "{ctype}");
    let page = resp.text().await.unwrap();
    for needed in [
        "<script>",
        "<style>",
        "/v1/chat/completions",
        "/cache/conversations",
        "aria-live",
        "Authorization",
    ] {
        assert!(page.contains(needed), "the page has {needed}");
    }
    // Nothing is loaded from elsewhere: no script, style or image from another origin.
    for outside in ["src=\"http", "href=\"http", "@import", "url(http"] {
        assert!(!page.contains(outside), "the page loads {outside}…");
    }
    // The list is not public.
    let (status, _) = srv.get("/cache/conversations").await;
    assert_eq!(status, 401);
    srv.stop().await;

    // Under a prefix the page is there too; with --no-ui it is not.
    let srv = env.start(&["--api-prefix", "/llm"]).await;
    assert_eq!(srv.get("/llm").await.0, 200);
    srv.stop().await;
    let srv = env.start(&["--no-ui"]).await;
    assert_eq!(srv.get("/").await.0, 404);
    assert_eq!(srv.get("/cache/conversations").await.0, 200);
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_chat_is_listed_after_a_restart_and_continues() {
    let env = Env::new();
    let srv = env.start(&[]).await;
    assert!(conversations(&srv, None).await.is_empty());
    let first = json!([{ "role": "user", "content": "tell me about disks and caches, please" }]);
    let (reply, _) = chat(&srv, None, &first).await;
    srv.stop().await;

    let srv = env.start(&[]).await;
    let listed = conversations(&srv, None).await;
    assert_eq!(listed.len(), 1, "{listed:?}");
    let c = &listed[0];
    let id = c["id"].as_str().unwrap().to_owned();
    assert_eq!(c["title"], "tell me about disks and caches, please");
    assert_eq!(c["messages"].as_array().unwrap().len(), 2);
    assert_eq!(c["messages"][1]["role"], "assistant");
    assert_eq!(c["messages"][1]["content"], reply.as_str());
    let tokens = c["tokens"].as_u64().unwrap();
    assert!(tokens > 8, "{c}");
    assert!(c["bytes"].as_u64().unwrap() > tokens, "{c}");
    assert!(c["last_used_unix"].as_u64().unwrap() >= c["created_unix"].as_u64().unwrap());

    // Continued as the page continues it: the messages it listed, then a new one.
    let mut next = c["messages"].as_array().unwrap().clone();
    next.push(json!({ "role": "user", "content": "and more?" }));
    let (_, timings) = chat(&srv, None, &Value::Array(next)).await;
    let cache_n = timings["cache_n"].as_u64().unwrap();
    // All of the earlier turn but its last sampled token (never evaluated) comes back from
    // the cache directory after the restart.
    assert!(
        cache_n + 1 >= tokens,
        "the earlier turn ({tokens} tokens) comes from the cache after the restart: {timings}"
    );
    let listed = conversations(&srv, None).await;
    assert_eq!(
        listed.len(),
        1,
        "the same conversation, continued: {listed:?}"
    );
    assert_eq!(listed[0]["id"], id.as_str());
    assert_eq!(listed[0]["messages"].as_array().unwrap().len(), 4);
    assert_eq!(listed[0]["timings"]["cache_n"].as_u64(), Some(cache_n));
    assert!(listed[0]["tokens"].as_u64().unwrap() > tokens);

    // The cache panel's figures.
    let (status, cache) = srv.get("/cache").await;
    assert_eq!(status, 200, "{cache}");
    assert!(cache["evictions"]["ram_blocks"].is_u64(), "{cache}");
    assert!(cache["evictions"]["disk_blocks"].is_u64(), "{cache}");
    assert!(cache["remote"].is_null(), "no remote tier: {cache}");
    assert!(cache["prompt_tokens"]["from_store"].as_u64().unwrap() >= cache_n);

    // Taken off the list, it is gone there (after a restart too).
    let (status, body) = srv
        .send_as(
            "",
            Method::DELETE,
            &format!("/cache/conversations/{id}"),
            None,
        )
        .await;
    assert_eq!(status, 200, "{body}");
    srv.stop().await;
    let srv = env.start(&[]).await;
    assert!(conversations(&srv, None).await.is_empty());
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_never_sees_another_keys_conversations() {
    let env = Env::new();
    let srv = env.start(&KEYS).await;
    let messages = json!([{ "role": "user", "content": "a secret of alpha's" }]);
    chat(&srv, Some("alpha"), &messages).await;
    let mine = conversations(&srv, Some("alpha")).await;
    assert_eq!(mine.len(), 1);
    assert!(conversations(&srv, Some("beta")).await.is_empty());
    let id = mine[0]["id"].as_str().unwrap().to_owned();
    let path = format!("/cache/conversations/{id}");
    let (status, _) = srv.send_as("beta", Method::DELETE, &path, None).await;
    assert_eq!(status, 404, "beta cannot delete alpha's conversation");

    // The same words from beta start beta's own conversation.
    chat(&srv, Some("beta"), &messages).await;
    let theirs = conversations(&srv, Some("beta")).await;
    assert_eq!(theirs.len(), 1);
    assert_ne!(theirs[0]["id"], id.as_str());
    srv.stop().await;

    // After a restart, still apart.
    let srv = env.start(&KEYS).await;
    let mine = conversations(&srv, Some("alpha")).await;
    assert_eq!(mine.len(), 1);
    assert_eq!(mine[0]["id"], id.as_str());
    assert_eq!(conversations(&srv, Some("beta")).await.len(), 1);
    let (status, _) = srv.send_as("alpha", Method::DELETE, &path, None).await;
    assert_eq!(status, 200);
    assert!(conversations(&srv, Some("alpha")).await.is_empty());
    assert_eq!(conversations(&srv, Some("beta")).await.len(), 1);
    srv.stop().await;
}
