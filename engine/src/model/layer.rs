//! The tensors of one transformer block, as indices into the model's weights or as handles
//! borrowed from them: the attention's projections (split or fused) and sinks, the norms each
//! family has, and the feed-forward network (dense or a mixture of experts).

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
        gate: T,
        up: T,
        down: T,
        shared: Option<SharedExpert<T>>,
        biases: Option<ExpertBiases<T>>,
    },
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
    pub gate_inp: T,
    pub gate: T,
    pub up: T,
    pub down: T,
}

impl<T: Copy> SharedExpert<T> {
    fn all(self) -> [T; 4] {
        [self.gate_inp, self.gate, self.up, self.down]
    }
    fn map<U>(self, f: impl Fn(T) -> U) -> SharedExpert<U> {
        SharedExpert {
            gate_inp: f(self.gate_inp),
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
                gate,
                up,
                down,
                shared,
                biases,
            } => {
                let mut v = vec![gate_inp, gate, up, down];
                v.extend(shared.into_iter().flat_map(SharedExpert::all));
                v.extend(biases.into_iter().flat_map(ExpertBiases::all));
                v
            }
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
                gate,
                up,
                down,
                shared,
                biases,
            } => Ffn::Experts {
                gate_inp: f(gate_inp),
                gate: f(gate),
                up: f(up),
                down: f(down),
                shared: shared.map(|s| s.map(&f)),
                biases: biases.map(|b| b.map(&f)),
            },
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
        }
    }
}
