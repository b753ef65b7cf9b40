//! Basic behaviour of the store on the real file system: tiers, pins,
//! checkpoints, prefix lookup, gc, quota, lock, metrics.

mod common;

use common::*;
use kvstore::{Config, KvStore, PolicyKind, StoreError};

#[test]
fn put_get_spill_and_promote() {
    let dir = tempfile::tempdir().unwrap();
    let store = KvStore::open(dir.path(), inline_config(2)).unwrap();
    let model = store.model(fp(), geometry()).unwrap();
    let tokens: Vec<u32> = (0..20).collect();
    let ids = put_tokens(&model, &tokens).unwrap();
    assert_eq!(ids.len(), 5);
    let m = store.metrics();
    assert!(m.ram_bytes <= 2 * block_bytes() as u64, "{m:?}");
    assert_eq!(m.spills, 3, "{m:?}");
    for id in &ids {
        assert_eq!(&model.get(id).unwrap().unwrap()[..], &kv_of(id)[..]);
    }
    let m = store.metrics();
    assert!(m.disk_hits >= 3 && m.promotions >= 3, "{m:?}");
    assert!(m.ram_bytes <= 2 * block_bytes() as u64);
    let unknown = model.block_id(None, &[9, 9, 9, 9]);
    assert!(model.get(&unknown).unwrap().is_none());
    assert_eq!(store.metrics().misses, 1);
}

#[test]
fn pinned_blocks_stay_in_ram() {
    let dir = tempfile::tempdir().unwrap();
    let store = KvStore::open(dir.path(), inline_config(3)).unwrap();
    let model = store.model(fp(), geometry()).unwrap();
    let ids = put_tokens(&model, &[1, 2, 3, 4, 5, 6, 7, 8]).unwrap();
    let guard = model.pin_all(&ids).unwrap();
    put_tokens(&model, &(100..140).collect::<Vec<_>>()).unwrap();
    let before = store.metrics().ram_hits;
    for id in guard.ids() {
        model.get(id).unwrap().unwrap();
    }
    assert_eq!(store.metrics().ram_hits, before + 2);
    assert_eq!(store.metrics().pinned_bytes, 2 * block_bytes() as u64);
    // The third slot is the only evictable one: pinning two more must fail.
    let more = put_tokens(&model, &[50, 51, 52, 53, 54, 55, 56, 57]).unwrap();
    model.pin(&more[0]).unwrap();
    assert!(matches!(
        model.pin(&more[1]),
        Err(StoreError::RamFull { .. })
    ));
    model.unpin(&more[0]).unwrap();
    assert!(matches!(
        model.unpin(&more[0]),
        Err(StoreError::NotPinned { .. })
    ));
    drop(guard);
    assert_eq!(store.metrics().pinned_bytes, 0);
}

#[test]
fn checkpoints_save_load_list_delete_across_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let tokens: Vec<u32> = (0..14).collect();
    {
        let store = KvStore::open(dir.path(), inline_config(8)).unwrap();
        let model = store.model(fp(), geometry()).unwrap();
        put_tokens(&model, &tokens).unwrap();
        model.save(&manifest("a", &tokens)).unwrap();
        model.save(&manifest("b", &tokens[..8])).unwrap();
        assert_eq!(
            model.list().unwrap(),
            vec!["a".to_string(), "b".to_string()]
        );
        // Nothing flushed: only the checkpoints' blocks must survive.
    }
    let store = KvStore::open(dir.path(), inline_config(8)).unwrap();
    assert_eq!(store.recovery_report().checkpoints, 2);
    let model = store.model(fp(), geometry()).unwrap();
    let a = model.load("a").unwrap();
    assert_eq!(a.manifest, manifest("a", &tokens));
    for (id, kv) in a.manifest.block_ids.iter().zip(&a.blocks) {
        assert_eq!(&kv[..], &kv_of(id)[..]);
    }
    model.delete("a").unwrap();
    assert!(matches!(
        model.load("a"),
        Err(StoreError::CheckpointNotFound { .. })
    ));
    assert!(matches!(
        model.delete("a"),
        Err(StoreError::CheckpointNotFound { .. })
    ));
    // Block 2 was only referenced by "a": gc reclaims it, not b's blocks.
    let report = store.gc().unwrap();
    assert_eq!(report.blocks, 1);
    let b = model.load("b").unwrap();
    assert_eq!(b.blocks.len(), 2);
}

#[test]
fn save_needs_every_block() {
    let dir = tempfile::tempdir().unwrap();
    let store = KvStore::open(dir.path(), inline_config(8)).unwrap();
    let model = store.model(fp(), geometry()).unwrap();
    let tokens: Vec<u32> = (0..8).collect();
    put_tokens(&model, &tokens[..4]).unwrap();
    assert!(matches!(
        model.save(&manifest("x", &tokens)),
        Err(StoreError::MissingBlock { .. })
    ));
    assert!(model.list().unwrap().is_empty());
}

#[test]
fn longest_prefix_spans_sessions() {
    let dir = tempfile::tempdir().unwrap();
    let store = KvStore::open(dir.path(), inline_config(64)).unwrap();
    let model = store.model(fp(), geometry()).unwrap();
    let system: Vec<u32> = (0..8).collect();
    let mut s1 = system.clone();
    s1.extend([100, 101, 102, 103]);
    let mut s2 = system.clone();
    s2.extend([200, 201, 202, 203, 204, 205, 206, 207]);
    put_tokens(&model, &s1).unwrap();
    put_tokens(&model, &s2).unwrap();
    let m = store.metrics();
    assert_eq!(m.dedup_blocks, 2, "the system prompt is stored once");
    let mut q = s2.clone();
    q.truncate(14);
    let hit = model.longest_prefix(&q, &[]);
    assert_eq!(hit.n_tokens, 12);
    assert_eq!(hit.block_ids, model.longest_prefix(&s2, &[]).block_ids[..3]);
    let mut q = system.clone();
    q.extend([100, 101, 102, 999]);
    assert_eq!(model.longest_prefix(&q, &[]).n_tokens, 8);
    assert_eq!(model.longest_prefix(&[5, 5, 5, 5], &[]).n_tokens, 0);
}

#[test]
fn gc_respects_quota_and_references() {
    let dir = tempfile::tempdir().unwrap();
    let store = KvStore::open(dir.path(), inline_config(1)).unwrap();
    let model = store.model(fp(), geometry()).unwrap();
    let keep: Vec<u32> = (0..8).collect();
    put_tokens(&model, &keep).unwrap();
    model.save(&manifest("keep", &keep)).unwrap();
    put_tokens(&model, &(100..120).collect::<Vec<_>>()).unwrap();
    store.flush().unwrap();
    let before = store.metrics();
    assert_eq!(before.disk_blocks, 7);
    let per_block = before.disk_bytes / before.disk_blocks;
    let r = store.gc_to(4 * per_block).unwrap();
    assert_eq!(r.blocks, 3);
    let r = store.gc().unwrap();
    assert_eq!(r.blocks, 2, "the RAM copy's file is reclaimable too");
    assert_eq!(store.metrics().disk_blocks, 2);
    // Collected means gone: the RAM copy went with its file, so no flush writes it back (the
    // disk budget would churn otherwise).
    assert_eq!(store.metrics().ram_blocks, 0);
    store.flush().unwrap();
    assert_eq!(store.metrics().disk_blocks, 2);
    assert_eq!(model.load("keep").unwrap().blocks.len(), 2);
}

#[test]
fn gc_removes_the_last_blocks_of_a_prefix_before_its_first() {
    let dir = tempfile::tempdir().unwrap();
    let store = KvStore::open(dir.path(), inline_config(16)).unwrap();
    let model = store.model(fp(), geometry()).unwrap();
    // Two unsaved prompts, the older one first; each block is put after the one before it.
    let old: Vec<u32> = (0..16).collect();
    let new: Vec<u32> = (100..116).collect();
    put_tokens(&model, &old).unwrap();
    put_tokens(&model, &new).unwrap();
    store.flush().unwrap();
    let per_block = store.metrics().disk_bytes / store.metrics().disk_blocks;
    // Room for five of the eight blocks: the older prompt loses its last three, and keeps its
    // first one, which is still worth something.
    store.gc_to(5 * per_block).unwrap();
    assert_eq!(model.longest_prefix(&new, &[]).n_tokens, 16);
    assert_eq!(model.longest_prefix(&old, &[]).n_tokens, 4);
    // Room for two: the newer prompt keeps its first two blocks.
    store.gc_to(2 * per_block).unwrap();
    assert_eq!(model.longest_prefix(&new, &[]).n_tokens, 8);
    assert_eq!(model.longest_prefix(&old, &[]).n_tokens, 0);
}

#[test]
fn quota_exceeded_is_an_error_and_keeps_data() {
    let dir = tempfile::tempdir().unwrap();
    let probe = KvStore::open(dir.path().join("probe"), inline_config(4)).unwrap();
    let pm = probe.model(fp(), geometry()).unwrap();
    put_tokens(&pm, &[1, 2, 3, 4]).unwrap();
    probe.flush().unwrap();
    let per_block = probe.metrics().disk_bytes;
    drop(pm);
    drop(probe);

    let cfg = Config {
        disk_quota: 2 * per_block,
        ..inline_config(8)
    };
    let store = KvStore::open(dir.path().join("s"), cfg).unwrap();
    let model = store.model(fp(), geometry()).unwrap();
    let tokens: Vec<u32> = (0..12).collect();
    let ids = put_tokens(&model, &tokens).unwrap();
    let err = model.save(&manifest("big", &tokens)).unwrap_err();
    assert!(err.is_no_space(), "{err}");
    assert!(model.list().unwrap().is_empty());
    model.save(&manifest("small", &tokens[..8])).unwrap();
    for id in &ids {
        assert_eq!(&model.get(id).unwrap().unwrap()[..], &kv_of(id)[..]);
    }
}

#[test]
fn geometry_is_fixed_per_model_and_models_share_a_directory() {
    let dir = tempfile::tempdir().unwrap();
    let other_fp = ckptfmt::Fingerprint::of(b"another model");
    let other_geom = ckptfmt::Geometry::uniform(2, 4, 4, ckptfmt::ElemType::F16, 2).unwrap();
    {
        let store = KvStore::open(dir.path(), inline_config(16)).unwrap();
        let a = store.model(fp(), geometry()).unwrap();
        let b = store.model(other_fp, other_geom.clone()).unwrap();
        assert!(matches!(
            store.model(fp(), other_geom.clone()),
            Err(StoreError::GeometryMismatch { .. })
        ));
        put_tokens(&a, &[1, 2, 3, 4]).unwrap();
        a.save(&manifest("x", &[1, 2, 3, 4])).unwrap();
        let bb = other_geom.block_bytes() as usize;
        b.put_sequence(&[1, 2], |_| vec![7u8; bb]).unwrap();
        store.flush().unwrap();
    }
    let store = KvStore::open(dir.path(), inline_config(16)).unwrap();
    assert_eq!(store.models().len(), 2);
    assert_eq!(store.recovery_report().blocks, 2);
    let b = store.model(other_fp, other_geom).unwrap();
    let id = b.block_id(None, &[1, 2]);
    assert_eq!(b.get(&id).unwrap().unwrap()[0], 7);
    assert!(b.list().unwrap().is_empty());
}

#[test]
fn prefetch_brings_a_checkpoint_into_ram() {
    for background in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let cfg = Config {
            background,
            ..inline_config(4)
        };
        let store = KvStore::open(dir.path(), cfg).unwrap();
        let model = store.model(fp(), geometry()).unwrap();
        let tokens: Vec<u32> = (0..12).collect();
        put_tokens(&model, &tokens).unwrap();
        model.save(&manifest("s", &tokens)).unwrap();
        put_tokens(&model, &(100..120).collect::<Vec<_>>()).unwrap();
        store.flush().unwrap();
        let n = model.prefetch("s").unwrap().wait().unwrap();
        assert!(n >= 1, "background={background}: {n}");
        let hits = store.metrics().ram_hits;
        let cp = model.load("s").unwrap();
        assert_eq!(store.metrics().ram_hits, hits + 3);
        assert_eq!(cp.blocks.len(), 3);
    }
}

#[test]
fn both_policies_work() {
    for policy in [PolicyKind::Lru, PolicyKind::S3Fifo] {
        let dir = tempfile::tempdir().unwrap();
        let cfg = Config {
            policy,
            ..inline_config(3)
        };
        let store = KvStore::open(dir.path(), cfg).unwrap();
        let model = store.model(fp(), geometry()).unwrap();
        let ids = put_tokens(&model, &(0..40).collect::<Vec<_>>()).unwrap();
        for id in ids.iter().rev() {
            assert_eq!(&model.get(id).unwrap().unwrap()[..], &kv_of(id)[..]);
        }
        assert!(store.metrics().ram_bytes <= 3 * block_bytes() as u64);
    }
}
