//! Arbitrary bytes through a real vocabulary: encoding and decoding never panic; for valid UTF-8,
//! decoding the encoding gives the text back and the streaming decoder agrees with `decode`.
//!
//! A vocabulary may lack the token of a byte (SmolLM2's has none for 0x04, 0x06, 0x13, 0x14,
//! 0x16, 0x1D, 0xF1 and 0xF2, among bytes valid UTF-8 uses): like llama.cpp, encoding drops such a
//! byte, so the text comes back whole only when each of its characters does on its own.
//!
//! The vocabulary is the GGUF named by `ENGINE_FUZZ_VOCAB` (default: the vocabulary-only file
//! written by `make_seeds.py`, `seeds/vocab.gguf`).

#![no_main]

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use engine::gguf::Gguf;
use engine::tokenizer::{StreamDecoder, Tokenizer};
use libfuzzer_sys::fuzz_target;

fn tokenizer() -> &'static Tokenizer {
    static TOK: OnceLock<Tokenizer> = OnceLock::new();
    TOK.get_or_init(|| {
        let path = std::env::var("ENGINE_FUZZ_VOCAB").unwrap_or_else(|_| "seeds/vocab.gguf".into());
        let g = Gguf::open(std::path::Path::new(&path)).expect("the fuzz vocabulary opens");
        Tokenizer::from_gguf(&g).expect("the fuzz vocabulary loads")
    })
}

fuzz_target!(|data: &[u8]| {
    let tok = tokenizer();
    // Arbitrary ids (some out of range) decode without panicking.
    let ids: Vec<u32> = data
        .chunks(2)
        .map(|c| u32::from(c[0]) << 8 | u32::from(*c.get(1).unwrap_or(&0)))
        .map(|x| x * 2 % (tok.n_vocab() as u32 + 16))
        .collect();
    let _ = tok.decode(&ids);
    let _ = tok.decode_special(&ids);
    let mut stream = StreamDecoder::new();
    for &id in &ids {
        let _ = stream.push(tok, id);
    }
    let _ = stream.flush();

    let text = String::from_utf8_lossy(data);
    // Whether every character has tokens for its bytes (each character's answer is computed once
    // per process: the vocabulary never changes).
    let representable = || {
        static SEEN: OnceLock<Mutex<HashMap<char, bool>>> = OnceLock::new();
        let mut seen = SEEN.get_or_init(Default::default).lock().expect("not poisoned");
        text.chars().all(|c| {
            *seen.entry(c).or_insert_with(|| {
                let one = c.to_string();
                let ids = tok.encode(&one, false, false).expect("encodes");
                tok.decode(&ids) == one
            })
        })
    };
    for parse_special in [false, true] {
        let ids = tok.encode(&text, false, parse_special).expect("encodes");
        assert!(ids.iter().all(|&id| (id as usize) < tok.n_vocab()));
        if parse_special {
            let back = tok.decode_special(&ids);
            assert!(back == text || !representable(), "{ids:?}");
        } else {
            // Byte-level BPE without space clean-up (SmolLM's "smollm" pre-tokenizer) is exact.
            let back = tok.decode(&ids);
            assert!(back == text || !representable(), "{ids:?}");
            let mut stream = StreamDecoder::new();
            let mut streamed: String = ids.iter().map(|&id| stream.push(tok, id)).collect();
            streamed.push_str(&stream.flush());
            assert_eq!(streamed, back);
        }
    }
});
