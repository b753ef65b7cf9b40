//! Byte-level BPE (`tokenizer.ggml.model = "gpt2"`): the text is split by the pre-tokenizer,
//! each word's bytes are mapped to the GPT-2 byte alphabet, and adjacent symbols are merged by
//! rank (lowest first, ties leftmost) with the shared [`merge`](super::merge) loop. A final symbol
//! that is not in the vocabulary falls back to its single bytes that are.

use std::cmp::Reverse;
use std::collections::HashMap;

use super::merge::{MergeRule, Merger};
use super::pretok::{byte_to_char_table, PreTokenizer, Splitter};
use super::Tokenizer;
use crate::gguf::Gguf;
use crate::Result;

/// Byte-level BPE state.
pub(super) struct Bpe {
    splitter: Splitter,
    ignore_merges: bool,
    /// Ids of the strings that occur on either side of a merge rule.
    side_ids: HashMap<String, u32>,
    /// Merge rank by (left side id, right side id).
    ranks: HashMap<(u32, u32), u32>,
    byte_to_char: [char; 256],
    pub(super) char_to_byte: HashMap<char, u8>,
}

/// BPE merges: a symbol's tag is its side id; lower ranks merge first.
impl MergeRule for Bpe {
    type Priority = Reverse<u32>;
    type Tag = Option<u32>;

    fn tag(&self, text: &str) -> Option<u32> {
        self.side_ids.get(text).copied()
    }

    fn priority(
        &self,
        left: Option<u32>,
        right: Option<u32>,
        _joined: &str,
    ) -> Option<Reverse<u32>> {
        let rank = self.ranks.get(&(left?, right?))?;
        Some(Reverse(*rank))
    }
}

impl Bpe {
    pub(super) fn new(g: &Gguf, pre: &PreTokenizer) -> Result<Bpe> {
        let splitter = pre.splitter()?;
        let merges = g.get_strs("tokenizer.ggml.merges")?;
        let mut side_ids: HashMap<String, u32> = HashMap::with_capacity(merges.len());
        let mut ranks = HashMap::with_capacity(merges.len());
        for (rank, m) in merges.iter().enumerate() {
            // Split at the first space after the first byte, as llama.cpp does.
            let space = m.bytes().skip(1).position(|b| b == b' ');
            let Some(pos) = space.map(|p| p + 1) else {
                continue;
            };
            let (left, right) = (&m[..pos], &m[pos + 1..]);
            let mut intern = |s: &str| {
                let next = side_ids.len() as u32;
                *side_ids.entry(s.to_string()).or_insert(next)
            };
            let key = (intern(left), intern(right));
            ranks.entry(key).or_insert(rank as u32);
        }
        let byte_to_char = byte_to_char_table();
        let char_to_byte = byte_to_char
            .iter()
            .enumerate()
            .map(|(b, &c)| (c, b as u8))
            .collect();
        Ok(Bpe {
            splitter,
            ignore_merges: pre.ignore_merges,
            side_ids,
            ranks,
            byte_to_char,
            char_to_byte,
        })
    }

    pub(super) fn encode(&self, tok: &Tokenizer, text: &str, out: &mut Vec<u32>) {
        let mut word = String::new();
        let mut merger = Merger::default();
        for (s, e) in self.splitter.split(text) {
            word.clear();
            for &b in &text.as_bytes()[s..e] {
                word.push(self.byte_to_char[b as usize]);
            }
            if self.ignore_merges {
                if let Some(&id) = tok.token_to_id.get(word.as_str()) {
                    out.push(id);
                    continue;
                }
            }
            let merged = merger.merge_word(self, &word, |piece| {
                match tok.token_to_id.get(piece) {
                    Some(&id) => out.push(id),
                    None => {
                        // llama.cpp looks up each single byte of the encoded text; only ASCII
                        // bytes can be tokens.
                        for &b in piece.as_bytes().iter().filter(|b| b.is_ascii()) {
                            let one = [b];
                            let s = std::str::from_utf8(&one).unwrap_or_default();
                            if let Some(&id) = tok.token_to_id.get(s) {
                                out.push(id);
                            }
                        }
                    }
                }
                Ok::<(), std::convert::Infallible>(())
            });
            // The callback never fails.
            let Ok(()) = merged;
        }
    }
}
