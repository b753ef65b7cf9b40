//! Fault injection: fail or crash at every mutating file-system operation of
//! a save and check that the previous checkpoint always loads and the new one
//! is all or nothing.

mod common;

use ckptfmt::{CrashMode, FaultFs, FaultMode, FormatError, Store};
use common::{assert_checkpoint, fp, small_geometry, Sequence};
use std::path::Path;

const ROOT: &str = "/store";

fn open(fs: &FaultFs) -> Store<FaultFs> {
    Store::open_with(fs.clone(), Path::new(ROOT), fp(), small_geometry()).unwrap()
}

/// Runs `scenario` with a fault at every operation index, in every mode.
/// `new_name` is the checkpoint being saved; `same_name` says whether it
/// replaces the base checkpoint.
fn run_all(extend_to: usize, same_name: bool) {
    let g = small_geometry();
    let base = Sequence::new(&g, 10, 1);
    let base_m = base.manifest("base", None);
    let new = Sequence::new(&g, extend_to, 1);
    let new_name = if same_name { "base" } else { "next" };
    let new_m = new.manifest(new_name, Some("base"));

    // Count the operations of a fault-free save.
    let fs = FaultFs::new();
    let store = open(&fs);
    base.save(&store, &base_m).unwrap();
    let before = fs.ops();
    new.save(&store, &new_m).unwrap();
    let total = fs.ops() - before;
    assert!(total >= 4, "a save makes several operations, got {total}");

    let crash_modes = [
        None,
        Some(CrashMode::DropUnsynced),
        Some(CrashMode::Random(1)),
        Some(CrashMode::Random(2)),
        Some(CrashMode::Random(3)),
    ];
    let mut outcomes = [0usize; 2];
    for k in 0..total {
        for fault in [FaultMode::Error, FaultMode::Crash] {
            for crash in crash_modes {
                let fs = FaultFs::new();
                let store = open(&fs);
                base.save(&store, &base_m).unwrap();
                fs.fail_at(Some((fs.ops() + k, fault)));
                let res = new.save(&store, &new_m);
                assert!(
                    matches!(res, Err(FormatError::Io { .. })),
                    "fault at op {k} must fail the save, got {res:?}"
                );
                match crash {
                    Some(mode) => fs.crash(mode),
                    None if fault == FaultMode::Crash => fs.crash(CrashMode::DropUnsynced),
                    None => {}
                }
                drop(store);
                let store = open(&fs);
                // The old checkpoint always loads, intact, unless it was
                // replaced by the complete new one.
                let got = store.read_manifest(new_name);
                let committed = match &got {
                    Ok(m) if *m == new_m => true,
                    Ok(m) if same_name => {
                        assert_eq!(*m, base_m, "op {k}: neither old nor new");
                        false
                    }
                    Ok(m) => panic!("op {k}: unexpected checkpoint {m:?}"),
                    Err(FormatError::NotFound { .. }) if !same_name => false,
                    Err(e) => panic!("op {k} {fault:?} {crash:?}: new checkpoint damaged: {e}"),
                };
                outcomes[usize::from(committed)] += 1;
                if committed {
                    assert_checkpoint(&store, &new_m, &new);
                }
                if !same_name || !committed {
                    assert_checkpoint(&store, &base_m, &base);
                }
                // No temporary file survives reopening.
                assert_eq!(store.recover().unwrap(), 0);
                // A retry after the failure succeeds.
                new.save(&store, &new_m).unwrap();
                assert_checkpoint(&store, &new_m, &new);
            }
        }
    }
    // Faults before the commit point leave the old state; a crash that keeps
    // unsynced operations may or may not keep the new one. Both must occur.
    assert!(outcomes[0] > 0, "some faults must leave the old state");
}

#[test]
fn crash_extend_under_new_name() {
    run_all(22, false);
}

#[test]
fn crash_replace_same_name() {
    run_all(22, true);
}

#[test]
fn crash_first_save_into_empty_store() {
    let g = small_geometry();
    let seq = Sequence::new(&g, 9, 5);
    let m = seq.manifest("first", None);
    let fs = FaultFs::new();
    let store = open(&fs);
    let before = fs.ops();
    seq.save(&store, &m).unwrap();
    let total = fs.ops() - before;
    for k in 0..total {
        for seed in 0..4u64 {
            let fs = FaultFs::new();
            let store = open(&fs);
            fs.fail_at(Some((fs.ops() + k, FaultMode::Crash)));
            assert!(seq.save(&store, &m).is_err());
            fs.crash(CrashMode::Random(seed));
            let store = open(&fs);
            match store.read_manifest("first") {
                Ok(got) => {
                    assert_eq!(got, m);
                    assert_checkpoint(&store, &m, &seq);
                }
                Err(FormatError::NotFound { .. }) => {}
                Err(e) => panic!("op {k}: damaged checkpoint: {e}"),
            }
        }
    }
}

#[test]
fn failed_fsync_fails_the_save_and_is_not_retried() {
    let g = small_geometry();
    let seq = Sequence::new(&g, 12, 9);
    let m = seq.manifest("x", None);
    // Find the index of the first fsync by failing each op in turn: the save
    // must fail every time (nothing swallows or retries an error).
    let fs = FaultFs::new();
    let store = open(&fs);
    let before = fs.ops();
    seq.save(&store, &m).unwrap();
    let total = fs.ops() - before;
    for k in 0..total {
        let fs = FaultFs::new();
        let store = open(&fs);
        let start = fs.ops();
        fs.fail_at(Some((start + k, FaultMode::Error)));
        assert!(seq.save(&store, &m).is_err(), "op {k}");
        // The failing call stops the save: no operation runs after it
        // except none (no retry loop).
        assert_eq!(
            fs.ops(),
            start + k + 1,
            "save continued after fault at op {k}"
        );
    }
}

#[test]
fn crash_during_block_delete_and_gc_keeps_live_checkpoints() {
    let g = small_geometry();
    let a = Sequence::new(&g, 17, 3);
    let ma = a.manifest("a", None);
    let b = Sequence::new(&g, 13, 4);
    let mb = b.manifest("b", None);
    for k in 0..8 {
        let fs = FaultFs::new();
        let store = open(&fs);
        a.save(&store, &ma).unwrap();
        b.save(&store, &mb).unwrap();
        fs.fail_at(Some((fs.ops() + 2, FaultMode::Crash)));
        let _ = store.delete_manifest("b");
        fs.crash(CrashMode::Random(k));
        let store = open(&fs);
        let _ = store.gc();
        assert_checkpoint(&store, &ma, &a);
    }
}
