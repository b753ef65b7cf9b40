//! gpt-oss (llama.cpp's `openai-moe` graph, GGUF architecture `gpt-oss`): pre-norm blocks of
//! RMSNorm; attention with biases on Q, K, V and the output, NeoX RoPE (YaRN-scaled in every
//! layer), each head's learned sink in its softmax ([`Forward::attention`]), the first of every
//! two layers windowed; then a mixture of experts (MXFP4 in the published files) with a biased
//! router whose chosen logits go through a softmax, each expert a clamped SwiGLU
//! ([`Gate::SwigluOai`]) with biased products ([`Forward::ffn`]). The output head is untied.
//!
//! Unlike llama's graph, the rows that give no logits are dropped after the last block rather
//! than inside it, where llama.cpp drops them: products that depend on their row count then
//! see the same rows as there.

use super::{Forward, Gate};
use crate::ggml::{Graph, Tensor};

/// The transformer blocks: the residual stream after the last one (its logit rows only).
pub(super) fn blocks<'g, 'w>(g: &mut Graph<'g, 'w>, f: &mut Forward<'_, 'g, 'w>) -> Tensor<'g> {
    let hp = f.hp;
    let mut x = f.embed(g);
    for il in 0..hp.n_layer {
        let lw = f.model.layer(il);
        let (q, k, v) = f.attention_inputs(g, il, x);
        let attn = f.attention(g, il, q, k, v, hp.attn_scale);
        let out = f.project(g, attn, lw.wo, lw.bo);
        let x_attn = g.add(out, x);

        // The norm after attention (`post_attention_norm`) is the experts' input norm.
        let cur = f.norm(g, x_attn, lw.ffn_norm);
        let moe = f.ffn(g, il, cur, Gate::SwigluOai);
        x = g.add(moe, x_attn);
    }
    f.last_rows(g, hp.n_layer - 1, x)
}
