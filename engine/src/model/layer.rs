//! The tensors of one transformer block, as indices into the model's weights or as handles
//! borrowed from them: the attention's projections (split or fused), the norms each family
//! has, and the feed-forward network (dense or a mixture of experts).

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
    /// RMSNorm weights after attention and after the feed-forward network (gemma3).
    pub post_attn_norm: Option<T>,
    pub post_ffn_norm: Option<T>,
    pub ffn_norm: T,
    pub ffn: Ffn<T>,
    /// Gemma 4's further tensors and facts.
    pub gemma4: Option<super::gemma4::Gemma4Layer<T>>,
    /// A gated delta-net block (qwen35): then `qkv` is `Fused` (the convolution's input
    /// projection), `wo` the output projection and `ffn_norm` the norm after the mixer.
    pub delta: Option<DeltaNetWeights<T>>,
}

/// The tensors of a gated delta-net besides its input and output projections.
#[derive(Clone, Copy)]
pub(crate) struct DeltaNetWeights<T> {
    /// `z`, the output gate's projection (`attn_gate`, `[n_embd, inner]`).
    pub gate: T,
    /// The convolution's kernel (`ssm_conv1d`, `[conv_kernel, channels]`, f32).
    pub conv: T,
    /// Bias added to `alpha` before the softplus (`ssm_dt.bias`, `[n_v_heads]`).
    pub dt_bias: T,
    /// `-exp(A_log)` per value head (`ssm_a`, `[n_v_heads]`).
    pub a: T,
    /// Projections giving beta and alpha per value head (`[n_embd, n_v_heads]`).
    pub beta: T,
    pub alpha: T,
    /// RMSNorm weights of each value head's output (`ssm_norm`, `[head_dim]`).
    pub norm: T,
}

impl<T: Copy> DeltaNetWeights<T> {
    fn all(self) -> [T; 7] {
        [
            self.gate,
            self.conv,
            self.dt_bias,
            self.a,
            self.beta,
            self.alpha,
            self.norm,
        ]
    }
    fn map<U>(self, f: impl Fn(T) -> U) -> DeltaNetWeights<U> {
        DeltaNetWeights {
            gate: f(self.gate),
            conv: f(self.conv),
            dt_bias: f(self.dt_bias),
            a: f(self.a),
            beta: f(self.beta),
            alpha: f(self.alpha),
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
    /// expert every token also runs (qwen2moe).
    Experts {
        gate_inp: T,
        gate: T,
        up: T,
        down: T,
        shared: Option<SharedExpert<T>>,
    },
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
            } => {
                let mut v = vec![gate_inp, gate, up, down];
                v.extend(shared.into_iter().flat_map(SharedExpert::all));
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
            } => Ffn::Experts {
                gate_inp: f(gate_inp),
                gate: f(gate),
                up: f(up),
                down: f(down),
                shared: shared.map(|s| s.map(&f)),
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
                self.post_attn_norm,
                self.post_ffn_norm,
            ]
            .into_iter()
            .flatten(),
        );
        all.extend(self.gemma4.iter().flat_map(|x| x.all()));
        all.extend(self.delta.into_iter().flat_map(DeltaNetWeights::all));
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
            post_attn_norm: self.post_attn_norm.map(&f),
            post_ffn_norm: self.post_ffn_norm.map(&f),
            ffn_norm: f(self.ffn_norm),
            ffn: self.ffn.map(&f),
            gemma4: self.gemma4.as_ref().map(|x| x.map(&f)),
            delta: self.delta.map(|d| d.map(&f)),
        }
    }
}
