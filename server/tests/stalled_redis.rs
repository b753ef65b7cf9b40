//! A Redis that stalls holds up only the requests that wait on it: a chat turn that asks Redis
//! for an earlier conversation's tokens waits off the async workers, and another client's stream
//! goes on meanwhile, even when the server has a single async worker.

mod common;

use std::time::Instant;

use common::{Env, TestServer};
use kvstore::remote::testing::RedisServer;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_redis_leaves_other_streams_flowing() {
    let redis = RedisServer::start();
    let env = Env::new();
    let url = redis.url();
    // The server on a runtime of its own with one async worker (the clients below run on the
    // test's runtime): any blocking call on that worker would stop every stream it serves.
    let server_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let args = [
        "-np",
        "2",
        "--kv-unified",
        "-c",
        "32768",
        "--cache-remote",
        url.as_str(),
        "--cache-remote-timeout",
        "20000",
    ];
    let srv: TestServer = server_rt
        .spawn({
            let model = env.model.clone();
            let cache = env.cache();
            let args: Vec<String> = args.iter().map(|s| (*s).to_owned()).collect();
            async move {
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                common::start_on(&model, &cache, &args).await
            }
        })
        .await
        .unwrap();

    let mut stream = srv.endless_stream(30000).await;

    // Redis holds every client's commands for 3 s from now.
    assert_eq!(
        redis.cli(&["CLIENT", "PAUSE", "3000"]).as_deref(),
        Some("OK")
    );
    // A second turn of a conversation: its prompt's earlier turns are looked up in Redis.
    let sent = Instant::now();
    let turn = tokio::spawn({
        let client = srv.client.clone();
        let url = format!("{}/v1/chat/completions", srv.url);
        async move {
            let resp = client
                .post(url)
                .json(&json!({
                    "messages": [
                        {"role": "user", "content": "hi"},
                        {"role": "assistant", "content": "hello there"},
                        {"role": "user", "content": "and then?"},
                    ],
                    "max_tokens": 2,
                }))
                .send()
                .await
                .unwrap();
            (resp.status().as_u16(), Instant::now())
        }
    });
    let mut arrivals = Vec::new();
    while !turn.is_finished() {
        assert!(stream.chunk().await.unwrap().is_some());
        arrivals.push(Instant::now());
    }
    let (status, done) = turn.await.unwrap();
    assert_eq!(status, 200);
    // The turn waited for Redis (it could not answer before the pause ended) ...
    let waited = done - sent;
    assert!(waited.as_millis() >= 2500, "the turn took {waited:?}");
    // ... and the stream went on through the middle of that wait.
    let (from, to) = (sent + waited / 4, sent + waited * 3 / 4);
    let middle = arrivals.iter().filter(|&&t| t > from && t < to).count();
    assert!(
        middle > 0,
        "no chunk of the stream arrived while the turn waited on Redis ({} in all)",
        arrivals.len()
    );
    drop(stream);
    drop(srv);
    server_rt.shutdown_background();
}
