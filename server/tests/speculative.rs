//! Speculative decoding through the server: replies are the same tokens with and without it
//! (n-gram drafts, a draft model, greedy and seeded sampling, several requests at once), the
//! drafts are counted in `timings`, a draft never runs past `n_predict` or the context, and
//! drafts from earlier conversations come only from the same API key's.

mod common;

use common::{Env, TestServer};
use reqwest::Method;
use serde_json::{json, Value};

/// Prompts with repetition in them (the tiny model's tokens are bytes), so that n-gram drafts
/// find matches.
fn prompts() -> Vec<String> {
    (0..6)
        .map(|i| {
            let unit = [
                "abcde",
                "the cat sat ",
                "xyz-",
                "0123456789",
                "lorem ipsum ",
                "ba",
            ][i];
            format!("{i}: {}", unit.repeat(4 + i))
        })
        .collect()
}

/// The reply's tokens and `timings`.
async fn complete(srv: &TestServer, body: Value) -> (Vec<u64>, Value) {
    let (status, r) = srv.post("/completion", &body).await;
    assert_eq!(status, 200, "{r}");
    let tokens = r["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap())
        .collect();
    (tokens, r["timings"].clone())
}

fn request(prompt: &str, n: usize, seed: Option<u64>) -> Value {
    let mut body = json!({"prompt": prompt, "n_predict": n, "return_tokens": true,
        "cache_prompt": false});
    match seed {
        None => body["temperature"] = json!(0.0),
        Some(s) => {
            body["temperature"] = json!(1.0);
            body["seed"] = json!(s);
        }
    }
    body
}

fn drafted(t: &Value) -> (u64, u64) {
    (
        t["draft_n"].as_u64().unwrap_or(0),
        t["draft_n_accepted"].as_u64().unwrap_or(0),
    )
}

/// The replies of every prompt, greedy and seeded, and the greedy replies' drafts counted.
async fn replies(srv: &TestServer) -> (Vec<Vec<u64>>, u64, u64) {
    let mut out = Vec::new();
    let (mut n, mut acc) = (0, 0);
    for p in prompts() {
        for seed in [None, Some(7)] {
            let (tokens, t) = complete(srv, request(&p, 40, seed)).await;
            assert_eq!(tokens.len(), 40, "n_predict is never passed");
            assert_eq!(t["predicted_n"], 40);
            if seed.is_none() {
                let (d, a) = drafted(&t);
                n += d;
                acc += a;
            }
            out.push(tokens);
        }
    }
    (out, n, acc)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drafts_never_change_a_reply() {
    let env = Env::new();
    let srv = env.start(&["--no-cache"]).await;
    let (want, n, _) = replies(&srv).await;
    assert_eq!(n, 0, "no drafts without speculation");
    srv.stop().await;

    let srv = env
        .start(&[
            "--no-cache",
            "--spec-type",
            "ngram-simple",
            "--spec-ngram-min-match",
            "2",
        ])
        .await;
    let (got, n, acc) = replies(&srv).await;
    assert_eq!(got, want, "n-gram drafts");
    assert!(n > 0, "the repeated prompts give n-gram drafts");
    assert!(acc <= n);
    srv.stop().await;

    let model = env.model.display().to_string();
    let srv = env
        .start(&["--no-cache", "-md", &model, "--spec-draft-n-max", "4"])
        .await;
    let (got, n, acc) = replies(&srv).await;
    assert_eq!(got, want, "the target as its own draft model");
    // Greedy drafts of the target itself are all taken.
    assert!(acc == n && n > 0, "{acc} of {n} accepted");
    srv.stop().await;

    // Four at once over two slots, beside each other in every batch.
    let srv = env
        .start(&[
            "--no-cache",
            "-np",
            "2",
            "--spec-type",
            "ngram-simple,draft-simple",
            "-md",
            &model,
        ])
        .await;
    let all = prompts();
    let got = tokio::join!(
        complete(&srv, request(&all[0], 40, None)),
        complete(&srv, request(&all[1], 40, None)),
        complete(&srv, request(&all[2], 40, None)),
        complete(&srv, request(&all[3], 40, None)),
    );
    let got = [got.0 .0, got.1 .0, got.2 .0, got.3 .0];
    for (i, g) in got.iter().enumerate() {
        assert_eq!(g, &want[2 * i], "prompt {i}, four at once");
    }
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draft_stays_inside_the_context() {
    let env = Env::new();
    // 512 positions, a 480-byte prompt: generation runs into the end of the context.
    let srv = env
        .start(&["--no-cache", "--spec-type", "ngram-simple"])
        .await;
    let prompt = "abcdefgh".repeat(60);
    let (status, r) = srv
        .post(
            "/completion",
            &json!({"prompt": prompt, "temperature": 0.0, "n_predict": 100}),
        )
        .await;
    assert_eq!(status, 200, "{r}");
    let n_prompt =
        r["timings"]["prompt_n"].as_u64().unwrap() + r["timings"]["cache_n"].as_u64().unwrap();
    let n = r["timings"]["predicted_n"].as_u64().unwrap();
    assert!(n_prompt + n <= 512, "{n_prompt} + {n}");
    assert_eq!(r["stop_type"], "limit");
    // Unknown kinds and draft heads this server lacks are refused by name at start.
    for (argv, what) in [
        (&["--spec-type", "draft-eagle3"][..], "draft-eagle3"),
        (&["--spec-type", "ngram-fancy"], "ngram-fancy"),
        (&["--spec-type", "draft-simple"], "-md"),
    ] {
        let mut full = vec!["llama-hdd-server", "-m", "x.gguf"];
        full.extend_from_slice(argv);
        let e = server::Args::parse_from_argv(full)
            .unwrap()
            .check()
            .err()
            .unwrap();
        assert!(e.to_string().contains(what), "{argv:?}: {e}");
    }
    srv.stop().await;
}

const ALPHA: &str = "alpha";

/// A prompt without repetition, asked as `key`: the reply's tokens and its drafts.
async fn ask(srv: &TestServer, key: &str) -> (Value, (u64, u64)) {
    let body = json!({"prompt": "Qk7!vR2#mT9$wL4", "temperature": 0.0, "n_predict": 32,
        "return_tokens": true});
    let (status, r) = srv
        .send_as(key, Method::POST, "/completion", Some(&body))
        .await;
    assert_eq!(status, 200, "{r}");
    (r["tokens"].clone(), drafted(&r["timings"]))
}

/// A conversation's reply drafts its repeat for the same key, never for another key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_drafts_stay_with_their_key() {
    let env = Env::new();
    let args = [
        "--no-cache",
        "--api-key",
        "alpha",
        "--api-key",
        "beta",
        "--spec-type",
        "ngram-simple",
    ];
    // What the prompt drafts from its own context alone, on a server with no history.
    let fresh = env.start(&args).await;
    let (want, alone) = ask(&fresh, ALPHA).await;
    fresh.stop().await;

    let srv = env.start(&args).await;
    let (first, _) = ask(&srv, ALPHA).await;
    assert_eq!(first, want);
    let (again, by_history) = ask(&srv, ALPHA).await;
    assert_eq!(again, want, "drafts from history change nothing");
    assert!(
        by_history.1 > alone.1,
        "the same key drafts its earlier reply: {by_history:?} against {alone:?}"
    );
    let (other, other_drafts) = ask(&srv, "beta").await;
    assert_eq!(other, want);
    assert_eq!(
        other_drafts, alone,
        "another key drafts nothing from alpha's history"
    );
    srv.stop().await;
}
