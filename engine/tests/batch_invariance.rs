//! Batch-invariant evaluation, the default ([`Evaluation::Invariant`]), makes the cache
//! invisible in the logits: over 20 prompts, on SmolLM2 and on Gemma 3, five ways of
//! evaluating a prompt give the same bits for its last token's logits and for each of 16 greedy
//! tokens after it:
//! cold, as one item; split into items at random points; from the pages left in memory; from
//! blocks stored on disk, into a new context; and 8 at a time in shared batches, beside the
//! other sequences' prompts and decoding steps. [`Evaluation::LlamaCpp`] (ggml's kernels) is
//! checked the same way on fewer prompts.
//!
//! Needs the real models (`cargo xtask fetch-model`, `cargo xtask fetch-model gemma3`); without
//! them the tests say so and pass, except under CI, where their absence fails them.

mod common;

use std::path::Path;
use std::sync::Arc;

use engine::store::{SessionStore, StoreConfig};
use engine::testing::SplitMix64;
use engine::{Batch, Context, ContextParams, Evaluation, Logits, Model, SeqId};

/// Logits compared per prompt: the last prompt token's, then those after each of 16 greedy
/// tokens.
const GEN: usize = 17;

fn context(model: &Arc<Model>, evaluation: Evaluation) -> Context {
    let params = ContextParams {
        n_ctx: 1024,
        kv_tokens: 10 * 1024,
        n_threads: 2,
        n_batch: 512,
        evaluation,
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

/// `n` prompts of 12 to about 400 words (some span several pages; with Gemma's 512-position
/// window, the longest cross it).
fn prompts(model: &Model, n: usize) -> Vec<Vec<u32>> {
    let words = [
        "river", "stone", "lamp", "orbit", "maple", "quiet", "harbor", "copper",
    ];
    (0..n)
        .map(|i| {
            let n = if i == 7 { 420 } else { 12 + i * 9 };
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

/// How many of `got`'s logit vectors differ from `want`'s in any bit, and the first that does.
fn differing(want: &[Vec<f32>], got: &[Vec<f32>]) -> Option<usize> {
    assert_eq!(want.len(), got.len());
    want.iter().zip(got).position(|(a, b)| {
        a.len() != b.len() || a.iter().zip(b).any(|(x, y)| x.to_bits() != y.to_bits())
    })
}

fn five_ways(path: &Path, evaluation: Evaluation, n_prompts: usize) {
    let model = Model::load(path).unwrap();
    let prompts = prompts(&model, n_prompts);
    assert!(
        prompts.iter().any(|p| p.len() > 128),
        "some prompts span pages"
    );
    let dir = tempfile::tempdir().unwrap();
    let store = SessionStore::open(dir.path(), &model, StoreConfig::default()).unwrap();
    let check = |way: &str, i: usize, got: &[Vec<f32>], want: &[Vec<f32>]| {
        if let Some(step) = differing(want, got) {
            panic!(
                "{evaluation}: prompt {i} ({} tokens) {way}: the logits of step {step} differ \
                 from the cold run's",
                prompts[i].len()
            );
        }
    };

    // 1. Cold, each prompt as one item, one after another in one context; the blocks go to
    // the store.
    let mut ctx = context(&model, evaluation);
    let mut cold = Vec::new();
    let mut seqs = Vec::new();
    for p in &prompts {
        let seq = ctx.new_sequence();
        let first = ctx.feed(seq, p, Logits::Last).unwrap();
        let blocks = store.copy_blocks(&ctx, seq, 0).unwrap();
        store.put_blocks(blocks).unwrap();
        cold.push(generate(&mut ctx, seq, first));
        seqs.push(seq);
    }
    store.flush().unwrap();
    // The greedy tokens are a real continuation, not one repeated token.
    assert!(cold.iter().any(|c| {
        let tokens: Vec<u32> = c.iter().map(|l| argmax(l)).collect();
        tokens.windows(2).any(|w| w[0] != w[1])
    }));

    // 2. Split into items at random points (one to three splits, single tokens included).
    let mut split = context(&model, evaluation);
    let mut rng = SplitMix64(0x5EED ^ prompts.len() as u64);
    for (i, p) in prompts.iter().enumerate() {
        let seq = split.new_sequence();
        let mut cuts: Vec<usize> = (0..1 + rng.next_u64() % 3)
            .map(|_| 1 + (rng.next_u64() as usize) % (p.len() - 1))
            .collect();
        if i % 4 == 0 {
            // The last prompt token alone, as a decoding step.
            cuts.push(p.len() - 1);
        }
        cuts.sort_unstable();
        cuts.dedup();
        let mut at = 0;
        for &c in &cuts {
            split.feed(seq, &p[at..c], Logits::None).unwrap();
            at = c;
        }
        let first = split.feed(seq, &p[at..], Logits::Last).unwrap();
        let got = generate(&mut split, seq, first);
        check(&format!("split at {cuts:?}"), i, &got, &cold[i]);
    }
    drop(split);

    // 3. From memory: the finished sequence cut back to the prompt minus its last token, which
    // is evaluated again (what the server does with a repeated prompt).
    for (i, p) in prompts.iter().enumerate() {
        ctx.truncate(seqs[i], p.len() - 1).unwrap();
        let first = ctx.feed(seqs[i], &p[p.len() - 1..], Logits::Last).unwrap();
        let got = generate(&mut ctx, seqs[i], first);
        check("from memory", i, &got, &cold[i]);
    }
    drop(ctx);

    // 4. From disk, into a new context (a restarted server): the stored blocks, then the rest.
    let mut fresh = context(&model, evaluation);
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
        check("restored from disk", i, &got, &cold[i]);
    }
    drop(fresh);

    // 5. Eight at a time: each step one batch with a 40-token chunk of every prompt still being
    // read and one token of every prompt generating.
    let mut batched = context(&model, evaluation);
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
            check("batched with 7 others", i, &out[k], &cold[i]);
        }
    }
}

#[test]
fn smollm2_five_ways_give_the_same_bits_by_default() {
    let Some(path) = common::real_model_path() else {
        return;
    };
    five_ways(&path, Evaluation::default(), 20);
}

#[test]
fn gemma3_five_ways_give_the_same_bits_by_default() {
    let Some(path) = common::gemma3_model_path() else {
        return;
    };
    five_ways(&path, Evaluation::default(), 20);
}

#[test]
fn llama_cpp_evaluation_is_invariant_too() {
    let Some(path) = common::real_model_path() else {
        return;
    };
    five_ways(&path, Evaluation::LlamaCpp, 9);
}

#[test]
fn pages_out_of_pool_order_give_the_same_bits() {
    let Some(path) = common::real_model_path() else {
        return;
    };
    let model = Arc::new(Model::load(&path).unwrap());
    let prompt = prompts(&model, 20)
        .into_iter()
        .find(|p| p.len() > 100)
        .unwrap();
    for evaluation in [Evaluation::Invariant, Evaluation::LlamaCpp] {
        // Alone in a fresh context: the sequence's pages ascend in the pool.
        let mut ctx = context(&model, evaluation);
        let seq = ctx.new_sequence();
        let first = ctx.feed(seq, &prompt, Logits::Last).unwrap();
        let cold = generate(&mut ctx, seq, first);

        // Another sequence takes page 0 first and leaves it once ours holds page 1: our second
        // page is then page 0, before our first in the pool.
        let mut ctx = context(&model, evaluation);
        let other = ctx.new_sequence();
        ctx.feed(other, &prompt[..64], Logits::None).unwrap();
        let seq = ctx.new_sequence();
        ctx.feed(seq, &prompt[..64], Logits::None).unwrap();
        ctx.remove_sequence(other).unwrap();
        let first = ctx.feed(seq, &prompt[64..], Logits::Last).unwrap();
        let swapped = generate(&mut ctx, seq, first);
        assert!(
            differing(&cold, &swapped).is_none(),
            "{evaluation}: pages out of pool order changed the logits"
        );
    }
}
