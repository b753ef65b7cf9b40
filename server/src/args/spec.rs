//! Speculative decoding's options (`--spec-type`, `-md`, `--spec-draft-n-max`, …), as
//! llama-server spells them.

use std::path::PathBuf;

use engine::speculative::{NgramParams, SynthAcceptance};

/// The speculative-decoding options, flattened into [`super::Args`].
#[derive(Clone, Debug, clap::Args)]
pub struct SpecArgs {
    /// Kinds of drafts, comma-separated: none, draft-simple (a draft model, `-md`), or an
    /// n-gram kind (ngram-simple, ngram-map-k, ngram-map-k4v, ngram-mod, ngram-cache: here all
    /// draft the longest earlier match, from the context and the namespace's history).
    #[arg(long = "spec-type", value_name = "TYPES", env = "LLAMA_ARG_SPEC_TYPE")]
    pub spec_type: Vec<String>,
    /// The draft model (`-md`, `--model-draft`); implies `--spec-type draft-simple`.
    #[arg(
        long = "spec-draft-model",
        value_name = "FNAME",
        env = "LLAMA_ARG_SPEC_DRAFT_MODEL"
    )]
    pub model_draft: Option<PathBuf>,
    /// The draft model's context (`-cd`; 0: the target's).
    #[arg(long = "spec-draft-ctx-size", value_name = "N", default_value_t = 0)]
    pub ctx_size_draft: usize,
    /// Most tokens a draft model drafts at a step (llama-server's default, 3).
    #[arg(
        long = "spec-draft-n-max",
        value_name = "N",
        default_value_t = 3,
        env = "LLAMA_ARG_SPEC_DRAFT_N_MAX"
    )]
    pub n_max: usize,
    /// Fewest draft tokens worth verifying: a shorter draft is dropped.
    #[arg(
        long = "spec-draft-n-min",
        value_name = "N",
        default_value_t = 0,
        env = "LLAMA_ARG_SPEC_DRAFT_N_MIN"
    )]
    pub n_min: usize,
    /// A draft model stops drafting before a token it gives less than this probability.
    #[arg(long = "spec-draft-p-min", value_name = "P", default_value_t = 0.0)]
    pub p_min: f32,
    /// Longest run of the context's last tokens an n-gram draft matches (llama-server's
    /// `--spec-ngram-*-size-n`).
    #[arg(long = "spec-ngram-size-n", value_name = "N", default_value_t = 12)]
    pub ngram_size_n: usize,
    /// Most tokens an n-gram draft proposes (`--spec-ngram-*-size-m`).
    #[arg(long = "spec-ngram-size-m", value_name = "N", default_value_t = 16)]
    pub ngram_size_m: usize,
    /// Shortest match an n-gram draft needs.
    #[arg(long = "spec-ngram-min-match", value_name = "N", default_value_t = 3)]
    pub ngram_min_match: usize,
    /// Tokens of finished conversations kept in memory for n-gram drafts, per server (each
    /// namespace drafts only from its own; 0: drafts come from the context alone).
    #[arg(long = "spec-history-tokens", value_name = "N", default_value_t = 4 << 20)]
    pub history_tokens: usize,
    /// Benchmarking only: draft token j is kept with probability P_j whatever the target
    /// draws (`P0,P1,…`, one per draft position, none above the one before).
    #[arg(
        long = "spec-synth-rates",
        value_name = "P0,P1,...",
        value_delimiter = ','
    )]
    pub synth_rates: Vec<f64>,
}

/// Where drafts come from.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SpecConfig {
    /// N-gram drafts, with their matching.
    pub ngram: Option<NgramParams>,
    /// Most tokens an n-gram draft proposes.
    pub ngram_n_max: usize,
    /// Tokens of history kept for n-gram drafts.
    pub history_tokens: usize,
    /// The draft model, when one drafts (after n-grams, when both are asked for).
    pub draft_model: Option<PathBuf>,
    /// The draft model's context (0: the target's).
    pub draft_ctx: usize,
    /// Most tokens a draft model drafts.
    pub n_max: usize,
    /// Fewest draft tokens verified.
    pub n_min: usize,
    /// The draft model's probability floor.
    pub p_min: f32,
    /// `--spec-synth-rates`.
    pub synth: Option<SynthAcceptance>,
}

impl SpecArgs {
    /// What the options ask for: `None` for no speculation, or why they cannot be served.
    pub fn config(&self) -> Result<Option<SpecConfig>, String> {
        let mut ngram = false;
        let mut draft = false;
        for t in self.spec_type.iter().flat_map(|t| t.split(',')) {
            match t.trim() {
                "none" | "" => {}
                "draft-simple" => draft = true,
                "ngram-simple" | "ngram-map-k" | "ngram-map-k4v" | "ngram-mod" | "ngram-cache" => {
                    ngram = true
                }
                "draft-eagle3" | "draft-mtp" | "draft-dflash" | "draft-dspark" => {
                    return Err(format!(
                        "--spec-type {t}: that draft head is not supported; use draft-simple \
                         with -md, or an ngram type"
                    ))
                }
                other => return Err(format!("--spec-type: unknown type {other:?}")),
            }
        }
        if self.model_draft.is_some() {
            draft = true;
        } else if draft {
            return Err("--spec-type draft-simple needs a draft model (-md FILE)".into());
        }
        if !ngram && !draft {
            if !self.synth_rates.is_empty() {
                return Err("--spec-synth-rates needs drafts: give --spec-type or -md".into());
            }
            return Ok(None);
        }
        if self.ngram_min_match == 0 || self.ngram_min_match > self.ngram_size_n {
            return Err(format!(
                "--spec-ngram-min-match {} must be at least 1 and at most --spec-ngram-size-n {}",
                self.ngram_min_match, self.ngram_size_n
            ));
        }
        if !(0.0..=1.0).contains(&self.p_min) {
            return Err(format!(
                "--spec-draft-p-min {} is not within [0, 1]",
                self.p_min
            ));
        }
        let synth = if self.synth_rates.is_empty() {
            None
        } else {
            let n = if draft { self.n_max } else { self.ngram_size_m };
            if self.synth_rates.len() != n {
                return Err(format!(
                    "--spec-synth-rates needs {n} values, one per draft token, got {}",
                    self.synth_rates.len()
                ));
            }
            Some(
                SynthAcceptance::from_rates(&self.synth_rates)
                    .map_err(|e| format!("--spec-synth-rates: {e}"))?,
            )
        };
        Ok(Some(SpecConfig {
            ngram: ngram.then_some(NgramParams {
                min_match: self.ngram_min_match,
                max_match: self.ngram_size_n,
            }),
            ngram_n_max: self.ngram_size_m,
            history_tokens: self.history_tokens,
            draft_model: self.model_draft.clone(),
            draft_ctx: self.ctx_size_draft,
            n_max: self.n_max,
            n_min: self.n_min,
            p_min: self.p_min,
            synth,
        }))
    }
}
