//! gpt-oss on a tiny model the test writes (experts in MXFP4, attention sinks, a sliding
//! window on every other layer, YaRN), against a naive Rust forward pass of the same network
//! (`common::gpt_oss`); llama.cpp's own outputs on the same file are checked in
//! `arch_golden.rs`.

mod common;

/// The tiny model's seed in the comparisons: on others, an unlucky rounding (an f32 sum in
/// another order) may move a q8_0 code of the experts' input and a logit by about 1e-2.
const SEED: u64 = 21;

use common::gpt_oss::{self, Attention, N_EMBD, N_EXPERT, N_HEAD, N_VOCAB};
use common::*;
use std::sync::Arc;

use engine::gguf::{GgmlType, GgufWriter};
use engine::{ContextParams, Error, Evaluation, Model, Session};

/// Every position against the reference computing attention as `p`'s kernels do: in
/// micro-batches of 16 (batches cross the cache's earlier rows and the window's edge), then as
/// a prefill followed by single-token decoding.
fn check(p: ContextParams, seed: u64) {
    let (_dir, model, w) = gpt_oss::build(seed);
    let toks = tokens(40);
    let attention = match p.flash_attn {
        true => Attention::Fused,
        false => Attention::Unfused,
    };
    let want = gpt_oss::reference(&w, &toks, attention);
    let mut s = Session::new(model.clone(), p.clone()).unwrap();
    let all = s.feed_all_logits(&toks).unwrap();
    for (i, row) in all.chunks(N_VOCAB).enumerate() {
        assert_close(row, &want[i], 5e-3, &format!("position {i}"));
    }
    let mut s = Session::new(model, ContextParams { n_batch: 512, ..p }).unwrap();
    let last = s.feed(&toks[..30]).unwrap().to_vec();
    assert_close(&last, &want[29], 5e-3, "prefill");
    for (i, &t) in toks[30..].iter().enumerate() {
        let got = s.feed(&[t]).unwrap().to_vec();
        assert_close(&got, &want[30 + i], 5e-3, &format!("decode {}", 30 + i));
    }
}

#[test]
fn gpt_oss_matches_reference() {
    check(params(16), SEED);
}

#[test]
fn gpt_oss_matches_reference_unfused_and_per_item() {
    // The unfused attention adds the sinks to its softmax; `Fast` lets long items pick their
    // kernels, which sinks send to ggml's.
    for flash_attn in [false, true] {
        let p = ContextParams {
            flash_attn,
            evaluation: Evaluation::Fast,
            ..params(16)
        };
        check(p, SEED);
    }
}

#[test]
fn sinks_biases_window_and_yarn_each_move_the_logits() {
    // The comparisons above could pass with a part of the network ignored only if that part
    // changed nothing: each one moves the logits by more than their tolerance.
    let toks = tokens(12);
    let largest = |a: &[f32], b: &[f32]| {
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max)
    };
    let w = gpt_oss::make_weights(SEED);
    let base = gpt_oss::reference(&w, &toks, Attention::Fused);
    let moved = |edit: &dyn Fn(&mut gpt_oss::Layer)| {
        let mut w = gpt_oss::make_weights(SEED);
        w.layers.iter_mut().for_each(edit);
        largest(
            &gpt_oss::reference(&w, &toks, Attention::Fused)[11],
            &base[11],
        )
    };
    type Edit = fn(&mut gpt_oss::Layer);
    let edits: [(&str, Edit); 3] = [
        ("sinks", |l| l.sinks.fill(-1e30)),
        ("the experts' biases", |l| l.down_b.fill(0.0)),
        ("the router's bias", |l| l.router_b.fill(0.0)),
    ];
    for (what, edit) in edits {
        let d = moved(&edit);
        assert!(d > 0.05, "{what} changed the reference by {d} only");
    }
    // The engine reads the window and the scaling from the file: without them, other logits.
    let logits = |model: Arc<Model>| {
        let mut s = Session::new(model, params(16)).unwrap();
        s.feed(&toks).unwrap().to_vec()
    };
    let (_dir, model, _) = gpt_oss::build(SEED);
    let base = logits(model);
    let unwindowed = load_edited(|g| {
        g.add_u32("gpt-oss.attention.sliding_window", 1000);
    });
    let unscaled = load_edited(|g| {
        g.remove("gpt-oss.rope.scaling.type");
        g.remove("gpt-oss.rope.scaling.factor");
    });
    for (what, model) in [("window", unwindowed), ("YaRN", unscaled)] {
        let d = largest(&logits(model.unwrap()), &base);
        assert!(d > 0.05, "the {what} changed the logits by {d} only");
    }
}

#[test]
fn a_split_prompt_gives_the_same_bits_as_a_whole_one() {
    // The default evaluation is batch-invariant; with sinks it takes ggml's per-query path.
    let (_dir, model, _) = gpt_oss::build(24);
    let toks = tokens(70);
    let p = ContextParams {
        n_ctx: 128,
        n_threads: 2,
        ..ContextParams::default()
    };
    let mut whole = Session::new(model.clone(), p.clone()).unwrap();
    let want = whole.feed(&toks).unwrap().to_vec();
    let mut split = Session::new(model, p).unwrap();
    split.feed(&toks[..33]).unwrap();
    split.feed(&toks[33..69]).unwrap();
    let got = split.feed(&toks[69..]).unwrap().to_vec();
    assert_eq!(got, want);
}

/// The tiny model written with `edit` applied to its writer, then loaded.
fn load_edited(edit: impl FnOnce(&mut GgufWriter)) -> engine::Result<Arc<Model>> {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("base.gguf");
    gpt_oss::write_model(&gpt_oss::make_weights(SEED), &base);
    let gguf = engine::gguf::Gguf::open(&base).unwrap();
    let mut g = GgufWriter::from_gguf(&gguf).unwrap();
    edit(&mut g);
    let path = dir.path().join("edited.gguf");
    g.write(&path).unwrap();
    Model::load(&path)
}

fn refused(edit: impl FnOnce(&mut GgufWriter)) -> Error {
    load_edited(edit).expect_err("the edited file loaded")
}

#[test]
fn what_gpt_oss_needs_is_required() {
    let missing = |key: &str| {
        let key = key.to_owned();
        refused(move |g| {
            g.remove(&key);
        })
    };
    assert!(matches!(
        missing("gpt-oss.attention.sliding_window"),
        Error::MissingKey { .. } | Error::InvalidHParam { .. }
    ));
    assert!(matches!(
        missing("gpt-oss.expert_feed_forward_length"),
        Error::MissingKey { .. } | Error::InvalidHParam { .. }
    ));
    for tensor in [
        "blk.1.attn_sinks.weight",
        "blk.0.ffn_gate_inp.bias",
        "blk.0.ffn_down_exps.bias",
        "blk.0.attn_output.bias",
        "output.weight",
    ] {
        let err = refused(|g| {
            g.remove_tensor(tensor);
        });
        assert!(
            matches!(&err, Error::MissingTensor { name } if name == tensor),
            "{tensor}: {err}"
        );
    }
    // Sinks are f32, one per query head.
    let err = refused(|g| {
        g.replace_tensor(
            "blk.0.attn_sinks.weight",
            &[N_HEAD as u64 * 2],
            GgmlType::F32,
            f32_bytes(&[0.5; N_HEAD * 2]),
        );
    });
    assert!(matches!(err, Error::BadTensor { .. }), "{err}");
    // Expert biases are per expert.
    let err = refused(|g| {
        g.replace_tensor(
            "blk.0.ffn_down_exps.bias",
            &[N_EMBD as u64],
            GgmlType::F32,
            f32_bytes(&[0.0; N_EMBD]),
        );
    });
    assert!(matches!(err, Error::BadTensor { .. }), "{err}");
}

#[test]
fn the_window_and_scaling_are_read_as_llama_cpp_reads_them() {
    let model = load_edited(|_| {}).unwrap();
    let hp = model.hparams();
    let w = hp.sliding_window.as_ref().expect("a window");
    assert_eq!(w.size, gpt_oss::WINDOW);
    // The first of every two layers is windowed, and rotates as the others do.
    assert_eq!(w.layers, [true, false]);
    assert!(w.rope_scaled);
    assert_eq!(w.rope_freq_base, gpt_oss::ROPE_BASE);
    assert!(hp.has_attn_sinks());
    let x = hp.experts.as_ref().expect("experts");
    assert_eq!(
        (x.n_expert, x.n_used, x.n_ff_exp),
        (N_EXPERT, 2, gpt_oss::N_FF)
    );
    assert!(!x.norm_weights);
    // A base of its own for the windowed layers, when the file gives one.
    let model = load_edited(|g| {
        g.add_f32("gpt-oss.rope.freq_base_swa", 1000.0);
    })
    .unwrap();
    let w = model.hparams().sliding_window.as_ref().expect("a window");
    assert_eq!(w.rope_freq_base, 1000.0);
}
