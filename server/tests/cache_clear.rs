//! `POST /cache/clear` removes exactly its namespace: the key's (and salt's) cached prompts in
//! memory and on disk go, every other namespace's stay.

mod common;

use std::collections::BTreeSet;
use std::path::Path;

use common::{Env, TestServer};
use serde_json::{json, Value};

fn text(i: usize) -> String {
    format!("{i} {}", "abcdefgh".repeat(30))
}

async fn post(srv: &TestServer, path: &str, key: &str, body: Value) -> (u16, Value) {
    let resp = srv
        .client
        .post(format!("{}{path}", srv.url))
        .bearer_auth(key)
        .json(&body)
        .send()
        .await
        .unwrap();
    (resp.status().as_u16(), resp.json().await.unwrap())
}

async fn cache_n(srv: &TestServer, key: &str, salt: Option<&str>, i: usize) -> u64 {
    let mut body = json!({"prompt": text(i), "n_predict": 1});
    if let Some(s) = salt {
        body["cache_salt"] = json!(s);
    }
    let (status, v) = post(srv, "/completion", key, body).await;
    assert_eq!(status, 200, "{v}");
    v["timings"]["cache_n"].as_u64().unwrap()
}

/// The block and manifest files of the cache directory.
fn files(cache: &Path) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for model in std::fs::read_dir(cache.join("models")).unwrap() {
        let model = model.unwrap().path();
        for dir in ["blocks", "manifests"] {
            for f in std::fs::read_dir(model.join(dir)).unwrap() {
                out.insert(format!(
                    "{dir}/{}",
                    f.unwrap().file_name().to_string_lossy()
                ));
            }
        }
    }
    out
}

const KEYS: [&str; 4] = ["--api-key", "alpha", "--api-key", "beta"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clear_removes_exactly_its_namespace() {
    let env = Env::new();
    // Beta's prompts and alpha's salted ones, stored by a first server.
    let srv = env.start(&KEYS).await;
    for i in 0..2 {
        assert_eq!(cache_n(&srv, "beta", None, i).await, 0);
        assert_eq!(cache_n(&srv, "alpha", Some("s"), i).await, 0);
    }
    srv.stop().await;
    let kept = files(&env.cache());

    // Alpha's own prompts, one stored and one only in memory.
    let srv = env.start(&KEYS).await;
    assert_eq!(cache_n(&srv, "alpha", None, 0).await, 0);
    srv.stop().await;
    let srv = env.start(&KEYS).await;
    assert!(cache_n(&srv, "alpha", None, 0).await > 0, "from disk");
    assert_eq!(cache_n(&srv, "alpha", None, 1).await, 0);
    assert!(files(&env.cache()).len() > kept.len());

    let (status, cleared) = post(&srv, "/cache/clear", "alpha", json!({})).await;
    assert_eq!(status, 200, "{cleared}");
    assert!(cleared["blocks"].as_u64().unwrap() > 0, "{cleared}");
    // What alpha (without a salt) stored went, from disk and from the queue to it; every
    // other namespace's file is there.
    assert_eq!(
        files(&env.cache()),
        kept,
        "exactly the other namespaces' files"
    );
    // Alpha's prompts are computed again, in memory and from disk alike; the others are not.
    assert_eq!(cache_n(&srv, "alpha", None, 0).await, 0);
    assert_eq!(cache_n(&srv, "alpha", None, 1).await, 0);
    assert!(cache_n(&srv, "beta", None, 0).await > 0);
    assert!(cache_n(&srv, "alpha", Some("s"), 1).await > 0);
    srv.stop().await;
    // The shared cache has no namespace of its own to clear.
    let srv = env.start(&[]).await;
    let (status, body) = srv.post("/cache/clear", &json!({})).await;
    assert_eq!(status, 400, "{body}");
    srv.stop().await;
}
