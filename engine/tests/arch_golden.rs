//! Each architecture against llama.cpp on the same file. The test writes tiny models with random
//! weights (the same bytes for the same seed); llama.cpp's reference harness ran each once
//! (`refh golden`) and `fixtures/tiny_arch_golden.jsonl` records what it gave: the prompt's token
//! ids, the ten largest logits after it and 32 greedy tokens. Ours must give the same ids, those
//! logits within 1e-3 and the same greedy tokens.
//!
//! To record them again (after a change to the writer or the weights):
//!
//! ```text
//! LLAMA_HDD_TINY_OUT=DIR cargo test -p engine --test arch_golden -- --ignored
//! for a in llama qwen2 qwen3 gemma3 gemma2 phi3 qwen3moe llama-moe qwen2moe gpt-oss; do
//!   refh golden DIR/$a.gguf DIR/prompts.txt 32 | sed "s/^{/{\"arch\":\"$a\",/"
//! done > engine/tests/fixtures/tiny_arch_golden.jsonl
//! ```
//!
//! Record on a CPU without AMX, or with llama.cpp's extra buffer types off (`use_extra_bufts =
//! false`): on an AMX CPU llama.cpp moves f16 matrices of 32-multiple rows (the dense `ffn_down`
//! here) into its AMX buffer, whose kernels round differently from the plain ones the engine runs
//! (it uses only `CPU_REPACK`); the dense lines then move by up to ~1e-3 and a greedy run can part.

mod common;

use std::path::Path;

use common::gpt_oss;
use common::*;
use engine::gguf::GgmlType;
use engine::{ContextParams, Evaluation, Model, Session};
use serde_json::Value;

/// The seed of every tiny model here.
const SEED: u64 = 2026;

const PROMPTS: &[&str] = &["The_quick~brown|fox", "0123456789", "a"];

fn shape(arch: &str) -> Shape {
    match arch {
        "llama" => Shape::Llama,
        "qwen2" => Shape::Qwen2,
        "qwen3" => Shape::Qwen3,
        "gemma3" => Shape::Gemma3,
        "gemma2" => Shape::Gemma2,
        "phi3" => Shape::Phi3,
        "qwen3moe" => Shape::Qwen3Moe,
        "llama-moe" => Shape::LlamaMoe,
        "qwen2moe" => Shape::Qwen2Moe,
        other => panic!("no tiny model of architecture {other}"),
    }
}

/// The tiny model of `arch`: untied, except gemma2, whose output is always the embeddings.
fn arch_cfg(arch: &str) -> Cfg {
    cfg(shape(arch), arch == "gemma2")
}

/// The tiny model of `arch` (gpt-oss's is its own: `common::gpt_oss`), loaded.
fn tiny(arch: &str) -> (tempfile::TempDir, std::sync::Arc<Model>) {
    match arch {
        "gpt-oss" => {
            let (dir, model, _) = gpt_oss::build(SEED);
            (dir, model)
        }
        _ => {
            let (dir, model, _) = build(&arch_cfg(arch), SEED);
            (dir, model)
        }
    }
}

fn argmax(v: &[f32]) -> u32 {
    v.iter()
        .enumerate()
        .max_by(|a, b| a.1.total_cmp(b.1))
        .map_or(0, |(i, _)| i as u32)
}

#[test]
fn every_architecture_matches_llama_cpp_on_the_same_file() {
    let text = include_str!("fixtures/tiny_arch_golden.jsonl");
    let mut seen = std::collections::BTreeSet::new();
    for line in text.lines() {
        let want: Value = serde_json::from_str(line).unwrap();
        let arch = want["arch"].as_str().unwrap();
        seen.insert(arch.to_owned());
        let (_dir, model) = tiny(arch);
        let prompt = want["prompt"].as_str().unwrap();
        let ids: Vec<u32> = model.tokenizer().encode(prompt, true, false).unwrap();
        let want_ids: Vec<u32> = serde_json::from_value(want["prompt_ids"].clone()).unwrap();
        assert_eq!(ids, want_ids, "{arch} {prompt:?}: token ids");

        let mut s = Session::new(
            model.clone(),
            ContextParams {
                n_ctx: 128,
                n_threads: 2,
                // llama.cpp's kernels where its outputs are compared bit for bit.
                evaluation: Evaluation::Fast,
                ..ContextParams::default()
            },
        )
        .unwrap();
        let logits = s.feed(&ids).unwrap().to_vec();
        for pair in want["top10"].as_array().unwrap() {
            let (id, logit) = (
                pair[0].as_u64().unwrap() as usize,
                pair[1].as_f64().unwrap(),
            );
            let got = f64::from(logits[id]);
            assert!(
                (got - logit).abs() <= 1e-3,
                "{arch} {prompt:?}: logit of {id} is {got}, llama.cpp {logit}"
            );
        }
        let want_greedy: Vec<u32> = serde_json::from_value(want["greedy"].clone()).unwrap();
        let mut greedy = Vec::new();
        let mut next = argmax(&logits);
        for _ in 0..want_greedy.len() {
            greedy.push(next);
            next = argmax(s.feed(&[next]).unwrap());
        }
        assert_eq!(greedy, want_greedy, "{arch} {prompt:?}: greedy tokens");
    }
    assert_eq!(
        seen.into_iter().collect::<Vec<_>>(),
        [
            "gemma2",
            "gemma3",
            "gpt-oss",
            "llama",
            "llama-moe",
            "phi3",
            "qwen2",
            "qwen2moe",
            "qwen3",
            "qwen3moe"
        ],
        "a fixture for every architecture"
    );
}

/// Writes the tiny models and the prompts for `refh golden` (see the module's docs).
#[test]
#[ignore = "records fixtures; run by hand with LLAMA_HDD_TINY_OUT"]
fn write_the_tiny_models_for_llama_cpp() {
    let out = std::env::var("LLAMA_HDD_TINY_OUT").expect("LLAMA_HDD_TINY_OUT");
    let out = Path::new(&out);
    std::fs::create_dir_all(out).unwrap();
    for arch in [
        "llama",
        "qwen2",
        "qwen3",
        "gemma3",
        "gemma2",
        "phi3",
        "qwen3moe",
        "llama-moe",
        "qwen2moe",
    ] {
        let c = arch_cfg(arch);
        let mut w = make_weights(&c, SEED);
        write_model(&c, &mut w, &out.join(format!("{arch}.gguf")));
    }
    gpt_oss::write_model(&gpt_oss::make_weights(SEED), &out.join("gpt-oss.gguf"));
    std::fs::write(out.join("prompts.txt"), PROMPTS.join("\n") + "\n").unwrap();
}

/// qwen2moe's shared-expert gate is `[n_embd]` as llama.cpp declares it, or `[n_embd, 1]` as
/// some converters write it (llama.cpp accepts both): the same logits either way.
#[test]
fn the_shared_expert_gate_may_be_a_column() {
    let c = arch_cfg("qwen2moe");
    let dir = tempfile::tempdir().unwrap();
    let w = make_weights(&c, 7);
    let path = write_edited(&c, dir.path(), "column.gguf", |g| {
        for (l, lw) in w.layers.iter().enumerate() {
            let (name, e) = (
                format!("blk.{l}.ffn_gate_inp_shexp.weight"),
                c.n_embd as u64,
            );
            g.replace_tensor(&name, &[e, 1], GgmlType::F32, f32_bytes(&lw.shexp[0]));
        }
    });
    let column = Model::load(&path).unwrap();
    let (_dir, vector, _) = build(&c, 7);
    let logits = |model: std::sync::Arc<Model>| {
        let mut s = Session::new(model, params(8)).unwrap();
        s.feed(&tokens(12)).unwrap().to_vec()
    };
    assert_eq!(logits(column), logits(vector));
}

/// llama.cpp reads `expert_weights_scale` for none of the mixtures we run (its graphs for
/// llama, qwen3moe and qwen2moe scale by nothing): a file that sets it computes what one
/// without it does, as there.
#[test]
fn expert_weights_scale_is_not_read_as_llama_cpp_does_not() {
    for arch in ["qwen3moe", "llama-moe", "qwen2moe"] {
        let c = arch_cfg(arch);
        let dir = tempfile::tempdir().unwrap();
        let key = format!("{}.expert_weights_scale", c.shape.arch());
        let path = write_edited(&c, dir.path(), "scaled.gguf", |g| {
            g.add_f32(&key, 2.5);
        });
        let scaled = Model::load(&path).unwrap();
        let (_dir, plain, _) = build(&c, 7);
        let logits = |model: std::sync::Arc<Model>| {
            let mut s = Session::new(model, params(8)).unwrap();
            s.feed(&tokens(12)).unwrap().to_vec()
        };
        assert_eq!(logits(scaled), logits(plain), "{arch}");
    }
}
