//! Reading the metadata of a GGUF file of N bytes allocates at most a small multiple of N, for the
//! worst layouts we can construct (regression: a 90 M-element one-byte array in a 98 MB file
//! used to take 2.9 GB, about 32 bytes per element).
//!
//! A counting global allocator measures the bytes requested while parsing (peak minus what was
//! live before). Each test holds one lock throughout, so no other test allocates meanwhile.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use engine::gguf::Gguf;

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);
static MEASURE: Mutex<()> = Mutex::new(());

// SAFETY: defers to the system allocator; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let live = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
        PEAK.fetch_max(live, Ordering::Relaxed);
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// The most heap bytes parsing may take per byte of file.
const MAX_RATIO: f64 = 5.0;

/// Held for a whole test, so no other test allocates while one measures.
fn exclusive() -> std::sync::MutexGuard<'static, ()> {
    MEASURE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Parses `bytes`; returns the parse result's `is_ok` and the peak extra heap per file byte.
fn measure(bytes: Vec<u8>) -> (bool, f64) {
    let n = bytes.len();
    let before = LIVE.load(Ordering::Relaxed);
    PEAK.store(before, Ordering::Relaxed);
    let parsed = Gguf::from_bytes(bytes);
    let peak = PEAK.load(Ordering::Relaxed);
    let ok = parsed.is_ok();
    drop(parsed);
    // The file's own bytes were live before; only what parsing added counts.
    let ratio = (peak - before) as f64 / n as f64;
    eprintln!(
        "{n} bytes: peak {} extra heap bytes, {ratio:.2} per file byte",
        peak - before
    );
    (ok, ratio)
}

fn header(n_tensors: u64, n_kv: u64) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(b"GGUF");
    b.extend_from_slice(&3u32.to_le_bytes());
    b.extend_from_slice(&n_tensors.to_le_bytes());
    b.extend_from_slice(&n_kv.to_le_bytes());
    b
}

fn key(b: &mut Vec<u8>, k: &[u8]) {
    b.extend_from_slice(&(k.len() as u64).to_le_bytes());
    b.extend_from_slice(k);
}

/// A distinct 3-byte lowercase name for `i < 26^3`.
fn distinct3(i: usize) -> [u8; 3] {
    [
        b'a' + (i / (26 * 26) % 26) as u8,
        b'a' + (i / 26 % 26) as u8,
        b'a' + (i % 26) as u8,
    ]
}

#[test]
fn a_90m_element_byte_array_in_a_98mb_file() {
    let _only = exclusive();
    let count = 90_000_000u64;
    let mut b = header(0, 1);
    key(&mut b, b"big");
    b.extend_from_slice(&9u32.to_le_bytes());
    b.extend_from_slice(&0u32.to_le_bytes());
    b.extend_from_slice(&count.to_le_bytes());
    b.resize(98_000_000, 7);
    // The rest of the file is the array plus trailing bytes: it parses.
    let (ok, ratio) = measure(b.clone());
    assert!(ok);
    assert!(ratio <= 1.1, "{ratio}");
    // Declared one element longer than the file holds: a typed error, no allocation.
    let at = 24 + 8 + 3 + 4 + 4;
    b[at..at + 8].copy_from_slice(&(98_000_000u64).to_le_bytes());
    let (ok, ratio) = measure(b);
    assert!(!ok);
    assert!(ratio < 0.01, "{ratio}");
}

#[test]
fn many_tiny_metadata_entries() {
    let _only = exclusive();
    // 3-byte keys with a u8 value: 16 bytes each.
    let n = 26 * 26 * 26;
    let mut b = header(0, n as u64);
    for i in 0..n {
        key(&mut b, &distinct3(i));
        b.extend_from_slice(&0u32.to_le_bytes());
        b.push(1);
    }
    let (ok, ratio) = measure(b);
    assert!(ok);
    assert!(ratio <= MAX_RATIO, "{ratio}");
}

#[test]
fn arrays_of_tiny_strings_and_of_empty_arrays() {
    let _only = exclusive();
    let n = 1_000_000u64;
    for elem_type in [8u32, 9] {
        let mut b = header(0, 1);
        key(&mut b, b"k");
        b.extend_from_slice(&9u32.to_le_bytes());
        b.extend_from_slice(&elem_type.to_le_bytes());
        b.extend_from_slice(&n.to_le_bytes());
        for _ in 0..n {
            if elem_type == 8 {
                // A one-byte string.
                b.extend_from_slice(&1u64.to_le_bytes());
                b.push(b'x');
            } else {
                // An empty array of u8.
                b.extend_from_slice(&0u32.to_le_bytes());
                b.extend_from_slice(&0u64.to_le_bytes());
            }
        }
        let (ok, ratio) = measure(b);
        assert!(ok);
        assert!(ratio <= MAX_RATIO, "element type {elem_type}: {ratio}");
    }
}

#[test]
fn many_tiny_tensor_infos() {
    let _only = exclusive();
    // Zero-dimensional f32 tensors with 3-byte names, all at offset 0: 27 bytes each.
    let n = 26 * 26 * 26;
    let mut b = header(n as u64, 0);
    for i in 0..n {
        key(&mut b, &distinct3(i));
        b.extend_from_slice(&0u32.to_le_bytes());
        b.extend_from_slice(&0u32.to_le_bytes());
        b.extend_from_slice(&0u64.to_le_bytes());
    }
    b.resize(b.len().div_ceil(32) * 32 + 4, 0);
    let (ok, ratio) = measure(b);
    assert!(ok);
    assert!(ratio <= MAX_RATIO, "{ratio}");
}
