//! SentencePiece on a tiny vocabulary written with `GgufWriter`; expectations are derived by hand
//! from the algorithm: repeatedly merge the adjacent pair whose concatenation is the token with
//! the highest score (ties: leftmost), with `<0xXX>` byte fallback.

mod common;

use common::Vocab;

use engine::gguf::{Gguf, GgufWriter};
use engine::tokenizer::{StreamDecoder, Tokenizer};

const PIECES: [(&str, f32); 22] = [
    ("▁", -10.0),
    ("h", -10.0),
    ("e", -10.0),
    ("l", -10.0),
    ("o", -10.0),
    ("w", -10.0),
    ("r", -10.0),
    ("d", -10.0),
    ("a", -10.0),
    ("b", -10.0),
    ("he", -1.0),
    ("ll", -2.0),
    ("or", -2.5),
    ("hell", -3.0),
    ("hello", -4.0),
    ("▁hello", -5.0),
    ("▁w", -6.0),
    ("▁wor", -7.0),
    ("ld", -8.0),
    ("▁world", -9.0),
    ("ab", -1.0),
    ("aa", -1.5),
];

fn build(extra: impl FnOnce(&mut GgufWriter)) -> Vocab {
    let mut texts = vec!["<unk>".to_string(), "<s>".to_string(), "</s>".to_string()];
    let mut scores = vec![0.0, 0.0, 0.0];
    let mut types = vec![2, 3, 3];
    for b in 0..=255u8 {
        texts.push(format!("<0x{b:02X}>"));
        scores.push(0.0);
        types.push(6);
    }
    for (t, s) in PIECES {
        texts.push(t.to_string());
        scores.push(s);
        types.push(1);
    }
    let mut w = GgufWriter::new();
    w.add_str("tokenizer.ggml.model", "llama")
        .add_str_array("tokenizer.ggml.tokens", &texts)
        .add_f32_array("tokenizer.ggml.scores", &scores)
        .add_i32_array("tokenizer.ggml.token_type", &types)
        .add_u32("tokenizer.ggml.bos_token_id", 1)
        .add_u32("tokenizer.ggml.eos_token_id", 2)
        .add_u32("tokenizer.ggml.unknown_token_id", 0);
    extra(&mut w);
    let g = Gguf::from_bytes(w.to_bytes().unwrap()).unwrap();
    Vocab {
        tok: Tokenizer::from_gguf(&g).unwrap(),
        texts,
    }
}

#[test]
fn highest_score_merges_first() {
    let v = build(|_| {});
    // "▁hello▁world": he(-1), ll(-2), or(-2.5), hell(-3), hello(-4), ▁hello(-5), ▁w(-6),
    // ▁wor(-7), ld(-8), ▁world(-9).
    assert_eq!(
        v.tok.encode("hello world", false, false).unwrap(),
        v.ids(&["▁hello", "▁world"])
    );
    // "▁hell": he, ll, hell; "▁hell" is not a token, so ▁ stays alone.
    assert_eq!(
        v.tok.encode("hell", false, false).unwrap(),
        v.ids(&["▁", "hell"])
    );
    // "ab" appears twice in "abab" and both merge.
    assert_eq!(
        v.tok.encode("abab", false, false).unwrap(),
        v.ids(&["▁", "ab", "ab"])
    );
    // Equal scores: in "aaa" both pairs make "aa"; the leftmost merges first.
    assert_eq!(
        v.tok.encode("aaa", false, false).unwrap(),
        v.ids(&["▁", "aa", "a"])
    );
}

#[test]
fn byte_fallback_and_decode() {
    let v = build(|_| {});
    // "é" is not a piece: its UTF-8 bytes become byte tokens.
    let ids = v.tok.encode("hé", false, false).unwrap();
    assert_eq!(ids, v.ids(&["▁", "h", "<0xC3>", "<0xA9>"]));
    // The space added in front is removed again by decode.
    assert_eq!(v.tok.decode(&ids), "hé");
    assert_eq!(v.tok.token_bytes(v.id("▁hello")), b" hello");
    assert_eq!(v.tok.token_bytes(v.id("<0xC3>")), &[0xC3]);
    let text = "hello world, hé ☃";
    assert_eq!(
        v.tok.decode(&v.tok.encode(text, false, false).unwrap()),
        text
    );
}

#[test]
fn bos_by_default_and_space_prefix() {
    let v = build(|_| {});
    assert!(v.tok.add_bos());
    assert_eq!(
        v.tok.encode("hello", true, false).unwrap(),
        vec![1, v.id("▁hello")]
    );
    assert_eq!(v.tok.encode("", true, false).unwrap(), vec![1]);
    assert_eq!(v.tok.encode("", false, false).unwrap(), Vec::<u32>::new());

    let no_prefix = build(|w| {
        w.add_bool("tokenizer.ggml.add_space_prefix", false)
            .add_bool("tokenizer.ggml.add_bos_token", false)
            .add_bool("tokenizer.ggml.add_eos_token", true);
    });
    assert!(!no_prefix.tok.add_bos());
    assert_eq!(
        no_prefix.tok.encode("hello", true, false).unwrap(),
        vec![no_prefix.id("hello"), 2]
    );
}

#[test]
fn special_tokens_restart_the_space_prefix() {
    let v = build(|_| {});
    // After a special token the next text fragment gets a leading space again.
    let ids = v.tok.encode("hello</s>hello", false, true).unwrap();
    assert_eq!(ids, v.ids(&["▁hello", "</s>", "▁hello"]));
    assert!(v.tok.is_eog(2));
    assert!(!v.tok.is_eog(1));
    // Not parsed: "</s>" is spelled with byte tokens.
    let ids = v.tok.encode("</s>", false, false).unwrap();
    assert!(!ids.contains(&2));
    assert_eq!(v.tok.decode(&ids), "</s>");
}

#[test]
fn stream_decoder_on_byte_tokens() {
    let v = build(|_| {});
    let ids = v.tok.encode("é", false, false).unwrap();
    assert_eq!(ids, v.ids(&["▁", "<0xC3>", "<0xA9>"]));
    let mut dec = StreamDecoder::new();
    assert_eq!(dec.push(&v.tok, ids[0]), " ");
    assert_eq!(dec.push(&v.tok, ids[1]), "");
    assert_eq!(dec.push(&v.tok, ids[2]), "é");
    // Control tokens print nothing.
    assert_eq!(dec.push(&v.tok, 1), "");
    assert_eq!(dec.flush(), "");
}
