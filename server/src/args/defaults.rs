//! Defaults the options give: the slots and their context (llama-server's auto `--parallel`),
//! the sampling settings of requests, the model's names, and the prompt cache's budgets and
//! disk budget without `--cache-disk` (where it lives without `--cache-dir` is
//! `kvstore::default_cache_dir`, which the chat uses too), `--kv-ram` read and the KV pool's
//! RAM budget without it (the rule is in `memory.rs`); and the parts of `Args::check` they
//! go with (sampling ranges, API keys).

use std::path::PathBuf;

use super::Args;
use crate::error::{Result, ServerError};

impl Args {
    /// The slots and whether they share one unified context, as llama-server sets them:
    /// auto `--parallel` (-1) is 4 slots over a unified context (whatever `--no-kv-unified`
    /// says); `--parallel N` is N slots, unified only with `--kv-unified`.
    pub(super) fn slots(&self) -> Result<(usize, bool)> {
        match self.parallel {
            -1 => Ok((4, true)),
            n if n >= 1 => Ok((usize::try_from(n).unwrap_or(usize::MAX), self.kv_unified)),
            _ => Err(ServerError::BadOption {
                option: "--parallel",
                reason: "at least one slot is needed (-1: auto, 4)".into(),
            }),
        }
    }

    /// The sampling defaults, checked as a request's settings are.
    pub(super) fn sampler(&self) -> Result<engine::sampling::SamplerParams> {
        use engine::sampling::{sampler_chain_from_letters, sampler_chain_from_names};
        let bad = |option: &'static str, reason: String| ServerError::BadOption { option, reason };
        let samplers = match (&self.samplers, &self.sampler_seq) {
            (Some(names), _) => {
                let names: Vec<&str> = names
                    .split(';')
                    .map(str::trim)
                    .filter(|n| !n.is_empty())
                    .collect();
                let (chain, unknown) = sampler_chain_from_names(&names);
                if let Some(n) = unknown.first() {
                    return Err(bad("--samplers", format!("no sampler is named {n:?}")));
                }
                chain
            }
            (None, Some(letters)) => {
                let (chain, unknown) = sampler_chain_from_letters(letters);
                if let Some(c) = unknown.first() {
                    return Err(bad(
                        "--sampler-seq",
                        format!("no sampler has the letter {c:?}"),
                    ));
                }
                chain
            }
            (None, None) => engine::sampling::SamplerKind::DEFAULT_CHAIN.to_vec(),
        };
        let logit_bias = self
            .logit_bias
            .iter()
            .map(|spec| {
                let at = spec
                    .char_indices()
                    .skip(1)
                    .find(|&(_, c)| c == '+' || c == '-')
                    .map(|(i, _)| i);
                let parsed = at.and_then(|i| {
                    let id = spec[..i].trim().parse::<u32>().ok()?;
                    let bias = spec[i..]
                        .trim()
                        .trim_start_matches('+')
                        .parse::<f32>()
                        .ok()?;
                    Some((id, bias))
                });
                parsed.ok_or_else(|| {
                    bad(
                        "--logit-bias",
                        format!("{spec:?} is not TOKEN_ID+BIAS or TOKEN_ID-BIAS"),
                    )
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let p = engine::sampling::SamplerParams {
            temperature: self.temp,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            repeat_last_n: usize::try_from(self.repeat_last_n).unwrap_or(usize::MAX),
            frequency_penalty: self.frequency_penalty,
            presence_penalty: self.presence_penalty,
            typical_p: self.typical_p,
            xtc_probability: self.xtc_probability,
            xtc_threshold: self.xtc_threshold,
            top_n_sigma: self.top_n_sigma,
            dry_multiplier: self.dry_multiplier,
            dry_base: self.dry_base,
            dry_allowed_length: self.dry_allowed_length,
            dry_penalty_last_n: usize::try_from(self.dry_penalty_last_n).unwrap_or(usize::MAX),
            dynatemp_range: self.dynatemp_range,
            dynatemp_exponent: self.dynatemp_exp,
            mirostat: self.mirostat,
            mirostat_tau: self.mirostat_ent,
            mirostat_eta: self.mirostat_lr,
            logit_bias,
            samplers,
            ..engine::sampling::SamplerParams::default()
        };
        p.check()
            .map_err(|e| bad("--temp", format!("the sampling defaults: {e}")))?;
        Ok(p)
    }
}

/// A RAM size as `--cache-ram` reads it: MiB as a bare number (llama-server's unit), -1 for
/// no limit (`u64::MAX`), or a size with a unit (`256MiB`).
fn ram_size(option: &'static str, text: &str) -> Result<u64> {
    let bad = |reason: String| ServerError::BadOption { option, reason };
    match text.trim() {
        "-1" => Ok(u64::MAX),
        t if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) => t
            .parse::<u64>()
            .ok()
            .and_then(|mib| mib.checked_mul(1 << 20))
            .ok_or_else(|| bad(format!("{t} MiB is too large"))),
        t => kvstore::parse_size(t).map_err(|e| bad(e.to_string())),
    }
}

/// The KV pool's RAM budget without `--kv-ram`, for a model file of `model_bytes` and a
/// cache RAM tier of `cache_ram` bytes: see [`super::memory`]. `None` when the memory
/// available cannot be told.
pub fn default_kv_ram(model_bytes: u64, cache_ram: u64) -> Option<u64> {
    let available = super::memory::memory_available()?;
    Some(super::memory::kv_ram_rule(
        available,
        model_bytes,
        cache_ram,
    ))
}

/// The disk budget largest by default.
const DEFAULT_DISK_CAP: u64 = 20 << 30;

/// The prompt cache's disk budget without `--cache-disk`: the smaller of 20 GiB and half the
/// space free (to unprivileged users) on the filesystem of `dir` (or of its nearest existing
/// ancestor) now; 20 GiB when that cannot be told.
pub fn default_disk_budget(dir: &std::path::Path) -> u64 {
    let free = dir
        .ancestors()
        .find_map(|d| rustix::fs::statvfs(d).ok())
        .map(|s| s.f_bavail.saturating_mul(s.f_frsize));
    match free {
        Some(free) => (free / 2).min(DEFAULT_DISK_CAP),
        None => DEFAULT_DISK_CAP,
    }
}

impl Args {
    /// The sampling defaults that must be finite numbers in range.
    pub(super) fn check_sampling_ranges(&self) -> Result<()> {
        let bad = |option: &'static str, reason: String| ServerError::BadOption { option, reason };
        for (option, x) in [
            ("--temp", self.temp),
            ("--top-p", self.top_p),
            ("--min-p", self.min_p),
            ("--repeat-penalty", self.repeat_penalty),
            ("--presence-penalty", self.presence_penalty),
            ("--frequency-penalty", self.frequency_penalty),
        ] {
            if !x.is_finite() {
                return Err(bad(option, format!("{x} is not a finite number")));
            }
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(bad("--top-p", format!("{} is not in (0, 1]", self.top_p)));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err(bad("--min-p", format!("{} is not in [0, 1]", self.min_p)));
        }
        if self.repeat_penalty <= 0.0 {
            return Err(bad("--repeat-penalty", "must be more than 0".into()));
        }
        Ok(())
    }

    /// The API keys: `--api-key` (comma-separated; none empty or padded), then the lines of
    /// `--api-key-file` (blank lines and `#` comments aside; at least one key).
    pub(super) fn api_keys(&self) -> Result<Vec<String>> {
        let bad = |option: &'static str, reason: String| ServerError::BadOption { option, reason };
        let mut api_keys: Vec<String> = self
            .api_key
            .iter()
            .flat_map(|k| k.split(','))
            .map(str::trim)
            .filter(|k| !k.is_empty())
            .map(str::to_owned)
            .collect();
        if self
            .api_key
            .iter()
            .any(|k| k.trim() != k || k.split(',').all(|p| p.trim().is_empty()))
        {
            return Err(bad(
                "--api-key",
                "an empty key (or one with spaces around it) would turn authentication off; \
                 give the key, or leave the option out"
                    .into(),
            ));
        }
        if let Some(path) = &self.api_key_file {
            let text = std::fs::read_to_string(path).map_err(|source| ServerError::Io {
                what: format!("reading {}", path.display()),
                source,
            })?;
            let before = api_keys.len();
            api_keys.extend(
                text.lines()
                    .map(str::trim)
                    .filter(|l| !l.is_empty() && !l.starts_with('#'))
                    .map(str::to_owned),
            );
            if api_keys.len() == before {
                return Err(bad(
                    "--api-key-file",
                    format!("{} holds no key", path.display()),
                ));
            }
        }
        Ok(api_keys)
    }

    /// The RAM budget (`--cache-ram`: MiB, a size, or -1 for none), the cache directory and the
    /// disk budget (`--cache-disk`: a size, -1 for none, by default one sized for the
    /// directory's file system).
    pub(super) fn caches(&self) -> Result<(u64, PathBuf, Option<u64>)> {
        let bad = |option: &'static str, reason: String| ServerError::BadOption { option, reason };
        let size = |option: &'static str, text: &str| {
            kvstore::parse_size(text).map_err(|e| bad(option, e.to_string()))
        };
        let cache_ram = ram_size("--cache-ram", &self.cache_ram)?;
        let cache_dir = match &self.cache_dir {
            Some(dir) => dir.clone(),
            None => kvstore::default_cache_dir(),
        };
        let cache_disk = match self.cache_disk.as_deref().map(str::trim) {
            Some("-1") => None,
            Some(s) => Some(size("--cache-disk", s)?),
            None => Some(default_disk_budget(&cache_dir)),
        };
        Ok((cache_ram, cache_dir, cache_disk))
    }

    /// `--kv-ram`: `None` without it (the default budget is taken at start, from the memory
    /// available then), `Some(0)` for no budget (`0`, `none` or -1), else the budget in bytes
    /// (MiB as a bare number, as `--cache-ram` reads it, or a size). A budget needs a store to
    /// spill to whose blocks the pool can read: refused with `--no-cache`, and with a
    /// q8_0 pool over an f16 `--cache-type-stored` (f16 pages resting as q8_0 are widened as
    /// they are read; the other way is not done).
    pub(super) fn kv_ram(&self) -> Result<Option<u64>> {
        let bad = |reason: String| ServerError::BadOption {
            option: "--kv-ram",
            reason,
        };
        let Some(text) = self.kv_ram.as_deref().map(str::trim) else {
            return Ok(None);
        };
        let bytes = match text {
            "none" => 0,
            t => match ram_size("--kv-ram", t)? {
                u64::MAX => 0,
                n => n,
            },
        };
        match self.no_spill_store() {
            Some((_, why)) if bytes > 0 => Err(bad(format!("{why}, or --kv-ram 0"))),
            _ => Ok(Some(bytes)),
        }
    }

    /// Why the KV pool could not spill to the prompt cache's store, if it could not (briefly,
    /// and at length): there is none with `--no-cache`, and a q8_0 pool cannot read pages that
    /// `--cache-type-stored f16` keeps wider.
    pub fn no_spill_store(&self) -> Option<(&'static str, String)> {
        let (k, v) = (self.cache_type_k, self.cache_type_v);
        if self.no_cache {
            Some((
                "--no-cache: no store to spill to",
                "pages past the budget are spilled to the prompt cache's directory, which \
                 --no-cache turns off: give --cache-dir instead"
                    .into(),
            ))
        } else if self
            .cache_type_stored
            .is_some_and(|t| t == engine::KvType::F16 && (k != t || v != t))
        {
            Some((
                "--cache-type-stored: the store's pages are wider than the pool's",
                format!(
                    "spilled pages are read back as the pool holds them ({} K, {} V), and \
                     --cache-type-stored f16 keeps them wider: leave it out",
                    k.name(),
                    v.name()
                ),
            ))
        } else {
            None
        }
    }

    /// The model's names (`--alias`, comma-separated, sorted as llama-server keeps them; the
    /// file's stem without one): the first is its id.
    pub(super) fn aliases(&self) -> Vec<String> {
        let stem = self
            .model
            .file_stem()
            .map_or_else(|| "model".to_owned(), |s| s.to_string_lossy().into_owned());
        let mut aliases: Vec<String> = self
            .alias
            .iter()
            .flat_map(|a| a.split(','))
            .map(str::trim)
            .filter(|a| !a.is_empty())
            .map(str::to_owned)
            .collect();
        // llama-server keeps aliases in a sorted set: the first in order is the id.
        aliases.sort();
        aliases.dedup();
        if aliases.is_empty() {
            aliases.push(stem);
        }
        aliases
    }
}
