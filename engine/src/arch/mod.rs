//! The forward pass as a ggml graph: one module per family of architectures (`llama.rs`:
//! llama, qwen2, qwen3, phi3, qwen3moe, qwen2moe; `gemma.rs`: gemma2, gemma3; `gemma4.rs`;
//! `mistral3.rs`; `qwen35.rs`: qwen35, qwen35moe, qwen3next, with `qwen3next.rs`'s pieces;
//! `gpt_oss.rs`: gpt-oss; `lfm2.rs`: lfm2, lfm2moe; `nemotron_h.rs`: nemotron_h and the Mamba-2
//! layer; `granite_hybrid.rs`) over the building blocks here, which
//! every family shares: the batch's inputs, RMSNorm, projections, attention over the page
//! pool, the gated feed-forward network (or a mixture of experts) and the output head.
//!
//! Attention uses ggml's fused flash-attention kernel over the KV cache (f16 or q8_0) with a
//! causal mask, or with the sliding window's mask in the layers that have one; each sequence
//! attends on its own window of the pool (see [`Plan`]). Layers with attention sinks (gpt-oss)
//! always take ggml's kernels, which add the sinks; ggml-sys's kernel has none.

mod ffn;
mod gemma;
mod gemma4;
mod gpt_oss;
mod granite_hybrid;
mod lfm2;
mod llama;
mod mistral3;
mod nemotron_h;
mod qwen35;
mod qwen3next;

use crate::batch::{Output, Plan};
use crate::error::Result;
use crate::ggml::{
    DType, Graph, KvTensors, KvTensorsMut, RawTensor, RopeParams, Tensor, TensorMut,
};
use crate::model::{Arch, HParams, Model, Qkv, RopeScaling};
use crate::recurrent::{SlotPair, StateBatch};

/// Builds the graph evaluating the batch `plan` describes: each token's K and V are written
/// into its cell of the page pool, each token attends to the cells its mask allows; returns the
/// logits tensor (`[n_vocab, plan.out_rows.len()]`), or for [`Output::Embeddings`] the final
/// norm's output (`[n_embd, plan.out_rows.len()]`, what llama.cpp calls the embeddings of a
/// causal model), or for [`Output::Rank`] that output through the classifier head. The KV pool is borrowed mutably for the graph's life: the graph writes its cells.
/// A hybrid model's recurrent layers read and write the slots `state` gives per item.
pub(crate) fn build<'g, 'w>(
    g: &mut Graph<'g, 'w>,
    model: &'w Model,
    kv: &'w mut KvTensors,
    state: Option<StateBatch<'w>>,
    plan: &Plan,
    flash_attn: bool,
    output: Output,
) -> Result<Tensor<'g>> {
    let mut f = Forward::new(g, model, kv, plan, flash_attn);
    f.state = state;
    let x = match model.hparams().arch {
        Arch::Llama | Arch::Qwen2 | Arch::Qwen3 | Arch::Phi3 | Arch::Qwen3Moe | Arch::Qwen2Moe => {
            llama::blocks(g, &mut f)
        }
        Arch::Gemma3 | Arch::Gemma2 => gemma::blocks(g, &mut f),
        Arch::Gemma4 => gemma4::blocks(g, &mut f),
        Arch::Mistral3 => mistral3::blocks(g, &mut f),
        Arch::Qwen35 | Arch::Qwen35Moe | Arch::Qwen3Next => qwen35::blocks(g, &mut f)?,
        Arch::GptOss => gpt_oss::blocks(g, &mut f),
        Arch::Lfm2 | Arch::Lfm2Moe => lfm2::blocks(g, &mut f)?,
        Arch::NemotronH => nemotron_h::blocks(g, &mut f)?,
        Arch::GraniteHybrid => granite_hybrid::blocks(g, &mut f)?,
    };
    Ok(f.head(g, x, output))
}

/// What the layers of one forward pass share: the model, the KV pool and the batch's inputs.
pub(super) struct Forward<'p, 'g, 'w> {
    pub model: &'w Model,
    pub hp: &'w HParams,
    kv: KvTensorsMut<'w>,
    /// Per layer: a CPU kernel can read its K and V in place (for ggml-sys's attention).
    kv_host: Vec<bool>,
    plan: &'p Plan,
    flash_attn: bool,
    /// Tokens in the batch.
    pub n: usize,
    /// Token ids (i32 `[n]`).
    pub ids: Tensor<'g>,
    /// Positions (i32 `[n]`).
    pub pos: Tensor<'g>,
    cells: Tensor<'g>,
    masks: Vec<Option<Tensor<'g>>>,
    swa_masks: Vec<Option<Tensor<'g>>>,
    gathers: Vec<Option<Tensor<'g>>>,
    out_ids: Option<Tensor<'g>>,
    /// Llama-3-style RoPE frequency factors, if the model has them.
    pub freq_factors: Option<Tensor<'g>>,
    /// A hybrid model's recurrent state and each item's slots.
    pub state: Option<StateBatch<'w>>,
}

impl<'p, 'g, 'w> Forward<'p, 'g, 'w> {
    fn new(
        g: &mut Graph<'g, 'w>,
        model: &'w Model,
        kv: &'w mut KvTensors,
        plan: &'p Plan,
        flash_attn: bool,
    ) -> Self {
        let n = plan.tokens.len();
        let ids = g.input(
            DType::I32,
            &[n],
            plan.tokens
                .iter()
                .flat_map(|&t| (t as i32).to_le_bytes())
                .collect(),
        );
        let pos = g.input(DType::I32, &[n], plan.positions.clone());
        let cells = g.input(DType::I64, &[n], plan.cells.clone());
        let mut mask_input = |mask: &[u8], a: &crate::batch::SeqAttention| {
            let rows = a.rows.len() + usize::from(a.dup);
            g.input(DType::F16, &[a.n_kv, rows], mask.to_vec())
        };
        // Only the masks some layer reads: an input outside the graph gets no buffer.
        let hp = model.hparams();
        let windowed = (0..hp.n_layer).filter(|&il| hp.is_swa(il)).count();
        let masks = plan
            .attention
            .iter()
            .map(|a| (windowed < hp.n_layer).then(|| mask_input(&a.mask, a)))
            .collect();
        let swa_masks = plan
            .attention
            .iter()
            .map(|a| match (windowed > 0, &a.swa_mask) {
                (true, Some(m)) => Some(mask_input(m, a)),
                _ => None,
            })
            .collect();
        // Cells of the gathered windows (see `SeqAttention::gather`).
        let gathers = plan
            .attention
            .iter()
            .map(|a| {
                a.gather
                    .as_ref()
                    .map(|cells| g.input(DType::I32, &[a.n_kv], cells.clone()))
            })
            .collect();
        let n_out = plan.out_rows.len();
        let out_ids = (n_out < n).then(|| {
            g.input(
                DType::I32,
                &[n_out],
                plan.out_rows.iter().flat_map(|r| r.to_le_bytes()).collect(),
            )
        });
        let freq_factors = model.rope_freqs().map(|t| g.lift(t));
        Forward {
            model,
            hp: model.hparams(),
            kv_host: (0..model.hparams().n_layer)
                .map(|l| kv.cpu_readable(l))
                .collect(),
            kv: kv.tensors_mut(),
            plan,
            flash_attn,
            n,
            ids,
            pos,
            cells,
            masks,
            swa_masks,
            gathers,
            out_ids,
            freq_factors,
            state: None,
        }
    }

    /// The token embeddings (scaled by the family's factor, if any).
    pub fn embed(&self, g: &mut Graph<'g, 'w>) -> Tensor<'g> {
        let table = g.lift(self.model.tok_embd());
        let x = g.get_rows(table, self.ids);
        match self.hp.embd_scale {
            Some(s) => g.scale(x, s),
            None => x,
        }
    }

    /// RMSNorm of `x` times the weights `w`.
    pub fn norm(&self, g: &mut Graph<'g, 'w>, x: Tensor<'g>, w: RawTensor<'w>) -> Tensor<'g> {
        let w = g.lift(w);
        g.rms_norm_mul(x, w, self.hp.rms_eps)
    }

    /// RMSNorm with weights `w` if there are any, `x` unchanged otherwise.
    pub fn opt_norm(
        &self,
        g: &mut Graph<'g, 'w>,
        x: Tensor<'g>,
        w: Option<RawTensor<'w>>,
    ) -> Tensor<'g> {
        match w {
            Some(w) => self.norm(g, x, w),
            None => x,
        }
    }

    /// `w · x (+ b)`.
    pub fn project(
        &self,
        g: &mut Graph<'g, 'w>,
        x: Tensor<'g>,
        w: RawTensor<'w>,
        b: Option<RawTensor<'w>>,
    ) -> Tensor<'g> {
        let w = g.lift(w);
        let y = g.mul_mat(w, x);
        match b {
            Some(b) => {
                let b = g.lift(b);
                g.add(y, b)
            }
            None => y,
        }
    }

    /// Layer `il`'s attention inputs from the residual stream `x`: the attention norm, Q, K and
    /// V ([`Forward::qkv`]), each head of Q and K normalised where the layer has the weights,
    /// and Q and K rotated.
    pub fn attention_inputs(
        &self,
        g: &mut Graph<'g, 'w>,
        il: usize,
        x: Tensor<'g>,
    ) -> (Tensor<'g>, Tensor<'g>, Tensor<'g>) {
        let lw = self.model.layer(il);
        let cur = self.norm(g, x, lw.attn_norm);
        let (q, k, v) = self.qkv(g, il, cur);
        let q = self.opt_norm(g, q, lw.q_norm);
        let k = self.opt_norm(g, k, lw.k_norm);
        let q = self.rope(g, q, il);
        let k = self.rope(g, k, il);
        (q, k, v)
    }

    /// Layer `il`'s Q (`[head_dim, n_head, n]`), K and V (`[head_dim, n_head_kv, n]`) of the
    /// normed input `x`: three products, or one fused product whose rows are viewed apart
    /// (V copied out contiguous, since it goes to the cache as rows), biases added.
    pub fn qkv(
        &self,
        g: &mut Graph<'g, 'w>,
        il: usize,
        x: Tensor<'g>,
    ) -> (Tensor<'g>, Tensor<'g>, Tensor<'g>) {
        let lw = self.model.layer(il);
        let hp = self.hp;
        let (hd, n, n_head_kv) = (hp.head_dim_at(il), self.n, hp.n_head_kv_at(il));
        match lw.qkv {
            Qkv::Split { wq, wk, wv } => {
                let q = self.project(g, x, wq, lw.bq);
                let k = self.project(g, x, wk, lw.bk);
                let v = self.project(g, x, wv, lw.bv);
                let q = g.reshape_3d(q, hd, hp.n_head, n);
                let k = g.reshape_3d(k, hd, n_head_kv, n);
                let v = g.reshape_3d(v, hd, n_head_kv, n);
                (q, k, v)
            }
            Qkv::Fused(w) => {
                let qkv = self.project(g, x, w, None);
                let row = qkv.nb(1);
                let n_q = hd * hp.n_head;
                let mut part = |heads: usize, first: usize, b: Option<RawTensor<'w>>| {
                    let t = g.view_3d(qkv, [hd, heads, n], [hd * 4, row], first * 4);
                    match b {
                        Some(b) => {
                            let b = g.lift(b);
                            let b = g.reshape_3d(b, hd, heads, 1);
                            g.add(t, b)
                        }
                        None => t,
                    }
                };
                let q = part(hp.n_head, 0, lw.bq);
                let k = part(n_head_kv, n_q, lw.bk);
                let v = part(n_head_kv, n_q + hd * n_head_kv, lw.bv);
                let v = g.cont(v);
                (q, k, v)
            }
        }
    }

    /// The RoPE parameters of layer `il`.
    pub fn rope(&self, g: &mut Graph<'g, 'w>, x: Tensor<'g>, il: usize) -> Tensor<'g> {
        let p = rope_params(self.model, il);
        g.rope(x, self.pos, self.rope_factors(il), &p)
    }

    /// The RoPE frequency factors of layer `il`: the model's, except in gemma4's windowed
    /// layers, which have none.
    pub fn rope_factors(&self, il: usize) -> Option<Tensor<'g>> {
        match self.hp.gemma4.is_some() && self.hp.is_swa(il) {
            true => None,
            false => self.freq_factors,
        }
    }

    /// In the last layer only the rows that produce logits matter: `x` keeps those rows there.
    pub fn last_rows(&self, g: &mut Graph<'g, 'w>, il: usize, x: Tensor<'g>) -> Tensor<'g> {
        match self.out_ids {
            Some(ids) if il + 1 == self.hp.n_layer => g.get_rows(x, ids),
            _ => x,
        }
    }

    /// Attention of layer `il`: stores this batch's `k` and `v` (`[head_dim, n_head_kv, n]`,
    /// already rotated) in their cells, then each sequence's queries `q` (`[head_dim, n_head,
    /// n]`) attend to its window of the cache, scores scaled by `scale`, through the sliding
    /// window's mask in windowed layers, with the layer's attention sinks where it has them
    /// (ggml's kernels then, whatever the plan chose). Returns `[head_dim * n_head, n]`.
    pub fn attention(
        &self,
        g: &mut Graph<'g, 'w>,
        il: usize,
        q: Tensor<'g>,
        k: Tensor<'g>,
        v: Tensor<'g>,
        scale: f32,
    ) -> Tensor<'g> {
        self.attend(g, il, q, Some((k, v)), scale)
    }

    /// Attention of layer `il`, which has no KV of its own, over the cache of layer
    /// [`HParams::kv_layer`] (gemma4's shared KV): as [`Forward::attention`] without the stores.
    pub fn attention_shared(
        &self,
        g: &mut Graph<'g, 'w>,
        il: usize,
        q: Tensor<'g>,
        scale: f32,
    ) -> Tensor<'g> {
        self.attend(g, il, q, None, scale)
    }

    /// [`Forward::attention`], this batch's K and V stored first when given; the cache read is
    /// that of layer `kv_layer(il)`.
    fn attend(
        &self,
        g: &mut Graph<'g, 'w>,
        il: usize,
        q: Tensor<'g>,
        kv: Option<(Tensor<'g>, Tensor<'g>)>,
        scale: f32,
    ) -> Tensor<'g> {
        let hp = self.hp;
        let (head_dim, n_head, n_head_kv, n) =
            (hp.head_dim_at(il), hp.n_head, hp.n_head_kv_at(il), self.n);
        let layer = il;
        // The cache this layer reads (its own, unless it reuses an earlier layer's).
        let il = hp.kv_layer(il);
        let k_cache = g.lift_mut(self.kv.k(il));
        let v_cache = g.lift_mut(self.kv.v(il));
        // Store this batch's K and V in their cells (converted to the cache's type). The stores
        // join the graph before the attention that reads the cache, so they run first. A layer
        // reusing a cache reads it after the stores of the earlier layer that owns it.
        let (k_store, v_store) = match kv {
            Some((k, v)) => {
                let k_rows = g.reshape_2d(k, hp.n_embd_kv_at(il), n);
                let v_rows = g.reshape_2d(v, hp.n_embd_kv_at(il), n);
                let k_store = g.set_rows(k_cache, k_rows, self.cells);
                let v_store = g.set_rows(v_cache, v_rows, self.cells);
                g.expand(k_store);
                g.expand(v_store);
                (k_store, v_store)
            }
            None => (k_cache.as_tensor(), v_cache.as_tensor()),
        };

        let windowed = hp.is_swa(layer);
        let sinks = self.model.layer(layer).attn_sinks.map(|s| g.lift(s));
        // Each sequence attends on its own, over the window of cells holding its pages.
        // Per sequence, q: [head_dim, m, n_head]; cached k, v: [head_dim, n_kv, n_head_kv].
        let mut parts = Vec::with_capacity(self.plan.attention.len());
        for (i, a) in self.plan.attention.iter().enumerate() {
            let mask = match (windowed, self.swa_masks[i], self.masks[i]) {
                (true, Some(m), _) | (false, _, Some(m)) => m,
                _ => unreachable!("the mask of every kind of layer the model has is an input"),
            };
            let gather = self.gathers[i];
            let m = a.rows.len();
            let q_bytes = head_dim * n_head * 4;
            let q = g.view_3d(
                q,
                [head_dim, n_head, m],
                [head_dim * 4, q_bytes],
                a.rows.start * q_bytes,
            );
            // A lone query given twice, in batch-invariant plans (see `SeqAttention::dup`).
            let q = if a.dup { g.concat(q, q, 2) } else { q };
            let q = g.permute(q, [0, 2, 1, 3]);
            let window = |g: &mut Graph<'g, 'w>, cache: TensorMut<'g>, store, value: usize| {
                // One cell's row and one head of it, in the cache's type (heads are whole
                // blocks of a quantized type).
                let cache = cache.as_tensor();
                let (cache, first_cell) = match (&a.staged, gather) {
                    // Rows of spilled pages read from their block files (see `spill.rs`),
                    // the others from the pool once this batch's rows are stored.
                    (Some(layers), _) => (g.stage(store, &layers[il][value]), 0),
                    (None, Some(cells)) => (g.gather_f16(cache, cells), 0),
                    (None, None) => (cache, a.first_cell),
                };
                let row_bytes = cache.nb(1);
                g.view_3d(
                    cache,
                    [head_dim, a.n_kv, n_head_kv],
                    [row_bytes, row_bytes / n_head_kv],
                    first_cell * row_bytes,
                )
            };
            let softcap = hp.attn_softcap.unwrap_or(0.0);
            // A window with spilled pages that ggml-sys's kernel takes reads every page where
            // it lies, through a page table: nothing is staged.
            if let Some(out) = self.paged(g, il, a, q, [k_store, v_store], mask, scale, softcap) {
                parts.push(out);
                continue;
            }
            // A window out of pool order that ggml-sys's kernel takes reads the pool's pages in
            // position order through a page table: nothing is gathered.
            let caches = [k_cache, v_cache];
            if let Some(out) = self.paged_in_order(
                g,
                il,
                a,
                q,
                [k_store, v_store],
                caches,
                mask,
                scale,
                softcap,
            ) {
                parts.push(out);
                continue;
            }
            let k = window(g, k_cache, k_store, 0);
            let v = window(g, v_cache, v_store, 1);
            let out = if self.flash_attn {
                // Result: [head_dim, n_head, m].
                let ours = a.ours && self.kv_host[il];
                g.flash_attn(q, k, v, mask, scale, softcap, sinks, ours)
            } else {
                // Unfused: scores [n_kv, m, n_head], softmax, then V transposed to
                // [n_kv, head_dim, n_head_kv] (a copy, since the cache stores V token-major).
                let kq = g.mul_mat(k, q);
                let kq = match hp.attn_softcap {
                    // As llama.cpp: capped before the softmax's own scale.
                    Some(cap) => {
                        let s = g.scale(kq, 1.0 / cap);
                        let s = g.tanh(s);
                        g.scale(s, cap)
                    }
                    None => kq,
                };
                let kq = g.soft_max_sinks(kq, mask, scale, sinks);
                let v_t = g.permute(v, [1, 0, 2, 3]);
                let v_t = g.cont(v_t);
                let kqv = g.mul_mat(v_t, kq);
                let kqv = g.permute(kqv, [0, 2, 1, 3]);
                g.cont(kqv)
            };
            // Result: [head_dim, n_head, m]; the duplicated query's output is dropped.
            parts.push(if a.dup {
                g.view_3d(out, [head_dim, n_head, 1], [head_dim * 4, q_bytes], 0)
            } else {
                out
            });
        }
        let attn = concat_tokens(g, parts);
        g.reshape_2d(attn, head_dim * n_head, n)
    }

    /// Attention of the part `a` of layer `il` through page tables, when its window has
    /// spilled pages (see `spill.rs`) and ggml-sys's kernel takes it; `None` otherwise (the
    /// window is then staged). `stores` are the layer's K and V after this batch's rows were
    /// stored: their shape and strides describe the rows, and the kernel runs after them.
    #[allow(clippy::too_many_arguments)]
    fn paged(
        &self,
        g: &mut Graph<'g, 'w>,
        il: usize,
        a: &crate::batch::SeqAttention,
        q: Tensor<'g>,
        stores: [Tensor<'g>; 2],
        mask: Tensor<'g>,
        scale: f32,
        softcap: f32,
    ) -> Option<Tensor<'g>> {
        let ops = &a.staged.as_ref()?[il];
        let (hd, n_head_kv) = (self.hp.head_dim_at(il), self.hp.n_head_kv_at(il));
        let fits = stores.iter().all(|t| a.n_kv <= t.ne(1));
        let sinks = self.hp.has_attn_sinks();
        if !(self.flash_attn && a.ours && !sinks && self.kv_host[il] && !a.dup && fits)
            || ops.iter().any(|op| op.page_table().is_empty())
        {
            return None;
        }
        let [k, v] = stores.map(|t| {
            let row = t.nb(1);
            g.view_3d(t, [hd, a.n_kv, n_head_kv], [row, row / n_head_kv], 0)
        });
        if !g.kernel_takes(q, k, v, mask, softcap) {
            return None;
        }
        if ops[0].prefetches() {
            let hint = g.prefetch(stores[0], &ops[0]);
            g.expand(hint);
        }
        let tables = [0, 1].map(|i| {
            let table = ops[i].page_table();
            g.input(DType::I64, &[table.len() / 8], table.to_vec())
        });
        Some(g.flash_attn_paged(q, k, v, mask, scale, tables))
    }

    /// Attention of the part `a` of layer `il` over a window gathered in position order
    /// ([`SeqAttention::gather`](crate::batch::SeqAttention::gather)), through page tables
    /// of the pool's rows, when ggml-sys's kernel takes it; `None` otherwise (the window is
    /// then gathered). `stores` are the layer's K and V after this batch's rows were stored
    /// (the kernel runs after them); `caches` the pool's tensors, whose rows the tables point
    /// at: the same rows, in the same order, as the gathered copy.
    #[allow(clippy::too_many_arguments)]
    fn paged_in_order(
        &self,
        g: &mut Graph<'g, 'w>,
        il: usize,
        a: &crate::batch::SeqAttention,
        q: Tensor<'g>,
        stores: [Tensor<'g>; 2],
        caches: [TensorMut<'g>; 2],
        mask: Tensor<'g>,
        scale: f32,
        softcap: f32,
    ) -> Option<Tensor<'g>> {
        let cells = a.gather.as_ref()?;
        let (hd, n_head_kv) = (self.hp.head_dim_at(il), self.hp.n_head_kv_at(il));
        let fits = stores.iter().all(|t| a.n_kv <= t.ne(1));
        if !(self.flash_attn
            && a.ours
            && !self.hp.has_attn_sinks()
            && self.kv_host[il]
            && !a.dup
            && fits
            && a.n_kv.is_multiple_of(crate::PAGE_TOKENS))
        {
            return None;
        }
        let [k, v] = stores.map(|t| {
            let row = t.nb(1);
            g.view_3d(t, [hd, a.n_kv, n_head_kv], [row, row / n_head_kv], 0)
        });
        if !g.kernel_takes(q, k, v, mask, softcap) {
            return None;
        }
        let tables = caches.map(|cache| {
            // The pool's tensor lives in host memory (`kv_host`); its rows are `row` apart.
            let base = cache.data_address();
            let row = cache.as_tensor().nb(1);
            let table: Vec<u8> = cells
                .chunks(4 * crate::PAGE_TOKENS)
                .flat_map(|page| {
                    let first = i32::from_le_bytes([page[0], page[1], page[2], page[3]]);
                    ((base + first.max(0) as usize * row) as i64).to_le_bytes()
                })
                .collect();
            g.input(DType::I64, &[table.len() / 8], table)
        });
        Some(g.flash_attn_paged(q, k, v, mask, scale, tables))
    }

    /// The final norm and the output head (soft-capped if the family says so), or the final
    /// norm's output, or that through the classifier head, as `output` says.
    fn head(&self, g: &mut Graph<'g, 'w>, x: Tensor<'g>, output: Output) -> Tensor<'g> {
        let x = self.norm(g, x, self.model.output_norm());
        debug_assert_eq!(x.ne(0), self.hp.n_embd);
        match output {
            Output::Logits => {}
            Output::Embeddings => return x,
            Output::Rank => return self.rank_head(g, x),
        }
        let mut logits = self.project(g, x, self.model.output(), None);
        // Granite divides its logits by its `logit_scale`.
        if let Some(s) = self.hp.granite.as_ref().and_then(|s| s.logit_scale) {
            logits = g.scale(logits, 1.0 / s);
        }
        match self.hp.final_softcap {
            Some(cap) => {
                let y = g.scale(logits, 1.0 / cap);
                let y = g.tanh(y);
                g.scale(y, cap)
            }
            None => logits,
        }
    }
}

impl<'g, 'w> Forward<'_, 'g, 'w> {
    /// llama.cpp's rank pooling after the pooled rows are chosen (`build_pooling`): the
    /// classifier `cls` (plus bias) and `tanh`, then `cls.output` (plus bias), each where the
    /// file has it; qwen3's outputs (a Qwen3 reranker's "yes" and "no" logits) through a
    /// softmax. Without a head, the final norm's rows as they are.
    fn rank_head(&self, g: &mut Graph<'g, 'w>, x: Tensor<'g>) -> Tensor<'g> {
        let h = self.model.head_weights();
        let mut x = x;
        if let Some(w) = h.cls {
            x = self.project(g, x, w, h.cls_b);
            x = g.tanh(x);
        }
        if let Some(w) = h.out {
            x = self.project(g, x, w, h.out_b);
        }
        if self.hp.arch == Arch::Qwen3 {
            x = g.soft_max_plain(x);
        }
        x
    }
}

/// The activation of a gated feed-forward network.
#[derive(Clone, Copy)]
pub(super) enum Gate {
    /// SiLU (SwiGLU): llama, qwen.
    Silu,
    /// GELU, tanh approximation (GeGLU): gemma.
    Gelu,
    /// gpt-oss's clamped SwiGLU (ggml's `swiglu_oai`, with [`SWIGLU_OAI_ALPHA`] and
    /// [`SWIGLU_OAI_LIMIT`]): `min(g, limit) * sigmoid(alpha * min(g, limit)) * (clamp(u,
    /// -limit, limit) + 1)`.
    SwigluOai,
}

/// The sigmoid's slope in gpt-oss's activation (llama.cpp's constant for `openai-moe`).
const SWIGLU_OAI_ALPHA: f32 = 1.702;
/// The clamp of gpt-oss's activation (llama.cpp's constant for `openai-moe`).
const SWIGLU_OAI_LIMIT: f32 = 7.0;

/// The batch items of `plan` in the order of their rows (a recurrent layer runs one segment
/// per sequence, and the segments' outputs join into the batch's rows in this order).
fn items_in_row_order(plan: &Plan) -> Vec<usize> {
    let mut items: Vec<usize> = (0..plan.token_rows.len()).collect();
    items.sort_by_key(|&i| plan.token_rows[i].start);
    items
}

/// One sequence's causal convolution, as the recurrent layers run it (qwen35's and Mamba-2's
/// convolutions, lfm2's short one): `x` (`[channels, m]`, its `m` tokens) after the last
/// `kc - 1` inputs that slot `slot.src` of `states` kept; slot `slot.dst` takes the last
/// `kc - 1` inputs now. `kernel` is `[kc, channels]`; returns ggml's `ssm_conv`, `[channels, m]`.
fn causal_conv<'g>(
    g: &mut Graph<'g, '_>,
    states: TensorMut<'g>,
    kernel: Tensor<'g>,
    x: Tensor<'g>,
    slot: SlotPair,
) -> Tensor<'g> {
    let (ch, m, kc) = (x.ne(0), x.ne(1), kernel.ne(0));
    let row = (kc - 1) * ch * 4;
    // Time first, after the previous inputs.
    let x_t = g.permute(x, [1, 0, 2, 3]);
    let prev = g.view_3d(
        states.as_tensor(),
        [kc - 1, ch, 1],
        [(kc - 1) * 4, row],
        slot.src * row,
    );
    let conv_in = g.concat(prev, x_t, 0);
    // The state after the last token: its last `kc - 1` inputs.
    let last = g.view_3d(
        conv_in,
        [kc - 1, ch, 1],
        [conv_in.nb(1), conv_in.nb(2)],
        m * 4,
    );
    let stored = g.store(states, slot.dst * row, last);
    g.expand(stored);
    g.ssm_conv(conv_in, kernel)
}

/// Joins `[head_dim, n_head, m_i]` tensors along the token dimension, pairwise so that each
/// row is copied about log2(parts) times.
fn concat_tokens<'g>(g: &mut Graph<'g, '_>, mut parts: Vec<Tensor<'g>>) -> Tensor<'g> {
    while parts.len() > 1 {
        parts = parts
            .chunks(2)
            .map(|pair| match *pair {
                [a, b] => g.concat(a, b, 2),
                [a] => a,
                _ => unreachable!("chunks of two"),
            })
            .collect();
    }
    parts[0]
}

/// RoPE of layer `il`: the model's, except in sliding-window layers, which rotate with their
/// own base frequency and, unless the window says they are scaled (gpt-oss), no scaling (as
/// llama.cpp does).
pub(crate) fn rope_params(model: &Model, il: usize) -> RopeParams {
    let hp = model.hparams();
    let (freq_scale, ext_factor, n_ctx_orig) = match hp.rope_scaling {
        RopeScaling::None => (1.0, 0.0, hp.n_ctx_train),
        RopeScaling::Linear { factor } => (1.0 / factor, 0.0, hp.n_ctx_train),
        RopeScaling::Yarn { factor, n_ctx_orig } => (1.0 / factor, 1.0, n_ctx_orig),
    };
    // YaRN: ggml's rotation multiplies by `1 + 0.1 ln(factor)` itself, so llama.cpp's
    // attention factor (that same magnitude) is divided by it: 1 up to rounding, computed as
    // llama.cpp does so that the rounding is the same.
    let attn_factor = match hp.rope_scaling {
        RopeScaling::Yarn { factor, .. } => {
            let mscale = 0.1 * factor.ln() + 1.0;
            mscale * (1.0 / (1.0 + 0.1 * factor.ln()))
        }
        RopeScaling::None | RopeScaling::Linear { .. } => 1.0,
    };
    let mut p = RopeParams {
        n_dims: hp.rope_dims_at(il),
        mode: match hp.arch {
            Arch::Llama | Arch::Mistral3 | Arch::GraniteHybrid => 0,
            Arch::Qwen2
            | Arch::Qwen3
            | Arch::Gemma3
            | Arch::Gemma2
            | Arch::Phi3
            | Arch::Qwen3Moe
            | Arch::Qwen2Moe
            | Arch::Gemma4
            | Arch::Qwen3Next
            | Arch::GptOss
            | Arch::Lfm2
            | Arch::Lfm2Moe
            // nemotron_h does not rotate; its parameters are never used.
            | Arch::NemotronH => 2,
            // Interleaved M-RoPE (`GGML_ROPE_TYPE_IMROPE`), through `Graph::rope_multi`.
            Arch::Qwen35 | Arch::Qwen35Moe => 40,
        },
        n_ctx_orig,
        freq_base: hp.rope_freq_base,
        freq_scale,
        ext_factor,
        attn_factor,
        beta_fast: 32.0,
        beta_slow: 1.0,
    };
    if let Some(m) = &hp.mistral3 {
        p.beta_fast = m.yarn_beta_fast;
        p.beta_slow = m.yarn_beta_slow;
        p.attn_factor = m.rope_attn_factor;
    }
    if let (true, Some(w)) = (hp.is_swa(il), &hp.sliding_window) {
        p.freq_base = w.rope_freq_base;
        if !w.rope_scaled {
            p.freq_scale = 1.0;
        }
    }
    p
}
