//! Sessions saved to and restored from a kvstore directory (the one persistence path), on tiny
//! models the test writes: identical logits, incremental saves, branches, a disk budget, two
//! stores on one directory, and refusal of damaged or foreign checkpoints that changes nothing.

mod common;

use std::path::Path;

use common::*;
use engine::store::{CheckpointMeta, SessionStore, StoreConfig};
use engine::testing::files_under;
use engine::{Error, Session};

fn open(dir: &Path, model: &engine::Model) -> SessionStore {
    SessionStore::open(&dir.join("store"), model, StoreConfig::default()).unwrap()
}

#[test]
fn restore_reproduces_the_next_logits_and_generates_at_once() {
    let c = cfg(Shape::Llama, false);
    let (dir, model, _) = build(&c, 31);
    let toks = tokens(100); // one full block of 64 and a tail of 36 before the probe token
    let n = 99;
    let mut a = Session::new(model.clone(), params(512)).unwrap();
    a.feed(&toks[..n]).unwrap();
    let logits_a = a.logits().unwrap().to_vec();
    let store = open(dir.path(), &model);
    let meta = CheckpointMeta {
        sampler_state: Some(vec![9; 32]),
        turns: vec![40, 99],
        app: [("messages".to_owned(), "[]".to_owned())].into(),
        ..CheckpointMeta::default()
    };
    let saved = store.save(&a, "chat", &meta).unwrap();
    assert_eq!((saved.blocks_written, saved.blocks_reused), (1, 0));

    // Another process (a fresh store handle and session) restores it.
    let store2 = open(dir.path(), &model);
    let mut b = Session::new(model.clone(), params(512)).unwrap();
    b.feed(&toks[50..60]).unwrap(); // whatever it held before is replaced
    let back = store2.restore(&mut b, "chat").unwrap();
    assert_eq!(back.sampler_state, meta.sampler_state);
    assert_eq!(
        (back.turns.clone(), back.app.clone()),
        (meta.turns, meta.app)
    );
    assert_eq!(b.tokens(), &toks[..n]);
    // A restored session has logits at once (its last token is evaluated again).
    // Evaluated alone rather than at the end of the prefill, the kernels sum in another order.
    assert_close(
        b.ensure_logits().unwrap(),
        &logits_a,
        5e-3,
        "logits after restore",
    );
    let want = a.feed(&toks[n..]).unwrap().to_vec();
    let got = b.feed(&toks[n..]).unwrap().to_vec();
    assert_eq!(got, want);
}

#[test]
fn saves_write_only_new_blocks_and_branches_write_none() {
    let c = cfg(Shape::Qwen2, false);
    let (dir, model, _) = build(&c, 32);
    let toks = tokens(140);
    let mut p = params(512);
    p.n_ctx = 256;
    let mut s = Session::new(model.clone(), p.clone()).unwrap();
    s.feed(&toks[..70]).unwrap();
    let store = open(dir.path(), &model);
    let meta = CheckpointMeta::default();
    let first = store.save(&s, "c", &meta).unwrap();
    assert_eq!((first.blocks_written, first.blocks_reused), (1, 0));
    s.feed(&toks[70..]).unwrap();
    let second = store.save(&s, "c", &meta).unwrap();
    assert_eq!((second.blocks_written, second.blocks_reused), (1, 1));
    let files = files_under(dir.path()).len();
    store.branch("c", "c-alt").unwrap();
    assert_eq!(
        files_under(dir.path()).len(),
        files + 1,
        "a branch adds its manifest only"
    );
    let mut names: Vec<_> = store
        .checkpoints()
        .unwrap()
        .into_iter()
        .map(|c| c.name)
        .collect();
    names.sort();
    assert_eq!(names, ["c", "c-alt"]);
    let mut t = Session::new(model, p).unwrap();
    let m = store.restore(&mut t, "c-alt").unwrap();
    assert_eq!((t.tokens(), m.parent.as_deref()), (&toks[..], Some("c")));
    store.delete("c").unwrap();
    assert!(!store.exists("c").unwrap() && store.exists("c-alt").unwrap());
}

#[test]
fn a_damaged_or_foreign_checkpoint_is_refused_and_the_session_kept() {
    let c = cfg(Shape::Llama, false);
    let (dir, model, _) = build(&c, 33);
    let toks = tokens(200); // three full blocks and a tail
    let mut p = params(512);
    p.n_ctx = 256;
    let mut s = Session::new(model.clone(), p.clone()).unwrap();
    s.feed(&toks).unwrap();
    let store = open(dir.path(), &model);
    store.save(&s, "c", &CheckpointMeta::default()).unwrap();
    let third = s.context().block_ids(s.seq()).unwrap()[2].to_hex();
    drop(store);

    // Flip one byte near the end of the last block's file: the first two restore fine, then
    // the third fails verification.
    let file = files_under(dir.path())
        .into_iter()
        .find(|p| p.file_name().unwrap().to_string_lossy().starts_with(&third))
        .expect("the third block's file");
    let mut bytes = std::fs::read(&file).unwrap();
    let at = bytes.len() - 100;
    bytes[at] ^= 1;
    std::fs::write(&file, bytes).unwrap();

    let store = open(dir.path(), &model);
    let mut other = Session::new(model.clone(), p.clone()).unwrap();
    other.feed(&toks[..5]).unwrap();
    let mut kv_before = vec![0u8; 5 * other.kv_layout().k_bytes_per_token[0]];
    let mut v_before = kv_before.clone();
    other
        .read_kv(0, 0..5, &mut kv_before, &mut v_before)
        .unwrap();
    let logits_before = other.logits().unwrap().to_vec();
    let err = store.restore(&mut other, "c").unwrap_err();
    assert!(
        matches!(err, Error::Store { .. } | Error::Checkpoint { .. }),
        "{err}"
    );
    // Exactly as before: tokens, KV bytes and logits.
    assert_eq!(other.tokens(), &toks[..5]);
    assert_eq!(other.logits().unwrap(), &logits_before[..]);
    let (mut k, mut v) = (kv_before.clone(), v_before.clone());
    other.read_kv(0, 0..5, &mut k, &mut v).unwrap();
    assert_eq!((k, v), (kv_before, v_before));
    assert!(
        store.exists("c").unwrap(),
        "the damaged checkpoint is kept, not deleted"
    );

    // A prefix lookup (what the server's prompt cache does) still uses the two blocks that
    // verify: the damaged one ends the usable prefix there.
    let mut prefixed = Session::new(model.clone(), p.clone()).unwrap();
    let reused = store.restore_prefix(&mut prefixed, &toks).unwrap();
    assert_eq!(reused, 128, "the blocks before the damaged one");
    assert_eq!(prefixed.tokens(), &toks[..128]);
    let got = prefixed.feed(&toks[128..]).unwrap().to_vec();
    assert_eq!(
        got,
        s.logits().unwrap(),
        "same logits as the uninterrupted evaluation"
    );

    // A different model (other weights, same shapes) has another fingerprint: its store sees
    // no checkpoint, and the first model's files are untouched.
    let before: Vec<_> = files_under(dir.path());
    let (_dir2, other_model, _) = build(&c, 34);
    let foreign = open(dir.path(), &other_model);
    assert!(!foreign.exists("c").unwrap());
    let mut t = Session::new(other_model, p).unwrap();
    assert!(foreign.restore(&mut t, "c").is_err());
    for f in before {
        assert!(f.exists(), "{} vanished", f.display());
    }
}

#[test]
fn a_new_conversation_reuses_a_stored_prefix_from_another() {
    let c = cfg(Shape::Llama, false);
    let (dir, model, _) = build(&c, 35);
    let mut p = params(512);
    p.n_ctx = 256;
    let shared = tokens(150);
    let mut a = Session::new(model.clone(), p.clone()).unwrap();
    a.feed(&shared).unwrap();
    let store = open(dir.path(), &model);
    store.save(&a, "first", &CheckpointMeta::default()).unwrap();

    let mut prompt = shared[..140].to_vec();
    prompt.extend([3, 1, 4, 1, 5, 9, 2, 6]);
    let mut b = Session::new(model.clone(), p.clone()).unwrap();
    let reused = store.restore_prefix(&mut b, &prompt).unwrap();
    assert_eq!(reused, 128, "two full blocks of the shared 140 tokens");
    assert_eq!(b.tokens(), &prompt[..128]);
    let got = b.feed(&prompt[reused..]).unwrap().to_vec();
    let mut fresh = Session::new(model.clone(), p.clone()).unwrap();
    fresh.feed(&prompt[..128]).unwrap();
    let want = fresh.feed(&prompt[128..]).unwrap().to_vec();
    assert_eq!(got, want);

    let mut other = prompt.clone();
    other[10] = 77;
    let mut d = Session::new(model, p).unwrap();
    assert_eq!(store.restore_prefix(&mut d, &other).unwrap(), 0);
    assert!(d.tokens().is_empty());
}

#[test]
fn a_disk_budget_keeps_the_most_recent_conversations() {
    let c = cfg(Shape::Llama, false);
    let (dir, model, _) = build(&c, 36);
    let bytes_per_block = 64 * model_kv_bytes_per_token(&model) as u64;
    // Room for about four conversations of three blocks.
    let budget = 13 * bytes_per_block;
    let store = SessionStore::open(
        &dir.path().join("store"),
        &model,
        StoreConfig {
            ram_bytes: 1 << 20,
            disk_bytes: Some(budget),
            ..StoreConfig::default()
        },
    )
    .unwrap();
    let mut p = params(512);
    p.n_ctx = 256;
    let mut s = Session::new(model.clone(), p.clone()).unwrap();
    let mut evicted = Vec::new();
    for conv in 0..8u32 {
        s.clear();
        let toks: Vec<u32> = (0..200).map(|i| (i * 7 + conv * 13 + 1) % 97).collect();
        s.feed(&toks).unwrap();
        let meta = CheckpointMeta::default();
        evicted.extend(
            store
                .save(&s, &format!("conv{conv}"), &meta)
                .unwrap()
                .evicted,
        );
        // Every file of the store counts: blocks, manifests (with their partial last
        // blocks), the descriptor and lock files (a few hundred bytes).
        let on_disk: u64 = files_under(&dir.path().join("store"))
            .iter()
            .map(|p| p.metadata().unwrap().len())
            .sum();
        assert!(on_disk <= budget + 4096, "{on_disk} > {budget}");
    }
    assert!(
        !evicted.is_empty(),
        "the budget must have dropped old conversations"
    );
    let names: Vec<_> = store
        .checkpoints()
        .unwrap()
        .into_iter()
        .map(|c| c.name)
        .collect();
    assert!(names.contains(&"conv7".to_owned()) && names.contains(&"conv6".to_owned()));
    assert!(!names.contains(&"conv0".to_owned()), "{names:?}");
    let mut t = Session::new(model, p).unwrap();
    store.restore(&mut t, "conv7").unwrap();
    assert_eq!(t.tokens().len(), 200);
}

fn model_kv_bytes_per_token(model: &engine::Model) -> usize {
    engine::KvLayout::for_model(model.hparams()).bytes_per_token()
}
