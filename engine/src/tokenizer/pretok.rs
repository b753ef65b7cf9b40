//! The pre-tokenizer table: for each `tokenizer.ggml.pre` value, the regexes that split text into
//! words before BPE merging (as llama.cpp's `llm_tokenizer_bpe` chooses them), and the GPT-2
//! byte-to-unicode alphabet.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use fancy_regex::Regex;

use crate::error::TokenizerError;
use crate::Result;

/// The GPT-2 pre-tokenizer regex.
const RE_GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
/// The Llama 3 pre-tokenizer regex (case-insensitive contractions spelled out).
const RE_LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// The Qwen2 pre-tokenizer regex: like Llama 3 but one digit per piece.
const RE_QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The GPT-4o (o200k: gpt-oss, Llama 4) pre-tokenizer regex as llama.cpp runs it: a word's
/// capitals, then its lower-case letters (a letter outside ASCII counts as either), optional
/// contraction; numbers by three; punctuation with trailing newlines or slashes.
const RE_GPT4O: &str = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Pre-tokenizer settings for a `tokenizer.ggml.pre` value: regexes, whether a word that is
/// already a token skips merging, whether BOS is added by default, and whether decoding cleans up
/// spaces before punctuation.
pub(super) struct PreTokenizer {
    pub regexes: &'static [&'static str],
    pub ignore_merges: bool,
    pub add_bos: bool,
    pub clean_spaces: bool,
}

impl PreTokenizer {
    /// The settings for `name`, or [`TokenizerError::UnknownPreTokenizer`].
    pub(super) fn named(name: &str) -> Result<PreTokenizer> {
        let pre = |regexes, ignore_merges, add_bos, clean_spaces| PreTokenizer {
            regexes,
            ignore_merges,
            add_bos,
            clean_spaces,
        };
        Ok(match name {
            "" | "default" => pre(
                &[
                    r"[\p{P}\$\+<=>\^~\|]+",
                    RE_GPT2,
                    r"\p{N}+",
                    r"[0-9][0-9][0-9]",
                ],
                false,
                false,
                true,
            ),
            "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "pixtral" | "lfm2" => {
                pre(&[RE_LLAMA3], true, true, true)
            }
            "qwen2" | "deepseek-r1-qwen" => pre(&[RE_QWEN2], false, false, false),
            "stablelm2" => pre(&[RE_QWEN2], false, false, true),
            "gpt-4o" | "llama4" | "kanana2" | "talkie" => pre(&[RE_GPT4O], false, false, false),
            "smollm" | "command-r" => pre(&[r"\p{N}", RE_GPT2], false, false, false),
            "starcoder" | "refact" | "codeshell" | "exaone" | "minerva-7b" => {
                pre(&[r"\p{N}", RE_GPT2], false, false, true)
            }
            "gpt2" | "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "mpt" | "olmo" | "jais" => {
                pre(&[RE_GPT2], false, false, true)
            }
            other => return Err(TokenizerError::UnknownPreTokenizer(other.to_owned()).into()),
        })
    }

    /// The compiled regexes (each pattern is compiled once per process and shared: compiling
    /// the larger ones costs more than loading a small model).
    pub(super) fn splitter(&self) -> Result<Splitter> {
        type Compiled = HashMap<&'static str, Arc<Regex>>;
        static COMPILED: OnceLock<Mutex<Compiled>> = OnceLock::new();
        let mut compiled = COMPILED
            .get_or_init(Mutex::default)
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut regexes = Vec::with_capacity(self.regexes.len());
        for &pattern in self.regexes.iter() {
            if let Some(re) = compiled.get(pattern) {
                regexes.push(Arc::clone(re));
                continue;
            }
            let re = Arc::new(Regex::new(pattern).map_err(|e| TokenizerError::Regex {
                pattern,
                message: e.to_string(),
            })?);
            compiled.insert(pattern, Arc::clone(&re));
            regexes.push(re);
        }
        Ok(Splitter { regexes })
    }
}

/// Compiled pre-tokenizer regexes: each refines the pieces of the previous one; text between
/// matches stays a piece of its own.
pub(super) struct Splitter {
    regexes: Vec<Arc<Regex>>,
}

impl Splitter {
    /// Splits `text` into words with the pre-tokenizer regexes; returns byte ranges.
    pub(super) fn split(&self, text: &str) -> Vec<(usize, usize)> {
        let mut pieces = vec![(0, text.len())];
        for re in &self.regexes {
            let mut next = Vec::with_capacity(pieces.len() * 2);
            for &(s, e) in &pieces {
                let piece = &text[s..e];
                let mut last = 0;
                for m in re.find_iter(piece) {
                    // Matching cannot fail on these regexes except by backtrack limit; keep the
                    // rest of the piece whole in that case.
                    let Ok(m) = m else { break };
                    if m.start() > last {
                        next.push((s + last, s + m.start()));
                    }
                    if m.end() > m.start() {
                        next.push((s + m.start(), s + m.end()));
                    }
                    last = m.end();
                }
                if last < piece.len() {
                    next.push((s + last, e));
                }
            }
            pieces = next;
        }
        pieces
    }
}

/// The GPT-2 byte-to-unicode alphabet: printable bytes map to themselves, the others to
/// U+0100 onwards in byte order.
pub(super) fn byte_to_char_table() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut next = 256u32;
    for b in 0..=255u8 {
        let printable = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        table[b as usize] = if printable {
            char::from(b)
        } else {
            // U+0100..U+0143 are all chars.
            let c = char::from_u32(next).unwrap_or(char::REPLACEMENT_CHARACTER);
            next += 1;
            c
        };
    }
    table
}
