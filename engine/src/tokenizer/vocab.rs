//! Vocabulary loading: token texts, scores and types from `tokenizer.ggml.*`, special tokens
//! (BOS, EOS, EOT, end-of-generation set) as llama.cpp's `llama_vocab::load` finds them, and each
//! token's printable piece.

use std::cmp::Reverse;
use std::collections::HashMap;

use super::bpe::Bpe;
use super::pretok::PreTokenizer;
use super::{Model, Tokenizer};
use crate::error::TokenizerError;
use crate::gguf::{Gguf, MetaArray};
use crate::{Error, Result};

/// Token attribute bits, as llama.cpp derives them from `tokenizer.ggml.token_type`.
pub(super) mod attr {
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

#[derive(Debug)]
pub(super) struct TokenData {
    pub text: String,
    pub score: f32,
    pub attr: u8,
}

const SCORES_KEY: &str = "tokenizer.ggml.scores";
const TYPES_KEY: &str = "tokenizer.ggml.token_type";

fn int_array(g: &Gguf, key: &str) -> Result<Option<Vec<i64>>> {
    let Some(v) = g.get(key) else {
        return Ok(None);
    };
    v.as_array()
        .and_then(MetaArray::to_i64s)
        .map(Some)
        .ok_or_else(|| Error::KeyType {
            key: key.to_string(),
            expected: "array of integers",
            found: v.describe(),
        })
}

fn float_array(g: &Gguf, key: &str) -> Result<Option<Vec<f32>>> {
    let Some(v) = g.get(key) else {
        return Ok(None);
    };
    v.as_array()
        .and_then(MetaArray::to_f64s)
        .map(|v| Some(v.into_iter().map(|x| x as f32).collect()))
        .ok_or_else(|| Error::KeyType {
            key: key.to_string(),
            expected: "array of numbers",
            found: v.describe(),
        })
}

/// The id under `key`, if present (its range is checked by [`check_token_ids`]).
fn optional_id(g: &Gguf, key: &str) -> Result<Option<u32>> {
    match g.get(key) {
        None => Ok(None),
        Some(_) => g.get_u32(key).map(Some),
    }
}

/// Every `tokenizer.ggml.*_token_id` in the file must name a token of the vocabulary.
fn check_token_ids(g: &Gguf, n_vocab: usize) -> Result<()> {
    for (key, value) in g.metadata() {
        if !(key.starts_with("tokenizer.ggml.") && key.ends_with("_token_id")) {
            continue;
        }
        let id = value.as_u64().ok_or_else(|| Error::KeyType {
            key: key.to_string(),
            expected: "integer token id",
            found: value.describe(),
        })?;
        if id >= n_vocab as u64 {
            return Err(TokenizerError::TokenIdOutOfRange {
                key: key.to_string(),
                id,
                n_vocab,
            }
            .into());
        }
    }
    Ok(())
}

impl Tokenizer {
    /// Builds the tokenizer from `tokenizer.ggml.*` metadata.
    pub fn from_gguf(g: &Gguf) -> Result<Tokenizer> {
        let model_name = g.get_str("tokenizer.ggml.model")?;
        let texts = g.get_strs("tokenizer.ggml.tokens")?;
        let n_vocab = texts.len();
        if n_vocab == 0 || n_vocab > u32::MAX as usize {
            return Err(TokenizerError::VocabSize { n_vocab }.into());
        }
        let scores = float_array(g, SCORES_KEY)?;
        let types = int_array(g, TYPES_KEY)?;
        for (key, len) in [
            (SCORES_KEY, scores.as_ref().map(Vec::len)),
            (TYPES_KEY, types.as_ref().map(Vec::len)),
        ] {
            if let Some(len) = len.filter(|&len| len < n_vocab) {
                return Err(TokenizerError::ShortArray { key, len, n_vocab }.into());
            }
        }
        check_token_ids(g, n_vocab)?;

        let mut tokens = Vec::with_capacity(n_vocab);
        let mut token_to_id = HashMap::with_capacity(n_vocab);
        for (i, text) in texts.iter().enumerate() {
            let mut text = text.to_string();
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
                    let pre = PreTokenizer::named(pre_name)?;
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
                other => return Err(TokenizerError::UnsupportedModel(other.to_owned()).into()),
            };
        if let Some(id) = optional_id(g, "tokenizer.ggml.bos_token_id")? {
            bos = Some(id);
        }
        if let Some(id) = optional_id(g, "tokenizer.ggml.eos_token_id")? {
            eos = Some(id);
        }
        if let Some(id) = optional_id(g, "tokenizer.ggml.unknown_token_id")? {
            unk = Some(id);
        }
        let mut eot = optional_id(g, "tokenizer.ggml.eot_token_id")?;
        let mut eom = optional_id(g, "tokenizer.ggml.eom_token_id")?;
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

        let eog = end_of_generation(g, &mut tokens, &token_to_id, eos, &mut eot, &mut eom)?;

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
            return Err(TokenizerError::MissingSpecialToken { which: "bos" }.into());
        }
        if add_eos && eos.is_none() {
            return Err(TokenizerError::MissingSpecialToken { which: "eos" }.into());
        }
        tok.pieces = (0..n_vocab as u32)
            .map(|id| tok.compute_piece(id))
            .collect();
        Ok(tok)
    }

    pub(super) fn compute_piece(&self, id: u32) -> Vec<u8> {
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
}

pub(super) fn parse_byte_token(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

/// The end-of-generation tokens, sorted: `eos`, `eot`, `eom`, the FIM ends and those known by
/// their text. Special tokens are found by their text, as llama.cpp does (filling `eot` and
/// `eom` when the metadata does not name them); those become control tokens.
fn end_of_generation(
    g: &Gguf,
    tokens: &mut [TokenData],
    token_to_id: &HashMap<String, u32>,
    eos: Option<u32>,
    eot: &mut Option<u32>,
    eom: &mut Option<u32>,
) -> Result<Vec<u32>> {
    let mut by_text: Vec<(&str, u32)> = token_to_id
        .iter()
        .map(|(t, &id)| (t.as_str(), id))
        .collect();
    by_text.sort_unstable_by_key(|&(_, id)| id);
    let mut make_control = Vec::new();
    for &(text, id) in &by_text {
        if eot.is_none() && EOT_TEXTS.contains(&text) {
            *eot = Some(id);
            make_control.push(id);
        }
        if eom.is_none() && text == "<|eom_id|>" {
            *eom = Some(id);
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
        let mut id = optional_id(g, key)?;
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
    eog.extend([eos, *eot, *eom].into_iter().flatten());
    eog.sort_unstable();
    eog.dedup();
    harmony(tokens, token_to_id, &mut eog);
    Ok(eog)
}

/// gpt-oss's harmony tokens, as llama.cpp treats them: the channel markers (`<|channel|>`,
/// `<|message|>`, `<|start|>`, `<|constrain|>`) are rendered in the reply's text (user-defined
/// tokens), and where `<|return|>` and `<|call|>` end generation (or `<|calls|>` and
/// `<|flush|>`), `<|end|>` does not: it closes one message of a reply (the reasoning, before
/// the final answer) and is rendered too.
fn harmony(tokens: &mut [TokenData], token_to_id: &HashMap<String, u32>, eog: &mut Vec<u32>) {
    for marker in ["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"] {
        if let Some(&id) = token_to_id.get(marker) {
            tokens[id as usize].attr = attr::USER_DEFINED;
        }
    }
    let ends = |text: &str| {
        token_to_id
            .get(text)
            .is_some_and(|id| eog.binary_search(id).is_ok())
    };
    let call = ends("<|call|>") || ends("<|calls|>");
    if !(call && (ends("<|return|>") || ends("<|flush|>"))) {
        return;
    }
    if let Some(&end) = token_to_id.get("<|end|>") {
        if let Ok(i) = eog.binary_search(&end) {
            eog.remove(i);
            tokens[end as usize].attr = attr::USER_DEFINED;
        }
    }
}
