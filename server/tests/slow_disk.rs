//! A slow disk delays only the request whose blocks are read: every block read waits 200 ms
//! (`--fault-read-delay-ms`), and a request streaming meanwhile keeps its pace, because lookups
//! and reads run on the loader thread, not on the scheduler's.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::Env;
use serde_json::json;

/// A prompt of several 64-token blocks on the byte-level tiny model.
fn stored_prompt() -> String {
    "the quick brown fox jumps over the lazy dog. ".repeat(7)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_block_read_does_not_stall_another_stream() {
    let env = Env::new();
    let body = |prompt: &str, n: u32| json!({"prompt": prompt, "n_predict": n, "temperature": 0, "ignore_eos": true});
    // The prompt's blocks go to disk with the first server.
    let first = env.start(&["-c", "4096"]).await;
    let (status, cold) = first.post("/completion", &body(&stored_prompt(), 1)).await;
    assert_eq!(status, 200, "{cold}");
    first.stop().await;

    let server = env
        .start(&["-c", "4096", "-np", "2", "--fault-read-delay-ms", "200"])
        .await;
    // A long stream with another prompt, read chunk by chunk with arrival times.
    let mut stream = server
        .client
        .post(format!("{}/completion", server.url))
        .json(
            &json!({"prompt": "zzz", "n_predict": 3500, "temperature": 0,
                      "ignore_eos": true, "stream": true}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), 200);
    let enough = Arc::new(AtomicBool::new(false));
    let stop_reading = Arc::clone(&enough);
    let reader = tokio::spawn(async move {
        let mut times = Vec::new();
        while let Ok(Some(_)) = stream.chunk().await {
            times.push(Instant::now());
            if stop_reading.load(Ordering::Relaxed) {
                break;
            }
        }
        times
    });
    // Let the stream get going, then ask for the stored prompt.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let sent = Instant::now();
    let (status, warm) = server.post("/completion", &body(&stored_prompt(), 1)).await;
    let done = Instant::now();
    assert_eq!(status, 200, "{warm}");
    let cache_n = warm["timings"]["cache_n"].as_u64().unwrap();
    assert!(
        cache_n >= 4 * 64,
        "the blocks should come from disk: {warm}"
    );
    // Four or more blocks read at 200 ms each: the delay was in effect.
    assert!(
        done - sent >= Duration::from_millis(800),
        "the reads were not slowed: {:?}",
        done - sent
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    enough.store(true, Ordering::Relaxed);
    let times = reader.await.unwrap();
    let during: Vec<Instant> = times
        .iter()
        .copied()
        .filter(|&t| t >= sent && t <= done)
        .collect();
    assert!(
        during.len() >= 20 && times.last().is_some_and(|&t| t > done),
        "the stream should run all through the slow read: {} chunks during it, {} in all",
        during.len(),
        times.len()
    );
    let worst = during.windows(2).map(|w| w[1] - w[0]).max().unwrap();
    assert!(
        worst < Duration::from_millis(50),
        "a gap of {worst:?} between tokens while blocks were read"
    );
    server.stop().await;
}
