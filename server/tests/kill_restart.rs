//! The server binary killed with SIGKILL after a response: the blocks and the tail that the
//! write-behind thread had written come back in the next process, verified, and the reply is
//! the same as when everything is computed.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::{metric, Env, Killed};
use serde_json::{json, Value};

/// Starts the binary on port 0 and reads the address it listens on.
fn spawn(env: &Env) -> (Killed, String) {
    spawn_with(env, &["-c", "512", "--kv-unified"])
}

/// [`spawn`] with `options` in place of its context options.
fn spawn_with(env: &Env, options: &[&str]) -> (Killed, String) {
    common::spawn_listening(
        Command::new(env!("CARGO_BIN_EXE_llama-hdd-server"))
            .arg("-m")
            .arg(&env.model)
            .arg("--cache-dir")
            .arg(env.cache())
            .args(["--port", "0", "-t", "1", "--metrics"])
            .args(options),
    )
}

async fn post(url: &str, body: &Value) -> Value {
    reqwest::Client::new()
        .post(format!("{url}/completion"))
        .json(body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_9_keeps_what_the_writer_had_written() {
    let env = Env::new();
    let body = json!({
        "prompt": format!("kill {}", "abcdefgh ".repeat(30)),
        "n_predict": 4,
        "temperature": 0,
    });
    let (mut first, url) = spawn(&env);
    let cold = post(&url, &body).await;
    let n_prompt = cold["tokens_evaluated"].as_u64().unwrap();
    assert!(n_prompt > 3 * 64, "{cold}");
    // Wait until the writer has stored the blocks and the tail, then kill without warning.
    let deadline = Instant::now() + Duration::from_secs(60);
    while metric(&url, "cache_tails_written_total").await == 0 {
        assert!(Instant::now() < deadline, "the writer stored nothing");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    first.0.kill().unwrap();
    first.0.wait().unwrap();

    let (_second, url) = spawn(&env);
    let warm = post(&url, &body).await;
    assert_eq!(warm["timings"]["cache_n"], n_prompt - 1, "{warm}");
    assert_eq!(warm["content"], cold["content"]);
}

/// A prompt repeated back to back: each repeat takes the last one's sequence over, so the
/// scheduler is seldom idle and the pages they share are copied out a piece at a time between
/// requests' steps once due. Every piece reaches the disk while the repeats go on: after a
/// kill, the next process restores the whole prompt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chain_of_repeats_stores_the_pages_it_keeps() {
    let env = Env::new();
    let body = json!({
        "prompt": format!("chain {}", "abcdefgh ".repeat(56)),
        "n_predict": 4,
        "temperature": 0,
    });
    let (mut first, url) = spawn(&env);
    let cold = post(&url, &body).await;
    let n_prompt = cold["tokens_evaluated"].as_u64().unwrap();
    let pages = n_prompt / 64;
    assert!(pages > 4, "more pages than one piece: {cold}");
    // Repeats until the writer has stored every full page and a tail.
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut repeats = 0;
    while metric(&url, "cache_blocks_written_total").await < pages
        || metric(&url, "cache_tails_written_total").await == 0
    {
        assert!(
            Instant::now() < deadline,
            "{repeats} repeats, and the writer stored {} of {pages} pages",
            metric(&url, "cache_blocks_written_total").await
        );
        let warm = post(&url, &body).await;
        assert_eq!(warm["content"], cold["content"]);
        repeats += 1;
    }
    first.0.kill().unwrap();
    first.0.wait().unwrap();

    let (_second, url) = spawn(&env);
    let restored = post(&url, &body).await;
    assert_eq!(restored["timings"]["cache_n"], n_prompt - 1, "{restored}");
    assert_eq!(restored["content"], cold["content"]);
}

/// A prompt that finishes while another request decodes on: the scheduler is never idle, and
/// the finished prompt's pages still go to the store in pieces between the other request's
/// steps, not once it ends. Killed while the other request still streams, the next process
/// restores the whole prompt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prompt_is_stored_while_another_request_decodes() {
    let env = Env::new();
    let launch = |env: &Env| spawn_with(env, &["-c", "4096", "-np", "2"]);
    let (mut first, url) = launch(&env);
    // The long request: it decodes until its slot's context is full.
    let mut stream = reqwest::Client::new()
        .post(format!("{url}/completion"))
        .json(&json!({
            "prompt": "long",
            "n_predict": 2000,
            "ignore_eos": true,
            "temperature": 0,
            "stream": true,
        }))
        .send()
        .await
        .unwrap();
    assert!(stream.status().is_success());
    // Decoding has begun once the first token arrives; its chunks are read on meanwhile.
    assert!(stream.chunk().await.unwrap().is_some(), "no first chunk");
    let (ended_tx, mut ended) = tokio::sync::watch::channel(false);
    let reader = tokio::spawn(async move {
        while let Ok(Some(_)) = stream.chunk().await {}
        let _ = ended_tx.send(true);
    });

    let body = json!({
        "prompt": format!("decoding beside {}", "abcdefgh ".repeat(50)),
        "n_predict": 2,
        "temperature": 0,
    });
    let cold = post(&url, &body).await;
    let n_prompt = cold["tokens_evaluated"].as_u64().unwrap();
    let pages = n_prompt / 64;
    assert!(pages > 4, "more pages than one piece: {cold}");
    let deadline = Instant::now() + Duration::from_secs(120);
    while metric(&url, "cache_blocks_written_total").await < pages
        || metric(&url, "cache_tails_written_total").await == 0
    {
        assert!(
            !*ended.borrow_and_update(),
            "the long request ended before the prompt's {pages} pages were stored (stored {})",
            metric(&url, "cache_blocks_written_total").await
        );
        assert!(
            Instant::now() < deadline,
            "the writer stored nothing in 120 s"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        !*ended.borrow(),
        "the long request ended before the prompt was stored"
    );
    first.0.kill().unwrap();
    first.0.wait().unwrap();
    reader.abort();

    let (_second, url) = launch(&env);
    let restored = post(&url, &body).await;
    assert_eq!(restored["timings"]["cache_n"], n_prompt - 1, "{restored}");
    assert_eq!(restored["content"], cold["content"]);
}
