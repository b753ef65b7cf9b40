//! Blocks fetched back from the remote tier (a real `redis-server`) land on disk within the
//! disk budget: room is made before they are written, as for blocks put here, also while a
//! checkpoint is being saved. The directory is measured from another thread all the while they
//! are spilled and flushed.

mod common;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use ckptfmt::store::BlockInput;
use ckptfmt::{ElemType, Fingerprint, Geometry, Manifest, Metadata};
use kvstore::remote::testing::RedisServer;
use kvstore::{BlockId, Config, KvStore, ModelStore, Remote, RemoteConfig};

const TPB: u32 = 16;

/// Two layers of 16 K and 16 V halves per token: 2 KiB of KV per block.
fn geometry() -> Geometry {
    Geometry::uniform(2, 16, 16, ElemType::F16, TPB).unwrap()
}

/// A store in `dir` on the remote tier `url`, with a RAM budget of `ram_blocks` blocks and a
/// disk budget of `disk` bytes (`None`: none).
fn host(dir: &Path, url: &str, ram_blocks: u64, disk: Option<u64>) -> (KvStore, ModelStore) {
    let mut remote = RemoteConfig::new(url);
    remote.namespace = "budget".into();
    let cfg = Config {
        remote: Some(Remote::open(&remote).unwrap()),
        ram_budget: ram_blocks * geometry().block_bytes(),
        // As the engine opens its stores: no quota, the budget kept by collecting.
        disk_quota: u64::MAX,
        disk_budget: disk,
        ..Config::default()
    };
    let store = KvStore::open(dir, cfg).unwrap();
    let model = store.model(Fingerprint::of(b"model"), geometry()).unwrap();
    (store, model)
}

/// Bytes of the files under `dir`, however deep (files that vanish meanwhile count nothing).
fn dir_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => dir_bytes(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

/// Measures `dir` over and over on its own thread until stopped; keeps the largest size seen
/// and how many times it looked.
struct Sampler {
    stop: Arc<AtomicBool>,
    peak: Arc<AtomicU64>,
    samples: Arc<AtomicU64>,
    thread: JoinHandle<()>,
}

impl Sampler {
    fn start(dir: PathBuf) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let peak = Arc::new(AtomicU64::new(0));
        let samples = Arc::new(AtomicU64::new(0));
        let (s, p, n) = (stop.clone(), peak.clone(), samples.clone());
        let thread = std::thread::spawn(move || loop {
            // Read the flag first: the last pass measures after everything was written.
            let last = s.load(Ordering::Acquire);
            p.fetch_max(dir_bytes(&dir), Ordering::Relaxed);
            n.fetch_add(1, Ordering::Relaxed);
            if last {
                return;
            }
        });
        Sampler {
            stop,
            peak,
            samples,
            thread,
        }
    }

    /// Stops the thread; the largest size seen and the number of looks.
    fn finish(self) -> (u64, u64) {
        self.stop.store(true, Ordering::Release);
        self.thread.join().unwrap();
        (
            self.peak.load(Ordering::Relaxed),
            self.samples.load(Ordering::Relaxed),
        )
    }
}

/// `n` blocks of one token stream, computed on a host of their own and pushed to the tier;
/// their ids and tokens.
fn computed_elsewhere(url: &str, n: usize) -> (Vec<BlockId>, Vec<u32>) {
    let dir = tempfile::tempdir().unwrap();
    let (_store, model) = host(dir.path(), url, 1 << 20, None);
    let tpb = TPB as usize;
    let tokens: Vec<u32> = (0..(n * tpb) as u32).collect();
    let ids = BlockId::chain_all(&model.fingerprint(), &tokens, TPB);
    let kvs: Vec<Vec<u8>> = (0..n)
        .map(|i| common::seeded_kv(&geometry(), 5, i))
        .collect();
    let inputs: Vec<BlockInput<'_>> = (0..n)
        .map(|i| BlockInput {
            prev: i.checked_sub(1).map(|p| &ids[p]),
            tokens: &tokens[i * tpb..(i + 1) * tpb],
            kv: &kvs[i],
        })
        .collect();
    assert_eq!(model.push_remote(&inputs).unwrap(), n);
    (ids, tokens)
}

/// A checkpoint over the first `len` of `tokens` (the last block partly filled).
fn checkpoint(tokens: &[u32], len: usize) -> Manifest {
    let g = geometry();
    let tail = vec![7u8; g.span_bytes((len % TPB as usize) as u64) as usize];
    let meta = Metadata {
        name: "tail".into(),
        ..Metadata::default()
    };
    let fp = Fingerprint::of(b"model");
    let positions = (0..len as i32).collect();
    Manifest::new(fp, g, tokens[..len].to_vec(), positions, tail, meta).unwrap()
}

#[test]
fn blocks_fetched_from_redis_are_written_within_the_disk_budget() {
    let redis = RedisServer::start();
    let n = 240;
    let (ids, tokens) = computed_elsewhere(&redis.url(), n);

    let dir = tempfile::tempdir().unwrap();
    let (store, model) = host(dir.path(), &redis.url(), 8, Some(0));
    let file = model.block_file_bytes();
    // Room for 24 block files (a tenth of what comes back), the store's own files included.
    let budget = 24 * file + dir_bytes(dir.path());
    drop((store, model));
    let (store, model) = host(dir.path(), &redis.url(), 8, Some(budget));

    let sampler = Sampler::start(dir.path().to_path_buf());
    // In pieces, as prompts come (each continues the one before); RAM holds 8 blocks, so most
    // are spilled while they arrive, and a flush after each piece writes the rest. Meanwhile
    // another thread saves a checkpoint of the first blocks over and over, as the server's
    // writer stores tails: room is made while a save is in progress too.
    let pieces: Vec<&[BlockId]> = ids.chunks(30).collect();
    let fetch = |piece: &[BlockId]| {
        let got = model.fetch_remote(piece);
        assert!(got.answered);
        assert_eq!(got.blocks, piece.len(), "every block verifies");
        // Whatever is still dirty in RAM goes to disk too.
        store.flush().unwrap();
        got.blocks
    };
    let mut fetched = fetch(pieces[0]);
    let tail = checkpoint(&tokens, 2 * TPB as usize + 3);
    model.save(&tail).unwrap();
    let manifest_file = std::fs::metadata(model.manifest_path("tail").unwrap())
        .unwrap()
        .len();
    let mut saves = 0;
    for piece in &pieces[1..] {
        std::thread::scope(|scope| {
            let saver = scope.spawn(|| model.save(&tail));
            fetched += fetch(piece);
            saver.join().unwrap().unwrap();
        });
        saves += 1;
    }
    assert_eq!(saves, pieces.len() - 1);
    let (peak, samples) = sampler.finish();

    assert_eq!(fetched, n);
    let m = store.metrics();
    assert!(
        m.bytes_written >= n as u64 * file,
        "every block reached the disk once at least ({} bytes written)",
        m.bytes_written
    );
    assert!(
        samples > 1,
        "the directory was measured while it was written"
    );
    assert!(
        peak <= budget + file,
        "the directory reached {peak} bytes; the budget is {budget} ({} block files), a block \
         file {file} bytes, the checkpoint's manifest {manifest_file} ({samples} samples)",
        budget / file
    );
    assert!(
        dir_bytes(dir.path()) <= budget,
        "within the budget at the end"
    );
}
