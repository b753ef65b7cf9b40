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

    let mut crash_modes = vec![None, Some(CrashMode::DropUnsynced)];
    crash_modes.extend((1..=8).map(|seed| Some(CrashMode::Random(seed))));
    crash_modes.extend((1..=8).map(|seed| Some(CrashMode::Reorder(seed))));
    let mut outcomes = [0usize; 2];
    for k in 0..total {
        for fault in [FaultMode::Error, FaultMode::Crash] {
            for &crash in &crash_modes {
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
    assert!(outcomes[1] > 0, "some crashes must keep the new checkpoint");
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
    // k == total: the crash comes right after a successful save, which
    // must then be durable.
    for k in 0..=total {
        for seed in 0..4u64 {
            let fs = FaultFs::new();
            let store = open(&fs);
            fs.fail_at(Some((fs.ops() + k, FaultMode::Crash)));
            let res = seq.save(&store, &m);
            assert_eq!(res.is_ok(), k == total, "op {k}");
            fs.crash(if seed == 0 {
                CrashMode::DropUnsynced
            } else {
                CrashMode::Random(seed)
            });
            let store = open(&fs);
            match store.read_manifest("first") {
                Ok(got) => {
                    assert_eq!(got, m);
                    assert_checkpoint(&store, &m, &seq);
                }
                Err(FormatError::NotFound { .. }) if k < total => {}
                Err(e) => panic!("op {k}: damaged checkpoint: {e}"),
            }
        }
    }
}

#[test]
fn failed_fsync_fails_the_save_and_is_not_retried() {
    use ckptfmt::Vfs;
    let g = small_geometry();
    let seq = Sequence::new(&g, 12, 9);
    let m = seq.manifest("x", None);
    let fs = FaultFs::new();
    let store = open(&fs);
    let before = fs.ops();
    seq.save(&store, &m).unwrap();
    let total = fs.ops() - before;
    let ops = &fs.history()[before as usize..];
    assert!(ops.iter().filter(|(op, _)| *op == "fsync").count() >= 2);
    for k in 0..total {
        let fs = FaultFs::new();
        let store = open(&fs);
        let start = fs.ops() as usize;
        fs.fail_at(Some((start as u64 + k, FaultMode::Error)));
        assert!(seq.save(&store, &m).is_err(), "op {k}");
        // Nothing runs after the failed call but the removal of temporary
        // files: no retried sync, no rename, nothing committed.
        let after = &fs.history()[start + k as usize + 1..];
        for (op, path) in after {
            assert_eq!(*op, "remove", "op {k}: {op} {path:?} after the fault");
            assert!(path.to_string_lossy().ends_with(".tmp"), "{path:?}");
        }
        // No temporary file is left behind, even before a reopen.
        for dir in ["/store", "/store/blocks", "/store/manifests"] {
            let names = fs.list(Path::new(dir)).unwrap();
            assert!(
                !names.iter().any(|n| n.ends_with(".tmp")),
                "op {k}: {names:?}"
            );
        }
        // Without a crash the failed save left either nothing or (fault in
        // the last directory sync) the complete new checkpoint.
        match store.read_manifest("x") {
            Ok(got) => assert_eq!(got, m),
            Err(FormatError::NotFound { .. }) => {}
            Err(e) => panic!("op {k}: {e}"),
        }
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

#[test]
fn crash_while_writing_an_export_leaves_no_partial_export() {
    let g = small_geometry();
    let seq = Sequence::new(&g, 14, 6);
    let m = seq.manifest("e", None);
    let target = Path::new("/store/e.export");
    let fs = FaultFs::new();
    let store = open(&fs);
    seq.save(&store, &m).unwrap();
    let before = fs.ops();
    store.export("e", target).unwrap();
    let total = fs.ops() - before;
    let full = fs.file(target).unwrap();
    for k in 0..=total {
        for seed in 0..6u64 {
            let fs = FaultFs::new();
            let store = open(&fs);
            seq.save(&store, &m).unwrap();
            fs.fail_at(Some((fs.ops() + k, FaultMode::Crash)));
            assert_eq!(store.export("e", target).is_ok(), k == total, "op {k}");
            fs.crash(if seed == 0 {
                CrashMode::DropUnsynced
            } else {
                CrashMode::Random(seed)
            });
            assert!(
                k < total || fs.file(target).is_some(),
                "a finished export must be durable"
            );
            if let Some(bytes) = fs.file(target) {
                assert_eq!(
                    bytes, full,
                    "op {k}: a partial export is visible under its name"
                );
                let v = ckptfmt::ExportView::parse(&bytes).unwrap();
                v.verify_all().unwrap();
            }
        }
    }
}

#[test]
fn crash_during_import_keeps_the_store_consistent() {
    let g = small_geometry();
    let seq = Sequence::new(&g, 18, 8);
    let m = seq.manifest("imp", None);
    // Build an export in one store...
    let src_fs = FaultFs::new();
    let src = open(&src_fs);
    seq.save(&src, &m).unwrap();
    src.export("imp", Path::new("/store/x.export")).unwrap();
    let bytes = src_fs.file(Path::new("/store/x.export")).unwrap();
    let view = ckptfmt::ExportView::parse(&bytes).unwrap();
    // ...and import it into another, crashing at every step.
    let fs = FaultFs::new();
    let dst = open(&fs);
    let before = fs.ops();
    dst.import(&view).unwrap();
    let total = fs.ops() - before;
    for k in 0..=total {
        for seed in 0..4u64 {
            let fs = FaultFs::new();
            let dst = open(&fs);
            fs.fail_at(Some((fs.ops() + k, FaultMode::Crash)));
            assert_eq!(dst.import(&view).is_ok(), k == total, "op {k}");
            fs.crash(if seed == 0 {
                CrashMode::DropUnsynced
            } else {
                CrashMode::Random(seed)
            });
            let dst = open(&fs);
            match dst.read_manifest("imp") {
                Ok(_) => assert_checkpoint(&dst, &m, &seq),
                Err(FormatError::NotFound { .. }) if k < total => {}
                Err(e) => panic!("op {k}: {e}"),
            }
        }
    }
}
