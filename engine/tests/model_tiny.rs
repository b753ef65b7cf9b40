//! The forward pass on tiny llama-, qwen2- and qwen3-shaped models that the test writes, against a naive
//! Rust implementation of the same network; KV save/restore; micro-batching; typed errors.

mod common;

use common::*;
use engine::gguf::GgufWriter;
use engine::{ContextParams, Error, Model, Session};

fn check_against_reference(shape: Shape, tied: bool) {
    let c = cfg(shape, tied);
    let (_dir, model, w) = build(&c, 7);
    let toks = tokens(40);
    let want = reference(&c, &w, &toks);
    // Every position, in micro-batches of 16 (so batches cross the cache's earlier rows).
    let mut s = Session::new(model.clone(), params(16)).unwrap();
    let all = s.feed_all_logits(&toks).unwrap();
    for (i, row) in all.chunks(c.n_vocab).enumerate() {
        assert_close(row, &want[i], 5e-3, &format!("position {i}"));
    }
    // Prefill then single-token decoding.
    let mut s = Session::new(model, params(512)).unwrap();
    let last = s.feed(&toks[..30]).unwrap().to_vec();
    assert_close(&last, &want[29], 5e-3, "prefill");
    for (i, &t) in toks[30..].iter().enumerate() {
        let got = s.feed(&[t]).unwrap().to_vec();
        assert_close(&got, &want[30 + i], 5e-3, &format!("decode {}", 30 + i));
    }
}

#[test]
fn unfused_attention_matches_reference_too() {
    let c = cfg(Shape::Qwen2, false);
    let (_dir, model, w) = build(&c, 8);
    let toks = tokens(40);
    let want = reference(&c, &w, &toks);
    let mut p = params(16);
    p.flash_attn = false;
    // The batch-invariant default always fuses attention.
    p.evaluation = engine::Evaluation::Fast;
    let mut s = Session::new(model, p).unwrap();
    let all = s.feed_all_logits(&toks).unwrap();
    for (i, row) in all.chunks(c.n_vocab).enumerate() {
        assert_close(row, &want[i], 5e-3, &format!("position {i}"));
    }
}

#[test]
fn llama3_rope_frequency_factors_match_reference() {
    let mut c = cfg(Shape::Llama, false);
    // Factors like Llama 3's: high frequencies untouched, low ones stretched.
    let half = c.head_dim() / 2;
    c.rope_freqs = Some(
        (0..half)
            .map(|i| 1.0 + 7.0 * i as f32 / (half - 1) as f32)
            .collect(),
    );
    let (_dir, model, w) = build(&c, 9);
    let toks = tokens(40);
    let want = reference(&c, &w, &toks);
    let mut s = Session::new(model, params(16)).unwrap();
    let all = s.feed_all_logits(&toks).unwrap();
    for (i, row) in all.chunks(c.n_vocab).enumerate() {
        assert_close(row, &want[i], 5e-3, &format!("position {i}"));
    }
    // Without the factors the reference differs: the test sees them.
    let plain = Cfg {
        rope_freqs: None,
        ..c
    };
    let other = reference(&plain, &w, &toks);
    let worst = other[39]
        .iter()
        .zip(&want[39])
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(worst > 0.05, "frequency factors changed nothing ({worst})");
}

#[test]
fn llama_shape_matches_reference() {
    check_against_reference(Shape::Llama, false);
}

#[test]
fn llama_shape_with_tied_embeddings_matches_reference() {
    check_against_reference(Shape::Llama, true);
}

#[test]
fn qwen2_shape_with_biases_matches_reference() {
    check_against_reference(Shape::Qwen2, false);
}

#[test]
fn qwen3_shape_with_head_norms_matches_reference() {
    check_against_reference(Shape::Qwen3, false);
}

#[test]
fn restored_kv_gives_the_same_logits_as_prefill() {
    let c = cfg(Shape::Llama, false);
    let (_dir, model, _) = build(&c, 11);
    let toks = tokens(110);
    // A full page and a partial one.
    let n = 100;
    let mut a = Session::new(model.clone(), params(512)).unwrap();
    a.feed(&toks[..n]).unwrap();
    let saved = export_pages(&a);
    assert_eq!((saved.blocks.len(), saved.tokens.len()), (1, n));
    assert!(
        saved
            .blocks
            .iter()
            .chain([&saved.tail])
            .all(|b| b.iter().any(|&x| x != 0)),
        "exported KV is empty"
    );
    let want = a.feed(&toks[n..n + 1]).unwrap().to_vec();

    let mut b = Session::new(model, params(512)).unwrap();
    import_pages(&mut b, &saved).unwrap();
    assert!(matches!(b.logits(), Err(Error::NoLogits)));
    let got = b.feed(&toks[n..n + 1]).unwrap().to_vec();
    assert_eq!(got, want, "restored KV must reproduce the logits exactly");

    // A cache restored with the wrong bytes must not: the test can fail.
    let mut c2 = Session::new(b.model().clone(), params(512)).unwrap();
    let mut bad = saved;
    bad.blocks[0][5] ^= 0x40;
    import_pages(&mut c2, &bad).unwrap();
    assert_ne!(c2.feed(&toks[n..n + 1]).unwrap(), &want[..]);
}

#[test]
fn truncate_then_refeed_matches_fresh_evaluation() {
    let c = cfg(Shape::Llama, false);
    let (_dir, model, _) = build(&c, 12);
    let toks = tokens(30);
    let mut s = Session::new(model.clone(), params(512)).unwrap();
    s.feed(&toks).unwrap();
    s.truncate(10).unwrap();
    assert_eq!(s.tokens(), &toks[..10]);
    let other: Vec<u32> = (0..5).map(|i| (i * 3 + 1) as u32).collect();
    let got = s.feed(&other).unwrap().to_vec();
    let mut fresh = Session::new(model, params(512)).unwrap();
    let mut seq = toks[..10].to_vec();
    seq.extend_from_slice(&other);
    let want = fresh.feed(&seq).unwrap().to_vec();
    assert_close(&got, &want, 1e-4, "after truncate");
}

#[test]
fn bad_inputs_give_typed_errors() {
    let c = cfg(Shape::Llama, false);
    let (dir, model, _) = build(&c, 13);
    let mut s = Session::new(
        model.clone(),
        ContextParams {
            n_ctx: 16,
            n_threads: 1,
            n_batch: 8,
            flash_attn: true,
            ..ContextParams::default()
        },
    )
    .unwrap();
    assert!(matches!(
        s.feed(&[1000]),
        Err(Error::BadToken { id: 1000, .. })
    ));
    assert!(matches!(
        s.feed(&tokens(17)),
        Err(Error::ContextFull {
            needed: 17,
            n_ctx: 16
        })
    ));
    assert!(
        s.tokens().is_empty(),
        "a refused feed must leave the session unchanged"
    );
    let mut k = vec![0u8; 3];
    assert!(matches!(
        s.read_kv(0, 0..1, &mut k, &mut [0u8; 3]),
        Err(Error::KvRange { .. })
    ));

    assert!(matches!(
        Model::load(dir.path().join("missing.gguf")),
        Err(Error::ModelNotFound { .. })
    ));

    // Truncated files are refused, wherever they are cut.
    let bytes = std::fs::read(dir.path().join("tiny.gguf")).unwrap();
    let cut = dir.path().join("cut.gguf");
    for at in [10, bytes.len() / 3, bytes.len() - 1] {
        std::fs::write(&cut, &bytes[..at]).unwrap();
        assert!(Model::load(&cut).is_err(), "a file cut at {at} loaded");
    }

    // An architecture we do not run.
    let mut g = GgufWriter::new();
    g.add_str("general.architecture", "mamba");
    let other = dir.path().join("other.gguf");
    g.write(&other).unwrap();
    assert!(
        matches!(Model::load(&other), Err(Error::UnsupportedArchitecture { arch }) if arch == "mamba")
    );
}

#[test]
fn models_are_shared_across_threads_and_sessions_move_between_them() {
    fn shared<T: Send + Sync>() {}
    fn movable<T: Send>() {}
    shared::<Model>();
    movable::<Session>();
    // And it works: two sessions on two threads over one model give the same logits.
    let c = cfg(Shape::Llama, false);
    let (_dir, model, _) = build(&c, 14);
    let toks = tokens(20);
    let run = |m: std::sync::Arc<Model>, t: Vec<u32>| {
        std::thread::spawn(move || {
            Session::new(m, params(512))
                .unwrap()
                .feed(&t)
                .unwrap()
                .to_vec()
        })
    };
    let a = run(model.clone(), toks.clone());
    let b = run(model, toks);
    assert_eq!(a.join().unwrap(), b.join().unwrap());
}
