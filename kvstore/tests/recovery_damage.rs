//! Opening a store whose files were damaged behind its back: a flipped bit
//! in a block, a missing block, a leftover temporary file.

mod common;

use std::path::{Path, PathBuf};

use common::*;
use kvstore::{Config, FaultIo, KvStore, StoreError, VerifyLevel};

fn setup(io: &FaultIo) -> (Vec<kvstore::BlockId>, PathBuf) {
    let store = KvStore::open_with(io.clone(), Path::new("/kv"), inline_config(8)).unwrap();
    let model = store.model(fp(), geometry()).unwrap();
    let shared: Vec<u32> = (0..8).collect();
    let mut long = shared.clone();
    long.extend(100..104);
    put_tokens(&model, &long).unwrap();
    model.save(&manifest("short", &shared)).unwrap();
    model.save(&manifest("long", &long)).unwrap();
    let ids = kvstore::BlockId::chain_all(&fp(), &long, TPB);
    let path = model.block_path(&ids[2]);
    (ids, path)
}

fn cfg(verify: VerifyLevel) -> Config {
    Config {
        verify,
        ..inline_config(8)
    }
}

#[test]
fn full_verification_quarantines_damaged_blocks_and_reports_their_checkpoints() {
    let io = FaultIo::new();
    let (_ids, path) = setup(&io);
    let mut bytes = io.file(&path).unwrap();
    let last = bytes.len() - 5000;
    bytes[last] ^= 0x40;
    io.set_file(&path, bytes);
    let tmp = path.with_extension("blk.tmp");
    io.set_file(&tmp, vec![1, 2, 3]);

    let store = KvStore::open_with(io.clone(), Path::new("/kv"), cfg(VerifyLevel::Full)).unwrap();
    let report = store.recovery_report().clone();
    assert_eq!(report.quarantined_blocks, 1, "{report:?}");
    assert_eq!(report.damaged_checkpoints.len(), 1, "{report:?}");
    assert_eq!(report.damaged_checkpoints[0].name, "long");
    assert_eq!(report.damaged_checkpoints[0].good_blocks, 2);
    assert!(io.file(&tmp).is_none(), "temporary file left behind");
    assert!(io.file(&path).is_none(), "damaged block not moved aside");
    let model = store.model(fp(), geometry()).unwrap();
    // Nothing is deleted: the damaged checkpoint stays, restorable up to block 2.
    assert_eq!(
        model.list().unwrap(),
        vec!["long".to_string(), "short".to_string()]
    );
    assert_eq!(model.checkpoint_health("long").unwrap().good_blocks, 2);
    let cp = model.load("short").unwrap();
    for (id, kv) in cp.manifest.block_ids.iter().zip(&cp.blocks) {
        assert_eq!(&kv[..], &kv_of(id)[..]);
    }
}

#[test]
fn lazy_verification_reports_damage_on_read() {
    let io = FaultIo::new();
    let (ids, path) = setup(&io);
    let mut bytes = io.file(&path).unwrap();
    let last = bytes.len() - 5000;
    bytes[last] ^= 0x40;
    io.set_file(&path, bytes);

    let store = KvStore::open_with(io.clone(), Path::new("/kv"), cfg(VerifyLevel::Exists)).unwrap();
    let model = store.model(fp(), geometry()).unwrap();
    assert_eq!(model.list().unwrap().len(), 2);
    match model.get(&ids[2]) {
        Err(StoreError::Format { path: p, source }) => {
            assert_eq!(p, path);
            assert!(source.is_corruption(), "{source}");
        }
        other => panic!("expected a corruption error, got {other:?}"),
    }
    assert!(model.load("short").is_ok());
    // Quarantined: never reused.
    assert!(!model.contains(&ids[2]));
    assert!(io.file(&path).is_none());
    let h = model.checkpoint_health("long").unwrap();
    assert_eq!((h.good_blocks, h.first_bad.unwrap().index), (2, 2));
}

#[test]
fn missing_block_is_reported_even_without_full_verification() {
    let io = FaultIo::new();
    let (_ids, path) = setup(&io);
    {
        use ckptfmt::Vfs;
        io.remove(&path).unwrap();
    }
    let store = KvStore::open_with(io.clone(), Path::new("/kv"), cfg(VerifyLevel::Exists)).unwrap();
    let report = store.recovery_report();
    assert_eq!(report.damaged_checkpoints.len(), 1, "{report:?}");
    assert_eq!(report.damaged_checkpoints[0].name, "long");
    let model = store.model(fp(), geometry()).unwrap();
    assert_eq!(
        model.list().unwrap(),
        vec!["long".to_string(), "short".to_string()]
    );
}

#[test]
fn load_pinned_holds_a_session_in_ram() {
    let io = FaultIo::new();
    setup(&io);
    let store = KvStore::open_with(io.clone(), Path::new("/kv"), inline_config(4)).unwrap();
    let model = store.model(fp(), geometry()).unwrap();
    let (cp, guard) = model.load_pinned("long").unwrap();
    assert_eq!(cp.blocks.len(), 3);
    assert_eq!(store.metrics().pinned_bytes, 3 * block_bytes() as u64);
    // Other traffic cannot push the session out, and gc cannot take it.
    put_tokens(&model, &(500..540).collect::<Vec<_>>()).unwrap();
    model.delete("long").unwrap();
    model.delete("short").unwrap();
    store.gc().unwrap();
    for id in guard.ids() {
        assert!(model.is_resident(id));
    }
    drop(guard);
    assert_eq!(store.metrics().pinned_bytes, 0);
}
