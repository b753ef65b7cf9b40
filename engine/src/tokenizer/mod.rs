//! Tokenizers built from a GGUF file's `tokenizer.ggml.*` metadata, matching llama.cpp's
//! `llama-vocab.cpp` token for token.
//!
//! Two models are supported:
//!
//! - **Byte-level BPE** (`tokenizer.ggml.model = "gpt2"`). The text is split by the pre-tokenizer
//!   regexes named by `tokenizer.ggml.pre` (each regex refines the pieces of the previous one; text
//!   between matches stays a piece of its own), each piece's bytes are mapped to the GPT-2
//!   byte-to-unicode alphabet, and the pair with the lowest rank in `tokenizer.ggml.merges` is
//!   merged repeatedly (ties: leftmost first). A final symbol that is not in the vocabulary falls
//!   back to its single bytes that are.
//! - **SentencePiece** (`tokenizer.ggml.model = "llama"`). Spaces become `▁` (with a leading one
//!   when `add_space_prefix` and the fragment starts the text or follows a special token), the text
//!   is split into characters, and the adjacent pair whose concatenation is the vocabulary token
//!   with the highest score is merged repeatedly (ties: leftmost first). Characters that never form
//!   a token are emitted as `<0xXX>` byte tokens.
//!
//! Before either, special tokens (types control, user-defined and unknown; control and unknown only
//! when `parse_special`) are cut out of the text, longest first, as llama.cpp does.

//!
//! Files: `vocab` (loading the vocabulary and special tokens), `pretok` (the pre-tokenizer table),
//! `bpe` and `spm` (the two models), `merge` (the merge loop they share) and `stream`
//! ([`StreamDecoder`]).

#![forbid(unsafe_code)]

use std::collections::HashMap;

mod bpe;
mod merge;
mod pretok;
mod spm;
mod stream;
mod vocab;

pub use stream::StreamDecoder;

use crate::Result;
use bpe::Bpe;
use vocab::{attr, TokenData};

enum Model {
    Bpe(Box<Bpe>),
    Spm,
}

/// A tokenizer built from a GGUF vocabulary. See the module docs for the algorithms.
pub struct Tokenizer {
    model: Model,
    tokens: Vec<TokenData>,
    token_to_id: HashMap<String, u32>,
    /// Each token's piece as llama.cpp's `token_to_piece(special = true)` gives it.
    pieces: Vec<Vec<u8>>,
    /// Ids of control, user-defined and unknown tokens, longest text first.
    special_cache: Vec<u32>,
    eog: Vec<u32>,
    bos: Option<u32>,
    eos: Option<u32>,
    eot: Option<u32>,
    unk: Option<u32>,
    add_bos: bool,
    add_eos: bool,
    add_space_prefix: bool,
    clean_spaces: bool,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field(
                "model",
                &match self.model {
                    Model::Bpe(_) => "bpe",
                    Model::Spm => "spm",
                },
            )
            .field("n_vocab", &self.tokens.len())
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .field("add_bos", &self.add_bos)
            .finish()
    }
}

impl Tokenizer {
    /// Number of tokens in the vocabulary.
    pub fn n_vocab(&self) -> usize {
        self.tokens.len()
    }

    /// The beginning-of-sequence token.
    pub fn bos(&self) -> Option<u32> {
        self.bos
    }

    /// The end-of-sequence token.
    pub fn eos(&self) -> Option<u32> {
        self.eos
    }

    /// The end-of-turn token (from `tokenizer.ggml.eot_token_id` or found by its text).
    pub fn eot(&self) -> Option<u32> {
        self.eot
    }

    /// The unknown token.
    pub fn unk(&self) -> Option<u32> {
        self.unk
    }

    /// Whether `encode(.., add_special = true, ..)` prepends BOS.
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// Whether `encode(.., add_special = true, ..)` appends EOS.
    pub fn add_eos(&self) -> bool {
        self.add_eos
    }

    /// Whether `id` ends generation: EOS, EOT, EOM and the tokens llama.cpp recognises by text
    /// (`<|im_end|>`, `<|endoftext|>`, `<|eot_id|>`, ...).
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.binary_search(&id).is_ok()
    }

    /// All end-of-generation tokens, ascending.
    pub fn eog_tokens(&self) -> &[u32] {
        &self.eog
    }

    /// Whether `id` is a control token (its text is not printed by [`decode`](Self::decode)).
    pub fn is_control(&self, id: u32) -> bool {
        self.tokens
            .get(id as usize)
            .is_some_and(|t| t.attr & attr::CONTROL != 0)
    }

    /// The token's vocabulary text as stored in the GGUF (byte-level or `▁` form).
    pub fn token_text(&self, id: u32) -> &str {
        self.tokens.get(id as usize).map_or("", |t| t.text.as_str())
    }

    /// The id of a vocabulary text.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.token_to_id.get(text).copied()
    }

    /// The token's piece as raw bytes: byte-level BPE decoded, SPM `▁` as a space, `<0xXX>` as
    /// that byte, and control/user-defined tokens as their text. Empty for unknown ids.
    pub fn token_bytes(&self, id: u32) -> &[u8] {
        self.pieces.get(id as usize).map_or(&[], |p| p.as_slice())
    }

    /// The bytes [`decode`](Self::decode) and [`StreamDecoder`] print for a token: its piece,
    /// or nothing for control and unknown tokens (llama.cpp's `special = false`).
    pub fn visible_bytes(&self, id: u32) -> &[u8] {
        match self.tokens.get(id as usize) {
            Some(t) if t.attr & (attr::CONTROL | attr::UNKNOWN) == 0 => self.token_bytes(id),
            _ => &[],
        }
    }

    ///
    /// `add_special` prepends BOS / appends EOS as `tokenizer.ggml.add_bos_token` /
    /// `add_eos_token` say. `parse_special` recognises control tokens written in the text (e.g.
    /// `<|im_start|>`); user-defined tokens are always recognised, as in llama.cpp.
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Result<Vec<u32>> {
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if add_special && self.add_bos {
            out.extend(self.bos);
        }
        let fragments = self.partition(text, parse_special);
        let mut prev_special = true;
        for frag in fragments {
            match frag {
                Fragment::Token(id) => {
                    out.push(id);
                    prev_special = true;
                }
                Fragment::Text(start, end) => {
                    let piece = &text[start..end];
                    match &self.model {
                        Model::Bpe(bpe) => bpe.encode(self, piece, &mut out),
                        Model::Spm => {
                            let mut s = String::with_capacity(piece.len() + 4);
                            if self.add_space_prefix && prev_special {
                                s.push(' ');
                            }
                            s.push_str(piece);
                            self.spm_encode(&s.replace(' ', "\u{2581}"), &mut out)?;
                        }
                    }
                    prev_special = false;
                }
            }
        }
        if add_special && self.add_eos {
            out.extend(self.eos);
        }
        Ok(out)
    }

    /// Splits `text` around special tokens, longest token first (llama.cpp's
    /// `tokenizer_st_partition`).
    fn partition(&self, text: &str, parse_special: bool) -> Vec<Fragment> {
        let mut frags = Vec::new();
        if text.is_empty() {
            return frags;
        }
        frags.push(Fragment::Text(0, text.len()));
        for &id in &self.special_cache {
            let t = &self.tokens[id as usize];
            if !parse_special && t.attr & (attr::CONTROL | attr::UNKNOWN) != 0 {
                continue;
            }
            let needle = t.text.as_str();
            if !frags.iter().any(|f| match *f {
                Fragment::Text(s, e) => text[s..e].contains(needle),
                Fragment::Token(_) => false,
            }) {
                continue;
            }
            let mut next = Vec::with_capacity(frags.len() + 2);
            for f in frags {
                let Fragment::Text(mut s, e) = f else {
                    next.push(f);
                    continue;
                };
                while let Some(pos) = text[s..e].find(needle) {
                    if pos > 0 {
                        next.push(Fragment::Text(s, s + pos));
                    }
                    next.push(Fragment::Token(id));
                    s += pos + needle.len();
                }
                if s < e {
                    next.push(Fragment::Text(s, e));
                }
            }
            frags = next;
        }
        frags
    }

    /// unparse_special = false)`: control and unknown tokens print nothing, a vocabulary with
    /// `add_space_prefix` drops one leading space of the first token, and vocabularies that ask for
    /// it (`clean_spaces`, e.g. pre-tokenizer "gpt2"/"default") get llama.cpp's space clean-up
    /// before `?!.,` and contractions. Invalid UTF-8 becomes U+FFFD.
    pub fn decode(&self, ids: &[u32]) -> String {
        self.detokenize(ids, false)
    }

    /// Like [`decode`](Self::decode), but control and unknown tokens print their text
    /// (llama.cpp's `unparse_special = true`), so `decode_special(encode(s, false, true)) == s`.
    pub fn decode_special(&self, ids: &[u32]) -> String {
        self.detokenize(ids, true)
    }

    fn detokenize(&self, ids: &[u32], special: bool) -> String {
        let mut bytes = Vec::new();
        for (i, &id) in ids.iter().enumerate() {
            let mut piece = if special {
                self.token_bytes(id)
            } else {
                self.visible_bytes(id)
            };
            if i == 0 && self.add_space_prefix {
                piece = piece.strip_prefix(b" ").unwrap_or(piece);
            }
            bytes.extend_from_slice(piece);
        }
        if self.clean_spaces {
            bytes = clean_up_spaces(&bytes);
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

/// llama.cpp's `clean_up_tokenization_spaces`: three passes over the bytes.
fn clean_up_spaces(text: &[u8]) -> Vec<u8> {
    // Pass 1: drop a space before ? ! . ,
    let mut a = Vec::with_capacity(text.len());
    for (i, &x) in text.iter().enumerate() {
        if i > 0 && text[i - 1] == b' ' && matches!(x, b'?' | b'!' | b'.' | b',') {
            a.pop();
        }
        a.push(x);
    }
    // Pass 2: " ' " becomes "'"; the removed following space cannot start another match.
    let mut b = Vec::with_capacity(a.len());
    let mut src = a;
    let mut i = 0;
    while i < src.len() {
        let x = src[i];
        if i > 0 && x == b'\'' && i + 1 < src.len() && src[i - 1] == b' ' && src[i + 1] == b' ' {
            b.pop();
            src[i + 1] = 0;
            b.push(x);
            i += 2;
            continue;
        }
        b.push(x);
        i += 1;
    }
    // Pass 3: drop the space before 's 'm 're 've.
    let mut c = Vec::with_capacity(b.len());
    for (i, &x) in b.iter().enumerate() {
        if i > 0 && b[i - 1] == b' ' && x == b'\'' && i + 1 < b.len() {
            let x1 = b[i + 1];
            let x2 = b.get(i + 2).copied();
            let drop = matches!(x1, b's' | b'm')
                || (!matches!(x1, b't' | b'd')
                    && matches!((x1, x2), (b'r', Some(b'e')) | (b'v', Some(b'e'))));
            if drop {
                c.pop();
            }
        }
        c.push(x);
    }
    c
}

#[derive(Clone, Copy, Debug)]
enum Fragment {
    Text(usize, usize),
    Token(u32),
}
