//! Batch-invariant evaluation (`ContextParams::batch_invariant`) makes the cache invisible in
//! the logits: on the real model, 20 prompts evaluated cold (in one batch each), again from
//! the pages left in memory, from blocks stored on disk into a new context, and 8 at a time in
//! shared batches give the same logits, bit for bit, for the prompt's last token and every
//! greedy token after it.

mod common;

use std::sync::Arc;

use engine::store::{SessionStore, StoreConfig};
use engine::{Batch, Context, ContextParams, Logits, Model, SeqId};

const GEN: usize = 6;

fn context(model: &Arc<Model>, n_batch: usize) -> Context {
    let params = ContextParams {
        n_ctx: 1024,
        kv_tokens: 8 * 1024,
        n_threads: 2,
        n_batch,
        batch_invariant: true,
        ..ContextParams::default()
    };
    Context::new(Arc::clone(model), params).unwrap()
}

fn argmax(l: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in l.iter().enumerate() {
        if x > l[best] {
            best = i;
        }
    }
    best as u32
}

/// Greedy tokens after `seq`'s prompt whose last token's logits are `first`: every step's
/// logits, the first included.
fn generate(ctx: &mut Context, seq: SeqId, first: Vec<f32>) -> Vec<Vec<f32>> {
    let mut all = vec![first];
    for _ in 1..GEN {
        let t = argmax(all.last().unwrap());
        all.push(ctx.feed(seq, &[t], Logits::Last).unwrap());
    }
    all
}

fn prompts(model: &Model) -> Vec<Vec<u32>> {
    let words = [
        "river", "stone", "lamp", "orbit", "maple", "quiet", "harbor", "copper",
    ];
    (0..20)
        .map(|i| {
            let n = 12 + i * 9;
            let text: Vec<&str> = (0..n)
                .map(|k| words[(k * 7 + i * 3) % words.len()])
                .collect();
            model
                .tokenizer()
                .encode(&format!("Story {i}: {}", text.join(" ")), false, true)
                .unwrap()
        })
        .collect()
}

#[test]
fn cold_resident_stored_and_batched_logits_are_the_same_bits() {
    let Some(path) = common::real_model_path() else {
        return;
    };
    let model = Model::load(&path).unwrap();
    let prompts = prompts(&model);
    assert!(
        prompts.iter().any(|p| p.len() > 128),
        "some prompts span pages"
    );
    let dir = tempfile::tempdir().unwrap();
    let store = SessionStore::open(dir.path(), &model, StoreConfig::default()).unwrap();

    // Cold, in micro-batches of 48 tokens, one prompt after another in one context; the
    // blocks go to the store.
    let mut ctx = context(&model, 512);
    let mut cold = Vec::new();
    let mut seqs = Vec::new();
    for p in &prompts {
        let seq = ctx.new_sequence();
        let first = ctx.feed(seq, p, Logits::Last).unwrap();
        let blocks = store.prompt_cache().new_blocks(&ctx, seq, 0).unwrap();
        store.prompt_cache().put_blocks(blocks).unwrap();
        cold.push(generate(&mut ctx, seq, first));
        seqs.push(seq);
    }
    store.flush().unwrap();

    // From memory: the finished sequence cut back to the prompt minus its last token, which
    // is evaluated again (what the server does with a repeated prompt).
    for (i, p) in prompts.iter().enumerate() {
        ctx.truncate(seqs[i], p.len() - 1).unwrap();
        let first = ctx.feed(seqs[i], &p[p.len() - 1..], Logits::Last).unwrap();
        let got = generate(&mut ctx, seqs[i], first);
        assert!(
            got == cold[i],
            "prompt {i}: resident logits differ from cold"
        );
    }

    // From disk, into a new context (a restarted server): the stored blocks, then the rest.
    let mut fresh = context(&model, 512);
    for (i, p) in prompts.iter().enumerate() {
        let seq = fresh.new_sequence();
        let n = store.restore_prefix_seq(&mut fresh, seq, p).unwrap();
        assert_eq!(
            n,
            (p.len() - 1) / 64 * 64,
            "prompt {i}: whole blocks restored"
        );
        let first = fresh.feed(seq, &p[n..], Logits::Last).unwrap();
        let got = generate(&mut fresh, seq, first);
        assert!(
            got == cold[i],
            "prompt {i}: restored logits differ from cold"
        );
    }

    // Eight at a time: each step one batch with a 40-token chunk of every prompt still being
    // read and one token of every prompt generating.
    let mut batched = context(&model, 512);
    for group in (0..prompts.len()).collect::<Vec<_>>().chunks(8) {
        let seqs: Vec<SeqId> = group.iter().map(|_| batched.new_sequence()).collect();
        let mut fed = vec![0usize; group.len()];
        let mut out: Vec<Vec<Vec<f32>>> = vec![Vec::new(); group.len()];
        while out.iter().any(|o| o.len() < GEN) {
            let mut batch = Batch::new();
            let mut items = Vec::new();
            for (k, &i) in group.iter().enumerate() {
                let p = &prompts[i];
                if fed[k] < p.len() {
                    let end = (fed[k] + 40).min(p.len());
                    let logits = if end == p.len() {
                        Logits::Last
                    } else {
                        Logits::None
                    };
                    items.push((
                        k,
                        batch.add(seqs[k], &p[fed[k]..end], logits),
                        end == p.len(),
                    ));
                    fed[k] = end;
                } else if out[k].len() < GEN {
                    let t = argmax(out[k].last().unwrap());
                    items.push((k, batch.add(seqs[k], &[t], Logits::Last), true));
                }
            }
            let o = batched.decode(&batch).unwrap();
            for (k, item, wants) in items {
                if wants {
                    out[k].push(o.logits(item).to_vec());
                }
            }
        }
        for (k, &i) in group.iter().enumerate() {
            assert!(
                out[k] == cold[i],
                "prompt {i}: batched logits differ from cold"
            );
        }
    }
}

#[test]
fn pages_out_of_pool_order_give_the_same_bits() {
    let Some(path) = common::real_model_path() else {
        return;
    };
    let model = Arc::new(Model::load(&path).unwrap());
    let prompt = prompts(&model).into_iter().find(|p| p.len() > 100).unwrap();

    // Alone in a fresh context: the sequence's pages ascend in the pool.
    let mut ctx = context(&model, 512);
    let seq = ctx.new_sequence();
    let first = ctx.feed(seq, &prompt, Logits::Last).unwrap();
    let cold = generate(&mut ctx, seq, first);

    // Another sequence takes page 0 first and leaves it once ours holds page 1: our second
    // page is then page 0, before our first in the pool.
    let mut ctx = context(&model, 512);
    let other = ctx.new_sequence();
    ctx.feed(other, &prompt[..64], Logits::None).unwrap();
    let seq = ctx.new_sequence();
    ctx.feed(seq, &prompt[..64], Logits::None).unwrap();
    ctx.remove_sequence(other).unwrap();
    let first = ctx.feed(seq, &prompt[64..], Logits::Last).unwrap();
    let swapped = generate(&mut ctx, seq, first);
    assert!(
        swapped == cold,
        "pages out of pool order changed the logits"
    );
}
