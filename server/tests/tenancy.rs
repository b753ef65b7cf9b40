//! Every request is scoped to its API key: under `--api-key A --api-key B`, B neither sees,
//! deletes, replaces nor continues A's pins, stored responses or slots, and a `/cache/clear`
//! of a namespace both keys reach (a shared `cache_salt` under `--cache-isolation salt`) leaves
//! the other key's pins and responses. Another key's id answers as one that does not exist.

mod common;

use common::{Env, TestServer};
use reqwest::Method;
use serde_json::{json, Value};

const KEYS: [&str; 4] = ["--api-key", "alpha", "--api-key", "beta"];
const A: &str = "alpha";
const B: &str = "beta";

/// A prompt of `len` bytes after `tag` (the tiny model's tokens are bytes).
fn prompt(tag: &str, len: usize) -> String {
    format!("{tag} {}", "abcdefgh".repeat(len / 8))
}

async fn post(srv: &TestServer, key: &str, path: &str, body: Value) -> (u16, Value) {
    srv.send_as(key, Method::POST, path, Some(&body)).await
}

/// The pins `key` sees in `GET /cache`, as (id, tokens), sorted.
async fn pins(srv: &TestServer, key: &str) -> Vec<(String, u64)> {
    let (status, body) = srv.send_as(key, Method::GET, "/cache", None).await;
    assert_eq!(status, 200, "{body}");
    let mut out: Vec<_> = body["pins"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["id"].as_str().unwrap().to_owned(),
                p["tokens"].as_u64().unwrap(),
            )
        })
        .collect();
    out.sort();
    out
}

/// Pins `text` for `key` under `id`; the tokens pinned.
async fn pin(srv: &TestServer, key: &str, text: &str, id: &str, salt: Option<&str>) -> u64 {
    let mut body = json!({"prompt": text, "id": id});
    if let Some(s) = salt {
        body["cache_salt"] = json!(s);
    }
    let (status, pinned) = post(srv, key, "/cache/pin", body).await;
    assert_eq!(status, 200, "{pinned}");
    assert_eq!(pinned["id"], id);
    pinned["tokens"].as_u64().unwrap()
}

/// The error of a 404 answer, checked to be one.
fn not_found((status, body): (u16, Value)) -> Value {
    assert_eq!(status, 404, "{body}");
    body["error"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pins_are_seen_deleted_and_replaced_only_by_their_key() {
    let env = Env::new();
    let srv = env.start(&KEYS).await;
    let a_tokens = pin(&srv, A, &prompt("alpha", 240), "x", None).await;
    assert_eq!(a_tokens, 192);
    assert_eq!(pins(&srv, B).await, vec![], "B sees none of A's pins");

    // A's pin answers B as one that does not exist.
    let theirs = not_found(srv.send_as(B, Method::DELETE, "/cache/pin/x", None).await);
    let nothing = not_found(srv.send_as(B, Method::DELETE, "/cache/pin/y", None).await);
    assert_eq!(theirs["type"], nothing["type"]);
    assert_eq!(
        theirs["message"]
            .as_str()
            .unwrap()
            .replace("\"x\"", "\"y\""),
        nothing["message"].as_str().unwrap()
    );

    // B's own pin "x" is another pin: A's stays as it was.
    let b_tokens = pin(&srv, B, &prompt("beta", 160), "x", None).await;
    assert_eq!(b_tokens, 128);
    assert_eq!(pins(&srv, A).await, vec![("x".to_owned(), a_tokens)]);
    assert_eq!(pins(&srv, B).await, vec![("x".to_owned(), b_tokens)]);
    let (status, gone) = srv.send_as(B, Method::DELETE, "/cache/pin/x", None).await;
    assert_eq!(status, 200, "{gone}");
    assert_eq!(pins(&srv, A).await, vec![("x".to_owned(), a_tokens)]);
    assert_eq!(pins(&srv, B).await, vec![]);
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stored_responses_are_read_continued_and_deleted_only_by_their_key() {
    let env = Env::new();
    let srv = env.start(&KEYS).await;
    let ask = |input: &str| json!({"input": input, "max_output_tokens": 4, "temperature": 0});
    let (status, mine) = post(&srv, A, "/v1/responses", ask("My PIN is 4242.")).await;
    assert_eq!(status, 200, "{mine}");
    let id = mine["id"].as_str().unwrap().to_owned();
    let path = format!("/v1/responses/{id}");

    let theirs = not_found(srv.send_as(B, Method::GET, &path, None).await);
    let absent = "/v1/responses/resp_doesnotexist";
    let nothing = not_found(srv.send_as(B, Method::GET, absent, None).await);
    assert_eq!(
        theirs["message"].as_str().unwrap().replace(&id, "X"),
        nothing["message"]
            .as_str()
            .unwrap()
            .replace("resp_doesnotexist", "X")
    );
    let mut follow = ask("What is my PIN?");
    follow["previous_response_id"] = json!(id);
    not_found(post(&srv, B, "/v1/responses", follow.clone()).await);
    not_found(srv.send_as(B, Method::DELETE, &path, None).await);

    // Still A's, whole.
    let (status, again) = srv.send_as(A, Method::GET, &path, None).await;
    assert_eq!((status, &again), (200, &mine));
    let (status, next) = post(&srv, A, "/v1/responses", follow).await;
    assert_eq!(status, 200, "{next}");

    // A response stored by an older version names no key: with keys it is nobody's.
    let legacy = json!({
        "response": {"id": "resp_legacy", "object": "response", "output": []},
        "conversation": [],
    });
    let file = env.cache().join("responses").join("resp_legacy.json");
    std::fs::write(&file, legacy.to_string()).unwrap();
    not_found(
        srv.send_as(A, Method::GET, "/v1/responses/resp_legacy", None)
            .await,
    );
    srv.stop().await;
    let srv = env.start(&[]).await;
    let (status, old) = srv.get("/v1/responses/resp_legacy").await;
    assert_eq!((status, &old), (200, &legacy["response"]));
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slots_are_saved_restored_and_erased_only_by_their_key() {
    let env = Env::new();
    let mut argv = vec!["-np", "2"];
    argv.extend_from_slice(&KEYS);
    let srv = env.start(&argv).await;
    let run = |key: &'static str, text: String, slot: usize| {
        let body = json!({"prompt": text, "n_predict": 4, "temperature": 0, "id_slot": slot});
        let srv = &srv;
        async move {
            let (status, done) = post(srv, key, "/completion", body).await;
            assert_eq!(status, 200, "{done}");
        }
    };
    let save = |slot: usize, name: &str| {
        (
            format!("/slots/{slot}?action=save"),
            json!({"filename": name}),
        )
    };
    run(A, prompt("alpha", 160), 0).await;
    for (key, seen) in [(A, true), (B, false)] {
        let (status, slots) = srv.send_as(key, Method::GET, "/slots", None).await;
        assert_eq!(status, 200, "{slots}");
        assert_eq!(slots[0]["n_past"].as_u64().unwrap() > 0, seen, "{slots}");
    }

    // B can neither save nor erase A's conversation: slot 0 answers B as an empty slot does.
    let (path, body) = save(0, "stolen");
    let (status, theirs) = post(&srv, B, &path, body).await;
    let (path, body) = save(1, "stolen");
    let (empty_status, empty) = post(&srv, B, &path, body).await;
    assert_eq!((status, empty_status), (400, 400), "{theirs} {empty}");
    assert_eq!(
        theirs["error"]["message"]
            .as_str()
            .unwrap()
            .replace("slot 0", "slot 1"),
        empty["error"]["message"].as_str().unwrap()
    );
    let (status, erased) = post(&srv, B, "/slots/0?action=erase", json!({})).await;
    assert_eq!((status, &erased["n_erased"]), (200, &json!(0)), "{erased}");

    let (path, body) = save(0, "mine");
    let (status, a_saved) = post(&srv, A, &path, body).await;
    assert_eq!(status, 200, "{a_saved}");
    assert_eq!(a_saved["filename"], "mine");
    let a_n = a_saved["n_saved"].as_u64().unwrap();
    assert!(a_n > 160, "{a_saved}");

    // A's file is not B's to restore: it answers as a name that does not exist.
    let restore = |name: &str| json!({"filename": name});
    let (status, theirs) = post(&srv, B, "/slots/1?action=restore", restore("mine")).await;
    let (empty_status, empty) = post(&srv, B, "/slots/1?action=restore", restore("none")).await;
    assert_eq!((status, empty_status), (400, 400), "{theirs} {empty}");
    assert_eq!(
        theirs["error"]["message"]
            .as_str()
            .unwrap()
            .replace("mine", "none"),
        empty["error"]["message"].as_str().unwrap()
    );

    // B's own "mine" is another file.
    run(B, prompt("beta", 80), 1).await;
    let (path, body) = save(1, "mine");
    let (status, b_saved) = post(&srv, B, &path, body).await;
    assert_eq!(status, 200, "{b_saved}");
    let b_n = b_saved["n_saved"].as_u64().unwrap();
    assert!(b_n < a_n, "{b_saved}");
    for (key, n) in [(A, a_n), (B, b_n)] {
        let (status, back) = post(&srv, key, "/slots/1?action=restore", restore("mine")).await;
        assert_eq!((status, &back["n_restored"]), (200, &json!(n)), "{back}");
    }
    // Slot 1 holds B's restored conversation now, not A's.
    let (status, erased) = post(&srv, A, "/slots/1?action=erase", json!({})).await;
    assert_eq!((status, &erased["n_erased"]), (200, &json!(0)), "{erased}");
    let (status, erased) = post(&srv, B, "/slots/1?action=erase", json!({})).await;
    assert_eq!(
        (status, &erased["n_erased"]),
        (200, &json!(b_n)),
        "{erased}"
    );
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clearing_a_shared_salt_leaves_the_other_keys_pins_and_responses() {
    let env = Env::new();
    let mut argv = vec!["--cache-isolation", "salt"];
    argv.extend_from_slice(&KEYS);
    let srv = env.start(&argv).await;
    let b_tokens = pin(&srv, B, &prompt("beta", 160), "keep", Some("team")).await;
    let ask = json!({"input": "Remember me.", "max_output_tokens": 4});
    let (status, resp) = post(&srv, B, "/v1/responses", ask).await;
    assert_eq!(status, 200, "{resp}");
    let path = format!("/v1/responses/{}", resp["id"].as_str().unwrap());

    let (status, cleared) = post(&srv, A, "/cache/clear", json!({"cache_salt": "team"})).await;
    assert_eq!(status, 200, "{cleared}");
    assert_eq!(pins(&srv, B).await, vec![("keep".to_owned(), b_tokens)]);
    assert_eq!(pins(&srv, A).await, vec![], "A sees none of B's pins");
    let (status, kept) = srv.send_as(B, Method::GET, &path, None).await;
    assert_eq!(status, 200, "{kept}");
    // B's own clear takes its pin.
    let (status, cleared) = post(&srv, B, "/cache/clear", json!({"cache_salt": "team"})).await;
    assert_eq!(status, 200, "{cleared}");
    assert_eq!(pins(&srv, B).await, vec![]);
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_isolation_every_key_shares_the_pins_as_before() {
    let env = Env::new();
    let mut argv = vec!["--cache-isolation", "none"];
    argv.extend_from_slice(&KEYS);
    let srv = env.start(&argv).await;
    let n = pin(&srv, A, &prompt("alpha", 160), "shared", None).await;
    assert_eq!(pins(&srv, B).await, vec![("shared".to_owned(), n)]);
    let (status, gone) = srv
        .send_as(B, Method::DELETE, "/cache/pin/shared", None)
        .await;
    assert_eq!(status, 200, "{gone}");
    assert_eq!(pins(&srv, A).await, vec![]);
    srv.stop().await;
}
