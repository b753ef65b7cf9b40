//! Beyond RAM (`--kv-ram`) on the real model (SmolLM2-135M-Instruct): conversations longer
//! than the KV pool's RAM budget are answered with the greedy text a server without a budget
//! gives, alone and two at once, their pages read from disk (`/metrics` says so); continued
//! after a restart, they start from the cache; and a generation that fills its context under
//! a budget shifts it and goes on.
//!
//! SmolLM2's f16 KV is 23,040 bytes a token, so a 64-token page is 1.47 MB: `--kv-ram 4MiB`
//! keeps the engine's least (a batch's 8 pages and one more, 13 MB) and a 2,000-token prompt
//! (32 pages) spills most of its pages.

mod common;

use std::path::{Path, PathBuf};

use common::TestServer;
use serde_json::{json, Value};

fn real_model() -> Option<PathBuf> {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if !path.is_file() {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must run the real-model tests"
        );
        eprintln!("skipped: the real model is absent (cargo xtask fetch-model)");
        return None;
    }
    Some(path)
}

/// A server on the real model with `kv_ram` as its budget: two slots over one 4,096-token
/// context.
async fn server(model: &Path, cache: &Path, kv_ram: &str) -> TestServer {
    let argv = [
        "-c",
        "4096",
        "-np",
        "2",
        "--kv-unified",
        "-t",
        "2",
        "--metrics",
        "--kv-ram",
        kv_ram,
    ];
    common::start_on(model, cache, &argv).await
}

/// A long document of numbered notes on `topic` (19 tokens a note), whose next words the
/// model is sure of: greedy replies to it do not turn on the last bits of a logit, which
/// differ with what a prompt was batched with (the batch-invariant mode, which would make
/// them the same bits, takes over a minute for each of these prompts on two cores).
fn document(topic: &str, notes: usize) -> String {
    let things = [
        "lamps", "boats", "maps", "bells", "coins", "kites", "jars", "nets",
    ];
    let places = ["harbor", "mill", "tower", "market", "orchard", "bridge"];
    let mut text = format!("Notes on the {topic}.\n");
    for i in 0..notes {
        text.push_str(&format!(
            "{i}. In the {} of the {topic}, {} {} were counted.\n",
            places[i % places.len()],
            i * 7 % 97 + 3,
            things[i * 3 % things.len()],
        ));
    }
    text
}

/// A greedy `/completion` of `prompt`.
fn completion(prompt: &str, n_predict: u64) -> Value {
    json!({
        "prompt": prompt,
        "n_predict": n_predict,
        "temperature": 0,
        "ignore_eos": true,
    })
}

/// Posts `body` to `/completion`; the answer, checked to be a success.
async fn complete(srv: &TestServer, body: &Value) -> Value {
    let (status, answer) = srv.post("/completion", body).await;
    assert_eq!(status, 200, "{answer}");
    answer
}

fn text(answer: &Value) -> &str {
    answer["content"].as_str().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn conversations_past_the_budget_answer_as_without_one_alone_at_once_and_restarted() {
    let Some(model) = real_model() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let harbor = document("harbor town", 110);
    let continued = format!("{harbor}Which things were counted in the mill?");
    let bodies = [
        completion(&harbor, 12),
        completion(&document("valley farms", 68), 12),
        completion(&document("forest roads", 70), 12),
        completion(&continued, 12),
    ];

    // The texts a server without a budget gives, each request alone.
    let reference = server(&model, &dir.path().join("reference"), "0").await;
    let mut expected = Vec::new();
    for b in &bodies {
        expected.push(text(&complete(&reference, b).await).to_owned());
    }
    assert_eq!(common::metric(&reference.url, "kv_pages_spilled").await, 0);
    assert_eq!(
        common::metric(&reference.url, "kv_ram_budget_bytes").await,
        0
    );
    reference.stop().await;

    let cache = dir.path().join("cache");
    let srv = server(&model, &cache, "4MiB").await;
    assert_eq!(
        common::metric(&srv.url, "kv_ram_budget_bytes").await,
        4 << 20
    );
    // Alone: the prompt is longer than the budget holds.
    let alone = complete(&srv, &bodies[0]).await;
    let n_prompt = alone["tokens_evaluated"].as_u64().unwrap();
    assert!(n_prompt > 2000, "{n_prompt} prompt tokens");
    assert_eq!(text(&alone), expected[0]);
    let spilled = common::metric(&srv.url, "kv_pages_spilled").await;
    let written = common::metric(&srv.url, "kv_spill_pages_written_total").await;
    let read = common::metric(&srv.url, "kv_spill_bytes_read_total").await;
    let resident = common::metric(&srv.url, "kv_pages_resident").await;
    assert!(
        spilled > 20 && written >= spilled,
        "{spilled} spilled, {written} written"
    );
    assert!(read > 0, "{read} bytes read from disk");
    assert!(resident <= 10, "{resident} pages resident");

    // Two at once, with different long prompts.
    let (a, b) = tokio::join!(complete(&srv, &bodies[1]), complete(&srv, &bodies[2]));
    assert_eq!(text(&a), expected[1]);
    assert_eq!(text(&b), expected[2]);
    assert!(common::metric(&srv.url, "kv_spill_bytes_read_total").await > read);
    srv.stop().await;

    // Restarted on the same cache directory: the conversation goes on from the stored prompt.
    let srv = server(&model, &cache, "4MiB").await;
    let next = complete(&srv, &bodies[3]).await;
    let cache_n = next["timings"]["cache_n"].as_u64().unwrap();
    assert!(
        cache_n >= n_prompt - 1,
        "{cache_n} tokens from the cache, the old prompt had {n_prompt}"
    );
    assert_eq!(text(&next), expected[3]);
    assert!(common::metric(&srv.url, "kv_pages_spilled").await > 20);
    srv.stop().await;
}

// The scheduler takes the first prompt's finished sequence over and cuts it inside page 23,
// which was spilled: the engine brings that page back into the pool before the second
// prompt's rows are written into it (without that, attention read the first prompt's rows
// from its block file and the reply was garbled).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_prompt_that_parts_from_a_spilled_one_inside_a_page_answers_as_without_a_budget() {
    let Some(model) = real_model() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    // The second prompt shares the first 80 notes (1,526 tokens: page 23 and 54 of its
    // rows) with the first, then asks.
    let first = completion(&document("harbor town", 110), 12);
    let second = completion(
        &format!("{}Which things were counted?", document("harbor town", 80)),
        12,
    );
    let mut texts = Vec::new();
    for kv_ram in ["0", "4MiB"] {
        let srv = server(&model, &dir.path().join(kv_ram), kv_ram).await;
        complete(&srv, &first).await;
        let answer = complete(&srv, &second).await;
        let cache_n = answer["timings"]["cache_n"].as_u64().unwrap();
        assert!(
            cache_n > 1500 && cache_n % 64 != 0,
            "{cache_n} from the cache"
        );
        texts.push(text(&answer).to_owned());
        srv.stop().await;
    }
    assert_eq!(texts[1], texts[0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_generation_that_fills_its_context_under_a_budget_shifts_it_and_goes_on() {
    let Some(model) = real_model() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let srv = common::start_on(
        &model,
        &dir.path().join("cache"),
        &[
            "-c",
            "1024",
            "-np",
            "1",
            "-t",
            "2",
            "--metrics",
            "--kv-ram",
            "4MiB",
            "--context-shift",
            "--sleep-idle-seconds",
            "1",
        ],
    )
    .await;
    let body = completion(&document("mountain passes", 48), 200);
    let answer = complete(&srv, &body).await;
    let n_prompt = answer["tokens_evaluated"].as_u64().unwrap();
    assert!(n_prompt + 200 > 1024, "{n_prompt} prompt tokens");
    assert_eq!(answer["timings"]["predicted_n"], 200, "{answer}");
    assert_eq!(answer["truncated"], true, "{answer}");
    let written = common::metric(&srv.url, "kv_spill_pages_written_total").await;
    let read = common::metric(&srv.url, "kv_spill_bytes_read_total").await;
    assert!(
        written > 0 && read > 0,
        "{written} pages spilled, {read} bytes read"
    );

    // Asleep, the context is dropped; the one built on waking spills to the store too, and
    // the counters go on from where they were.
    let t = std::time::Instant::now();
    while srv.get("/props").await.1["is_sleeping"] != true {
        assert!(t.elapsed().as_secs() < 30, "never slept");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let other = complete(&srv, &completion(&document("river fords", 40), 8)).await;
    assert_eq!(other["timings"]["predicted_n"], 8, "{other}");
    assert!(common::metric(&srv.url, "kv_pages_spilled").await > 0);
    assert!(common::metric(&srv.url, "kv_spill_pages_written_total").await > written);
    assert!(common::metric(&srv.url, "kv_spill_bytes_read_total").await > read);
    srv.stop().await;
}
