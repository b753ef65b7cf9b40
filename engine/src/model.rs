//! A loaded model: typed hyperparameters, weights mapped in place, tokenizer, chat template.
//!
//! Hyperparameters follow llama.cpp's GGUF keys (`{arch}.embedding_length`, ...). Weights stay
//! in the memory-mapped file: ggml reads them where they lie, nothing is copied.

use std::path::Path;
use std::sync::Arc;

use crate::chat::ChatTemplate;
use crate::error::{Error, Result};
use crate::ggml::{self, RawTensor, WeightSpec, Weights};
use crate::gguf::{Gguf, MetaValue};
use crate::tokenizer::Tokenizer;

/// The model families this engine runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Arch {
    /// `llama`: Llama 1/2/3, Mistral, SmolLM, TinyLlama and other llama-shaped models.
    Llama,
    /// `qwen2`: llama-shaped with biases on Q, K and V, and NeoX-style RoPE.
    Qwen2,
}

impl Arch {
    fn from_name(name: &str) -> Result<Arch> {
        match name {
            "llama" => Ok(Arch::Llama),
            "qwen2" => Ok(Arch::Qwen2),
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
}

impl HParams {
    /// Reads and validates the hyperparameters of `gguf`.
    pub fn from_gguf(gguf: &Gguf) -> Result<HParams> {
        let arch = Arch::from_name(gguf.get_str("general.architecture")?)?;
        let a = arch.name();
        let u = |key: &str| gguf.get_u32(&format!("{a}.{key}")).map(|v| v as usize);
        let n_embd = u("embedding_length")?;
        let n_head = u("attention.head_count")?;
        let n_head_kv = u("attention.head_count_kv").unwrap_or(n_head);
        if n_head == 0 || n_head_kv == 0 || n_head % n_head_kv != 0 {
            return Err(Error::BadHyperparameters {
                reason: format!("{n_head} query heads and {n_head_kv} KV heads"),
            });
        }
        let head_dim = u("attention.key_length").unwrap_or(n_embd / n_head);
        let n_vocab = match gguf.get(&format!("{a}.vocab_size")) {
            Some(_) => u("vocab_size")?,
            None => gguf.get_array("tokenizer.ggml.tokens")?.len(),
        };
        let factor = gguf
            .get_f32(&format!("{a}.rope.scaling.factor"))
            .unwrap_or(0.0);
        let scaling_type = gguf
            .get(&format!("{a}.rope.scaling.type"))
            .and_then(MetaValue::as_str)
            .unwrap_or("none");
        let n_ctx_train = u("context_length")?;
        let rope_scaling = match (scaling_type, factor) {
            (_, f) if f <= 1.0 => RopeScaling::None,
            ("linear", f) => RopeScaling::Linear { factor: f },
            ("yarn", f) => RopeScaling::Yarn {
                factor: f,
                n_ctx_orig: u("rope.scaling.original_context_length").unwrap_or(n_ctx_train),
            },
            _ => RopeScaling::None,
        };
        let hp = HParams {
            arch,
            n_vocab,
            n_ctx_train,
            n_embd,
            n_layer: u("block_count")?,
            n_head,
            n_head_kv,
            head_dim,
            n_ff: u("feed_forward_length")?,
            rms_eps: gguf.get_f32(&format!("{a}.attention.layer_norm_rms_epsilon"))?,
            rope_freq_base: gguf
                .get_f32(&format!("{a}.rope.freq_base"))
                .unwrap_or(10_000.0),
            rope_dims: u("rope.dimension_count").unwrap_or(head_dim),
            rope_scaling,
        };
        if hp.n_layer == 0
            || hp.head_dim == 0
            || hp.rope_dims > hp.head_dim
            || !hp.head_dim.is_multiple_of(2)
        {
            return Err(Error::BadHyperparameters {
                reason: format!("{hp:?}"),
            });
        }
        Ok(hp)
    }

    /// K (and V) elements per token per layer: `head_dim * n_head_kv`.
    pub fn n_embd_kv(&self) -> usize {
        self.head_dim * self.n_head_kv
    }
}

/// One block's tensors: weight handles, or indices into the weight list while loading.
pub(crate) struct LayerWeights<T = RawTensor> {
    pub attn_norm: T,
    pub wq: T,
    pub wk: T,
    pub wv: T,
    pub wo: T,
    pub bq: Option<T>,
    pub bk: Option<T>,
    pub bv: Option<T>,
    pub ffn_norm: T,
    pub ffn_gate: T,
    pub ffn_up: T,
    pub ffn_down: T,
}

impl<T: Copy> LayerWeights<T> {
    fn map<U>(&self, f: impl Fn(T) -> U) -> LayerWeights<U> {
        LayerWeights {
            attn_norm: f(self.attn_norm),
            wq: f(self.wq),
            wk: f(self.wk),
            wv: f(self.wv),
            wo: f(self.wo),
            bq: self.bq.map(&f),
            bk: self.bk.map(&f),
            bv: self.bv.map(&f),
            ffn_norm: f(self.ffn_norm),
            ffn_gate: f(self.ffn_gate),
            ffn_up: f(self.ffn_up),
            ffn_down: f(self.ffn_down),
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
    fn find(&mut self, name: &str, shape: &[usize]) -> Result<Option<usize>> {
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
        self.list.push(WeightSpec {
            name: &info.name,
            ggml_type: code,
            shape: &info.shape,
            offset: info.offset as usize,
            n_bytes: info.n_bytes as usize,
        });
        Ok(Some(self.list.len() - 1))
    }

    /// Like [`Specs::find`], but a missing tensor is an error.
    fn require(&mut self, name: &str, shape: &[usize]) -> Result<usize> {
        self.find(name, shape)?.ok_or_else(|| Error::MissingTensor {
            name: name.to_owned(),
        })
    }
}

/// A model ready to run: share it between sessions with [`Arc`].
pub struct Model {
    hparams: HParams,
    tokenizer: Tokenizer,
    chat_template: ChatTemplate,
    fingerprint: [u8; 32],
    pub(crate) tok_embd: RawTensor,
    pub(crate) output_norm: RawTensor,
    pub(crate) output: RawTensor,
    pub(crate) rope_freqs: Option<RawTensor>,
    pub(crate) layers: Vec<LayerWeights>,
    // Declared after the tensors that point into them: dropped last.
    _weights: Weights,
    _gguf: Gguf,
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
        let path = path.as_ref();
        if !path.exists() {
            return Err(Error::ModelNotFound {
                path: path.to_owned(),
            });
        }
        let gguf = Gguf::open(path)?;
        Model::from_gguf(gguf).map(Arc::new)
    }

    /// Builds a model from an opened GGUF file.
    pub fn from_gguf(gguf: Gguf) -> Result<Model> {
        let hp = HParams::from_gguf(&gguf)?;
        let tokenizer = Tokenizer::from_gguf(&gguf)?;
        let chat_template = ChatTemplate::from_gguf(&gguf)?;

        let mut specs = Specs {
            gguf: &gguf,
            list: Vec::new(),
        };
        let (e, kv, q) = (hp.n_embd, hp.n_embd_kv(), hp.head_dim * hp.n_head);
        let tok_embd = specs.require("token_embd.weight", &[e, hp.n_vocab])?;
        let output_norm = specs.require("output_norm.weight", &[e])?;
        // Models with tied embeddings have no output matrix and reuse the embedding table.
        let output = specs
            .find("output.weight", &[e, hp.n_vocab])?
            .unwrap_or(tok_embd);
        let rope_freqs = specs.find("rope_freqs.weight", &[hp.rope_dims / 2])?;
        let mut layer_idx = Vec::with_capacity(hp.n_layer);
        for l in 0..hp.n_layer {
            let n = |s: &str| format!("blk.{l}.{s}");
            // qwen2 has Q/K/V biases; for llama they are optional (some finetunes carry them).
            let bias = |specs: &mut Specs<'_>, name: &str, dim: usize| match hp.arch {
                Arch::Qwen2 => specs.require(&n(name), &[dim]).map(Some),
                Arch::Llama => specs.find(&n(name), &[dim]),
            };
            layer_idx.push(LayerWeights {
                attn_norm: specs.require(&n("attn_norm.weight"), &[e])?,
                wq: specs.require(&n("attn_q.weight"), &[e, q])?,
                wk: specs.require(&n("attn_k.weight"), &[e, kv])?,
                wv: specs.require(&n("attn_v.weight"), &[e, kv])?,
                wo: specs.require(&n("attn_output.weight"), &[q, e])?,
                bq: bias(&mut specs, "attn_q.bias", q)?,
                bk: bias(&mut specs, "attn_k.bias", kv)?,
                bv: bias(&mut specs, "attn_v.bias", kv)?,
                ffn_norm: specs.require(&n("ffn_norm.weight"), &[e])?,
                ffn_gate: specs.require(&n("ffn_gate.weight"), &[e, hp.n_ff])?,
                ffn_up: specs.require(&n("ffn_up.weight"), &[e, hp.n_ff])?,
                ffn_down: specs.require(&n("ffn_down.weight"), &[hp.n_ff, e])?,
            });
        }
        let weights = Weights::map(gguf.bytes(), &specs.list)?;
        let fingerprint = fingerprint(&gguf, &hp, &tokenizer);
        let layers = layer_idx
            .into_iter()
            .map(|l| l.map(|i| weights.get(i)))
            .collect();
        Ok(Model {
            tok_embd: weights.get(tok_embd),
            output_norm: weights.get(output_norm),
            output: weights.get(output),
            rope_freqs: rope_freqs.map(|i| weights.get(i)),
            layers,
            hparams: hp,
            tokenizer,
            chat_template,
            fingerprint,
            _weights: weights,
            _gguf: gguf,
        })
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

    /// 32 bytes that identify the model's computation: BLAKE3 over the architecture,
    /// hyperparameters, every tensor's name, type and shape, a sample of every tensor's bytes
    /// (its first and last 4 KiB, so fine-tunes of one base differ) and the vocabulary. KV caches
    /// are only interchangeable between models with equal fingerprints.
    pub fn fingerprint(&self) -> [u8; 32] {
        self.fingerprint
    }
}

fn fingerprint(gguf: &Gguf, hp: &HParams, tokenizer: &Tokenizer) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    h.update(b"llama-hdd model fingerprint v1\0");
    h.update(format!("{hp:?}").as_bytes());
    for t in gguf.tensors() {
        h.update(t.name.as_bytes());
        h.update(&(t.dtype as u32).to_le_bytes());
        for d in &t.shape {
            h.update(&d.to_le_bytes());
        }
        let data = gguf.tensor_bytes(t);
        let sample = 4096.min(data.len());
        h.update(&data[..sample]);
        h.update(&data[data.len() - sample..]);
    }
    for id in 0..tokenizer.n_vocab() as u32 {
        let piece = tokenizer.token_bytes(id);
        h.update(&(piece.len() as u32).to_le_bytes());
        h.update(piece);
    }
    *h.finalize().as_bytes()
}
