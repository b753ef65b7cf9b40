//! The tensors of one transformer block, as indices into the model's weights or as handles
//! borrowed from them: the attention's projections (split or fused) and sinks, the norms each
//! family has, and the feed-forward network (dense or a mixture of experts).

use super::{Arch, GateUp, HParams, Role, Specs};
use crate::error::{Error, Result};

/// One block's tensors: indices into the model's weights, or handles borrowed from them.
pub(crate) struct LayerWeights<T = usize> {
    pub attn_norm: T,
    /// Q, K and V: three matrices, or one fused (`wqkv`, rows Q then K then V; phi3).
    pub qkv: Qkv<T>,
    pub wo: T,
    /// Bias of the output projection (phi3 files may have one).
    pub bo: Option<T>,
    pub bq: Option<T>,
    pub bk: Option<T>,
    pub bv: Option<T>,
    /// Per-head RMSNorm weights of Q and K (qwen3).
    pub q_norm: Option<T>,
    pub k_norm: Option<T>,
    /// Each query head's learned attention sink (`attn_sinks`, f32 `[n_head]`; gpt-oss).
    pub attn_sinks: Option<T>,
    /// RMSNorm weights after attention and after the feed-forward network (gemma3).
    pub post_attn_norm: Option<T>,
    pub post_ffn_norm: Option<T>,
    pub ffn_norm: T,
    pub ffn: Ffn<T>,
    /// Gemma 4's further tensors and facts.
    pub gemma4: Option<super::gemma4::Gemma4Layer<T>>,
    /// A gated delta-net block (qwen35, qwen35moe, qwen3next): then `qkv` is `Fused` (the
    /// convolution's input projection, or qwen3next's `ssm_in`, which gives `z` too), `wo` the output projection and `ffn_norm` the norm after the mixer.
    pub delta: Option<DeltaNetWeights<T>>,
    /// A gated short convolution's kernel (lfm2, `[l_cache, n_embd]`): then `qkv` is `Fused`
    /// (the input projection giving B, C and x) and `wo` the output projection.
    pub short_conv: Option<T>,
    /// A Mamba-2 layer's tensors besides its input and output projections (nemotron_h): then
    /// `qkv` is `Fused` (`ssm_in`) and `wo` is `ssm_out`.
    pub mamba2: Option<Mamba2Weights<T>>,
}

/// The tensors of a Mamba-2 layer besides its input and output projections, f32.
#[derive(Clone, Copy)]
pub(crate) struct Mamba2Weights<T> {
    /// The convolution's kernel (`ssm_conv1d`, `[d_conv, channels]`) and bias (`[channels]`).
    pub conv: T,
    pub conv_bias: T,
    /// Bias added to dt before the scan's softplus (`ssm_dt.bias`, `[n_head]`).
    pub dt_bias: T,
    /// `-exp(A_log)` per head (`ssm_a`, `[1, n_head]`).
    pub a: T,
    /// The skip connection's factor per head (`ssm_d`, `[1, n_head]`).
    pub d: T,
    /// RMSNorm weights of the gated output, per group (`ssm_norm`, `[d_inner / n_group,
    /// n_group]`).
    pub norm: T,
}

impl<T: Copy> Mamba2Weights<T> {
    fn all(self) -> [T; 6] {
        [
            self.conv,
            self.conv_bias,
            self.dt_bias,
            self.a,
            self.d,
            self.norm,
        ]
    }
    fn map<U>(self, f: impl Fn(T) -> U) -> Mamba2Weights<U> {
        Mamba2Weights {
            conv: f(self.conv),
            conv_bias: f(self.conv_bias),
            dt_bias: f(self.dt_bias),
            a: f(self.a),
            d: f(self.d),
            norm: f(self.norm),
        }
    }
}

/// The tensors of a gated delta-net besides its input and output projections.
#[derive(Clone, Copy)]
pub(crate) struct DeltaNetWeights<T> {
    /// `z`, the output gate's projection (`attn_gate`, `[n_embd, inner]`); `None` when the
    /// input projection gives it too (qwen3next's `ssm_in`).
    pub gate: Option<T>,
    /// The convolution's kernel (`ssm_conv1d`, `[conv_kernel, channels]`, f32).
    pub conv: T,
    /// Bias added to `alpha` before the softplus (`ssm_dt.bias`, `[n_v_heads]`).
    pub dt_bias: T,
    /// `-exp(A_log)` per value head (`ssm_a`, `[n_v_heads]`).
    pub a: T,
    /// The projections giving beta and alpha per value head.
    pub beta_alpha: BetaAlpha<T>,
    /// RMSNorm weights of each value head's output (`ssm_norm`, `[head_dim]`).
    pub norm: T,
}

/// A delta-net's projections to beta and alpha.
#[derive(Clone, Copy)]
pub(crate) enum BetaAlpha<T> {
    /// Two projections, `[n_embd, n_v_heads]` each (`ssm_beta`, `ssm_alpha`; qwen35).
    Split { beta: T, alpha: T },
    /// One (`ssm_ba`, `[n_embd, 2 * n_v_heads]`; qwen3next): per key head, the betas of its
    /// value heads, then their alphas.
    Fused(T),
}

impl<T: Copy> DeltaNetWeights<T> {
    fn all(self) -> Vec<T> {
        let mut v = vec![self.conv, self.dt_bias, self.a, self.norm];
        v.extend(self.gate);
        match self.beta_alpha {
            BetaAlpha::Split { beta, alpha } => v.extend([beta, alpha]),
            BetaAlpha::Fused(ba) => v.push(ba),
        }
        v
    }
    fn map<U>(self, f: impl Fn(T) -> U) -> DeltaNetWeights<U> {
        DeltaNetWeights {
            gate: self.gate.map(&f),
            conv: f(self.conv),
            dt_bias: f(self.dt_bias),
            a: f(self.a),
            beta_alpha: match self.beta_alpha {
                BetaAlpha::Split { beta, alpha } => BetaAlpha::Split {
                    beta: f(beta),
                    alpha: f(alpha),
                },
                BetaAlpha::Fused(ba) => BetaAlpha::Fused(f(ba)),
            },
            norm: f(self.norm),
        }
    }
}

/// The feed-forward network of a block.
#[derive(Clone, Copy)]
pub(crate) enum Ffn<T> {
    /// `down · act(gate · x) * (up · x)`; with no `gate`, `up` holds the gate's rows, then the
    /// up projection's (phi3).
    Dense { gate: Option<T>, up: T, down: T },
    /// Mixture of experts: `gate_inp` scores the experts (`[n_embd, n_expert]`), the best few
    /// run, each a dense SwiGLU network, stacked in `[.., .., n_expert]` tensors; with a shared
    /// expert every token also runs (qwen2moe); with biases, each product has one (gpt-oss).
    Experts {
        gate_inp: T,
        /// The experts' gate and up projections: two stacks, or one (`ffn_gate_up_exps`,
        /// each expert's gate rows then its up rows).
        gate_up: GateUp<T>,
        down: T,
        shared: Option<SharedExpert<T>>,
        biases: Option<ExpertBiases<T>>,
        /// Added to the router's probabilities to choose the experts, not to weigh them
        /// (`exp_probs_b`, `[n_expert]`, f32; lfm2moe).
        probs_bias: Option<T>,
    },
    /// No feed-forward network: the block's one mixer is all it runs (nemotron_h).
    None,
}

/// The biases of a mixture's products (gpt-oss), f32: the router's (`[n_expert]`), and each
/// expert's gate and up (`[n_ff_exp, n_expert]`) and down (`[n_embd, n_expert]`) biases.
#[derive(Clone, Copy)]
pub(crate) struct ExpertBiases<T> {
    pub gate_inp: T,
    pub gate: T,
    pub up: T,
    pub down: T,
}

impl<T: Copy> ExpertBiases<T> {
    fn all(self) -> [T; 4] {
        [self.gate_inp, self.gate, self.up, self.down]
    }
    fn map<U>(self, f: impl Fn(T) -> U) -> ExpertBiases<U> {
        ExpertBiases {
            gate_inp: f(self.gate_inp),
            gate: f(self.gate),
            up: f(self.up),
            down: f(self.down),
        }
    }
}

/// The shared expert of a mixture (qwen2moe): a dense SwiGLU network (`gate`, `up`: `[n_embd,
/// ff]`, `down`: `[ff, n_embd]`) whose output is multiplied by `sigmoid(gate_inp · x)`
/// (`gate_inp`: `[n_embd]`, one scalar per token).
#[derive(Clone, Copy)]
pub(crate) struct SharedExpert<T> {
    /// The sigmoid gate's weights; none in granitehybrid, whose shared expert is ungated.
    pub gate_inp: Option<T>,
    pub gate: T,
    pub up: T,
    pub down: T,
}

impl<T: Copy> SharedExpert<T> {
    fn all(self) -> Vec<T> {
        let mut v = vec![self.gate, self.up, self.down];
        v.extend(self.gate_inp);
        v
    }
    fn map<U>(self, f: impl Fn(T) -> U) -> SharedExpert<U> {
        SharedExpert {
            gate_inp: self.gate_inp.map(&f),
            gate: f(self.gate),
            up: f(self.up),
            down: f(self.down),
        }
    }
}

impl<T: Copy> Ffn<T> {
    fn all(self) -> Vec<T> {
        match self {
            Ffn::Dense { gate, up, down } => {
                let mut v = vec![up, down];
                v.extend(gate);
                v
            }
            Ffn::Experts {
                gate_inp,
                gate_up,
                down,
                shared,
                biases,
                probs_bias,
            } => {
                let mut v = vec![gate_inp, down];
                v.extend(probs_bias);
                match gate_up {
                    GateUp::Split { gate, up } => v.extend([gate, up]),
                    GateUp::Fused(w) => v.push(w),
                }
                v.extend(shared.into_iter().flat_map(SharedExpert::all));
                v.extend(biases.into_iter().flat_map(ExpertBiases::all));
                v
            }
            Ffn::None => Vec::new(),
        }
    }
    fn map<U>(self, f: impl Fn(T) -> U) -> Ffn<U> {
        match self {
            Ffn::Dense { gate, up, down } => Ffn::Dense {
                gate: gate.map(&f),
                up: f(up),
                down: f(down),
            },
            Ffn::Experts {
                gate_inp,
                gate_up,
                down,
                shared,
                biases,
                probs_bias,
            } => Ffn::Experts {
                probs_bias: probs_bias.map(&f),
                gate_inp: f(gate_inp),
                gate_up: match gate_up {
                    GateUp::Split { gate, up } => GateUp::Split {
                        gate: f(gate),
                        up: f(up),
                    },
                    GateUp::Fused(w) => GateUp::Fused(f(w)),
                },
                down: f(down),
                shared: shared.map(|s| s.map(&f)),
                biases: biases.map(|b| b.map(&f)),
            },
            Ffn::None => Ffn::None,
        }
    }
}

/// The attention's input projections.
#[derive(Clone, Copy)]
pub(crate) enum Qkv<T> {
    Split { wq: T, wk: T, wv: T },
    Fused(T),
}

impl<T: Copy> Qkv<T> {
    fn all(self) -> Vec<T> {
        match self {
            Qkv::Split { wq, wk, wv } => vec![wq, wk, wv],
            Qkv::Fused(w) => vec![w],
        }
    }
    fn map<U>(self, f: impl Fn(T) -> U) -> Qkv<U> {
        match self {
            Qkv::Split { wq, wk, wv } => Qkv::Split {
                wq: f(wq),
                wk: f(wk),
                wv: f(wv),
            },
            Qkv::Fused(w) => Qkv::Fused(f(w)),
        }
    }
}

impl LayerWeights<usize> {
    /// Every tensor index of the block.
    pub(super) fn indices(&self) -> Vec<usize> {
        let mut all = vec![self.attn_norm, self.wo, self.ffn_norm];
        all.extend(self.qkv.all());
        all.extend(self.ffn.all());
        all.extend(
            [
                self.bo,
                self.bq,
                self.bk,
                self.bv,
                self.q_norm,
                self.k_norm,
                self.attn_sinks,
                self.post_attn_norm,
                self.post_ffn_norm,
            ]
            .into_iter()
            .flatten(),
        );
        all.extend(self.gemma4.iter().flat_map(|x| x.all()));
        all.extend(self.delta.into_iter().flat_map(DeltaNetWeights::all));
        all.extend(self.short_conv);
        all.extend(self.mamba2.into_iter().flat_map(Mamba2Weights::all));
        all
    }
}

impl<T: Copy> LayerWeights<T> {
    pub(super) fn map<U>(&self, f: impl Fn(T) -> U) -> LayerWeights<U> {
        LayerWeights {
            attn_norm: f(self.attn_norm),
            qkv: self.qkv.map(&f),
            wo: f(self.wo),
            bo: self.bo.map(&f),
            bq: self.bq.map(&f),
            bk: self.bk.map(&f),
            bv: self.bv.map(&f),
            q_norm: self.q_norm.map(&f),
            k_norm: self.k_norm.map(&f),
            attn_sinks: self.attn_sinks.map(&f),
            post_attn_norm: self.post_attn_norm.map(&f),
            post_ffn_norm: self.post_ffn_norm.map(&f),
            ffn_norm: f(self.ffn_norm),
            ffn: self.ffn.map(&f),
            gemma4: self.gemma4.as_ref().map(|x| x.map(&f)),
            delta: self.delta.map(|d| d.map(&f)),
            short_conv: self.short_conv.map(&f),
            mamba2: self.mamba2.map(|m| m.map(&f)),
        }
    }
}

/// Which of the block's optional tensors a family requires.
struct Extras {
    /// Q/K/V biases (qwen2, qwen2moe); for the others they are optional (some finetunes carry
    /// them; gpt-oss files have them, which llama.cpp does not require).
    qkv_bias: bool,
    /// Per-head norms of Q and K (qwen3, gemma3 and the families built on them).
    head_norm: bool,
    /// Norms of the outputs of attention and of the feed-forward network (gemma2, gemma3).
    post_norm: bool,
}

impl Extras {
    fn of(arch: Arch) -> Extras {
        let qkv_bias = match arch {
            Arch::Qwen2 | Arch::Qwen2Moe => true,
            Arch::Llama
            | Arch::Qwen3
            | Arch::Gemma3
            | Arch::Gemma2
            | Arch::Phi3
            | Arch::Qwen3Moe
            | Arch::Gemma4
            | Arch::Mistral3
            | Arch::Qwen35
            | Arch::Qwen35Moe
            | Arch::Qwen3Next
            | Arch::GptOss
            | Arch::Lfm2
            | Arch::Lfm2Moe
            | Arch::NemotronH
            | Arch::GraniteHybrid => false,
        };
        let head_norm = match arch {
            Arch::Qwen3
            | Arch::Gemma3
            | Arch::Qwen3Moe
            | Arch::Qwen35
            | Arch::Qwen35Moe
            | Arch::Qwen3Next
            | Arch::Lfm2
            | Arch::Lfm2Moe => true,
            Arch::Llama
            | Arch::Qwen2
            | Arch::Gemma2
            | Arch::Phi3
            | Arch::Qwen2Moe
            | Arch::Gemma4
            | Arch::Mistral3
            | Arch::GptOss
            | Arch::NemotronH
            | Arch::GraniteHybrid => false,
        };
        let post_norm = match arch {
            Arch::Gemma3 | Arch::Gemma2 => true,
            Arch::Llama
            | Arch::Qwen2
            | Arch::Qwen3
            | Arch::Phi3
            | Arch::Qwen3Moe
            | Arch::Qwen2Moe
            | Arch::Gemma4
            | Arch::Mistral3
            | Arch::Qwen35
            | Arch::Qwen35Moe
            | Arch::Qwen3Next
            | Arch::GptOss
            | Arch::Lfm2
            | Arch::Lfm2Moe
            | Arch::NemotronH
            | Arch::GraniteHybrid => false,
        };
        Extras {
            qkv_bias,
            head_norm,
            post_norm,
        }
    }
}

/// The weights of layer `l`, looked up (and registered in `specs`) in the order the forward
/// pass reads them, with the shapes `hp` implies for its architecture.
pub(super) fn layer_weights(specs: &mut Specs<'_>, hp: &HParams, l: usize) -> Result<LayerWeights> {
    let (e, kv, q) = (hp.n_embd, hp.n_embd_kv(), hp.head_dim * hp.n_head);
    let n = |s: &str| format!("blk.{l}.{s}");
    let has = Extras::of(hp.arch);
    let bias = |specs: &mut Specs<'_>, name: &str, dim: usize| match has.qkv_bias {
        true => specs.require(&n(name), &[dim], Role::Vector).map(Some),
        false => specs.find(&n(name), &[dim], Role::Vector),
    };
    let head_norm = |specs: &mut Specs<'_>, name: &str| match has.head_norm {
        true => specs
            .require(&n(name), &[hp.head_dim], Role::Vector)
            .map(Some),
        false => Ok(None),
    };
    let post_norm = |specs: &mut Specs<'_>, name: &str| match has.post_norm {
        true => specs.require(&n(name), &[e], Role::Vector).map(Some),
        false => Ok(None),
    };
    let gpt_oss = hp.arch == Arch::GptOss;
    let (m, v) = (Role::Matrix, Role::Vector);
    // phi3 may fuse Q, K and V into one matrix, and always fuses gate and up.
    let qkv = match specs.find(&n("attn_qkv.weight"), &[e, q + 2 * kv], m)? {
        Some(w) => Qkv::Fused(w),
        None => Qkv::Split {
            wq: specs.require(&n("attn_q.weight"), &[e, q], m)?,
            wk: specs.require(&n("attn_k.weight"), &[e, kv], m)?,
            wv: specs.require(&n("attn_v.weight"), &[e, kv], m)?,
        },
    };
    let ffn = match (&hp.experts, hp.arch) {
        (Some(x), _) => experts(specs, hp, x, l)?,
        (None, Arch::Phi3) => Ffn::Dense {
            gate: None,
            up: specs.require(&n("ffn_up.weight"), &[e, 2 * hp.n_ff], m)?,
            down: specs.require(&n("ffn_down.weight"), &[hp.n_ff, e], m)?,
        },
        (None, _) => Ffn::Dense {
            gate: Some(specs.require(&n("ffn_gate.weight"), &[e, hp.n_ff], m)?),
            up: specs.require(&n("ffn_up.weight"), &[e, hp.n_ff], m)?,
            down: specs.require(&n("ffn_down.weight"), &[hp.n_ff, e], m)?,
        },
    };
    if hp.arch == Arch::Phi3 && specs.gguf.tensor("rope_factors_long.weight").is_some() {
        return Err(Error::BadTensor {
            name: "rope_factors_long.weight".into(),
            reason: "LongRoPE (Phi-3 128k, Phi-3.5) is not supported yet".into(),
        });
    }
    Ok(LayerWeights {
        attn_norm: specs.require(&n("attn_norm.weight"), &[e], v)?,
        qkv,
        wo: specs.require(&n("attn_output.weight"), &[q, e], m)?,
        // Required for gpt-oss (as llama.cpp), optional for the others (phi3 files may have one).
        bo: match gpt_oss {
            true => Some(specs.require(&n("attn_output.bias"), &[e], v)?),
            false => specs.find(&n("attn_output.bias"), &[e], v)?,
        },
        bq: bias(specs, "attn_q.bias", q)?,
        bk: bias(specs, "attn_k.bias", kv)?,
        bv: bias(specs, "attn_v.bias", kv)?,
        q_norm: head_norm(specs, "attn_q_norm.weight")?,
        k_norm: head_norm(specs, "attn_k_norm.weight")?,
        attn_sinks: match gpt_oss {
            true => Some(specs.require(&n("attn_sinks.weight"), &[hp.n_head], v)?),
            false => None,
        },
        post_attn_norm: post_norm(specs, "post_attention_norm.weight")?,
        post_ffn_norm: post_norm(specs, "post_ffw_norm.weight")?,
        // gpt-oss names its feed-forward network's norm after the attention it follows.
        ffn_norm: match gpt_oss {
            true => specs.require(&n("post_attention_norm.weight"), &[e], v)?,
            false => specs.require(&n("ffn_norm.weight"), &[e], v)?,
        },
        ffn,
        gemma4: None,
        delta: None,
        short_conv: None,
        mamba2: None,
    })
}

/// Layer `l`'s mixture of experts `x` as llama.cpp's loader shapes it: the router, the
/// experts' stacked projections, the shared expert where `x` has one, and gpt-oss's biases.
pub(super) fn experts(
    specs: &mut Specs<'_>,
    hp: &HParams,
    x: &super::Experts,
    l: usize,
) -> Result<Ffn<usize>> {
    let (e, m, v) = (hp.n_embd, Role::Matrix, Role::Vector);
    let n = |s: &str| format!("blk.{l}.{s}");
    let gpt_oss = hp.arch == Arch::GptOss;
    let (ff, nx) = (x.n_ff_exp, x.n_expert);
    Ok(Ffn::Experts {
        gate_inp: specs.require(&n("ffn_gate_inp.weight"), &[e, x.n_expert], m)?,
        // One stack of gate and up where the file has it (llama.cpp reads either; gpt-oss's
        // biases go with two).
        gate_up: match gpt_oss {
            false => specs.find(&n("ffn_gate_up_exps.weight"), &[e, 2 * ff, nx], m)?,
            true => None,
        }
        .map_or_else(
            || -> Result<GateUp<usize>> {
                Ok(GateUp::Split {
                    gate: specs.require(&n("ffn_gate_exps.weight"), &[e, ff, nx], m)?,
                    up: specs.require(&n("ffn_up_exps.weight"), &[e, ff, nx], m)?,
                })
            },
            |w| Ok(GateUp::Fused(w)),
        )?,
        down: specs.require(&n("ffn_down_exps.weight"), &[x.n_ff_exp, e, x.n_expert], m)?,
        probs_bias: None,
        shared: match x.n_ff_shared {
            Some(ff) => Some(SharedExpert {
                gate_inp: Some({
                    // `[n_embd]`, or `[n_embd, 1]` as some converters write it
                    // (llama.cpp accepts both: trailing dimensions of 1).
                    let name = n("ffn_gate_inp_shexp.weight");
                    let column = specs
                        .gguf
                        .tensor(&name)
                        .is_some_and(|t| t.shape == [e as u64, 1]);
                    let shape: &[usize] = if column { &[e, 1] } else { &[e] };
                    specs.require(&name, shape, m)?
                }),
                gate: specs.require(&n("ffn_gate_shexp.weight"), &[e, ff], m)?,
                up: specs.require(&n("ffn_up_shexp.weight"), &[e, ff], m)?,
                down: specs.require(&n("ffn_down_shexp.weight"), &[ff, e], m)?,
            }),
            None => None,
        },
        // gpt-oss: a bias on the router and on each expert's products.
        biases: match gpt_oss {
            true => Some(ExpertBiases {
                gate_inp: specs.require(&n("ffn_gate_inp.bias"), &[x.n_expert], v)?,
                gate: specs.require(&n("ffn_gate_exps.bias"), &[x.n_ff_exp, x.n_expert], v)?,
                up: specs.require(&n("ffn_up_exps.bias"), &[x.n_ff_exp, x.n_expert], v)?,
                down: specs.require(&n("ffn_down_exps.bias"), &[e, x.n_expert], v)?,
            }),
            false => None,
        },
    })
}

/// As llama.cpp: a tensor of `gguf` the forward pass does not `read` means a variant of the
/// architecture this engine does not run (a bias, an extra projection); its weights would be
/// ignored, so the file is refused rather than answered wrongly. The blocks past the `n_layer`
/// run (multi-token prediction heads, `nextn_predict_layers`) are not read, as llama.cpp's
/// main graph does not.
pub(super) fn all_read(gguf: &crate::gguf::Gguf, hp: &HParams, read: &[&str]) -> Result<()> {
    let blocks = gguf.get_u32(&format!("{}.block_count", hp.arch.name()))? as usize;
    let past_the_run = |name: &str| {
        let block = name.strip_prefix("blk.").and_then(|r| r.split('.').next());
        block
            .and_then(|b| b.parse::<usize>().ok())
            .is_some_and(|b| (hp.n_layer..blocks).contains(&b))
    };
    let read: std::collections::HashSet<&str> = read.iter().copied().collect();
    match gguf
        .tensors()
        .iter()
        .find(|t| !read.contains(t.name.as_str()) && !past_the_run(&t.name))
    {
        Some(t) => Err(Error::BadTensor {
            name: t.name.clone(),
            reason: format!(
                "not read by the {} forward pass (a variant this engine does not run)",
                hp.arch.name()
            ),
        }),
        None => Ok(()),
    }
}
