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

/// The replies of every prompt, greedy, seeded and seeded under a grammar, and the greedy
/// replies' drafts counted.
async fn replies(srv: &TestServer) -> (Vec<Vec<u64>>, u64, u64) {
    let mut out = Vec::new();
    let (mut n, mut acc) = (0, 0);
    for p in prompts() {
        for (seed, grammar) in [(None, false), (Some(7), false), (Some(9), true)] {
            let mut body = request(&p, 40, seed);
            if grammar {
                body["grammar"] = json!("root ::= [a-e ]+");
            }
            let (tokens, t) = complete(srv, body).await;
            // A grammar may end the reply sooner.
            assert!(tokens.len() <= 40, "n_predict is never passed");
            if !grammar {
                assert_eq!(tokens.len(), 40);
            }
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
            "--metrics",
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
    // `/metrics` counts every request's drafts (the seeded ones too).
    let text = reqwest::get(format!("{}/metrics", srv.url))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let counter = |name: &str| -> u64 {
        let line = format!("llamacpp:spec_decode_num_{name}_total ");
        text.lines()
            .find_map(|l| l.strip_prefix(&line))
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or_else(|| panic!("no {name} counter in {text}")) as u64
    };
    let (drafted, accepted, steps) = (
        counter("draft_tokens"),
        counter("accepted_tokens"),
        counter("drafts"),
    );
    assert!(
        drafted >= n && accepted >= acc && accepted <= drafted,
        "{drafted} {accepted}"
    );
    assert!(steps > 0 && steps <= drafted);
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
        assert_eq!(g, &want[3 * i], "prompt {i}, four at once");
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
        (
            &["--spec-synth-rates", "0.5"],
            "--spec-synth-rates needs drafts",
        ),
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

/// 100 bytes without a repeated 3-gram (the tiny model's tokens are bytes): more than a
/// block, so that the cache stores it.
fn unrepeated() -> String {
    let mut x: u32 = 12345;
    let mut s = String::new();
    while s.len() < 100 {
        x = x.wrapping_mul(1_103_515_245).wrapping_add(12_345);
        let c = char::from(b'!' + ((x >> 16) % 90) as u8);
        s.push(c);
        let b = s.as_bytes();
        let n = b.len();
        if n >= 3 && (0..n - 3).any(|i| b[i..i + 3] == b[n - 3..]) {
            s.pop();
        }
    }
    s
}

/// A prompt without repetition, asked as `key`: the reply's tokens and its drafts.
async fn ask(srv: &TestServer, key: &str) -> (Value, (u64, u64)) {
    let body = json!({"prompt": unrepeated(), "temperature": 0.0, "n_predict": 32,
        "return_tokens": true});
    let (status, r) = srv
        .send_as(key, Method::POST, "/completion", Some(&body))
        .await;
    assert_eq!(status, 200, "{r}");
    (r["tokens"].clone(), drafted(&r["timings"]))
}

/// Key beta gets alpha's reply and drafts only what the prompt drafts alone.
async fn another_key_drafts_alone(srv: &TestServer, want: &Value, alone: (u64, u64)) {
    let (other, other_drafts) = ask(srv, "beta").await;
    assert_eq!(&other, want);
    assert_eq!(
        other_drafts, alone,
        "another key drafts nothing from alpha's history"
    );
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
    another_key_drafts_alone(&srv, &want, alone).await;
    srv.stop().await;
}

/// After a restart on the same cache directory, a key drafts from the conversations it had
/// before (the history is read back from the cached prompts), and another key still does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_drafts_survive_a_restart() {
    let env = Env::new();
    let args = [
        "--api-key",
        "alpha",
        "--api-key",
        "beta",
        "--spec-type",
        "ngram-simple",
    ];
    let fresh = Env::new();
    let baseline = fresh
        .start(&[
            "--no-cache",
            "--api-key",
            "alpha",
            "--spec-type",
            "ngram-simple",
        ])
        .await;
    let (want, alone) = ask(&baseline, ALPHA).await;
    baseline.stop().await;

    let srv = env.start(&args).await;
    let (first, _) = ask(&srv, ALPHA).await;
    assert_eq!(first, want);
    srv.stop().await;

    let srv = env.start(&args).await;
    let (again, by_history) = ask(&srv, ALPHA).await;
    assert_eq!(again, want);
    assert!(
        by_history.1 > alone.1,
        "after a restart the key drafts its earlier reply: {by_history:?} against {alone:?}"
    );
    another_key_drafts_alone(&srv, &want, alone).await;
    srv.stop().await;
}

/// With a draft model, a conversation's draft KV is stored under the draft model's own
/// fingerprint: after a restart the draft model reads its prefix back instead of computing it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_draft_models_prefix_survives_a_restart() {
    let env = Env::new();
    // Another model of the same vocabulary (other weights): another fingerprint, so the
    // draft's blocks are its own, not the target's.
    let draft = env.cache().with_file_name("draft.gguf");
    engine::testing::TinyChatModel {
        n_ff: 64,
        context_length: 4096,
        seed: 99,
        ..engine::testing::TinyChatModel::default()
    }
    .write(&draft)
    .unwrap();
    let model = draft.display().to_string();
    let args = [
        "--metrics",
        "-md",
        model.as_str(),
        "--spec-draft-n-max",
        "4",
    ];
    let body = json!({"prompt": unrepeated(), "temperature": 0.0, "n_predict": 16});
    let restored = |srv: &TestServer| {
        let url = srv.url.clone();
        async move { common::metric(&url, "draft_tokens_from_store_total").await }
    };
    let srv = env.start(&args).await;
    let (status, first) = srv.post("/completion", &body).await;
    assert_eq!(status, 200, "{first}");
    assert!(first["timings"]["draft_n"].as_u64().unwrap() > 0);
    assert_eq!(
        restored(&srv).await,
        0,
        "nothing stored before the first request"
    );
    srv.stop().await;

    let srv = env.start(&args).await;
    let (status, again) = srv.post("/completion", &body).await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["content"], first["content"]);
    assert!(
        restored(&srv).await >= 64,
        "the draft model's first block came from the store"
    );
    srv.stop().await;
}
