//! Tokenizer parity with llama.cpp on the real SmolLM2 vocabulary (skipped when the model file is
//! absent): every fixture line must tokenize to exactly the recorded ids.

mod common;

use common::real_model_path;

use std::path::PathBuf;

use engine::gguf::Gguf;
use engine::tokenizer::{StreamDecoder, Tokenizer};

fn fixture(name: &str) -> Vec<serde_json::Value> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    let text = std::fs::read_to_string(&path).expect("fixture readable");
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).expect("fixture line is JSON"))
        .collect()
}

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .expect("ids array")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

fn load() -> Option<Tokenizer> {
    let path = real_model_path()?;
    let g = Gguf::open(&path).expect("model opens");
    Some(Tokenizer::from_gguf(&g).expect("tokenizer builds"))
}

fn check_cases(tok: &Tokenizer, cases: &[(String, Vec<u32>)]) {
    let mut failures = Vec::new();
    for (text, want) in cases {
        let got = tok.encode(text, false, true).expect("encode");
        if &got != want {
            failures.push(format!("{text:?}\n  want {want:?}\n  got  {got:?}"));
        }
        assert_eq!(
            &tok.decode_special(want),
            text,
            "decode of the ids of {text:?}"
        );
    }
    assert!(
        failures.is_empty(),
        "tokenization differs:\n{}",
        failures.join("\n")
    );
}

#[test]
fn tok_visible_fixture_matches_llama_cpp() {
    let Some(tok) = load() else { return };
    let cases: Vec<(String, Vec<u32>)> = fixture("tok_visible.jsonl")
        .iter()
        .map(|v| (v["text"].as_str().unwrap().to_string(), ids(&v["ids"])))
        .collect();
    assert!(!cases.is_empty());
    check_cases(&tok, &cases);
}

#[test]
fn golden_prompts_match_llama_cpp() {
    let Some(tok) = load() else { return };
    let cases: Vec<(String, Vec<u32>)> = fixture("golden_visible.jsonl")
        .iter()
        .map(|v| {
            (
                v["prompt"].as_str().unwrap().to_string(),
                ids(&v["prompt_ids"]),
            )
        })
        .collect();
    assert!(!cases.is_empty());
    // The recorded prompts were tokenized with add_special, which adds nothing for SmolLM2.
    assert!(!tok.add_bos());
    check_cases(&tok, &cases);
}

#[test]
fn special_tokens_and_eog() {
    let Some(tok) = load() else { return };
    assert_eq!(tok.n_vocab(), 49152);
    assert_eq!(tok.bos(), Some(1));
    assert_eq!(tok.eos(), Some(2));
    assert!(tok.is_eog(2), "<|im_end|>");
    assert!(tok.is_eog(0), "<|endoftext|>");
    assert!(!tok.is_eog(1));
    assert!(!tok.is_eog(504));
    // Without parse_special the markers are plain text.
    let plain = tok.encode("<|im_start|>", false, false).unwrap();
    assert!(plain.len() > 1 && !plain.contains(&1), "{plain:?}");
    assert_eq!(tok.decode(&plain), "<|im_start|>");
    // Control tokens print nothing in decode but keep their text as bytes.
    assert_eq!(tok.decode(&[1, 4093]), "user");
    assert_eq!(tok.token_bytes(1), b"<|im_start|>");
}

#[test]
fn greedy_text_decodes_and_streams() {
    let Some(tok) = load() else { return };
    for v in fixture("golden_visible.jsonl") {
        let ids = ids(&v["greedy"]);
        let want = v["greedy_text"].as_str().unwrap();
        assert_eq!(tok.decode(&ids), want);
        let mut dec = StreamDecoder::new();
        let mut streamed = String::new();
        for &id in &ids {
            streamed.push_str(&dec.push(&tok, id));
        }
        streamed.push_str(&dec.flush());
        assert_eq!(streamed, want);
    }
}

#[test]
fn stream_decoder_never_splits_a_character() {
    let Some(tok) = load() else { return };
    // Emoji and CJK are split across byte-level tokens in this vocabulary.
    let text = "emoji 🚀🔥👍🏽 日本語のテキスト";
    let ids = tok.encode(text, false, false).unwrap();
    let mut dec = StreamDecoder::new();
    let mut out = String::new();
    for &id in &ids {
        let piece = dec.push(&tok, id);
        assert!(!piece.contains('\u{FFFD}'), "split character in {piece:?}");
        out.push_str(&piece);
    }
    assert_eq!(dec.flush(), "");
    assert_eq!(out, text);
}

#[test]
fn long_prompt_tokenizes_fast() {
    let Some(tok) = load() else { return };
    let para =
        "The quick brown fox jumps over the lazy dog; it's 12345 times faster — naïve café. ";
    let text = para.repeat(30);
    let start = std::time::Instant::now();
    let ids = tok.encode(&text, false, true).unwrap();
    let elapsed = start.elapsed();
    assert!(ids.len() > 500, "{}", ids.len());
    assert_eq!(tok.decode(&ids), text);
    eprintln!("{} tokens in {elapsed:?}", ids.len());
    // Generous bound so that unoptimised test builds pass; release is far below 10 ms.
    assert!(elapsed.as_millis() < 500, "{elapsed:?}");
}
