//! Embeddings (the final norm's output) from the step API, against the naive reference.

mod common;

use common::*;
use engine::{Batch, Context, ContextParams, Logits};

fn context(model: &std::sync::Arc<engine::Model>, n_batch: usize) -> Context {
    Context::new(
        model.clone(),
        ContextParams {
            n_ctx: 128,
            kv_tokens: 512,
            n_threads: 2,
            n_batch,
            flash_attn: true,
            ..ContextParams::default()
        },
    )
    .unwrap()
}

#[test]
fn embed_matches_the_reference_hidden_states() {
    for shape in [Shape::Llama, Shape::Qwen2] {
        let c = cfg(shape, false);
        let (_dir, model, w) = build(&c, 5);
        let toks = tokens(45);
        let want = reference_hidden(&c, &w, &toks);
        // Micro-batches of 16: the rows of every chunk come back, in order.
        let mut ctx = context(&model, 16);
        let seq = ctx.new_sequence();
        let got = ctx.embed(seq, &toks).unwrap();
        assert_eq!(got.len(), toks.len() * c.n_embd);
        for (i, row) in got.chunks(c.n_embd).enumerate() {
            assert_close(row, &want[i], 2e-2, &format!("{shape:?} embedding {i}"));
        }
        // The sequence went on: its KV is the same as a fed one's, so the next token's logits
        // match the reference.
        let more = [7u32];
        let logits = ctx.feed(seq, &more, Logits::Last).unwrap();
        let all: Vec<u32> = toks.iter().chain(&more).copied().collect();
        let want_logits = reference(&c, &w, &all);
        assert_close(&logits, want_logits.last().unwrap(), 2e-2, "logits after");
    }
}

#[test]
fn an_embeddings_batch_returns_no_logits_and_the_rows_asked_for() {
    let c = cfg(Shape::Llama, true);
    let (_dir, model, w) = build(&c, 9);
    let mut ctx = context(&model, 64);
    let (a, b) = (ctx.new_sequence(), ctx.new_sequence());
    let (ta, tb) = (tokens(10), tokens(20)[5..].to_vec());
    let mut batch = Batch::new();
    batch.set_embeddings(true);
    let ia = batch.add(a, &ta, Logits::Last);
    let ib = batch.add(b, &tb, Logits::All);
    let out = ctx.decode(&batch).unwrap();
    assert!(out.logits(ia).is_empty() && out.logits(ib).is_empty());
    assert_eq!(out.embeddings(ia).len(), c.n_embd);
    assert_eq!(out.embeddings(ib).len(), tb.len() * c.n_embd);
    let want_a = reference_hidden(&c, &w, &ta);
    assert_close(
        out.embeddings(ia),
        want_a.last().unwrap(),
        2e-2,
        "last of a",
    );
    let want_b = reference_hidden(&c, &w, &tb);
    for (i, row) in out.embeddings(ib).chunks(c.n_embd).enumerate() {
        assert_close(row, &want_b[i], 2e-2, &format!("b row {i}"));
    }
    // The sequences keep no logits from an embeddings batch.
    assert!(matches!(ctx.logits(a), Err(engine::Error::NoLogits)));

    // A logits batch after it gives logits again, and no embeddings.
    let mut batch = Batch::new();
    let i = batch.add(a, &[3], Logits::Last);
    let out = ctx.decode(&batch).unwrap();
    assert!(out.embeddings(i).is_empty());
    assert_eq!(out.logits(i).len(), c.n_vocab);
}
