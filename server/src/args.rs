//! The command line: llama-server's names and meanings for what we support, plus the prompt
//! cache's own options.

use std::path::PathBuf;

use clap::Parser;

use crate::error::{Result, ServerError};

/// An OpenAI- and llama-server-compatible HTTP server whose prompt cache survives restarts.
///
/// Every prompt's computed KV is kept as blocks in the cache directory (shared with other
/// processes and with the chat example); a later request, after a restart too, reuses the
/// longest prefix already computed.
#[derive(Clone, Debug, Parser)]
#[command(name = "llama-hdd-server", version, args_override_self = true)]
pub struct Args {
    /// Model file (GGUF).
    #[arg(short = 'm', long = "model", value_name = "FNAME")]
    pub model: PathBuf,
    /// Layers to run on the GPU, counted from the last; more than the model has puts the output
    /// head there too (`-ngl` works too; needs a `cuda` or `metal` build).
    #[arg(long = "n-gpu-layers", value_name = "N", default_value_t = 0)]
    pub n_gpu_layers: usize,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0 picks a free one).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Positions each request may use (prompt and reply).
    #[arg(
        short = 'c',
        long = "ctx-size",
        value_name = "N",
        default_value_t = 4096
    )]
    pub ctx_size: usize,
    /// Requests evaluated at once (`-np` works too); more wait in a first-come queue.
    #[arg(long = "parallel", value_name = "N", default_value_t = 4)]
    pub parallel: usize,
    /// Threads for the kernels [default: all cores].
    #[arg(short = 't', long = "threads", value_name = "N")]
    pub threads: Option<usize>,
    /// Default number of tokens to generate, -1 for as many as the context allows.
    #[arg(short = 'n', long = "n-predict", value_name = "N", default_value_t = -1, allow_negative_numbers = true)]
    pub n_predict: i64,
    /// Default sampling temperature.
    #[arg(long = "temp", value_name = "T", default_value_t = 0.8)]
    pub temp: f32,
    /// Default seed, -1 for a random one per request.
    #[arg(long, value_name = "SEED", default_value_t = -1, allow_negative_numbers = true)]
    pub seed: i64,
    /// API key that clients must send (`Authorization: Bearer KEY`).
    #[arg(long = "api-key", value_name = "KEY")]
    pub api_key: Option<String>,
    /// File whose first line is the API key.
    #[arg(
        long = "api-key-file",
        value_name = "FNAME",
        conflicts_with = "api_key"
    )]
    pub api_key_file: Option<PathBuf>,
    /// Separate store directory for `/slots` save and restore [default: the cache directory].
    #[arg(long = "slot-save-path", value_name = "PATH")]
    pub slot_save_path: Option<PathBuf>,
    /// Serve Prometheus metrics at `/metrics`.
    #[arg(long)]
    pub metrics: bool,
    /// Model name shown by `/v1/models` [default: the file's stem].
    #[arg(long, value_name = "NAME")]
    pub alias: Option<String>,
    /// Directory of the persistent prompt cache (shared with other processes).
    #[arg(long = "cache-dir", value_name = "PATH", default_value = "store")]
    pub cache_dir: PathBuf,
    /// RAM tier of the prompt cache (e.g. 256MiB).
    #[arg(long = "cache-ram", value_name = "SIZE", default_value = "256MiB")]
    pub cache_ram: String,
    /// Disk budget of the prompt cache (e.g. 10GiB); least recently used blocks go first
    /// [default: no limit].
    #[arg(long = "cache-disk", value_name = "SIZE")]
    pub cache_disk: Option<String>,
    /// Keep no prompt cache on disk (prompts are still shared in memory).
    #[arg(long = "no-cache")]
    pub no_cache: bool,
    /// Element type of the K cache: f16 or q8_0 (llama.cpp's `-ctk`). The cache directory holds
    /// one type: a store written with another is refused.
    #[arg(long = "cache-type-k", visible_alias = "ctk", default_value = "f16")]
    pub cache_type_k: engine::KvType,
    /// Element type of the V cache: f16 or q8_0 (llama.cpp's `-ctv`).
    #[arg(long = "cache-type-v", visible_alias = "ctv", default_value = "f16")]
    pub cache_type_v: engine::KvType,
    /// Element type of K and V in the conversation store, when it differs from the cache
    /// types: f16 pages kept as q8_0 take 53% of the disk and RAM of the store, converted on
    /// save and restore (a restored conversation computes with what was stored). Also opens
    /// a store written with q8_0 from an f16 session, and the other way round.
    #[arg(long = "cache-type-stored", value_name = "TYPE")]
    pub cache_type_stored: Option<engine::KvType>,
    /// Largest request body accepted (e.g. 8MiB).
    #[arg(long = "max-body", value_name = "SIZE", default_value = "8MiB")]
    pub max_body: String,
}

/// [`Args`] checked and converted.
#[derive(Clone, Debug)]
pub struct Config {
    /// The options as given.
    pub args: Args,
    /// The API key, from `--api-key` or `--api-key-file`.
    pub api_key: Option<String>,
    /// `--cache-ram` in bytes.
    pub cache_ram: u64,
    /// `--cache-disk` in bytes.
    pub cache_disk: Option<u64>,
    /// `--max-body` in bytes.
    pub max_body: usize,
    /// The name `/v1/models` shows.
    pub alias: String,
}

impl Args {
    /// Parses `argv` (program name first), accepting llama-server's `-np N` for `--parallel`,
    /// `-ctk` / `-ctv` for the cache types and `-ngl` for `--n-gpu-layers`.
    pub fn parse_from_argv<I, S>(argv: I) -> std::result::Result<Args, clap::Error>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let argv = argv.into_iter().map(|a| {
            let a: String = a.into();
            match a.strip_prefix("-np") {
                Some("") => "--parallel".to_owned(),
                Some(rest) if rest.starts_with('=') => format!("--parallel{rest}"),
                _ => a,
            }
        });
        // llama-server's `-ctk` / `-ctv` / `-ngl` too.
        Args::try_parse_from(engine::expand_llama_cpp_flags(
            argv.map(std::ffi::OsString::from),
        ))
    }

    /// Checks the options and reads the key file.
    pub fn check(self) -> Result<Config> {
        let size = |option: &'static str, text: &str| {
            kvstore::parse_size(text).map_err(|e| ServerError::BadOption {
                option,
                reason: e.to_string(),
            })
        };
        if self.parallel == 0 {
            return Err(ServerError::BadOption {
                option: "--parallel",
                reason: "at least one slot is needed".into(),
            });
        }
        if !self.temp.is_finite() {
            return Err(ServerError::BadOption {
                option: "--temp",
                reason: format!("{} is not a finite number", self.temp),
            });
        }
        if self.ctx_size < 2 {
            return Err(ServerError::BadOption {
                option: "--ctx-size",
                reason: "at least 2 positions are needed".into(),
            });
        }
        let api_key = match &self.api_key_file {
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|source| ServerError::Io {
                    what: format!("reading {}", path.display()),
                    source,
                })?;
                let key = text.lines().next().unwrap_or("").trim().to_owned();
                if key.is_empty() {
                    return Err(ServerError::BadOption {
                        option: "--api-key-file",
                        reason: format!("{} holds no key", path.display()),
                    });
                }
                Some(key)
            }
            None => self.api_key.clone(),
        };
        let cache_ram = size("--cache-ram", &self.cache_ram)?;
        let cache_disk = match &self.cache_disk {
            Some(s) => Some(size("--cache-disk", s)?),
            None => None,
        };
        let max_body = size("--max-body", &self.max_body)? as usize;
        let alias = self.alias.clone().unwrap_or_else(|| {
            self.model
                .file_stem()
                .map_or_else(|| "model".to_owned(), |s| s.to_string_lossy().into_owned())
        });
        Ok(Config {
            api_key,
            cache_ram,
            cache_disk,
            max_body,
            alias,
            args: self,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_infinite_default_temperature_is_refused() {
        let args = Args::parse_from_argv(["server", "-m", "m.gguf", "--temp", "inf"]);
        let e = args.expect("clap reads inf").check().unwrap_err();
        assert!(
            matches!(
                e,
                ServerError::BadOption {
                    option: "--temp",
                    ..
                }
            ),
            "{e}"
        );
    }
}
