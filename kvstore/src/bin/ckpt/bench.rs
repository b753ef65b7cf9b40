//! `ckpt bench`: writes and reads a synthetic checkpoint through a bare
//! `ckptfmt` store and prints JSON figures next to raw `write`+`fsync` and
//! raw `read` of the same bytes (`docs/BENCHMARKS.md`).
//!
//! The only `unsafe` of the tool: the mapped read passes map block files of
//! the scratch directory the bench created and never modifies (`UNSAFE.md`).

use std::borrow::Cow;
use std::io::{Read, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use ckptfmt::{
    ElemType, Encoding, Fingerprint, FormatError, Geometry, Manifest, Metadata, StdFs, Store, Vfs,
    VfsFile,
};
use serde_json::json;

use crate::CliError;

/// What to measure.
pub struct BenchArgs {
    /// Tokens in the checkpoint.
    pub tokens: u64,
    /// Layers.
    pub layers: usize,
    /// Bytes per token per layer, for K and for V each.
    pub bytes_per_token: u32,
    /// Tokens per block.
    pub tokens_per_block: u32,
    /// Store blocks as q8_0.
    pub q8: bool,
    /// Repetitions of each measurement.
    pub iters: u32,
}

/// Deterministic pseudo-random f16 data shaped like KV (values mostly in [-4, 4]).
fn synthetic_kv(n_bytes: usize, seed: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(n_bytes);
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    while out.len() < n_bytes {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        let u = (s >> 40) as f32 / (1u64 << 24) as f32; // [0, 1)
        let v = (u - 0.5) * 8.0 * u; // skewed, mostly small
        out.extend_from_slice(&half::f16::from_f32(v).to_le_bytes());
    }
    out.truncate(n_bytes);
    out
}

fn mbps(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / 1e6 / d.as_secs_f64().max(1e-9)
}

fn io_err<'p>(op: &'static str, p: &'p Path) -> impl FnOnce(std::io::Error) -> FormatError + 'p {
    move |e| FormatError::io(op, p, e)
}

/// Runs the bench in a fresh subdirectory of `dir` (removed afterwards) and
/// prints the figures as JSON.
pub fn run(dir: &Path, args: &BenchArgs, out: &mut dyn Write) -> Result<(), CliError> {
    let figures = measure(dir, args)?;
    writeln!(
        out,
        "{}",
        serde_json::to_string_pretty(&figures).unwrap_or_default()
    )?;
    Ok(())
}

/// The synthetic checkpoint every measurement uses, and the scratch directory.
struct Fixture {
    geometry: Geometry,
    fp: Fingerprint,
    work: std::path::PathBuf,
    n_tokens: u64,
    tpb: u32,
    n_blocks: usize,
    block_bytes: usize,
    blocks: Vec<Vec<u8>>,
    tail: Vec<u8>,
    tokens: Vec<u32>,
    positions: Vec<i32>,
    encoding: Encoding,
}

fn measure(dir: &Path, args: &BenchArgs) -> Result<serde_json::Value, FormatError> {
    let (n_tokens, layers, bpt, tpb, q8) = (
        args.tokens,
        args.layers,
        args.bytes_per_token,
        args.tokens_per_block,
        args.q8,
    );
    let iters = args.iters.max(1);
    let fx = fixture(dir, args)?;
    let tail_tokens = n_tokens % u64::from(tpb);
    let (best_write, written, store_dir) = durable_writes(&fx, iters)?;
    let (ext_tokens, ext_report) = extend_by_64(&fx, &store_dir)?;
    let raw_path = fx.work.join("raw.bin");
    let chunk = synthetic_kv(fx.block_bytes.max(1 << 20), 7);
    let best_raw_write = raw_writes(&fx.work, &raw_path, &chunk, written, iters)?;
    let best_raw_hint_write = raw_hint_writes(&fx.work, &raw_path, &chunk, written, iters)?;
    let mut checksum = 0u64;
    let reads = verified_reads(&store_dir, iters, &mut checksum)?;
    let best_raw_read = raw_reads(&raw_path, iters, &mut checksum)?;
    let (geometry, encoding, n_blocks, blocks, work) =
        (&fx.geometry, fx.encoding, fx.n_blocks, &fx.blocks, &fx.work);
    let (best_read, read_bytes, best_map_read, best_owned_read) = reads;
    let q8_error = (q8 && n_blocks > 0)
        .then(|| {
            let st = Store::open_existing(&store_dir).ok()?;
            let m = st.read_manifest("bench").ok()?;
            let b = st.read_block(&m.block_ids[0]).ok()?;
            let kv = b.view().ok()?.kv().ok()?.into_owned();
            Some(ckptfmt::quant::measure_error(&blocks[0], &kv))
        })
        .flatten();
    let _ = std::fs::remove_dir_all(work);

    let w = mbps(written, best_write);
    let rw = mbps(written, best_raw_write);
    let r = mbps(read_bytes, best_read);
    let rr = mbps(written, best_raw_read);
    let out = json!({
        "tokens": n_tokens,
        "layers": layers,
        "bytes_per_token_per_layer_k_and_v": bpt,
        "bytes_per_token": geometry.bytes_per_token(),
        "tokens_per_block": tpb,
        "encoding": encoding.name(),
        "blocks": n_blocks,
        "tail_tokens": tail_tokens,
        "bytes_written": written,
        "iters": iters,
        "durable_write_mb_s": w,
        "raw_write_fsync_mb_s": rw,
        "raw_write_hint_fsync_mb_s": mbps(written, best_raw_hint_write),
        "durable_write_ratio": w / rw,
        "read_verify_mb_s": r,
        "raw_read_mb_s": rr,
        "read_verify_ratio": r / rr,
        "map_each_read_verify_mb_s": mbps(read_bytes, best_map_read),
        "map_each_read_verify_ratio": mbps(read_bytes, best_map_read) / rr,
        "owned_read_verify_mb_s": mbps(read_bytes, best_owned_read),
        "extend_by_64_tokens": {
            "tokens": ext_tokens,
            "blocks_written": ext_report.blocks_written,
            "blocks_reused": ext_report.blocks_reused,
            "bytes_written": ext_report.bytes_written,
            "new_tokens_kv_bytes": 64 * geometry.bytes_per_token(),
            "overhead_bytes": ext_report.bytes_written as i64 - (64 * geometry.bytes_per_token()) as i64,
        },
        "q8_0_error": q8_error.map(|e| json!({"max_abs": e.max_abs, "rms": e.rms, "rel_rms": e.rel_rms})),
        "checksum": checksum,
    });
    Ok(out)
}

/// The checkpoint `args` describe, in memory, and a fresh scratch directory under `dir`.
fn fixture(dir: &Path, args: &BenchArgs) -> Result<Fixture, FormatError> {
    let (n_tokens, layers, bpt, tpb, q8) = (
        args.tokens,
        args.layers,
        args.bytes_per_token,
        args.tokens_per_block,
        args.q8,
    );
    let geometry = Geometry::uniform(layers, bpt, bpt, ElemType::F16, tpb)?;
    let fp = Fingerprint::of(b"ckpt bench");
    let work = dir.join(format!("ckpt-bench-{}", std::process::id()));
    std::fs::create_dir_all(&work).map_err(io_err("mkdir", &work))?;
    let n_blocks = (n_tokens / u64::from(tpb)) as usize;
    let block_bytes = geometry.block_bytes() as usize;
    let blocks: Vec<Vec<u8>> = (0..n_blocks)
        .map(|i| synthetic_kv(block_bytes, i as u64 + 1))
        .collect();
    let tail = synthetic_kv(geometry.span_bytes(n_tokens % u64::from(tpb)) as usize, 999);
    let tokens: Vec<u32> = (0..n_tokens as u32)
        .map(|t| t.wrapping_mul(2_654_435_761) % 49_152)
        .collect();
    let positions: Vec<i32> = (0..n_tokens as i32).collect();
    let encoding = if q8 { Encoding::Q8_0 } else { Encoding::Raw };
    Ok(Fixture {
        geometry,
        fp,
        work,
        n_tokens,
        tpb,
        n_blocks,
        block_bytes,
        blocks,
        tail,
        tokens,
        positions,
        encoding,
    })
}

/// Durable writes of the checkpoint, a fresh store per iteration: the best time, the bytes
/// written and the last store's directory (kept).
fn durable_writes(
    fx: &Fixture,
    iters: u32,
) -> Result<(Duration, u64, std::path::PathBuf), FormatError> {
    let Fixture {
        geometry,
        fp,
        work,
        blocks,
        tail,
        tokens,
        positions,
        encoding,
        ..
    } = fx;
    let (fp, encoding) = (*fp, *encoding);
    let mut best_write = Duration::MAX;
    let mut written = 0u64;
    let mut store_dir = work.join("store-0");
    for it in 0..iters {
        store_dir = work.join(format!("store-{it}"));
        let _ = std::fs::remove_dir_all(&store_dir);
        let store = Store::open(&store_dir, fp, geometry.clone())?;
        let meta = Metadata {
            name: "bench".into(),
            ..Metadata::default()
        };
        let m = Manifest::new(
            fp,
            geometry.clone(),
            tokens.clone(),
            positions.clone(),
            tail.clone(),
            meta,
        )?;
        let t = Instant::now();
        let r = store.save(&m, |i| Ok(Cow::Borrowed(&blocks[i][..])), encoding)?;
        let d = t.elapsed();
        written = r.bytes_written;
        best_write = best_write.min(d);
        if it + 1 < iters {
            let _ = std::fs::remove_dir_all(&store_dir);
        }
    }

    Ok((best_write, written, store_dir))
}

/// Incremental: a checkpoint extending the last one by 64 tokens, saved into `store_dir`.
fn extend_by_64(fx: &Fixture, store_dir: &Path) -> Result<(u64, ckptfmt::SaveReport), FormatError> {
    let Fixture {
        geometry,
        fp,
        n_tokens,
        tpb,
        n_blocks,
        block_bytes,
        blocks,
        encoding,
        ..
    } = fx;
    let (fp, n_tokens, tpb, n_blocks, block_bytes, encoding) =
        (*fp, *n_tokens, *tpb, *n_blocks, *block_bytes, *encoding);
    let ext_tokens = n_tokens + 64;
    let ext_tok: Vec<u32> = (0..ext_tokens as u32)
        .map(|t| t.wrapping_mul(2_654_435_761) % 49_152)
        .collect();
    let ext_blocks = (ext_tokens / u64::from(tpb)) as usize;
    let extra: Vec<Vec<u8>> = (n_blocks..ext_blocks)
        .map(|i| synthetic_kv(block_bytes, i as u64 + 1))
        .collect();
    let ext_tail = synthetic_kv(
        geometry.span_bytes(ext_tokens % u64::from(tpb)) as usize,
        998,
    );
    let ext_meta = Metadata {
        name: "bench-extended".into(),
        parent: Some("bench".into()),
        ..Metadata::default()
    };
    let ext_m = Manifest::new(
        fp,
        geometry.clone(),
        ext_tok,
        (0..ext_tokens as i32).collect(),
        ext_tail,
        ext_meta,
    )?;
    let ext_report = {
        let store = Store::open_existing(store_dir)?;
        store.save(
            &ext_m,
            |i| {
                Ok(Cow::Borrowed(if i < n_blocks {
                    &blocks[i][..]
                } else {
                    &extra[i - n_blocks][..]
                }))
            },
            encoding,
        )?
    };

    Ok((ext_tokens, ext_report))
}

/// Raw write + fsync of `written` bytes, one file: the best time.
fn raw_writes(
    work: &Path,
    raw_path: &Path,
    chunk: &[u8],
    written: u64,
    iters: u32,
) -> Result<Duration, FormatError> {
    let mut best_raw_write = Duration::MAX;
    for _ in 0..iters {
        let _ = std::fs::remove_file(raw_path);
        let t = Instant::now();
        let mut f = std::fs::File::create(raw_path).map_err(io_err("create", raw_path))?;
        let mut left = written as usize;
        while left > 0 {
            let n = left.min(chunk.len());
            f.write_all(&chunk[..n])
                .map_err(io_err("write", raw_path))?;
            left -= n;
        }
        f.sync_data().map_err(io_err("fsync", raw_path))?;
        drop(f);
        std::fs::File::open(work)
            .and_then(|d| d.sync_all())
            .map_err(io_err("fsync", work))?;
        best_raw_write = best_raw_write.min(t.elapsed());
    }

    Ok(best_raw_write)
}

/// Raw write + fsync through the same writeback hint the store uses (StdFs), to show what
/// the hint alone is worth: the best time.
fn raw_hint_writes(
    work: &Path,
    raw_path: &Path,
    chunk: &[u8],
    written: u64,
    iters: u32,
) -> Result<Duration, FormatError> {
    let mut best_raw_hint_write = Duration::MAX;
    for _ in 0..iters {
        let _ = std::fs::remove_file(raw_path);
        let t = Instant::now();
        let mut f = StdFs.create(raw_path).map_err(io_err("create", raw_path))?;
        let mut left = written as usize;
        while left > 0 {
            let n = left.min(chunk.len());
            f.write_all(&chunk[..n])
                .map_err(io_err("write", raw_path))?;
            left -= n;
        }
        f.sync().map_err(io_err("fsync", raw_path))?;
        drop(f);
        StdFs.sync_dir(work).map_err(io_err("fsync", work))?;
        best_raw_hint_write = best_raw_hint_write.min(t.elapsed());
    }

    Ok(best_raw_hint_write)
}

/// The store's reads of checkpoint "bench" in `store_dir`, each verifying every block: through
/// maps kept, maps made on each pass, and owned reads. Returns the best time of the first,
/// the bytes it reads, and the best times of the other two.
fn verified_reads(
    store_dir: &Path,
    iters: u32,
    checksum: &mut u64,
) -> Result<(Duration, u64, Duration, Duration), FormatError> {
    // Read + verify of the mapped, cached checkpoint: the blocks are mapped
    // once (as a long-lived reader keeps them); each pass reads the manifest
    // and re-verifies every block (header, id, payload CRC) before using it.
    let store = Store::open_existing(store_dir)?;
    let m0 = store.read_manifest("bench")?;
    let maps = m0
        .block_ids
        .iter()
        // SAFETY: the bench owns the directory and nothing modifies its files.
        .map(|id| unsafe { store.map_block(id) })
        .collect::<Result<Vec<_>, _>>()?;
    let mut best_read = Duration::MAX;
    let mut read_bytes = 0u64;
    for _ in 0..=iters {
        let t = Instant::now();
        let m = store.read_manifest("bench")?;
        let mut n = m.tail_kv.len() as u64;
        for mb in &maps {
            let v = mb.verify()?;
            let kv = v.kv()?;
            *checksum = checksum.wrapping_add(u64::from(kv[kv.len() / 2]));
            n += kv.len() as u64;
        }
        best_read = best_read.min(t.elapsed());
        read_bytes = n;
    }
    drop(maps);

    // The same, but opening and mapping every block file on each pass.
    let mut best_map_read = Duration::MAX;
    for _ in 0..=iters {
        let t = Instant::now();
        let m = store.read_manifest("bench")?;
        for id in &m.block_ids {
            // SAFETY: as above.
            let mb = unsafe { store.map_block(id) }?;
            let v = mb.view()?;
            let kv = v.kv()?;
            *checksum = checksum.wrapping_add(u64::from(kv[kv.len() / 2]));
        }
        best_map_read = best_map_read.min(t.elapsed());
    }

    // Owned read: read() every block file into memory and verify it.
    let mut best_owned_read = Duration::MAX;
    for _ in 0..=iters {
        let t = Instant::now();
        let m = store.read_manifest("bench")?;
        for id in &m.block_ids {
            let b = store.read_block(id)?;
            *checksum = checksum.wrapping_add(b.as_bytes().len() as u64);
        }
        best_owned_read = best_owned_read.min(t.elapsed());
    }

    Ok((best_read, read_bytes, best_map_read, best_owned_read))
}

/// Raw read of the same bytes from the page cache: the best time.
fn raw_reads(raw_path: &Path, iters: u32, checksum: &mut u64) -> Result<Duration, FormatError> {
    let mut buf = vec![0u8; 1 << 20];
    let mut best_raw_read = Duration::MAX;
    for _ in 0..=iters {
        let t = Instant::now();
        let mut f = std::fs::File::open(raw_path).map_err(io_err("open", raw_path))?;
        loop {
            let n = f.read(&mut buf).map_err(io_err("read", raw_path))?;
            if n == 0 {
                break;
            }
            *checksum = checksum.wrapping_add(u64::from(buf[n / 2]));
        }
        best_raw_read = best_raw_read.min(t.elapsed());
    }
    Ok(best_raw_read)
}
