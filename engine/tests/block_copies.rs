//! A sequence's pages copied for the store a piece at a time
//! ([`SessionStore::copy_block_range`]) are the pages copied in one go, and a piece already
//! stored is not copied again.

mod common;

use std::sync::Arc;

use common::*;
use engine::store::{SessionStore, StoreConfig};
use engine::{Context, ContextParams, Logits, PAGE_TOKENS};

#[test]
fn pieces_make_up_the_whole_copy() {
    let (dir, model, _) = build(&cfg(Shape::Llama, false), 53);
    let mut ctx = Context::new(
        Arc::clone(&model),
        ContextParams {
            n_ctx: 256,
            kv_tokens: 2048,
            n_threads: 1,
            ..ContextParams::default()
        },
    )
    .unwrap();
    let seq = ctx.new_sequence();
    let toks = tokens(3 * PAGE_TOKENS + 10);
    ctx.feed(seq, &toks, Logits::None).unwrap();
    let store =
        SessionStore::open(&dir.path().join("cache"), &model, StoreConfig::default()).unwrap();

    let whole = store.copy_blocks(&ctx, seq, 0).unwrap();
    assert_eq!(whole.len(), 3, "the full pages, not the partly filled one");
    let mut pieces = Vec::new();
    for range in [0..1, 1..2, 2..usize::MAX] {
        pieces.extend(store.copy_block_range(&ctx, seq, range).unwrap());
    }
    let ids = |v: &[engine::store::BlockCopy]| v.iter().map(|b| b.id).collect::<Vec<_>>();
    assert_eq!(ids(&pieces), ids(&whole));
    for (p, w) in pieces.iter().zip(&whole) {
        assert_eq!((&p.kv, &p.tokens, p.prev), (&w.kv, &w.tokens, w.prev));
    }
    assert!(store.copy_block_range(&ctx, seq, 4..9).unwrap().is_empty());

    // The first piece stored: a copy from the start skips it.
    let first: Vec<_> = pieces.drain(..1).collect();
    store.put_blocks(first).unwrap();
    let rest = store.copy_blocks(&ctx, seq, 0).unwrap();
    assert_eq!(ids(&rest), ids(&whole[1..]));
}
