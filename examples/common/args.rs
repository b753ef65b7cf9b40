//! Command-line options the examples share, said once: the model file, its GPU layers and the
//! kernels' threads ([`ModelArgs`], with loading), and the KV cache's element types
//! ([`KvArgs`], with the context and store settings they imply). Each example flattens them
//! into its own clap `Args` (`#[command(flatten)]`).

#![allow(dead_code)] // Each example uses its own part.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context as _, Result};
use engine::store::StoreConfig;
use engine::{ContextParams, KvType, Model, ModelParams};

/// The model examples use when `--model` is not given.
pub const DEFAULT_MODEL: &str = "models/SmolLM2-135M-Instruct.Q4_1.gguf";

/// The model and where it runs.
#[derive(clap::Args, Debug, Clone)]
pub struct ModelArgs {
    /// GGUF model file.
    #[arg(long = "model", value_name = "MODEL", default_value = DEFAULT_MODEL)]
    pub path: PathBuf,
    /// Layers to run on the GPU, counted from the last; more than the model has puts the output
    /// head there too (`-ngl` works too; needs a `cuda` or `metal` build).
    #[arg(long = "n-gpu-layers", value_name = "N", default_value_t = 0)]
    pub n_gpu_layers: usize,
    /// Threads for the kernels.
    #[arg(long, value_parser = positive, default_value_t = default_threads())]
    pub threads: usize,
}

impl ModelArgs {
    /// How the model is loaded (`ModelParams::repack` and the rest at their defaults).
    pub fn params(&self) -> ModelParams {
        ModelParams::gpu_layers(self.n_gpu_layers)
    }

    /// Loads the model with [`params`](Self::params), naming the file in the error.
    pub fn load(&self) -> Result<Arc<Model>> {
        self.load_with(&self.params())
    }

    /// Loads the model with `params`, naming the file in the error.
    pub fn load_with(&self, params: &ModelParams) -> Result<Arc<Model>> {
        Model::load_with(&self.path, params)
            .with_context(|| format!("loading {}", self.path.display()))
    }
}

/// The KV cache's element types (llama.cpp's `-ctk`/`-ctv`).
#[derive(clap::Args, Debug, Clone)]
pub struct KvArgs {
    /// Element type of the K cache: f16 or q8_0 (llama.cpp's `-ctk`).
    #[arg(long = "cache-type-k", visible_alias = "ctk", default_value = "f16")]
    pub cache_type_k: KvType,
    /// Element type of the V cache: f16 or q8_0 (llama.cpp's `-ctv`; q8_0 needs flash
    /// attention).
    #[arg(long = "cache-type-v", visible_alias = "ctv", default_value = "f16")]
    pub cache_type_v: KvType,
}

impl KvArgs {
    /// A context of `n_ctx` tokens with these types and `model`'s threads (the rest at
    /// [`ContextParams::default`]).
    pub fn context(&self, model: &ModelArgs, n_ctx: usize) -> ContextParams {
        ContextParams {
            n_ctx,
            n_threads: model.threads,
            type_k: self.cache_type_k,
            type_v: self.cache_type_v,
            ..ContextParams::default()
        }
    }

    /// `base` for sessions of these types, keeping K and V as `stored` at rest when given.
    pub fn store(&self, stored: Option<KvType>, base: StoreConfig) -> StoreConfig {
        StoreConfig {
            type_k: self.cache_type_k,
            type_v: self.cache_type_v,
            stored_type_k: stored,
            stored_type_v: stored,
            ..base
        }
    }
}

/// The machine's parallelism (4 when unknown).
pub fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(4, |n| n.get())
}

/// A whole number of at least 1.
pub fn positive(s: &str) -> std::result::Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}
