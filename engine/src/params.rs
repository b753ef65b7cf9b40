//! How a [`Context`](crate::Context) runs: [`ContextParams`].

use crate::kv::KvType;

/// How a [`Context`](crate::Context) runs.
#[derive(Clone, Debug)]
pub struct ContextParams {
    /// Most positions one sequence may hold. Clamped to the model's training context length.
    pub n_ctx: usize,
    /// KV budget of the page pool, in tokens over all sequences (rounded up to whole pages of
    /// [`PAGE_TOKENS`](crate::PAGE_TOKENS)); 0 means `n_ctx`. Shared pages count once.
    pub kv_tokens: usize,
    /// Threads for ggml's kernels.
    pub n_threads: usize,
    /// Most tokens one [`Context::decode`] evaluates.
    pub n_batch: usize,
    /// Attention through ggml's fused flash-attention kernel (the default, and faster here:
    /// see docs/BENCHMARKS.md) or as separate matrix products and a softmax.
    pub flash_attn: bool,
    /// Element type of cached K.
    pub type_k: KvType,
    /// Element type of cached V (a quantized V needs `flash_attn`).
    pub type_v: KvType,
    /// Batch-invariant evaluation: attention computes every query on its own (never in
    /// ggml's tiles of 64 queries) and matrix products keep ggml's bits at every batch size
    /// (never the integer-sum products of q4_1, Q4_0 or Q8_0 weights over 64 rows or more),
    /// so a token's logits are the same bits whether it was evaluated alone, in a micro-batch
    /// or beside other sequences. Costs most of the CPU's prefill speed (0.28x the default's
    /// at 1,024 tokens; see docs/BENCHMARKS.md); off by default.
    pub batch_invariant: bool,
    /// Bytes of KV the pool may keep in RAM; 0 for no budget. Past it, full pages leave RAM
    /// for block files of the store given with [`Context::spill_to`](crate::Context::spill_to), and attention reads
    /// them where they lie, with the same logits bit for bit (see `spill.rs`). Between
    /// batches the pool keeps at most this much (less one batch's pages, so that the next one
    /// fits); during one, up to a batch's pages more. The first page of each sequence (its
    /// attention sinks), pages shared by several sequences and partly filled pages stay.
    pub kv_ram: usize,
    /// Allows `n_ctx` past the model's training length (for speed and memory measurements:
    /// outputs there are not meaningful). Off: `n_ctx` is clamped to it.
    pub past_train: bool,
}

impl Default for ContextParams {
    fn default() -> Self {
        ContextParams {
            n_ctx: 4096,
            kv_tokens: 0,
            n_threads: std::thread::available_parallelism().map_or(4, |n| n.get()),
            n_batch: 512,
            flash_attn: true,
            type_k: KvType::F16,
            type_v: KvType::F16,
            batch_invariant: false,
            kv_ram: 0,
            past_train: false,
        }
    }
}
