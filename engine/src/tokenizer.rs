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

#![forbid(unsafe_code)]

use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, HashMap};

use fancy_regex::Regex;

use crate::gguf::{Gguf, MetaValue};
use crate::{Error, Result};

/// Token attribute bits, as llama.cpp derives them from `tokenizer.ggml.token_type`.
mod attr {
    pub const UNDEFINED: u8 = 0;
    pub const UNKNOWN: u8 = 1 << 0;
    pub const UNUSED: u8 = 1 << 1;
    pub const NORMAL: u8 = 1 << 2;
    pub const CONTROL: u8 = 1 << 3;
    pub const USER_DEFINED: u8 = 1 << 4;
    pub const BYTE: u8 = 1 << 5;

    /// From a GGUF token type (1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte).
    pub fn from_token_type(t: i64) -> u8 {
        match t {
            1 => NORMAL,
            2 => UNKNOWN,
            3 => CONTROL,
            4 => USER_DEFINED,
            5 => UNUSED,
            6 => BYTE,
            _ => UNDEFINED,
        }
    }
}

/// Token texts that end generation (llama.cpp's list, matched on the token text).
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
];

/// Token texts that llama.cpp takes as the end-of-turn token when the GGUF names none.
const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];

/// Texts of fill-in-the-middle pad / repo / file-separator tokens; llama.cpp makes them control
/// tokens that end generation.
const FIM_END_TEXTS: [&[&str]; 3] = [
    &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"],
    &[
        "<|fim_repo|>",
        "<|repo_name|>",
        "<fim-repo>",
        "<REPO>",
        "<reponame>",
    ],
    &["<|file_sep|>"],
];

/// The GPT-2 pre-tokenizer regex.
const RE_GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
/// The Llama 3 pre-tokenizer regex (case-insensitive contractions spelled out).
const RE_LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// The Qwen2 pre-tokenizer regex: like Llama 3 but one digit per piece.
const RE_QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Pre-tokenizer settings for a `tokenizer.ggml.pre` value: regexes, whether a word that is
/// already a token skips merging, whether BOS is added by default, and whether decoding cleans up
/// spaces before punctuation.
struct PreTokenizer {
    regexes: &'static [&'static str],
    ignore_merges: bool,
    add_bos: bool,
    clean_spaces: bool,
}

fn pre_tokenizer(name: &str) -> Result<PreTokenizer> {
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
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "pixtral" => {
            pre(&[RE_LLAMA3], true, true, true)
        }
        "qwen2" | "deepseek-r1-qwen" => pre(&[RE_QWEN2], false, false, false),
        "stablelm2" => pre(&[RE_QWEN2], false, false, true),
        "smollm" | "command-r" => pre(&[r"\p{N}", RE_GPT2], false, false, false),
        "starcoder" | "refact" | "codeshell" | "exaone" | "minerva-7b" => {
            pre(&[r"\p{N}", RE_GPT2], false, false, true)
        }
        "gpt2" | "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "mpt" | "olmo" | "jais" => {
            pre(&[RE_GPT2], false, false, true)
        }
        other => {
            return Err(Error::Tokenizer(format!(
                "unknown pre-tokenizer type '{other}'"
            )))
        }
    })
}

/// The GPT-2 byte-to-unicode alphabet: printable bytes map to themselves, the others to
/// U+0100 onwards in byte order.
fn byte_to_char_table() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut next = 256u32;
    for b in 0..=255u8 {
        let printable = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        table[b as usize] = if printable {
            char::from(b)
        } else {
            let c = char::from_u32(next).expect("U+0100..U+0143 are chars");
            next += 1;
            c
        };
    }
    table
}

#[derive(Debug)]
struct TokenData {
    text: String,
    score: f32,
    attr: u8,
}

/// Byte-level BPE state.
struct Bpe {
    regexes: Vec<Regex>,
    ignore_merges: bool,
    /// Ids of the strings that occur on either side of a merge rule.
    side_ids: HashMap<String, u32>,
    /// Merge rank by (left side id, right side id).
    ranks: HashMap<(u32, u32), u32>,
    byte_to_char: [char; 256],
    char_to_byte: HashMap<char, u8>,
}

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

fn int_array(g: &Gguf, key: &str) -> Result<Option<Vec<i64>>> {
    match g.get(key) {
        None => Ok(None),
        Some(v) => {
            let items = g.get_array(key)?;
            items
                .iter()
                .map(|i| i.as_i64())
                .collect::<Option<Vec<_>>>()
                .map(Some)
                .ok_or_else(|| Error::KeyType {
                    key: key.to_string(),
                    expected: "array of integers",
                    found: format!(
                        "{} {}",
                        v.type_name(),
                        items.first().map_or("", MetaValue::type_name)
                    ),
                })
        }
    }
}

fn optional_id(g: &Gguf, key: &str, n_vocab: usize) -> Result<Option<Option<u32>>> {
    match g.get(key) {
        None => Ok(None),
        Some(_) => {
            let id = g.get_u32(key)?;
            // llama.cpp ignores an out-of-range id and keeps the default.
            Ok(((id as usize) < n_vocab).then_some(Some(id)))
        }
    }
}

impl Tokenizer {
    /// Builds the tokenizer from `tokenizer.ggml.*` metadata.
    pub fn from_gguf(g: &Gguf) -> Result<Tokenizer> {
        let model_name = g.get_str("tokenizer.ggml.model")?;
        let texts = g.get_array("tokenizer.ggml.tokens")?;
        let n_vocab = texts.len();
        if n_vocab == 0 || n_vocab > u32::MAX as usize {
            return Err(Error::Tokenizer(format!("vocabulary of {n_vocab} tokens")));
        }
        let scores: Option<Vec<f32>> = match g.get("tokenizer.ggml.scores") {
            None => None,
            Some(_) => {
                let items = g.get_array("tokenizer.ggml.scores")?;
                Some(
                    items
                        .iter()
                        .map(|v| v.as_f64().or_else(|| v.as_i64().map(|i| i as f64)))
                        .map(|v| v.map(|x| x as f32))
                        .collect::<Option<Vec<f32>>>()
                        .ok_or_else(|| {
                            Error::Tokenizer("tokenizer.ggml.scores holds non-numbers".into())
                        })?,
                )
            }
        };
        let types = int_array(g, "tokenizer.ggml.token_type")?;
        if scores.as_ref().is_some_and(|s| s.len() < n_vocab)
            || types.as_ref().is_some_and(|t| t.len() < n_vocab)
        {
            return Err(Error::Tokenizer(
                "scores or token types shorter than the vocabulary".into(),
            ));
        }

        let mut tokens = Vec::with_capacity(n_vocab);
        let mut token_to_id = HashMap::with_capacity(n_vocab);
        for (i, v) in texts.iter().enumerate() {
            let mut text = v
                .as_str()
                .ok_or_else(|| {
                    Error::Tokenizer(format!("tokenizer.ggml.tokens[{i}] is not a string"))
                })?
                .to_string();
            if text.is_empty() {
                text = format!("[EMPTY_{i}]");
            }
            token_to_id.insert(text.clone(), i as u32);
            tokens.push(TokenData {
                text,
                score: scores.as_ref().map_or(0.0, |s| s[i]),
                attr: types
                    .as_ref()
                    .map_or(attr::NORMAL, |t| attr::from_token_type(t[i])),
            });
        }

        let (model, mut bos, mut eos, mut unk, mut add_bos, mut add_space_prefix, clean_spaces) =
            match model_name {
                "gpt2" => {
                    let pre_name = match g.get("tokenizer.ggml.pre") {
                        Some(_) => g.get_str("tokenizer.ggml.pre")?,
                        None => "default",
                    };
                    let pre = pre_tokenizer(pre_name)?;
                    let bpe = Bpe::new(g, &pre)?;
                    let default_special = (11 < n_vocab).then_some(11);
                    (
                        Model::Bpe(Box::new(bpe)),
                        default_special,
                        default_special,
                        None,
                        pre.add_bos,
                        false,
                        pre.clean_spaces,
                    )
                }
                "llama" => (
                    Model::Spm,
                    (1 < n_vocab).then_some(1),
                    (2 < n_vocab).then_some(2),
                    Some(0),
                    true,
                    true,
                    false,
                ),
                other => {
                    return Err(Error::Tokenizer(format!(
                        "unsupported tokenizer model '{other}'"
                    )))
                }
            };
        if let Some(id) = optional_id(g, "tokenizer.ggml.bos_token_id", n_vocab)? {
            bos = id;
        }
        if let Some(id) = optional_id(g, "tokenizer.ggml.eos_token_id", n_vocab)? {
            eos = id;
        }
        if let Some(id) = optional_id(g, "tokenizer.ggml.unknown_token_id", n_vocab)? {
            unk = id;
        }
        let mut eot = optional_id(g, "tokenizer.ggml.eot_token_id", n_vocab)?.flatten();
        let mut eom = optional_id(g, "tokenizer.ggml.eom_token_id", n_vocab)?.flatten();
        if g.get("tokenizer.ggml.add_bos_token").is_some() {
            add_bos = g.get_bool("tokenizer.ggml.add_bos_token")?;
        }
        let add_eos = match g.get("tokenizer.ggml.add_eos_token") {
            Some(_) => g.get_bool("tokenizer.ggml.add_eos_token")?,
            None => false,
        };
        if g.get("tokenizer.ggml.add_space_prefix").is_some() {
            add_space_prefix = g.get_bool("tokenizer.ggml.add_space_prefix")?;
        }

        // Special tokens found by their text, as llama.cpp does; they become control tokens.
        let mut by_text: Vec<(&str, u32)> = token_to_id
            .iter()
            .map(|(t, &id)| (t.as_str(), id))
            .collect();
        by_text.sort_unstable_by_key(|&(_, id)| id);
        let mut make_control = Vec::new();
        for &(text, id) in &by_text {
            if eot.is_none() && EOT_TEXTS.contains(&text) {
                eot = Some(id);
                make_control.push(id);
            }
            if eom.is_none() && text == "<|eom_id|>" {
                eom = Some(id);
                make_control.push(id);
            }
        }
        let mut eog = Vec::new();
        let fim_keys = [
            "tokenizer.ggml.fim_pad_token_id",
            "tokenizer.ggml.fim_rep_token_id",
            "tokenizer.ggml.fim_sep_token_id",
        ];
        for (key, texts) in fim_keys.into_iter().zip(FIM_END_TEXTS) {
            let mut id = optional_id(g, key, n_vocab)?.flatten();
            if id.is_none() {
                id = by_text
                    .iter()
                    .find(|(t, _)| texts.contains(t))
                    .map(|&(_, id)| id);
                make_control.extend(id);
            }
            eog.extend(id);
        }
        for &(text, id) in &by_text {
            if EOG_TEXTS.contains(&text) {
                eog.push(id);
                make_control.push(id);
            }
        }
        for id in make_control {
            tokens[id as usize].attr |= attr::CONTROL;
        }
        eog.extend([eos, eot, eom].into_iter().flatten());
        eog.sort_unstable();
        eog.dedup();

        let mut special_cache: Vec<u32> = (0..n_vocab as u32)
            .filter(|&id| {
                tokens[id as usize].attr & (attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN) != 0
            })
            .collect();
        special_cache.sort_by_key(|&id| Reverse(tokens[id as usize].text.len()));

        let mut tok = Tokenizer {
            model,
            tokens,
            token_to_id,
            pieces: Vec::new(),
            special_cache,
            eog,
            bos,
            eos,
            eot,
            unk,
            add_bos,
            add_eos,
            add_space_prefix,
            clean_spaces,
        };
        if add_bos && bos.is_none() {
            return Err(Error::Tokenizer(
                "add_bos is set but there is no BOS token".into(),
            ));
        }
        if add_eos && eos.is_none() {
            return Err(Error::Tokenizer(
                "add_eos is set but there is no EOS token".into(),
            ));
        }
        tok.pieces = (0..n_vocab as u32)
            .map(|id| tok.compute_piece(id))
            .collect();
        Ok(tok)
    }

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

    fn compute_piece(&self, id: u32) -> Vec<u8> {
        let t = &self.tokens[id as usize];
        if t.attr & (attr::CONTROL | attr::UNKNOWN | attr::USER_DEFINED) != 0 {
            return t.text.as_bytes().to_vec();
        }
        if t.attr & attr::BYTE != 0 {
            return parse_byte_token(&t.text).map_or_else(Vec::new, |b| vec![b]);
        }
        if t.attr & attr::NORMAL == 0 {
            return Vec::new();
        }
        match &self.model {
            Model::Spm => t.text.replace('\u{2581}', " ").into_bytes(),
            Model::Bpe(bpe) => {
                let mut out = Vec::with_capacity(t.text.len());
                for c in t.text.chars() {
                    match bpe.char_to_byte.get(&c) {
                        Some(&b) => out.push(b),
                        // Not from the byte alphabet: keep the character itself.
                        None => out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
                    }
                }
                out
            }
        }
    }

    /// Tokenizes `text`.
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

    fn byte_token(&self, b: u8) -> Result<u32> {
        let hex = format!("<0x{b:02X}>");
        self.token_id(&hex)
            .or_else(|| {
                std::str::from_utf8(&[b])
                    .ok()
                    .and_then(|s| self.token_id(s))
            })
            .ok_or_else(|| Error::Tokenizer(format!("no byte token for 0x{b:02X}")))
    }

    /// SentencePiece merging of one whitespace-escaped fragment.
    fn spm_encode(&self, text: &str, out: &mut Vec<u32>) -> Result<()> {
        let mut syms: Vec<Symbol> = text
            .char_indices()
            .map(|(i, c)| Symbol {
                start: i,
                len: c.len_utf8(),
                prev: -1,
                next: -1,
            })
            .collect();
        link(&mut syms);
        let mut heap = BinaryHeap::new();
        let try_add = |heap: &mut BinaryHeap<SpmBigram>, syms: &[Symbol], l: isize, r: isize| {
            if l < 0 || r < 0 {
                return;
            }
            let (ls, rs) = (&syms[l as usize], &syms[r as usize]);
            let s = &text[ls.start..ls.start + ls.len + rs.len];
            if let Some(&id) = self.token_to_id.get(s) {
                heap.push(SpmBigram {
                    score: self.tokens[id as usize].score,
                    left: l as usize,
                    right: r as usize,
                    size: s.len(),
                });
            }
        };
        for i in 1..syms.len() {
            try_add(&mut heap, &syms, i as isize - 1, i as isize);
        }
        while let Some(bg) = heap.pop() {
            let (l, r) = (bg.left, bg.right);
            if syms[l].len == 0 || syms[r].len == 0 || syms[l].len + syms[r].len != bg.size {
                continue;
            }
            merge(&mut syms, l, r);
            let (prev, next) = (syms[l].prev, syms[l].next);
            try_add(&mut heap, &syms, prev, l as isize);
            try_add(&mut heap, &syms, l as isize, next);
        }
        let mut i = if syms.is_empty() { -1 } else { 0 };
        while i >= 0 {
            let s = &syms[i as usize];
            let piece = &text[s.start..s.start + s.len];
            match self.token_to_id.get(piece) {
                Some(&id) => out.push(id),
                None => {
                    for &b in piece.as_bytes() {
                        out.push(self.byte_token(b)?);
                    }
                }
            }
            i = s.next;
        }
        Ok(())
    }

    /// Detokenizes like llama.cpp's `llama_detokenize(remove_special = false,
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

fn parse_byte_token(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
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

/// A run of bytes in the text being merged, linked to its neighbours.
#[derive(Clone, Copy, Debug)]
struct Symbol {
    start: usize,
    len: usize,
    prev: isize,
    next: isize,
}

fn link(syms: &mut [Symbol]) {
    let n = syms.len() as isize;
    for (i, s) in syms.iter_mut().enumerate() {
        let i = i as isize;
        s.prev = i - 1;
        s.next = if i + 1 < n { i + 1 } else { -1 };
    }
}

/// Merges symbol `r` into its left neighbour `l`.
fn merge(syms: &mut [Symbol], l: usize, r: usize) {
    syms[l].len += syms[r].len;
    syms[r].len = 0;
    let next = syms[r].next;
    syms[l].next = next;
    if next >= 0 {
        syms[next as usize].prev = l as isize;
    }
}

/// A candidate SentencePiece merge: highest score first, then leftmost.
struct SpmBigram {
    score: f32,
    left: usize,
    right: usize,
    size: usize,
}

impl PartialEq for SpmBigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for SpmBigram {}
impl PartialOrd for SpmBigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for SpmBigram {
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then_with(|| other.left.cmp(&self.left))
    }
}

impl Bpe {
    fn new(g: &Gguf, pre: &PreTokenizer) -> Result<Bpe> {
        let regexes = pre
            .regexes
            .iter()
            .map(|r| {
                Regex::new(r).map_err(|e| Error::Tokenizer(format!("pre-tokenizer regex: {e}")))
            })
            .collect::<Result<Vec<_>>>()?;
        let merges = g.get_array("tokenizer.ggml.merges")?;
        let mut side_ids: HashMap<String, u32> = HashMap::with_capacity(merges.len());
        let mut ranks = HashMap::with_capacity(merges.len());
        for (rank, m) in merges.iter().enumerate() {
            let m = m
                .as_str()
                .ok_or_else(|| Error::Tokenizer(format!("merge {rank} is not a string")))?;
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
            regexes,
            ignore_merges: pre.ignore_merges,
            side_ids,
            ranks,
            byte_to_char,
            char_to_byte,
        })
    }

    /// Splits `text` into words with the pre-tokenizer regexes; returns byte ranges.
    fn pre_tokenize(&self, text: &str) -> Vec<(usize, usize)> {
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

    fn encode(&self, tok: &Tokenizer, text: &str, out: &mut Vec<u32>) {
        let mut word = String::new();
        let mut syms: Vec<Symbol> = Vec::new();
        let mut side: Vec<Option<u32>> = Vec::new();
        let mut heap: BinaryHeap<Reverse<(u32, usize, usize, usize)>> = BinaryHeap::new();
        for (s, e) in self.pre_tokenize(text) {
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
            syms.clear();
            syms.extend(word.char_indices().map(|(i, c)| Symbol {
                start: i,
                len: c.len_utf8(),
                prev: -1,
                next: -1,
            }));
            link(&mut syms);
            side.clear();
            side.extend(
                syms.iter()
                    .map(|s| self.side_ids.get(&word[s.start..s.start + s.len]).copied()),
            );
            heap.clear();
            let add = |heap: &mut BinaryHeap<_>,
                       syms: &[Symbol],
                       side: &[Option<u32>],
                       l: isize,
                       r: isize| {
                if l < 0 || r < 0 {
                    return;
                }
                let (l, r) = (l as usize, r as usize);
                if let (Some(a), Some(b)) = (side[l], side[r]) {
                    if let Some(&rank) = self.ranks.get(&(a, b)) {
                        heap.push(Reverse((rank, l, r, syms[l].len + syms[r].len)));
                    }
                }
            };
            for i in 1..syms.len() {
                add(&mut heap, &syms, &side, i as isize - 1, i as isize);
            }
            while let Some(Reverse((_, l, r, size))) = heap.pop() {
                if syms[l].len == 0 || syms[r].len == 0 || syms[l].len + syms[r].len != size {
                    continue;
                }
                merge(&mut syms, l, r);
                let sl = syms[l];
                side[l] = self
                    .side_ids
                    .get(&word[sl.start..sl.start + sl.len])
                    .copied();
                add(&mut heap, &syms, &side, sl.prev, l as isize);
                add(&mut heap, &syms, &side, l as isize, sl.next);
            }
            let mut i: isize = if syms.is_empty() { -1 } else { 0 };
            while i >= 0 {
                let sy = syms[i as usize];
                let piece = &word[sy.start..sy.start + sy.len];
                match tok.token_to_id.get(piece) {
                    Some(&id) => out.push(id),
                    None => {
                        // llama.cpp looks up each single byte of the encoded text; only ASCII
                        // bytes can be tokens.
                        for &b in piece.as_bytes() {
                            if b.is_ascii() {
                                if let Some(&id) =
                                    tok.token_to_id.get(std::str::from_utf8(&[b]).unwrap_or(""))
                                {
                                    out.push(id);
                                }
                            }
                        }
                    }
                }
                i = sy.next;
            }
        }
    }
}

/// Turns a stream of token ids into text without ever cutting a UTF-8 character: bytes of an
/// incomplete character are held until the token that completes it arrives.
///
/// Like [`Tokenizer::decode`], control and unknown tokens print nothing. Unlike it, no leading
/// space is stripped and no space clean-up is done (streams print pieces as they come, as
/// llama.cpp's examples do).
#[derive(Debug, Default, Clone)]
pub struct StreamDecoder {
    pending: Vec<u8>,
}

impl StreamDecoder {
    /// A decoder with nothing pending.
    pub fn new() -> StreamDecoder {
        StreamDecoder::default()
    }

    /// Adds a token; returns the text that is now complete (possibly empty).
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> String {
        self.pending.extend_from_slice(tok.visible_bytes(id));
        let mut out = String::new();
        let mut rest: &[u8] = &self.pending;
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let (valid, after) = rest.split_at(e.valid_up_to());
                    out.push_str(std::str::from_utf8(valid).unwrap_or_default());
                    match e.error_len() {
                        // An incomplete character at the end: wait for more bytes.
                        None => {
                            rest = after;
                            break;
                        }
                        Some(n) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            rest = &after[n..];
                        }
                    }
                }
            }
        }
        self.pending = rest.to_vec();
        out
    }

    /// Returns whatever is still held, with incomplete characters as U+FFFD.
    pub fn flush(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        s
    }
}
