//! The prompt cache of a hybrid model (recurrent layers whose state cannot be cut back): a
//! 10-turn conversation computes only each turn's new tokens (plus at most one block), across a
//! restart too, and its replies are the same as those of a server that never stopped; a client
//! that edits an earlier message resumes at the last state kept before the edit; another
//! replica on the same Redis resumes it too.

mod common;

use common::start_on;
use engine::testing::TinyHybridModel;
use serde_json::{json, Value};

const TURNS: usize = 10;
const PAGE: usize = 64;

/// The new tokens of turn `t`'s user message (byte tokens, 37 to 60 of them).
fn user_tokens(t: usize) -> Vec<u32> {
    (0..37 + (t * 7) % 24)
        .map(|i| (97 + (i * 5 + t * 11) % 26) as u32)
        .collect()
}

/// One turn: the whole history as token ids, greedy, 24 tokens.
async fn turn(server: &common::TestServer, history: &[u32]) -> (Vec<u32>, u64, u64) {
    let body = json!({
        "prompt": history,
        "n_predict": 24,
        "temperature": 0,
        "ignore_eos": true,
        "return_tokens": true,
        "cache_prompt": true,
    });
    let (status, out) = server.post("/completion", &body).await;
    assert_eq!(status, 200, "{out}");
    let tokens: Vec<u32> = out["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect();
    let t = &out["timings"];
    let n = |v: &Value| v.as_u64().unwrap();
    (tokens, n(&t["prompt_n"]), n(&t["cache_n"]))
}

/// Plays the conversation on a server over `cache`, stopping and starting it again after turn
/// `restart_after` if given; returns the replies and, per turn, (new tokens, computed, cached).
async fn conversation(
    model: &std::path::Path,
    cache: &std::path::Path,
    restart_after: Option<usize>,
) -> (Vec<Vec<u32>>, Vec<(usize, u64, u64)>) {
    let args = ["-t", "1", "-c", "2048", "-np", "1"];
    let mut server = start_on(model, cache, &args).await;
    let mut history = Vec::new();
    let mut replies = Vec::new();
    let mut counts = Vec::new();
    for t in 0..TURNS {
        let new = user_tokens(t);
        history.extend_from_slice(&new);
        let (reply, computed, cached) = turn(&server, &history).await;
        assert_eq!(reply.len(), 24);
        counts.push((new.len(), computed, cached));
        history.extend_from_slice(&reply);
        replies.push(reply);
        if restart_after == Some(t) {
            server.stop().await;
            server = start_on(model, cache, &args).await;
        }
    }
    server.stop().await;
    (replies, counts)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hybrid_conversation_computes_only_its_new_tokens_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("hybrid.gguf");
    TinyHybridModel::default().write(&model).unwrap();

    let (steady, steady_counts) = conversation(&model, &dir.path().join("a"), None).await;
    let (restarted, counts) = conversation(&model, &dir.path().join("b"), Some(4)).await;
    for (t, &(new, computed, cached)) in counts.iter().enumerate().skip(1) {
        // The previous reply comes back as it was generated: only the new message is
        // computed, and the reply's last token (sampled, never fed before).
        assert!(
            computed as usize <= new + 1,
            "turn {t}: {computed} computed for {new} new tokens (cached {cached})"
        );
    }
    assert_eq!(
        counts, steady_counts,
        "the restart changed what was computed"
    );
    assert_eq!(restarted, steady, "the restart changed a reply");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edited_history_resumes_at_the_last_state_kept_before_the_edit() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("hybrid.gguf");
    TinyHybridModel::default().write(&model).unwrap();
    let cache = dir.path().join("cache");
    let args = ["-t", "1", "-c", "2048", "-np", "1"];

    // Six turns, then a new server on the same directory.
    let server = start_on(&model, &cache, &args).await;
    let mut history = Vec::new();
    let mut starts = Vec::new();
    for t in 0..6 {
        starts.push(history.len());
        history.extend(user_tokens(t));
        let (reply, _, _) = turn(&server, &history).await;
        history.extend(reply);
    }
    server.stop().await;
    let server = start_on(&model, &cache, &args).await;

    // The client rewrites turn 4's message, near its start and further in: everything before
    // the edit is still valid. The prompt resumes no earlier than turn 3's last block boundary
    // (where its reply left a snapshot) and never after the edit; an edit past turn 4's prompt
    // boundary resumes at that boundary's snapshot.
    for edit in [starts[4] + 3, starts[4] + 40] {
        let mut edited = history.clone();
        edited[edit] = if edited[edit] == 120 { 121 } else { 120 };
        let (_, computed, cached) = turn(&server, &edited).await;
        let (cached, floor) = (cached as usize, starts[4] / PAGE * PAGE);
        assert!(
            cached >= floor && cached <= edit,
            "resumed at {cached}: the edit is at {edit}, turn 3 ended at {}",
            starts[4]
        );
        assert_eq!(computed as usize + cached, edited.len());
        if edit / PAGE > starts[4] / PAGE {
            assert_eq!(cached, edit / PAGE * PAGE, "the edit at {edit}");
        }
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_replica_resumes_a_hybrid_conversation_through_redis() {
    let redis = kvstore::remote::testing::RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("hybrid.gguf");
    TinyHybridModel::default().write(&model).unwrap();
    let url = redis.url();
    let args = [
        "-t",
        "1",
        "-c",
        "2048",
        "-np",
        "1",
        "--cache-remote",
        &url,
        "--cache-remote-namespace",
        "h",
    ];
    // Three turns on one replica, stopped (its cache written through to Redis).
    let first = start_on(&model, &dir.path().join("a"), &args).await;
    let mut history = Vec::new();
    for t in 0..3 {
        history.extend(user_tokens(t));
        let (reply, _, _) = turn(&first, &history).await;
        history.extend(reply);
    }
    first.stop().await;
    // The fourth on another, with a cache directory of its own: the tail and its state come
    // from Redis, and only the new message (and the reply's last token) is computed.
    let second = start_on(&model, &dir.path().join("b"), &args).await;
    let before = history.len();
    let new = user_tokens(3);
    history.extend_from_slice(&new);
    let (_, computed, cached) = turn(&second, &history).await;
    assert_eq!(cached as usize, before - 1, "computed {computed}");
    assert!(computed as usize <= new.len() + 1);
    second.stop().await;
}

/// Writes the tiny hybrid model to `$LLAMA_HDD_TINY_OUT/hybrid.gguf`, for
/// `cargo xtask bench-server --model` side by side with llama-server:
/// `LLAMA_HDD_TINY_OUT=DIR cargo test -p server --test hybrid_cache -- --ignored`.
#[test]
#[ignore = "writes the benchmark's model where asked"]
fn write_the_benchmark_model() {
    let dir = std::env::var("LLAMA_HDD_TINY_OUT").expect("LLAMA_HDD_TINY_OUT");
    let path = std::path::Path::new(&dir).join("hybrid.gguf");
    TinyHybridModel::default().write(&path).unwrap();
}
