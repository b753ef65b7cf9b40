//! Byte-level BPE on a tiny vocabulary written with `GgufWriter`; expectations are derived by
//! hand from the algorithm: repeatedly merge the adjacent pair with the lowest merge rank (ties:
//! leftmost), on pieces cut by the pre-tokenizer regex.

mod common;

use common::Vocab;

use engine::gguf::{Gguf, GgufWriter};
use engine::tokenizer::{StreamDecoder, Tokenizer};

/// GPT-2's byte-to-unicode alphabet, written out from its definition.
fn byte_char(b: u8) -> char {
    let printable = |b: u8| (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || b >= 0xAE;
    if printable(b) {
        return char::from(b);
    }
    let n = (0..b).filter(|&x| !printable(x)).count() as u32;
    char::from_u32(256 + n).unwrap()
}

const SPECIALS: [(&str, i32); 4] = [
    ("<|endoftext|>", 3),
    ("<|im_start|>", 3),
    ("<|im_end|>", 3),
    ("<tool>", 4),
];

/// Merge rules in rank order, each "left right".
const MERGES: [&str; 12] = [
    "l l", "h e", "he ll", "hell o", "Ġ w", "o r", "Ġw or", "b c", "a b", "a a", "x y", "1 2",
];

fn build(pre: &str, extra: impl FnOnce(&mut GgufWriter)) -> Vocab {
    let mut texts: Vec<String> = SPECIALS.iter().map(|(t, _)| t.to_string()).collect();
    let mut types: Vec<i32> = SPECIALS.iter().map(|(_, k)| *k).collect();
    for b in 0..=255u8 {
        texts.push(byte_char(b).to_string());
        types.push(1);
    }
    // Merge results; "xy" is deliberately missing, and "abc" is a token that no merge sequence
    // reaches (b+c comes first and there is no "a bc" rule).
    for t in [
        "ll", "he", "hell", "hello", "Ġw", "or", "Ġwor", "bc", "ab", "aa", "12", "abc",
    ] {
        texts.push(t.to_string());
        types.push(1);
    }
    let mut w = GgufWriter::new();
    w.add_str("tokenizer.ggml.model", "gpt2")
        .add_str("tokenizer.ggml.pre", pre)
        .add_str_array("tokenizer.ggml.tokens", &texts)
        .add_i32_array("tokenizer.ggml.token_type", &types)
        .add_str_array("tokenizer.ggml.merges", &MERGES)
        .add_u32("tokenizer.ggml.bos_token_id", 1)
        .add_u32("tokenizer.ggml.eos_token_id", 0)
        .add_bool("tokenizer.ggml.add_bos_token", false);
    extra(&mut w);
    let g = Gguf::from_bytes(w.to_bytes().unwrap()).unwrap();
    Vocab {
        tok: Tokenizer::from_gguf(&g).unwrap(),
        texts,
    }
}

#[test]
fn merges_follow_rank_order() {
    let v = build("gpt2", |_| {});
    // "hello" : l+l (0), h+e (1), he+ll (2), hell+o (3). " world": Ġ+w (4), o+r (5), Ġw+or (6);
    // nothing merges with "l" or "d" after that.
    assert_eq!(
        v.tok.encode("hello world", false, false).unwrap(),
        v.ids(&["hello", "Ġwor", "l", "d"])
    );
    // b+c has a lower rank than a+b, so "abc" is a + bc, not ab + c.
    assert_eq!(
        v.tok.encode("abc", false, false).unwrap(),
        v.ids(&["a", "bc"])
    );
    // Equal ranks: the leftmost pair first.
    assert_eq!(
        v.tok.encode("aaa", false, false).unwrap(),
        v.ids(&["aa", "a"])
    );
    // x+y merges, but "xy" is not a token: llama.cpp falls back to the single bytes.
    assert_eq!(
        v.tok.encode("xy", false, false).unwrap(),
        v.ids(&["x", "y"])
    );
    // Non-ASCII bytes go through the byte alphabet.
    let e_acute = v.tok.encode("é", false, false).unwrap();
    assert_eq!(
        e_acute,
        vec![
            v.id(&byte_char(0xC3).to_string()),
            v.id(&byte_char(0xA9).to_string())
        ]
    );
    assert_eq!(v.tok.decode(&e_acute), "é");
    assert_eq!(v.tok.token_bytes(v.id("Ġwor")), b" wor");
}

#[test]
fn pre_tokenizer_splits_before_merging() {
    let gpt2 = build("gpt2", |_| {});
    // The GPT-2 regex keeps "12" together as one number piece.
    assert_eq!(
        gpt2.tok.encode("12", false, false).unwrap(),
        gpt2.ids(&["12"])
    );
    // Words are merged separately: "ab" in "a b" is never formed across the space.
    assert_eq!(
        gpt2.tok.encode("a b", false, false).unwrap(),
        gpt2.ids(&["a", "Ġ", "b"])
    );
    // SmolLM's pre-tokenizer splits every digit first.
    let smol = build("smollm", |_| {});
    assert_eq!(
        smol.tok.encode("12", false, false).unwrap(),
        smol.ids(&["1", "2"])
    );
    // Two spaces before a word: the first stands alone (\s+(?!\S)), the second starts the piece
    // " hello", in which no rule merges Ġ with h.
    assert_eq!(
        smol.tok.encode("a  hello", false, false).unwrap(),
        smol.ids(&["a", "Ġ", "Ġ", "hello"]),
    );
    for text in ["hello world", "a  hello", "x\ty\n\nz 12 3!", "naïve ☃"] {
        let ids = smol.tok.encode(text, false, false).unwrap();
        assert_eq!(smol.tok.decode(&ids), text);
    }
}

#[test]
fn other_pre_tokenizers() {
    // Llama 3 (and LFM2, which llama.cpp splits alike): numbers in groups of three, and a
    // word that is already a token skips merging.
    for name in ["llama-bpe", "lfm2"] {
        let llama3 = build(name, |_| {});
        assert_eq!(
            llama3.tok.encode("1234", false, false).unwrap(),
            llama3.ids(&["12", "3", "4"]),
            "{name}"
        );
        assert_eq!(
            llama3.tok.encode("abc", false, false).unwrap(),
            llama3.ids(&["abc"]),
            "{name}"
        );
    }
    // Merging never reaches "abc" for the others.
    let gpt2 = build("gpt2", |_| {});
    assert_eq!(
        gpt2.tok.encode("abc", false, false).unwrap(),
        gpt2.ids(&["a", "bc"])
    );
    // Qwen2: one digit per piece (the GPT-2 regex above keeps "12" whole).
    let qwen2 = build("qwen2", |_| {});
    assert_eq!(
        qwen2.tok.encode("12", false, false).unwrap(),
        qwen2.ids(&["1", "2"])
    );
    // llama.cpp's default: three-digit groups after the number split.
    let default = build("default", |_| {});
    assert_eq!(
        default.tok.encode("1212", false, false).unwrap(),
        default.ids(&["12", "1", "2"])
    );
}

#[test]
fn leading_space_merge_depends_on_the_space() {
    let v = build("gpt2", |_| {});
    // " hello" is Ġ + hello (no rule merges Ġ with h), "hello" alone is one token.
    assert_eq!(
        v.tok.encode(" hello", false, false).unwrap(),
        v.ids(&["Ġ", "hello"])
    );
}

#[test]
fn special_tokens_in_text() {
    let v = build("gpt2", |_| {});
    let ids = v
        .tok
        .encode("<|im_start|>hello<|im_end|>", false, true)
        .unwrap();
    assert_eq!(ids, v.ids(&["<|im_start|>", "hello", "<|im_end|>"]));
    // Without parse_special, control tokens are ordinary text...
    let plain = v.tok.encode("<|im_start|>hello", false, false).unwrap();
    assert!(!plain.contains(&v.id("<|im_start|>")));
    assert_eq!(v.tok.decode(&plain), "<|im_start|>hello");
    // ...but user-defined tokens are always recognised, as in llama.cpp.
    let ids = v.tok.encode("ab<tool>ab", false, false).unwrap();
    assert_eq!(ids, v.ids(&["ab", "<tool>", "ab"]));
    // decode prints user-defined text but not control text.
    let ids = v
        .tok
        .encode("<|im_start|><tool>hello", false, true)
        .unwrap();
    assert_eq!(v.tok.decode(&ids), "<tool>hello");
    assert_eq!(v.tok.decode_special(&ids), "<|im_start|><tool>hello");
}

#[test]
fn bos_eos_flags_and_eog() {
    let v = build("gpt2", |w| {
        w.add_bool("tokenizer.ggml.add_bos_token", true)
            .add_bool("tokenizer.ggml.add_eos_token", true);
    });
    assert!(v.tok.add_bos());
    assert_eq!(v.tok.bos(), Some(1));
    assert_eq!(v.tok.eos(), Some(0));
    let ids = v.tok.encode("hello", true, false).unwrap();
    assert_eq!(ids, vec![1, v.id("hello"), 0]);
    assert_eq!(
        v.tok.encode("hello", false, false).unwrap(),
        vec![v.id("hello")]
    );
    assert_eq!(v.tok.encode("", true, false).unwrap(), vec![1, 0]);

    let plain = build("gpt2", |_| {});
    assert!(!plain.tok.add_bos());
    assert_eq!(
        plain.tok.encode("hello", true, false).unwrap(),
        vec![plain.id("hello")]
    );
    assert!(plain.tok.is_eog(plain.id("<|im_end|>")));
    assert!(plain.tok.is_eog(plain.id("<|endoftext|>")));
    assert!(!plain.tok.is_eog(plain.id("<|im_start|>")));
    assert!(!plain.tok.is_eog(plain.id("hello")));
}

#[test]
fn stream_decoder_holds_partial_characters() {
    let v = build("gpt2", |_| {});
    let ids = v.tok.encode("é🚀!", false, false).unwrap();
    // Two byte tokens for é, four for the rocket, one for "!".
    assert_eq!(ids.len(), 7);
    let mut dec = StreamDecoder::new();
    let outs: Vec<String> = ids.iter().map(|&id| dec.push(&v.tok, id)).collect();
    assert_eq!(outs, ["", "é", "", "", "", "🚀", "!"]);
    assert_eq!(dec.flush(), "");
    // A dangling lead byte comes out as U+FFFD only on flush.
    let mut dec = StreamDecoder::new();
    assert_eq!(dec.push(&v.tok, ids[2]), "");
    assert_eq!(dec.flush(), "\u{FFFD}");
    // An invalid byte in the middle is replaced, the rest still flows.
    let mut dec = StreamDecoder::new();
    assert_eq!(dec.push(&v.tok, ids[1]), "\u{FFFD}");
    assert_eq!(dec.push(&v.tok, v.id("a")), "a");
}

#[test]
fn unknown_pre_tokenizer_is_an_error() {
    let mut w = GgufWriter::new();
    w.add_str("tokenizer.ggml.model", "gpt2")
        .add_str("tokenizer.ggml.pre", "no-such-thing")
        .add_str_array("tokenizer.ggml.tokens", &["a"])
        .add_str_array("tokenizer.ggml.merges", &["a a"]);
    let g = Gguf::from_bytes(w.to_bytes().unwrap()).unwrap();
    let e = Tokenizer::from_gguf(&g).unwrap_err();
    assert!(e.to_string().contains("no-such-thing"), "{e}");
}

/// A vocabulary of `specials` (control tokens), the byte alphabet, then the tokens the merge
/// rules `merges` make (in rank order, each "left right").
fn small_vocab(pre: &str, specials: &[&str], merges: &[&str]) -> Vocab {
    let mut texts: Vec<String> = specials.iter().map(|t| t.to_string()).collect();
    let mut types = vec![3; specials.len()];
    for b in 0..=255u8 {
        texts.push(byte_char(b).to_string());
        types.push(1);
    }
    for m in merges {
        texts.push(m.replace(' ', ""));
        types.push(1);
    }
    let mut w = GgufWriter::new();
    w.add_str("tokenizer.ggml.model", "gpt2")
        .add_str("tokenizer.ggml.pre", pre)
        .add_str_array("tokenizer.ggml.tokens", &texts)
        .add_i32_array("tokenizer.ggml.token_type", &types)
        .add_str_array("tokenizer.ggml.merges", merges)
        .add_u32("tokenizer.ggml.eos_token_id", 0);
    let g = Gguf::from_bytes(w.to_bytes().unwrap()).unwrap();
    Vocab {
        tok: Tokenizer::from_gguf(&g).unwrap(),
        texts,
    }
}

#[test]
fn harmony_ends_generation_at_return_and_call_and_shows_its_markers() {
    // gpt-oss's tokens, as llama.cpp treats them: `<|end|>` closes one message of a reply (the
    // reasoning), so it does not end generation where `<|return|>` and `<|call|>` do.
    let v = small_vocab(
        "gpt2",
        &[
            "<|endoftext|>",
            "<|start|>",
            "<|channel|>",
            "<|message|>",
            "<|constrain|>",
            "<|end|>",
            "<|return|>",
            "<|call|>",
        ],
        &[],
    );
    for (text, ends) in [("<|return|>", true), ("<|call|>", true), ("<|end|>", false)] {
        assert_eq!(v.tok.is_eog(v.id(text)), ends, "{text}");
    }
    // The markers and `<|end|>` are in the reply's text, for the harmony parser to read.
    let ids = v.ids(&[
        "<|channel|>",
        "a",
        "<|message|>",
        "b",
        "<|end|>",
        "<|start|>",
    ]);
    assert_eq!(
        v.tok.decode(&ids),
        "<|channel|>a<|message|>b<|end|><|start|>"
    );
    assert_eq!(v.tok.decode(&v.ids(&["<|return|>"])), "");
    // Without `<|call|>` (not a harmony vocabulary), `<|end|>` ends generation as before.
    let other = small_vocab("gpt2", &["<|endoftext|>", "<|end|>", "<|return|>"], &[]);
    assert!(other.tok.is_eog(other.id("<|end|>")));
}

#[test]
fn gpt_4o_pre_tokenizer_splits_words_at_case_and_numbers_by_three() {
    // gpt-oss's (o200k) pre-tokenizer, as llama.cpp runs it: a word is its capitals then its
    // lower-case letters ("o" and "Wab" in "oWab", so "o W" cannot merge), optional contraction
    // after; numbers in groups of three ("121", "2"); no space clean-up.
    let merges = ["o W", "a b", "1 2", "2 1"];
    let v = small_vocab("gpt-4o", &["<|endoftext|>"], &merges);
    assert_eq!(
        v.tok.encode("oWab", false, false).unwrap(),
        v.ids(&["o", "W", "ab"])
    );
    assert_eq!(
        v.tok.encode("1212", false, false).unwrap(),
        v.ids(&["12", "1", "2"])
    );
    // GPT-2's regex keeps both whole: "oW" merges, and "12" twice.
    let gpt2 = small_vocab("gpt2", &["<|endoftext|>"], &merges);
    assert_eq!(
        gpt2.tok.encode("oWab", false, false).unwrap(),
        gpt2.ids(&["oW", "ab"])
    );
    assert_eq!(
        gpt2.tok.encode("1212", false, false).unwrap(),
        gpt2.ids(&["12", "12"])
    );
    for name in ["gpt-4o", "llama4"] {
        let v = small_vocab(name, &["<|endoftext|>"], &merges);
        let text = "It's 2024 ab , x";
        assert_eq!(
            v.tok.decode(&v.tok.encode(text, false, false).unwrap()),
            text
        );
    }
}
