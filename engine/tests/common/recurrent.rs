//! Checks the hybrid families' tests share: a prompt fed in chunks against one batch, and
//! sequences fed together in shared batches against each alone, over the per-sequence
//! recurrent state.

use std::sync::Arc;

use engine::{Batch, Context, ContextParams, Evaluation, Logits, Model, SeqId};

/// A context for the checks: the same attention kernel for one query as for many (the fast
/// mode picks kernels that round differently by the number of queries), so what differs
/// between the ways a prompt is fed is the recurrent state (and ggml's f32 products) alone.
pub fn recurrent_context(model: &Arc<Model>) -> Context {
    Context::new(
        model.clone(),
        ContextParams {
            n_ctx: 128,
            kv_tokens: 1024,
            n_threads: 2,
            n_batch: 64,
            evaluation: Evaluation::Invariant,
            ..ContextParams::default()
        },
    )
    .unwrap()
}

/// The largest absolute difference between `a` and `b`.
pub fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Every position's logits of `tokens` fed to a fresh sequence in chunks of `chunk`.
pub fn logits_in_chunks(model: &Arc<Model>, tokens: &[u32], chunk: usize) -> Vec<f32> {
    let mut ctx = recurrent_context(model);
    let seq = ctx.new_sequence();
    let mut all = Vec::new();
    for part in tokens.chunks(chunk) {
        let mut batch = Batch::new();
        batch.add(seq, part, Logits::All);
        all.extend_from_slice(ctx.decode(&batch).unwrap().logits(0));
    }
    all
}

/// Feeds each plan's tokens (`(tokens, chunk)`) in chunks of its own size, the sequences
/// sharing batches, and returns per sequence the largest difference of every position's
/// logits from the same tokens fed alone in one batch.
pub fn batched_against_alone(model: &Arc<Model>, plans: &[(Vec<u32>, usize)]) -> Vec<f32> {
    let mut ctx = recurrent_context(model);
    let seqs: Vec<SeqId> = plans.iter().map(|_| ctx.new_sequence()).collect();
    let mut got = vec![Vec::new(); plans.len()];
    let mut done = vec![0; plans.len()];
    while done.iter().zip(plans).any(|(d, (t, _))| *d < t.len()) {
        let mut batch = Batch::new();
        let mut items = Vec::new();
        for (i, (toks, chunk)) in plans.iter().enumerate() {
            if done[i] < toks.len() {
                let end = (done[i] + chunk).min(toks.len());
                items.push((i, batch.add(seqs[i], &toks[done[i]..end], Logits::All)));
                done[i] = end;
            }
        }
        let out = ctx.decode(&batch).unwrap();
        for (i, item) in items {
            got[i].extend_from_slice(out.logits(item));
        }
    }
    plans
        .iter()
        .zip(&got)
        .map(|((toks, _), g)| max_diff(g, &logits_in_chunks(model, toks, toks.len())))
        .collect()
}
