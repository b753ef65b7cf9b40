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
}

/// The feed-forward network of a block.
#[derive(Clone, Copy)]
pub(crate) enum Ffn<T> {
    /// `down · act(gate · x) * (up · x)`; with no `gate`, `up` holds the gate's rows, then the
    /// up projection's (phi3).
    Dense { gate: Option<T>, up: T, down: T },
    /// Mixture of experts: `gate_inp` scores the experts (`[n_embd, n_expert]`), the best few
    /// run, each a dense SwiGLU network, stacked in `[.., .., n_expert]` tensors.
    Experts {
        gate_inp: T,
        gate: T,
        up: T,
        down: T,
    },
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
            } => vec![gate_inp, gate, up, down],
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
            } => Ffn::Experts {
                gate_inp: f(gate_inp),
                gate: f(gate),
                up: f(up),
                down: f(down),
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
        }
    }
}
