//! Malformed tiny models are refused at load with a typed error naming the key or tensor, before
//! any graph is built (regressions: a RoPE dimension count of 0 used to spin forever in the
//! first decode, an odd one aborted the process inside ggml).

mod common;

use common::{cfg, params, tokens, write_edited, Shape};
use engine::gguf::{GgmlType, GgufWriter, MetaValue};
use engine::{Error, Model, Session};

/// Loads the tiny llama model after `edit`; returns the load error.
fn load_err(edit: impl FnOnce(&mut GgufWriter)) -> Error {
    let dir = tempfile::tempdir().unwrap();
    let path = write_edited(&cfg(Shape::Llama, false), dir.path(), "m.gguf", edit);
    Model::load(&path).expect_err("a malformed model loaded")
}

/// Asserts `e` is an [`Error::InvalidHParam`] for `key`.
fn assert_key(e: &Error, key: &str) {
    match e {
        Error::InvalidHParam { key: k, .. } if k == key => {}
        other => panic!("expected InvalidHParam for {key}, got {other:?}"),
    }
    assert!(e.to_string().contains(key), "{e}");
}

#[test]
fn the_unedited_model_loads_and_runs() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_edited(&cfg(Shape::Llama, false), dir.path(), "m.gguf", |_| {});
    let model = Model::load(&path).unwrap();
    let mut s = Session::new(model, params(8)).unwrap();
    s.feed(&tokens(5)).unwrap();
}

#[test]
fn rope_dimension_count_zero_is_refused() {
    let e = load_err(|w| {
        w.add_u32("llama.rope.dimension_count", 0);
    });
    assert_key(&e, "llama.rope.dimension_count");
}

#[test]
fn odd_rope_dimension_count_is_refused() {
    let e = load_err(|w| {
        w.add_u32("llama.rope.dimension_count", 3);
    });
    assert_key(&e, "llama.rope.dimension_count");
    // Larger than the head dimension (8).
    let e = load_err(|w| {
        w.add_u32("llama.rope.dimension_count", 10);
    });
    assert_key(&e, "llama.rope.dimension_count");
}

#[test]
fn a_smaller_even_rope_dimension_count_still_runs() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_edited(&cfg(Shape::Llama, false), dir.path(), "m.gguf", |w| {
        w.add_u32("llama.rope.dimension_count", 4);
    });
    let model = Model::load(&path).unwrap();
    assert_eq!(model.hparams().rope_dims, 4);
    let mut s = Session::new(model, params(8)).unwrap();
    s.feed(&tokens(5)).unwrap();
}

#[test]
fn head_counts_must_divide() {
    // 4 query heads, 3 KV heads.
    let e = load_err(|w| {
        w.add_u32("llama.attention.head_count_kv", 3);
    });
    assert_key(&e, "llama.attention.head_count_kv");
    let e = load_err(|w| {
        w.add_u32("llama.attention.head_count_kv", 0);
    });
    assert_key(&e, "llama.attention.head_count_kv");
    let e = load_err(|w| {
        w.add_u32("llama.attention.head_count", 0);
    });
    assert_key(&e, "llama.attention.head_count");
    // 32 is not a multiple of 5 heads.
    let e = load_err(|w| {
        w.add_u32("llama.attention.head_count", 5)
            .add_u32("llama.attention.head_count_kv", 5);
    });
    assert_key(&e, "llama.embedding_length");
    // An odd head dimension.
    let e = load_err(|w| {
        w.add_u32("llama.attention.key_length", 7);
    });
    assert_key(&e, "llama.attention.key_length");
    let e = load_err(|w| {
        w.add_u32("llama.attention.value_length", 16);
    });
    assert_key(&e, "llama.attention.value_length");
}

#[test]
fn floats_must_be_finite_and_positive() {
    for (key, v) in [
        ("llama.attention.layer_norm_rms_epsilon", f32::NAN),
        ("llama.attention.layer_norm_rms_epsilon", 0.0),
        ("llama.attention.layer_norm_rms_epsilon", -1e-5),
        ("llama.rope.freq_base", 0.0),
        ("llama.rope.freq_base", f32::INFINITY),
        ("llama.rope.scaling.factor", f32::NAN),
    ] {
        let e = load_err(|w| {
            w.add_f32(key, v);
        });
        assert_key(&e, key);
    }
}

#[test]
fn sizes_and_scaling_are_checked() {
    for (key, v) in [
        ("llama.block_count", 0),
        ("llama.block_count", 1 << 30),
        ("llama.embedding_length", 0),
        ("llama.context_length", 0),
        ("llama.feed_forward_length", 0),
    ] {
        let e = load_err(|w| {
            w.add_u32(key, v);
        });
        assert_key(&e, key);
    }
    let e = load_err(|w| {
        w.add_str("llama.rope.scaling.type", "longrope")
            .add_f32("llama.rope.scaling.factor", 4.0);
    });
    assert_key(&e, "llama.rope.scaling.type");
    // A context length that is not an integer is a type error naming the key.
    let e = load_err(|w| {
        w.add_f32("llama.context_length", 1.5);
    });
    assert!(
        matches!(&e, Error::KeyType { key, .. } if key == "llama.context_length"),
        "{e:?}"
    );
}

#[test]
fn vocabulary_must_match_the_embedding_and_the_tokenizer() {
    // vocab_size disagrees with the token list (and so with the tensors).
    let e = load_err(|w| {
        w.add_u32("llama.vocab_size", 98);
    });
    assert_key(&e, "llama.vocab_size");
    // An embedding table with one row too few.
    let c = cfg(Shape::Llama, false);
    let e = load_err(|w| {
        let shape = [c.n_embd as u64, c.n_vocab as u64 - 1];
        let bytes = vec![0u8; 4 * c.n_embd * (c.n_vocab - 1)];
        w.replace_tensor("token_embd.weight", &shape, GgmlType::F32, bytes);
    });
    assert!(
        matches!(&e, Error::BadTensor { name, .. } if name == "token_embd.weight"),
        "{e:?}"
    );
}

#[test]
fn token_ids_must_be_in_the_vocabulary() {
    for key in [
        "tokenizer.ggml.bos_token_id",
        "tokenizer.ggml.eos_token_id",
        "tokenizer.ggml.padding_token_id",
        "tokenizer.ggml.eot_token_id",
    ] {
        let e = load_err(|w| {
            w.add_u32(key, 97);
        });
        match &e {
            Error::Tokenizer(engine::TokenizerError::TokenIdOutOfRange {
                key: k,
                id: 97,
                n_vocab: 97,
            }) if k == key => {}
            other => panic!("{key}: {other:?}"),
        }
    }
    let e = load_err(|w| {
        w.add("tokenizer.ggml.bos_token_id", MetaValue::I32(-1));
    });
    assert!(matches!(e, Error::KeyType { .. }), "{e:?}");
}

#[test]
fn tensor_types_must_suit_their_kernels() {
    let c = cfg(Shape::Llama, false);
    // A norm stored as f16 (ggml_mul wants f32).
    let e = load_err(|w| {
        let shape = [c.n_embd as u64];
        w.replace_tensor(
            "blk.0.attn_norm.weight",
            &shape,
            GgmlType::F16,
            vec![0; 2 * c.n_embd],
        );
    });
    assert!(
        matches!(&e, Error::BadTensor { name, .. } if name == "blk.0.attn_norm.weight"),
        "{e:?}"
    );
    // A matrix of i32 (no dot product on the CPU).
    let e = load_err(|w| {
        w.replace_tensor(
            "blk.1.ffn_up.weight",
            &[c.n_embd as u64, c.n_ff as u64],
            GgmlType::I32,
            vec![0; 4 * c.n_embd * c.n_ff],
        );
    });
    assert!(
        matches!(&e, Error::BadTensor { name, .. } if name == "blk.1.ffn_up.weight"),
        "{e:?}"
    );
}

#[test]
fn a_tensor_the_forward_pass_does_not_read_is_refused() {
    // A bias on the output head: llama has none, so its weights would be ignored.
    let e = load_err(|w| {
        w.add_tensor("output.bias", &[97], GgmlType::F32, vec![0; 97 * 4]);
    });
    match &e {
        Error::BadTensor { name, reason } if name == "output.bias" => {
            assert!(reason.contains("not read"), "{reason}")
        }
        other => panic!("expected BadTensor for output.bias, got {other:?}"),
    }
}
