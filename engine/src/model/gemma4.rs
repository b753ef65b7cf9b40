//! Gemma 4's tensors, as llama.cpp loads them: per block Q (and K and V unless the block
//! reuses an earlier block's KV; V may be absent, K then serving as V; or one fused QKV
//! matrix), head norms, the norms after attention and after the feed-forward network, a dense
//! GELU network, optionally a mixture of experts beside it (with its own norms and router
//! scale), the per-layer input's gate, projection and norm, and an optional output scale;
//! globally the per-layer token table, its projection from the embeddings and its norm.

use crate::error::Result;

use super::{Ffn, HParams, LayerWeights, Qkv, Role, Specs};

/// A Gemma 4 block's tensors beyond the common ones.
#[derive(Clone, Copy)]
pub(crate) struct Gemma4Layer<T> {
    /// The block computes its own K and V (else it reads [`HParams::kv_layer`]'s cache).
    pub has_kv: bool,
    /// The file has no V projection: V is K's projection (before K's norm).
    pub v_is_k: bool,
    /// Factor the block's output is multiplied by (`[1]`).
    pub out_scale: Option<T>,
    /// Per-layer input: gate `[n_embd, n_pl]`, projection `[n_pl, n_embd]`, norm `[n_embd]`.
    pub per_layer: Option<[T; 3]>,
    /// The mixture of experts beside the dense network.
    pub moe: Option<Gemma4Moe<T>>,
}

/// Gemma 4's mixture of experts: router `[n_embd, n_expert]` and its input scale `[n_embd]`,
/// the norms (before the experts, after the dense network, after the experts), the experts'
/// gate and up (split or fused, gate rows first), down, and down's per-expert scale.
#[derive(Clone, Copy)]
pub(crate) struct Gemma4Moe<T> {
    pub gate_inp: T,
    pub gate_inp_s: T,
    pub pre_norm_2: T,
    pub post_norm_1: T,
    pub post_norm_2: T,
    pub gate_up: GateUp<T>,
    pub down: T,
    pub down_s: Option<T>,
}

/// The experts' gate and up projections.
#[derive(Clone, Copy)]
pub(crate) enum GateUp<T> {
    Split { gate: T, up: T },
    Fused(T),
}

impl<T: Copy> Gemma4Layer<T> {
    pub(super) fn all(&self) -> Vec<T> {
        let mut v: Vec<T> = self.out_scale.into_iter().collect();
        v.extend(self.per_layer.into_iter().flatten());
        if let Some(m) = &self.moe {
            v.extend([
                m.gate_inp,
                m.gate_inp_s,
                m.pre_norm_2,
                m.post_norm_1,
                m.post_norm_2,
                m.down,
            ]);
            v.extend(m.down_s);
            match m.gate_up {
                GateUp::Split { gate, up } => v.extend([gate, up]),
                GateUp::Fused(w) => v.push(w),
            }
        }
        v
    }

    pub(super) fn map<U>(&self, f: impl Fn(T) -> U) -> Gemma4Layer<U> {
        Gemma4Layer {
            has_kv: self.has_kv,
            v_is_k: self.v_is_k,
            out_scale: self.out_scale.map(&f),
            per_layer: self.per_layer.map(|p| p.map(&f)),
            moe: self.moe.map(|m| Gemma4Moe {
                gate_inp: f(m.gate_inp),
                gate_inp_s: f(m.gate_inp_s),
                pre_norm_2: f(m.pre_norm_2),
                post_norm_1: f(m.post_norm_1),
                post_norm_2: f(m.post_norm_2),
                gate_up: match m.gate_up {
                    GateUp::Split { gate, up } => GateUp::Split {
                        gate: f(gate),
                        up: f(up),
                    },
                    GateUp::Fused(w) => GateUp::Fused(f(w)),
                },
                down: f(m.down),
                down_s: m.down_s.map(&f),
            }),
        }
    }
}

/// The per-layer token table `[n_pl * n_layer, n_vocab]`, its projection from the scaled
/// embeddings `[n_embd, n_pl * n_layer]` and its norm `[n_pl]`, when the file has per-layer
/// inputs.
pub(super) fn globals(specs: &mut Specs<'_>, hp: &HParams) -> Result<Option<[usize; 3]>> {
    let n_pl = hp.gemma4.as_ref().map_or(0, |g| g.n_embd_per_layer);
    if n_pl == 0 {
        return Ok(None);
    }
    let all = n_pl * hp.n_layer;
    Ok(Some([
        specs.require(
            "per_layer_token_embd.weight",
            &[all, hp.n_vocab],
            Role::Embedding { tied: false },
        )?,
        specs.require(
            "per_layer_model_proj.weight",
            &[hp.n_embd, all],
            Role::Matrix,
        )?,
        specs.require("per_layer_proj_norm.weight", &[n_pl], Role::Vector)?,
    ]))
}

/// Block `l`'s tensors, with the shapes its kind (windowed or global) gives.
pub(super) fn layer_weights(specs: &mut Specs<'_>, hp: &HParams, l: usize) -> Result<LayerWeights> {
    let (e, hd) = (hp.n_embd, hp.head_dim_at(l));
    let (q, kv) = (hd * hp.n_head, hp.n_embd_kv_at(l));
    let has_kv = hp.kv_layer(l) == l;
    let n = |s: &str| format!("blk.{l}.{s}");
    let (m, v) = (Role::Matrix, Role::Vector);
    // Blocks without KV may still carry K and V: read (and ignored) as in llama.cpp.
    let (qkv, v_is_k) = match specs.find(&n("attn_qkv.weight"), &[e, q + 2 * kv], m)? {
        Some(w) => (Qkv::Fused(w), false),
        None => {
            let wq = specs.require(&n("attn_q.weight"), &[e, q], m)?;
            let wk = match has_kv {
                true => Some(specs.require(&n("attn_k.weight"), &[e, kv], m)?),
                false => specs.find(&n("attn_k.weight"), &[e, kv], m)?,
            };
            let wv = specs.find(&n("attn_v.weight"), &[e, kv], m)?;
            // Without K (a block reusing KV) Q stands in; those blocks never read K or V.
            let wk_or_q = wk.unwrap_or(wq);
            let split = Qkv::Split {
                wq,
                wk: wk_or_q,
                wv: wv.unwrap_or(wk_or_q),
            };
            (split, wv.is_none())
        }
    };
    let wo = specs.require(&n("attn_output.weight"), &[q, e], m)?;
    let q_norm = specs.require(&n("attn_q_norm.weight"), &[hd], v)?;
    let k_norm = match has_kv {
        true => Some(specs.require(&n("attn_k_norm.weight"), &[hd], v)?),
        false => specs.find(&n("attn_k_norm.weight"), &[hd], v)?,
    };
    let post_attn_norm = specs.require(&n("post_attention_norm.weight"), &[e], v)?;
    let out_scale = specs.find(&n("layer_output_scale.weight"), &[1], v)?;
    let ff = hp.n_ff_at(l);
    let ffn_norm = specs.require(&n("ffn_norm.weight"), &[e], v)?;
    let ffn = Ffn::Dense {
        gate: Some(specs.require(&n("ffn_gate.weight"), &[e, ff], m)?),
        up: specs.require(&n("ffn_up.weight"), &[e, ff], m)?,
        down: specs.require(&n("ffn_down.weight"), &[ff, e], m)?,
    };
    let post_ffn_norm = specs.require(&n("post_ffw_norm.weight"), &[e], v)?;
    let moe = match &hp.experts {
        None => None,
        Some(x) => match specs.find(&n("ffn_gate_inp.weight"), &[e, x.n_expert], m)? {
            None => None,
            Some(gate_inp) => {
                let (ffx, nx) = (x.n_ff_exp, x.n_expert);
                Some(Gemma4Moe {
                    gate_inp,
                    gate_inp_s: specs.require(&n("ffn_gate_inp.scale"), &[e], v)?,
                    pre_norm_2: specs.require(&n("pre_ffw_norm_2.weight"), &[e], v)?,
                    post_norm_1: specs.require(&n("post_ffw_norm_1.weight"), &[e], v)?,
                    post_norm_2: specs.require(&n("post_ffw_norm_2.weight"), &[e], v)?,
                    gate_up: match specs.find(
                        &n("ffn_gate_up_exps.weight"),
                        &[e, 2 * ffx, nx],
                        m,
                    )? {
                        Some(w) => GateUp::Fused(w),
                        None => GateUp::Split {
                            gate: specs.require(&n("ffn_gate_exps.weight"), &[e, ffx, nx], m)?,
                            up: specs.require(&n("ffn_up_exps.weight"), &[e, ffx, nx], m)?,
                        },
                    },
                    down: specs.require(&n("ffn_down_exps.weight"), &[ffx, e, nx], m)?,
                    down_s: specs.find(&n("ffn_down_exps.scale"), &[nx], v)?,
                })
            }
        },
    };
    let n_pl = hp.gemma4.as_ref().map_or(0, |g| g.n_embd_per_layer);
    let per_layer = match n_pl {
        0 => None,
        _ => Some([
            specs.require(&n("inp_gate.weight"), &[e, n_pl], m)?,
            specs.require(&n("proj.weight"), &[n_pl, e], m)?,
            specs.require(&n("post_norm.weight"), &[e], v)?,
        ]),
    };
    Ok(LayerWeights {
        attn_norm: specs.require(&n("attn_norm.weight"), &[e], v)?,
        qkv,
        wo,
        bo: None,
        bq: None,
        bk: None,
        bv: None,
        q_norm: Some(q_norm),
        k_norm,
        post_attn_norm: Some(post_attn_norm),
        post_ffn_norm: Some(post_ffn_norm),
        ffn_norm,
        ffn,
        gemma4: Some(Gemma4Layer {
            has_kv,
            v_is_k,
            out_scale,
            per_layer,
            moe,
        }),
        delta: None,
        short_conv: None,
        mamba2: None,
        attn_sinks: None,
    })
}
