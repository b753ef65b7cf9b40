//! What attention reads spilled pages through (`spill.rs` decides what; this module does the
//! reading, with raw addresses): the staging op's kernel, which copies a window's rows from the
//! pool and from mapped block files (widening q8_0 at rest), the prefetch op's kernel, and the
//! memory hints and maps of block files.

use std::ffi::{c_int, c_void};
use std::path::Path;

use ckptfmt::{BlockId, FormatError, MappedBlock};
use ggml_sys as sys;

/// Where a run of staged rows comes from.
#[derive(Clone, Copy)]
pub(crate) enum Src {
    /// The pool's cells from this one on.
    Pool(usize),
    /// A block file's rows from this address on (inside a map the context keeps).
    File(*const u8),
    /// The same, rows at rest as q8_0, widened to the pool's f16 as they are copied.
    Widen(*const u8),
    /// Zeros.
    Zero,
}

impl Src {
    /// Whether `next` continues a run of `n` rows (`rows`: bytes of one in the pool and at
    /// rest) from `self`.
    pub(crate) fn follows(self, next: Src, n: usize, rows: [usize; 2]) -> bool {
        match (self, next) {
            (Src::Pool(a), Src::Pool(b)) => a + n == b,
            (Src::File(a), Src::File(b)) => a.wrapping_add(n * rows[0]) == b,
            (Src::Widen(a), Src::Widen(b)) => a.wrapping_add(n * rows[1]) == b,
            (Src::Zero, Src::Zero) => true,
            _ => false,
        }
    }
}

/// `n` rows of the staged window from row `dst`.
pub(crate) struct Run {
    pub dst: usize,
    pub n: usize,
    pub src: Src,
}

/// One staging op: the window's rows of one layer's K or V.
pub(crate) struct StageOp {
    pub runs: Vec<Run>,
    pub row_bytes: usize,
    /// Bytes of a row at rest (`Widen` runs).
    pub rest_row: usize,
    pub n_rows: usize,
    /// Address ranges to hint to the kernel once copied (the next layers' spans).
    pub prefetch: Vec<(usize, usize)>,
    /// The thread that hints them, if one runs (else the op's thread 0 does).
    pub hinter: Option<Hinter>,
    /// The same rows as a page table (i64 addresses of each page's first row) for an
    /// attention kernel that reads them where they lie; empty where the window is not whole
    /// pages or the pool is not in host memory.
    pub pages: Vec<u8>,
}

impl StageOp {
    /// Rows of the staged window.
    pub(crate) fn n_rows(&self) -> usize {
        self.n_rows
    }

    /// The window's page table (see the field), empty when there is none.
    pub(crate) fn page_table(&self) -> &[u8] {
        &self.pages
    }

    /// Whether the op hints ranges to the kernel.
    pub(crate) fn prefetches(&self) -> bool {
        !self.prefetch.is_empty()
    }
}

/// A ggml custom op's kernel that only hints the next layer's spans to the kernel (thread 0),
/// for attention that reads pages through a table and stages nothing.
///
/// # Safety
///
/// `userdata` points to a live [`StageOp`]; `dst` is not written.
pub(crate) unsafe extern "C" fn prefetch_spans(
    _dst: *mut sys::ggml_tensor,
    ith: c_int,
    _nth: c_int,
    userdata: *mut c_void,
) {
    if ith != 0 {
        return;
    }
    // SAFETY: the caller's contract.
    let op = unsafe { &*(userdata as *const StageOp) };
    op.hint();
}

impl StageOp {
    /// Hints [`StageOp::prefetch`]: through the hinter thread where there is one, else here.
    fn hint(&self) {
        if self.prefetch.is_empty() {
            return;
        }
        if let Some(h) = &self.hinter {
            if h.tx.send(self.prefetch.clone()).is_ok() {
                return;
            }
        }
        for &(addr, len) in &self.prefetch {
            will_need(addr, len);
        }
    }
}

/// A thread that hints address ranges of mapped files to the kernel in the order given: a
/// hint may wait for the device's queue, and then no compute thread waits with it. A hint
/// changes no byte and a range no longer mapped only fails, so a late hint is harmless.
#[derive(Clone)]
pub(crate) struct Hinter {
    tx: std::sync::mpsc::Sender<Vec<(usize, usize)>>,
}

impl Hinter {
    /// Starts the thread; `None` where it cannot start (the ops then hint themselves). It
    /// ends when the last `Hinter` is dropped.
    pub(crate) fn spawn() -> Option<Hinter> {
        let (tx, rx) = std::sync::mpsc::channel::<Vec<(usize, usize)>>();
        std::thread::Builder::new()
            .name("kv-read-ahead".into())
            .spawn(move || {
                while let Ok(spans) = rx.recv() {
                    for (addr, len) in spans {
                        will_need(addr, len);
                    }
                }
            })
            .ok()?;
        Some(Hinter { tx })
    }
}

/// Staging kernel, run by every thread of a ggml custom op: `dst` (the staged window, `n_rows`
/// rows of `row_bytes`) gets its rows from `dst->src[0]` (the layer's K or V in the pool, after
/// this batch's rows were stored) or from mapped block files, each thread a share of the rows.
///
/// # Safety
///
/// `userdata` points to a live [`StageOp`] whose `File` addresses lie inside maps that outlive
/// the graph's computation, with `row_bytes` bytes per row readable from each; `dst` has
/// `n_rows * row_bytes` bytes and `src[0]` the pool's cells every `Pool` run names.
pub(crate) unsafe extern "C" fn stage_rows(
    dst: *mut sys::ggml_tensor,
    ith: c_int,
    nth: c_int,
    userdata: *mut c_void,
) {
    // SAFETY: the caller's contract (the graph keeps the op and the maps alive).
    let op = unsafe { &*(userdata as *const StageOp) };
    let (ith, nth) = (ith.max(0) as usize, nth.max(1) as usize);
    let per = op.n_rows.div_ceil(nth);
    let (lo, hi) = (ith * per, ((ith + 1) * per).min(op.n_rows));
    let rb = op.row_bytes;
    // SAFETY: live tensors of the running graph.
    let (out, cache) = unsafe { ((*dst).data as *mut u8, (*(*dst).src[0]).data as *const u8) };
    for r in &op.runs {
        let (a, b) = (r.dst.max(lo), (r.dst + r.n).min(hi));
        if a >= b {
            continue;
        }
        let skip = (a - r.dst) * rb;
        let len = (b - a) * rb;
        // SAFETY: the ranges lie inside `dst`, the pool and the maps (the contract above);
        // they do not overlap (the staged window is a tensor of its own).
        unsafe {
            let to = out.add(a * rb);
            match r.src {
                Src::Pool(c) => std::ptr::copy_nonoverlapping(cache.add(c * rb + skip), to, len),
                Src::File(p) => std::ptr::copy_nonoverlapping(p.add(skip), to, len),
                Src::Widen(p) => {
                    let rows = b - a;
                    let q = std::slice::from_raw_parts(
                        p.add((a - r.dst) * op.rest_row),
                        rows * op.rest_row,
                    );
                    let wide = std::slice::from_raw_parts_mut(to, len);
                    if !ckptfmt::quant::dequantize_f16_into(q, wide) {
                        // Not whole q8_0 groups (a layout the spill refuses): NaN, visibly.
                        std::ptr::write_bytes(to, 0xff, len);
                    }
                }
                Src::Zero => std::ptr::write_bytes(to, 0, len),
            }
        }
    }
    if ith == 0 {
        op.hint();
    }
}

/// Asks the kernel to read `len` bytes of a mapped file at `addr` ahead (no effect on error).
fn will_need(addr: usize, len: usize) {
    #[cfg(unix)]
    {
        let page = 4096;
        let start = addr / page * page;
        // SAFETY: a hint over pages of a live map (`MADV_WILLNEED` reads nothing into the
        // process and changes no byte); a range reaching past the map only fails.
        let _ = unsafe {
            libc::madvise(
                start as *mut c_void,
                addr + len - start,
                libc::MADV_WILLNEED,
            )
        };
    }
    #[cfg(not(unix))]
    let _ = (addr, len);
}

/// Whether a fault in a mapped block file reads only the pages it needs (`random`:
/// `MADV_RANDOM`) or also the pages around them (`MADV_NORMAL`, the kernel's read-around).
pub(crate) fn advise_random(map: &[u8], random: bool) {
    #[cfg(unix)]
    {
        let advice = match random {
            true => libc::MADV_RANDOM,
            false => libc::MADV_NORMAL,
        };
        // SAFETY: advice over a live read-only map of a file, which changes no byte it reads.
        unsafe {
            libc::madvise(map.as_ptr() as *mut c_void, map.len(), advice);
        }
    }
    #[cfg(not(unix))]
    let _ = (map, random);
}

/// Drops a mapped block file's bytes from memory: this process's page table entries for the
/// map (`madvise(DONTNEED)`; a file map faults the file's bytes in again on the next read, so
/// no byte read changes), then the file's pages in the page cache (`posix_fadvise(DONTNEED)`).
pub(crate) fn drop_cached(map: &[u8], path: &Path) {
    #[cfg(unix)]
    // SAFETY: advice over a live read-only map of a file, which changes no byte it reads.
    unsafe {
        libc::madvise(map.as_ptr() as *mut c_void, map.len(), libc::MADV_DONTNEED);
    }
    #[cfg(target_os = "linux")]
    if let Ok(f) = std::fs::File::open(path) {
        use std::os::fd::AsRawFd;
        // SAFETY: a hint over an open file descriptor, borrowed for the call.
        unsafe {
            libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED);
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = path;
}

/// Maps block `id`'s file from `files`, verified whole (`verify`) or its header, id and owner
/// only (the caller verifies it before first reading it: [`MappedBlock::verify`]).
pub(crate) fn map_block_file(
    files: &ckptfmt::Store,
    id: &BlockId,
    verify: bool,
) -> Result<MappedBlock, FormatError> {
    match verify {
        // SAFETY: the store never writes a block file in place (it writes a temporary file
        // and renames it, and gc unlinks), so the mapped bytes do not change while the map
        // lives.
        true => unsafe { files.map_block(id) },
        // SAFETY: as above.
        false => unsafe { files.map_block_unverified(id) },
    }
}
