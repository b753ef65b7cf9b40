//! The remote tier on a real `redis-server`: two stores in their own directories (two hosts)
//! share blocks and checkpoints through it, damaged and foreign values are refused, and a Redis
//! that is absent, killed, slow or out of memory costs misses, never a failed call.

mod common;

use std::time::{Duration, Instant};

use ckptfmt::store::BlockInput;
use ckptfmt::{ElemType, Fingerprint, Geometry, Manifest, Metadata};
use kvstore::remote::testing::{redis, RedisServer};
use kvstore::{BlockId, Config, KvStore, ModelStore, RemoteConfig};

const TPB: u32 = 4;

fn geometry() -> Geometry {
    Geometry::uniform(2, 16, 16, ElemType::F16, TPB).unwrap()
}

fn host(dir: &std::path::Path, url: &str, fp: &Fingerprint) -> (KvStore, ModelStore) {
    let ram = Config::default().ram_budget;
    common::remote_host(dir, RemoteConfig::new(url), ram, fp, geometry())
}

/// Block `i`'s bytes, different for every block and seed.
fn kv(seed: u8, i: usize) -> Vec<u8> {
    common::seeded_kv(&geometry(), seed, i)
}

/// The blocks of `tokens` (ids `ids`, KV `kvs`) as the tier takes them.
fn inputs<'a>(ids: &'a [BlockId], tokens: &'a [u32], kvs: &'a [Vec<u8>]) -> Vec<BlockInput<'a>> {
    let tpb = TPB as usize;
    (0..ids.len())
        .map(|i| BlockInput {
            prev: i.checked_sub(1).map(|p| &ids[p]),
            tokens: &tokens[i * tpb..(i + 1) * tpb],
            kv: &kvs[i],
        })
        .collect()
}

/// Puts the blocks of `tokens` locally and pushes them to the tier; their ids.
fn compute(model: &ModelStore, tokens: &[u32], seed: u8) -> Vec<BlockId> {
    let ids = BlockId::chain_all(&model.fingerprint(), tokens, TPB);
    let kvs: Vec<Vec<u8>> = (0..ids.len()).map(|i| kv(seed, i)).collect();
    let inputs = inputs(&ids, tokens, &kvs);
    model.put_sequence(tokens, |i| kvs[i].clone()).unwrap();
    assert_eq!(model.push_remote(&inputs).unwrap(), ids.len());
    // A second push finds them all held and writes nothing.
    assert_eq!(model.push_remote(&inputs).unwrap(), 0);
    ids
}

#[test]
fn a_prefix_computed_on_one_host_is_read_on_another_and_verified() {
    let redis = RedisServer::start();
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let fp = Fingerprint::of(b"model");
    let (_sa, ma) = host(a.path(), &redis.url(), &fp);
    let (_sb, mb) = host(b.path(), &redis.url(), &fp);
    let tokens: Vec<u32> = (0..40).collect();
    let ids = compute(&ma, &tokens, 7);

    assert!(ids.iter().all(|id| !mb.contains(id)), "nothing local yet");
    let got = mb.fetch_remote(&ids);
    assert!(got.answered);
    assert_eq!(got.blocks, ids.len());
    // Held locally now, with the bytes the first host computed.
    assert_eq!(mb.longest_prefix(&tokens, &[]).block_ids, ids);
    for (i, id) in ids.iter().enumerate() {
        assert_eq!(&mb.get(id).unwrap().unwrap()[..], &kv(7, i)[..]);
    }
    let f = mb.remote().unwrap().metrics().figures();
    assert_eq!((f.hits, f.rejected), (ids.len() as u64, 0));
    assert!(f.bytes_read >= ids.len() as u64 * geometry().block_bytes());

    // A prefix whose later blocks the tier lacks ends where they start.
    let (_sc, mc) = host(tempfile::tempdir().unwrap().path(), &redis.url(), &fp);
    let longer: Vec<u32> = (0..40).chain(1000..1008).collect();
    let longer_ids = BlockId::chain_all(&fp, &longer, TPB);
    assert_eq!(mc.fetch_remote(&longer_ids).blocks, ids.len());
    // The prefix walk goes on into the remote tier where the local tiers end.
    let (_sd, md) = host(tempfile::tempdir().unwrap().path(), &redis.url(), &fp);
    let hit = md.longest_prefix(&longer, &[]);
    assert_eq!((hit.block_ids, hit.n_tokens), (ids.clone(), tokens.len()));
}

#[test]
fn damaged_truncated_and_foreign_values_are_misses_never_used() {
    let redis = RedisServer::start();
    let fp = Fingerprint::of(b"model");
    let other = Fingerprint::of(b"another model");
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let (_s0, m0) = host(dirs[0].path(), &redis.url(), &fp);
    let (_s1, m1) = host(dirs[1].path(), &redis.url(), &other);
    let tokens: Vec<u32> = (0..24).collect();
    let ids = compute(&m0, &tokens, 1);
    let other_ids = compute(&m1, &tokens, 2);
    let remote = m0.remote().unwrap().clone();
    let key = |id: &BlockId| remote.block_key(&fp, &geometry(), id);
    let mut con = redis.connection();
    let get = |con: &mut redis::Connection, k: &str| -> Vec<u8> {
        redis::cmd("GET").arg(k).query(con).unwrap()
    };
    let set = |con: &mut redis::Connection, k: &str, v: &[u8]| {
        redis::cmd("SET").arg(k).arg(v).exec(con).unwrap();
    };
    // Block 1: one flipped bit in its payload. Block 3: cut short. Block 4: another model's
    // block 4 stored under this model's key.
    let mut v = get(&mut con, &key(&ids[1]));
    let last = v.len() - 5000;
    v[last] ^= 0x10;
    set(&mut con, &key(&ids[1]), &v);
    let v = get(&mut con, &key(&ids[3]));
    set(&mut con, &key(&ids[3]), &v[..v.len() / 2]);
    let foreign = get(
        &mut con,
        &remote.block_key(&other, &geometry(), &other_ids[4]),
    );
    set(&mut con, &key(&ids[4]), &foreign);

    let (_s2, m2) = host(dirs[2].path(), &redis.url(), &fp);
    assert_eq!(m2.fetch_remote(&ids).blocks, 1, "stops at the flipped bit");
    assert_eq!(
        m2.fetch_remote(&ids[2..]).blocks,
        1,
        "stops at the cut value"
    );
    assert_eq!(
        m2.fetch_remote(&ids[4..]).blocks,
        0,
        "refuses another model's block"
    );
    assert_eq!(m2.fetch_remote(&ids[5..]).blocks, 1);
    assert_eq!(m2.remote().unwrap().metrics().figures().rejected, 3);
    // What was used is exactly what the first host computed.
    for i in [0, 2, 5] {
        assert_eq!(&m2.get(&ids[i]).unwrap().unwrap()[..], &kv(1, i)[..]);
    }
    for i in [1, 3, 4] {
        assert!(!m2.contains(&ids[i]));
    }
}

#[test]
fn named_checkpoints_travel_with_their_blocks() {
    let redis = RedisServer::start();
    let fp = Fingerprint::of(b"model");
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (_sa, ma) = host(a.path(), &redis.url(), &fp);
    let (_sb, mb) = host(b.path(), &redis.url(), &fp);
    let tokens: Vec<u32> = (0..10).collect();
    compute(&ma, &tokens[..8], 3);
    let tail = vec![9u8; geometry().span_bytes(2) as usize];
    let meta = Metadata {
        name: "chat-1".into(),
        ..Metadata::default()
    };
    let m = Manifest::new(
        fp,
        geometry(),
        tokens.clone(),
        (0..10).collect(),
        tail,
        meta,
    )
    .unwrap();
    ma.save(&m).unwrap();
    ma.push_remote_manifest(&m).unwrap();

    assert!(!mb.fetch_remote_checkpoint("absent").unwrap());
    assert!(mb.fetch_remote_checkpoint("chat-1").unwrap());
    let back = mb.load("chat-1").unwrap();
    assert_eq!(back.manifest.tokens, tokens);
    assert_eq!(&back.blocks[1][..], &kv(3, 1)[..]);
}

/// Every call returns within a bound (the timeout, plus the time to put what was read).
fn timed<T>(f: impl FnOnce() -> T) -> (T, Duration) {
    let t = Instant::now();
    let out = f();
    (out, t.elapsed())
}

#[test]
fn an_absent_killed_slow_or_full_redis_is_a_miss_and_comes_back() {
    let fp = Fingerprint::of(b"model");
    // Nothing listens on the port yet.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("redis://127.0.0.1:{port}");
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (_sa, ma) = host(a.path(), &url, &fp);
    let (_sb, mb) = host(b.path(), &url, &fp);
    let lines = common::log_of(&mb);
    let tokens: Vec<u32> = (0..16).collect();
    let ids = BlockId::chain_all(&fp, &tokens, TPB);

    // Absent at start: a miss at once, then calls are skipped until the backoff passes.
    let (got, took) = timed(|| mb.fetch_remote(&ids));
    assert_eq!(got.blocks, 0);
    assert!(!got.answered);
    assert!(took < Duration::from_millis(500), "{took:?}");
    let (got, _) = timed(|| mb.fetch_remote(&ids));
    assert!(!got.answered);
    let f = mb.remote().unwrap().metrics().figures();
    assert!(f.errors >= 1 && f.skipped >= 1 && !f.up, "{f:?}");
    assert_eq!(
        lines.lock().unwrap().len(),
        1,
        "said once: {:?}",
        lines.lock().unwrap()
    );

    // It starts: after the backoff, the next call connects.
    let mut redis = RedisServer::start_on(port);
    compute_when_up(&ma, &tokens);
    std::thread::sleep(Duration::from_millis(250));
    assert_eq!(mb.fetch_remote(&ids).blocks, ids.len());
    assert!(lines
        .lock()
        .unwrap()
        .last()
        .unwrap()
        .contains("reachable again"));

    // Killed mid-run: a miss, within the timeout.
    redis.stop();
    let more: Vec<u32> = (100..116).collect();
    let more_ids = BlockId::chain_all(&fp, &more, TPB);
    let (got, took) = timed(|| mb.fetch_remote(&more_ids));
    assert!(!got.answered);
    assert!(took < Duration::from_millis(500), "{took:?}");

    // Restarted: found again after the backoff.
    let redis = RedisServer::start_on(port);
    std::thread::sleep(Duration::from_millis(600));
    compute_when_up(&ma, &more);
    assert_eq!(mb.fetch_remote(&more_ids).blocks, more_ids.len());

    // Slow: a server busy for a second answers nothing within the timeout.
    let sleeper = {
        let port = redis.port();
        std::thread::spawn(move || {
            let _ = std::process::Command::new("redis-cli")
                .args(["-p", &port.to_string(), "DEBUG", "SLEEP", "1"])
                .output();
        })
    };
    std::thread::sleep(Duration::from_millis(100));
    let third: Vec<u32> = (200..208).collect();
    let (got, took) = timed(|| mb.fetch_remote(&BlockId::chain_all(&fp, &third, TPB)));
    assert!(!got.answered, "answered in {took:?}");
    assert!(
        took < Duration::from_millis(400),
        "waited {took:?} for a stuck server"
    );
    sleeper.join().unwrap();

    // Out of memory: writes are refused (counted, said once), reads still work.
    std::thread::sleep(Duration::from_millis(600));
    redis.cli(&["CONFIG", "SET", "maxmemory-policy", "noeviction"]);
    redis.cli(&["CONFIG", "SET", "maxmemory", "1"]);
    let fourth: Vec<u32> = (300..308).collect();
    let fourth_ids = BlockId::chain_all(&fp, &fourth, TPB);
    let kvs: Vec<Vec<u8>> = (0..2).map(|i| kv(9, i)).collect();
    let inputs = inputs(&fourth_ids, &fourth, &kvs);
    let errors = mb.remote().unwrap().metrics().figures().errors;
    assert!(mb.push_remote(&inputs).is_err());
    assert!(mb.remote().unwrap().metrics().figures().errors > errors);
    assert!(lines
        .lock()
        .unwrap()
        .last()
        .unwrap()
        .contains("refuses writes"));
    let (_sc, mc) = host(tempfile::tempdir().unwrap().path(), &url, &fp);
    assert_eq!(
        mc.fetch_remote(&more_ids).blocks,
        more_ids.len(),
        "reads go on"
    );
}

/// Computes `tokens`' blocks on `model` and pushes them, retrying while the tier's backoff
/// after an earlier failure lasts.
fn compute_when_up(model: &ModelStore, tokens: &[u32]) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let ids = BlockId::chain_all(&model.fingerprint(), tokens, TPB);
        let kvs: Vec<Vec<u8>> = (0..ids.len()).map(|i| kv(5, i)).collect();
        let inputs = inputs(&ids, tokens, &kvs);
        if model.push_remote(&inputs).is_ok() {
            return;
        }
        assert!(Instant::now() < deadline, "the tier never came back");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_password_and_a_database_from_the_url_are_used() {
    let redis = RedisServer::start();
    redis.cli(&["CONFIG", "SET", "requirepass", "s3cret"]);
    let fp = Fingerprint::of(b"model");
    let url = format!("redis://:s3cret@127.0.0.1:{}/2", redis.port());
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (_sa, ma) = host(a.path(), &url, &fp);
    let tokens: Vec<u32> = (0..8).collect();
    let ids = compute(&ma, &tokens, 4);
    // The values are in database 2, not 0.
    let count = |db: &str| {
        std::process::Command::new("redis-cli")
            .args([
                "-p",
                &redis.port().to_string(),
                "-a",
                "s3cret",
                "--no-auth-warning",
            ])
            .args(["-n", db, "DBSIZE"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
            .unwrap()
    };
    assert_eq!(count("2"), ids.len().to_string());
    assert_eq!(count("0"), "0");
    // A wrong password is a miss, never an error of the lookup.
    let wrong = format!("redis://:nope@127.0.0.1:{}/2", redis.port());
    let (_sb, mb) = host(b.path(), &wrong, &fp);
    let lines = common::log_of(&mb);
    let got = mb.fetch_remote(&ids);
    assert_eq!((got.blocks, got.answered), (0, false));
    assert!(mb.remote().unwrap().metrics().figures().errors >= 1);
    let said = lines.lock().unwrap().join("\n");
    assert!(
        said.contains("unavailable") && said.contains("WRONGPASS"),
        "{said}"
    );
}
