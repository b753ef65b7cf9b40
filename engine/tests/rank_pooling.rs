//! Rank pooling (reranking): `Model::rerank_tokens` and `Context::rank` on tiny random-weight
//! rerankers, against llama.cpp's `llama-server --rerank` on the same files and against the
//! naive forward pass.
//!
//! `fixtures/tiny_rerank.jsonl` holds what llama-server answered: for each tiny model and each
//! (query, document) pair, one `POST /rerank` with that one document, its `relevance_score` and
//! `usage.prompt_tokens`. The models (see [`write`]):
//!
//! - `qwen3-head`: a Qwen3 reranker as llama.cpp's converter writes one: `cls.output.weight`
//!   (two outputs, labels "yes" and "no"), pooling type rank, a `tokenizer.chat_template.rerank`
//!   prompt. The score is the softmax's "yes".
//! - `qwen3-special`: the same without the template: the prompt is `[BOS] query [EOS] [SEP]
//!   document [EOS]`, every special token asked for by the vocabulary's flags.
//! - `llama-plain`: a llama with no head (what llama-server does with `--rerank` on a plain
//!   model): the score is the first float of the last token's final-norm output.
//!
//! To record them again (after a change to the writer or the weights), write the models, run
//! the reference `llama-server -m DIR/NAME.gguf --rerank -c 256` for each and post each pair:
//!
//! ```text
//! LLAMA_HDD_TINY_OUT=DIR cargo test -p engine --test rank_pooling -- --ignored
//! # for each model NAME and each pair of PAIRS:
//! #   POST /rerank {"query": Q, "documents": [D]}
//! #   -> {"model":NAME,"query":Q,"document":D,"score":results[0].relevance_score,
//! #       "n_tokens":usage.prompt_tokens}, one line each
//! ```

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::*;
use engine::gguf::{GgmlType, Gguf, GgufWriter};
use engine::testing::SplitMix64;
use engine::{Context, ContextParams, Model, PoolingType};
use serde_json::Value;

/// The models of the fixture.
const MODELS: &[&str] = &["qwen3-head", "qwen3-special", "llama-plain"];

/// The (query, document) pairs of the fixture: characters of the tiny vocabulary only.
const PAIRS: &[(&str, &str)] = &[
    ("Machine_learning", "A_machine_is_a_system"),
    ("Machine_learning", "Paris_est_une_ville"),
    ("0123", "456789"),
    ("a", "b"),
];

/// A reranker's prompt: characters of the tiny vocabulary only.
const TEMPLATE: &str = "Judge:{query}?Doc:{document}=Answer:";

fn shape_of(name: &str) -> Shape {
    match name {
        "qwen3-head" | "qwen3-special" => Shape::Qwen3,
        "llama-plain" | "llama-cls" => Shape::Llama,
        other => panic!("no tiny reranker {other}"),
    }
}

/// Writes tiny reranker `name` (see the module's docs; `llama-cls` has both head layers, which
/// llama.cpp's llama does not read) to `dir/name.gguf`; returns its path and the weights the
/// model computes with, head included.
fn write(name: &str, dir: &Path) -> (PathBuf, Weights, Head) {
    let c = cfg(shape_of(name), false);
    let base = dir.join(format!("{name}.base.gguf"));
    let mut w = make_weights(&c, 2026);
    write_model(&c, &mut w, &base);
    let mut g = GgufWriter::from_gguf(&Gguf::open(&base).unwrap()).unwrap();
    let arch = c.shape.arch();
    let e = c.n_embd;
    let mut r = SplitMix64(99);
    let mut head = Head::default();
    let mut add = |g: &mut GgufWriter, n: &str, shape: &[usize], scale: f32| {
        let v = r.f32_vec(shape.iter().product(), scale);
        let dims: Vec<u64> = shape.iter().map(|&d| d as u64).collect();
        g.add_tensor(n, &dims, GgmlType::F32, f32_bytes(&v));
        v
    };
    match name {
        "qwen3-head" | "qwen3-special" => {
            g.add_u32(&format!("{arch}.pooling_type"), 4);
            g.add_str_array(&format!("{arch}.classifier.output_labels"), &["yes", "no"]);
            head.out = add(&mut g, "cls.output.weight", &[e, 2], 0.1);
        }
        "llama-cls" => {
            g.add_u32(&format!("{arch}.pooling_type"), 4);
            head.cls = add(&mut g, "cls.weight", &[e, e], 0.3);
            head.cls_b = add(&mut g, "cls.bias", &[e], 0.3);
            head.out = add(&mut g, "cls.output.weight", &[e, 1], 1.0);
            head.out_b = add(&mut g, "cls.output.bias", &[1], 1.0);
        }
        _ => {}
    }
    match name {
        "qwen3-head" => {
            g.add_str("tokenizer.chat_template.rerank", TEMPLATE);
        }
        "qwen3-special" => {
            g.add_u32("tokenizer.ggml.bos_token_id", 1);
            g.add_u32("tokenizer.ggml.seperator_token_id", 2);
            g.add_bool("tokenizer.ggml.add_bos_token", true);
            g.add_bool("tokenizer.ggml.add_eos_token", true);
            g.add_bool("tokenizer.ggml.add_sep_token", true);
        }
        _ => {}
    }
    let path = dir.join(format!("{name}.gguf"));
    g.write(&path).unwrap();
    (path, w, head)
}

/// The classifier head's weights, as the file holds them (empty where absent).
#[derive(Default)]
struct Head {
    cls: Vec<f32>,
    cls_b: Vec<f32>,
    out: Vec<f32>,
    out_b: Vec<f32>,
}

fn context(model: &Arc<Model>, n_batch: usize) -> Context {
    Context::new(
        model.clone(),
        ContextParams {
            n_ctx: 256,
            n_threads: 2,
            n_batch,
            ..ContextParams::default()
        },
    )
    .unwrap()
}

/// The rank pooling's outputs for `tokens`, in a sequence of its own.
fn rank(ctx: &mut Context, tokens: &[u32]) -> Vec<f32> {
    let seq = ctx.new_sequence();
    let out = ctx.rank(seq, tokens).unwrap();
    ctx.remove_sequence(seq).unwrap();
    out
}

#[test]
fn scores_match_llama_server_on_the_same_files() {
    let dir = tempfile::tempdir().unwrap();
    let mut seen = std::collections::BTreeSet::new();
    for line in include_str!("fixtures/tiny_rerank.jsonl").lines() {
        let want: Value = serde_json::from_str(line).unwrap();
        let name = want["model"].as_str().unwrap();
        let (query, doc) = (
            want["query"].as_str().unwrap(),
            want["document"].as_str().unwrap(),
        );
        let path = dir.path().join(format!("{name}.gguf"));
        if !path.exists() {
            write(name, dir.path());
        }
        let model = Model::load(&path).unwrap();
        let tokens = model.rerank_tokens(query, doc).unwrap();
        assert_eq!(
            tokens.len() as u64,
            want["n_tokens"].as_u64().unwrap(),
            "{name} {query:?} {doc:?}: prompt tokens"
        );
        let out = rank(&mut context(&model, 64), &tokens);
        assert_eq!(out.len(), model.ranking().n_outputs(), "{name}");
        let score = want["score"].as_f64().unwrap();
        assert!(
            (f64::from(out[0]) - score).abs() <= 1e-3,
            "{name} {query:?} {doc:?}: score {}, llama.cpp {score}",
            out[0]
        );
        seen.insert((name.to_owned(), query.to_owned(), doc.to_owned()));
    }
    assert_eq!(
        seen.len(),
        MODELS.len() * PAIRS.len(),
        "a fixture line a case"
    );
}

#[test]
fn the_metadata_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let (path, ..) = write("qwen3-head", dir.path());
    let model = Model::load(&path).unwrap();
    let r = model.ranking();
    assert_eq!(r.pooling(), Some(PoolingType::Rank));
    assert_eq!(r.labels(), ["yes", "no"]);
    assert!(r.has_head());
    assert_eq!(r.template(), Some(TEMPLATE));
    let (path, ..) = write("llama-plain", dir.path());
    let plain = Model::load(&path).unwrap();
    let r = plain.ranking();
    assert_eq!((r.pooling(), r.n_outputs(), r.has_head()), (None, 1, false));
    // The special tokens where the vocabulary asks for them: BOS, EOS after the query, SEP,
    // EOS after the document.
    let (path, ..) = write("qwen3-special", dir.path());
    let special = Model::load(&path).unwrap();
    let t = special.rerank_tokens("ab", "cd").unwrap();
    let tok = special.tokenizer();
    let (q, d) = (
        tok.encode("ab", false, false).unwrap(),
        tok.encode("cd", false, false).unwrap(),
    );
    let want: Vec<u32> = [vec![1], q, vec![0, 2], d, vec![0]].concat();
    assert_eq!(t, want);
}

/// Both head layers (`cls` with its tanh, then `cls.output`), each with its bias, against the
/// naive forward pass's last final-norm row put through them.
#[test]
fn the_two_layer_head_matches_the_reference() {
    let dir = tempfile::tempdir().unwrap();
    let (path, w, head) = write("llama-cls", dir.path());
    let c = cfg(Shape::Llama, false);
    let model = Model::load(&path).unwrap();
    let toks = tokens(40);
    let last = reference_hidden(&c, &w, &toks).pop().unwrap();
    let hidden: Vec<f32> = matvec(&head.cls, &last)
        .iter()
        .zip(&head.cls_b)
        .map(|(x, b)| (x + b).tanh())
        .collect();
    let want = matvec(&head.out, &hidden)[0] + head.out_b[0];
    // Micro-batches of 16 and one batch: the same pooled row.
    for n_batch in [16, 64] {
        let got = rank(&mut context(&model, n_batch), &toks);
        assert_eq!(got.len(), 1);
        assert!(
            (got[0] - want).abs() <= 2e-2 * want.abs().max(1.0),
            "n_batch {n_batch}: {} against {want}",
            got[0]
        );
    }
    // Nothing to pool.
    let mut ctx = context(&model, 16);
    let seq = ctx.new_sequence();
    assert!(matches!(ctx.rank(seq, &[]), Err(engine::Error::EmptyBatch)));
}

/// Writes the fixture's models for llama-server (see the module's docs).
#[test]
#[ignore = "records fixtures; run by hand with LLAMA_HDD_TINY_OUT"]
fn write_the_tiny_rerankers_for_llama_cpp() {
    let out = std::env::var("LLAMA_HDD_TINY_OUT").expect("LLAMA_HDD_TINY_OUT");
    let out = Path::new(&out);
    std::fs::create_dir_all(out).unwrap();
    for name in MODELS {
        write(name, out);
    }
    let pairs: Vec<Value> = PAIRS
        .iter()
        .map(|(q, d)| serde_json::json!({ "query": q, "document": d }))
        .collect();
    std::fs::write(
        out.join("pairs.json"),
        serde_json::to_string(&pairs).unwrap(),
    )
    .unwrap();
}
