//! Several stores (threads and processes) on one directory: all saves
//! complete and verify, read-only opens never disturb a writer, a collector
//! spares what other processes' checkpoints need.

mod common;

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use ckptfmt::FormatError;
use common::{fp, geometry, manifest, put_tokens};
use kvstore::{Config, KvStore, StoreError};

const SAVES: u32 = 200;

/// Saves `n` checkpoints `{tag}-{i}` (a shared prefix and a private part each).
fn save_many(dir: &Path, tag: u32, n: u32) {
    let store = KvStore::open(dir, Config::default()).unwrap();
    let model = store.model(fp(), geometry()).unwrap();
    for i in 0..n {
        let mut tokens: Vec<u32> = (0..8).collect();
        tokens.extend((0..8).map(|k| 1000 * (tag + 1) + 10 * i + k));
        put_tokens(&model, &tokens).unwrap();
        model
            .save(&manifest(&format!("c{tag}-{i}"), &tokens))
            .unwrap();
    }
}

fn verify_all(dir: &Path) -> usize {
    let store = KvStore::open_read_only(dir, Config::default()).unwrap();
    let Some(model) = store.existing_model(&fp()) else {
        return 0;
    };
    let names = model.list().unwrap();
    for n in &names {
        let h = model.checkpoint_health(n).unwrap();
        assert!(h.is_intact(), "{n}: {:?}", h.first_bad);
    }
    names.len()
}

#[test]
fn two_stores_in_threads_save_beside_readers_and_a_collector() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    KvStore::open(&root, Config::default()).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let (root, stop) = (root.clone(), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut runs = 0;
            while !stop.load(Ordering::Relaxed) || runs < 200 {
                verify_all(&root);
                runs += 1;
            }
            runs
        })
    };
    let collector = {
        let (root, stop) = (root.clone(), Arc::clone(&stop));
        std::thread::spawn(move || {
            let store = KvStore::open(&root, Config::default()).unwrap();
            while !stop.load(Ordering::Relaxed) {
                store.gc().unwrap();
            }
        })
    };
    let writers: Vec<_> = (0..2)
        .map(|t| {
            let root = root.clone();
            std::thread::spawn(move || save_many(&root, t, SAVES))
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    collector.join().unwrap();
    assert!(reader.join().unwrap() >= 200);
    assert_eq!(verify_all(&root), 2 * SAVES as usize);
    let store = KvStore::open(&root, Config::default()).unwrap();
    let model = store.model(fp(), geometry()).unwrap();
    for t in 0..2 {
        for i in 0..SAVES {
            model.load(&format!("c{t}-{i}")).unwrap();
        }
    }
}

#[test]
fn a_block_written_by_another_store_is_found_and_shared() {
    let dir = tempfile::tempdir().unwrap();
    let a = KvStore::open(dir.path(), Config::default()).unwrap();
    let b = KvStore::open(dir.path(), Config::default()).unwrap();
    let (ma, mb) = (
        a.model(fp(), geometry()).unwrap(),
        b.model(fp(), geometry()).unwrap(),
    );
    let tokens: Vec<u32> = (0..8).collect();
    let ids = put_tokens(&ma, &tokens).unwrap();
    ma.save(&manifest("x", &tokens)).unwrap();
    assert!(mb.contains(&ids[1]));
    assert_eq!(mb.longest_prefix(&tokens, &[]).n_tokens, 8);
    assert_eq!(mb.list().unwrap(), vec!["x".to_string()]);
    assert_eq!(mb.load("x").unwrap().blocks.len(), ids.len());
    // b's collection spares a's checkpoint; deleting it frees its blocks.
    b.gc().unwrap();
    assert!(ma.load("x").is_ok());
    mb.delete("x").unwrap();
    assert_eq!(b.gc().unwrap().blocks, ids.len() as u64);
}

#[test]
fn read_only_store_refuses_writes_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    save_many(dir.path(), 0, 3);
    let ro = KvStore::open_read_only(dir.path(), Config::default()).unwrap();
    let model = ro.existing_model(&fp()).unwrap();
    assert!(matches!(
        model.delete("c0-0"),
        Err(StoreError::Refused(FormatError::ReadOnly { .. }))
    ));
    assert!(matches!(
        ro.gc(),
        Err(StoreError::Refused(FormatError::ReadOnly { .. }))
    ));
    assert!(matches!(
        model.put(None, &[1, 2, 3, 4], vec![0; common::block_bytes()]),
        Err(StoreError::Refused(FormatError::ReadOnly { .. }))
    ));
    assert_eq!(model.checkpoints().unwrap().len(), 3);
}

#[test]
fn two_processes_save_into_one_store() {
    // The child: this same test binary, run with the directory in the environment.
    if let Some(dir) = std::env::var_os("KVSTORE_SHARE_CHILD_DIR") {
        save_many(Path::new(&dir), 1, SAVES);
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    KvStore::open(dir.path(), Config::default()).unwrap();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "two_processes_save_into_one_store",
            "--test-threads=1",
        ])
        .env("KVSTORE_SHARE_CHILD_DIR", dir.path())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    save_many(dir.path(), 0, SAVES);
    assert!(child.wait().unwrap().success(), "the child's saves failed");
    assert_eq!(verify_all(dir.path()), 2 * SAVES as usize);
}
