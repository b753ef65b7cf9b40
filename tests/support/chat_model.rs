//! The tiny chat model the chat's tests write: a byte-level BPE vocabulary with a few merges and
//! ChatML's special tokens, random f32 weights, llama architecture.

use std::path::Path;

use engine::gguf::{GgmlType, GgufWriter};

/// Deterministic pseudo-random weights (SplitMix64).
struct Rng(u64);
impl Rng {
    fn f32(&mut self) -> f32 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
    fn tensor(&mut self, n: usize, scale: f32, offset: f32) -> Vec<u8> {
        (0..n)
            .flat_map(|_| (offset + self.f32() * scale).to_le_bytes())
            .collect()
    }
}

/// GPT-2's byte-level alphabet: the character standing for each byte.
fn byte_chars() -> Vec<char> {
    let printable = |b: u32| {
        (u32::from('!')..=u32::from('~')).contains(&b)
            || (0xA1..=0xAC).contains(&b)
            || (0xAE..=0xFF).contains(&b)
    };
    let mut extra = 0;
    (0..256u32)
        .map(|b| {
            if printable(b) {
                char::from_u32(b).unwrap()
            } else {
                extra += 1;
                char::from_u32(255 + extra).unwrap()
            }
        })
        .collect()
}

/// Writes a tiny llama model with a byte-level vocabulary (every text encodes), merges of the
/// letters `a`-`h` in pairs (so a reply sampled letter by letter tokenizes differently when its
/// text is encoded again), ChatML's control tokens, and `template` as its chat template (ChatML
/// when `None`).
pub fn write_model(path: &Path, template: Option<&str>) {
    write_model_wide(path, template, 32);
}

/// The tiny model with `n_embd` (4 heads of `n_embd / 4`; 128 gives heads of whole q8_0 blocks).
pub fn write_model_wide(path: &Path, template: Option<&str>, n_embd: usize) {
    let (n_head, n_head_kv, n_ff, n_layer) = (4usize, 2usize, 48usize, 2usize);
    let kv = n_embd / n_head * n_head_kv;
    let mut tokens: Vec<String> = byte_chars().iter().map(char::to_string).collect();
    let letters = "abcdefgh";
    let mut merges = Vec::new();
    for a in letters.chars() {
        for b in letters.chars() {
            tokens.push(format!("{a}{b}"));
            merges.push(format!("{a} {b}"));
        }
    }
    let mut types = vec![1i32; tokens.len()];
    for special in ["<|im_start|>", "<|im_end|>"] {
        tokens.push(special.to_owned());
        types.push(3);
    }
    let n_vocab = tokens.len();
    let mut g = GgufWriter::new();
    g.add_str("general.architecture", "llama")
        .add_u32("llama.context_length", 8192)
        .add_u32("llama.embedding_length", n_embd as u32)
        .add_u32("llama.block_count", n_layer as u32)
        .add_u32("llama.feed_forward_length", n_ff as u32)
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
    if let Some(t) = template {
        g.add_str("tokenizer.chat_template", t);
    }
    let mut r = Rng(7);
    let (e, v) = (n_embd as u64, n_vocab as u64);
    g.add_tensor(
        "token_embd.weight",
        &[e, v],
        GgmlType::F32,
        r.tensor(n_embd * n_vocab, 1.0, 0.0),
    );
    g.add_tensor(
        "output_norm.weight",
        &[e],
        GgmlType::F32,
        r.tensor(n_embd, 0.5, 1.0),
    );
    g.add_tensor(
        "output.weight",
        &[e, v],
        GgmlType::F32,
        r.tensor(n_embd * n_vocab, 0.3, 0.0),
    );
    for l in 0..n_layer {
        let n = |s: &str| format!("blk.{l}.{s}");
        let (kv64, ff64) = (kv as u64, n_ff as u64);
        let mut add = |name: &str, dims: &[u64], scale: f32, offset: f32| {
            let count = dims.iter().product::<u64>() as usize;
            g.add_tensor(
                &n(name),
                dims,
                GgmlType::F32,
                r.tensor(count, scale, offset),
            );
        };
        add("attn_norm.weight", &[e], 0.5, 1.0);
        add("attn_q.weight", &[e, e], 0.3, 0.0);
        add("attn_k.weight", &[e, kv64], 0.3, 0.0);
        add("attn_v.weight", &[e, kv64], 0.3, 0.0);
        add("attn_output.weight", &[e, e], 0.3, 0.0);
        add("ffn_norm.weight", &[e], 0.5, 1.0);
        add("ffn_gate.weight", &[e, ff64], 0.3, 0.0);
        add("ffn_up.weight", &[e, ff64], 0.3, 0.0);
        add("ffn_down.weight", &[ff64, e], 0.3, 0.0);
    }
    g.write(path).unwrap();
}
