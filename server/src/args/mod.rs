//! The command line: llama-server's options with their meanings, plus the prompt cache's own.
//!
//! Every option llama-server documents is known. Those that tune what this server has are
//! parsed here by clap, under llama-server's names, short forms and `LLAMA_ARG_*` variables.
//! The rest are sorted in [`compat`]: options that only tune what llama.cpp has and this server
//! does not need (thread polling, memory mapping, log colours) are accepted and named once at
//! start; options for capabilities this server lacks (LoRA, draft models, images) are refused
//! with the capability's name, never ignored.

mod compat;
mod config;
mod defaults;
mod embed;
mod gcp;
pub mod memory;
mod remote;
mod router;
mod spec;
mod tools;

pub use config::Config;

pub use defaults::{default_disk_budget, default_kv_ram};
pub use embed::{EmbeddingArgs, Pooling};
pub use gcp::{Gcp, GcpArgs};
pub use remote::{remote_config, RemoteArgs};
pub use router::RouterArgs;
pub use spec::{SpecArgs, SpecConfig};
pub use tools::ToolsArgs;

use std::path::PathBuf;

use clap::{ArgAction, Parser};

use crate::error::{Result, ServerError};

pub use compat::NoEffect;

/// A path, empty allowed (an empty `-m` is router mode).
fn any_path(s: &str) -> std::result::Result<PathBuf, std::convert::Infallible> {
    Ok(PathBuf::from(s))
}

/// An OpenAI-, Anthropic- and llama-server-compatible HTTP server whose prompt cache survives
/// restarts.
///
/// Every prompt's computed KV is kept as blocks in the cache directory (shared with other
/// processes and with the chat example); a later request, after a restart too, reuses the
/// longest prefix already computed. Options keep llama-server's names and meanings.
#[derive(Clone, Debug, Parser)]
#[command(name = "llama-hdd-server", version, args_override_self = true)]
pub struct Args {
    /// Model file (GGUF). Without one the server is a router over several models
    /// (`--models-dir`, `--models-preset`, the hub cache), each run by a process of its own.
    #[arg(
        short = 'm',
        long = "model",
        value_name = "FNAME",
        default_value = "",
        hide_default_value = true,
        value_parser = any_path,
        env = "LLAMA_ARG_MODEL"
    )]
    pub model: PathBuf,
    /// Layers to run on the GPU, counted from the last: a number, `auto` or `all` (`auto` is 0
    /// in a CPU-only build and `all` otherwise); more than the model has puts the output head
    /// there too (needs a `cuda` or `metal` build).
    #[arg(
        long = "n-gpu-layers",
        visible_aliases = ["gpu-layers"],
        value_name = "N",
        default_value = "auto",
        env = "LLAMA_ARG_N_GPU_LAYERS"
    )]
    pub n_gpu_layers: String,
    /// Addresses to listen on, comma-separated (`127.0.0.1,::1`).
    #[arg(long, default_value = "127.0.0.1", env = "LLAMA_ARG_HOST")]
    pub host: String,
    /// Port to listen on (0 picks a free one).
    #[arg(long, default_value_t = 8080, env = "LLAMA_ARG_PORT")]
    pub port: u16,
    /// Context size in positions, shared by the slots as llama-server shares it (a request may
    /// use all of it without `--parallel` or with `--kv-unified`, else `N / --parallel`); 0
    /// takes the model's.
    #[arg(
        short = 'c',
        long = "ctx-size",
        value_name = "N",
        default_value_t = 0,
        env = "LLAMA_ARG_CTX_SIZE"
    )]
    pub ctx_size: usize,
    /// Slots: requests evaluated at once (`-np`); more wait in a first-come queue. -1 (auto):
    /// 4 over one unified context, as llama-server.
    #[arg(long = "parallel", value_name = "N", default_value_t = -1, allow_negative_numbers = true, env = "LLAMA_ARG_N_PARALLEL")]
    pub parallel: i64,
    /// Every slot may use the whole context (`-kvu`; always so with auto `--parallel`); the KV
    /// pool is shared either way.
    #[arg(long = "kv-unified", action = ArgAction::SetTrue, overrides_with = "no_kv_unified", env = "LLAMA_ARG_KV_UNIFIED")]
    pub kv_unified: bool,
    /// Each slot gets its share of the context (`-no-kvu`; the default with `--parallel N`).
    #[arg(long = "no-kv-unified", action = ArgAction::SetTrue, overrides_with = "kv_unified")]
    pub no_kv_unified: bool,
    /// Threads for the kernels, -1 for all cores.
    #[arg(short = 't', long = "threads", value_name = "N", default_value_t = -1, allow_negative_numbers = true, env = "LLAMA_ARG_THREADS")]
    pub threads: i64,
    /// Threads for prompt batches (`-tb`); one pool runs both here, so this sizes it when
    /// `--threads` is not given.
    #[arg(long = "threads-batch", value_name = "N", default_value_t = -1, allow_negative_numbers = true, env = "LLAMA_ARG_THREADS_BATCH")]
    pub threads_batch: i64,
    /// Logical batch: most tokens one scheduler step evaluates over all requests (`-b`).
    #[arg(
        long = "batch-size",
        value_name = "N",
        default_value_t = 2048,
        env = "LLAMA_ARG_BATCH"
    )]
    pub batch_size: usize,
    /// Physical batch: most tokens one evaluation of the model takes (`-ub`).
    #[arg(
        long = "ubatch-size",
        value_name = "N",
        default_value_t = 512,
        env = "LLAMA_ARG_UBATCH"
    )]
    pub ubatch_size: usize,
    /// Flash attention: on, off or auto (on) (`-fa`).
    #[arg(long = "flash-attn", value_name = "on|off|auto", default_value = "auto", num_args = 0..=1, default_missing_value = "on", env = "LLAMA_ARG_FLASH_ATTN")]
    pub flash_attn: String,
    /// Default number of tokens to generate, -1 for as many as the context allows (`-n`,
    /// `--predict`).
    #[arg(long = "n-predict", visible_aliases = ["predict"], value_name = "N", default_value_t = -1, allow_negative_numbers = true, env = "LLAMA_ARG_N_PREDICT")]
    pub n_predict: i64,
    /// Prompt tokens kept when the context shifts (-1: all); with `--context-shift`.
    #[arg(
        long = "keep",
        value_name = "N",
        default_value_t = 0,
        allow_negative_numbers = true
    )]
    pub keep: i64,
    /// When a generation fills its context, drop the oldest half after `--keep` and go on.
    #[arg(long = "context-shift", action = ArgAction::SetTrue, overrides_with = "no_context_shift", env = "LLAMA_ARG_CONTEXT_SHIFT")]
    pub context_shift: bool,
    /// Stop a generation that fills its context (the default).
    #[arg(long = "no-context-shift", action = ArgAction::SetTrue, overrides_with = "context_shift")]
    pub no_context_shift: bool,
    /// Default sampling temperature.
    #[arg(long = "temp", visible_aliases = ["temperature"], value_name = "T", default_value_t = 0.8, env = "LLAMA_ARG_TEMPERATURE")]
    pub temp: f32,
    /// Default top-k (0 = off).
    #[arg(
        long = "top-k",
        value_name = "N",
        default_value_t = 40,
        env = "LLAMA_ARG_TOP_K"
    )]
    pub top_k: usize,
    /// Default top-p (1 = off).
    #[arg(
        long = "top-p",
        value_name = "P",
        default_value_t = 0.95,
        env = "LLAMA_ARG_TOP_P"
    )]
    pub top_p: f32,
    /// Default min-p (0 = off).
    #[arg(
        long = "min-p",
        value_name = "P",
        default_value_t = 0.05,
        env = "LLAMA_ARG_MIN_P"
    )]
    pub min_p: f32,
    /// Default repeat penalty (1 = off).
    #[arg(
        long = "repeat-penalty",
        value_name = "R",
        default_value_t = 1.0,
        env = "LLAMA_ARG_REPEAT_PENALTY"
    )]
    pub repeat_penalty: f32,
    /// Tokens the penalties look back over (0 = off, -1 = the context).
    #[arg(
        long = "repeat-last-n",
        value_name = "N",
        default_value_t = 64,
        allow_negative_numbers = true
    )]
    pub repeat_last_n: i64,
    /// Default presence penalty (0 = off).
    #[arg(
        long = "presence-penalty",
        value_name = "P",
        default_value_t = 0.0,
        allow_negative_numbers = true,
        env = "LLAMA_ARG_PRESENCE_PENALTY"
    )]
    pub presence_penalty: f32,
    /// Default frequency penalty (0 = off).
    #[arg(
        long = "frequency-penalty",
        value_name = "P",
        default_value_t = 0.0,
        allow_negative_numbers = true,
        env = "LLAMA_ARG_FREQUENCY_PENALTY"
    )]
    pub frequency_penalty: f32,
    /// Default locally typical sampling p (1 = off).
    #[arg(long = "typical-p", visible_aliases = ["typical"], value_name = "P", default_value_t = 1.0)]
    pub typical_p: f32,
    /// Default XTC probability (0 = off).
    #[arg(long = "xtc-probability", value_name = "P", default_value_t = 0.0)]
    pub xtc_probability: f32,
    /// Default XTC threshold.
    #[arg(long = "xtc-threshold", value_name = "P", default_value_t = 0.1)]
    pub xtc_threshold: f32,
    /// Default top-n-sigma (-1 = off).
    #[arg(long = "top-n-sigma", value_name = "N", default_value_t = -1.0, allow_negative_numbers = true)]
    pub top_n_sigma: f32,
    /// Default DRY multiplier (0 = off).
    #[arg(long = "dry-multiplier", value_name = "N", default_value_t = 0.0)]
    pub dry_multiplier: f32,
    /// Default DRY base.
    #[arg(long = "dry-base", value_name = "N", default_value_t = 1.75)]
    pub dry_base: f32,
    /// Default DRY allowed length.
    #[arg(long = "dry-allowed-length", value_name = "N", default_value_t = 2)]
    pub dry_allowed_length: usize,
    /// Default DRY window (-1 = the context, 0 = off).
    #[arg(long = "dry-penalty-last-n", value_name = "N", default_value_t = -1, allow_negative_numbers = true)]
    pub dry_penalty_last_n: i64,
    /// DRY sequence breaker (repeatable; replaces the defaults; `none` for none).
    #[arg(long = "dry-sequence-breaker", value_name = "STRING")]
    pub dry_sequence_breaker: Vec<String>,
    /// Default dynamic temperature range (0 = off).
    #[arg(long = "dynatemp-range", value_name = "N", default_value_t = 0.0)]
    pub dynatemp_range: f32,
    /// Default dynamic temperature exponent.
    #[arg(long = "dynatemp-exp", value_name = "N", default_value_t = 1.0)]
    pub dynatemp_exp: f32,
    /// Default mirostat: 0 off, 1 or 2.
    #[arg(long = "mirostat", value_name = "N", default_value_t = 0)]
    pub mirostat: u8,
    /// Default mirostat learning rate (eta).
    #[arg(long = "mirostat-lr", value_name = "N", default_value_t = 0.1)]
    pub mirostat_lr: f32,
    /// Default mirostat target entropy (tau).
    #[arg(long = "mirostat-ent", value_name = "N", default_value_t = 5.0)]
    pub mirostat_ent: f32,
    /// Default sampler chain, names separated by `;`.
    #[arg(long = "samplers", value_name = "SAMPLERS")]
    pub samplers: Option<String>,
    /// Default sampler chain as letters (`edskypmxt`).
    #[arg(long = "sampler-seq", visible_aliases = ["sampling-seq"], value_name = "SEQUENCE")]
    pub sampler_seq: Option<String>,
    /// A default logit bias, `TOKEN_ID+BIAS` or `TOKEN_ID-BIAS` (repeatable, `-l`).
    #[arg(
        long = "logit-bias",
        value_name = "TOKEN_ID(+/-)BIAS",
        allow_hyphen_values = true
    )]
    pub logit_bias: Vec<String>,
    /// Default seed, -1 for a random one per request (`-s`).
    #[arg(short = 's', long, value_name = "SEED", default_value_t = -1, allow_negative_numbers = true)]
    pub seed: i64,
    /// Never end a generation on an end-of-generation token, by default.
    #[arg(long = "ignore-eos")]
    pub ignore_eos: bool,
    /// API keys that clients must send (`Authorization: Bearer KEY` or `x-api-key`),
    /// comma-separated or the option repeated.
    #[arg(long = "api-key", value_name = "KEY", env = "LLAMA_API_KEY")]
    pub api_key: Vec<String>,
    /// What keeps clients' cached prompts apart: `key` (each API key its own cache, and a
    /// request's `cache_salt` within it), `salt` (only `cache_salt`), `none` (one cache for
    /// all: a client can tell by timing whether another sent a prompt).
    #[arg(long = "cache-isolation", value_name = "MODE", default_value = "key")]
    pub cache_isolation: CacheIsolation,
    /// File of API keys, one a line (`#` starts a comment line).
    #[arg(
        long = "api-key-file",
        value_name = "FNAME",
        env = "LLAMA_ARG_API_KEY_FILE"
    )]
    pub api_key_file: Option<PathBuf>,
    /// Separate store directory for `/slots` save and restore [default: the cache directory].
    #[arg(long = "slot-save-path", value_name = "PATH")]
    pub slot_save_path: Option<PathBuf>,
    /// Serve Prometheus metrics at `/metrics`.
    #[arg(long, env = "LLAMA_ARG_ENDPOINT_METRICS")]
    pub metrics: bool,
    /// Serve `GET /slots` (the default).
    #[arg(long = "slots", action = ArgAction::SetTrue, overrides_with = "no_slots")]
    pub slots: bool,
    /// Do not serve `GET /slots` (501 instead).
    #[arg(long = "no-slots", action = ArgAction::SetTrue, overrides_with = "slots")]
    pub no_slots: bool,
    /// Accept `POST /props`; as in llama-server, no property can be changed through it yet.
    #[arg(long = "props", env = "LLAMA_ARG_ENDPOINT_PROPS")]
    pub props: bool,
    /// Model names for the API, comma-separated (`-a`) [default: the file's stem].
    #[arg(short = 'a', long, value_name = "NAMES", env = "LLAMA_ARG_ALIAS")]
    pub alias: Option<String>,
    /// Model tags shown by `/v1/models`, comma-separated.
    #[arg(long, value_name = "TAGS", env = "LLAMA_ARG_TAGS")]
    pub tags: Option<String>,
    /// Origins allowed by CORS, comma-separated; `*` allows any, `localhost` pages of this
    /// machine [default: `*`, or `localhost` when tools or MCP servers are on].
    #[arg(
        long = "cors-origins",
        value_name = "ORIGINS",
        env = "LLAMA_ARG_CORS_ORIGINS"
    )]
    pub cors_origins: Option<String>,
    /// Methods allowed by CORS.
    #[arg(
        long = "cors-methods",
        value_name = "METHODS",
        default_value = "GET, POST, DELETE, OPTIONS"
    )]
    pub cors_methods: String,
    /// Headers allowed by CORS.
    #[arg(long = "cors-headers", value_name = "HEADERS", default_value = "*")]
    pub cors_headers: String,
    /// Serve every endpoint under this path prefix too (e.g. `/llm`).
    #[arg(
        long = "api-prefix",
        value_name = "PREFIX",
        default_value = "",
        env = "LLAMA_ARG_API_PREFIX"
    )]
    pub api_prefix: String,
    /// Serve the small web page at `/` (the default).
    #[arg(long = "ui", visible_aliases = ["webui"], action = ArgAction::SetTrue, overrides_with = "no_ui")]
    pub ui: bool,
    /// Serve no web page (404 at `/`).
    #[arg(long = "no-ui", visible_aliases = ["no-webui"], action = ArgAction::SetTrue, overrides_with = "ui")]
    pub no_ui: bool,
    /// Serve `/cors-proxy` (llama-server's proxy for the web page's MCP servers): a request's
    /// `url` (plain `http`) fetched with only the headers sent as
    /// `x-llama-server-proxy-header-NAME`. Off: 403.
    #[arg(long = "ui-mcp-proxy", visible_aliases = ["webui-mcp-proxy"], action = ArgAction::SetTrue, overrides_with = "no_ui_mcp_proxy", env = "LLAMA_ARG_UI_MCP_PROXY")]
    pub ui_mcp_proxy: bool,
    /// No `/cors-proxy` (the default).
    #[arg(long = "no-ui-mcp-proxy", visible_aliases = ["no-webui-mcp-proxy"], action = ArgAction::SetTrue, overrides_with = "ui_mcp_proxy")]
    pub no_ui_mcp_proxy: bool,
    /// Seconds a request may wait on its client before it is dropped (`-to`).
    #[arg(
        long = "timeout",
        value_name = "N",
        default_value_t = 3600,
        env = "LLAMA_ARG_TIMEOUT"
    )]
    pub timeout: u64,
    /// Threads serving HTTP, -1 for as many as cores.
    #[arg(long = "threads-http", value_name = "N", default_value_t = -1, allow_negative_numbers = true, env = "LLAMA_ARG_THREADS_HTTP")]
    pub threads_http: i64,
    /// Reuse cached prompts (the default).
    #[arg(long = "cache-prompt", action = ArgAction::SetTrue, overrides_with = "no_cache_prompt")]
    pub cache_prompt: bool,
    /// Reuse no cached prompt unless a request asks (`cache_prompt: true`).
    #[arg(long = "no-cache-prompt", action = ArgAction::SetTrue, overrides_with = "cache_prompt")]
    pub no_cache_prompt: bool,
    /// Smallest chunk of a resident cached prompt reused after the shared prefix by shifting
    /// its KV into place, as llama-server does (0 = off). A shifted sequence's KV saw other
    /// tokens before it, so replies may differ from a full evaluation; it is never stored.
    #[arg(
        long = "cache-reuse",
        value_name = "N",
        default_value_t = 0,
        env = "LLAMA_ARG_CACHE_REUSE"
    )]
    pub cache_reuse: usize,
    /// How much of the prompt a slot's last one must share for a request to go to it
    /// (`-sps`); prompts are shared by prefix in any slot here, so this only orders the
    /// choice.
    #[arg(
        long = "slot-prompt-similarity",
        value_name = "S",
        default_value_t = 0.1
    )]
    pub slot_prompt_similarity: f32,
    /// Free the slots' memory after this many idle seconds (-1 = never); it comes back from
    /// the cache on the next request.
    #[arg(long = "sleep-idle-seconds", value_name = "N", default_value_t = -1, allow_negative_numbers = true)]
    pub sleep_idle_seconds: i64,
    /// Most context checkpoints per slot (`-ctxcp`); every prompt's 64-token pages are kept
    /// here, so this bounds nothing more.
    #[arg(long = "ctx-checkpoints", visible_aliases = ["swa-checkpoints"], value_name = "N", default_value_t = 32)]
    pub ctx_checkpoints: usize,
    /// Log every request and the scheduler's steps (`-v`).
    #[arg(long = "verbose", visible_aliases = ["log-verbose"], action = ArgAction::SetTrue)]
    pub verbose: bool,
    /// Verbosity threshold (`-lv`): 0 quiet … 4 debug.
    #[arg(long = "verbosity", visible_aliases = ["log-verbosity"], value_name = "N", default_value_t = 3)]
    pub verbosity: i64,
    /// Log nothing.
    #[arg(long = "log-disable")]
    pub log_disable: bool,
    /// Log to this file as well (appended to).
    #[arg(long = "log-file", value_name = "FNAME", env = "LLAMA_ARG_LOG_FILE")]
    pub log_file: Option<PathBuf>,
    /// Render chats with the model's Jinja template (the default).
    #[arg(long = "jinja", action = ArgAction::SetTrue, overrides_with = "no_jinja")]
    pub jinja: bool,
    /// Render chats with llama-server's built-in templates instead: the one named by
    /// `--chat-template`, or ChatML.
    #[arg(long = "no-jinja", action = ArgAction::SetTrue, overrides_with = "jinja")]
    pub no_jinja: bool,
    /// Chat template: a Jinja template, or one of llama-server's built-in names (`chatml`,
    /// `llama3`, `mistral-v7`, …).
    #[arg(long = "chat-template", value_name = "TEMPLATE")]
    pub chat_template: Option<String>,
    /// File holding the chat template.
    #[arg(
        long = "chat-template-file",
        value_name = "FNAME",
        conflicts_with = "chat_template"
    )]
    pub chat_template_file: Option<PathBuf>,
    /// Extra variables for the chat template, a JSON object.
    #[arg(
        long = "chat-template-kwargs",
        value_name = "JSON",
        env = "LLAMA_CHAT_TEMPLATE_KWARGS"
    )]
    pub chat_template_kwargs: Option<String>,
    /// Where reasoning goes: `auto`/`deepseek` (split out as `reasoning_content`),
    /// `deepseek-legacy` (both), `none` (left in the content).
    #[arg(
        long = "reasoning-format",
        value_name = "FORMAT",
        default_value = "auto"
    )]
    pub reasoning_format: String,
    /// Reasoning tokens allowed: -1 unrestricted, 0 none.
    #[arg(long = "reasoning-budget", value_name = "N", default_value_t = -1, allow_negative_numbers = true)]
    pub reasoning_budget: i64,
    /// Reasoning on, off or auto (`-rea`).
    #[arg(long = "reasoning", value_name = "on|off|auto", default_value = "auto")]
    pub reasoning: String,
    /// Continue a final assistant message rather than start a new one (the default).
    #[arg(long = "prefill-assistant", action = ArgAction::SetTrue, overrides_with = "no_prefill_assistant")]
    pub prefill_assistant: bool,
    /// Start a new assistant message after a final assistant message.
    #[arg(long = "no-prefill-assistant", action = ArgAction::SetTrue, overrides_with = "prefill_assistant")]
    pub no_prefill_assistant: bool,
    /// Directory of the persistent prompt cache (shared with other processes)
    /// [default: the user's cache directory, `$XDG_CACHE_HOME/llama-hdd`].
    #[arg(long = "cache-dir", value_name = "PATH", env = "LLAMA_HDD_CACHE_DIR")]
    pub cache_dir: Option<PathBuf>,
    /// RAM tier of the prompt cache: MiB as llama-server reads it (`-cram`; -1 no limit, 0
    /// none), or a size with a unit (`256MiB`).
    #[arg(
        long = "cache-ram",
        value_name = "SIZE",
        default_value = "256MiB",
        allow_negative_numbers = true,
        env = "LLAMA_ARG_CACHE_RAM"
    )]
    pub cache_ram: String,
    /// Disk budget of the prompt cache (e.g. 10GiB); least recently used blocks go first;
    /// -1 for no limit [default: the smaller of 20GiB and half the space free on the cache
    /// directory's filesystem at start].
    #[arg(
        long = "cache-disk",
        value_name = "SIZE",
        allow_negative_numbers = true
    )]
    pub cache_disk: Option<String>,
    /// RAM budget of the KV pool: past it, full pages of long contexts go to their blocks in
    /// the cache directory and attention reads them there (the same replies); MiB as a bare
    /// number, or a size (`4GiB`); `0` or `none` for no budget [default: half the memory
    /// available at start (the cgroup's limit or MemAvailable, the smaller) after the model
    /// file and `--cache-ram`, at least 64 MiB; no budget when the whole pool fits in it, or
    /// with `--no-cache`].
    #[arg(
        long = "kv-ram",
        value_name = "SIZE",
        allow_negative_numbers = true,
        env = "LLAMA_HDD_KV_RAM"
    )]
    pub kv_ram: Option<String>,
    /// Keep no prompt cache on disk (prompts are still shared in memory).
    #[arg(long = "no-cache")]
    pub no_cache: bool,
    /// Do not evaluate a reasoning reply ahead as clients such as opencode and Open WebUI send
    /// it back (its content without the reasoning), so that their next turn is a cache hit up
    /// to the new message; such a turn then computes the reply again.
    #[arg(long = "no-warm-replies")]
    pub no_warm_replies: bool,
    /// Element type of the K cache: f16 or q8_0 (`-ctk`). The cache directory holds one
    /// type: a store written with another is refused.
    #[arg(
        long = "cache-type-k",
        visible_alias = "ctk",
        default_value = "f16",
        env = "LLAMA_ARG_CACHE_TYPE_K"
    )]
    pub cache_type_k: engine::KvType,
    /// Element type of the V cache: f16 or q8_0 (`-ctv`).
    #[arg(
        long = "cache-type-v",
        visible_alias = "ctv",
        default_value = "f16",
        env = "LLAMA_ARG_CACHE_TYPE_V"
    )]
    pub cache_type_v: engine::KvType,
    /// Element type of K and V in the conversation store, when it differs from the cache
    /// types: f16 pages kept as q8_0 take 53% of the disk and RAM of the store, converted on
    /// save and restore (a restored conversation computes with what was stored). Also opens
    /// a store written with q8_0 from an f16 session, and the other way round.
    #[arg(long = "cache-type-stored", value_name = "TYPE")]
    pub cache_type_stored: Option<engine::KvType>,
    /// Which kernels evaluate: `invariant` (the default: a reply is the same bits whether its
    /// prompt came from the cache, memory or disk, or was computed, alone or in a batch, at
    /// full speed), `llama-cpp` (ggml's kernels and llama.cpp's bits, invariant too, prefill
    /// much slower) or `fast` (each request's kernels chosen by its own length; a cached
    /// prompt may answer otherwise than the same prompt computed).
    #[arg(long = "evaluation", value_name = "KIND", default_value = "invariant")]
    pub evaluation: engine::Evaluation,
    /// Batch-invariant evaluation, now the default (`--evaluation invariant`); accepted.
    #[arg(long = "deterministic")]
    pub deterministic: bool,
    /// Copy matrix weights into llama.cpp's repacked CPU layout (q4_0, q4_K, iq4_nl), as
    /// llama-server does by default: llama.cpp's own sums over them, whose bits depend on a
    /// batch's size, so replies are no longer batch-invariant. Off by default.
    #[arg(long = "repack", overrides_with = "no_repack")]
    pub repack: bool,
    /// Keep matrix weights as the file lays them out (`-nr`; the default here).
    #[arg(long = "no-repack", overrides_with = "repack")]
    pub no_repack: bool,
    /// Skip the warm-up at start (one token through the model, as llama-server evaluates, so
    /// that the first request does not pay for it). `--warmup`, the default, is accepted.
    #[arg(long = "no-warmup")]
    pub no_warmup: bool,
    /// Fault injection for tests: each block read from the cache waits this many milliseconds
    /// first, as on a slow disk.
    #[arg(long = "fault-read-delay-ms", hide = true, default_value_t = 0)]
    pub fault_read_delay_ms: u64,
    /// Largest request body accepted (e.g. 8MiB).
    #[arg(long = "max-body", value_name = "SIZE", default_value = "8MiB")]
    pub max_body: String,
    /// The embeddings options.
    #[command(flatten)]
    pub embeddings: EmbeddingArgs,
    /// The prompt cache's remote tier.
    #[command(flatten)]
    pub remote: RemoteArgs,
    /// Google Cloud Vertex AI's variables (`AIP_MODE`, `AIP_HTTP_PORT`, ...).
    #[command(flatten)]
    pub gcp: GcpArgs,
    /// Speculative decoding.
    #[command(flatten)]
    pub spec: SpecArgs,
    /// Router mode (no `-m`).
    #[command(flatten)]
    pub router: RouterArgs,
    /// Built-in agent tools and MCP servers (`/tools`).
    #[command(flatten)]
    pub tools: ToolsArgs,
    /// llama-server options accepted that tune nothing here (filled by the parser).
    #[arg(skip)]
    pub no_effect: Vec<NoEffect>,
}

impl Args {
    /// Parses `argv` (program name first) as llama-server does: its short forms (`-np`,
    /// `-ngl`, `-ctk`, `-fa`, …), its options that tune nothing here (kept in
    /// [`Args::no_effect`]), and a refusal naming the capability for those this server lacks.
    pub fn parse_from_argv<I, S>(argv: I) -> std::result::Result<Args, clap::Error>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let argv: Vec<String> = argv.into_iter().map(Into::into).collect();
        let sorted = compat::sort(argv).map_err(|msg| {
            clap::Error::raw(clap::error::ErrorKind::ArgumentConflict, format!("{msg}\n"))
        })?;
        let mut args = Args::try_parse_from(sorted.argv)?;
        args.no_effect = sorted.no_effect;
        // Parsed for their values, but tuning nothing here.
        let noted = [
            ("--timeout", args.timeout != 3600, "connection timeouts"),
            (
                "--threads-http",
                args.threads_http != -1,
                "HTTP threads (requests are served on the async runtime)",
            ),
            (
                "--slot-prompt-similarity",
                args.slot_prompt_similarity != 0.1,
                "slot choice by prompt similarity (prompts are shared by prefix in any slot)",
            ),
            (
                "--ctx-checkpoints",
                args.ctx_checkpoints != 32,
                "context checkpoints (every 64-token page is one)",
            ),
            ("--verbosity", args.verbosity != 3, "log verbosity"),
            ("--verbose", args.verbose, "log verbosity"),
        ];
        for (option, set, tunes) in noted {
            if set {
                args.no_effect.push(NoEffect {
                    option: option.to_owned(),
                    tunes,
                });
            }
        }
        Ok(args)
    }

    /// `--flash-attn` as a switch (`auto` is on).
    fn flash_attn(&self) -> Result<bool> {
        match self.flash_attn.as_str() {
            "on" | "auto" | "1" | "true" => Ok(true),
            "off" | "0" | "false" => Ok(false),
            other => Err(ServerError::BadOption {
                option: "--flash-attn",
                reason: format!("{other:?} is not on, off or auto"),
            }),
        }
    }

    /// Checks the options and reads the key file.
    pub fn check(mut self) -> Result<Config> {
        let bad = |option: &'static str, reason: String| ServerError::BadOption { option, reason };
        if let Some(gcp) = self.gcp.routes() {
            if let Some(reason) = crate::routes::gcp_conflict(&gcp.predict) {
                return Err(bad("AIP_PREDICT_ROUTE", reason));
            }
            // As llama-server: Vertex AI's port replaces `--port`.
            self.port = gcp.port;
        }
        let size = |option: &'static str, text: &str| {
            kvstore::parse_size(text).map_err(|e| bad(option, e.to_string()))
        };
        self.router.check(
            !self.model.as_os_str().is_empty(),
            [
                ("--alias", self.alias.is_some()),
                ("--tags", self.tags.is_some()),
            ],
        )?;
        let (n_slots, kv_unified) = self.slots()?;
        self.check_sampling_ranges()?;
        if self.ctx_size == 1 {
            return Err(bad("--ctx-size", "at least 2 positions are needed".into()));
        }
        let pooling = self
            .embeddings
            .pooling()
            .map_err(|reason| bad("--pooling", reason))?;
        if self.batch_size == 0 || self.ubatch_size == 0 {
            return Err(bad(
                "--batch-size",
                "batches hold at least one token".into(),
            ));
        }
        if self.reasoning_budget == 0 && self.reasoning == "on" {
            return Err(bad(
                "--reasoning-budget",
                "0 turns reasoning off, which --reasoning on contradicts".into(),
            ));
        }
        let flash_attn = self.flash_attn()?;
        let n_gpu_layers = match self.n_gpu_layers.as_str() {
            "auto" if !cfg!(any(feature = "cuda", feature = "metal")) => 0,
            "auto" | "all" => usize::MAX,
            n => n
                .parse::<i64>()
                .map(|n| usize::try_from(n).unwrap_or(usize::MAX))
                .map_err(|_| {
                    bad(
                        "--n-gpu-layers",
                        format!("{n:?} is not a number, auto or all"),
                    )
                })?,
        };
        match self.reasoning_format.as_str() {
            "auto" | "none" | "deepseek" | "deepseek-legacy" => {}
            other => {
                return Err(bad(
                    "--reasoning-format",
                    format!("{other:?} is not auto, none, deepseek or deepseek-legacy"),
                ))
            }
        }
        match self.reasoning.as_str() {
            "auto" | "on" | "off" => {}
            other => {
                return Err(bad(
                    "--reasoning",
                    format!("{other:?} is not on, off or auto"),
                ))
            }
        }
        let chat_template_kwargs = match &self.chat_template_kwargs {
            None => serde_json::Map::new(),
            Some(text) => match serde_json::from_str(text) {
                Ok(serde_json::Value::Object(map)) => map,
                _ => {
                    return Err(bad(
                        "--chat-template-kwargs",
                        "a JSON object is required".into(),
                    ))
                }
            },
        };
        let api_keys = self.api_keys()?;
        let (cache_ram, cache_dir, cache_disk) = self.caches()?;
        let kv_ram = self.kv_ram()?;
        let max_body = size("--max-body", &self.max_body)? as usize;
        let aliases = self.aliases();
        let tags = self
            .tags
            .iter()
            .flat_map(|t| t.split(','))
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .map(str::to_owned)
            .collect();
        let cores = std::thread::available_parallelism().map_or(4, |n| n.get());
        let n_threads = match (self.threads, self.threads_batch) {
            (t, _) if t > 0 => t as usize,
            (_, tb) if tb > 0 => tb as usize,
            _ => cores,
        };
        let hosts: Vec<String> = self
            .host
            .split(',')
            .map(str::trim)
            .filter(|h| !h.is_empty())
            .map(str::to_owned)
            .collect();
        if hosts.is_empty() {
            return Err(bad("--host", "no address given".into()));
        }
        let sampler = self.sampler()?;
        let spec = self.spec.config().map_err(|e| bad("--spec-type", e))?;
        let dry_breakers = match self.dry_sequence_breaker.as_slice() {
            [] => None,
            [none] if none == "none" => Some(Vec::new()),
            list => Some(list.to_vec()),
        };
        Ok(Config {
            api_keys,
            cache_ram,
            kv_ram,
            cache_disk,
            max_body,
            alias: aliases[0].clone(),
            aliases,
            tags,
            n_slots,
            kv_unified,
            n_threads,
            hosts,
            flash_attn,
            n_gpu_layers,
            cache_dir,
            slots_endpoint: !self.no_slots,
            ui: !self.no_ui,
            cache_prompt: !self.no_cache_prompt,
            chat_template_kwargs,
            sampler,
            dry_breakers,
            pooling,
            spec,
            args: self,
        })
    }
}

#[cfg(test)]
mod tests;

/// `--cache-isolation`: what keeps clients' cached prompts apart.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum CacheIsolation {
    /// Each API key has a cache of its own, and a request's `cache_salt` separates further.
    #[default]
    Key,
    /// Only `cache_salt` separates: clients with the same key or without one share.
    Salt,
    /// One cache for every client; `cache_salt` is ignored.
    None,
}
