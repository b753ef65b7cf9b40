//! How a [`Context`](crate::Context) runs: [`ContextParams`].

use crate::kv::KvType;

/// Which kernels evaluate a batch, and what a token's logits may therefore depend on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Evaluation {
    /// Batch-invariant at full speed (the default): every matrix product of a weight type
    /// ggml-sys has an integer-sum kernel for (q4_0, q4_1, q5_0, q8_0, q4_K, q5_K, q6_K) takes
    /// it for every row, and attention over an f16 cache takes ggml-sys's kernel for every shape, whose
    /// tiles are the pages of a sequence. A token's logits are then the same bits whether its
    /// prompt was one item or split, whether its prefix came from memory, from disk or was
    /// computed, and whatever shares its batch. They differ from llama.cpp's by float rounding
    /// (measured as llama.cpp compares its backends: perplexity, KL divergence; see
    /// docs/BENCHMARKS.md). Where ggml-sys's attention cannot run (a quantized cache, a
    /// device, a CPU without AVX2), attention is evaluated as [`Evaluation::LlamaCpp`] does,
    /// which is invariant too but slower.
    #[default]
    Invariant,
    /// llama.cpp's bits (ggml's kernels), batch-invariant: attention computes every query on
    /// its own (never in ggml's tiles of 64 queries) and products keep ggml's sums at every
    /// batch size. The greedy continuations of llama.cpp's own runs are reproduced; prefill
    /// costs most of its speed (0.28x at 1,024 tokens; see docs/BENCHMARKS.md).
    LlamaCpp,
    /// Each item picks its kernels by its own size: items of 64 tokens or more take the
    /// integer-sum products and ggml-sys's attention, shorter ones ggml's (llama.cpp's bits
    /// for short prompts and decoding). A token's logits depend on how its prompt was split
    /// into items, never on the other sequences of its batch. Kept to measure the price of
    /// invariance (none measured: prefill the same, decoding slower than
    /// [`Evaluation::Invariant`]; see docs/BENCHMARKS.md).
    Fast,
}

impl std::str::FromStr for Evaluation {
    type Err = crate::Error;

    fn from_str(s: &str) -> crate::Result<Evaluation> {
        match s.to_ascii_lowercase().as_str() {
            "invariant" => Ok(Evaluation::Invariant),
            "llama-cpp" | "llamacpp" => Ok(Evaluation::LlamaCpp),
            "fast" => Ok(Evaluation::Fast),
            _ => Err(crate::Error::UnknownEvaluation { name: s.to_owned() }),
        }
    }
}

impl std::fmt::Display for Evaluation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Evaluation::Invariant => "invariant",
            Evaluation::LlamaCpp => "llama-cpp",
            Evaluation::Fast => "fast",
        })
    }
}

impl Evaluation {
    /// Whether a token's logits are independent of how its prompt was split into items.
    pub fn batch_invariant(self) -> bool {
        !matches!(self, Evaluation::Fast)
    }
}

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
    /// see docs/BENCHMARKS.md) or as separate matrix products and a softmax. Under
    /// [`Evaluation::Invariant`] attention is always fused (the separate products' bits
    /// depend on the batch), so `false` matters only to the other evaluations.
    pub flash_attn: bool,
    /// Element type of cached K.
    pub type_k: KvType,
    /// Element type of cached V (a quantized V needs `flash_attn`).
    pub type_v: KvType,
    /// Which kernels evaluate a batch, and so what a token's logits may depend on (see
    /// [`Evaluation`]); [`Evaluation::Invariant`] by default.
    pub evaluation: Evaluation,
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
            evaluation: Evaluation::default(),
            kv_ram: 0,
            past_train: false,
        }
    }
}
