//! nemotron_h (NVIDIA's Nemotron-H, a hybrid of Mamba-2, attention and ReLU² feed-forward
//! blocks) against llama.cpp on the same file, and its per-sequence Mamba-2 state: the same
//! logits whether a prompt comes in one batch or several, alone or batched with other
//! sequences; cutting a sequence back is a typed error; malformed hyperparameters are typed
//! errors at load. (A checkpointed nemotron_h sequence restored and continued bit for bit:
//! `tests/hybrid_checkpoint.rs`.)
//!
//! `fixtures/tiny_nemotron_h_golden.jsonl` holds what llama.cpp's reference harness gave on
//! the test's tiny model (the prompt's token ids, the ten largest logits after it, 32 greedy
//! tokens). To record it again:
//!
//! ```text
//! LLAMA_HDD_TINY_OUT=DIR cargo test -p engine --test arch_nemotron_h -- --ignored
//! refh golden DIR/nemotron_h.gguf DIR/prompts.txt 32 | sed 's/^{/{"arch":"nemotron_h",/' \
//!   > engine/tests/fixtures/tiny_nemotron_h_golden.jsonl
//! ```
//!
//! The weights are all f32, so llama.cpp's AMX buffers (f16 and quantized matrices only) do
//! not change its kernels on an AMX CPU.

mod common;

use common::recurrent::{batched_against_alone, logits_in_chunks, max_diff};

use std::path::Path;
use std::sync::Arc;

use common::nemotron_h::*;
use engine::{Context, ContextParams, Error, Evaluation, Logits, MixerKind, Model, Session};

/// The seed of the tiny model.
const SEED: u64 = 2028;

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
            // ways a prompt is fed is then the recurrent state alone.
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
/// and more, as `the_mamba2_state_carries_over_between_batches` checks).
const ROUNDING: f32 = 5e-4;

#[test]
fn nemotron_h_matches_llama_cpp_on_the_same_file() {
    let text = include_str!("fixtures/tiny_nemotron_h_golden.jsonl");
    let (_dir, model) = build_nemotron_h(SEED);
    let hp = model.hparams();
    let kinds = &hp.mamba2.as_ref().unwrap().kinds;
    assert_eq!(kinds[0], MixerKind::Mamba2);
    assert_eq!(kinds[1], MixerKind::Mlp);
    assert_eq!(kinds[2], MixerKind::Attention);
    assert!(hp.is_recurrent(4) && !hp.is_recurrent(2) && !hp.is_recurrent(3));
    // Only the attention layer keeps KV rows.
    assert_eq!(
        (0..5).map(|il| hp.holds_kv(il)).collect::<Vec<_>>(),
        [false, false, true, false, false]
    );
    let mut n = 0;
    for line in text.lines() {
        assert!(
            line.contains("\"arch\":\"nemotron_h\""),
            "a nemotron_h line"
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
    write_nemotron_h(&nemotron_h_cfg(), SEED, &out.join("nemotron_h.gguf"));
    std::fs::write(out.join("prompts.txt"), PROMPTS.join("\n") + "\n").unwrap();
}

#[test]
fn the_mamba2_state_carries_over_between_batches() {
    let (_dir, model) = build_nemotron_h(SEED);
    let tokens = stream(1, 40);
    let whole = logits_in_chunks(&model, &tokens, 40);
    assert_eq!(whole.len(), 40 * 97);
    for chunk in [1, 2, 5, 16] {
        let parts = logits_in_chunks(&model, &tokens, chunk);
        let d = max_diff(&parts, &whole);
        eprintln!("chunks of {chunk}: largest difference {d:.2e}");
        assert!(d <= ROUNDING, "chunks of {chunk}: {d}");
    }
    // The state matters: the same last two tokens after another history give other logits.
    let mut other = stream(2, 38);
    other.extend_from_slice(&tokens[38..]);
    let elsewhere = logits_in_chunks(&model, &other, 40);
    assert!(max_diff(&elsewhere[39 * 97..], &whole[39 * 97..]) > 1e-2);
}

#[test]
fn batched_sequences_keep_their_own_state() {
    let (_dir, model) = build_nemotron_h(SEED);
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
fn cutting_back_is_a_typed_error() {
    let (_dir, model) = build_nemotron_h(SEED);
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
}

/// The key of the error of loading the tiny model `c` written with per-layer `kv` and `ff`.
fn bad_key(dir: &Path, c: &NemotronHCfg, kv: &[i32], ff: &[i32]) -> String {
    let path = dir.join("bad.gguf");
    write_nemotron_h_with(c, SEED, &path, kv, ff);
    match Model::load(&path).unwrap_err() {
        Error::InvalidHParam { key, .. } => key,
        other => panic!("not an InvalidHParam: {other:?}"),
    }
}

#[test]
fn malformed_hyperparameters_are_typed_errors() {
    let dir = tempfile::tempdir().unwrap();
    let c = nemotron_h_cfg();
    let (kv, ff) = per_layer(&c);
    // The same sizes load.
    let path = dir.path().join("good.gguf");
    write_nemotron_h_with(&c, SEED, &path, &kv, &ff);
    Model::load(&path).unwrap();
    // Attention layers of different KV head counts; none at all.
    let key = bad_key(dir.path(), &c, &[0, 0, 2, 1, 0], &[0, 48, 0, 0, 0]);
    assert_eq!(key, "nemotron_h.attention.head_count_kv");
    let key = bad_key(dir.path(), &c, &[0; 5], &ff);
    assert_eq!(key, "nemotron_h.attention.head_count_kv");
    // Feed-forward layers of different widths; a count per layer for another number of layers.
    let key = bad_key(dir.path(), &c, &kv, &[0, 48, 0, 24, 0]);
    assert_eq!(key, "nemotron_h.feed_forward_length");
    let key = bad_key(dir.path(), &c, &kv, &[0, 48]);
    assert_eq!(key, "nemotron_h.feed_forward_length");
    // Heads that do not divide the inner width; groups that do not.
    let odd = NemotronHCfg {
        n_ssm_head: 5,
        ..nemotron_h_cfg()
    };
    assert_eq!(
        bad_key(dir.path(), &odd, &kv, &ff),
        "nemotron_h.ssm.time_step_rank"
    );
    let odd = NemotronHCfg {
        n_group: 5,
        ..nemotron_h_cfg()
    };
    assert_eq!(
        bad_key(dir.path(), &odd, &kv, &ff),
        "nemotron_h.ssm.group_count"
    );
    // A convolution of width 1 keeps no state.
    let odd = NemotronHCfg {
        d_conv: 1,
        ..nemotron_h_cfg()
    };
    assert_eq!(
        bad_key(dir.path(), &odd, &kv, &ff),
        "nemotron_h.ssm.conv_kernel"
    );
}
