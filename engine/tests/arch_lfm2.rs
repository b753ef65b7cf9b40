//! lfm2 (Liquid's LFM2, a hybrid of gated short convolutions and grouped-query attention)
//! against llama.cpp on the same file, and its per-sequence convolution state: the same logits
//! whether a prompt comes in one batch or several, alone or batched with other sequences;
//! cutting a sequence back is a typed error; malformed hyperparameters are typed errors at
//! load. (A checkpointed lfm2 sequence restored and continued bit for bit:
//! `tests/hybrid_checkpoint.rs`.)
//!
//! `fixtures/tiny_lfm2_golden.jsonl` holds what llama.cpp's reference harness gave on the
//! test's tiny model (the prompt's token ids, the ten largest logits after it, 32 greedy
//! tokens). To record it again:
//!
//! ```text
//! LLAMA_HDD_TINY_OUT=DIR cargo test -p engine --test arch_lfm2 -- --ignored
//! refh golden DIR/lfm2.gguf DIR/prompts.txt 32 | sed 's/^{/{"arch":"lfm2",/' \
//!   > engine/tests/fixtures/tiny_lfm2_golden.jsonl
//! refh golden DIR/lfm2moe.gguf DIR/prompts.txt 32 | sed 's/^{/{"arch":"lfm2moe",/' \
//!   > engine/tests/fixtures/tiny_lfm2moe_golden.jsonl
//! ```
//!
//! `fixtures/tiny_lfm2moe_golden.jsonl` holds the same for the lfm2moe variant (sigmoid
//! routing with a bias on the choice, a dense first block).
//!
//! The weights are all f32, so llama.cpp's AMX buffers (f16 and quantized matrices only) do
//! not change its kernels on an AMX CPU.

mod common;

use common::recurrent::{batched_against_alone, logits_in_chunks, max_diff};

use std::path::Path;
use std::sync::Arc;

use common::lfm2::*;
use engine::{Context, ContextParams, Error, Evaluation, Logits, Model, Session};

/// The seed of the tiny model.
const SEED: u64 = 2027;

const PROMPTS: &[&str] = &["The_quick~brown|fox", "0123456789", "a"];

fn context(model: &Arc<Model>) -> Context {
    Context::new(
        model.clone(),
        ContextParams {
            n_ctx: 128,
            kv_tokens: 1024,
            n_threads: 2,
            n_batch: 64,
            // The same attention kernel for one query as for many: what differs between the
            // ways a prompt is fed is then the convolution state alone.
            evaluation: Evaluation::Invariant,
            ..ContextParams::default()
        },
    )
    .unwrap()
}

/// A token stream of its own for each `seed`.
fn stream(seed: usize, n: usize) -> Vec<u32> {
    (0..n)
        .map(|i| ((i * 29 + seed * 13 + 3) % 97) as u32)
        .collect()
}

/// How far logits computed in other batches may be apart: ggml's f32 products round
/// differently for one column than for several (a state carried wrongly moves them by 1e-2
/// and more, as `the_convolution_state_carries_over_between_batches` checks).
const ROUNDING: f32 = 5e-4;

#[test]
fn lfm2_matches_llama_cpp_on_the_same_file() {
    let text = include_str!("fixtures/tiny_lfm2_golden.jsonl");
    let (_dir, model) = build_lfm2(SEED);
    assert!(model.hparams().is_recurrent(0) && !model.hparams().is_recurrent(2));
    check_golden(&model, text, "lfm2");
}

#[test]
fn lfm2moe_matches_llama_cpp_on_the_same_file() {
    let text = include_str!("fixtures/tiny_lfm2moe_golden.jsonl");
    let (_dir, model) = build_lfm2_of(&lfm2moe_cfg(), SEED);
    let x = model.hparams().experts.as_ref().unwrap();
    assert!(x.sigmoid && x.n_dense_lead == 1);
    check_golden(&model, text, "lfm2moe");
    // Its state carries over between batches as lfm2's.
    let tokens = stream(6, 24);
    let whole = logits_in_chunks(&model, &tokens, 24);
    let parts = logits_in_chunks(&model, &tokens, 5);
    assert!(max_diff(&parts, &whole) <= ROUNDING);
}

/// Checks `model` against every line of `text`, a `refh golden` fixture of `arch`.
fn check_golden(model: &Arc<Model>, text: &str, arch: &str) {
    let mut n = 0;
    for line in text.lines() {
        assert!(
            line.contains(&format!("\"arch\":\"{arch}\"")),
            "an {arch} line"
        );
        let mut s = Session::new(
            model.clone(),
            ContextParams {
                n_ctx: 128,
                n_threads: 2,
                evaluation: Evaluation::Fast,
                ..ContextParams::default()
            },
        )
        .unwrap();
        common::golden::check_golden_line(model, &mut s, line);
        n += 1;
    }
    assert_eq!(n, PROMPTS.len(), "a fixture line per prompt");
}

/// Writes the tiny model and the prompts for `refh golden` (see the module's docs).
#[test]
#[ignore = "records fixtures; run by hand with LLAMA_HDD_TINY_OUT"]
fn write_the_tiny_model_for_llama_cpp() {
    let out = std::env::var("LLAMA_HDD_TINY_OUT").expect("LLAMA_HDD_TINY_OUT");
    let out = Path::new(&out);
    std::fs::create_dir_all(out).unwrap();
    write_lfm2(&lfm2_cfg(), SEED, &out.join("lfm2.gguf"));
    write_lfm2(&lfm2moe_cfg(), SEED, &out.join("lfm2moe.gguf"));
    std::fs::write(out.join("prompts.txt"), PROMPTS.join("\n") + "\n").unwrap();
}

#[test]
fn the_convolution_state_carries_over_between_batches() {
    let (_dir, model) = build_lfm2(SEED);
    let tokens = stream(1, 40);
    let whole = logits_in_chunks(&model, &tokens, 40);
    assert_eq!(whole.len(), 40 * 97);
    for chunk in [1, 2, 5, 16] {
        let parts = logits_in_chunks(&model, &tokens, chunk);
        let d = max_diff(&parts, &whole);
        eprintln!("chunks of {chunk}: largest difference {d:.2e}");
        assert!(d <= ROUNDING, "chunks of {chunk}: {d}");
    }
    // The state matters: the same last two tokens after another history give other logits
    // (the convolution reaches back two tokens, the attention layer further).
    let mut other = stream(2, 38);
    other.extend_from_slice(&tokens[38..]);
    let elsewhere = logits_in_chunks(&model, &other, 40);
    assert!(max_diff(&elsewhere[39 * 97..], &whole[39 * 97..]) > 1e-2);
}

#[test]
fn batched_sequences_keep_their_own_state() {
    let (_dir, model) = build_lfm2(SEED);
    // Six sequences (more than the first slots, so the state grows) of different lengths,
    // fed in chunks of different sizes in shared batches.
    let plans: Vec<(Vec<u32>, usize)> = (0..6)
        .map(|i| (stream(i + 3, 11 + 6 * i), [1, 4, 7, 2, 9, 5][i]))
        .collect();
    for (i, d) in batched_against_alone(&model, &plans)
        .into_iter()
        .enumerate()
    {
        eprintln!("sequence {i}: largest difference {d:.2e}");
        assert!(d <= ROUNDING, "sequence {i}: {d}");
    }
}

#[test]
fn cutting_back_is_a_typed_error_and_a_whole_fork_continues_alike() {
    let (_dir, model) = build_lfm2(SEED);
    let tokens = stream(4, 20);
    let mut ctx = context(&model);
    let seq = ctx.new_sequence();
    ctx.feed(seq, &tokens, Logits::Last).unwrap();
    assert!(matches!(
        ctx.truncate(seq, 10),
        Err(Error::Recurrent { .. })
    ));
    assert!(matches!(ctx.fork(seq, 10), Err(Error::Recurrent { .. })));
    assert_eq!(ctx.tokens(seq).unwrap(), &tokens[..]);
    let fork = ctx.fork(seq, 20).unwrap();
    let next = [7u32, 8, 9];
    let a = ctx.feed(seq, &next, Logits::Last).unwrap();
    let b = ctx.feed(fork, &next, Logits::Last).unwrap();
    let mut longer = tokens.clone();
    longer.extend_from_slice(&next);
    let want = logits_in_chunks(&model, &longer, 23);
    assert!(max_diff(&a, &want[22 * 97..]) <= ROUNDING);
    assert!(max_diff(&b, &want[22 * 97..]) <= ROUNDING);
}

/// The error of loading the tiny model written with convolution width `l_cache` and per-layer
/// KV head counts `kv` (its tensors those of the usual layers).
fn load_error(dir: &Path, l_cache: usize, kv: &[i32]) -> Error {
    let cfg = Lfm2Cfg {
        l_cache,
        ..lfm2_cfg()
    };
    let path = dir.join("bad.gguf");
    write_lfm2_with_kv(&cfg, SEED, &path, kv);
    Model::load(&path).unwrap_err()
}

#[test]
fn malformed_hyperparameters_are_typed_errors() {
    let dir = tempfile::tempdir().unwrap();
    let key_of = |e: Error| match e {
        Error::InvalidHParam { key, .. } => key,
        other => panic!("not an InvalidHParam: {other:?}"),
    };
    let kv = [0, 0, 2, 0];
    // A convolution of width 1 keeps no state.
    let e = load_error(dir.path(), 1, &kv);
    assert_eq!(key_of(e), "lfm2.shortconv.l_cache");
    // The same sizes load.
    let cfg = lfm2_cfg();
    Model::load({
        let path = dir.path().join("good.gguf");
        write_lfm2_with_kv(&cfg, SEED, &path, &kv);
        path
    })
    .unwrap();
    // Attention layers of different KV head counts.
    let e = load_error(dir.path(), 3, &[0, 1, 2, 0]);
    assert_eq!(key_of(e), "lfm2.attention.head_count_kv");
    // No attention layer at all.
    let e = load_error(dir.path(), 3, &[0; 4]);
    assert_eq!(key_of(e), "lfm2.attention.head_count_kv");
    // A count per layer for another number of layers.
    let e = load_error(dir.path(), 3, &[0, 2]);
    assert_eq!(key_of(e), "lfm2.attention.head_count_kv");
}
