//! Rows of sliding-window layers released from memory (`Context::release_windows`), on a tiny
//! Gemma 3 model the test writes (layer 0 windowed to 4 positions, layer 1 global; rows of
//! 256 bytes, so a page of one layer fills whole memory pages): the system takes the memory
//! back, the sequence goes on computing the same bits, nothing released is read, exported or
//! resumed from, and a prefix whose window was released is read again from the store.

mod common;

use std::sync::Arc;

use common::*;
use engine::store::{CheckpointMeta, SessionStore, StoreConfig};
use engine::{Context, ContextParams, Error, Logits, Model, SeqId, PAGE_TOKENS};

fn model() -> (tempfile::TempDir, Arc<Model>) {
    let mut c = cfg(Shape::Gemma3, false);
    c.n_embd = 128;
    c.n_head = 2;
    c.n_head_kv = 2;
    c.n_ctx_train = 1024;
    let (dir, model, _) = build(&c, 41);
    (dir, model)
}

fn ctx_params() -> ContextParams {
    let mut p = params(64);
    p.n_ctx = 1024;
    p.kv_tokens = 4096;
    p
}

fn context(model: &Arc<Model>) -> Context {
    Context::new(model.clone(), ctx_params()).unwrap()
}

/// A sequence of `ctx` holding `tokens`, with the logits after the last.
fn fed(ctx: &mut Context, tokens: &[u32]) -> (SeqId, Vec<f32>) {
    let seq = ctx.new_sequence();
    let logits = ctx.feed(seq, tokens, Logits::Last).unwrap();
    (seq, logits)
}

fn window_released<T: std::fmt::Debug>(r: engine::Result<T>) -> bool {
    matches!(r, Err(Error::WindowReleased { .. }))
}

#[test]
fn released_rows_leave_memory_and_the_sequence_goes_on_with_the_same_bits() {
    let (_dir, model) = model();
    let doc = tokens(700);
    let mut a = context(&model);
    let mut b = context(&model);
    let (sa, _) = fed(&mut a, &doc[..600]);
    let (sb, _) = fed(&mut b, &doc[..600]);

    let before = a.kv_resident_bytes().expect("residency is known here");
    // The window of position 600 starts at 597: pages 0..9 (positions 0..576) are outside.
    let released = a.release_windows(sa).unwrap();
    assert_eq!(released, 9);
    assert_eq!(a.stats().pages_window_released, 9);
    let after = a.kv_resident_bytes().unwrap();
    let layer0 = a.kv_layout().k_bytes_per_token[0] + a.kv_layout().v_bytes_per_token[0];
    let expected = 9 * PAGE_TOKENS * layer0;
    assert!(
        before - after >= expected,
        "resident KV went from {before} to {after} bytes; {expected} expected to leave"
    );
    assert_eq!(a.release_windows(sa).unwrap(), 0, "nothing left to release");

    // Both go on: the same logits, bit for bit, token after token.
    for (i, &t) in doc[600..700].iter().enumerate() {
        let la = a.feed(sa, &[t], Logits::Last).unwrap();
        let lb = b.feed(sb, &[t], Logits::Last).unwrap();
        assert_eq!(la, lb, "logits after token {}", 600 + i);
    }

    // The global layer's rows are all there; the windowed layer's released ones are refused.
    let layout = a.kv_layout().clone();
    let read = |ctx: &Context, seq, layer: usize| {
        let mut k = vec![0u8; 64 * layout.k_bytes_per_token[layer]];
        let mut v = vec![0u8; 64 * layout.v_bytes_per_token[layer]];
        ctx.read_kv(seq, layer, 0..64, &mut k, &mut v)
            .map(|()| (k, v))
    };
    assert_eq!(read(&a, sa, 1).unwrap(), read(&b, sb, 1).unwrap());
    assert!(window_released(read(&a, sa, 0)));
    let mut span = Vec::new();
    assert!(window_released(a.read_page(sa, 0, &mut span)));
    assert!(window_released(a.read_full_pages(
        sa,
        &[3],
        &mut [Vec::new()]
    )));
    // Pages released later than export time are still readable while in the window.
    assert!(a.read_page(sa, 10, &mut span).is_ok());

    // No going on from a length whose window reaches released rows.
    assert!(window_released(a.fork(sa, 100)));
    assert!(window_released(a.truncate(sa, 300)));
    assert_eq!(
        a.tokens(sa).unwrap().len(),
        700,
        "a refused truncation changes nothing"
    );
    assert_eq!(a.resumable_len(sa, 300).unwrap(), 0);
    assert_eq!(a.resumable_len(sa, 699).unwrap(), 699);
    assert!(window_released(a.shift(sa, 4, 100)));
    let f = a.fork(sa, 650).unwrap();
    let lf = a.feed(f, &[5], Logits::Last).unwrap();
    let g = b.fork(sb, 650).unwrap();
    assert_eq!(lf, b.feed(g, &[5], Logits::Last).unwrap());
}

#[test]
fn a_prefix_whose_window_was_released_is_read_again_from_the_store() {
    let (dir, model) = model();
    let doc = tokens(700);
    let store = SessionStore::open(
        &dir.path().join("store"),
        &model,
        StoreConfig::for_context(&ctx_params()),
    )
    .unwrap();

    // Same steps in two contexts; only `a` releases the first sequence's windows.
    let mut a = context(&model);
    let mut b = context(&model);
    let (sa, _) = fed(&mut a, &doc[..600]);
    let (_sb, _) = fed(&mut b, &doc[..600]);
    store
        .save_seq(&a, sa, "first", &CheckpointMeta::default())
        .unwrap();
    store.flush().unwrap();
    assert_eq!(a.resident_prefix(&doc[..600], None), 576);
    a.release_windows(sa).unwrap();
    // The pool holds the blocks, but not a window to go on from.
    assert_eq!(a.resident_prefix(&doc[..600], None), 0);
    let late = a.new_sequence();
    assert_eq!(a.attach_prefix(late, &doc[..600]).unwrap(), 0);

    let restore = |ctx: &mut Context| {
        let seq = ctx.new_sequence();
        let n = store.restore_prefix_seq(ctx, seq, &doc[..650]).unwrap();
        assert_eq!(n, 576);
        let logits = ctx.feed(seq, &doc[576..650], Logits::Last).unwrap();
        (seq, logits)
    };
    let used_before = a.stats().pages_used;
    let (ra, la) = restore(&mut a);
    let (_, lb) = restore(&mut b);
    assert_eq!(la, lb, "the restored sequence computes the same bits");
    // Pages 0..8 are shared though released (outside the new sequence's window); page 8,
    // inside it, was read again, and is the one found from now on.
    assert_eq!(a.stats().pages_used - used_before, 1 + 2);
    assert_eq!(a.resident_prefix(&doc[..600], None), 576);
    assert!(!a.page_released(ra, 8).unwrap());
    assert!(a.page_released(ra, 7).unwrap());
}

#[test]
fn a_model_without_windows_releases_nothing() {
    let (_dir, model, _) = build(&cfg(Shape::Llama, false), 3);
    let mut ctx = context(&model);
    let (seq, _) = fed(&mut ctx, &tokens(200));
    assert_eq!(ctx.release_windows(seq).unwrap(), 0);
    let mut span = Vec::new();
    assert!(ctx.read_page(seq, 0, &mut span).is_ok());
    assert_eq!(ctx.resumable_len(seq, 10).unwrap(), 10);
}
