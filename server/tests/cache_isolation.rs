//! Clients' cached prompts are kept apart: each API key has a cache of its own, and a
//! request's `cache_salt` separates further, in memory, on disk and across restarts; the same
//! key and salt reuse as before. `--cache-isolation none` shares one cache.

mod common;

use std::collections::BTreeSet;
use std::path::Path;

use common::{Env, TestServer};
use serde_json::{json, Value};

/// A chat whose prompt spans several 64-token blocks.
fn long_chat(salt: Option<&str>) -> Value {
    let mut body = json!({
        "messages": [
            {"role": "system", "content": "abcdefgh ".repeat(30)},
            {"role": "user", "content": "What comes next?"}
        ],
        "max_tokens": 6,
        "temperature": 0,
    });
    if let Some(s) = salt {
        body["cache_salt"] = json!(s);
    }
    body
}

/// Sends the long chat with API key `key` and `salt`; returns (prompt tokens, cached tokens,
/// the reply).
async fn ask(srv: &TestServer, key: &str, salt: Option<&str>) -> (u64, u64, Value) {
    let resp = srv
        .client
        .post(format!("{}/v1/chat/completions", srv.url))
        .bearer_auth(key)
        .json(&long_chat(salt))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let v: Value = resp.json().await.unwrap();
    let prompt = v["usage"]["prompt_tokens"].as_u64().unwrap();
    let cached = v["timings"]["cache_n"].as_u64().unwrap();
    (prompt, cached, v["choices"].clone())
}

/// The block files of the cache directory.
fn block_files(cache: &Path) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for model in std::fs::read_dir(cache.join("models")).unwrap() {
        for f in std::fs::read_dir(model.unwrap().path().join("blocks")).unwrap() {
            out.insert(f.unwrap().file_name().to_string_lossy().into_owned());
        }
    }
    out
}

const KEYS: [&str; 4] = ["--api-key", "alpha", "--api-key", "beta"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_keys_or_two_salts_share_no_block_and_each_reuses_its_own() {
    let env = Env::new();
    let srv = env.start(&KEYS).await;
    let (n, cached, reply) = ask(&srv, "alpha", None).await;
    assert!(n > 3 * 64, "the prompt should span blocks: {n}");
    assert_eq!(cached, 0);
    let (_, cached, again) = ask(&srv, "alpha", None).await;
    assert_eq!(cached, n - 1, "the same key reuses its prompt");
    assert_eq!(again, reply);
    srv.stop().await;
    let first = block_files(&env.cache());
    assert!(first.len() >= 3, "{first:?}");

    // Another key, same prompt: every token computed, every block written again.
    let srv = env.start(&KEYS).await;
    let (_, cached, other) = ask(&srv, "beta", None).await;
    assert_eq!(cached, 0, "another key's cache is not used");
    assert_eq!(other, reply, "the same computation");
    srv.stop().await;
    let second = block_files(&env.cache());
    assert_eq!(
        second.difference(&first).count(),
        first.len(),
        "the second key's blocks are its own"
    );

    // The first key with a salt: computed again, written again.
    let srv = env.start(&KEYS).await;
    let (_, cached, _) = ask(&srv, "alpha", Some("tenant-1")).await;
    assert_eq!(cached, 0, "a salt separates within a key");
    srv.stop().await;
    let third = block_files(&env.cache());
    assert_eq!(third.difference(&second).count(), first.len());

    // After a restart each namespace finds its own prompt on disk; a new salt does not.
    let srv = env.start(&KEYS).await;
    for (key, salt) in [("alpha", None), ("beta", None), ("alpha", Some("tenant-1"))] {
        let (_, cached, got) = ask(&srv, key, salt).await;
        assert_eq!(
            cached,
            n - 1,
            "{key} {salt:?} reuses its own blocks from disk"
        );
        assert_eq!(got, reply);
    }
    let (_, cached, _) = ask(&srv, "alpha", Some("tenant-2")).await;
    assert_eq!(cached, 0);
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn isolation_none_shares_one_cache_and_salt_mode_ignores_keys() {
    let env = Env::new();
    let mut none = KEYS.to_vec();
    none.extend(["--cache-isolation", "none"]);
    let srv = env.start(&none).await;
    let (n, cached, _) = ask(&srv, "alpha", None).await;
    assert_eq!(cached, 0);
    let (_, cached, _) = ask(&srv, "beta", Some("ignored")).await;
    assert_eq!(cached, n - 1, "one cache for every client");
    srv.stop().await;

    let mut salt = KEYS.to_vec();
    salt.extend(["--cache-isolation", "salt"]);
    let srv = env.start(&salt).await;
    let (_, cached, _) = ask(&srv, "beta", None).await;
    assert_eq!(cached, n - 1, "keys do not separate: the shared cache");
    let (_, cached, _) = ask(&srv, "beta", Some("s")).await;
    assert_eq!(cached, 0, "a salt does");
    let (_, cached, _) = ask(&srv, "alpha", Some("s")).await;
    assert_eq!(cached, n - 1, "the same salt under another key shares");
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_salt_is_refused() {
    let env = Env::new();
    let srv = env.start(&[]).await;
    let (status, body) = srv.post("/v1/chat/completions", &long_chat(Some(""))).await;
    assert_eq!(status, 400, "{body}");
    srv.stop().await;
}
