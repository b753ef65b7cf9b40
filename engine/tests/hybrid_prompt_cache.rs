//! A hybrid model's prompt cache: a sequence keeps its recurrent state at two page boundaries
//! (the end of its prompt's last full page, the last boundary its reply crossed) and can be cut
//! back or forked there; the cache stores those snapshots with the blocks and a tail with the
//! state after the last token, so that the next turn of a conversation, in a new context of a
//! new store handle, resumes at the previous turn's end and continues bit for bit as the
//! uninterrupted sequence, and an edited history resumes at the last snapshot before the edit.

mod common;

use std::sync::Arc;

use common::qwen35::build_qwen35;
use engine::store::{SessionStore, StoreConfig};
use engine::{Context, ContextParams, Error, Evaluation, Logits, Model, SeqId, PAGE_TOKENS};

/// The name a prompt cache gives the tail after full block `last`.
fn tail_name(last: &engine::BlockId) -> String {
    format!("{}{}", engine::store::CACHED_PREFIX, last.to_hex())
}

fn context(model: &Arc<Model>) -> Context {
    Context::new(
        model.clone(),
        ContextParams {
            n_ctx: 512,
            kv_tokens: 2048,
            n_threads: 2,
            evaluation: Evaluation::Invariant,
            ..ContextParams::default()
        },
    )
    .unwrap()
}

/// `n` tokens of stream `seed`.
fn stream(seed: usize, n: usize) -> Vec<u32> {
    (0..n)
        .map(|i| ((i * 37 + seed * 13 + 11) % 97) as u32)
        .collect()
}

fn argmax(v: &[f32]) -> u32 {
    v.iter()
        .enumerate()
        .max_by(|a, b| a.1.total_cmp(b.1))
        .map_or(0, |(i, _)| i as u32)
}

/// A new sequence of `ctx` fed `prompt`, then `n` greedy tokens one at a time (as a server
/// decodes); returns it and the logits after its last token.
fn converse(ctx: &mut Context, prompt: &[u32], n: usize) -> (SeqId, Vec<f32>) {
    let seq = ctx.new_sequence();
    let mut logits = ctx.feed(seq, prompt, Logits::Last).unwrap();
    for _ in 0..n {
        let next = argmax(&logits);
        logits = ctx.feed(seq, &[next], Logits::Last).unwrap();
    }
    (seq, logits)
}

#[test]
fn a_hybrid_sequence_is_cut_back_only_where_it_kept_its_state() {
    assert_eq!(
        PAGE_TOKENS, 64,
        "the boundaries below assume pages of 64 tokens"
    );
    let (_models, model) = build_qwen35(2026);
    let mut ctx = context(&model);
    // A prompt of 150 tokens (its last full page ends at 128), then 50 decoded (crossing 192).
    let (seq, _) = converse(&mut ctx, &stream(1, 150), 50);
    let held = ctx.tokens(seq).unwrap().to_vec();
    assert_eq!(held.len(), 200);
    assert_eq!(ctx.resumable_len(seq, 199).unwrap(), 192);
    assert_eq!(ctx.resumable_len(seq, 191).unwrap(), 128);
    assert_eq!(ctx.resumable_len(seq, 127).unwrap(), 0);
    assert_eq!(ctx.resumable_len(seq, 200).unwrap(), 200);

    // Forked at the prompt's boundary and fed the rest again: the uninterrupted logits.
    let fork = ctx.fork(seq, 128).unwrap();
    let refed = ctx.feed(fork, &held[128..], Logits::Last).unwrap();
    let mut whole = context(&model);
    let (w, _) = converse(&mut whole, &held[..128], 0);
    let straight = whole.feed(w, &held[128..], Logits::Last).unwrap();
    assert!(
        refed == straight,
        "the fork at 128 differs from a straight run"
    );

    // Cut back to a boundary it kept: as the straight run there; elsewhere a typed error that
    // changes nothing.
    let err = ctx.truncate(seq, 150).unwrap_err();
    assert!(matches!(err, Error::Recurrent { .. }), "{err:?}");
    assert_eq!(ctx.tokens(seq).unwrap().len(), 200);
    ctx.truncate(seq, 192).unwrap();
    let again = ctx.feed(seq, &held[192..], Logits::Last).unwrap();
    let mut by_steps = context(&model);
    let (b, _) = converse(&mut by_steps, &held[..150], 0);
    let mut last = Vec::new();
    for &t in &held[150..] {
        last = by_steps.feed(b, &[t], Logits::Last).unwrap();
    }
    // The same tokens from 192 fed as one batch rather than one by one: compared against a
    // run fed the same way.
    by_steps.truncate(b, 192).unwrap();
    let want = by_steps.feed(b, &held[192..], Logits::Last).unwrap();
    assert!(
        again == want,
        "the cut-back sequence differs from the straight run"
    );
    assert!(!last.is_empty());
    // Cut back past the prompt's boundary: the later snapshot went with the tokens.
    ctx.truncate(seq, 128).unwrap();
    assert_eq!(ctx.resumable_len(seq, 127).unwrap(), 0);
}

#[test]
fn the_next_turn_resumes_from_disk_where_the_last_one_ended() {
    let (_models, model) = build_qwen35(99);
    let dir = tempfile::tempdir().unwrap();
    // Turn one: a prompt of 150 tokens and 50 decoded ones.
    let mut a = context(&model);
    let (seq, end) = converse(&mut a, &stream(2, 150), 50);
    let turn1 = a.tokens(seq).unwrap().to_vec();
    {
        let store = SessionStore::open(dir.path(), &model, StoreConfig::default()).unwrap();
        let blocks = store.copy_blocks(&a, seq, 0).unwrap();
        // Three full blocks; the snapshots at 128 (the prompt's) and 192 (the reply's).
        assert_eq!(blocks.len(), 3);
        let states: Vec<usize> = blocks
            .iter()
            .filter_map(|b| b.state.as_ref())
            .map(|s| s.0)
            .collect();
        assert_eq!(states, [128, 192]);
        store.put_blocks(blocks).unwrap();
        let tail = store.copy_prefix(&a, seq, turn1.len()).unwrap().unwrap();
        assert!(tail.state.is_some());
        store
            .save_prefix(&tail_name(&a.block_ids(seq).unwrap()[2]), tail)
            .unwrap();
        store.flush().unwrap();
    }

    // Turn two, in a new context through a store opened anew: the whole first turn is found
    // (its tail carries the state) and only the new tokens are computed; the logits are the
    // uninterrupted sequence's bit for bit.
    let store = SessionStore::open(dir.path(), &model, StoreConfig::default()).unwrap();
    let mut next = turn1.clone();
    next.push(argmax(&end));
    next.extend(stream(3, 29));
    let usable = &next[..next.len() - 1];
    let mut b = context(&model);
    let loaded = store
        .load_prefix(b.kv_layout(), usable, 0, None, Some(&tail_name))
        .unwrap();
    assert_eq!(loaded.tokens(), turn1.len());
    let s = b.new_sequence();
    assert_eq!(
        store.import_loaded(&mut b, s, usable, &loaded).unwrap(),
        200
    );
    let resumed = b.feed(s, &next[200..], Logits::Last).unwrap();
    let uninterrupted = a.feed(seq, &next[200..], Logits::Last).unwrap();
    assert!(resumed == uninterrupted, "the resumed turn differs");

    // A history edited at token 170 resumes at the prompt's boundary before it (128) and
    // gives the logits of the edited history fed from scratch at the same boundaries.
    let mut edited = turn1[..170].to_vec();
    edited.extend(stream(4, 40));
    let found = store.stored_prefix(&edited[..edited.len() - 1], None, Some(&tail_name));
    assert_eq!(found.tokens, 128);
    let mut c = context(&model);
    let e = c.new_sequence();
    assert_eq!(
        store.restore_stored(&mut c, e, &edited, &found).unwrap(),
        128
    );
    let got = c.feed(e, &edited[128..], Logits::Last).unwrap();
    let mut cold = context(&model);
    let (f, _) = converse(&mut cold, &edited[..128], 0);
    let want = cold.feed(f, &edited[128..], Logits::Last).unwrap();
    assert!(got == want, "the resumed edit differs from the cold run");
    // Edited inside the first block: no state fits, nothing is found.
    let mut early = turn1.clone();
    early[5] = (early[5] + 1) % 97;
    assert_eq!(
        store.stored_prefix(&early, None, Some(&tail_name)).tokens,
        0
    );
}

#[test]
fn recurrent_layers_keep_no_rows_in_the_pool() {
    let (_models, model) = build_qwen35(5);
    let layout = engine::KvLayout::for_model(model.hparams());
    // Blocks 0 and 2 are delta-nets, 1 and 3 attend.
    assert_eq!(layout.k_bytes_per_token[0] + layout.v_bytes_per_token[0], 0);
    assert_eq!(layout.k_bytes_per_token[2] + layout.v_bytes_per_token[2], 0);
    assert!(layout.k_bytes_per_token[1] > 0 && layout.v_bytes_per_token[3] > 0);
    let ctx = context(&model);
    assert_eq!(ctx.kv_layout(), &layout);
}
