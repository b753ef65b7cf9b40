//! `ckpt bench-remote`: the remote tier's read throughput on a real Redis.
//!
//! One store writes `--blocks` blocks of a prompt to the tier; then, `--reps` times, a store on
//! a fresh directory (another host, holding nothing) brings them back: once with the tier's raw
//! call (every key's `GET` pipelined, a few values in flight), once with `fetch_remote` (the
//! same requests, each record verified and put into the RAM tier as it arrives), which is what
//! a prompt lookup pays. Medians, as JSON.

use std::io::Write;
use std::time::Instant;

use ckptfmt::store::BlockInput;
use ckptfmt::{BlockId, ElemType, Fingerprint, Geometry};
use kvstore::{Config, KvStore, Remote, RemoteConfig};
use serde_json::json;

use crate::CliError;

/// What to measure.
pub struct RemoteArgs {
    /// The Redis.
    pub url: String,
    /// Blocks of the prompt (31: a 2,000-token prompt).
    pub blocks: usize,
    /// Layers.
    pub layers: usize,
    /// Bytes per token per layer, for K and for V each.
    pub bytes_per_token: u32,
    /// Repetitions.
    pub reps: usize,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// A store on a fresh directory with the tier (its own namespace per run, so nothing else in
/// the Redis is read).
fn host(
    dir: &std::path::Path,
    a: &RemoteArgs,
    ns: &str,
) -> Result<(KvStore, kvstore::ModelStore), CliError> {
    let mut cfg = RemoteConfig::new(a.url.clone());
    cfg.namespace = ns.to_owned();
    // Reading 50 MB takes longer than the default per-read timeout allows on a slow machine.
    cfg.timeout = std::time::Duration::from_secs(5);
    let store = KvStore::open(
        dir,
        Config {
            remote: Some(Remote::open(&cfg)?),
            ram_budget: 4 << 30,
            ..Config::default()
        },
    )?;
    let geometry = Geometry::uniform(
        a.layers,
        a.bytes_per_token,
        a.bytes_per_token,
        ElemType::F16,
        64,
    )?;
    let model = store.model(Fingerprint::of(b"bench-remote"), geometry)?;
    Ok((store, model))
}

/// Runs the measurement; prints JSON to `out`.
pub fn run(a: &RemoteArgs, out: &mut dyn Write) -> Result<(), CliError> {
    let work = tempfile_dir()?;
    let ns = format!("bench-remote-{}", std::process::id());
    let (_writer, model) = host(&work.join("writer"), a, &ns)?;
    let block_bytes = model.geometry().block_bytes() as usize;
    let tokens: Vec<u32> = (0..(a.blocks * 64) as u32).collect();
    let ids = BlockId::chain_all(&model.fingerprint(), &tokens, 64);
    let kvs: Vec<Vec<u8>> = (0..a.blocks)
        .map(|i| (0..block_bytes).map(|j| (i * 7 + j) as u8).collect())
        .collect();
    let inputs: Vec<BlockInput<'_>> = (0..a.blocks)
        .map(|i| BlockInput {
            prev: i.checked_sub(1).map(|p| &ids[p]),
            tokens: &tokens[i * 64..(i + 1) * 64],
            kv: &kvs[i],
        })
        .collect();
    model.push_remote(&inputs)?;
    let remote = model
        .remote()
        .cloned()
        .ok_or_else(|| CliError::Usage("no remote".into()))?;
    let keys: Vec<String> = ids
        .iter()
        .map(|id| remote.block_key(&model.fingerprint(), model.geometry(), id))
        .collect();
    let record_bytes: usize = remote
        .tier()
        .get_many(&keys)?
        .iter()
        .map(|v| v.as_ref().map_or(0, Vec::len))
        .sum();
    let (mut raw, mut fetch) = (Vec::new(), Vec::new());
    for rep in 0..a.reps {
        let t = Instant::now();
        let got = remote.tier().get_many(&keys)?;
        let secs = t.elapsed().as_secs_f64();
        if got.iter().any(Option::is_none) {
            return Err(CliError::Usage(
                "the Redis lost values during the run".into(),
            ));
        }
        drop(got);
        raw.push(record_bytes as f64 / secs / 1e6);
        let (_reader, fresh) = host(&work.join(format!("reader-{rep}")), a, &ns)?;
        let t = Instant::now();
        let n = fresh.fetch_remote(&ids).blocks;
        let secs = t.elapsed().as_secs_f64();
        if n != a.blocks {
            return Err(CliError::Usage(format!(
                "fetched {n} of {} blocks",
                a.blocks
            )));
        }
        fetch.push(record_bytes as f64 / secs / 1e6);
    }
    let _ = std::fs::remove_dir_all(&work);
    let report = json!({
        "blocks": a.blocks,
        "record_bytes": record_bytes / a.blocks,
        "get_many_mb_s": median(raw.clone()),
        "fetch_remote_mb_s": median(fetch.clone()),
        "get_many_runs": raw,
        "fetch_remote_runs": fetch,
    });
    writeln!(out, "{report}")?;
    Ok(())
}

fn tempfile_dir() -> Result<std::path::PathBuf, CliError> {
    let dir = std::env::temp_dir().join(format!("ckpt-bench-remote-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}
