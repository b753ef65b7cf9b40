//! Two server processes with cache directories of their own (two hosts) on one real
//! `redis-server`: what one computed the other reads; damaged and foreign values are
//! recomputed; a Redis that is absent, killed, restarted, slow or refusing writes never fails a
//! request.

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{Env, Killed};
use engine::testing::TinyChatModel;
use kvstore::remote::testing::{redis, RedisServer};
use serde_json::{json, Value};

/// A server binary on `model` with a cache directory of its own and the remote tier at `url`;
/// its standard error's lines are kept.
struct Replica {
    _child: Killed,
    url: String,
    log: Arc<Mutex<Vec<String>>>,
    cache: tempfile::TempDir,
}

impl Replica {
    /// A replica whose calls to Redis time out after a second: long enough that a loaded
    /// machine does not see a healthy Redis as down.
    fn spawn(model: &Path, redis_url: &str) -> Replica {
        Replica::spawn_timing_out(model, redis_url, 1000)
    }

    /// A replica whose calls to Redis time out after `ms` milliseconds.
    fn spawn_timing_out(model: &Path, redis_url: &str, ms: u64) -> Replica {
        Replica::spawn_with(model, redis_url, ms, &[])
    }

    /// A replica whose calls to Redis time out after `ms` milliseconds, with `extra` options.
    fn spawn_with(model: &Path, redis_url: &str, ms: u64, extra: &[&str]) -> Replica {
        let cache = tempfile::tempdir().unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_llama-hdd-server"))
            .arg("-m")
            .arg(model)
            .arg("--cache-dir")
            .arg(cache.path())
            .args([
                "--port",
                "0",
                "-t",
                "1",
                "-c",
                "1024",
                "--kv-unified",
                "--metrics",
            ])
            .args(["--cache-remote", redis_url, "--cache-remote-namespace", "t"])
            .args(["--cache-remote-timeout", &ms.to_string()])
            .args(extra)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let url = common::listening_url(&mut lines);
        let log = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&log);
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                sink.lock().unwrap().push(line);
            }
        });
        Replica {
            _child: Killed(child),
            url,
            log,
            cache,
        }
    }

    /// `/completion`, greedy; fails the test on anything but a 200.
    async fn complete(&self, prompt: &str, cache_prompt: bool) -> Value {
        let resp = reqwest::Client::new()
            .post(format!("{}/completion", self.url))
            .json(&json!({
                "prompt": prompt,
                "n_predict": 8,
                "temperature": 0,
                "cache_prompt": cache_prompt,
            }))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 200);
        resp.json().await.unwrap()
    }

    /// `/v1/chat/completions`, greedy; fails the test on anything but a 200.
    async fn chat(&self, messages: &Value) -> Value {
        let resp = reqwest::Client::new()
            .post(format!("{}/v1/chat/completions", self.url))
            .json(&json!({"messages": messages, "max_tokens": 8, "temperature": 0}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 200);
        resp.json().await.unwrap()
    }

    /// A field of `/props`.
    async fn prop(&self, name: &str) -> u64 {
        let props: Value = reqwest::get(format!("{}/props", self.url))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        props[name].as_u64().unwrap()
    }

    /// A remote-tier counter of `/metrics` (`llamahdd:cache_remote_NAME`).
    async fn remote(&self, name: &str) -> u64 {
        common::metric(&self.url, &format!("cache_remote_{name}")).await
    }

    /// Waits until the writer has put at least `blocks` blocks and one tail in the tier.
    async fn wait_pushed(&self, blocks: u64) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.remote("blocks_written_total").await < blocks
            || self.remote("manifests_written_total").await < 1
        {
            assert!(
                Instant::now() < deadline,
                "the writer never reached the tier"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn said(&self, needle: &str) -> usize {
        self.log
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.contains(needle))
            .count()
    }

    /// How often the log says `needle` once it has said it `at_least` times (or after 10 s):
    /// the log reaches the test through a pipe, after the counters the test polls.
    async fn said_by_now(&self, needle: &str, at_least: usize) -> usize {
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.said(needle) < at_least && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.said(needle)
    }
}

/// A prompt of about 600 tokens (the tiny model's vocabulary is bytes).
fn long_prompt(tag: &str) -> String {
    format!(
        "{tag} {}",
        "the quick brown fox jumps over the lazy dog. ".repeat(13)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prompt_computed_by_one_replica_is_read_by_another() {
    let env = Env::new();
    let redis = RedisServer::start();
    let a = Replica::spawn(&env.model, &redis.url());
    let b = Replica::spawn(&env.model, &redis.url());
    let prompt = long_prompt("shared");
    let cold = a.complete(&prompt, true).await;
    let n = cold["tokens_evaluated"].as_u64().unwrap();
    assert!(n > 500, "{cold}");
    a.wait_pushed(n / 64).await;

    let warm = b.complete(&prompt, true).await;
    let cached = warm["tokens_cached"].as_u64().unwrap();
    assert!(
        cached + 64 >= n,
        "{cached} of {n} tokens came from the tier"
    );
    assert!(b.remote("hits_total").await >= n / 64);
    // The same greedy reply as computing the whole prompt on this replica.
    let computed = b.complete(&prompt, false).await;
    assert_eq!(warm["content"], computed["content"]);
    assert_eq!(warm["content"], cold["content"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damaged_and_foreign_values_are_recomputed() {
    let env = Env::new();
    let other = env.dir.path().join("other.gguf");
    TinyChatModel {
        n_ff: 64,
        context_length: 4096,
        seed: 99,
        ..TinyChatModel::default()
    }
    .write(&other)
    .unwrap();
    let redis = RedisServer::start();
    let a = Replica::spawn(&env.model, &redis.url());
    let foreign = Replica::spawn(&other, &redis.url());
    let prompt = long_prompt("damaged");
    let n = a.complete(&prompt, true).await["tokens_evaluated"]
        .as_u64()
        .unwrap();
    a.wait_pushed(n / 64).await;
    foreign.complete(&prompt, true).await;
    foreign.wait_pushed(n / 64).await;

    // The other model's keys differ in their fingerprint; take its first block's value.
    let mut con = redis.connection();
    let keys: Vec<String> = redis::cmd("KEYS").arg("t:*:b:*").query(&mut con).unwrap();
    let mut by_model: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    for k in keys {
        by_model
            .entry(k.split(':').nth(1).unwrap().to_owned())
            .or_default()
            .push(k);
    }
    assert_eq!(by_model.len(), 2, "two models' blocks");
    let mut models = by_model.into_values();
    let (first, second) = (models.next().unwrap(), models.next().unwrap());
    let foreign_value: Vec<u8> = redis::cmd("GET").arg(&second[0]).query(&mut con).unwrap();
    // Every block of one model is damaged: half with a flipped bit, half replaced by the
    // other model's block. Which model is which does not matter: both are asked again.
    for (i, key) in first.iter().enumerate() {
        let mut v: Vec<u8> = redis::cmd("GET").arg(key).query(&mut con).unwrap();
        if i % 2 == 0 {
            let at = v.len() / 2;
            v[at] ^= 0x01;
        } else {
            v = foreign_value.clone();
        }
        redis::cmd("SET").arg(key).arg(v).exec(&mut con).unwrap();
    }
    let b = Replica::spawn(&env.model, &redis.url());
    let c = Replica::spawn(&other, &redis.url());
    let (mut rejected, mut hits) = (0, 0);
    for (replica, first_run) in [(&b, &a), (&c, &foreign)] {
        let got = replica.complete(&prompt, true).await;
        let computed = first_run.complete(&prompt, false).await;
        assert_eq!(got["content"], computed["content"]);
        rejected += replica.remote("rejected_total").await;
        hits += replica.remote("hits_total").await;
    }
    assert!(rejected >= 1, "a damaged value was used");
    // And the rejection was said in the log.
    let said = || b.said("rejected a block") + c.said("rejected a block");
    let deadline = Instant::now() + Duration::from_secs(10);
    while said() == 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(said() >= 1, "no rejection in the replicas' logs");
    assert!(hits >= n / 64, "the undamaged model's blocks were read");
}

/// Sends requests until `done` holds, each of which must succeed; the replies are checked
/// against computing the prompt.
async fn requests_succeed(replica: &Replica, tag: &str) -> Value {
    let got = replica.complete(&long_prompt(tag), true).await;
    assert!(got["tokens_evaluated"].as_u64().unwrap() > 500);
    got
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_absent_at_start_then_started_is_found() {
    let env = Env::new();
    let port = free_port();
    let url = format!("redis://127.0.0.1:{port}");
    let a = Replica::spawn(&env.model, &url);
    let started = Instant::now();
    requests_succeed(&a, "absent").await;
    assert!(a.remote("errors_total").await >= 1);
    assert_eq!(a.remote("up").await, 0);
    assert!(started.elapsed() < Duration::from_secs(20));
    let _redis = RedisServer::start_on(port);
    // Writes come back once the backoff has passed: a new prompt reaches the tier.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut i = 0;
    while a.remote("blocks_written_total").await == 0 {
        assert!(Instant::now() < deadline, "never reconnected");
        requests_succeed(&a, &format!("again {i}")).await;
        i += 1;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert_eq!(a.remote("up").await, 1);
    assert_eq!(a.said("is unavailable"), 1, "said once");
    assert_eq!(a.said_by_now("reachable again", 1).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_killed_then_restarted_costs_only_misses() {
    let env = Env::new();
    let mut redis = RedisServer::start();
    let port = redis.port();
    let a = Replica::spawn(&env.model, &redis.url());
    let b = Replica::spawn(&env.model, &redis.url());
    let first = requests_succeed(&a, "before").await;
    a.wait_pushed(first["tokens_evaluated"].as_u64().unwrap() / 64)
        .await;
    redis.stop();
    // Killed: both replicas answer, computing what they lack.
    requests_succeed(&b, "before").await;
    requests_succeed(&a, "during").await;
    assert!(b.remote("errors_total").await >= 1);
    // Restarted (empty): writes reach it again.
    let _redis = RedisServer::start_on(port);
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut i = 0;
    while a.remote("up").await == 0 || a.remote("blocks_written_total").await < 16 {
        assert!(Instant::now() < deadline, "never reconnected");
        requests_succeed(&a, &format!("after {i}")).await;
        i += 1;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let prompt = long_prompt(&format!("after {}", i - 1));
    a.wait_pushed(16).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let got = b.complete(&prompt, true).await;
    assert!(got["tokens_cached"].as_u64().unwrap() >= 512, "{got}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_redis_delays_no_request_past_its_timeout() {
    let env = Env::new();
    let redis = RedisServer::start();
    let a = Replica::spawn_timing_out(&env.model, &redis.url(), 100);
    requests_succeed(&a, "warm").await;
    let port = redis.port();
    let stuck = std::thread::spawn(move || {
        let _ = Command::new("redis-cli")
            .args(["-p", &port.to_string(), "DEBUG", "SLEEP", "3"])
            .output();
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    // The lookup times out after 100 ms; the prompt is computed.
    let t = Instant::now();
    requests_succeed(&a, "while stuck").await;
    let took = t.elapsed();
    assert!(
        took < Duration::from_millis(2500),
        "waited {took:?} for a stuck Redis"
    );
    assert!(a.remote("errors_total").await >= 1);
    stuck.join().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_refusing_writes_is_counted_and_said_once() {
    let env = Env::new();
    let redis = RedisServer::start();
    redis.cli(&["CONFIG", "SET", "maxmemory-policy", "noeviction"]);
    redis.cli(&["CONFIG", "SET", "maxmemory", "1"]);
    let a = Replica::spawn(&env.model, &redis.url());
    for i in 0..3 {
        requests_succeed(&a, &format!("full {i}")).await;
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while a.said("refuses writes") == 0 {
        assert!(Instant::now() < deadline, "never said");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(a.remote("errors_total").await >= 1);
    assert_eq!(a.remote("blocks_written_total").await, 0);
    assert_eq!(a.said("refuses writes"), 1, "said once");
    // Room again: writes resume and it is said.
    redis.cli(&["CONFIG", "SET", "maxmemory", "0"]);
    requests_succeed(&a, "room").await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while a.remote("blocks_written_total").await == 0 {
        assert!(Instant::now() < deadline, "writes never resumed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        a.said_by_now("accepts writes again", 1).await,
        1,
        "{:?}",
        a.log.lock().unwrap()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversation_goes_on_at_another_replica_with_the_tokens_it_was_evaluated_as() {
    let env = Env::new();
    let redis = RedisServer::start();
    let a = Replica::spawn(&env.model, &redis.url());
    let b = Replica::spawn(&env.model, &redis.url());
    let mut messages = json!([
        {"role": "system", "content": long_prompt("system")},
        {"role": "user", "content": "hello there"},
    ]);
    let first = a.chat(&messages).await;
    let reply = first["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_owned();
    a.wait_pushed(8).await;
    // The turn's text and tokens reach Redis off the request's thread.
    let mut con = redis.connection();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg("t:*:v:text:*")
            .query(&mut con)
            .unwrap();
        if !keys.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the conversation's text never reached Redis"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(1000)).await;
    messages.as_array_mut().unwrap().extend([
        json!({"role": "assistant", "content": reply}),
        json!({"role": "user", "content": "and then?"}),
    ]);
    let second = b.chat(&messages).await;
    assert_eq!(b.prop("chat_prefix_remote_hits").await, 1, "{second}");
    let prompt = second["usage"]["prompt_tokens"].as_u64().unwrap();
    let cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert!(cached + 64 >= prompt, "{cached} of {prompt} from the tier");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prompts_that_branch_off_a_shared_prefix_share_its_last_partial_page_too() {
    let env = Env::new();
    let redis = RedisServer::start();
    let replicas: Vec<Replica> = (0..3)
        .map(|_| Replica::spawn(&env.model, &redis.url()))
        .collect();
    // 616 tokens shared (9 full blocks and 40 tokens: one a byte), then each user's own 100.
    let shared = "s".repeat(616);
    let prompt = |user: char| format!("{shared}{}", user.to_string().repeat(100));
    replicas[0].complete(&prompt('a'), true).await;
    replicas[0].wait_pushed(10).await;
    // The second computes the shared partial page again (the tier shares whole blocks) and
    // leaves a tail where it branched off them.
    let b = replicas[1].complete(&prompt('b'), true).await;
    assert_eq!(b["tokens_cached"].as_u64().unwrap(), 9 * 64, "{b}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while replicas[1].remote("manifests_written_total").await < 2 {
        assert!(Instant::now() < deadline, "no tail at the branch");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The third finds the whole shared prefix: blocks and the branch's tail.
    let c = replicas[2].complete(&prompt('c'), true).await;
    let cached = c["tokens_cached"].as_u64().unwrap();
    assert_eq!(cached, 616, "the shared partial page was computed again");
    let computed = replicas[2].complete(&prompt('c'), false).await;
    assert_eq!(c["content"], computed["content"]);
}

/// Blocks that come back from Redis make room on disk before they are written, by dropping the
/// oldest cached prompts when unreferenced blocks are not enough: under a disk budget of a
/// twelfth of what the prompts take, the replica's directory, sampled while it reads them back,
/// never holds more than the budget and two blocks (a block being written as its temporary
/// file, and a prompt's tail manifest, which a loaded machine may catch at the same instant;
/// without the room made first it held twelve times the budget).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocks_from_redis_make_room_on_disk_first() {
    let env = Env::new();
    let redis = RedisServer::start();
    let a = Replica::spawn(&env.model, &redis.url());
    let prompts: Vec<String> = (0..16).map(|i| long_prompt(&format!("{i:02}"))).collect();
    let mut blocks = 0;
    for p in &prompts {
        blocks += a.complete(p, true).await["tokens_evaluated"]
            .as_u64()
            .unwrap()
            / 64;
    }
    a.wait_pushed(blocks).await;
    let block = common::largest_file(a.cache.path());
    let budget = blocks / 12 * block;
    let b = Replica::spawn_with(
        &env.model,
        &redis.url(),
        1000,
        &["--cache-disk", &budget.to_string(), "--cache-ram", "1"],
    );
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let (done, dir) = (Arc::clone(&done), b.cache.path().to_owned());
        std::thread::spawn(move || {
            let mut peak = 0;
            while !done.load(std::sync::atomic::Ordering::Acquire) {
                peak = peak.max(common::dir_bytes(&dir));
            }
            peak
        })
    };
    for p in &prompts {
        b.complete(p, true).await;
    }
    // Until the replica's writer is idle: its disk counter stands still over a round trip of
    // the metrics and a writer's round.
    let mut last = common::metric(&b.url, "cache_bytes_written_total").await;
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = common::metric(&b.url, "cache_bytes_written_total").await;
        if now == last {
            break;
        }
        last = now;
    }
    done.store(true, std::sync::atomic::Ordering::Release);
    let peak = sampler.join().unwrap();
    assert!(
        b.remote("hits_total").await >= blocks / 2,
        "the blocks did not come from Redis"
    );
    assert!(
        peak <= budget + 2 * block,
        "the directory reached {peak} bytes: budget {budget} + two blocks of {block}"
    );
}
