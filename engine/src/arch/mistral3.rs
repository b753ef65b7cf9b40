//! mistral3 (llama.cpp's `llama_model_mistral3` graph): llama's pre-norm blocks (adjacent-pair
//! RoPE, with YaRN's parameters from the file, see [`rope_params`](super::rope_params)), a
//! bias on the output projection where the file has one, a SwiGLU network or a mixture of
//! experts; and, when the file sets `attention.temperature_scale`, each token's rotated Q
//! multiplied by `1 + scale * ln(floor(pos / floor_len) + 1)` before attention (Llama 4's
//! attention temperature, which lengthens the reach of long contexts).

use super::{Forward, Gate};
use crate::ggml::{DType, Graph, Tensor};

/// The transformer blocks: the residual stream after the last one.
pub(super) fn blocks<'g, 'w>(g: &mut Graph<'g, 'w>, f: &mut Forward<'_, 'g, 'w>) -> Tensor<'g> {
    let hp = f.hp;
    let mut x = f.embed(g);
    let temperature = f.attn_temperature(g);
    for il in 0..hp.n_layer {
        let lw = f.model.layer(il);
        let (q, k, v) = f.attention_inputs(g, il, x);
        let q = match temperature {
            Some(t) => g.mul(q, t),
            None => q,
        };
        let attn = f.attention(g, il, q, k, v, hp.attn_scale);
        let out = f.project(g, attn, lw.wo, lw.bo);
        let out = f.last_rows(g, il, out);
        let residual = f.last_rows(g, il, x);
        let x_attn = g.add(out, residual);

        let cur = f.norm(g, x_attn, lw.ffn_norm);
        let down = f.ffn(g, il, cur, Gate::Silu);
        x = g.add(down, x_attn);
    }
    x
}

impl<'g, 'w> Forward<'_, 'g, 'w> {
    /// The attention temperature of each token (`[1, 1, n]`, broadcast over Q), when the
    /// model has one: computed from the batch's positions as llama.cpp does (in double
    /// precision, rounded to f32).
    fn attn_temperature(&self, g: &mut Graph<'g, 'w>) -> Option<Tensor<'g>> {
        let m = self.hp.mistral3.as_ref()?;
        let scale = m.attn_temp_scale?;
        let floor_len = m.attn_temp_floor as f32;
        let bytes: Vec<u8> = self
            .plan
            .positions
            .chunks_exact(4)
            .flat_map(|p| {
                let pos = i32::from_le_bytes([p[0], p[1], p[2], p[3]]) as f32;
                let steps = f64::from((pos / floor_len).floor()) + 1.0;
                let t = steps.ln() * f64::from(scale) + 1.0;
                (t as f32).to_le_bytes()
            })
            .collect();
        Some(g.input(DType::F32, &[1, 1, self.n], bytes))
    }
}
