//! The prompt cache: a repeated prompt starts from the blocks computed before, in the same
//! server and in a new one on the same cache directory (the partly filled last page included),
//! and the text it generates is the same as when everything was computed.

mod common;

use common::Env;
use engine::testing::TinyChatModel;
use serde_json::{json, Value};

/// A chat whose prompt spans several 64-token blocks.
fn long_chat() -> Value {
    json!({
        "messages": [
            {"role": "system", "content": "abcdefgh ".repeat(30)},
            {"role": "user", "content": "What comes next?"}
        ],
        "max_tokens": 10,
        "temperature": 0,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_prompt_is_served_from_the_cache_across_a_restart() {
    let env = Env::new();
    let first = env.start(&[]).await;
    let (status, cold) = first.post("/v1/chat/completions", &long_chat()).await;
    assert_eq!(status, 200, "{cold}");
    let n_prompt = cold["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(
        n_prompt > 3 * 64,
        "the prompt should span blocks: {n_prompt}"
    );
    assert_eq!(cold["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    assert_eq!(cold["timings"]["prompt_n"], n_prompt);

    // Same server: the pages are still resident.
    // The partly filled last page is shared too: only the last token is evaluated again
    // (for its logits).
    let (_, warm) = first.post("/v1/chat/completions", &long_chat()).await;
    let warm_cached = warm["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert_eq!(warm_cached, n_prompt - 1, "{warm}");
    assert_eq!(warm["choices"], cold["choices"]);
    first.stop().await;

    // The store holds the whole blocks and the partly filled last page (a tail checkpoint),
    // so all but the last token come from disk.
    let cached = n_prompt - 1;
    assert_ne!(
        cached % 64,
        0,
        "the prompt should end inside a page: {n_prompt}"
    );

    // A new server on the same directory reads the blocks and the tail from disk.
    let second = env.start(&[]).await;
    let (status, restarted) = second.post("/v1/chat/completions", &long_chat()).await;
    assert_eq!(status, 200, "{restarted}");
    assert_eq!(restarted["timings"]["cache_n"], cached);
    assert_eq!(
        restarted["timings"]["prompt_n"].as_u64().unwrap(),
        n_prompt - cached
    );
    assert_eq!(restarted["choices"], cold["choices"]);

    // cache_prompt: false computes everything again, with the same result.
    let mut body = long_chat();
    body["cache_prompt"] = json!(false);
    let (_, uncached) = second.post("/v1/chat/completions", &body).await;
    assert_eq!(uncached["timings"]["cache_n"], 0);
    assert_eq!(uncached["choices"], cold["choices"]);
    second.stop().await;

    // --no-cache keeps nothing on disk for the next server.
    let third = env.start(&["--no-cache"]).await;
    let (_, none) = third.post("/v1/chat/completions", &long_chat()).await;
    assert_eq!(none["timings"]["cache_n"], 0);
    third.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_chat_turn_reuses_the_previous_turn_and_its_reply() {
    let env = Env::new();
    let srv = env.start(&[]).await;
    let mut messages = vec![
        json!({"role": "system", "content": "abcdefgh ".repeat(20)}),
        json!({"role": "user", "content": "first question"}),
    ];
    let body = |m: &Vec<Value>| json!({"messages": m, "max_tokens": 70, "temperature": 0});
    let (_, turn1) = srv.post("/v1/chat/completions", &body(&messages)).await;
    let reply = turn1["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_owned();
    let held = turn1["usage"]["prompt_tokens"].as_u64().unwrap()
        + turn1["usage"]["completion_tokens"].as_u64().unwrap();
    messages.push(json!({"role": "assistant", "content": reply}));
    messages.push(json!({"role": "user", "content": "second question"}));
    let (_, turn2) = srv.post("/v1/chat/completions", &body(&messages)).await;
    let cached = turn2["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    // Every full block of the first turn, reply included, is reused.
    assert!(
        cached >= (held - 1) / 64 * 64,
        "cached {cached} of {held}: {turn2}"
    );
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_disk_budget_holds_and_keeps_the_most_recent_prompt() {
    let env = Env::new();
    let budget = 64 * 1024;
    let srv = env.start(&["--cache-disk", "64KiB"]).await;
    let prompt = |i: usize| format!("{i} {}", "abcdefgh".repeat(30));
    for i in 0..6 {
        let (status, body) = srv
            .post("/completion", &json!({"prompt": prompt(i), "n_predict": 1}))
            .await;
        assert_eq!(status, 200, "{body}");
    }
    srv.stop().await;

    let srv = env.start(&["--metrics"]).await;
    let (_, metrics) = srv.get("/metrics").await;
    let text = metrics.as_str().unwrap();
    let on_disk: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("llamahdd:cache_disk_bytes "))
        .unwrap()
        .parse()
        .unwrap();
    assert!(on_disk > 0 && on_disk <= budget, "{on_disk} bytes on disk");
    // Every file of the cache counts: blocks, and the manifests of the tails.
    let files = common::dir_bytes(&env.cache());
    assert!(files <= budget, "{files} bytes in the cache directory");
    let (_, last) = srv
        .post("/completion", &json!({"prompt": prompt(5), "n_predict": 1}))
        .await;

    assert!(last["timings"]["cache_n"].as_u64().unwrap() > 0, "{last}");
    let (_, first) = srv
        .post("/completion", &json!({"prompt": prompt(0), "n_predict": 1}))
        .await;
    assert_eq!(first["timings"]["cache_n"], 0, "{first}");
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocks_collected_by_another_process_are_written_again() {
    let env = Env::new();
    let srv = env.start(&[]).await;
    let (_, cold) = srv.post("/v1/chat/completions", &long_chat()).await;
    let n_prompt = cold["usage"]["prompt_tokens"].as_u64().unwrap();
    // Let the writer store the blocks (it waits for the scheduler to be idle).
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;

    // Beside the running server, another process removes every checkpoint and collects the
    // blocks (what `ckpt rm` and `ckpt gc` do).
    let cache = env.cache();
    let removed = tokio::task::spawn_blocking(move || {
        let store = kvstore::KvStore::open(&cache, kvstore::Config::default()).unwrap();
        for fp in store.models() {
            let m = store.existing_model(&fp).unwrap();
            for name in m.list().unwrap() {
                m.delete(&name).unwrap();
            }
        }
        store.gc().unwrap().blocks
    })
    .await
    .unwrap();
    assert!(removed >= 3, "{removed} blocks collected");

    // The same prompt again: served from the server's memory, and its blocks, which the store
    // no longer holds, are written again.
    let (_, warm) = srv.post("/v1/chat/completions", &long_chat()).await;
    assert_eq!(warm["timings"]["cache_n"], n_prompt - 1, "{warm}");
    srv.stop().await;

    // So a new server finds them on disk.
    let next = env.start(&[]).await;
    let (_, restarted) = next.post("/v1/chat/completions", &long_chat()).await;
    assert_eq!(restarted["timings"]["cache_n"], n_prompt - 1, "{restarted}");
    assert_eq!(restarted["choices"], cold["choices"]);
    next.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_directory_stays_within_the_budget_while_it_is_written() {
    let env = Env::new();
    let budget = 64 * 1024;
    let srv = env.start(&["--cache-disk", "64KiB"]).await;
    // Sample the directory's size as fast as it can be read, for as long as the requests run.
    let cache = env.cache();
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let done = done.clone();
        std::thread::spawn(move || {
            let (mut peak, mut block, mut samples) = (0, 0, 0);
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                peak = peak.max(common::dir_bytes(&cache));
                block = block.max(common::largest_file(&cache));
                samples += 1;
            }
            (peak, block, samples)
        })
    };
    for i in 0..12 {
        let prompt = format!("{i} {}", "abcdefgh".repeat(40));
        let (status, body) = srv
            .post("/completion", &json!({"prompt": prompt, "n_predict": 1}))
            .await;
        assert_eq!(status, 200, "{body}");
        // Give the writer its round between requests.
        tokio::time::sleep(std::time::Duration::from_millis(60)).await;
    }
    srv.stop().await;
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let (peak, block, samples) = sampler.join().unwrap();
    assert!(samples > 100, "{samples} samples");
    assert!(block > 0);
    assert!(
        peak <= budget + block,
        "the directory reached {peak} bytes: budget {budget} + one block of {block}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_that_tokenizes_otherwise_is_reused_after_a_restart_too() {
    // Letter pairs are merged when text is tokenized, but a reply is sampled a letter at a
    // time: its text tokenized again gives other tokens than the ones the cache holds.
    let env = Env::new();
    TinyChatModel {
        n_ff: 64,
        context_length: 4096,
        letter_merges: true,
        ..TinyChatModel::default()
    }
    .write(&env.model)
    .unwrap();
    let mut messages = vec![
        json!({"role": "system", "content": "abcdefgh ".repeat(20)}),
        json!({"role": "user", "content": "first question"}),
    ];
    // Single letters only (a grammar, and the 64 pair tokens banned), so that the reply's
    // text merges into pairs when tokenized again.
    let pairs: Vec<Value> = (256..320).map(|id| json!([id, false])).collect();
    let body = |m: &Vec<Value>| {
        json!({"messages": m, "max_tokens": 150, "temperature": 0,
               "grammar": "root ::= [a-h]{150}", "logit_bias": pairs})
    };
    let srv = env.start(&[]).await;
    let (_, turn1) = srv.post("/v1/chat/completions", &body(&messages)).await;
    let reply = turn1["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_owned();
    let held = turn1["usage"]["prompt_tokens"].as_u64().unwrap()
        + turn1["usage"]["completion_tokens"].as_u64().unwrap();
    messages.push(json!({"role": "assistant", "content": reply.clone()}));
    messages.push(json!({"role": "user", "content": "second question"}));
    // The reply's text tokenizes into fewer tokens than were sampled.
    let (_, again) = srv.post("/tokenize", &json!({"content": reply})).await;
    let retokenized = again["tokens"].as_array().unwrap().len() as u64;
    assert!(
        retokenized < turn1["usage"]["completion_tokens"].as_u64().unwrap(),
        "{retokenized} tokens"
    );
    srv.stop().await;

    // After a restart, the next turn still starts from every full block of the first.
    let srv = env.start(&[]).await;
    let (_, turn2) = srv.post("/v1/chat/completions", &body(&messages)).await;
    let cached = turn2["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert!(
        cached >= (held - 1) / 64 * 64,
        "cached {cached} of {held}: {turn2}"
    );
    srv.stop().await;
}
