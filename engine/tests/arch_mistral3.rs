//! Mistral 3's text model against llama.cpp on the same file. The test writes a tiny
//! random-weight model (see `common/mistral3.rs`: YaRN with the file's own betas and log
//! multiplier, an attention temperature); llama.cpp's reference harness ran once on the same
//! bytes (`refh golden`) and `fixtures/tiny_mistral3_golden.jsonl` records what it gave: the
//! prompt's token ids, the ten largest logits after it and 32 greedy tokens. Ours must give the
//! same ids, those logits within 1e-3 and the same greedy tokens.
//!
//! To record them again (after a change to the writer):
//!
//! ```text
//! LLAMA_HDD_TINY_OUT=DIR cargo test -p engine --test arch_mistral3 -- --ignored
//! refh golden DIR/mistral3.gguf DIR/prompts.txt 32 | sed 's/^{/{"arch":"mistral3",/' \
//!   > engine/tests/fixtures/tiny_mistral3_golden.jsonl
//! ```
//!
//! (On an AMX CPU, with llama.cpp's extra buffer types off: see `arch_golden.rs`.)

mod common;

use std::path::Path;

use common::mistral3::write;
use engine::{ContextParams, Evaluation, Model, Session};

const SEED: u64 = 2026;

/// The attention temperature of the tiny model.
const TEMPERATURE: f32 = 0.5;

const PROMPTS: &[&str] = &["The_quick~brown|fox", "0123456789", "a"];

fn load(temperature: f32) -> (tempfile::TempDir, std::sync::Arc<Model>) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mistral3.gguf");
    write(&path, SEED, temperature);
    let model = Model::load(&path).unwrap();
    (dir, model)
}

fn session(model: std::sync::Arc<Model>) -> Session {
    Session::new(
        model,
        ContextParams {
            n_ctx: 128,
            n_threads: 2,
            evaluation: Evaluation::Fast,
            ..ContextParams::default()
        },
    )
    .unwrap()
}

#[test]
fn mistral3_matches_llama_cpp_on_the_same_file() {
    let (_dir, model) = load(TEMPERATURE);
    let text = include_str!("fixtures/tiny_mistral3_golden.jsonl");
    let mut n = 0;
    for line in text.lines() {
        let mut s = session(model.clone());
        common::golden::check_golden_line(&model, &mut s, line);
        n += 1;
    }
    assert_eq!(n, PROMPTS.len(), "a fixture line per prompt");
}

/// The temperature changes nothing within the first 8 positions (its factor is 1 there) and
/// changes the logits after them.
#[test]
fn mistral3_temperature_bites_only_past_the_original_context() {
    let (_d1, with) = load(TEMPERATURE);
    let (_d2, without) = load(0.0);
    let ids: Vec<u32> = (0..16).map(|i| (i * 37 + 11) % 97).collect();
    let run =
        |model: std::sync::Arc<Model>, n: usize| session(model).feed(&ids[..n]).unwrap().to_vec();
    assert_eq!(run(with.clone(), 8), run(without.clone(), 8));
    assert_ne!(run(with, 16), run(without, 16));
}

/// Writes the tiny model and the prompts for `refh golden` (see the module's docs).
#[test]
#[ignore = "records fixtures; run by hand with LLAMA_HDD_TINY_OUT"]
fn write_the_tiny_mistral3_for_llama_cpp() {
    let out = std::env::var("LLAMA_HDD_TINY_OUT").expect("LLAMA_HDD_TINY_OUT");
    let out = Path::new(&out);
    std::fs::create_dir_all(out).unwrap();
    write(&out.join("mistral3.gguf"), SEED, TEMPERATURE);
    std::fs::write(out.join("prompts.txt"), PROMPTS.join("\n") + "\n").unwrap();
}
