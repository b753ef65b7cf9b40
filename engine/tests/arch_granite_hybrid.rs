//! granitehybrid (IBM's Granite 4.0 hybrids: Mamba-2 and attention blocks, each followed by a
//! SwiGLU network, with Granite's multipliers) against llama.cpp on the same file, and its
//! per-sequence Mamba-2 state: the same logits whether a prompt comes in one batch or several;
//! malformed hyperparameters are typed errors at load. (A checkpointed granitehybrid sequence
//! restored and continued bit for bit: `tests/hybrid_checkpoint.rs`.)
//!
//! `fixtures/tiny_granite_hybrid_golden.jsonl` holds what llama.cpp's reference harness gave
//! on the test's tiny model (the prompt's token ids, the ten largest logits after it, 32
//! greedy tokens). To record it again:
//!
//! ```text
//! LLAMA_HDD_TINY_OUT=DIR cargo test -p engine --test arch_granite_hybrid -- --ignored
//! refh golden DIR/granitehybrid.gguf DIR/prompts.txt 32 \
//!   | sed 's/^{/{"arch":"granitehybrid",/' > engine/tests/fixtures/tiny_granite_hybrid_golden.jsonl
//! refh golden DIR/granitehybrid_moe.gguf DIR/prompts.txt 32 \
//!   | sed 's/^{/{"arch":"granitehybrid",/' \
//!   > engine/tests/fixtures/tiny_granite_hybrid_moe_golden.jsonl
//! ```
//!
//! `fixtures/tiny_granite_hybrid_moe_golden.jsonl` holds the same for the variant with
//! mixtures of experts (softmax routing, 2 of 4 experts, an ungated shared expert).
//!
//! The weights are all f32, so llama.cpp's AMX buffers (f16 and quantized matrices only) do
//! not change its kernels on an AMX CPU.

mod common;

use common::recurrent::{logits_in_chunks, max_diff};

use std::path::Path;
use std::sync::Arc;

use common::granite_hybrid::*;
use common::nemotron_h::NemotronHCfg;
use engine::{ContextParams, Error, Evaluation, Model, Session};

/// The seed of the tiny model.
const SEED: u64 = 2029;

const PROMPTS: &[&str] = &["The_quick~brown|fox", "0123456789", "a"];

#[test]
fn granite_hybrid_matches_llama_cpp_on_the_same_file() {
    let text = include_str!("fixtures/tiny_granite_hybrid_golden.jsonl");
    let (_dir, model) = build_granite_hybrid(SEED, None);
    let hp = model.hparams();
    assert!(hp.is_recurrent(0) && !hp.is_recurrent(1) && hp.is_recurrent(3));
    let g = hp.granite.as_ref().unwrap();
    assert_eq!(
        [
            hp.embd_scale,
            g.residual_scale,
            Some(hp.attn_scale),
            g.logit_scale
        ],
        SCALES.map(Some)
    );
    assert!(g.rope);
    check_golden(&model, text);
}

#[test]
fn granite_hybrid_moe_matches_llama_cpp_on_the_same_file() {
    let text = include_str!("fixtures/tiny_granite_hybrid_moe_golden.jsonl");
    let (_dir, model) = build_granite_hybrid(SEED, Some(&GRANITE_MOE));
    let x = model.hparams().experts.as_ref().unwrap();
    assert!(x.norm_weights && !x.sigmoid && x.n_ff_shared == Some(GRANITE_MOE.n_ff_shared));
    check_golden(&model, text);
}

/// Checks `model` against every line of `text`, a `refh golden` fixture.
fn check_golden(model: &Arc<Model>, text: &str) {
    let mut n = 0;
    for line in text.lines() {
        assert!(
            line.contains("\"arch\":\"granitehybrid\""),
            "a granitehybrid line"
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
    let c = granite_hybrid_cfg();
    write_granite_hybrid(&c, None, SEED, &out.join("granitehybrid.gguf"));
    let moe = out.join("granitehybrid_moe.gguf");
    write_granite_hybrid(&c, Some(&GRANITE_MOE), SEED, &moe);
    std::fs::write(out.join("prompts.txt"), PROMPTS.join("\n") + "\n").unwrap();
}

#[test]
fn the_mamba2_state_carries_over_between_batches() {
    let (_dir, model) = build_granite_hybrid(SEED, None);
    let tokens: Vec<u32> = (0..40).map(|i| ((i * 29 + 16) % 97) as u32).collect();
    let whole = logits_in_chunks(&model, &tokens, 40);
    for chunk in [1, 3, 16] {
        let d = max_diff(&logits_in_chunks(&model, &tokens, chunk), &whole);
        eprintln!("chunks of {chunk}: largest difference {d:.2e}");
        // ggml's f32 products round differently for one column than for several.
        assert!(d <= 5e-4, "chunks of {chunk}: {d}");
    }
}

#[test]
fn malformed_hyperparameters_are_typed_errors() {
    let dir = tempfile::tempdir().unwrap();
    let load = |c: &NemotronHCfg| {
        let path = dir.path().join("bad.gguf");
        write_granite_hybrid(c, None, SEED, &path);
        Model::load(&path)
    };
    // An inner width other than twice the embedding width.
    let c = NemotronHCfg {
        d_inner: 48,
        n_ssm_head: 6,
        ..granite_hybrid_cfg()
    };
    match load(&c).unwrap_err() {
        Error::InvalidHParam { key, .. } => assert_eq!(key, "granitehybrid.ssm.inner_size"),
        other => panic!("not an InvalidHParam: {other:?}"),
    }
    // The same sizes load.
    load(&granite_hybrid_cfg()).unwrap();
}
