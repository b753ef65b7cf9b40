//! The options checked: what the server runs with.

use std::path::PathBuf;

use super::Args;

/// [`Args`] checked and converted.
#[derive(Clone, Debug)]
pub struct Config {
    /// The options as given.
    pub args: Args,
    /// The API keys, from `--api-key` and `--api-key-file` (empty: no authentication).
    pub api_keys: Vec<String>,
    /// `--cache-ram` in bytes (`u64::MAX`: no limit).
    pub cache_ram: u64,
    /// `--kv-ram` in bytes: `None` without it (a budget from the memory available is taken
    /// at start, see [`super::default_kv_ram`]), `Some(0)` for no budget.
    pub kv_ram: Option<u64>,
    /// `--cache-disk` in bytes.
    pub cache_disk: Option<u64>,
    /// `--max-body` in bytes.
    pub max_body: usize,
    /// The model names clients may use; the first is the one `/v1/models` shows as `id`.
    pub aliases: Vec<String>,
    /// The name responses carry (the first alias).
    pub alias: String,
    /// `--tags`.
    pub tags: Vec<String>,
    /// Slots.
    pub n_slots: usize,
    /// Whether any one request may use the whole context (`--kv-unified`, or `--parallel`
    /// left to auto, as llama-server does), rather than its slot's share.
    pub kv_unified: bool,
    /// Kernel threads.
    pub n_threads: usize,
    /// Addresses to listen on.
    pub hosts: Vec<String>,
    /// Flash attention.
    pub flash_attn: bool,
    /// Layers offloaded.
    pub n_gpu_layers: usize,
    /// Where the prompt cache lives.
    pub cache_dir: PathBuf,
    /// `/slots` is served.
    pub slots_endpoint: bool,
    /// The web page at `/` is served.
    pub ui: bool,
    /// Cached prompts are reused unless a request says otherwise.
    pub cache_prompt: bool,
    /// Extra template variables from `--chat-template-kwargs`.
    pub chat_template_kwargs: serde_json::Map<String, serde_json::Value>,
    /// The sampling defaults of requests (`--temp`, `--top-k`, …, `--logit-bias`).
    pub sampler: engine::sampling::SamplerParams,
    /// Pooling of `/embedding` and `/v1/embeddings` (served with `--embedding`).
    pub pooling: super::Pooling,
    /// DRY's sequence breakers (`None`: llama-server's defaults).
    pub dry_breakers: Option<Vec<String>>,
    /// Speculative decoding, when asked for.
    pub spec: Option<super::SpecConfig>,
}
