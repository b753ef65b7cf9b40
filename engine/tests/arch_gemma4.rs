//! Gemma 4's text model against llama.cpp on the same file. The test writes a tiny random-weight
//! model exercising every part of the graph (see `common/gemma4.rs`); llama.cpp's reference
//! harness ran once on the same bytes (`refh golden`) and `fixtures/tiny_gemma4_golden.jsonl`
//! records what it gave: the prompt's token ids, the ten largest logits after it and 32 greedy
//! tokens. Ours must give the same ids, those logits within 1e-3 and the same greedy tokens.
//!
//! To record them again (after a change to the writer):
//!
//! ```text
//! LLAMA_HDD_TINY_OUT=DIR cargo test -p engine --test arch_gemma4 -- --ignored
//! refh golden DIR/gemma4.gguf DIR/prompts.txt 32 | sed 's/^{/{"arch":"gemma4",/' \
//!   > engine/tests/fixtures/tiny_gemma4_golden.jsonl
//! ```
//!
//! (On an AMX CPU, with llama.cpp's extra buffer types off: see `arch_golden.rs`.)

mod common;

use std::path::Path;

use common::gemma4::{write, Variant};
use engine::{ContextParams, Error, Evaluation, Model, Session};

const SEED: u64 = 2026;

const PROMPTS: &[&str] = &["The_quick~brown|fox", "0123456789", "a"];

/// Loads the tiny model written with `variant`.
fn load(variant: Variant) -> (tempfile::TempDir, engine::Result<std::sync::Arc<Model>>) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gemma4.gguf");
    write(&path, SEED, variant);
    let model = Model::load(&path);
    (dir, model)
}

#[test]
fn gemma4_matches_llama_cpp_on_the_same_file() {
    let (_dir, model) = load(Variant::default());
    let model = model.unwrap();
    let text = include_str!("fixtures/tiny_gemma4_golden.jsonl");
    let mut n = 0;
    for line in text.lines() {
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

/// The same logits whether the prompt is fed at once or token by token (the shared-KV layers
/// read what the earlier layers stored in earlier batches).
#[test]
fn gemma4_prompt_at_once_equals_token_by_token() {
    let (_dir, model) = load(Variant::default());
    let model = model.unwrap();
    let ids: Vec<u32> = (0..20).map(|i| (i * 37 + 11) % 97).collect();
    let params = ContextParams {
        n_ctx: 64,
        n_threads: 2,
        ..ContextParams::default()
    };
    let mut whole = Session::new(model.clone(), params.clone()).unwrap();
    let a = whole.feed(&ids).unwrap().to_vec();
    let mut steps = Session::new(model, params).unwrap();
    let mut b = Vec::new();
    for &t in &ids {
        b = steps.feed(&[t]).unwrap().to_vec();
    }
    let worst = a
        .iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max);
    assert!(worst < 1e-3, "largest difference {worst}");
}

#[test]
fn gemma4_malformed_files_are_typed_errors() {
    // Fewer than two layers keep their own KV.
    let (_dir, model) = load(Variant {
        shared_kv: Some(4),
        ..Variant::default()
    });
    match model {
        Err(Error::InvalidHParam { key, .. }) => {
            assert_eq!(key, "gemma4.attention.shared_kv_layers")
        }
        other => panic!("expected InvalidHParam, got {other:?}"),
    }
    // Per-layer inputs without their token table.
    let (_dir, model) = load(Variant {
        no_per_layer_table: true,
        ..Variant::default()
    });
    match model {
        Err(Error::MissingTensor { name }) => assert_eq!(name, "per_layer_token_embd.weight"),
        other => panic!("expected MissingTensor, got {other:?}"),
    }
    // A vision tower's tensors are not run: refused, not ignored.
    let (_dir, model) = load(Variant {
        vision_tensor: true,
        ..Variant::default()
    });
    match model {
        Err(Error::BadTensor { name, .. }) => assert_eq!(name, "v.patch_embd.weight"),
        other => panic!("expected BadTensor, got {other:?}"),
    }
}

/// Writes the tiny model and the prompts for `refh golden` (see the module's docs).
#[test]
#[ignore = "records fixtures; run by hand with LLAMA_HDD_TINY_OUT"]
fn write_the_tiny_gemma4_for_llama_cpp() {
    let out = std::env::var("LLAMA_HDD_TINY_OUT").expect("LLAMA_HDD_TINY_OUT");
    let out = Path::new(&out);
    std::fs::create_dir_all(out).unwrap();
    write(&out.join("gemma4.gguf"), SEED, Variant::default());
    std::fs::write(out.join("prompts.txt"), PROMPTS.join("\n") + "\n").unwrap();
}
