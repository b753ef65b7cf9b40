//! nemotron_h's hyperparameters and block tensors, as llama.cpp's loader reads them. Each block
//! is one mixer after its `attn_norm`, told apart by the per-layer `attention.head_count_kv`
//! and `feed_forward_length`: both 0 is a Mamba-2 layer (`ssm_in` giving z, x, B, C and dt;
//! the depthwise kernel `ssm_conv1d` with its bias over x, B and C; `ssm_dt.bias`, `ssm_a`,
//! `ssm_d`, the grouped norm `ssm_norm`, `ssm_out`), KV heads and no feed-forward width an
//! attention layer without RoPE (`attn_q`, `attn_k`, `attn_v`, `attn_output`, optional biases),
//! a feed-forward width a ReLU² network (`ffn_up`, `ffn_down`). The final norm is
//! `output_norm`.

use super::hparams::{invalid, Keys, MAX_WIDTH};
use super::{Ffn, HParams, LayerWeights, Mamba2Weights, Qkv, Role, Specs};
use crate::error::Result;

/// What one nemotron_h block runs after its norm.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MixerKind {
    /// A Mamba-2 layer (recurrent: its state is kept per sequence).
    Mamba2,
    /// Grouped-query attention without RoPE (the only layers with KV rows).
    Attention,
    /// A ReLU² feed-forward network, `down · relu(up · x)²`.
    Mlp,
}

/// The Mamba-2 layers of a hybrid model (nemotron_h) and their sizes, from `ssm.*` keys.
#[derive(Clone, Debug, PartialEq)]
pub struct Mamba2 {
    /// Per layer: what it runs.
    pub kinds: Vec<MixerKind>,
    /// Per layer: whether it is a Mamba-2 layer.
    pub layers: Vec<bool>,
    /// Width of the causal convolution (`ssm.conv_kernel`); its state keeps `d_conv - 1`
    /// inputs per channel.
    pub d_conv: usize,
    /// Width of x and of z (`ssm.inner_size`).
    pub d_inner: usize,
    /// Size of B and C per group (`ssm.state_size`).
    pub d_state: usize,
    /// SSM heads (`ssm.time_step_rank`), each `d_inner / n_head` wide.
    pub n_head: usize,
    /// Groups of B and C, and of the output norm (`ssm.group_count`).
    pub n_group: usize,
}

impl Mamba2 {
    /// Channels of the convolution: x, then B, then C.
    pub fn conv_channels(&self) -> usize {
        self.d_inner + 2 * self.n_group * self.d_state
    }

    /// Rows of the input projection: z, x, B, C, then dt.
    pub fn in_proj_len(&self) -> usize {
        self.d_inner + self.conv_channels() + self.n_head
    }

    /// Width of one SSM head.
    pub fn head_dim(&self) -> usize {
        self.d_inner / self.n_head
    }

    /// f32 values of one sequence's convolution state in one layer.
    pub fn conv_state_len(&self) -> usize {
        (self.d_conv - 1) * self.conv_channels()
    }

    /// f32 values of one sequence's SSM state in one layer (`d_state` per channel of x).
    pub fn ssm_state_len(&self) -> usize {
        self.d_state * self.d_inner
    }
}

/// The one non-zero value of the per-layer `name`, which at least one layer must have.
fn common_nonzero(k: &Keys<'_>, values: &[usize], name: &str, what: &str) -> Result<usize> {
    let mut set = values.iter().copied().filter(|&c| c > 0);
    let first = set.next().ok_or_else(|| {
        invalid(
            &k.key(name),
            "0 in every layer",
            format!("must give at least one {what} layer its width"),
        )
    })?;
    match set.find(|&c| c != first) {
        Some(other) => Err(invalid(
            &k.key(name),
            other,
            format!("must be the same in every {what} layer ({first})"),
        )),
        None => Ok(first),
    }
}

/// The key/value heads of a nemotron_h file's attention layers (the one non-zero count of
/// `attention.head_count_kv`).
pub(super) fn n_head_kv(k: &Keys<'_>, n_head: usize, n_layer: usize) -> Result<usize> {
    let counts = k.per_layer("attention.head_count_kv", 0, n_head, n_layer)?;
    common_nonzero(k, &counts, "attention.head_count_kv", "attention")
}

/// The width of a nemotron_h file's feed-forward layers (the one non-zero value of
/// `feed_forward_length`).
pub(super) fn n_ff(k: &Keys<'_>, n_layer: usize) -> Result<usize> {
    let widths = k.per_layer("feed_forward_length", 0, MAX_WIDTH, n_layer)?;
    common_nonzero(k, &widths, "feed_forward_length", "feed-forward")
}

/// The layers and Mamba-2 sizes of a nemotron_h file. Files with experts or appended
/// next-token prediction layers are refused: they are not run here.
pub(super) fn mamba2(k: &Keys<'_>, n_head: usize, n_layer: usize) -> Result<Mamba2> {
    let heads = k.per_layer("attention.head_count_kv", 0, n_head, n_layer)?;
    let widths = k.per_layer("feed_forward_length", 0, MAX_WIDTH, n_layer)?;
    let kinds: Vec<MixerKind> = heads
        .iter()
        .zip(&widths)
        .map(|(&h, &w)| match (h, w) {
            (0, 0) => MixerKind::Mamba2,
            (_, 0) => MixerKind::Attention,
            _ => MixerKind::Mlp,
        })
        .collect();
    if let Some(n) = k.opt_int("nextn_predict_layers", 0, n_layer)? {
        if n > 0 {
            return Err(invalid(
                &k.key("nextn_predict_layers"),
                n,
                "must be 0 or absent (next-token prediction layers are not supported)",
            ));
        }
    }
    sizes(k, kinds)
}

/// The Mamba-2 sizes from the `ssm.*` keys, for layers of `kinds` (nemotron_h's, or
/// granitehybrid's).
pub(super) fn sizes(k: &Keys<'_>, kinds: Vec<MixerKind>) -> Result<Mamba2> {
    let d_conv = k.int("ssm.conv_kernel", 2, 64)?;
    let d_inner = k.int("ssm.inner_size", 1, MAX_WIDTH)?;
    let d_state = k.int("ssm.state_size", 1, 4096)?;
    let n_ssm_head = k.int("ssm.time_step_rank", 1, 4096)?;
    let n_group = k.int("ssm.group_count", 1, 4096)?;
    for (name, d) in [
        ("ssm.time_step_rank", n_ssm_head),
        ("ssm.group_count", n_group),
    ] {
        if d_inner % d != 0 {
            return Err(invalid(
                &k.key(name),
                d,
                format!("must divide ssm.inner_size ({d_inner})"),
            ));
        }
    }
    if (2 * n_group).saturating_mul(d_state) > MAX_WIDTH {
        return Err(invalid(
            &k.key("ssm.group_count"),
            n_group,
            format!("gives convolution channels wider than {MAX_WIDTH}"),
        ));
    }
    Ok(Mamba2 {
        layers: kinds.iter().map(|&m| m == MixerKind::Mamba2).collect(),
        kinds,
        d_conv,
        d_inner,
        d_state,
        n_head: n_ssm_head,
        n_group,
    })
}

/// Layer `l`'s weights, registered in `specs` with the shapes `hp` and `s` imply. A block runs
/// one mixer: `qkv` and `wo` are its input and output projections (attention's Q, K and V;
/// Mamba-2's `ssm_in` as `Fused`; the network's `ffn_up` as `Fused`), and `ffn_norm` repeats
/// `attn_norm` (there is no second norm).
pub(super) fn layer_weights(
    specs: &mut Specs<'_>,
    hp: &HParams,
    s: &Mamba2,
    l: usize,
) -> Result<LayerWeights> {
    let n = |s: &str| format!("blk.{l}.{s}");
    let attn_norm = specs.require(&n("attn_norm.weight"), &[hp.n_embd], Role::Vector)?;
    let Mixer {
        qkv,
        wo,
        bias,
        mamba2,
    } = mixer(specs, hp, s, l)?;
    let [bq, bk, bv, bo] = bias;
    Ok(LayerWeights {
        attn_norm,
        qkv,
        wo,
        bo,
        bq,
        bk,
        bv,
        q_norm: None,
        k_norm: None,
        attn_sinks: None,
        post_attn_norm: None,
        post_ffn_norm: None,
        ffn_norm: attn_norm,
        ffn: Ffn::None,
        gemma4: None,
        delta: None,
        short_conv: None,
        mamba2,
    })
}

/// One layer's mixer tensors: its input and output projections, the attention's optional
/// biases (Q, K, V, output) and a Mamba-2 layer's own tensors.
pub(super) struct Mixer {
    pub qkv: Qkv<usize>,
    pub wo: usize,
    pub bias: [Option<usize>; 4],
    pub mamba2: Option<Mamba2Weights<usize>>,
}

/// Layer `l`'s mixer, registered in `specs`: Mamba-2 (`ssm_in` as `Fused`), attention, or
/// the feed-forward network of nemotron_h (`ffn_up` as `Fused`, `ffn_down` as `wo`).
pub(super) fn mixer(specs: &mut Specs<'_>, hp: &HParams, s: &Mamba2, l: usize) -> Result<Mixer> {
    let e = hp.n_embd;
    let n = |s: &str| format!("blk.{l}.{s}");
    let (m, v) = (Role::Matrix, Role::Vector);
    let mut bias = [None; 4];
    let mut mamba2 = None;
    let (qkv, wo) = match s.kinds[l] {
        MixerKind::Mamba2 => {
            let in_proj = specs.require(&n("ssm_in.weight"), &[e, s.in_proj_len()], m)?;
            let ch = s.conv_channels();
            mamba2 = Some(Mamba2Weights {
                conv: specs.require(&n("ssm_conv1d.weight"), &[s.d_conv, ch], v)?,
                conv_bias: specs.require(&n("ssm_conv1d.bias"), &[ch], v)?,
                dt_bias: specs.require(&n("ssm_dt.bias"), &[s.n_head], v)?,
                a: specs.require(&n("ssm_a"), &[1, s.n_head], v)?,
                d: specs.require(&n("ssm_d"), &[1, s.n_head], v)?,
                norm: specs.require(
                    &n("ssm_norm.weight"),
                    &[s.d_inner / s.n_group, s.n_group],
                    v,
                )?,
            });
            let out = specs.require(&n("ssm_out.weight"), &[s.d_inner, e], m)?;
            (Qkv::Fused(in_proj), out)
        }
        MixerKind::Attention => {
            let (q, kv) = (hp.head_dim * hp.n_head, hp.n_embd_kv());
            let qkv = Qkv::Split {
                wq: specs.require(&n("attn_q.weight"), &[e, q], m)?,
                wk: specs.require(&n("attn_k.weight"), &[e, kv], m)?,
                wv: specs.require(&n("attn_v.weight"), &[e, kv], m)?,
            };
            for (b, (name, dim)) in bias.iter_mut().zip([
                ("attn_q.bias", q),
                ("attn_k.bias", kv),
                ("attn_v.bias", kv),
                ("attn_output.bias", e),
            ]) {
                *b = specs.find(&n(name), &[dim], v)?;
            }
            let wo = specs.require(&n("attn_output.weight"), &[q, e], m)?;
            (qkv, wo)
        }
        MixerKind::Mlp => {
            let up = specs.require(&n("ffn_up.weight"), &[e, hp.n_ff], m)?;
            let down = specs.require(&n("ffn_down.weight"), &[hp.n_ff, e], m)?;
            (Qkv::Fused(up), down)
        }
    };
    Ok(Mixer {
        qkv,
        wo,
        bias,
        mamba2,
    })
}
