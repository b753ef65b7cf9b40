//! Collection reads only the manifests that changed since it last looked (unchanged files are
//! known by their stamps), and a damaged manifest is set aside rather than stopping it.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use common::*;
use kvstore::KvStore;

fn manifests_dir(root: &Path) -> PathBuf {
    root.join("models").join(fp().to_hex()).join("manifests")
}

/// Dates the manifests `names` (every one when empty) back a minute, as if written long
/// before (the index reads a file modified within the last moments again, in case it changes
/// within the same clock tick).
fn age_manifests(root: &Path, names: &[&str]) {
    let old = SystemTime::now() - Duration::from_secs(60);
    for e in std::fs::read_dir(manifests_dir(root)).unwrap() {
        let path = e.unwrap().path();
        let stem = path.file_stem().unwrap().to_str().unwrap().to_owned();
        if names.is_empty() || names.contains(&stem.as_str()) {
            let f = std::fs::File::options().write(true).open(&path).unwrap();
            f.set_modified(old).unwrap();
        }
    }
}

#[test]
fn a_collection_reads_only_new_or_changed_manifests() {
    let dir = tempfile::tempdir().unwrap();
    let store = KvStore::open(dir.path(), inline_config(1)).unwrap();
    let model = store.model(fp(), geometry()).unwrap();
    for c in 0..20u32 {
        let tokens: Vec<u32> = (0..8).map(|t| c * 100 + t).collect();
        put_tokens(&model, &tokens).unwrap();
        model.save(&manifest(&format!("chat{c}"), &tokens)).unwrap();
    }
    store.flush().unwrap();
    age_manifests(dir.path(), &[]);
    assert_eq!(store.gc().unwrap().manifests_read, 20);
    // Nothing changed: nothing read.
    assert_eq!(store.gc().unwrap().manifests_read, 0);

    // One new checkpoint and one deleted: one read; the deleted one's blocks go.
    let tokens: Vec<u32> = (0..8).map(|t| 5000 + t).collect();
    put_tokens(&model, &tokens).unwrap();
    model.save(&manifest("new", &tokens)).unwrap();
    model.delete("chat3").unwrap();
    store.flush().unwrap();
    age_manifests(dir.path(), &["new"]);
    let report = store.gc().unwrap();
    assert_eq!(report.manifests_read, 1, "{report:?}");
    assert!(
        report.blocks > 0,
        "chat3's blocks are collected: {report:?}"
    );
    assert!(model.load("new").is_ok());
    assert!(model.load("chat4").is_ok());

    // Another process replaces a checkpoint under the same name: read again.
    {
        let other = KvStore::open(dir.path(), inline_config(1)).unwrap();
        let m = other.model(fp(), geometry()).unwrap();
        let tokens: Vec<u32> = (0..8).map(|t| 7000 + t).collect();
        put_tokens(&m, &tokens).unwrap();
        m.save(&manifest("chat5", &tokens)).unwrap();
        other.flush().unwrap();
    }
    let report = store.gc().unwrap();
    assert_eq!(report.manifests_read, 1, "{report:?}");
    assert!(report.blocks > 0, "the old chat5's blocks are collected");
    // (A new open indexes the files another process wrote.)
    drop((model, store));
    let fresh = KvStore::open(dir.path(), inline_config(1)).unwrap();
    let model = fresh.model(fp(), geometry()).unwrap();
    if let Err(e) = model.load("chat5") {
        panic!("the new chat5 keeps its blocks: {e}");
    }
}

#[test]
fn a_damaged_manifest_is_set_aside_and_the_rest_is_collected() {
    let dir = tempfile::tempdir().unwrap();
    let store = KvStore::open(dir.path(), inline_config(1)).unwrap();
    let model = store.model(fp(), geometry()).unwrap();
    let kept: Vec<u32> = (0..8).collect();
    put_tokens(&model, &kept).unwrap();
    model.save(&manifest("kept", &kept)).unwrap();
    let damaged: Vec<u32> = (100..108).collect();
    put_tokens(&model, &damaged).unwrap();
    model.save(&manifest("damaged", &damaged)).unwrap();
    // Blocks no checkpoint references.
    put_tokens(&model, &(200..208).collect::<Vec<u32>>()).unwrap();
    store.flush().unwrap();

    let path = manifests_dir(dir.path()).join("damaged.ckpt");
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[40] ^= 0x40;
    std::fs::write(&path, &bytes).unwrap();

    let report = store.gc().unwrap();
    assert_eq!(report.set_aside.len(), 1, "{report:?}");
    assert!(!path.exists());
    assert!(
        report.set_aside[0].exists(),
        "moved aside, not deleted: {report:?}"
    );
    assert!(report.blocks > 0, "the store was collected: {report:?}");
    assert!(model.load("kept").is_ok());
    assert!(model.load("damaged").is_err());
}

#[test]
fn a_collection_drops_the_given_checkpoints_in_order_only_as_far_as_needed() {
    let dir = tempfile::tempdir().unwrap();
    let store = KvStore::open(dir.path(), inline_config(1)).unwrap();
    let model = store.model(fp(), geometry()).unwrap();
    // Three conversations after one shared first block; and blocks nobody references.
    let conv = |c: u32| -> Vec<u32> { (0..4).chain((0..8).map(|t| 100 * (c + 1) + t)).collect() };
    for c in 0..3 {
        put_tokens(&model, &conv(c)).unwrap();
        model
            .save(&manifest(&format!("conv{c}"), &conv(c)))
            .unwrap();
    }
    put_tokens(&model, &(900..908).collect::<Vec<u32>>()).unwrap();
    store.flush().unwrap();
    let blocks_dir = dir.path().join("models").join(fp().to_hex()).join("blocks");
    let count = || std::fs::read_dir(&blocks_dir).unwrap().count() as u64;
    let before = count();
    let per_block = std::fs::read_dir(&blocks_dir)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .metadata()
        .unwrap()
        .len();
    // All of the same age: the order's keys decide.
    age_manifests(dir.path(), &[]);
    let manifest_len = |c: u32| {
        std::fs::metadata(manifests_dir(dir.path()).join(format!("conv{c}.ckpt")))
            .unwrap()
            .len()
    };
    let order = |name: &str| name.strip_prefix("conv").and_then(|c| c.parse().ok());

    // The budget counts the manifests. Three blocks must go: the two unreferenced ones, then
    // conv0 is dropped and one of its own blocks (its last) goes, and nothing more.
    let budget = (before - 3) * per_block + manifest_len(1) + manifest_len(2);
    let report = model.collect_dropping(budget, &order).unwrap();
    assert_eq!(report.manifests_dropped, ["conv0"], "{report:?}");
    assert_eq!(count(), before - 3);
    assert!(model.load("conv1").is_ok() && model.load("conv2").is_ok());
    assert!(model.load("conv0").is_err());

    // Room for one block: conv0's other block (unreferenced now) goes first, then conv1 and
    // conv2 are dropped; the shared block, first of the chain, is the one left.
    let report = model.collect_dropping(per_block, &order).unwrap();
    assert_eq!(report.manifests_dropped, ["conv1", "conv2"], "{report:?}");
    assert_eq!(count(), 1);
    let shared = kvstore::BlockId::chain(&fp(), None, &[0, 1, 2, 3]);
    assert!(blocks_dir.join(format!("{}.blk", shared.to_hex())).exists());
}

/// Another process's store on the same directory (a store of its own: its own index and its
/// own view of the files).
fn other_process(root: &Path) -> (KvStore, kvstore::ModelStore) {
    let store = KvStore::open(root, inline_config(1)).unwrap();
    let model = store.model(fp(), geometry()).unwrap();
    (store, model)
}

#[test]
fn a_collection_follows_what_other_processes_did_since_it_last_looked() {
    let dir = tempfile::tempdir().unwrap();
    let store = KvStore::open(dir.path(), inline_config(1)).unwrap();
    let model = store.model(fp(), geometry()).unwrap();
    let conv = |c: u32| -> Vec<u32> { (0..8).map(|t| 1000 * (c + 1) + t).collect() };
    for c in 0..3 {
        put_tokens(&model, &conv(c)).unwrap();
        model
            .save(&manifest(&format!("conv{c}"), &conv(c)))
            .unwrap();
    }
    store.flush().unwrap();
    let report = store.gc().unwrap();
    assert_eq!(report.manifests_read, 3, "{report:?}");
    assert_eq!(report.blocks, 0);

    // Meanwhile another process saves conv3 over blocks of its own, deletes conv0 and
    // replaces conv1 with a checkpoint of other tokens.
    {
        let (other, theirs) = other_process(dir.path());
        put_tokens(&theirs, &conv(3)).unwrap();
        theirs.save(&manifest("conv3", &conv(3))).unwrap();
        theirs.delete("conv0").unwrap();
        put_tokens(&theirs, &conv(4)).unwrap();
        theirs.save(&manifest("conv1", &conv(4))).unwrap();
        other.flush().unwrap();
    }
    // This process's collection reads the two manifests written, and deletes exactly the
    // blocks of conv0 and of the old conv1; conv3's blocks, which it never saw written, stay.
    let report = store.gc().unwrap();
    assert_eq!(report.manifests_read, 2, "{report:?}");
    assert_eq!(
        report.blocks, 4,
        "two blocks each of conv0 and the old conv1: {report:?}"
    );
    for name in ["conv1", "conv2", "conv3"] {
        if let Err(e) = model.load(name) {
            panic!("{name} lost its blocks: {e}");
        }
    }
    assert_eq!(model.load("conv1").unwrap().manifest.tokens, conv(4));
    let blocks_dir = dir.path().join("models").join(fp().to_hex()).join("blocks");
    assert_eq!(std::fs::read_dir(&blocks_dir).unwrap().count(), 6);
    // Nothing changed since: nothing read, nothing deleted.
    let report = store.gc().unwrap();
    assert_eq!((report.manifests_read, report.blocks), (0, 0), "{report:?}");
}

#[test]
fn an_expired_checkpoint_and_the_blocks_only_it_held_go_whatever_the_budget() {
    let dir = tempfile::tempdir().unwrap();
    let store = KvStore::open(dir.path(), inline_config(1)).unwrap();
    let model = store.model(fp(), geometry()).unwrap();
    // Two conversations after a shared first block; one expires.
    let conv = |c: u32| -> Vec<u32> { (0..4).chain((0..8).map(|t| 100 * (c + 1) + t)).collect() };
    let with_expiry = |name: &str, tokens: &[u32], expires: u64| {
        let mut m = manifest(name, tokens);
        m.meta.kv = vec![(kvstore::EXPIRES_KEY.to_owned(), expires.to_string())];
        m
    };
    put_tokens(&model, &conv(0)).unwrap();
    put_tokens(&model, &conv(1)).unwrap();
    model.save(&with_expiry("old", &conv(0), 1_000)).unwrap();
    model
        .save(&with_expiry("later", &conv(1), 4_000_000_000))
        .unwrap();
    store.flush().unwrap();
    let blocks_dir = dir.path().join("models").join(fp().to_hex()).join("blocks");
    let count = || std::fs::read_dir(&blocks_dir).unwrap().count();
    assert_eq!(count(), 5, "a shared block and two of each conversation");

    let report = model.collect_dropping(u64::MAX, &|_| None).unwrap();
    assert_eq!(report.manifests_expired, ["old"], "{report:?}");
    assert_eq!(
        count(),
        3,
        "old's own two blocks went; the shared one stays"
    );
    assert!(model.load("old").is_err());
    assert!(model.load("later").is_ok());
    // Nothing more to do.
    let report = model.collect_dropping(u64::MAX, &|_| None).unwrap();
    assert!(report.manifests_expired.is_empty() && report.blocks == 0);
}

#[test]
fn deleting_a_chain_removes_what_chains_from_its_root_and_spares_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let store = KvStore::open(dir.path(), inline_config(1)).unwrap();
    let model = store.model(fp(), geometry()).unwrap();
    let root = kvstore::BlockId([7; 32]);
    let tpb = TPB as usize;
    // The same tokens three times: chained from the root (a tail and a named save, and a
    // longer chain no checkpoint holds), and plainly.
    let tokens: Vec<u32> = (0..12).collect();
    let put_rooted = |tokens: &[u32]| {
        let mut prev = root;
        let mut ids = Vec::new();
        for chunk in tokens.chunks_exact(tpb) {
            let id = kvstore::BlockId::chain(&fp(), Some(&prev), chunk);
            model.put(Some(&prev), chunk, kv_of(&id)).unwrap();
            ids.push(id);
            prev = id;
        }
        ids
    };
    let rooted = put_rooted(&tokens[..8]);
    let loose = put_rooted(&tokens);
    let roots = vec![ckptfmt::ChainRoot { block: 0, id: root }];
    let rooted_manifest = |name: &str, n: usize| {
        manifest(name, &tokens[..n])
            .with_chain_roots(roots.clone())
            .unwrap()
    };
    model.save(&rooted_manifest("_tail-x", 8)).unwrap();
    model.save(&rooted_manifest("saved", 4)).unwrap();
    put_tokens(&model, &tokens).unwrap();
    model.save(&manifest("plain", &tokens)).unwrap();
    store.flush().unwrap();
    let blocks_dir = dir.path().join("models").join(fp().to_hex()).join("blocks");
    let files = || std::fs::read_dir(&blocks_dir).unwrap().count();
    assert_eq!(
        files(),
        3 + 3,
        "the rooted chain's three blocks and the plain three"
    );

    let report = model
        .delete_chain(&root, &|name: &str| name.starts_with("_tail-"))
        .unwrap();
    assert_eq!(report.manifests, ["_tail-x"]);
    // The rooted blocks went but the first, which the named save still holds; the loose third
    // block went by its chain.
    assert_eq!(report.blocks, 2, "{report:?}");
    assert_eq!(files(), 1 + 3);
    assert!(model.contains(&rooted[0]) && !model.contains(&rooted[1]));
    assert!(!model.contains(&loose[2]));
    assert!(model.load("saved").is_ok() && model.load("plain").is_ok());
}
