//! `kvstore` benchmarks as one small binary (no criterion: the figures are
//! throughputs and hit rates measured against raw file I/O in the same run).
//!
//! ```text
//! cargo bench -p kvstore --bench kvbench -- [ram] [spill] [service] [policy]
//! ```
//!
//! With no section named, all run. `KVBENCH_DIR` picks the scratch directory
//! (default: the system temporary directory). Cold reads drop the files from
//! the page cache first with `dd iflag=nocache` (POSIX_FADV_DONTNEED).

use std::collections::HashMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use ckptfmt::{ElemType, Fingerprint, Geometry, Manifest, Metadata};
use kvstore::{BlockId, Config, KvStore, Metrics, PolicyKind};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --all-targets` does not, and
    // then this binary only says how to run it (the service needs ~1.6 GB).
    if !std::env::args().any(|a| a == "--bench") {
        println!("kvbench: run with `cargo bench -p kvstore --bench kvbench`");
        return;
    }
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let all = args.is_empty();
    let want = |s: &str| all || args.iter().any(|a| a == s);
    let base = std::env::var_os("KVBENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let scratch = tempfile::tempdir_in(base).expect("scratch dir");
    println!("scratch: {}", scratch.path().display());
    if want("ram") {
        bench_ram(scratch.path());
    }
    if want("spill") {
        bench_spill(scratch.path());
    }
    if want("warm") {
        bench_warm(scratch.path());
    }
    if want("parse") {
        bench_parse();
    }
    if want("policy") {
        bench_policy_trace();
    }
    if want("service") {
        for policy in [PolicyKind::Lru, PolicyKind::S3Fifo] {
            bench_service(scratch.path(), policy, &[1, 4], 16, "service");
        }
    }
    if want("cold") {
        // 0 stands for one reader in the calling thread (no background threads).
        bench_service(
            scratch.path(),
            PolicyKind::S3Fifo,
            &[0, 1, 2, 4, 8],
            64,
            "cold",
        );
    }
}

fn mib_s(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / (1 << 20) as f64 / d.as_secs_f64()
}

/// Drops files from the page cache (clean pages only; they were synced).
fn drop_cache(paths: &[PathBuf]) {
    for chunk in paths.chunks(64) {
        for p in chunk {
            let _ = Command::new("dd")
                .arg(format!("if={}", p.display()))
                .args(["iflag=nocache", "count=0", "status=none"])
                .status();
        }
    }
}

fn fill(id: &BlockId, len: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(len);
    while v.len() < len {
        let n = (len - v.len()).min(32);
        v.extend_from_slice(&id.0[..n]);
    }
    v
}

fn bench_ram(dir: &Path) {
    println!("\n## RAM tier: put/get operations per second");
    let geometry = Geometry::uniform(1, 32, 32, ElemType::F16, 16).unwrap();
    let bb = geometry.block_bytes() as usize;
    let fp = Fingerprint::of(b"bench ram");
    let cfg = Config {
        ram_budget: 1 << 30,
        ..Config::default()
    };
    let store = KvStore::open(dir.join("ram"), cfg).unwrap();
    let model = store.model(fp, geometry).unwrap();
    let n = 200_000u32;
    let tokens: Vec<Vec<u32>> = (0..n).map(|i| (i * 16..i * 16 + 16).collect()).collect();
    let kvs: Vec<Vec<u8>> = (0..n).map(|i| vec![i as u8; bb]).collect();
    let t = Instant::now();
    let mut ids = Vec::with_capacity(n as usize);
    for (tok, kv) in tokens.iter().zip(kvs) {
        ids.push(model.put(None, tok, kv).unwrap());
    }
    let d = t.elapsed();
    println!(
        "put   {n} blocks of {bb} B (id hashing included): {:.0} ops/s",
        n as f64 / d.as_secs_f64()
    );
    let mut rng = StdRng::seed_from_u64(1);
    let order: Vec<usize> = (0..1_000_000)
        .map(|_| rng.gen_range(0..ids.len()))
        .collect();
    let t = Instant::now();
    let mut sum = 0u64;
    for &i in &order {
        sum += model.get(&ids[i]).unwrap().unwrap()[0] as u64;
    }
    let d = t.elapsed();
    println!(
        "get   1,000,000 random RAM hits, 1 thread: {:.0} ops/s (checksum {sum})",
        order.len() as f64 / d.as_secs_f64()
    );
    let t = Instant::now();
    std::thread::scope(|s| {
        for k in 0..2 {
            let (model, ids, order) = (&model, &ids, &order);
            s.spawn(move || {
                for &i in order.iter().skip(k).step_by(2) {
                    model.get(&ids[i]).unwrap().unwrap();
                }
            });
        }
    });
    let d = t.elapsed();
    println!(
        "get   1,000,000 random RAM hits, 2 threads: {:.0} ops/s",
        order.len() as f64 / d.as_secs_f64()
    );
    let t = Instant::now();
    for (tok, id) in tokens.iter().zip(&ids).take(100_000) {
        let again = model.put(None, tok, vec![0u8; bb]).unwrap();
        assert_eq!(again, *id);
    }
    let d = t.elapsed();
    println!(
        "put   100,000 duplicate blocks (dedup hits): {:.0} ops/s",
        100_000.0 / d.as_secs_f64()
    );
}

fn bench_spill(dir: &Path) {
    println!("\n## Spill and promote vs raw file I/O (SmolLM2 geometry, 64-token blocks)");
    // 30 layers x (384 + 384) bytes per token = 23,040 bytes per token in f16.
    let geometry = Geometry::uniform(30, 384, 384, ElemType::F16, 64).unwrap();
    let bb = geometry.block_bytes() as usize;
    let fp = Fingerprint::of(b"bench spill");
    let n = 128u32;
    let cfg = Config {
        ram_budget: 8 * bb as u64,
        max_spill_backlog: 48 * bb as u64,
        spill_batch_bytes: 16 * bb as u64,
        ..Config::default()
    };
    let tokens: Vec<Vec<u32>> = (0..n).map(|i| (i * 64..i * 64 + 64).collect()).collect();
    let ids: Vec<BlockId> = tokens
        .iter()
        .map(|t| BlockId::chain(&fp, None, t))
        .collect();
    let total = n as u64 * bb as u64;
    let spill = |root: &Path| -> (Duration, Vec<PathBuf>) {
        let store = KvStore::open(root, cfg.clone()).unwrap();
        let model = store.model(fp, geometry.clone()).unwrap();
        let kvs: Vec<Vec<u8>> = ids.iter().map(|id| fill(id, bb)).collect();
        let t = Instant::now();
        for (tok, kv) in tokens.iter().zip(kvs) {
            model.put(None, tok, kv).unwrap();
        }
        store.flush().unwrap();
        let d = t.elapsed();
        let m = store.metrics();
        assert_eq!(m.spills + m.writes, n as u64);
        (d, ids.iter().map(|id| model.block_path(id)).collect())
    };
    // Raw: the same number of files of the same size, each written and
    // fdatasync'd, renamed, one directory sync (the same durability).
    let raw_write = |raw_dir: &Path, record_len: usize| -> (Duration, Vec<PathBuf>) {
        fs::create_dir_all(raw_dir).unwrap();
        let bufs: Vec<Vec<u8>> = (0..n).map(|i| vec![i as u8 | 1; record_len]).collect();
        let t = Instant::now();
        let mut paths = Vec::new();
        for (i, b) in bufs.iter().enumerate() {
            let tmp = raw_dir.join(format!("{i}.tmp"));
            let mut f = fs::File::create(&tmp).unwrap();
            f.write_all(b).unwrap();
            f.sync_data().unwrap();
            let p = raw_dir.join(format!("{i}.blk"));
            fs::rename(&tmp, &p).unwrap();
            paths.push(p);
        }
        fs::File::open(raw_dir).unwrap().sync_all().unwrap();
        (t.elapsed(), paths)
    };
    let mut paths = Vec::new();
    for round in 0..3 {
        let root = dir.join(format!("spill{round}"));
        let raw_dir = dir.join(format!("raw{round}"));
        let record_len = 1_478_656;
        let (d_kv, d_raw) = if round % 2 == 0 {
            let (d_kv, p) = spill(&root);
            paths = p;
            (d_kv, raw_write(&raw_dir, record_len).0)
        } else {
            let d_raw = raw_write(&raw_dir, record_len).0;
            let (d_kv, p) = spill(&root);
            paths = p;
            (d_kv, d_raw)
        };
        assert_eq!(fs::metadata(&paths[0]).unwrap().len() as usize, record_len);
        println!(
            "round {round}: spill {n} blocks x {bb} B (put + write-behind + flush): {:.0} MiB/s; raw write of {n} files x {record_len} B, fdatasync each: {:.0} MiB/s",
            mib_s(total, d_kv),
            mib_s(n as u64 * record_len as u64, d_raw)
        );
        fs::remove_dir_all(&raw_dir).unwrap();
    }
    // Promote: reopen with room for everything; read every block cold.
    let big = Config {
        ram_budget: 1 << 30,
        ..cfg.clone()
    };
    let root = dir.join("spill2");
    for round in 0..3 {
        let store = KvStore::open(&root, big.clone()).unwrap();
        let model = store.model(fp, geometry.clone()).unwrap();
        let ours = || {
            drop_cache(&paths);
            let t = Instant::now();
            for id in &ids {
                model.get(id).unwrap().unwrap();
            }
            t.elapsed()
        };
        // Raw read into RAM: the buffers are kept, as the RAM tier keeps its copies.
        let raw = || {
            drop_cache(&paths);
            let t = Instant::now();
            let kept: Vec<Vec<u8>> = paths.iter().map(|p| fs::read(p).unwrap()).collect();
            let d = t.elapsed();
            (d, kept.iter().map(Vec::len).sum::<usize>())
        };
        let (d_kv, (d_raw, sum)) = if round % 2 == 0 {
            let a = ours();
            (a, raw())
        } else {
            let b = raw();
            (ours(), b)
        };
        println!(
            "round {round}: promote {n} blocks cold (read + verify CRC + insert): {:.0} MiB/s; raw fs::read of the same files cold, kept in RAM: {:.0} MiB/s; ratio {:.2}x",
            mib_s(total, d_kv),
            mib_s(sum as u64, d_raw),
            d_kv.as_secs_f64() / d_raw.as_secs_f64()
        );
    }
}

/// A Zipf(s) sampler over `n` items by inverse CDF.
struct Zipf {
    cdf: Vec<f64>,
}

impl Zipf {
    fn new(n: usize, s: f64) -> Self {
        let mut acc = 0.0;
        let mut cdf = Vec::with_capacity(n);
        for k in 1..=n {
            acc += 1.0 / (k as f64).powf(s);
            cdf.push(acc);
        }
        for c in &mut cdf {
            *c /= acc;
        }
        Zipf { cdf }
    }

    fn sample(&self, rng: &mut StdRng) -> usize {
        let u: f64 = rng.gen();
        self.cdf.partition_point(|&c| c < u).min(self.cdf.len() - 1)
    }
}

fn bench_policy_trace() {
    println!("\n## Policies on a block trace (simulation only, no I/O)");
    // 1,000 sessions of 8 to 64 blocks; Zipf(1.0) session popularity; each
    // access reads all of a session's blocks in order; capacity 10% of blocks.
    let mut rng = StdRng::seed_from_u64(7);
    let lens: Vec<u64> = (0..1000).map(|_| rng.gen_range(8..=64)).collect();
    let mut starts = Vec::new();
    let mut acc = 0u64;
    for l in &lens {
        starts.push(acc);
        acc += l;
    }
    let zipf = Zipf::new(1000, 1.0);
    let mut trace = Vec::new();
    for _ in 0..20_000 {
        let s = zipf.sample(&mut rng);
        trace.extend(starts[s]..starts[s] + lens[s]);
    }
    let cap = (acc / 10) as usize;
    for kind in [PolicyKind::Lru, PolicyKind::S3Fifo] {
        let hits = kvstore::policy::simulate(kind, cap, &trace);
        println!(
            "{kind:?}: {:.1}% block hit rate ({} accesses, capacity {cap} of {acc} blocks)",
            100.0 * hits as f64 / trace.len() as f64,
            trace.len()
        );
    }
}

fn delta(a: &Metrics, b: &Metrics) -> (u64, u64, u64) {
    (
        b.ram_hits - a.ram_hits,
        b.disk_hits - a.disk_hits,
        b.misses - a.misses,
    )
}

fn bench_service(dir: &Path, policy: PolicyKind, readers: &[usize], n_cold: usize, label: &str) {
    // SmolLM2's 23,040 bytes per token scaled down 64x: 30 layers x (6 + 6) bytes.
    const SCALE: u64 = 64;
    let geometry = Geometry::uniform(30, 6, 6, ElemType::F16, 64).unwrap();
    let bpt = geometry.bytes_per_token();
    assert_eq!(bpt * SCALE, 23_040);
    let tpb = geometry.tokens_per_block() as usize;
    let fp = Fingerprint::of(b"bench service");
    let n_sessions = 1000usize;
    let mut rng = StdRng::seed_from_u64(42);
    let sessions: Vec<Vec<u32>> = (0..n_sessions)
        .map(|i| {
            let len = rng.gen_range(500..=4000usize);
            let shared = if i % 2 == 0 { 1000 } else { 0 };
            (0..len)
                .map(|j| {
                    if j < shared {
                        j as u32
                    } else {
                        (i as u32 + 1) * 100_000 + j as u32
                    }
                })
                .collect()
        })
        .collect();
    let logical: u64 = sessions.iter().map(|s| s.len() as u64 * bpt).sum();
    let cfg = Config {
        ram_budget: logical / 10,
        disk_quota: 64 << 30,
        policy,
        ..Config::default()
    };
    println!(
        "\n## Synthetic service, policy {policy:?}: {n_sessions} sessions, 500-4,000 tokens, half share a 1,000-token prompt; {bpt} B/token (SmolLM2 / {SCALE}); logical KV {:.0} MiB, RAM budget {:.0} MiB",
        logical as f64 / (1 << 20) as f64,
        cfg.ram_budget as f64 / (1 << 20) as f64
    );
    let root = dir.join(format!("{label}-{policy:?}"));
    let store = KvStore::open(&root, cfg.clone()).unwrap();
    let model = store.model(fp, geometry.clone()).unwrap();
    let t = Instant::now();
    for (i, tokens) in sessions.iter().enumerate() {
        let ids = BlockId::chain_all(&fp, tokens, tpb as u32);
        let live = model
            .put_sequence_pinned(tokens, |b| fill(&ids[b], geometry.block_bytes() as usize))
            .unwrap();
        let tail = vec![0u8; geometry.span_bytes((tokens.len() % tpb) as u64) as usize];
        let meta = Metadata {
            name: format!("s{i}"),
            ..Metadata::default()
        };
        let positions = (0..tokens.len() as i32).collect();
        let m = Manifest::new(fp, geometry.clone(), tokens.clone(), positions, tail, meta).unwrap();
        model.save(&m).unwrap();
        drop(live);
    }
    store.flush().unwrap();
    let d_build = t.elapsed();
    let m0 = store.metrics();
    println!(
        "build: {:.1} s ({:.0} MiB/s logical); deduplicated {} blocks = {:.1} MiB ({:.1}% of logical); disk {:.0} MiB in {} files",
        d_build.as_secs_f64(),
        mib_s(logical, d_build),
        m0.dedup_blocks,
        m0.dedup_bytes as f64 / (1 << 20) as f64,
        100.0 * m0.dedup_bytes as f64 / logical as f64,
        m0.disk_bytes as f64 / (1 << 20) as f64,
        m0.disk_blocks
    );
    // Skewed access: Zipf(1.0) over a random permutation of the sessions;
    // each access resumes the session (reads all its blocks).
    let mut perm: Vec<usize> = (0..n_sessions).collect();
    for i in (1..perm.len()).rev() {
        perm.swap(i, rng.gen_range(0..=i));
    }
    let zipf = Zipf::new(n_sessions, 1.0);
    let mut counts: HashMap<usize, u32> = HashMap::new();
    let t = Instant::now();
    let n_access = 3000;
    for _ in 0..n_access {
        let s = perm[zipf.sample(&mut rng)];
        *counts.entry(s).or_default() += 1;
        let cp = model.load(&format!("s{s}")).unwrap();
        assert_eq!(cp.blocks.len(), sessions[s].len() / tpb);
    }
    let d_access = t.elapsed();
    let m1 = store.metrics();
    let (ram, disk, miss) = delta(&m0, &m1);
    let all = (ram + disk + miss) as f64;
    println!(
        "access: {n_access} resumes in {:.1} s; block hits RAM {:.1}%, disk {:.1}%, miss {:.1}%; evictions {}, promotions {}",
        d_access.as_secs_f64(),
        100.0 * ram as f64 / all,
        100.0 * disk as f64 / all,
        100.0 * miss as f64 / all,
        m1.evictions - m0.evictions,
        m1.promotions - m0.promotions
    );
    drop(model);
    drop(store);
    cold_resumes(&root, &cfg, fp, &geometry, &sessions, readers, n_cold);
}

/// Cold resumes: reopens the store at `root` (the RAM tier starts empty) once per count of
/// `readers` and brings `n_cold` sessions that do not share the prompt into RAM, against a raw
/// read of the same files.
fn cold_resumes(
    root: &Path,
    cfg: &Config,
    fp: Fingerprint,
    geometry: &Geometry,
    sessions: &[Vec<u32>],
    readers: &[usize],
    n_cold: usize,
) {
    let n_sessions = sessions.len();
    let tpb = geometry.tokens_per_block() as usize;
    let cold: Vec<usize> = (0..n_sessions)
        .filter(|s| s % 2 == 1)
        .take(n_cold)
        .collect();
    for &r in readers {
        let store = KvStore::open(
            root,
            Config {
                prefetch_readers: r.max(1),
                background: r > 0,
                ..cfg.clone()
            },
        )
        .unwrap();
        let model = store.model(fp, geometry.clone()).unwrap();
        let mut t_kv = Duration::ZERO;
        let mut t_raw = Duration::ZERO;
        let mut bytes = 0u64;
        for (k, s) in cold.iter().enumerate() {
            let ids = BlockId::chain_all(&fp, &sessions[*s], tpb as u32);
            let paths: Vec<PathBuf> = ids.iter().map(|id| model.block_path(id)).collect();
            let raw = || {
                drop_cache(&paths);
                let t = Instant::now();
                let kept: Vec<Vec<u8>> = paths.iter().map(|p| fs::read(p).unwrap()).collect();
                let d = t.elapsed();
                (d, kept.iter().map(|k| k.len() as u64).sum::<u64>())
            };
            let ours = || {
                drop_cache(&paths);
                let t = Instant::now();
                let n = model.prefetch(&format!("s{s}")).unwrap().wait().unwrap();
                let d = t.elapsed();
                assert_eq!(n, ids.len());
                d
            };
            // Alternate the order so neither side always runs second.
            if k % 2 == 0 {
                let (d, n) = raw();
                t_raw += d;
                bytes += n;
                t_kv += ours();
            } else {
                t_kv += ours();
                let (d, n) = raw();
                t_raw += d;
                bytes += n;
            }
        }
        println!(
            "cold resume, {} prefetch reader(s): {} sessions, {:.1} MiB of block files: prefetch into RAM {:.1} ms vs sequential raw read into RAM {:.1} ms = {:.2}x",
            if r == 0 {
                "1 (inline)".to_string()
            } else {
                r.to_string()
            },
            cold.len(),
            bytes as f64 / (1 << 20) as f64,
            t_kv.as_secs_f64() * 1e3,
            t_raw.as_secs_f64() * 1e3,
            t_kv.as_secs_f64() / t_raw.as_secs_f64()
        );
    }
}

fn bench_parse() {
    println!("\n## Verifying a block record in memory (CPU cost of promotion)");
    let geometry = Geometry::uniform(30, 384, 384, ElemType::F16, 64).unwrap();
    let fp = Fingerprint::of(b"bench parse");
    let tokens: Vec<u32> = (0..64).collect();
    let kv = vec![3u8; geometry.block_bytes() as usize];
    let rec = ckptfmt::encode_block(&fp, &geometry, None, &tokens, &kv, ckptfmt::Encoding::Raw)
        .unwrap()
        .to_vec();
    let n = 200;
    let t = Instant::now();
    for _ in 0..n {
        let v = ckptfmt::BlockView::parse(&rec).unwrap();
        assert_eq!(v.n_tokens(), 64);
    }
    let d = t.elapsed();
    println!(
        "BlockView::parse: {:.0} MiB/s",
        mib_s(n * rec.len() as u64, d)
    );
    let t = Instant::now();
    for _ in 0..n {
        let c = crc32fast::hash(&rec);
        assert_ne!(c, 1);
    }
    println!(
        "crc32fast alone: {:.0} MiB/s",
        mib_s(n * rec.len() as u64, t.elapsed())
    );
}

fn bench_warm(dir: &Path) {
    println!("\n## Promotion from the page cache (CPU cost per block, 23,040-byte blocks)");
    let geometry = Geometry::uniform(30, 6, 6, ElemType::F16, 64).unwrap();
    let bb = geometry.block_bytes() as usize;
    let fp = Fingerprint::of(b"bench warm");
    let root = dir.join("warm");
    let n = 4000u32;
    let cfg = Config {
        ram_budget: 1 << 30,
        ..Config::default()
    };
    let tokens: Vec<Vec<u32>> = (0..n).map(|i| (i * 64..i * 64 + 64).collect()).collect();
    let ids: Vec<BlockId> = tokens
        .iter()
        .map(|t| BlockId::chain(&fp, None, t))
        .collect();
    {
        let store = KvStore::open(&root, cfg.clone()).unwrap();
        let model = store.model(fp, geometry.clone()).unwrap();
        for (t, id) in tokens.iter().zip(&ids) {
            model.put(None, t, fill(id, bb)).unwrap();
        }
        store.flush().unwrap();
    }
    for round in 0..3 {
        let store = KvStore::open(&root, cfg.clone()).unwrap();
        let model = store.model(fp, geometry.clone()).unwrap();
        let paths: Vec<PathBuf> = ids.iter().map(|id| model.block_path(id)).collect();
        let t = Instant::now();
        let kept: Vec<Vec<u8>> = paths.iter().map(|p| fs::read(p).unwrap()).collect();
        let d_raw = t.elapsed();
        drop(kept);
        let t = Instant::now();
        for id in &ids {
            model.get(id).unwrap().unwrap();
        }
        let d_kv = t.elapsed();
        println!(
            "round {round}: {n} blocks: get (promote) {:.1} us/block, raw fs::read kept {:.1} us/block, ratio {:.2}x",
            d_kv.as_secs_f64() * 1e6 / n as f64,
            d_raw.as_secs_f64() * 1e6 / n as f64,
            d_kv.as_secs_f64() / d_raw.as_secs_f64()
        );
    }
}
