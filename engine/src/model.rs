//! A loaded model: typed hyperparameters, weights mapped in place, tokenizer, chat template.
//!
//! Hyperparameters follow llama.cpp's GGUF keys (`{arch}.embedding_length`, ...). Weights stay
//! in the memory-mapped file: ggml reads them where they lie, nothing is copied.
//!
//! Loading validates everything the file controls before any ggml object is made: the
//! hyperparameters (`hparams`), every tensor's shape against them, and every tensor's type
//! against what its kernel accepts (matrices need a CPU dot product, the embedding table a
//! conversion to f32, norms, biases and RoPE factors must be f32).

use std::path::Path;
use std::sync::Arc;

use crate::chat::ChatTemplate;
use crate::error::{Error, Result};
use crate::ggml::{self, Device, RawTensor, WeightSpec, Weights};
use crate::gguf::{GgmlType, Gguf};
use crate::tokenizer::Tokenizer;

mod classifier;
mod experts;
mod fingerprint;
mod gemma4;
mod granite_hybrid;
mod hparams;
mod layer;
mod lfm2;
mod nemotron_h;
mod qwen35;
mod qwen3next;
mod state_shape;

pub use classifier::{PoolingType, Ranking};

pub(crate) use fingerprint::records_bytes;
pub use fingerprint::FINGERPRINT_VERSION;
pub(crate) use gemma4::{GateUp, Gemma4Layer};
pub use granite_hybrid::GraniteScales;
use layer::layer_weights;
pub(crate) use layer::{
    BetaAlpha, DeltaNetWeights, ExpertBiases, Ffn, LayerWeights, Mamba2Weights, Qkv, SharedExpert,
};
pub use lfm2::ShortConv;
pub use nemotron_h::{Mamba2, MixerKind};
pub use qwen35::DeltaNet;
pub(crate) use state_shape::StateShape;

/// The model families this engine runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Arch {
    /// `llama`: Llama 1/2/3, Mistral, SmolLM, TinyLlama and other llama-shaped models.
    Llama,
    /// `qwen2`: llama-shaped with biases on Q, K and V, and NeoX-style RoPE.
    Qwen2,
    /// `qwen3`: qwen2 without the biases, with an RMSNorm over each head of Q and K before
    /// RoPE.
    Qwen3,
    /// `gemma3`: embeddings scaled by `sqrt(n_embd)`, per-head Q/K norms, RMSNorms after
    /// attention and after the feed-forward network (GELU-gated), NeoX RoPE, and
    /// sliding-window layers interleaved with global ones.
    Gemma3,
    /// `gemma2`: gemma3 without the Q/K norms, with soft-capped attention scores and logits, and
    /// every other layer windowed.
    Gemma2,
    /// `phi3`: Phi-3 and Phi-4: llama-shaped with Q, K and V fused in one matrix
    /// (`attn_qkv`), gate and up in another (`ffn_up`, gate first), NeoX RoPE.
    Phi3,
    /// `qwen3moe`: qwen3 whose feed-forward networks are mixtures of experts (softmax routing,
    /// the chosen experts' weights normalised).
    Qwen3Moe,
    /// `qwen2moe`: Qwen1.5-MoE and Qwen2-MoE: qwen2's attention; each feed-forward network a
    /// mixture of experts (softmax routing, the chosen experts' weights not normalised) plus a
    /// shared expert, a SwiGLU network whose output is gated by a sigmoid of the input.
    Qwen2Moe,
    /// `gemma4`: Gemma 4's text model: gemma3's blocks with unscaled attention over
    /// RMS-normalised Q, K and V, head sizes and RoPE per layer kind, the last layers reusing
    /// earlier layers' KV, per-layer token inputs, a per-layer output scale, and optionally a
    /// GELU mixture of experts beside each dense network.
    Gemma4,
    /// `mistral3`: Ministral 3 and Mistral Small 3.x text models: llama's blocks with YaRN's
    /// own parameters from the file and, when `attention.temperature_scale` is set, Q scaled
    /// by a factor growing with the log of the position (Llama 4's attention temperature).
    Mistral3,
    /// `qwen35`: Qwen3.5, a hybrid: most blocks are gated delta-nets (a short causal
    /// convolution and a matrix state per head, kept per sequence), every few a gated
    /// attention (Q's projection also gives a sigmoid gate; head norms; partial M-RoPE).
    Qwen35,
    /// `qwen35moe`: Qwen3.5's mixture-of-experts models: qwen35's blocks with a mixture of
    /// experts (softmax routing, the chosen weights normalised) plus a shared expert gated by
    /// a sigmoid of the input in place of each dense network.
    Qwen35Moe,
    /// `qwen3next`: Qwen3-Next: qwen35moe's hybrid, with the delta-net's beta and alpha from
    /// one projection (`ssm_ba`, interleaved per key head), key heads repeated over
    /// consecutive value heads, and NeoX RoPE (not M-RoPE) in the attention blocks.
    Qwen3Next,
    /// `gpt-oss`: OpenAI's gpt-oss (llama.cpp's `openai-moe` graph): biases on Q, K, V and the
    /// output projection, NeoX RoPE with YaRN on every layer, a learned per-head attention sink
    /// (a term in each softmax's denominator), every other layer windowed (the first of each
    /// pair), and mixtures of experts with biases everywhere: the router's chosen logits through
    /// a softmax, each expert a clamped SwiGLU (`swiglu_oai`).
    GptOss,
    /// `lfm2`: Liquid's LFM2, a hybrid: most blocks are gated short convolutions (`B`, `C` and
    /// `x` from one projection; `C * conv(B * x)`, the convolution's last inputs kept per
    /// sequence), the others grouped-query attention with per-head Q/K norms; SwiGLU networks.
    Lfm2,
    /// `lfm2moe`: lfm2 whose feed-forward networks after the first few are mixtures of
    /// experts (sigmoid or softmax routing, a bias on the choice, weights normalised).
    Lfm2Moe,
    /// `nemotron_h`: NVIDIA's Nemotron-H, a hybrid whose blocks each run one mixer: most are
    /// Mamba-2 layers (a causal convolution and a selective scan per head, kept per sequence,
    /// with a gated, grouped RMS norm), a few attention without RoPE, the others ReLU²
    /// feed-forward networks.
    NemotronH,
    /// `granitehybrid`: IBM's Granite 4.0 hybrids: Mamba-2 layers (nemotron_h's) and
    /// attention layers (RoPE unless the file turns it off), each block followed by a SwiGLU
    /// network, with Granite's multipliers on the embeddings, the residual branches, the
    /// attention scores and the logits.
    GraniteHybrid,
}

impl Arch {
    fn from_name(name: &str) -> Result<Arch> {
        match name {
            "llama" => Ok(Arch::Llama),
            "qwen2" => Ok(Arch::Qwen2),
            "qwen3" => Ok(Arch::Qwen3),
            "gemma3" => Ok(Arch::Gemma3),
            "gemma2" => Ok(Arch::Gemma2),
            "phi3" => Ok(Arch::Phi3),
            "qwen3moe" => Ok(Arch::Qwen3Moe),
            "qwen2moe" => Ok(Arch::Qwen2Moe),
            "gemma4" => Ok(Arch::Gemma4),
            "mistral3" => Ok(Arch::Mistral3),
            "qwen35" => Ok(Arch::Qwen35),
            "qwen35moe" => Ok(Arch::Qwen35Moe),
            "qwen3next" => Ok(Arch::Qwen3Next),
            "gpt-oss" => Ok(Arch::GptOss),
            "lfm2" => Ok(Arch::Lfm2),
            "lfm2moe" => Ok(Arch::Lfm2Moe),
            "nemotron_h" => Ok(Arch::NemotronH),
            "granitehybrid" => Ok(Arch::GraniteHybrid),
            other => Err(Error::UnsupportedArchitecture {
                arch: other.to_owned(),
            }),
        }
    }

    /// The architecture's name in GGUF metadata.
    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::Gemma3 => "gemma3",
            Arch::Gemma2 => "gemma2",
            Arch::Phi3 => "phi3",
            Arch::Qwen3Moe => "qwen3moe",
            Arch::Qwen2Moe => "qwen2moe",
            Arch::Gemma4 => "gemma4",
            Arch::Mistral3 => "mistral3",
            Arch::Qwen35 => "qwen35",
            Arch::Qwen35Moe => "qwen35moe",
            Arch::Qwen3Next => "qwen3next",
            Arch::GptOss => "gpt-oss",
            Arch::Lfm2 => "lfm2",
            Arch::Lfm2Moe => "lfm2moe",
            Arch::NemotronH => "nemotron_h",
            Arch::GraniteHybrid => "granitehybrid",
        }
    }
}

/// How RoPE frequencies are scaled for contexts beyond the training length.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RopeScaling {
    /// No scaling.
    None,
    /// Positions are divided by `factor`.
    Linear {
        /// The scaling factor.
        factor: f32,
    },
    /// YaRN scaling with the original context length.
    Yarn {
        /// The scaling factor.
        factor: f32,
        /// Context length the model was trained with.
        n_ctx_orig: usize,
    },
}

/// Hyperparameters read from the GGUF metadata.
#[derive(Clone, Debug, PartialEq)]
pub struct HParams {
    /// Model family.
    pub arch: Arch,
    /// Vocabulary size (rows of the embedding table).
    pub n_vocab: usize,
    /// Context length the model was trained with.
    pub n_ctx_train: usize,
    /// Width of the residual stream.
    pub n_embd: usize,
    /// Number of transformer blocks.
    pub n_layer: usize,
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads (grouped-query attention when fewer than `n_head`).
    pub n_head_kv: usize,
    /// Dimension of one attention head.
    pub head_dim: usize,
    /// Hidden width of the feed-forward network.
    pub n_ff: usize,
    /// RMSNorm epsilon.
    pub rms_eps: f32,
    /// RoPE base frequency.
    pub rope_freq_base: f32,
    /// Number of rotated dimensions per head.
    pub rope_dims: usize,
    /// RoPE scaling.
    pub rope_scaling: RopeScaling,
    /// Factor attention scores are multiplied by (`1/sqrt(head_dim)` unless the family says
    /// otherwise).
    pub attn_scale: f32,
    /// Factor the token embeddings are multiplied by (gemma: `sqrt(n_embd)`).
    pub embd_scale: Option<f32>,
    /// Sliding-window attention: which layers attend only to recent positions.
    pub sliding_window: Option<SlidingWindow>,
    /// Final logits soft-capped to `cap * tanh(x / cap)`.
    pub final_softcap: Option<f32>,
    /// Attention scores soft-capped the same way, before the softmax (gemma2).
    pub attn_softcap: Option<f32>,
    /// Mixture-of-experts feed-forward networks (qwen3moe, qwen2moe, gpt-oss; llama files with
    /// experts, such as Mixtral; gemma4).
    pub experts: Option<Experts>,
    /// Gemma 4's per-layer shapes, KV sharing and per-layer inputs.
    pub gemma4: Option<Gemma4Params>,
    /// Mistral 3's YaRN parameters and attention temperature.
    pub mistral3: Option<Mistral3Params>,
    /// The gated delta-net layers of a hybrid (qwen35, qwen35moe, qwen3next); `None` for
    /// attention-only families.
    pub delta_net: Option<DeltaNet>,
    /// The gated short-convolution layers of a hybrid (lfm2); `None` for the other families.
    pub short_conv: Option<ShortConv>,
    /// The Mamba-2, attention and feed-forward layers of a hybrid (nemotron_h); `None` for
    /// the other families.
    pub mamba2: Option<Mamba2>,
    /// Granite's multipliers and RoPE switch (granitehybrid).
    pub granite: Option<GraniteScales>,
}

/// Mistral 3's hyperparameters beyond llama's, as llama.cpp reads them.
#[derive(Clone, Debug, PartialEq)]
pub struct Mistral3Params {
    /// YaRN's `beta_fast` and `beta_slow` (`rope.scaling.yarn_beta_fast`, `_slow`; 32 and 1).
    pub yarn_beta_fast: f32,
    /// See `yarn_beta_fast`.
    pub yarn_beta_slow: f32,
    /// The factor RoPE scales magnitudes by (YaRN's, with `rope.scaling.yarn_log_multiplier`,
    /// times `rope.scaling.attn_factor`), as passed to ggml.
    pub rope_attn_factor: f32,
    /// `attention.temperature_scale`: Q at position `p` is multiplied by
    /// `1 + scale * ln(floor(p / attn_temp_floor) + 1)`; `None` when absent or 0.
    pub attn_temp_scale: Option<f32>,
    /// The positions per step of the temperature (the original context length).
    pub attn_temp_floor: usize,
}

/// Gemma 4's hyperparameters beyond the common ones (see [`HParams::head_dim_at`] and its
/// siblings for the per-layer values they give).
#[derive(Clone, Debug, PartialEq)]
pub struct Gemma4Params {
    /// Head dimension of the windowed layers (the others': [`HParams::head_dim`]).
    pub head_dim_swa: usize,
    /// Rotated dimensions per head in the windowed layers.
    pub rope_dims_swa: usize,
    /// Key/value heads per layer.
    pub n_head_kv: Vec<usize>,
    /// Dense feed-forward width per layer.
    pub n_ff: Vec<usize>,
    /// Layers with their own KV cache (the first ones); the others reuse one.
    pub n_layer_kv: usize,
    /// Width of each layer's per-layer token input (0: none).
    pub n_embd_per_layer: usize,
}

/// A mixture of experts in place of each block's feed-forward network. The router's softmax
/// runs over every expert's logit, except in gpt-oss, where it runs over the chosen experts'
/// logits only (llama.cpp's `SOFTMAX_WEIGHT` gating).
#[derive(Clone, Debug, PartialEq)]
pub struct Experts {
    /// Experts per block.
    pub n_expert: usize,
    /// Experts each token runs.
    pub n_used: usize,
    /// Hidden width of one expert.
    pub n_ff_exp: usize,
    /// The chosen experts' weights are divided by their sum.
    pub norm_weights: bool,
    /// Factor on the chosen experts' weights (1: none).
    pub weights_scale: f32,
    /// Hidden width of the shared expert every token also runs, its output gated by a sigmoid
    /// of the input (qwen2moe, qwen35moe, qwen3next); `None` without one.
    pub n_ff_shared: Option<usize>,
    /// The router's probabilities are sigmoids of its logits, not their softmax (lfm2moe).
    pub sigmoid: bool,
    /// The first blocks have dense networks instead (lfm2moe's `leading_dense_block_count`).
    pub n_dense_lead: usize,
}

/// Layers that attend only to the last `size` positions (a token at `p` sees `p - size + 1
/// ..= p`), as llama.cpp's standard sliding window.
#[derive(Clone, Debug, PartialEq)]
pub struct SlidingWindow {
    /// Positions a windowed layer sees, its own included.
    pub size: usize,
    /// Per layer: whether it is windowed (the others attend to every position).
    pub layers: Vec<bool>,
    /// RoPE base frequency of the windowed layers.
    pub rope_freq_base: f32,
    /// The windowed layers' RoPE is scaled as the others' ([`HParams::rope_scaling`]; gpt-oss);
    /// otherwise it is unscaled (gemma).
    pub rope_scaled: bool,
}

impl HParams {
    /// Whether layer `il` attends through the sliding window.
    pub fn is_swa(&self, il: usize) -> bool {
        self.sliding_window
            .as_ref()
            .is_some_and(|w| w.layers.get(il).copied().unwrap_or(false))
    }

    /// Whether each attention head has a learned sink (`attn_sinks`, gpt-oss): a logit that
    /// takes part in the softmax's denominator and attends to nothing.
    pub fn has_attn_sinks(&self) -> bool {
        self.arch == Arch::GptOss
    }
}

/// What a tensor is used for, which decides the types its kernels accept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    /// The weight of a matrix multiplication.
    Matrix,
    /// The embedding table (`get_rows`); also a matrix when the output is tied to it.
    Embedding { tied: bool },
    /// Norm weights, biases, RoPE factors: element-wise operands, f32 only.
    Vector,
}

impl Role {
    fn accepts(self, dtype: GgmlType) -> bool {
        let Some(facts) = ggml::type_facts(dtype as u32) else {
            return false;
        };
        match self {
            Role::Matrix => facts.matmul_weight,
            Role::Embedding { tied } => facts.to_float && (!tied || facts.matmul_weight),
            Role::Vector => dtype == GgmlType::F32,
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Role::Matrix => "a matrix weight (no CPU dot product for it)",
            Role::Embedding { .. } => "the embedding table",
            Role::Vector => "a norm, bias or RoPE factor vector (f32 only)",
        }
    }
}

/// The weight tensors a model needs, checked against the file and collected for mapping.
struct Specs<'a> {
    gguf: &'a Gguf,
    list: Vec<WeightSpec<'a>>,
}

impl<'a> Specs<'a> {
    /// The tensor's index in the list, after checking its shape and type; `None` if absent.
    fn find(&mut self, name: &str, shape: &[usize], role: Role) -> Result<Option<usize>> {
        let Some(info) = self.gguf.tensor(name) else {
            return Ok(None);
        };
        let want: Vec<u64> = shape.iter().map(|&d| d as u64).collect();
        if info.shape != want {
            return Err(Error::BadTensor {
                name: name.to_owned(),
                reason: format!("shape {:?}, expected {:?}", info.shape, want),
            });
        }
        let code = info.dtype as u32;
        if !ggml::type_is_supported(code) {
            return Err(Error::UnsupportedTensorType {
                type_code: code,
                tensor: name.to_owned(),
            });
        }
        if !role.accepts(info.dtype) {
            return Err(Error::BadTensor {
                name: name.to_owned(),
                reason: format!("type {} cannot be {}", info.dtype.name(), role.describe()),
            });
        }
        self.list.push(WeightSpec {
            name: &info.name,
            ggml_type: code,
            shape: &info.shape,
            offset: info.offset as usize,
            n_bytes: info.n_bytes as usize,
            on_device: false,
            matmul_only: role == Role::Matrix,
        });
        Ok(Some(self.list.len() - 1))
    }

    /// Like [`Specs::find`], but a missing tensor is an error.
    fn require(&mut self, name: &str, shape: &[usize], role: Role) -> Result<usize> {
        self.find(name, shape, role)?
            .ok_or_else(|| Error::MissingTensor {
                name: name.to_owned(),
            })
    }
}

/// Where the layers offloaded by [`ModelParams::n_gpu_layers`] go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OffloadDevice {
    /// The GPU of this index among those ggml's compiled-in backends (`cuda`, `metal`) find
    /// (the default: the first).
    Gpu(usize),
    /// The CPU, through the same path as a GPU (weights copied into backend memory, graphs
    /// split by ggml's scheduler): what tests and comparisons use where there is no GPU.
    Cpu,
}

impl Default for OffloadDevice {
    fn default() -> Self {
        OffloadDevice::Gpu(0)
    }
}

/// How a model is loaded (by default: every layer on the CPU, weights as the file lays them
/// out).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ModelParams {
    /// Layers whose weights and KV live on the device, counted from the last (llama.cpp's
    /// `--n-gpu-layers`); more than the model has also puts the output head there. 0 keeps
    /// everything on the CPU, in the mapped file.
    pub n_gpu_layers: usize,
    /// The device that takes them.
    pub device: OffloadDevice,
    /// On the CPU alone, matrix weights of types ggml has an interleaved layout for (q4_0, q4_K,
    /// iq4_nl on x86) are copied into it at load, as llama.cpp does by default. Off by default:
    /// products over a repacked weight stay ggml's, whose sums depend on how many rows a batch
    /// has (so [`Evaluation::Invariant`](crate::Evaluation::Invariant) and
    /// [`Evaluation::LlamaCpp`](crate::Evaluation::LlamaCpp) are no longer invariant over
    /// them), and ggml-sys's integer-sum products over the file's layout are faster. On,
    /// llama.cpp's own sums (its `--repack`), at the cost of RAM for the copies.
    pub repack: bool,
}

impl ModelParams {
    /// The last `n` layers on the first GPU (llama.cpp's `--n-gpu-layers n`); 0: all on the CPU.
    pub fn gpu_layers(n: usize) -> ModelParams {
        ModelParams {
            n_gpu_layers: n,
            ..ModelParams::default()
        }
    }
}

/// Where a loaded model's layers are: the device and the first layer on it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Placement {
    pub device: Device,
    pub first_layer: usize,
}

/// A model ready to run: share it between sessions with [`Arc`].
pub struct Model {
    /// Where offloaded layers live, if any are.
    placement: Option<Placement>,
    hparams: HParams,
    tokenizer: Tokenizer,
    chat_template: ChatTemplate,
    /// Computed when first asked for, or taken from a record ([`Model::remember_fingerprint`]).
    fingerprint: std::sync::OnceLock<[u8; 32]>,
    /// The file, for the fingerprint.
    gguf: Arc<Gguf>,
    // Indices into `weights`; the tensors are borrowed from it when a graph is built.
    tok_embd: usize,
    output_norm: usize,
    output: usize,
    rope_freqs: Option<usize>,
    /// Gemma 4's per-layer token table, its projection and its norm.
    per_layer_inputs: Option<[usize; 3]>,
    layers: Vec<LayerWeights>,
    /// Reranking: the classifier head's tensors and what the file says about ranking.
    ranking: Ranking,
    /// The weights, which own the mapped file their tensors point into.
    weights: Weights,
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model")
            .field("hparams", &self.hparams)
            .finish_non_exhaustive()
    }
}

impl Model {
    /// Loads a GGUF model: maps it, checks every tensor the architecture needs, reads the
    /// tokenizer and chat template.
    pub fn load(path: impl AsRef<Path>) -> Result<Arc<Model>> {
        Model::load_with(path, &ModelParams::default())
    }

    /// As [`Model::load`], with the layers `params` offloads uploaded to their device.
    pub fn load_with(path: impl AsRef<Path>, params: &ModelParams) -> Result<Arc<Model>> {
        let path = path.as_ref();
        if !path.exists() {
            return Err(Error::ModelNotFound {
                path: path.to_owned(),
            });
        }
        let gguf = Gguf::open(path)?;
        Model::from_gguf_with(gguf, params).map(Arc::new)
    }

    /// Builds a model from an opened GGUF file, all on the CPU.
    pub fn from_gguf(gguf: Gguf) -> Result<Model> {
        Model::from_gguf_with(gguf, &ModelParams::default())
    }

    /// Builds a model from an opened GGUF file, offloading as `params` says.
    pub fn from_gguf_with(gguf: Gguf, params: &ModelParams) -> Result<Model> {
        // Shared with the weights, which keep it alive for as long as their tensors point into it.
        let gguf = Arc::new(gguf);
        let hp = HParams::from_gguf(&gguf)?;
        let tokenizer = Tokenizer::from_gguf(&gguf)?;
        let chat_template = ChatTemplate::from_gguf(&gguf)?;

        if tokenizer.n_vocab() != hp.n_vocab {
            let key = match gguf.get(&format!("{}.vocab_size", hp.arch.name())) {
                Some(_) => format!("{}.vocab_size", hp.arch.name()),
                None => "tokenizer.ggml.tokens".to_owned(),
            };
            return Err(Error::InvalidHParam {
                key,
                value: hp.n_vocab.to_string(),
                requirement: format!("must equal the tokenizer's {} tokens", tokenizer.n_vocab()),
            });
        }

        let mut specs = Specs {
            gguf: &gguf,
            list: Vec::new(),
        };
        let e = hp.n_embd;
        let tied = gguf.tensor("output.weight").is_none();
        let tok_embd = specs.require(
            "token_embd.weight",
            &[e, hp.n_vocab],
            Role::Embedding { tied },
        )?;
        // lfm2 files name the final norm after the embeddings (as llama.cpp reads them).
        let output_norm = match hp.arch {
            Arch::Lfm2 | Arch::Lfm2Moe => "token_embd_norm.weight",
            _ => "output_norm.weight",
        };
        let output_norm = specs.require(output_norm, &[e], Role::Vector)?;
        // Models with tied embeddings have no output matrix and reuse the embedding table
        // (qwen2moe and gpt-oss always have one, as llama.cpp requires).
        let output = match hp.arch {
            Arch::Qwen2Moe | Arch::GptOss => {
                specs.require("output.weight", &[e, hp.n_vocab], Role::Matrix)?
            }
            _ => specs
                .find("output.weight", &[e, hp.n_vocab], Role::Matrix)?
                .unwrap_or(tok_embd),
        };
        let rope_freqs = match hp.arch {
            // gemma4's global layers rotate through it (required when there is one).
            Arch::Gemma4 if (0..hp.n_layer).any(|il| !hp.is_swa(il)) => {
                Some(specs.require("rope_freqs.weight", &[hp.head_dim / 2], Role::Vector)?)
            }
            _ => specs.find("rope_freqs.weight", &[hp.rope_dims / 2], Role::Vector)?,
        };
        let per_layer_inputs = gemma4::globals(&mut specs, &hp)?;
        let mut layer_idx = Vec::with_capacity(hp.n_layer);
        for l in 0..hp.n_layer {
            layer_idx.push(match (&hp.delta_net, hp.arch) {
                (Some(d), _) => qwen35::layer_weights(&mut specs, &hp, d, l)?,
                (None, Arch::Lfm2 | Arch::Lfm2Moe) => lfm2::layer_weights(&mut specs, &hp, l)?,
                (None, Arch::NemotronH | Arch::GraniteHybrid) => match (&hp.mamba2, hp.arch) {
                    (Some(m), Arch::NemotronH) => nemotron_h::layer_weights(&mut specs, &hp, m, l)?,
                    (Some(m), _) => granite_hybrid::layer_weights(&mut specs, &hp, m, l)?,
                    (None, _) => {
                        unreachable!("the Mamba-2 hybrids' hyperparameters give their layers")
                    }
                },
                (None, Arch::Gemma4) => gemma4::layer_weights(&mut specs, &hp, l)?,
                (None, _) => layer_weights(&mut specs, &hp, l)?,
            });
        }
        let ranking = classifier::load(&mut specs, &gguf, &hp)?;
        let read: Vec<&str> = specs.list.iter().map(|s| s.name).collect();
        layer::all_read(&gguf, &hp, &read)?;
        let placement = match params.n_gpu_layers {
            0 => None,
            n => Some(Placement {
                device: offload_device(params.device)?,
                first_layer: hp.n_layer - n.min(hp.n_layer),
            }),
        };
        let mut output = output;
        if let Some(p) = placement {
            for layer in &layer_idx[p.first_layer..] {
                for i in layer.indices() {
                    specs.list[i].on_device = true;
                }
            }
            if params.n_gpu_layers > hp.n_layer {
                if output == tok_embd {
                    // Tied: the embedding table stays on the CPU (its rows are gathered there),
                    // and the head gets a device copy of the same bytes.
                    let copy = WeightSpec {
                        on_device: true,
                        ..specs.list[tok_embd]
                    };
                    specs.list.push(copy);
                    output = specs.list.len() - 1;
                }
                specs.list[output].on_device = true;
                specs.list[output_norm].on_device = true;
            }
        }
        let weights = Weights::map(
            Arc::clone(&gguf),
            &specs.list,
            placement.map(|p| p.device),
            params.repack,
        )?;
        Ok(Model {
            placement,
            tok_embd,
            output_norm,
            output,
            rope_freqs,
            per_layer_inputs,
            layers: layer_idx,
            ranking,
            hparams: hp,
            tokenizer,
            chat_template,
            fingerprint: std::sync::OnceLock::new(),
            gguf,
            weights,
        })
    }

    /// Where offloaded layers live, if any are.
    pub(crate) fn placement(&self) -> Option<Placement> {
        self.placement
    }

    /// How many layers run on the offload device (0 when none).
    pub fn n_offloaded_layers(&self) -> usize {
        self.placement
            .map_or(0, |p| self.hparams.n_layer - p.first_layer)
    }

    /// The offload device as ggml names it (`CUDA0 (NVIDIA H200)`), when layers are offloaded.
    pub fn offload_device(&self) -> Option<String> {
        self.placement.map(|p| p.device.describe())
    }

    /// The token embedding table.
    pub(crate) fn tok_embd(&self) -> RawTensor<'_> {
        self.weights.get(self.tok_embd)
    }

    /// The final norm's weight.
    pub(crate) fn output_norm(&self) -> RawTensor<'_> {
        self.weights.get(self.output_norm)
    }

    /// The output head (the embedding table when they are tied).
    pub(crate) fn output(&self) -> RawTensor<'_> {
        self.weights.get(self.output)
    }

    /// RoPE frequency factors, when the file has them.
    pub(crate) fn rope_freqs(&self) -> Option<RawTensor<'_>> {
        self.rope_freqs.map(|i| self.weights.get(i))
    }

    /// Gemma 4's per-layer token table, its projection from the embeddings and its norm.
    pub(crate) fn per_layer_inputs(&self) -> Option<[RawTensor<'_>; 3]> {
        self.per_layer_inputs
            .map(|t| t.map(|i| self.weights.get(i)))
    }

    /// Block `il`'s tensors.
    pub(crate) fn layer(&self, il: usize) -> LayerWeights<RawTensor<'_>> {
        self.layers[il].map(|i| self.weights.get(i))
    }

    /// The hyperparameters.
    pub fn hparams(&self) -> &HParams {
        &self.hparams
    }

    /// The tokenizer built from the GGUF vocabulary.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// The chat template (the GGUF's, or ChatML).
    pub fn chat_template(&self) -> &ChatTemplate {
        &self.chat_template
    }

    /// 32 bytes that identify the model's computation: BLAKE3 over an explicit, versioned
    /// encoding ([`FINGERPRINT_VERSION`]) of the architecture, every hyperparameter, every
    /// tensor's name, type and shape, every byte of every tensor (hashed on all cores, when
    /// first asked for) and the vocabulary. KV caches are only interchangeable between models
    /// with equal fingerprints.
    pub fn fingerprint(&self) -> [u8; 32] {
        *self
            .fingerprint
            .get_or_init(|| fingerprint::fingerprint(&self.gguf, &self.hparams, &self.tokenizer))
    }

    /// [`Model::fingerprint`], taken from the record kept for this model file in cache
    /// directory `dir` when the file is unchanged since (same path, length, times, inode and
    /// device), else hashed and recorded there. Says which it was.
    pub fn remember_fingerprint(&self, dir: &Path) -> ([u8; 32], FingerprintOrigin) {
        let id = self.gguf.identity();
        if let Some(fp) = self.fingerprint.get() {
            if let Some(id) = id.filter(|id| fingerprint::remembered(dir, id) != Some(*fp)) {
                fingerprint::remember(dir, id, fp);
            }
            return (*fp, FingerprintOrigin::Known);
        }
        if let Some(fp) = id.and_then(|id| fingerprint::remembered(dir, id)) {
            return (
                *self.fingerprint.get_or_init(|| fp),
                FingerprintOrigin::Remembered,
            );
        }
        let fp = self.fingerprint();
        if let Some(id) = id {
            fingerprint::remember(dir, id, &fp);
        }
        (fp, FingerprintOrigin::Hashed)
    }

    /// The fingerprint fingerprint version 2 gave this model (its tensors sampled at both
    /// ends): stores named by it are not used, and can be reported as such.
    pub fn legacy_fingerprint(&self) -> [u8; 32] {
        fingerprint::legacy_sampled(&self.gguf, &self.hparams, &self.tokenizer)
    }
}

/// Where [`Model::remember_fingerprint`] found the fingerprint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FingerprintOrigin {
    /// Hashed from the file now (and recorded).
    Hashed,
    /// Read from the record of the unchanged file.
    Remembered,
    /// Computed earlier in this process.
    Known,
}

/// The ggml device `device` names: [`Error::NoGpu`] when there is no such GPU.
fn offload_device(device: OffloadDevice) -> Result<Device> {
    let index = match device {
        OffloadDevice::Cpu => return Device::cpu(),
        OffloadDevice::Gpu(i) => i,
    };
    let gpus = Device::gpus();
    gpus.get(index).copied().ok_or(Error::NoGpu {
        index,
        found: gpus.len(),
    })
}
