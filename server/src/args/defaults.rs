//! Defaults the options give: the slots and their context (llama-server's auto `--parallel`),
//! the sampling settings of requests, and the prompt cache's disk budget without `--cache-disk`
//! (where it lives without `--cache-dir` is `kvstore::default_cache_dir`, which the chat uses
//! too).

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
