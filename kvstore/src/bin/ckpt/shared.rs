//! `ckpt bench-shared`: several processes saving checkpoints into one store at once.
//!
//! Each worker process (this binary again, with `--worker`) opens the same store directory and
//! saves `--checkpoints` checkpoints of `--tokens` tokens each, every one of them new KV (its
//! own blocks, then its manifest, durably). The parent times the whole run for 1 process and
//! for `--processes` processes, and next to it the same bytes written and fsynced as plain
//! files by as many threads (one file per checkpoint), so the figures read as aggregate MB/s
//! against raw I/O of the same volume and parallelism.

use std::io::Write;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

use ckptfmt::{
    ElemType, Fingerprint, FormatError, Geometry, Manifest, Metadata, StdFs, Vfs, VfsFile,
};
use kvstore::{Config, KvStore};
use serde_json::json;

use crate::CliError;

/// Shape of one worker's work.
#[derive(Clone, Copy)]
pub struct SharedArgs {
    /// Checkpoints each worker saves.
    pub checkpoints: usize,
    /// Tokens of each checkpoint.
    pub tokens: u32,
    /// Layers.
    pub layers: usize,
    /// Bytes per token per layer, for K and for V each.
    pub bytes_per_token: u32,
}

const TOKENS_PER_BLOCK: u32 = 64;

fn geometry(a: &SharedArgs) -> Result<Geometry, CliError> {
    Ok(Geometry::uniform(
        a.layers,
        a.bytes_per_token,
        a.bytes_per_token,
        ElemType::F16,
        TOKENS_PER_BLOCK,
    )?)
}

/// Bytes of KV one checkpoint holds.
fn checkpoint_bytes(a: &SharedArgs) -> Result<u64, CliError> {
    Ok(geometry(a)?.span_bytes(u64::from(a.tokens)))
}

/// Filler bytes that differ per `seed` (content does not matter to the store's speed, and
/// making it must cost next to nothing, or the figures would measure the filler).
fn filler(n: usize, seed: u64) -> Vec<u8> {
    let mut v = vec![seed as u8; n];
    let head = seed.to_le_bytes();
    let k = head.len().min(n);
    v[..k].copy_from_slice(&head[..k]);
    v
}

/// One worker: saves its checkpoints into the store at `dir`.
pub fn worker(dir: &Path, id: usize, a: &SharedArgs) -> Result<(), CliError> {
    let store = KvStore::open(dir, Config::default())?;
    let geometry = geometry(a)?;
    let fp = Fingerprint::of(b"ckpt bench-shared");
    let handle = store.model(fp, geometry.clone())?;
    let block_bytes = geometry.block_bytes() as usize;
    let n_blocks = (a.tokens / TOKENS_PER_BLOCK) as usize;
    for c in 0..a.checkpoints {
        // Tokens unique to this worker and checkpoint, so every block is new.
        let base = ((id * a.checkpoints + c) as u32) << 16;
        let tokens: Vec<u32> = (0..a.tokens).map(|t| base + t).collect();
        let mut prev = None;
        for b in 0..n_blocks {
            let span = &tokens[b * TOKENS_PER_BLOCK as usize..][..TOKENS_PER_BLOCK as usize];
            let kv = filler(block_bytes, u64::from(base) + b as u64);
            prev = Some(handle.put(prev.as_ref(), span, kv)?);
        }
        let tail = filler(
            geometry.span_bytes(u64::from(a.tokens % TOKENS_PER_BLOCK)) as usize,
            u64::from(base),
        );
        let m = Manifest::new(
            fp,
            geometry.clone(),
            tokens,
            (0..a.tokens as i32).collect(),
            tail,
            Metadata {
                name: format!("w{id}-c{c}"),
                ..Metadata::default()
            },
        )?;
        handle.save(&m)?;
    }
    store.flush()?;
    Ok(())
}

/// Seconds for `processes` workers saving at once into a fresh store under `work`.
fn run_store(work: &Path, processes: usize, a: &SharedArgs) -> Result<f64, CliError> {
    let dir = work.join(format!("store-{processes}"));
    let _ = std::fs::remove_dir_all(&dir);
    let exe =
        std::env::current_exe().map_err(|e| FormatError::io("locate", Path::new("ckpt"), e))?;
    let t = Instant::now();
    let children = (0..processes)
        .map(|id| {
            Command::new(&exe)
                .arg("bench-shared")
                .arg("--dir")
                .arg(&dir)
                .arg("--worker")
                .arg(id.to_string())
                .arg("--checkpoints")
                .arg(a.checkpoints.to_string())
                .arg("--tokens")
                .arg(a.tokens.to_string())
                .arg("--layers")
                .arg(a.layers.to_string())
                .arg("--bytes-per-token")
                .arg(a.bytes_per_token.to_string())
                .spawn()
                .map_err(|e| FormatError::io("spawn", &exe, e))
        })
        .collect::<Result<Vec<_>, _>>()?;
    for mut c in children {
        let status = c.wait().map_err(|e| FormatError::io("wait for", &exe, e))?;
        if !status.success() {
            return Err(CliError::Usage(format!("a worker failed: {status}")));
        }
    }
    let secs = t.elapsed().as_secs_f64();
    let _ = std::fs::remove_dir_all(&dir);
    Ok(secs)
}

/// Seconds for `threads` threads each writing and fsyncing their checkpoints' bytes as plain
/// files (one file per checkpoint, the directory synced after each).
fn run_raw(work: &Path, threads: usize, a: &SharedArgs) -> Result<f64, CliError> {
    let dir = work.join(format!("raw-{threads}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| FormatError::io("mkdir", &dir, e))?;
    let bytes = checkpoint_bytes(a)? as usize;
    let t = Instant::now();
    std::thread::scope(|s| -> Result<(), CliError> {
        let jobs: Vec<_> = (0..threads)
            .map(|id| {
                let dir = &dir;
                s.spawn(move || -> std::io::Result<()> {
                    for c in 0..a.checkpoints {
                        let data = filler(bytes, (id * 1000 + c) as u64);
                        let p = dir.join(format!("w{id}-c{c}"));
                        let mut f = StdFs.create(&p)?;
                        f.write_all(&data)?;
                        f.sync()?;
                        StdFs.sync_dir(dir)?;
                    }
                    Ok(())
                })
            })
            .collect();
        for j in jobs {
            j.join()
                .map_err(|_| CliError::Usage("a writer thread panicked".into()))?
                .map_err(|e| FormatError::io("write", &dir, e))?;
        }
        Ok(())
    })?;
    let secs = t.elapsed().as_secs_f64();
    let _ = std::fs::remove_dir_all(&dir);
    Ok(secs)
}

/// Runs the comparison in a fresh subdirectory of `dir` and prints JSON.
pub fn run(
    dir: &Path,
    processes: usize,
    reps: usize,
    a: &SharedArgs,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let work = dir.join(format!("ckpt-bench-shared-{}", std::process::id()));
    std::fs::create_dir_all(&work).map_err(|e| FormatError::io("mkdir", &work, e))?;
    let per_worker = checkpoint_bytes(a)? as f64 * a.checkpoints as f64;
    let mut rows = Vec::new();
    for p in [1, processes.max(1)] {
        let (mut store_s, mut raw_s) = (Vec::new(), Vec::new());
        // Alternating, so both see the same machine.
        for _ in 0..reps.max(1) {
            store_s.push(run_store(&work, p, a)?);
            raw_s.push(run_raw(&work, p, a)?);
        }
        let (s, r) = (median(&mut store_s), median(&mut raw_s));
        let mb = per_worker * p as f64 / 1e6;
        rows.push(json!({
            "processes": p,
            "mb": mb,
            "store_mb_s": mb / s,
            "raw_mb_s": mb / r,
            "store_vs_raw": r / s,
            "checkpoints_per_s": (a.checkpoints * p) as f64 / s,
        }));
        if processes <= 1 {
            break;
        }
    }
    let _ = std::fs::remove_dir_all(&work);
    writeln!(
        out,
        "{}",
        serde_json::to_string_pretty(&json!({
            "tokens_per_checkpoint": a.tokens,
            "checkpoints_per_process": a.checkpoints,
            "runs": rows,
        }))
        .unwrap_or_default()
    )?;
    Ok(())
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}
