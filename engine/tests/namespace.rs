//! Prompt-cache namespaces: sequences in different namespaces share no block id, so no page
//! and no stored block; a sequence keeps its namespace through a truncation to nothing, and
//! its cached prompt is found in the store only in its namespace.

mod common;

use std::sync::Arc;

use common::*;
use engine::store::{SessionStore, StoreConfig, CACHED_PREFIX};
use engine::{Context, ContextParams, Logits, Model, Namespace};

fn context(model: &Arc<Model>) -> Context {
    Context::new(
        Arc::clone(model),
        ContextParams {
            n_ctx: 256,
            kv_tokens: 2048,
            n_threads: 1,
            ..ContextParams::default()
        },
    )
    .unwrap()
}

#[test]
fn namespaces_share_no_block_and_each_keeps_its_own() {
    let (dir, model, _) = build(&cfg(Shape::Llama, false), 47);
    let toks = tokens(150);
    let (ns_a, ns_b) = (Namespace::new(&[b"a"]), Namespace::new(&[b"b"]));
    let mut ctx = context(&model);
    let seq_in = |ctx: &mut Context, ns: Option<Namespace>| {
        let seq = ctx.new_sequence();
        ctx.set_namespace(seq, ns).unwrap();
        ctx.feed(seq, &toks, Logits::None).unwrap();
        seq
    };
    let plain = seq_in(&mut ctx, None);
    let a = seq_in(&mut ctx, Some(ns_a));
    let b = seq_in(&mut ctx, Some(ns_b));
    let ids = |ctx: &Context, s| ctx.block_ids(s).unwrap().to_vec();
    let (ids_plain, ids_a, ids_b) = (ids(&ctx, plain), ids(&ctx, a), ids(&ctx, b));
    assert_eq!(ids_a.len(), 2);
    for (x, y) in [(&ids_plain, &ids_a), (&ids_plain, &ids_b), (&ids_a, &ids_b)] {
        assert!(x.iter().all(|id| !y.contains(id)), "a block id shared");
    }

    // The pool finds a namespace's pages only for that namespace.
    let other = Namespace::new(&[b"c"]);
    assert_eq!(ctx.resident_prefix(&toks, Some(ns_a)), 128);
    assert_eq!(ctx.resident_prefix(&toks, None), 128);
    assert_eq!(ctx.resident_prefix(&toks, Some(other)), 0);
    let fresh = ctx.new_sequence();
    ctx.set_namespace(fresh, Some(ns_a)).unwrap();
    assert_eq!(ctx.attach_prefix(fresh, &toks).unwrap(), 128);
    assert_eq!(ids(&ctx, fresh), ids_a);
    assert!(
        ctx.set_namespace(fresh, None).is_err(),
        "not empty any more"
    );

    // Truncated to nothing and fed again, a sequence is still in its namespace.
    ctx.truncate(a, 0).unwrap();
    ctx.feed(a, &toks, Logits::None).unwrap();
    assert_eq!(ids(&ctx, a), ids_a);

    // Stored, its blocks and tail are found in its namespace only.
    let store =
        SessionStore::open(&dir.path().join("cache"), &model, StoreConfig::default()).unwrap();
    store
        .put_blocks(store.copy_blocks(&ctx, a, 0).unwrap())
        .unwrap();
    // The tail: a prefix checkpoint named after the last full block, as a prompt cache names it.
    let tail = |last: &engine::BlockId| format!("{CACHED_PREFIX}{}", last.to_hex());
    let full = toks.len() / engine::PAGE_TOKENS;
    store
        .save_prefix(
            &tail(&ctx.block_ids(a).unwrap()[full - 1]),
            store.copy_prefix(&ctx, a, toks.len()).unwrap().unwrap(),
        )
        .unwrap();
    let found = |ns| store.stored_prefix(&toks, ns, Some(&tail)).tokens;
    assert_eq!(found(Some(ns_a)), toks.len());
    assert_eq!(found(None), 0);
    assert_eq!(found(Some(ns_b)), 0);

    // Restored into a new context, it is a sequence of that namespace again.
    let mut ctx2 = context(&model);
    let back = ctx2.new_sequence();
    let layout = ctx2.kv_layout().clone();
    let loaded = store
        .load_prefix(&layout, &toks, 0, Some(ns_a), Some(&tail))
        .unwrap();
    assert_eq!(
        store
            .import_loaded(&mut ctx2, back, &toks, &loaded)
            .unwrap(),
        toks.len()
    );
    assert_eq!(ctx2.namespace(back).unwrap(), Some(ns_a));
    assert_eq!(ids(&ctx2, back), ids_a);
}
