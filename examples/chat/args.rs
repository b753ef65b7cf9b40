//! The chat's command line, every value checked before anything is loaded (a bad value is a
//! usage error: a message and exit status 2).

use std::path::PathBuf;

use clap::Parser;

use crate::common_args::positive;
pub use crate::common_args::{KvArgs, ModelArgs, DEFAULT_MODEL};

/// The store directory of earlier versions, in the working directory: offered when it exists,
/// never used silently.
pub const EARLIER_STORE: &str = "store";

/// The default store directory: `chat/` in the user's cache directory, the server's default
/// `--cache-dir` (`$XDG_CACHE_HOME/llama-hdd`, else `~/.cache/llama-hdd`).
pub fn default_store() -> PathBuf {
    kvstore::default_cache_dir().join("chat")
}

/// Longest conversation name, in bytes (the store allows longer names; this leaves room for the
/// `-N` suffix of a new conversation's name).
pub const MAX_NAME_LEN: usize = 100;

#[derive(Parser, Debug)]
#[command(
    about = "Chat with a local llama-family model",
    args_override_self = true
)]
pub struct Args {
    /// The model (the default one is fetched when missing), GPU layers, threads.
    #[command(flatten)]
    pub model: ModelArgs,
    /// Context window in tokens.
    #[arg(long, value_parser = positive, default_value_t = 4096)]
    pub ctx: usize,
    /// System prompt.
    #[arg(long)]
    pub system: Option<String>,
    /// Sampling temperature (0 = greedy).
    #[arg(long, value_parser = non_negative, default_value_t = 0.7)]
    pub temp: f32,
    /// Keep only the k most likely tokens (0 = off).
    #[arg(long, default_value_t = 40)]
    pub top_k: usize,
    /// Nucleus sampling threshold, in (0, 1] (1 = off).
    #[arg(long, value_parser = probability, default_value_t = 0.95)]
    pub top_p: f32,
    /// Drop tokens less likely than this fraction of the best, in [0, 1] (0 = off).
    #[arg(long, value_parser = fraction, default_value_t = 0.05)]
    pub min_p: f32,
    /// Penalty for repeating recent tokens, > 0 (1 = off).
    #[arg(long, value_parser = penalty, default_value_t = 1.1)]
    pub repeat_penalty: f32,
    /// Random seed.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Longest reply in tokens.
    #[arg(long, value_parser = positive, default_value_t = 512)]
    pub max_tokens: usize,
    /// Directory of saved conversations, shared safely by several chats [default: `chat/` in
    /// the user's cache directory, `$XDG_CACHE_HOME/llama-hdd/chat` or
    /// `~/.cache/llama-hdd/chat`].
    #[arg(long)]
    pub store: Option<PathBuf>,
    /// Name of this conversation in the store: 1 to 100 of `A-Z a-z 0-9 . _ -`, not starting
    /// with `.`, without `..`.
    #[arg(long, value_parser = session_name, default_value = "default")]
    pub session: String,
    /// Start a new conversation (under a new name if this one is taken); nothing is deleted.
    #[arg(long)]
    pub fresh: bool,
    /// Disk budget of the store (e.g. 50MB, 1GiB); the least recently used conversations
    /// are dropped to keep it. No limit when absent.
    #[arg(long, value_parser = size, value_name = "SIZE")]
    pub cache_disk: Option<u64>,
    /// RAM kept for recently used KV blocks (e.g. 256MiB).
    #[arg(long, value_parser = size, value_name = "SIZE", default_value = "256MiB")]
    pub cache_ram: u64,
    /// RAM budget of the KV cache (e.g. 64MiB): past it, full pages go to the store and
    /// attention reads them from their files, with the same results, so a long context (up
    /// to `--ctx`) takes little memory. No budget when absent.
    #[arg(long = "kv-ram", value_parser = size, value_name = "SIZE")]
    pub kv_ram: Option<u64>,
    /// The KV cache's element types.
    #[command(flatten)]
    pub kv: KvArgs,
    /// Element type of K and V in the conversation store, when it differs from the cache
    /// types: f16 pages kept as q8_0 take 53% of the disk and RAM of the store, converted on
    /// save and restore (a restored conversation computes with what was stored). Also opens
    /// a store written with q8_0 from an f16 session, and the other way round.
    #[arg(long = "cache-type-stored", value_name = "TYPE")]
    pub cache_type_stored: Option<engine::KvType>,
    /// A remote tier (Redis) shared with other machines.
    #[command(flatten)]
    pub remote: kvstore::remote::RemoteArgs,
}

fn float(s: &str) -> Result<f32, String> {
    let v: f32 = s.parse().map_err(|e| format!("{e}"))?;
    if v.is_finite() {
        Ok(v)
    } else {
        Err("must be a finite number".into())
    }
}

fn non_negative(s: &str) -> Result<f32, String> {
    let v = float(s)?;
    if v >= 0.0 {
        Ok(v)
    } else {
        Err("must be 0 or more".into())
    }
}

fn probability(s: &str) -> Result<f32, String> {
    let v = float(s)?;
    if v > 0.0 && v <= 1.0 {
        Ok(v)
    } else {
        Err("must be more than 0 and at most 1".into())
    }
}

fn fraction(s: &str) -> Result<f32, String> {
    let v = float(s)?;
    if (0.0..=1.0).contains(&v) {
        Ok(v)
    } else {
        Err("must be between 0 and 1".into())
    }
}

fn penalty(s: &str) -> Result<f32, String> {
    let v = float(s)?;
    if v > 0.0 {
        Ok(v)
    } else {
        Err("must be more than 0".into())
    }
}

fn size(s: &str) -> Result<u64, String> {
    match parse_size(s) {
        Some(0) => Err("must be more than 0 bytes".into()),
        Some(n) => Ok(n),
        None => Err("expected a size such as 50MB, 512MiB or 2GB".into()),
    }
}

/// Parses a byte size: a number, then an optional unit, case-insensitive: `B`; `K`/`KB`,
/// `M`/`MB`, `G`/`GB`, `T`/`TB` (powers of 1000); `KiB`, `MiB`, `GiB`, `TiB` (powers of 1024).
/// `None` for anything else, a negative number or one too large for `u64`.
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    let value: f64 = number.parse().ok()?;
    let unit = unit.trim().to_ascii_lowercase();
    let scale: f64 = match unit.as_str() {
        "" | "b" => 1.0,
        "k" | "kb" => 1e3,
        "m" | "mb" => 1e6,
        "g" | "gb" => 1e9,
        "t" | "tb" => 1e12,
        "kib" => 1024.0,
        "mib" => 1024.0 * 1024.0,
        "gib" => 1024.0 * 1024.0 * 1024.0,
        "tib" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        _ => return None,
    };
    let bytes = (value * scale).round();
    (bytes.is_finite() && bytes >= 0.0 && bytes < u64::MAX as f64).then_some(bytes as u64)
}

/// Checks a conversation name: 1 to [`MAX_NAME_LEN`] bytes of `A-Z a-z 0-9 . _ -`, not starting
/// with `.`, without `..`, not ending in `.tmp` (the store's temporary files).
pub fn check_session_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("a session name cannot be empty".into());
    }
    if name.len() > MAX_NAME_LEN {
        return Err(format!(
            "a session name is at most {MAX_NAME_LEN} bytes (this one has {})",
            name.len()
        ));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(format!(
            "a session name holds only A-Z a-z 0-9 . _ - (found {c:?})"
        ));
    }
    if name.starts_with('.') || name.contains("..") || name.ends_with(".tmp") {
        return Err("a session name cannot start with '.', contain '..' or end in '.tmp'".into());
    }
    Ok(())
}

fn session_name(s: &str) -> Result<String, String> {
    check_session_name(s).map(|()| s.to_owned())
}
