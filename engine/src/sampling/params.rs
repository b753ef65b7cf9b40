//! The settings of a [`Sampler`](super::Sampler), the names of the chain's steps and the checks
//! of the settings' ranges.

use std::fmt;
use std::str::FromStr;

/// One step of the sampler chain, as llama-server names them in `samplers`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SamplerKind {
    /// Repeat, frequency and presence penalties (`penalties`, letter `e`).
    Penalties,
    /// DRY, "don't repeat yourself" (`dry`, letter `d`).
    Dry,
    /// Top-n-sigma (`top_n_sigma`, letter `s`).
    TopNSigma,
    /// Top-k (`top_k`, letter `k`).
    TopK,
    /// Locally typical sampling (`typ_p`, letter `y`).
    TypicalP,
    /// Top-p, nucleus sampling (`top_p`, letter `p`).
    TopP,
    /// Min-p (`min_p`, letter `m`).
    MinP,
    /// Exclude top choices (`xtc`, letter `x`).
    Xtc,
    /// Temperature, dynamic when `dynatemp_range > 0` (`temperature`, letter `t`).
    Temperature,
    /// llama.cpp's fill-in-the-middle step (`infill`, letter `i`). It needs the vocabulary's
    /// end-of-generation tokens, which the sampler does not have: accepted, and a no-op here.
    Infill,
}

impl SamplerKind {
    /// llama.cpp's default chain: penalties, dry, top_n_sigma, top_k, typ_p, top_p, min_p, xtc,
    /// temperature (`"edskypmxt"`).
    pub const DEFAULT_CHAIN: [SamplerKind; 9] = [
        SamplerKind::Penalties,
        SamplerKind::Dry,
        SamplerKind::TopNSigma,
        SamplerKind::TopK,
        SamplerKind::TypicalP,
        SamplerKind::TopP,
        SamplerKind::MinP,
        SamplerKind::Xtc,
        SamplerKind::Temperature,
    ];

    /// Every kind, in the order of [`DEFAULT_CHAIN`](Self::DEFAULT_CHAIN) then `Infill`.
    pub const ALL: [SamplerKind; 10] = [
        SamplerKind::Penalties,
        SamplerKind::Dry,
        SamplerKind::TopNSigma,
        SamplerKind::TopK,
        SamplerKind::TypicalP,
        SamplerKind::TopP,
        SamplerKind::MinP,
        SamplerKind::Xtc,
        SamplerKind::Temperature,
        SamplerKind::Infill,
    ];

    /// The canonical name, as llama-server reports it (`"top_k"`, `"typ_p"`, ...).
    pub fn name(self) -> &'static str {
        match self {
            SamplerKind::Penalties => "penalties",
            SamplerKind::Dry => "dry",
            SamplerKind::TopNSigma => "top_n_sigma",
            SamplerKind::TopK => "top_k",
            SamplerKind::TypicalP => "typ_p",
            SamplerKind::TopP => "top_p",
            SamplerKind::MinP => "min_p",
            SamplerKind::Xtc => "xtc",
            SamplerKind::Temperature => "temperature",
            SamplerKind::Infill => "infill",
        }
    }

    /// The letter of llama.cpp's `--sampling-seq` (`'k'` for top-k, ...).
    pub fn letter(self) -> char {
        match self {
            SamplerKind::Penalties => 'e',
            SamplerKind::Dry => 'd',
            SamplerKind::TopNSigma => 's',
            SamplerKind::TopK => 'k',
            SamplerKind::TypicalP => 'y',
            SamplerKind::TopP => 'p',
            SamplerKind::MinP => 'm',
            SamplerKind::Xtc => 'x',
            SamplerKind::Temperature => 't',
            SamplerKind::Infill => 'i',
        }
    }

    /// The kind a name stands for, ignoring case: the canonical names, their kebab-case and
    /// undashed forms (`"top-k"`, `"topk"`), and the aliases `nucleus`, `temp`, `typ`,
    /// `typical`, `typical_p` (and its forms).
    pub fn from_name(name: &str) -> Option<SamplerKind> {
        let lower = name.to_ascii_lowercase();
        let kind = SamplerKind::ALL.into_iter().find(|k| {
            let c = k.name();
            lower == c || lower == c.replace('_', "-") || lower == c.replace('_', "")
        });
        kind.or(match lower.as_str() {
            "nucleus" => Some(SamplerKind::TopP),
            "temp" => Some(SamplerKind::Temperature),
            "typ" | "typical" | "typical_p" | "typical-p" | "typicalp" => {
                Some(SamplerKind::TypicalP)
            }
            _ => None,
        })
    }

    /// The kind a `--sampling-seq` letter stands for (case-sensitive, as in llama.cpp).
    pub fn from_letter(c: char) -> Option<SamplerKind> {
        SamplerKind::ALL.into_iter().find(|k| k.letter() == c)
    }
}

impl fmt::Display for SamplerKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for SamplerKind {
    type Err = String;

    /// [`SamplerKind::from_name`], with an error naming the unknown sampler.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        SamplerKind::from_name(s).ok_or_else(|| format!("unknown sampler \"{s}\""))
    }
}

/// A chain from llama-server's `samplers` array of names. Returns the chain and the names it
/// did not recognise, which llama-server skips with a warning.
pub fn sampler_chain_from_names<S: AsRef<str>>(names: &[S]) -> (Vec<SamplerKind>, Vec<String>) {
    let mut chain = Vec::with_capacity(names.len());
    let mut unknown = Vec::new();
    for name in names {
        match SamplerKind::from_name(name.as_ref()) {
            Some(k) => chain.push(k),
            None => unknown.push(name.as_ref().to_owned()),
        }
    }
    (chain, unknown)
}

/// A chain from llama-server's `samplers` string of letters (`"edskypmxt"`). Returns the chain
/// and the letters it did not recognise, which llama-server skips with a warning.
pub fn sampler_chain_from_letters(letters: &str) -> (Vec<SamplerKind>, Vec<char>) {
    let mut chain = Vec::with_capacity(letters.len());
    let mut unknown = Vec::new();
    for c in letters.chars() {
        match SamplerKind::from_letter(c) {
            Some(k) => chain.push(k),
            None => unknown.push(c),
        }
    }
    (chain, unknown)
}

/// llama.cpp's default DRY sequence breakers, as text; turn them into token sequences with
/// [`dry_breakers_from_strings`](super::dry_breakers_from_strings).
pub const DEFAULT_DRY_SEQUENCE_BREAKERS: [&str; 4] = ["\n", ":", "\"", "*"];

/// Sampling settings, with llama-server's fields. Each step has an "off" value; the defaults
/// are llama.cpp's, with every step that was added after penalties, top-k, top-p, min-p and
/// temperature off.
///
/// Mirostat (`mirostat` 1 or 2) replaces the chain, as in llama.cpp: the logit biases, then the
/// temperature, then mirostat's own truncation and draw; `samplers`, the penalties, DRY and
/// the other filters are then unused.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplerParams {
    /// Softmax temperature; `<= 0` means greedy (the most likely of the candidates left when
    /// the chain reaches its `temperature` step; a chain without that step ignores this).
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens; 0 = off.
    pub top_k: usize,
    /// Keep the smallest set of most likely tokens whose probability reaches `top_p`; 1 = off.
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` times the most likely one; 0 = off.
    pub min_p: f32,
    /// Divide positive (multiply negative) logits of recent tokens by this; 1 = off.
    pub repeat_penalty: f32,
    /// How many of the most recent history tokens the penalties look at.
    pub repeat_last_n: usize,
    /// Subtract `count * frequency_penalty` from the logit of each recent token; 0 = off.
    pub frequency_penalty: f32,
    /// Subtract this from the logit of each token seen recently; 0 = off.
    pub presence_penalty: f32,
    /// Seed of the random stream.
    pub seed: u64,
    /// `(token, bias)` pairs added to the logits before anything else; a bias of `-inf` bans
    /// the token. Ids past the vocabulary are ignored; a token listed twice gets both.
    pub logit_bias: Vec<(u32, f32)>,
    /// Locally typical sampling: keep the tokens whose surprise is closest to the entropy until
    /// their probability exceeds `typical_p`; 1 = off.
    pub typical_p: f32,
    /// Chance, per token, that XTC removes the top choices; 0 = off.
    pub xtc_probability: f32,
    /// XTC removes all but the least likely of the tokens at least this likely; `> 0.5` = off.
    pub xtc_threshold: f32,
    /// DRY: a token that would extend a repetition of `len >= dry_allowed_length` tokens loses
    /// `dry_multiplier * dry_base^(len - dry_allowed_length)`; 0 = off.
    pub dry_multiplier: f32,
    /// DRY's base, at least 1.
    pub dry_base: f32,
    /// Repetitions up to this length are free of DRY's penalty.
    pub dry_allowed_length: usize,
    /// How many of the most recent history tokens DRY scans; 0 = off, `usize::MAX` = the whole
    /// history (llama-server's -1).
    pub dry_penalty_last_n: usize,
    /// DRY's sequence breakers as token sequences: a repetition never extends across an
    /// occurrence of one in the history, and a candidate that is a one-token breaker is never
    /// penalised. Build them from text with
    /// [`dry_breakers_from_strings`](super::dry_breakers_from_strings); empty = none.
    pub dry_sequence_breakers: Vec<Vec<u32>>,
    /// 0 = off, 1 = Mirostat, 2 = Mirostat 2.0 (see the type's documentation).
    pub mirostat: u8,
    /// Mirostat's target surprise (tau), in bits.
    pub mirostat_tau: f32,
    /// Mirostat's learning rate (eta).
    pub mirostat_eta: f32,
    /// Keep the tokens whose logit is within `top_n_sigma` standard deviations of the best;
    /// `<= 0` = off.
    pub top_n_sigma: f32,
    /// Top-p, min-p, typical-p, XTC and top-n-sigma keep at least this many tokens; 0 = off.
    pub min_keep: usize,
    /// Dynamic temperature: the temperature moves within `temperature ± dynatemp_range` with
    /// the entropy of the candidates; 0 = off.
    pub dynatemp_range: f32,
    /// How the normalised entropy maps onto the dynamic temperature's range.
    pub dynatemp_exponent: f32,
    /// The chain's steps in order; a step absent from it is not applied, one listed twice is
    /// applied twice. The draw always follows. Default:
    /// [`SamplerKind::DEFAULT_CHAIN`].
    pub samplers: Vec<SamplerKind>,
}

impl Default for SamplerParams {
    /// llama.cpp's defaults: temperature 0.8, top-k 40, top-p 0.95, min-p 0.05, no penalties
    /// (over the last 64 tokens when enabled), seed `0xFFFF_FFFF`; typical-p, XTC, DRY,
    /// mirostat, top-n-sigma, dynamic temperature and logit biases off; the default chain.
    fn default() -> Self {
        SamplerParams {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            seed: 0xFFFF_FFFF,
            ..SamplerParams::greedy()
        }
    }
}

impl SamplerParams {
    /// Always the most likely token: temperature 0 and every filter and penalty off.
    pub fn greedy() -> Self {
        SamplerParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            seed: 0,
            logit_bias: Vec::new(),
            typical_p: 1.0,
            xtc_probability: 0.0,
            xtc_threshold: 0.1,
            dry_multiplier: 0.0,
            dry_base: 1.75,
            dry_allowed_length: 2,
            dry_penalty_last_n: 64,
            dry_sequence_breakers: Vec::new(),
            mirostat: 0,
            mirostat_tau: 5.0,
            mirostat_eta: 0.1,
            top_n_sigma: -1.0,
            min_keep: 0,
            dynatemp_range: 0.0,
            dynatemp_exponent: 1.0,
            samplers: SamplerKind::DEFAULT_CHAIN.to_vec(),
        }
    }

    /// Refuses settings outside their ranges: every float finite; `temperature >= 0`;
    /// `top_p`, `typical_p` in (0, 1]; `min_p`, `xtc_probability`, `xtc_threshold` in [0, 1];
    /// `repeat_penalty > 0`; `dry_multiplier`, `dynatemp_range`, `dynatemp_exponent`,
    /// `mirostat_tau`, `mirostat_eta >= 0`; `dry_base >= 1`; `mirostat` in {0, 1, 2}; no empty
    /// DRY sequence breaker; logit biases neither NaN nor `+inf`.
    pub fn check(&self) -> Result<(), InvalidSamplerParam> {
        let bad =
            |field: &'static str, reason: &'static str| Err(InvalidSamplerParam { field, reason });
        let floats = [
            ("temperature", self.temperature),
            ("top_p", self.top_p),
            ("min_p", self.min_p),
            ("repeat_penalty", self.repeat_penalty),
            ("frequency_penalty", self.frequency_penalty),
            ("presence_penalty", self.presence_penalty),
            ("typical_p", self.typical_p),
            ("xtc_probability", self.xtc_probability),
            ("xtc_threshold", self.xtc_threshold),
            ("dry_multiplier", self.dry_multiplier),
            ("dry_base", self.dry_base),
            ("mirostat_tau", self.mirostat_tau),
            ("mirostat_eta", self.mirostat_eta),
            ("top_n_sigma", self.top_n_sigma),
            ("dynatemp_range", self.dynatemp_range),
            ("dynatemp_exponent", self.dynatemp_exponent),
        ];
        for (field, v) in floats {
            if !v.is_finite() {
                return bad(field, "must be a finite number");
            }
        }
        let unit_open = |v: f32| v > 0.0 && v <= 1.0;
        let unit_closed = |v: f32| (0.0..=1.0).contains(&v);
        if self.temperature < 0.0 {
            return bad("temperature", "must be 0 or more");
        }
        if !unit_open(self.top_p) {
            return bad("top_p", "must be more than 0 and at most 1");
        }
        if !unit_closed(self.min_p) {
            return bad("min_p", "must be between 0 and 1");
        }
        if self.repeat_penalty <= 0.0 {
            return bad("repeat_penalty", "must be more than 0");
        }
        if !unit_open(self.typical_p) {
            return bad("typical_p", "must be more than 0 and at most 1");
        }
        if !unit_closed(self.xtc_probability) {
            return bad("xtc_probability", "must be between 0 and 1");
        }
        if !unit_closed(self.xtc_threshold) {
            return bad("xtc_threshold", "must be between 0 and 1");
        }
        for (field, v) in [
            ("dry_multiplier", self.dry_multiplier),
            ("mirostat_tau", self.mirostat_tau),
            ("mirostat_eta", self.mirostat_eta),
            ("dynatemp_range", self.dynatemp_range),
            ("dynatemp_exponent", self.dynatemp_exponent),
        ] {
            if v < 0.0 {
                return bad(field, "must be 0 or more");
            }
        }
        if self.dry_base < 1.0 {
            return bad("dry_base", "must be 1 or more");
        }
        if self.mirostat > 2 {
            return bad("mirostat", "must be 0, 1 or 2");
        }
        if self.dry_sequence_breakers.iter().any(Vec::is_empty) {
            return bad("dry_sequence_breakers", "must not hold an empty sequence");
        }
        if self
            .logit_bias
            .iter()
            .any(|&(_, b)| b.is_nan() || b == f32::INFINITY)
        {
            return bad("logit_bias", "must be numbers or -inf");
        }
        Ok(())
    }
}

/// A setting [`SamplerParams::check`] refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InvalidSamplerParam {
    /// The field's name, as llama-server spells it.
    pub field: &'static str,
    /// What the field must be.
    pub reason: &'static str,
}

impl fmt::Display for InvalidSamplerParam {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "\"{}\" {}", self.field, self.reason)
    }
}

impl std::error::Error for InvalidSamplerParam {}
