//! The cache directory on a 20 MiB filesystem of its own (a tmpfs mounted in a user and mount
//! namespace, `unshare -Urm`): once it fills, the oldest cached prompts give way, the log says
//! so once, new prompts are stored still, and a prompt no longer in memory comes back from
//! disk. Before, the first prompts' blocks stayed for ever and every later store failed.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{Env, Killed};
use serde_json::{json, Value};

/// Whether this machine lets an unprivileged process mount a tmpfs of its own.
fn can_mount() -> bool {
    Command::new("unshare")
        .args(["-Urm", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /tmp"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// A prompt of about 3,000 bytes (a token each on the tiny model), unlike any other `i`.
fn prompt(i: usize) -> String {
    (0..300).map(|k| format!("{:09} ", i * 1000 + k)).collect()
}

async fn complete(url: &str, i: usize) -> Value {
    let body = json!({"prompt": prompt(i), "n_predict": 1, "temperature": 0});
    reqwest::Client::new()
        .post(format!("{url}/completion"))
        .json(&body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_filesystem_keeps_serving_cache_hits() {
    if !can_mount() {
        eprintln!("skipped: this machine does not allow `unshare -Urm` to mount a tmpfs");
        return;
    }
    let env = Env::new();
    let cache = env.cache();
    std::fs::create_dir_all(&cache).unwrap();
    let script = format!(
        "mount -t tmpfs -o size=20m tmpfs '{}' && exec '{}' -m '{}' --cache-dir '{}' \
         --port 0 -t 1 -c 4096 -np 1 --cache-disk -1 --metrics",
        cache.display(),
        env!("CARGO_BIN_EXE_llama-hdd-server"),
        env.model.display(),
        cache.display()
    );
    let mut child = Command::new("unshare")
        .args(["-Urm", "sh", "-c", &script])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let _server = Killed(child);
    let url = common::listening_url(&mut lines);
    let log = Arc::new(Mutex::new(Vec::<String>::new()));
    {
        let log = Arc::clone(&log);
        std::thread::spawn(move || {
            for l in lines.map_while(Result::ok) {
                log.lock().unwrap().push(l);
            }
        });
    }
    let full_said = || {
        log.lock()
            .unwrap()
            .iter()
            .filter(|l| l.contains("the disk is full"))
            .count()
    };

    // New prompts until the filesystem has filled (each takes about 1.5 MiB of blocks).
    let mut sent = 0;
    let deadline = Instant::now() + Duration::from_secs(120);
    while full_said() == 0 {
        assert!(
            Instant::now() < deadline && sent < 60,
            "the filesystem never filled ({sent} prompts)"
        );
        let r = complete(&url, sent).await;
        assert!(r["content"].is_string(), "{r}");
        sent += 1;
        // Let the writer store it before the next one.
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    // Filled: new prompts go on being stored, and one that left memory (the pool holds about
    // two) is read back from disk.
    for round in 0..3 {
        let target = sent;
        complete(&url, target).await;
        sent += 1;
        tokio::time::sleep(Duration::from_millis(500)).await;
        for _ in 0..3 {
            complete(&url, sent).await;
            sent += 1;
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let again = complete(&url, target).await;
        let cache_n = again["timings"]["cache_n"].as_u64().unwrap();
        assert!(
            cache_n >= 2900,
            "round {round}: prompt {target} should come back from disk, cache_n {cache_n}; log: {:?}",
            log.lock().unwrap()
        );
    }
    assert_eq!(full_said(), 1, "said once: {:?}", log.lock().unwrap());
}
