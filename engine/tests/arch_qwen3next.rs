//! qwen35moe (Qwen3.5 MoE) and qwen3next (Qwen3-Next), hybrids of gated delta-nets and gated
//! attention with mixtures of experts and a shared expert, against llama.cpp on the same
//! files; qwen3next's recurrent state per sequence (the same logits whether a prompt comes in
//! one batch or several, alone or batched) and through a checkpoint; qwen3next's older fused
//! input projection (`ssm_in`) against llama.cpp too.
//!
//! `fixtures/tiny_qwen35moe_golden.jsonl`, `fixtures/tiny_qwen3next_golden.jsonl` and
//! `fixtures/tiny_qwen3next_ssm_in_golden.jsonl` (the older fused input projection) hold what
//! llama.cpp's reference harness gave on the test's tiny models (the prompt's token ids, the
//! ten largest logits after it, 32 greedy tokens). To record them again:
//!
//! ```text
//! LLAMA_HDD_TINY_OUT=DIR cargo test -p engine --test arch_qwen3next -- --ignored
//! for a in qwen35moe qwen3next qwen3next_ssm_in; do
//!   refh golden DIR/$a.gguf DIR/prompts.txt 32 | sed "s/^{/{\"arch\":\"${a%_ssm_in}\",/" \
//!     > engine/tests/fixtures/tiny_${a}_golden.jsonl
//! done
//! ```
//!
//! `refh golden` gives the same lines on `DIR/qwen35moe_mtp.gguf` and `DIR/qwen3next_mtp.gguf`
//! (the models with a multi-token prediction block after the others, which llama.cpp's main
//! graph does not run), and on `DIR/*_fused.gguf` (the experts' gate and up projections in
//! one stack, the attention's Q, K and V in one projection, the same weights), so
//! `prediction_heads_are_left_out` and `fused_projections_give_the_same_answers` check them
//! against the same lines.
//!
//! The weights are all f32, so llama.cpp's AMX buffers (f16 and quantized matrices only) do
//! not change its kernels on an AMX CPU.

mod common;

use common::recurrent::{batched_against_alone, logits_in_chunks, max_diff};

use std::path::Path;

use common::qwen3next::*;
use engine::store::{CheckpointMeta, SessionStore, StoreConfig};
use engine::{ContextParams, Error, Evaluation, Model, Session};

/// The seed of the tiny models.
const SEED: u64 = 2026;

const PROMPTS: &[&str] = &["The_quick~brown|fox", "0123456789", "a"];

/// The largest logit difference allowed between two ways of feeding the same tokens.
const TOLERANCE: f32 = 1e-3;

/// Checks the tiny model `cfg` describes against its fixture's lines.
fn check_against_llama_cpp(cfg: &MoeHybridCfg, text: &str) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.gguf");
    write_moe_hybrid(cfg, SEED, &path);
    let model = Model::load(&path).unwrap();
    let arch = cfg.family.arch();
    let mut n = 0;
    for line in text.lines() {
        assert!(
            line.contains(&format!("\"arch\":\"{arch}\"")),
            "a {arch} line"
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

#[test]
fn qwen35moe_matches_llama_cpp_on_the_same_file() {
    let text = include_str!("fixtures/tiny_qwen35moe_golden.jsonl");
    check_against_llama_cpp(&moe_hybrid_cfg(Family::Qwen35Moe), text);
}

#[test]
fn qwen3next_matches_llama_cpp_on_the_same_file() {
    let text = include_str!("fixtures/tiny_qwen3next_golden.jsonl");
    check_against_llama_cpp(&moe_hybrid_cfg(Family::Qwen3Next), text);
}

/// The older layout's `ssm_in` (queries, keys, values and `z` per key head in one projection).
#[test]
fn qwen3next_with_the_older_fused_input_projection_matches_llama_cpp() {
    let text = include_str!("fixtures/tiny_qwen3next_ssm_in_golden.jsonl");
    check_against_llama_cpp(&legacy_cfg(), text);
}

/// The qwen3next model with `ssm_in` in place of `attn_qkv` and `attn_gate`.
fn legacy_cfg() -> MoeHybridCfg {
    let mut cfg = moe_hybrid_cfg(Family::Qwen3Next);
    cfg.legacy_ssm_in = true;
    cfg
}

/// Writes the tiny models and the prompts for `refh golden` (see the module's docs).
#[test]
#[ignore = "records fixtures; run by hand with LLAMA_HDD_TINY_OUT"]
fn write_the_tiny_models_for_llama_cpp() {
    let out = std::env::var("LLAMA_HDD_TINY_OUT").expect("LLAMA_HDD_TINY_OUT");
    let out = Path::new(&out);
    std::fs::create_dir_all(out).unwrap();
    for family in [Family::Qwen35Moe, Family::Qwen3Next] {
        let path = out.join(format!("{}.gguf", family.arch()));
        write_moe_hybrid(&moe_hybrid_cfg(family), SEED, &path);
        let mut cfg = moe_hybrid_cfg(family);
        cfg.nextn_predict_layers = Some(1);
        let path = out.join(format!("{}_mtp.gguf", family.arch()));
        write_moe_hybrid(&cfg, SEED, &path);
        let mut cfg = moe_hybrid_cfg(family);
        (cfg.fused_gate_up, cfg.fused_qkv) = (true, true);
        let path = out.join(format!("{}_fused.gguf", family.arch()));
        write_moe_hybrid(&cfg, SEED, &path);
    }
    write_moe_hybrid(&legacy_cfg(), SEED, &out.join("qwen3next_ssm_in.gguf"));
    std::fs::write(out.join("prompts.txt"), PROMPTS.join("\n") + "\n").unwrap();
}

/// A token stream of its own for each `seed`.
fn stream(seed: usize, n: usize) -> Vec<u32> {
    (0..n)
        .map(|i| ((i * 31 + seed * 17 + 5) % 97) as u32)
        .collect()
}

#[test]
fn qwen3next_state_carries_over_between_batches_and_sequences() {
    let (_dir, model) = build_moe_hybrid(Family::Qwen3Next, SEED);
    let tokens = stream(1, 40);
    let whole = logits_in_chunks(&model, &tokens, 40);
    // f32 products round by how many tokens they hold, and the state carries that over 40
    // tokens: differences stay far below what a lost or misplaced state gives (checked last).
    for chunk in [1, 3, 16] {
        let d = max_diff(&logits_in_chunks(&model, &tokens, chunk), &whole);
        eprintln!("chunks of {chunk}: largest difference {d:.2e}");
        assert!(d <= TOLERANCE, "chunks of {chunk}: {d}");
    }
    // Three sequences of different lengths in shared batches, each chunked its own way.
    let plans: Vec<(Vec<u32>, usize)> = (0..3)
        .map(|i| (stream(i + 3, 12 + 7 * i), [1, 5, 3][i]))
        .collect();
    for (i, d) in batched_against_alone(&model, &plans)
        .into_iter()
        .enumerate()
    {
        eprintln!("sequence {i}: largest difference {d:.2e}");
        assert!(d <= TOLERANCE, "sequence {i}: {d}");
    }
    // The state matters: the same last token after another history gives other logits.
    let mut other = stream(2, 39);
    other.push(tokens[39]);
    let elsewhere = logits_in_chunks(&model, &other, 40);
    let d = max_diff(&elsewhere[39 * 97..], &whole[39 * 97..]);
    assert!(d > 100.0 * TOLERANCE, "another history: {d}");
}

fn argmax(v: &[f32]) -> u32 {
    v.iter()
        .enumerate()
        .max_by(|a, b| a.1.total_cmp(b.1))
        .map_or(0, |(i, _)| i as u32)
}

#[test]
fn a_restored_qwen3next_sequence_continues_bit_for_bit() {
    let (_models, model) = build_moe_hybrid(Family::Qwen3Next, SEED);
    let dir = tempfile::tempdir().unwrap();
    let session = || {
        let params = ContextParams {
            n_ctx: 256,
            kv_tokens: 1024,
            n_threads: 2,
            evaluation: Evaluation::Invariant,
            ..ContextParams::default()
        };
        Session::new(model.clone(), params).unwrap()
    };
    let tokens: Vec<u32> = (0..90).map(|i| ((i * 37 + 11) % 97) as u32).collect();
    let mut a = session();
    let mut logits = a.feed(&tokens).unwrap().to_vec();
    {
        let store = SessionStore::open(dir.path(), &model, StoreConfig::default()).unwrap();
        store.save(&a, "next", &CheckpointMeta::default()).unwrap();
    }
    let store = SessionStore::open(dir.path(), &model, StoreConfig::default()).unwrap();
    let mut b = session();
    store.restore(&mut b, "next").unwrap();
    assert_eq!(b.tokens(), &tokens[..]);
    for step in 0..8 {
        let next = argmax(&logits);
        let want = a.feed(&[next]).unwrap().to_vec();
        let got = b.feed(&[next]).unwrap().to_vec();
        assert!(got == want, "step {step} after the restore differs");
        logits = want;
    }
}

/// With the experts' gate and up projections in one stack (`ffn_gate_up_exps`) and the
/// attention's Q, K and V in one projection (`attn_qkv`), as llama.cpp also reads them, the
/// same answers.
#[test]
fn fused_projections_give_the_same_answers() {
    for (family, text) in [
        (
            Family::Qwen35Moe,
            include_str!("fixtures/tiny_qwen35moe_golden.jsonl"),
        ),
        (
            Family::Qwen3Next,
            include_str!("fixtures/tiny_qwen3next_golden.jsonl"),
        ),
    ] {
        let mut cfg = moe_hybrid_cfg(family);
        (cfg.fused_gate_up, cfg.fused_qkv) = (true, true);
        check_against_llama_cpp(&cfg, text);
    }
}

/// With multi-token prediction blocks after the others (not run, as llama.cpp's main graph
/// does not run them), the same answers as without them.
#[test]
fn prediction_heads_are_left_out() {
    for (family, text) in [
        (
            Family::Qwen35Moe,
            include_str!("fixtures/tiny_qwen35moe_golden.jsonl"),
        ),
        (
            Family::Qwen3Next,
            include_str!("fixtures/tiny_qwen3next_golden.jsonl"),
        ),
    ] {
        let mut cfg = moe_hybrid_cfg(family);
        cfg.nextn_predict_layers = Some(1);
        check_against_llama_cpp(&cfg, text);
    }
}

#[test]
fn what_is_not_run_is_refused_with_typed_errors() {
    let dir = tempfile::tempdir().unwrap();
    let key_of = |cfg: &MoeHybridCfg, name: &str| {
        let path = dir.path().join(format!("{name}.gguf"));
        write_moe_hybrid(cfg, SEED, &path);
        match Model::load(&path) {
            Err(Error::InvalidHParam { key, .. }) => key,
            other => panic!("{name}: expected InvalidHParam, got {:?}", other.err()),
        }
    };
    for family in [Family::Qwen35Moe, Family::Qwen3Next] {
        let arch = family.arch();
        // Prediction heads and nothing else.
        let mut cfg = moe_hybrid_cfg(family);
        cfg.n_layer = 0;
        cfg.nextn_predict_layers = Some(1);
        let key = key_of(&cfg, &format!("{arch}_nextn"));
        assert_eq!(key, format!("{arch}.nextn_predict_layers"));
        // A mixture family without experts.
        let mut cfg = moe_hybrid_cfg(family);
        (cfg.n_expert, cfg.n_used) = (0, 0);
        assert_eq!(
            key_of(&cfg, &format!("{arch}_dense")),
            format!("{arch}.expert_count")
        );
    }
}
