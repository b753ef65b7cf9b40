//! The model fingerprint covers every byte of the weights: two files that differ inside a
//! tensor are two models, and neither uses the other's store. A second start on an unchanged
//! file takes the fingerprint from the cache directory's record instead of hashing again.

mod common;

use std::path::{Path, PathBuf};

use common::*;
use engine::store::{CheckpointMeta, SessionStore, StoreConfig};
use engine::{FingerprintOrigin, Model, Session};

/// Where in the file at `path` the middle of its largest tensor lies, checked to be outside
/// both 4 KiB ends that fingerprint version 2 sampled.
fn middle_of_largest_tensor(path: &Path) -> usize {
    let gguf = engine::gguf::Gguf::open(path).unwrap();
    let t = gguf.tensors().iter().max_by_key(|t| t.n_bytes).unwrap();
    assert!(
        t.n_bytes > 3 * 4096,
        "{} has {} bytes: too few to have a middle",
        t.name,
        t.n_bytes
    );
    (t.offset + t.n_bytes / 2) as usize
}

fn flip_byte_in_place(path: &Path, pos: usize) {
    use std::io::{Read, Seek, SeekFrom, Write};
    let mut f = std::fs::File::options()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut b = [0u8];
    f.seek(SeekFrom::Start(pos as u64)).unwrap();
    f.read_exact(&mut b).unwrap();
    f.seek(SeekFrom::Start(pos as u64)).unwrap();
    f.write_all(&[b[0] ^ 1]).unwrap();
}

fn model_path(dir: &Path) -> PathBuf {
    dir.join("tiny.gguf")
}

#[test]
fn one_byte_inside_a_tensor_makes_another_model_with_a_store_of_its_own() {
    let (dir, model_a, _) = build(&cfg(Shape::Llama, false), 41);
    let path_b = dir.path().join("b.gguf");
    std::fs::copy(model_path(dir.path()), &path_b).unwrap();
    flip_byte_in_place(&path_b, middle_of_largest_tensor(&path_b));
    let model_b = Model::load(&path_b).unwrap();
    assert_eq!(
        model_a.legacy_fingerprint(),
        model_b.legacy_fingerprint(),
        "the byte is where version 2 did not look"
    );
    assert_ne!(model_a.fingerprint(), model_b.fingerprint());

    // A conversation stored with one model is not found with the other.
    let cache = dir.path().join("cache");
    let toks = tokens(150);
    let mut p = params(512);
    p.n_ctx = 256;
    let mut a = Session::new(model_a.clone(), p.clone()).unwrap();
    a.feed(&toks).unwrap();
    let store_a = SessionStore::open(&cache, &model_a, StoreConfig::default()).unwrap();
    store_a
        .save(&a, "chat", &CheckpointMeta::default())
        .unwrap();
    let store_b = SessionStore::open(&cache, &model_b, StoreConfig::default()).unwrap();
    let mut b = Session::new(model_b.clone(), p).unwrap();
    assert_eq!(store_b.restore_prefix(&mut b, &toks).unwrap(), 0);
    assert!(store_b.restore(&mut b, "chat").is_err());
    assert!(b.tokens().is_empty());
}

#[test]
fn the_fingerprint_is_remembered_for_an_unchanged_file_only() {
    let (dir, first, _) = build(&cfg(Shape::Llama, false), 43);
    let path = model_path(dir.path());
    let cache = dir.path().join("cache");
    let (fp, origin) = first.remember_fingerprint(&cache);
    assert_eq!(origin, FingerprintOrigin::Hashed);
    assert_eq!(fp, first.fingerprint());
    drop(first);

    let again = Model::load(&path).unwrap();
    assert_eq!(
        again.remember_fingerprint(&cache),
        (fp, FingerprintOrigin::Remembered)
    );
    drop(again);

    // Touched (the same bytes, another time): hashed again, the same fingerprint.
    let f = std::fs::File::options().write(true).open(&path).unwrap();
    f.set_modified(std::time::SystemTime::now() + std::time::Duration::from_secs(5))
        .unwrap();
    drop(f);
    let touched = Model::load(&path).unwrap();
    assert_eq!(
        touched.remember_fingerprint(&cache),
        (fp, FingerprintOrigin::Hashed)
    );
    drop(touched);

    // Changed in place (same length, same inode) and dated back to the recorded time: the
    // change time still tells, and the new fingerprint differs.
    let recorded = std::fs::metadata(&path).unwrap().modified().unwrap();
    flip_byte_in_place(&path, middle_of_largest_tensor(&path));
    let f = std::fs::File::options().write(true).open(&path).unwrap();
    f.set_modified(recorded).unwrap();
    drop(f);
    let changed = Model::load(&path).unwrap();
    let (fp2, origin) = changed.remember_fingerprint(&cache);
    assert_eq!(origin, FingerprintOrigin::Hashed);
    assert_ne!(fp2, fp);
    drop(changed);

    // A damaged record is not believed.
    for e in std::fs::read_dir(cache.join("fingerprints")).unwrap() {
        let p = e.unwrap().path();
        let text = std::fs::read_to_string(&p).unwrap();
        std::fs::write(&p, text.replace("fingerprint ", "fingerprint 00")).unwrap();
    }
    let damaged = Model::load(&path).unwrap();
    assert_eq!(
        damaged.remember_fingerprint(&cache),
        (fp2, FingerprintOrigin::Hashed)
    );
}

#[test]
fn a_store_under_the_old_fingerprint_is_reported_and_not_used() {
    let (dir, model, _) = build(&cfg(Shape::Llama, false), 45);
    let cache = dir.path().join("cache");
    // A store as version 2 left it: the model's checkpoints under its sampled fingerprint.
    {
        let layout =
            engine::KvLayout::with_types(model.hparams(), engine::KvType::F16, engine::KvType::F16)
                .unwrap();
        let geometry = engine::store::geometry(&layout).unwrap();
        let old = kvstore::Fingerprint(model.legacy_fingerprint());
        let store = kvstore::KvStore::open(&cache, kvstore::Config::default()).unwrap();
        let m = store.model(old, geometry.clone()).unwrap();
        let manifest = kvstore::Manifest::new(
            old,
            geometry,
            Vec::new(),
            Vec::new(),
            Vec::new(),
            ckptfmt::Metadata {
                name: "chat".into(),
                ..ckptfmt::Metadata::default()
            },
        )
        .unwrap();
        m.save(&manifest).unwrap();
    }
    let store = SessionStore::open(&cache, &model, StoreConfig::default()).unwrap();
    let old = store.legacy_store().expect("the old store is found");
    assert_eq!(old.checkpoints, 1);
    assert!(old.to_string().contains("delete that directory"), "{old}");
    assert!(old.dir.exists());
    // Not used: the checkpoint is not there for this model.
    assert!(!store.exists("chat").unwrap());
}

/// The weights are hashed from reads of the file, not through the map ggml computes with: a
/// file cut short after loading (which made the old, map-reading hash fault) gets a fingerprint
/// that matches nothing, not a crash and not the original's.
#[test]
fn a_model_file_cut_short_after_loading_matches_nothing() {
    let (dir, original, _) = build(&cfg(Shape::Llama, false), 43);
    let path_b = dir.path().join("b.gguf");
    std::fs::copy(model_path(dir.path()), &path_b).unwrap();
    let model_b = Model::load(&path_b).unwrap();
    let cut = middle_of_largest_tensor(&path_b) as u64;
    std::fs::File::options()
        .write(true)
        .open(&path_b)
        .unwrap()
        .set_len(cut)
        .unwrap();
    let fp = model_b.fingerprint();
    assert_ne!(fp, original.fingerprint());
    assert_ne!(model_b.legacy_fingerprint(), original.legacy_fingerprint());
    assert_ne!(
        model_b.legacy_fingerprint(),
        model_b.legacy_fingerprint(),
        "each unreadable hash is a fingerprint of its own"
    );
    assert_eq!(model_b.fingerprint(), fp, "computed once per model");
}
