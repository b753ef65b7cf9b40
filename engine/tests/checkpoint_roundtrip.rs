//! Saving a session as a ckptfmt checkpoint and restoring it in a fresh session, on tiny models
//! that the test writes: identical logits, incremental saves, and refusal of bad checkpoints.

mod common;

use common::*;
use engine::checkpoint::{open_store, TOKENS_PER_BLOCK};
use engine::{Error, Session};

#[test]
fn restore_reproduces_the_next_logits_exactly() {
    let c = cfg(Shape::Llama, false);
    let (dir, model, _) = build(&c, 21);
    let toks = tokens(100); // one full block of 64 and a tail of 36 before the probe token
    let n = 99;
    let mut a = Session::new(model.clone(), params(512)).unwrap();
    a.feed(&toks[..n]).unwrap();
    let store = open_store(&dir.path().join("store"), &a).unwrap();
    let meta = vec![("messages".to_owned(), "[]".to_owned())];
    let saved = a
        .save_checkpoint(&store, "chat", meta.clone(), Some(vec![9; 32]))
        .unwrap();
    assert_eq!(saved.blocks_written, n / TOKENS_PER_BLOCK as usize);
    let want = a.feed(&toks[n..]).unwrap().to_vec();

    let mut b = Session::new(model, params(512)).unwrap();
    b.feed(&toks[50..60]).unwrap(); // whatever it held before is replaced
    let m = b.restore_checkpoint(&store, "chat").unwrap();
    assert_eq!(m.meta.kv, meta);
    assert_eq!(m.sampler_state, Some(vec![9; 32]));
    assert_eq!(b.tokens(), &toks[..n]);
    let got = b.feed(&toks[n..]).unwrap().to_vec();
    assert_eq!(got, want);
}

#[test]
fn extending_a_conversation_writes_only_new_blocks() {
    let c = cfg(Shape::Qwen2, false);
    let (dir, model, _) = build(&c, 22);
    let toks = tokens(120);
    let mut s = Session::new(model, params(512)).unwrap();
    s.feed(&toks[..70]).unwrap();
    let store = open_store(&dir.path().join("store"), &s).unwrap();
    let first = s.save_checkpoint(&store, "c", Vec::new(), None).unwrap();
    assert_eq!((first.blocks_written, first.blocks_reused), (1, 0));
    s.feed(&toks[70..]).unwrap();
    let second = s.save_checkpoint(&store, "c", Vec::new(), None).unwrap();
    assert_eq!((second.blocks_written, second.blocks_reused), (0, 1));
    // Another conversation with the same first 64 tokens shares that block.
    let other = s
        .save_checkpoint(&store, "other", Vec::new(), None)
        .unwrap();
    assert_eq!((other.blocks_written, other.blocks_reused), (0, 1));
}

#[test]
fn a_corrupt_or_foreign_checkpoint_is_refused_and_nothing_half_restored() {
    let c = cfg(Shape::Llama, false);
    let (dir, model, _) = build(&c, 23);
    let toks = tokens(200); // three full blocks and a tail
    let mut p = params(512);
    p.n_ctx = 256;
    let mut s = Session::new(model.clone(), p.clone()).unwrap();
    s.feed(&toks).unwrap();
    let root = dir.path().join("store");
    let store = open_store(&root, &s).unwrap();
    s.save_checkpoint(&store, "c", Vec::new(), None).unwrap();

    // Flip one byte near the end of the third block's file: the first two restore fine, then
    // the third fails verification.
    let third = store.read_manifest("c").unwrap().block_ids[2].to_hex();
    let file = walk(&root)
        .into_iter()
        .find(|p| p.file_name().unwrap().to_string_lossy().starts_with(&third))
        .expect("the third block's file");
    let mut bytes = std::fs::read(&file).unwrap();
    let at = bytes.len() - 100;
    bytes[at] ^= 1;
    std::fs::write(&file, bytes).unwrap();
    let mut fresh = Session::new(model, p).unwrap();
    fresh.feed(&toks[..5]).unwrap();
    let err = fresh.restore_checkpoint(&store, "c").unwrap_err();
    assert!(matches!(err, Error::Checkpoint(_)), "{err}");
    assert!(
        fresh.tokens().is_empty() && fresh.logits().is_err(),
        "a failed restore must leave an empty session, never a partial one"
    );
    // The session is usable afterwards.
    assert!(fresh.feed(&toks[..5]).is_ok());

    // A different model (other weights, same shapes) has another fingerprint: refused.
    let (_dir2, other_model, _) = build(&c, 24);
    let other = Session::new(other_model, params(512)).unwrap();
    assert!(matches!(
        open_store(&root, &other),
        Err(Error::Checkpoint(_))
    ));
    assert!(matches!(
        store.read_manifest("missing"),
        Err(ckptfmt::FormatError::NotFound { .. })
    ));
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

#[test]
fn a_new_conversation_reuses_a_stored_prefix_from_another() {
    let c = cfg(Shape::Llama, false);
    let (dir, model, _) = build(&c, 25);
    let mut p = params(512);
    p.n_ctx = 256;
    let shared = tokens(150);
    let mut a = Session::new(model.clone(), p.clone()).unwrap();
    a.feed(&shared).unwrap();
    let store = open_store(&dir.path().join("store"), &a).unwrap();
    a.save_checkpoint(&store, "first", Vec::new(), None)
        .unwrap();

    // A second conversation: the same 140 leading tokens, then its own.
    let mut prompt = shared[..140].to_vec();
    prompt.extend([3, 1, 4, 1, 5, 9, 2, 6]);
    let mut b = Session::new(model.clone(), p.clone()).unwrap();
    let reused = b.restore_prefix(&store, &prompt).unwrap();
    assert_eq!(reused, 128, "two full blocks of the shared 140 tokens");
    assert_eq!(b.tokens(), &prompt[..128]);
    let got = b.feed(&prompt[reused..]).unwrap().to_vec();
    // The same split, computed from scratch.
    let mut fresh = Session::new(model.clone(), p.clone()).unwrap();
    fresh.feed(&prompt[..128]).unwrap();
    let want = fresh.feed(&prompt[128..]).unwrap().to_vec();
    assert_eq!(got, want);

    // A prompt that differs in its first block shares nothing.
    let mut other = prompt.clone();
    other[10] = 77;
    let mut d = Session::new(model, p).unwrap();
    assert_eq!(d.restore_prefix(&store, &other).unwrap(), 0);
    assert!(d.tokens().is_empty());
}
