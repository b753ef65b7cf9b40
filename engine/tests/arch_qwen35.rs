//! qwen35 (Qwen3.5, a hybrid of gated delta-nets and gated attention) against llama.cpp on the
//! same file, and its per-sequence recurrent state: the same logits whether a prompt comes in
//! one batch or several, alone or batched with other sequences; what cannot be done to a
//! recurrent state (cutting it back, shifting, importing KV alone) is a typed error, and
//! clearing, removing and forking behave.
//!
//! `fixtures/tiny_qwen35_golden.jsonl` holds what llama.cpp's reference harness gave on the
//! test's tiny model (the prompt's token ids, the ten largest logits after it, 32 greedy
//! tokens). To record it again:
//!
//! ```text
//! LLAMA_HDD_TINY_OUT=DIR cargo test -p engine --test arch_qwen35 -- --ignored
//! refh golden DIR/qwen35.gguf DIR/prompts.txt 32 | sed 's/^{/{"arch":"qwen35",/' \
//!   > engine/tests/fixtures/tiny_qwen35_golden.jsonl
//! ```
//!
//! The weights are all f32, so llama.cpp's AMX buffers (f16 and quantized matrices only) do
//! not change its kernels on an AMX CPU.

mod common;

use common::recurrent::{batched_against_alone, logits_in_chunks, max_diff};

use std::path::Path;
use std::sync::Arc;

use common::qwen35::*;
use engine::{Context, ContextParams, Error, Evaluation, Logits, Model, Session};

/// The seed of the tiny model.
const SEED: u64 = 2026;

const PROMPTS: &[&str] = &["The_quick~brown|fox", "0123456789", "a"];

fn context(model: &Arc<Model>, n_batch: usize) -> Context {
    Context::new(
        model.clone(),
        ContextParams {
            n_ctx: 128,
            kv_tokens: 1024,
            n_threads: 2,
            n_batch,
            // The same attention kernel for one query as for many (the fast mode picks
            // kernels that round differently by the number of queries): what differs between
            // the ways a prompt is fed is then the recurrent state alone.
            evaluation: Evaluation::Invariant,
            ..ContextParams::default()
        },
    )
    .unwrap()
}

/// A token stream of its own for each `seed`.
fn stream(seed: usize, n: usize) -> Vec<u32> {
    (0..n)
        .map(|i| ((i * 31 + seed * 17 + 5) % 97) as u32)
        .collect()
}

#[test]
fn qwen35_matches_llama_cpp_on_the_same_file() {
    let text = include_str!("fixtures/tiny_qwen35_golden.jsonl");
    let (_dir, model) = build_qwen35(SEED);
    let mut n = 0;
    for line in text.lines() {
        assert!(line.contains("\"arch\":\"qwen35\""), "a qwen35 line");
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
        common::golden::check_golden_line(&model, &mut s, line);
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
    write_qwen35(&qwen35_cfg(), SEED, &out.join("qwen35.gguf"));
    std::fs::write(out.join("prompts.txt"), PROMPTS.join("\n") + "\n").unwrap();
}

#[test]
fn the_state_carries_over_between_batches() {
    let (_dir, model) = build_qwen35(SEED);
    let tokens = stream(1, 40);
    let whole = logits_in_chunks(&model, &tokens, 40);
    assert_eq!(whole.len(), 40 * 97);
    for chunk in [1, 3, 16] {
        let parts = logits_in_chunks(&model, &tokens, chunk);
        let d = max_diff(&parts, &whole);
        eprintln!("chunks of {chunk}: largest difference {d:.2e}");
        assert!(d <= 1e-4, "chunks of {chunk}: {d}");
    }
    // The state matters: the same last token after another history gives other logits.
    let mut other = stream(2, 39);
    other.push(tokens[39]);
    let elsewhere = logits_in_chunks(&model, &other, 40);
    assert!(max_diff(&elsewhere[39 * 97..], &whole[39 * 97..]) > 1e-2);
}

#[test]
fn batched_sequences_keep_their_own_state() {
    let (_dir, model) = build_qwen35(SEED);
    // Six sequences (more than the first slots, so the state grows) of different lengths,
    // fed in chunks of different sizes in shared batches.
    let plans: Vec<(Vec<u32>, usize)> = (0..6)
        .map(|i| (stream(i + 3, 12 + 5 * i), [1, 4, 7, 2, 9, 5][i]))
        .collect();
    for (i, d) in batched_against_alone(&model, &plans)
        .into_iter()
        .enumerate()
    {
        eprintln!("sequence {i}: largest difference {d:.2e}");
        assert!(d <= 1e-4, "sequence {i}: {d}");
    }
}

#[test]
fn cutting_a_sequence_back_is_a_typed_error_and_clearing_starts_over() {
    let (_dir, model) = build_qwen35(SEED);
    let tokens = stream(4, 20);
    let want = logits_in_chunks(&model, &tokens, 20);
    let mut ctx = context(&model, 64);
    let seq = ctx.new_sequence();
    ctx.feed(seq, &tokens, Logits::Last).unwrap();
    // Cut back: refused, the sequence unchanged and still continuing as before.
    assert!(matches!(
        ctx.truncate(seq, 10),
        Err(Error::Recurrent { .. })
    ));
    assert!(matches!(ctx.fork(seq, 10), Err(Error::Recurrent { .. })));
    assert!(matches!(ctx.shift(seq, 4, 4), Err(Error::Recurrent { .. })));
    assert_eq!(ctx.tokens(seq).unwrap(), &tokens[..]);
    // Truncating to the length held changes nothing.
    ctx.truncate(seq, 20).unwrap();
    // A fork of the whole sequence copies its state: both continue alike.
    let fork = ctx.fork(seq, 20).unwrap();
    let next = [7u32, 8, 9];
    let a = ctx.feed(seq, &next, Logits::Last).unwrap();
    let b = ctx.feed(fork, &next, Logits::Last).unwrap();
    let mut longer = tokens.clone();
    longer.extend_from_slice(&next);
    let want_next = logits_in_chunks(&model, &longer, 23);
    assert!(max_diff(&a, &want_next[22 * 97..]) <= 1e-4);
    assert!(max_diff(&b, &want_next[22 * 97..]) <= 1e-4);
    // Cleared to nothing: the next tokens start from a zero state.
    ctx.truncate(seq, 0).unwrap();
    let again = ctx.feed(seq, &tokens, Logits::All).unwrap();
    assert!(max_diff(&again, &want) <= 1e-4);
    // Removing sequences frees their slots for new ones.
    ctx.remove_sequence(fork).unwrap();
    for _ in 0..8 {
        let s = ctx.new_sequence();
        let got = ctx.feed(s, &tokens, Logits::All).unwrap();
        assert!(max_diff(&got, &want) <= 1e-4);
        ctx.remove_sequence(s).unwrap();
    }
    // A session's truncate says so too.
    let mut s = Session::new(model.clone(), ContextParams::default()).unwrap();
    s.feed(&tokens).unwrap();
    assert!(matches!(s.truncate(5), Err(Error::Recurrent { .. })));
    assert_eq!(s.tokens().len(), 20);
    s.clear();
    assert!(s.tokens().is_empty());
}

#[test]
fn kv_pages_alone_cannot_restore_a_recurrent_sequence() {
    let (_dir, model) = build_qwen35(SEED);
    let mut ctx = context(&model, 64);
    let seq = ctx.new_sequence();
    let tokens = stream(5, 70);
    ctx.feed(seq, &tokens, Logits::Last).unwrap();
    let mut span = Vec::new();
    ctx.read_page(seq, 0, &mut span).unwrap();
    let other = ctx.new_sequence();
    let r = ctx.import(other, &tokens[..64], &[], |_, _, sink| sink(&span));
    assert!(matches!(r, Err(Error::Recurrent { .. })), "{r:?}");
    assert!(ctx.tokens(other).unwrap().is_empty());
    // Nor does a resident prefix attach.
    assert_eq!(ctx.attach_prefix(other, &tokens).unwrap(), 0);
    assert_eq!(ctx.resident_prefix(&tokens, None), 0);
}
