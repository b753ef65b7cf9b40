//! Several writers and readers on one store: readers write nothing, temporary
//! files of live writers survive other opens, the collector and saves exclude
//! each other, copied manifests and damaged blocks are caught.

mod common;

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ckptfmt::store::{BLOCKS_DIR, MANIFESTS_DIR};
use ckptfmt::{CrashMode, FaultFs, FormatError, Store, Vfs, VfsFile};
use common::{fp, small_geometry, Sequence};

#[test]
fn read_only_open_and_verify_write_nothing() {
    let fs = FaultFs::new();
    let g = small_geometry();
    let root = Path::new("/s");
    let store = Store::open_with(fs.clone(), root, fp(), g.clone()).unwrap();
    let seq = Sequence::new(&g, 10, 1);
    seq.save(&store, &seq.manifest("a", None)).unwrap();
    let before = fs.history().len();

    let ro = Store::open_read_only_with(fs.clone(), root).unwrap();
    assert!(ro.is_read_only());
    assert_eq!(ro.list_manifests().unwrap(), vec!["a".to_string()]);
    ro.verify_checkpoint("a").unwrap();
    assert!(ro.checkpoint_health("a").unwrap().is_intact());
    assert!(matches!(
        ro.delete_manifest("a"),
        Err(FormatError::ReadOnly { .. })
    ));
    assert!(matches!(ro.gc(), Err(FormatError::ReadOnly { .. })));
    assert_eq!(fs.history().len(), before, "{:?}", &fs.history()[before..]);
}

#[test]
fn read_only_open_on_a_store_no_writer_locked() {
    // A store whose lock file is missing (a copy without it) still reads.
    let dir = tempfile::tempdir().unwrap();
    let g = small_geometry();
    let store = Store::open(dir.path(), fp(), g.clone()).unwrap();
    let seq = Sequence::new(&g, 9, 2);
    seq.save(&store, &seq.manifest("a", None)).unwrap();
    drop(store);
    std::fs::remove_file(dir.path().join("LOCK")).unwrap();
    std::fs::remove_dir_all(dir.path().join("owners")).unwrap();
    let names = |p: &Path| {
        let mut v: Vec<_> = walk(p);
        v.sort();
        v
    };
    let before = names(dir.path());
    let ro = Store::open_read_only(dir.path()).unwrap();
    ro.verify_checkpoint("a").unwrap();
    assert_eq!(names(dir.path()), before);
}

fn walk(p: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(p).unwrap() {
        let e = e.unwrap();
        out.push(e.path().display().to_string());
        if e.file_type().unwrap().is_dir() {
            out.extend(walk(&e.path()));
        }
    }
    out
}

#[test]
fn a_live_writers_temporary_file_survives_another_open() {
    let fs = FaultFs::new();
    let g = small_geometry();
    let root = Path::new("/s");
    let a = Store::open_with(fs.clone(), root, fp(), g.clone()).unwrap();
    // A save of `a` in flight: its owner token is in its temporary names.
    let seq = Sequence::new(&g, 8, 3);
    seq.save(&a, &seq.manifest("x", None)).unwrap();
    let owner = fs
        .history()
        .iter()
        .find_map(|(op, p)| {
            let n = p.file_name()?.to_str()?;
            (*op == "create" && n.ends_with(".tmp")).then(|| {
                let stem = n.strip_suffix(".tmp").unwrap();
                let tag = &stem[stem.rfind('.').unwrap() + 1..];
                tag[..tag.rfind('-').unwrap()].to_string()
            })
        })
        .unwrap();
    let live_tmp = root
        .join(BLOCKS_DIR)
        .join(format!("ff.blk.{owner}-999.tmp"));
    let mut f = fs.create(&live_tmp).unwrap();
    f.write_all(b"half").unwrap();
    let dead_tmp = root.join(MANIFESTS_DIR).join("y.ckpt.1-abc-1.tmp");
    fs.create(&dead_tmp).unwrap();
    let legacy_tmp = root.join(MANIFESTS_DIR).join("z.ckpt.1-1.tmp");
    fs.create(&legacy_tmp).unwrap();

    let b = Store::open_with(fs.clone(), root, fp(), g.clone()).unwrap();
    assert!(fs.exists(&live_tmp).unwrap(), "owner is alive");
    assert!(!fs.exists(&dead_tmp).unwrap(), "owner file absent: gone");
    assert!(!fs.exists(&legacy_tmp).unwrap());
    drop(a);
    b.recover().unwrap();
    assert!(!fs.exists(&live_tmp).unwrap(), "owner closed");
}

#[test]
fn a_crash_makes_every_writer_gone() {
    let fs = FaultFs::new();
    let g = small_geometry();
    let root = Path::new("/s");
    let a = Store::open_with(fs.clone(), root, fp(), g.clone()).unwrap();
    let seq = Sequence::new(&g, 8, 4);
    fs.fail_at(Some((fs.ops() + 3, ckptfmt::FaultMode::Crash)));
    assert!(seq.save(&a, &seq.manifest("x", None)).is_err());
    fs.crash(CrashMode::Random(7));
    let b = Store::open_with(fs.clone(), root, fp(), g).unwrap();
    for d in [BLOCKS_DIR, MANIFESTS_DIR] {
        let names = fs.list(&root.join(d)).unwrap();
        assert!(!names.iter().any(|n| n.ends_with(".tmp")), "{names:?}");
    }
    drop((a, b));
}

#[test]
fn collector_waits_for_a_save_and_names_the_holders() {
    let dir = tempfile::tempdir().unwrap();
    let g = small_geometry();
    let mut store = Store::open(dir.path(), fp(), g).unwrap();
    store.set_lock_timeout(Duration::from_millis(50));
    let save = store.lock_shared().unwrap();
    match store.gc() {
        Err(FormatError::Busy { wanted, pids, .. }) => {
            assert_eq!(wanted, "exclusive");
            assert_eq!(pids, vec![std::process::id()]);
        }
        other => panic!("{other:?}"),
    }
    drop(save);
    assert_eq!(store.gc().unwrap(), 0);
}

#[test]
fn a_copied_manifest_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let g = small_geometry();
    let store = Store::open(dir.path(), fp(), g.clone()).unwrap();
    let seq = Sequence::new(&g, 9, 5);
    seq.save(&store, &seq.manifest("a", None)).unwrap();
    seq.save(&store, &seq.manifest("b", None)).unwrap();
    let m = dir.path().join(MANIFESTS_DIR);
    std::fs::copy(m.join("a.ckpt"), m.join("b.ckpt")).unwrap();
    match store.read_manifest("b") {
        Err(FormatError::NameMismatch {
            expected, found, ..
        }) => assert_eq!((expected.as_str(), found.as_str()), ("b", "a")),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_damaged_block_is_quarantined_and_written_again_by_the_next_save() {
    let dir = tempfile::tempdir().unwrap();
    let g = small_geometry();
    let store = Store::open(dir.path(), fp(), g.clone()).unwrap();
    let seq = Sequence::new(&g, 14, 6); // three blocks and a tail
    let m = seq.manifest("a", None);
    seq.save(&store, &m).unwrap();
    let bad = store.block_path(&m.block_ids[1]);
    let mut bytes = std::fs::read(&bad).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x40;
    std::fs::write(&bad, &bytes).unwrap();

    let h = store.checkpoint_health("a").unwrap();
    assert_eq!(h.good_blocks, 1);
    let first_bad = h.first_bad.unwrap();
    assert_eq!((first_bad.index, first_bad.path.clone()), (1, bad.clone()));
    let moved = store.quarantine_block(&m.block_ids[1]).unwrap().unwrap();
    assert!(moved.exists() && !bad.exists());
    assert_eq!(store.quarantined().unwrap(), vec![moved]);
    assert!(!store.has_block(&m.block_ids[1]).unwrap());
    assert_eq!(store.quarantine_block(&m.block_ids[0]).unwrap(), None);

    let report = seq.save(&store, &m).unwrap();
    assert_eq!(report.blocks_written, 1);
    assert!(store.checkpoint_health("a").unwrap().is_intact());
}

#[test]
fn concurrent_writers_collector_and_readers_lose_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let g = small_geometry();
    let root = dir.path().to_path_buf();
    Store::open(&root, fp(), g.clone()).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let (root, stop) = (root.clone(), Arc::clone(&stop));
            std::thread::spawn(move || {
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) {
                    let ro = Store::open_read_only(&root).unwrap();
                    for name in ro.list_manifests().unwrap() {
                        ro.verify_checkpoint(&name).unwrap();
                        n += 1;
                    }
                }
                n
            })
        })
        .collect();
    let collector = {
        let (root, stop) = (root.clone(), Arc::clone(&stop));
        std::thread::spawn(move || {
            let s = Store::open_existing(&root).unwrap();
            while !stop.load(Ordering::Relaxed) {
                s.gc().unwrap();
            }
        })
    };
    let writers: Vec<_> = (0..2u64)
        .map(|w| {
            let (root, g) = (root.clone(), g.clone());
            std::thread::spawn(move || {
                let s = Store::open(&root, fp(), g.clone()).unwrap();
                for i in 0..60u64 {
                    // Writers share a prefix half of the time.
                    let seq = Sequence::new(&g, 8 + (i % 3) as usize * 4, w * (i % 2) + i / 2);
                    let name = format!("w{w}-{}", i % 7);
                    seq.save(&s, &seq.manifest(&name, None)).unwrap();
                }
            })
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    collector.join().unwrap();
    let verified: usize = readers.into_iter().map(|r| r.join().unwrap()).sum();
    assert!(verified > 0);
    let s = Store::open_existing(&root).unwrap();
    let names = s.list_manifests().unwrap();
    assert_eq!(names.len(), 14);
    for n in names {
        s.verify_checkpoint(&n).unwrap();
    }
}
