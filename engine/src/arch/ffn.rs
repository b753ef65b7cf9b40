//! The feed-forward half of a block: the gated network, a mixture of experts (with biases,
//! as gpt-oss has them) and a shared expert.

use super::{Forward, Gate, SWIGLU_OAI_ALPHA, SWIGLU_OAI_LIMIT};
use crate::ggml::{Graph, RawTensor, Tensor};
use crate::model::{Arch, ExpertBiases, Ffn, GateUp, SharedExpert};

impl<'p, 'g, 'w> Forward<'p, 'g, 'w> {
    /// The feed-forward network of layer `il` on `x`: the gated network
    /// `down · (act(gate · x) * up · x)`, or a mixture of experts ([`Forward::experts`]) plus,
    /// where the layer has one, its shared expert ([`Forward::shared_expert`]).
    pub fn ffn(&self, g: &mut Graph<'g, 'w>, il: usize, x: Tensor<'g>, act: Gate) -> Tensor<'g> {
        match self.model.layer(il).ffn {
            Ffn::Dense { gate, up, down } => self.dense(g, x, gate, [up, down], act),
            Ffn::Experts {
                gate_inp,
                gate_up,
                down,
                shared,
                biases,
                probs_bias,
            } => {
                let weights = (gate_up, down);
                let routed = self.experts(g, x, gate_inp, weights, biases, probs_bias, act);
                match shared {
                    Some(s) => {
                        let shared = self.shared_expert(g, x, s);
                        g.add(routed, shared)
                    }
                    None => routed,
                }
            }
            Ffn::None => unreachable!("only nemotron_h's blocks lack a network, and it runs none"),
        }
    }

    /// A dense gated network on `x`: `down · (act(gate · x) * up · x)`; with no `gate`, `up`
    /// holds the gate's rows, then the up projection's (SwiGLU).
    fn dense(
        &self,
        g: &mut Graph<'g, 'w>,
        x: Tensor<'g>,
        gate: Option<RawTensor<'w>>,
        [up, down]: [RawTensor<'w>; 2],
        act: Gate,
    ) -> Tensor<'g> {
        let up = self.project(g, x, up, None);
        let h = match gate {
            Some(gate) => {
                let gate = self.project(g, x, gate, None);
                act.apply(g, gate, up)
            }
            // Gate and up in one product, the gate's rows first.
            None => g.swiglu_fused(up),
        };
        self.project(g, h, down, None)
    }

    /// A mixture of experts on `x` (`[n_embd, n]`), as llama.cpp's `build_moe_ffn` with softmax
    /// routing: the router's probabilities, the `n_used` largest per token (normalised to sum 1
    /// except in qwen2moe, and scaled, as the file says), each chosen expert's gated network
    /// (`act`) through `mul_mat_id`, its output weighted, and the weighted outputs added in the
    /// order chosen. gpt-oss chooses by the router's logits and weighs by their softmax over
    /// the chosen ones alone, and adds `biases` to the router's and each expert's products.
    /// lfm2moe may take sigmoids of the router's logits as probabilities, and chooses by the
    /// probabilities plus `probs_bias` (weighing by the probabilities alone).
    #[allow(clippy::too_many_arguments)]
    fn experts(
        &self,
        g: &mut Graph<'g, 'w>,
        x: Tensor<'g>,
        gate_inp: RawTensor<'w>,
        (gate_up, down): (GateUp<RawTensor<'w>>, RawTensor<'w>),
        biases: Option<ExpertBiases<RawTensor<'w>>>,
        probs_bias: Option<RawTensor<'w>>,
        act: Gate,
    ) -> Tensor<'g> {
        let spec = self
            .hp
            .experts
            .as_ref()
            .unwrap_or_else(|| unreachable!("expert tensors are loaded only with experts"));
        let (n_embd, n, k) = (self.hp.n_embd, x.ne(1), spec.n_used);
        let logits = self.project(g, x, gate_inp, biases.map(|b| b.gate_inp));
        // gpt-oss (llama.cpp's `SOFTMAX_WEIGHT` gating): the softmax comes after the choice.
        let softmax_chosen = self.hp.arch == Arch::GptOss;
        let probs = match (softmax_chosen, spec.sigmoid) {
            (true, _) => logits,
            (false, true) => g.sigmoid(logits),
            (false, false) => g.soft_max_plain(logits),
        };
        let selection = match probs_bias {
            Some(b) => {
                let b = g.lift(b);
                g.add(probs, b)
            }
            None => probs,
        };
        let chosen = g.argsort_top_k(selection, k);
        let probs = g.reshape_3d(probs, 1, spec.n_expert, n);
        let mut weights = g.get_rows(probs, chosen);
        if softmax_chosen {
            let w = g.reshape_2d(weights, k, n);
            let w = g.soft_max_plain(w);
            weights = g.reshape_3d(w, 1, k, n);
        }
        if spec.norm_weights {
            let w = g.reshape_2d(weights, k, n);
            let sum = g.sum_rows(w);
            // As llama.cpp: no division by less than f16's smallest normal number.
            let sum = g.clamp(sum, 6.103_515_6e-5, f32::INFINITY);
            let w = g.div(w, sum);
            weights = g.reshape_3d(w, 1, k, n);
        }
        if spec.weights_scale != 1.0 {
            weights = g.scale(weights, spec.weights_scale);
        }
        let x = g.reshape_3d(x, n_embd, 1, n);
        let down = g.lift(down);
        // Each chosen expert's bias on its product's rows, where the mixture has them.
        let bias = |g: &mut Graph<'g, 'w>, y: Tensor<'g>, b: Option<RawTensor<'w>>| match b {
            Some(b) => {
                let b = g.lift(b);
                g.add_id(y, b, chosen)
            }
            None => y,
        };
        let (gate, up) = match gate_up {
            GateUp::Split { gate, up } => {
                let (gate, up) = (g.lift(gate), g.lift(up));
                let up = g.mul_mat_id(up, x, chosen);
                let up = bias(g, up, biases.map(|b| b.up));
                let gate = g.mul_mat_id(gate, x, chosen);
                (bias(g, gate, biases.map(|b| b.gate)), up)
            }
            // One product, each expert's gate rows then its up rows, viewed apart.
            GateUp::Fused(w) => {
                let w = g.lift(w);
                let both = g.mul_mat_id(w, x, chosen);
                let ff = both.ne(0) / 2;
                let strides = [both.nb(1), both.nb(2)];
                let gate = g.view_3d(both, [ff, k, n], strides, 0);
                (gate, g.view_3d(both, [ff, k, n], strides, ff * 4))
            }
        };
        let h = act.apply(g, gate, up);
        let out = g.mul_mat_id(down, h, chosen);
        let out = bias(g, out, biases.map(|b| b.down));
        let out = g.mul(out, weights);
        // Sum over the chosen experts: [n_embd, n] views, added in order.
        let row = out.nb(1);
        let plane = out.nb(2);
        let mut sum = g.view_2d(out, n_embd, n, plane, 0);
        for i in 1..k {
            let part = g.view_2d(out, n_embd, n, plane, i * row);
            sum = g.add(sum, part);
        }
        if k == 1 {
            sum = g.cont(sum);
        }
        sum
    }

    /// The shared expert of a mixture (qwen2moe, qwen35moe, qwen3next) on `x` (`[n_embd, n]`):
    /// a SwiGLU network whose output is multiplied by each token's `sigmoid(gate_inp · x)`. As
    /// llama.cpp's graphs, qwen2moe's sigmoid is computed as `silu(z) / z`, the others' by
    /// ggml's sigmoid.
    fn shared_expert(
        &self,
        g: &mut Graph<'g, 'w>,
        x: Tensor<'g>,
        s: SharedExpert<RawTensor<'w>>,
    ) -> Tensor<'g> {
        // One logit per token: `[1, n]`, broadcast over the rows of the network's output.
        let gate = s.gate_inp.map(|w| {
            let z = self.project(g, x, w, None);
            match self.hp.arch {
                Arch::Qwen2Moe => {
                    let silu = g.silu(z);
                    g.div(silu, z)
                }
                _ => g.sigmoid(z),
            }
        });
        let out = self.dense(g, x, Some(s.gate), [s.up, s.down], Gate::Silu);
        match gate {
            Some(gate) => g.mul(out, gate),
            // granitehybrid's shared expert is ungated.
            None => out,
        }
    }
}

impl Gate {
    /// `act(gate) * up`, as this activation combines them.
    fn apply<'g>(self, g: &mut Graph<'g, '_>, gate: Tensor<'g>, up: Tensor<'g>) -> Tensor<'g> {
        match self {
            Gate::Silu => g.swiglu(gate, up),
            Gate::Gelu => g.geglu(gate, up),
            Gate::SwigluOai => g.swiglu_oai(gate, up, SWIGLU_OAI_ALPHA, SWIGLU_OAI_LIMIT),
        }
    }
}
