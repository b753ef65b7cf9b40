//! A hybrid model's checkpoint (ckptfmt's format version 2): the recurrent state after the
//! last token is saved beside the KV, and a sequence restored from it, in a new context of a
//! new process's store handle, continues bit for bit as the uninterrupted one; the state at the
//! last block boundary is kept too, so a prompt edited after it resumes there. A damaged state
//! is refused, never used; the prompt cache resumes a hybrid at a snapshot, never from blocks
//! alone.

mod common;

use std::sync::Arc;

use common::granite_hybrid::build_granite_hybrid;
use common::lfm2::build_lfm2;
use common::nemotron_h::build_nemotron_h;
use common::qwen35::build_qwen35;
use engine::store::{CheckpointMeta, SessionStore, StoreConfig};
use engine::{ContextParams, Evaluation, Model, Session, StoreErrorKind};

fn session(model: &Arc<Model>) -> Session {
    Session::new(
        model.clone(),
        ContextParams {
            n_ctx: 256,
            kv_tokens: 1024,
            n_threads: 2,
            evaluation: Evaluation::Invariant,
            ..ContextParams::default()
        },
    )
    .unwrap()
}

/// 150 tokens: two full blocks of 64 and a tail of 22.
fn prompt() -> Vec<u32> {
    (0..150).map(|i| ((i * 37 + 11) % 97) as u32).collect()
}

fn argmax(v: &[f32]) -> u32 {
    v.iter()
        .enumerate()
        .max_by(|a, b| a.1.total_cmp(b.1))
        .map_or(0, |(i, _)| i as u32)
}

/// Greedy continuation of `s` for `n` tokens: every step's logits.
fn continue_greedy(s: &mut Session, first: &[f32], n: usize) -> Vec<Vec<f32>> {
    let mut logits = first.to_vec();
    let mut out = Vec::new();
    for _ in 0..n {
        let next = argmax(&logits);
        logits = s.feed(&[next]).unwrap().to_vec();
        out.push(logits.clone());
    }
    out
}

#[test]
fn a_restored_hybrid_sequence_continues_bit_for_bit() {
    let (_models, model) = build_qwen35(2026);
    restored_sequence_continues(&model);
}

/// The same for lfm2, whose recurrent layers are short convolutions (a convolution state
/// alone).
#[test]
fn a_restored_lfm2_sequence_continues_bit_for_bit() {
    let (_models, model) = build_lfm2(2027);
    restored_sequence_continues(&model);
}

/// The same for nemotron_h, whose recurrent layers are Mamba-2 (a convolution state and an SSM
/// state per head), beside attention and feed-forward-only layers.
#[test]
fn a_restored_nemotron_h_sequence_continues_bit_for_bit() {
    let (_models, model) = build_nemotron_h(2028);
    restored_sequence_continues(&model);
}

/// The same for granitehybrid (Mamba-2 and attention layers, each with a network).
#[test]
fn a_restored_granite_hybrid_sequence_continues_bit_for_bit() {
    let (_models, model) = build_granite_hybrid(2029, None);
    restored_sequence_continues(&model);
}

/// A sequence of `model` saved, restored and continued bit for bit as the uninterrupted one;
/// an edited prompt resumed from the last boundary's snapshot.
fn restored_sequence_continues(model: &Arc<Model>) {
    let model = model.clone();
    let dir = tempfile::tempdir().unwrap();
    let tokens = prompt();

    // Uninterrupted: the prompt, then 12 greedy tokens.
    let mut a = session(&model);
    let after_prompt = a.feed(&tokens).unwrap().to_vec();
    let reference = continue_greedy(&mut a, &after_prompt, 12);

    // Saved after the prompt plus one token, restored into a new context through a store
    // opened anew, and continued from there.
    let mut b = session(&model);
    let first = b.feed(&tokens).unwrap().to_vec();
    assert_eq!(first, after_prompt);
    let next = argmax(&first);
    let l1 = b.feed(&[next]).unwrap().to_vec();
    assert_eq!(l1, reference[0]);
    {
        let store = SessionStore::open(dir.path(), &model, StoreConfig::default()).unwrap();
        store
            .save(&b, "hybrid", &CheckpointMeta::default())
            .unwrap();
    }
    drop(b);
    let store = SessionStore::open(dir.path(), &model, StoreConfig::default()).unwrap();
    let mut c = session(&model);
    store.restore(&mut c, "hybrid").unwrap();
    assert_eq!(c.tokens().len(), tokens.len() + 1);
    // Continue: the next token after `l1`, and on; each step identical to the reference.
    let rest = continue_greedy(&mut c, &l1, 11);
    for (i, (got, want)) in rest.iter().zip(&reference[1..]).enumerate() {
        assert!(got == want, "step {} after the restore differs", i + 1);
    }

    // The manifest carries the state: format version 2.
    let manifest = std::fs::read(
        dir.path()
            .join(kvstore::store::MODELS_DIR)
            .read_dir()
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
            .path()
            .join("manifests/hybrid.ckpt"),
    )
    .unwrap();
    assert_eq!(u16::from_le_bytes([manifest[8], manifest[9]]), 2);

    // A prompt edited after the last block boundary (token 140 of 150) resumes from the
    // snapshot the save kept there (128 tokens) and gives the logits of the edited prompt
    // computed from scratch (fed the same way: a hybrid's batches end at the last boundary).
    let mut edited = tokens[..140].to_vec();
    edited.extend((0..10).map(|i| (i * 7 + 3) % 97));
    let mut d = session(&model);
    let n = store.restore_prefix(&mut d, &edited).unwrap();
    assert_eq!(n, 128);
    let resumed = d.feed(&edited[n..]).unwrap().to_vec();
    let mut fresh = session(&model);
    let cold = fresh.feed(&edited).unwrap().to_vec();
    assert!(
        resumed == cold,
        "the resumed edit differs from the cold run"
    );
    // One edited inside the first block shares no boundary with a snapshot: nothing resumed.
    let mut early = tokens.clone();
    early[10] = (early[10] + 1) % 97;
    assert_eq!(
        store.restore_prefix(&mut session(&model), &early).unwrap(),
        0
    );
    // A stored-prefix lookup resumes it at the same snapshot (blocks alone could not).
    assert_eq!(store.stored_prefix(&tokens, None, None).tokens, 128);
}

#[test]
fn a_restored_hybrid_session_generates_at_once() {
    // A restored sequence has no logits: `generate` evaluates its last token again, which a
    // hybrid can do only from a known state (here the start: the restore kept none before).
    let (_models, model) = build_qwen35(11);
    let dir = tempfile::tempdir().unwrap();
    let tokens = prompt();
    let mut a = session(&model);
    let after = a.feed(&tokens).unwrap().to_vec();
    let store = SessionStore::open(dir.path(), &model, StoreConfig::default()).unwrap();
    store.save(&a, "g", &CheckpointMeta::default()).unwrap();
    let mut b = session(&model);
    store.restore(&mut b, "g").unwrap();
    let seq = b.seq();
    let again = b.context_mut().ensure_logits(seq).unwrap().to_vec();
    assert!(again == after, "the logits evaluated again differ");
    assert_eq!(b.tokens(), &tokens[..], "the sequence is left as it was");
    // And it goes on as the uninterrupted session.
    assert_eq!(
        continue_greedy(&mut b, &again, 4),
        continue_greedy(&mut a, &after, 4)
    );
}

#[test]
fn a_damaged_state_is_refused_and_the_session_kept() {
    let (_models, model) = build_qwen35(7);
    let dir = tempfile::tempdir().unwrap();
    let tokens = prompt();
    let store = SessionStore::open(dir.path(), &model, StoreConfig::default()).unwrap();
    let mut a = session(&model);
    a.feed(&tokens).unwrap();
    store.save(&a, "x", &CheckpointMeta::default()).unwrap();

    // Flip one bit of the manifest's tail state: its last section, so its last non-zero
    // byte (the padding after it is zero).
    let models = dir.path().join(kvstore::store::MODELS_DIR);
    let fp_dir = models.read_dir().unwrap().next().unwrap().unwrap().path();
    let path = fp_dir.join("manifests/x.ckpt");
    let mut bytes = std::fs::read(&path).unwrap();
    let at = bytes.iter().rposition(|&b| b != 0).unwrap();
    bytes[at] ^= 0x01;
    std::fs::write(&path, bytes).unwrap();

    let mut b = session(&model);
    b.feed(&[1, 2, 3]).unwrap();
    let err = store.restore(&mut b, "x").unwrap_err();
    assert_eq!(err.store_kind(), Some(StoreErrorKind::Corrupt), "{err:?}");
    assert_eq!(b.tokens(), &[1, 2, 3], "the session is left as it was");
}
