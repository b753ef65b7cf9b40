//! `--fingerprint`: what the model fingerprint costs. Side by side in one process, each a median
//! of `--reps`: reading the model file whole in 1 MiB reads (as `dd` would), hashing every byte
//! of it for the fingerprint (a loaded model, the hashing alone), and a load that finds the
//! fingerprint remembered in a cache directory. Both with the file in the page cache ("warm")
//! and with its pages dropped first ("cold": `posix_fadvise(DONTNEED)`, so both read the disk).

use std::io::Read;
use std::path::Path;
use std::time::Instant;

use anyhow::Result;
use engine::{FingerprintOrigin, Model};

/// Drops the file's clean pages from the page cache.
fn drop_pages(path: &Path) -> Result<()> {
    let f = std::fs::File::open(path)?;
    rustix::fs::fadvise(&f, 0, None, rustix::fs::Advice::DontNeed)?;
    Ok(())
}

/// Reads the file in 1 MiB reads; returns milliseconds.
fn read_whole(path: &Path) -> Result<f64> {
    let t = Instant::now();
    let mut f = std::fs::File::open(path)?;
    let mut buf = vec![0u8; 1 << 20];
    let mut n = 0usize;
    loop {
        let k = f.read(&mut buf)?;
        if k == 0 {
            break;
        }
        n += k;
    }
    std::hint::black_box(n);
    Ok(t.elapsed().as_secs_f64() * 1e3)
}

/// Loads the model (not timed), then hashes it; returns milliseconds of the hashing.
fn hash(path: &Path) -> Result<f64> {
    let model = Model::load(path)?;
    let t = Instant::now();
    std::hint::black_box(model.fingerprint());
    Ok(t.elapsed().as_secs_f64() * 1e3)
}

/// Loads the model and takes its fingerprint from the record in `cache`; returns milliseconds
/// of the fingerprint step and whether it was remembered.
fn remembered(path: &Path, cache: &Path) -> Result<(f64, bool)> {
    let model = Model::load(path)?;
    let t = Instant::now();
    let (_, origin) = model.remember_fingerprint(cache);
    Ok((
        t.elapsed().as_secs_f64() * 1e3,
        origin == FingerprintOrigin::Remembered,
    ))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The figures, as JSON.
pub fn fingerprint_cost(path: &Path, reps: usize) -> Result<serde_json::Value> {
    let cache = tempfile::tempdir()?;
    let bytes = std::fs::metadata(path)?.len();
    let mut out = serde_json::Map::new();
    out.insert("file_bytes".into(), bytes.into());
    for cold in [false, true] {
        let (mut read, mut hashed) = (Vec::new(), Vec::new());
        for _ in 0..reps.max(1) {
            if cold {
                drop_pages(path)?;
            }
            read.push(read_whole(path)?);
            if cold {
                drop_pages(path)?;
            }
            hashed.push(hash(path)?);
        }
        let (read, hashed) = (median(read), median(hashed));
        let key = if cold { "cold" } else { "warm" };
        out.insert(
            key.into(),
            serde_json::json!({
                "read_ms": read,
                "hash_ms": hashed,
                "hash_over_read": hashed / read,
            }),
        );
    }
    remembered(path, cache.path())?;
    let mut again = Vec::new();
    for _ in 0..reps.max(1) {
        let (ms, hit) = remembered(path, cache.path())?;
        anyhow::ensure!(
            hit,
            "the fingerprint was hashed again for an unchanged file"
        );
        again.push(ms);
    }
    out.insert("remembered_ms".into(), median(again).into());
    Ok(out.into())
}
