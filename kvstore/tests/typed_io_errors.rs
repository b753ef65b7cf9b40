//! A full disk and a read-only filesystem are told apart from damaged files: whichever write of
//! a save or a flush fails, the error is `NoSpace` or `NotWritable`, never a format error, and
//! what was stored before stays readable.

mod common;

use std::path::Path;

use common::*;
use kvstore::{Fault, FaultIo, KvStore, StoreError};

/// Puts 12 tokens' blocks, flushes and saves a checkpoint, with `fault` armed at operation
/// `at` (counted from the store's opening); returns the first error, if any fired.
fn run(at: u64, fault: Fault) -> (FaultIo, Option<StoreError>) {
    let io = FaultIo::new();
    let store = KvStore::open_with(io.clone(), Path::new("/kv"), inline_config(8)).unwrap();
    let model = store.model(fp(), geometry()).unwrap();
    let first: Vec<u32> = (0..8).collect();
    put_tokens(&model, &first).unwrap();
    model.save(&manifest("before", &first)).unwrap();
    store.flush().unwrap();
    io.arm(io.ops() + at, fault);
    let tokens: Vec<u32> = (50..62).collect();
    let err = put_tokens(&model, &tokens)
        .err()
        .or_else(|| store.flush().err())
        .or_else(|| model.save(&manifest("after", &tokens)).err());
    // The checkpoint written before the fault is intact.
    io.disarm();
    assert!(model.list().unwrap().iter().any(|m| m == "before"));
    (io, err)
}

#[test]
fn a_full_disk_is_no_space_wherever_the_write_fails() {
    let mut fired = 0;
    for at in 0..40 {
        let (io, err) = run(at, Fault::NoSpace);
        if io.take_fired().is_none() {
            continue;
        }
        fired += 1;
        let err = err.unwrap_or_else(|| panic!("ENOSPC at op {at} was not reported"));
        assert!(
            matches!(err, StoreError::NoSpace { .. } | StoreError::Spill { .. }),
            "op {at}: {err:?}"
        );
        assert!(err.is_no_space(), "op {at}: {err}");
        let text = err.to_string();
        assert!(text.contains("no space"), "op {at}: {text}");
        assert!(!text.contains("format error"), "op {at}: {text}");
    }
    assert!(fired > 3, "only {fired} faults fired");
}

#[test]
fn a_read_only_filesystem_is_not_writable() {
    let mut fired = 0;
    for at in 0..40 {
        let (io, err) = run(at, Fault::ReadOnly);
        if io.take_fired().is_none() {
            continue;
        }
        fired += 1;
        let err = err.unwrap_or_else(|| panic!("EROFS at op {at} was not reported"));
        let typed = match &err {
            StoreError::Spill { source } => matches!(**source, StoreError::NotWritable { .. }),
            e => matches!(e, StoreError::NotWritable { .. }),
        };
        assert!(typed, "op {at}: {err:?}");
        assert!(!err.to_string().contains("format error"), "op {at}: {err}");
    }
    assert!(fired > 3, "only {fired} faults fired");
}
