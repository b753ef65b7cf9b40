//! Tiny chat models for tests and benchmarks (feature `test-util`): a llama network with random
//! f32 weights and a GPT-2 byte-level vocabulary, so that any text encodes, plus ChatML's control
//! tokens. The chat's, the ingest's and the server's tests all write their models here, and find
//! the real Gemma 3 model through [`gemma3_model_path`]. [`TinyHybridModel`] is a qwen35 hybrid
//! with the same vocabulary.

use std::path::{Path, PathBuf};

use crate::gguf::{GgmlType, GgufWriter};
use crate::Result;

mod hybrid;

pub use hybrid::TinyHybridModel;

/// SplitMix64: a small deterministic generator, the same sequence on every machine.
#[derive(Debug, Clone)]
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A value uniform in `[-1, 1)` with 24 bits of resolution.
    pub fn next_f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }

    /// `n` values `scale * next_f32()`.
    pub fn f32_vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.next_f32() * scale).collect()
    }

    /// `n` values `offset + scale * next_f32()`, as little-endian f32 bytes.
    pub fn f32_bytes(&mut self, n: usize, scale: f32, offset: f32) -> Vec<u8> {
        (0..n)
            .flat_map(|_| (offset + self.next_f32() * scale).to_le_bytes())
            .collect()
    }
}

/// GPT-2's byte-level alphabet: the character standing for each byte, in byte order.
pub fn byte_alphabet() -> Vec<char> {
    let printable = |b: u32| {
        (u32::from('!')..=u32::from('~')).contains(&b)
            || (0xA1..=0xAC).contains(&b)
            || (0xAE..=0xFF).contains(&b)
    };
    let mut shifted = 0;
    (0..256u32)
        .map(|b| {
            let c = if printable(b) {
                b
            } else {
                shifted += 1;
                255 + shifted
            };
            char::from_u32(c).expect("below the surrogates")
        })
        .collect()
}

/// A tiny llama chat model: 4 attention heads over 2 KV heads, 2 layers, the byte vocabulary,
/// `<|im_start|>` and `<|im_end|>` (the end of generation) as control tokens.
#[derive(Debug, Clone)]
pub struct TinyChatModel {
    /// Embedding width (a multiple of 4; 128 gives heads of whole q8_0 blocks).
    pub n_embd: usize,
    /// Feed-forward width.
    pub n_ff: usize,
    /// `llama.context_length`.
    pub context_length: u32,
    /// Adds the 64 merges of the letters `a`-`h` in pairs, so that a reply sampled letter by
    /// letter tokenizes differently when its text is encoded again.
    pub letter_merges: bool,
    /// `tokenizer.chat_template`; ChatML applies when `None`.
    pub template: Option<String>,
    /// Seed of the weights.
    pub seed: u64,
}

impl Default for TinyChatModel {
    fn default() -> Self {
        TinyChatModel {
            n_embd: 32,
            n_ff: 48,
            context_length: 8192,
            letter_merges: false,
            template: None,
            seed: 11,
        }
    }
}

impl TinyChatModel {
    /// The vocabulary: 256 byte tokens, the merges if asked for, then the two control tokens.
    fn vocabulary(&self) -> (Vec<String>, Vec<i32>, Vec<String>) {
        let mut tokens: Vec<String> = byte_alphabet().iter().map(char::to_string).collect();
        let mut merges = Vec::new();
        if self.letter_merges {
            for a in "abcdefgh".chars() {
                for b in "abcdefgh".chars() {
                    tokens.push(format!("{a}{b}"));
                    merges.push(format!("{a} {b}"));
                }
            }
        }
        let mut types = vec![1i32; tokens.len()];
        for special in ["<|im_start|>", "<|im_end|>"] {
            tokens.push(special.to_owned());
            types.push(3);
        }
        (tokens, types, merges)
    }

    /// Writes the model to `path`.
    pub fn write(&self, path: &Path) -> Result<()> {
        let (n_head, n_head_kv, n_layer) = (4usize, 2usize, 2usize);
        let n_embd = self.n_embd;
        let kv = n_embd / n_head * n_head_kv;
        let (tokens, types, merges) = self.vocabulary();
        let n_vocab = tokens.len();
        let mut g = GgufWriter::new();
        g.add_str("general.architecture", "llama")
            .add_u32("llama.context_length", self.context_length)
            .add_u32("llama.embedding_length", n_embd as u32)
            .add_u32("llama.block_count", n_layer as u32)
            .add_u32("llama.feed_forward_length", self.n_ff as u32)
            .add_u32("llama.attention.head_count", n_head as u32)
            .add_u32("llama.attention.head_count_kv", n_head_kv as u32)
            .add_f32("llama.attention.layer_norm_rms_epsilon", 1e-5)
            .add_f32("llama.rope.freq_base", 10000.0)
            .add_str("tokenizer.ggml.model", "gpt2")
            .add_str("tokenizer.ggml.pre", "default")
            .add_str_array("tokenizer.ggml.tokens", &tokens)
            .add_i32_array("tokenizer.ggml.token_type", &types)
            .add_str_array("tokenizer.ggml.merges", &merges)
            .add_u32("tokenizer.ggml.eos_token_id", n_vocab as u32 - 1);
        if let Some(t) = &self.template {
            g.add_str("tokenizer.chat_template", t);
        }
        let mut r = SplitMix64(self.seed);
        let (e, v) = (n_embd as u64, n_vocab as u64);
        let (kv, ff) = (kv as u64, self.n_ff as u64);
        let mut add = |g: &mut GgufWriter, name: &str, dims: &[u64], scale: f32, offset: f32| {
            let count = dims.iter().product::<u64>() as usize;
            let bytes = r.f32_bytes(count, scale, offset);
            g.add_tensor(name, dims, GgmlType::F32, bytes);
        };
        add(&mut g, "token_embd.weight", &[e, v], 1.0, 0.0);
        add(&mut g, "output_norm.weight", &[e], 0.5, 1.0);
        add(&mut g, "output.weight", &[e, v], 0.3, 0.0);
        for l in 0..n_layer {
            for (name, dims, scale, offset) in [
                ("attn_norm", vec![e], 0.5, 1.0),
                ("attn_q", vec![e, e], 0.3, 0.0),
                ("attn_k", vec![e, kv], 0.3, 0.0),
                ("attn_v", vec![e, kv], 0.3, 0.0),
                ("attn_output", vec![e, e], 0.3, 0.0),
                ("ffn_norm", vec![e], 0.5, 1.0),
                ("ffn_gate", vec![e, ff], 0.3, 0.0),
                ("ffn_up", vec![e, ff], 0.3, 0.0),
                ("ffn_down", vec![ff, e], 0.3, 0.0),
            ] {
                add(
                    &mut g,
                    &format!("blk.{l}.{name}.weight"),
                    &dims,
                    scale,
                    offset,
                );
            }
        }
        g.write(path)
    }
}

/// Gemma 3 270M (Q4_K_M): `$LLAMA_HDD_GEMMA3`, else `<workspace>/models/gemma-3-270m-q4_k_m.gguf`
/// (`cargo xtask fetch-model gemma3`), for the tests of every crate that run it; see
/// [`workspace_model`].
pub fn gemma3_model_path() -> std::result::Result<PathBuf, String> {
    workspace_model(
        "LLAMA_HDD_GEMMA3",
        "gemma-3-270m-q4_k_m.gguf",
        "cargo xtask fetch-model gemma3",
    )
}

/// A real model for tests: the file `$env` names, else `<workspace>/models/<file>` (which
/// `fetch` downloads). Absent: the note a test prints as it skips; under CI (`CI` set) a
/// panic, so that no test passes by skipping it.
pub fn workspace_model(env: &str, file: &str, fetch: &str) -> std::result::Result<PathBuf, String> {
    let path = std::env::var_os(env).map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../models")
            .join(file)
    });
    if path.is_file() {
        return Ok(path);
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "CI must run the tests of {file}, but {} is missing",
        path.display()
    );
    Err(format!(
        "skipped: {} not present (run `{fetch}`)",
        path.display()
    ))
}

/// A grammar of `n + 1` rules, each referring to the next (`r0 ::= "a" r1`, ..., `rN ::=
/// "end"`), started from `root` in GBNF or from `start` in Lark: a chain as deep as `n`, for
/// tests of the grammar compiler's bounds.
pub fn rule_chain(n: usize, lark: bool) -> String {
    let (start, def) = if lark {
        ("start", ":")
    } else {
        ("root", " ::=")
    };
    let mut s = format!("{start}{def} r0\n");
    for i in 0..n {
        s.push_str(&format!("r{i}{def} \"a\" r{}\n", i + 1));
    }
    s.push_str(&format!("r{n}{def} \"end\"\n"));
    s
}

/// A JSON schema whose definitions refer to each other in a chain of `n` (three objects each),
/// for tests of the grammar compiler's bounds.
pub fn schema_chain(n: usize) -> serde_json::Value {
    let mut defs = serde_json::Map::new();
    for i in 0..n {
        defs.insert(
            format!("a{i}"),
            serde_json::json!({"properties": {"x": {"$ref": format!("#/$defs/a{}", i + 1)}}}),
        );
    }
    defs.insert(format!("a{n}"), serde_json::json!({"type": "integer"}));
    serde_json::json!({"$defs": defs, "$ref": "#/$defs/a0"})
}

/// Every file under `dir`, recursively, sorted (none when it cannot be read).
pub fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(files_under(&p));
        } else {
            out.push(p);
        }
    }
    out.sort();
    out
}

/// Fixes the page cache's room for block files that `ctx`'s spill read-ahead sees (`None`:
/// the system's), so that a test takes either of its ways.
pub fn fix_spill_room(ctx: &mut crate::Context, room: Option<u64>) {
    let _ = ctx.spill_room(Some(room));
}

/// How `ctx`'s spill read the last batch ahead: whether tightly (groups of layers, no
/// read-around) and its layers per group; `None` without a spill store.
pub fn spill_read_ahead(ctx: &mut crate::Context) -> Option<(bool, usize)> {
    ctx.spill_room(None)
}
