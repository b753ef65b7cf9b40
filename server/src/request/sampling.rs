//! A request's generation settings: lengths, seeds, the sampler chain and its values checked,
//! grammars, logit biases.

use std::sync::atomic::{AtomicU64, Ordering};

use super::{check_tokens, token_id, Grammar, Limits, SamplerParams, Sampling, Stop};
use crate::error::{Result, ServerError};
use crate::scheduler::GenParams;

/// The generation settings of a request, with the server's defaults.
pub(super) fn gen_params(
    limits: &Limits,
    s: &Sampling,
    max_tokens: Option<i64>,
) -> Result<GenParams> {
    let bad = |what: String| ServerError::BadRequest(what);
    // A negative or absent length is the server's `-n` (as llama-server, `-n` is a default,
    // not a cap).
    let max_tokens = max_tokens.filter(|&m| m >= 0).unwrap_or(limits.n_predict);
    let max_tokens = usize::try_from(max_tokens).unwrap_or(usize::MAX);
    let seed = match s.seed.filter(|&s| s >= 0).unwrap_or(limits.seed) {
        s if s < 0 => random_seed(),
        s => s.unsigned_abs(),
    };
    let sampler = sampler_params(limits, s, seed)?;
    let pending = |field: &str, set: bool| -> Result<()> {
        if set {
            Err(ServerError::Unsupported(format!(
                "\"{field}\" is not supported by this server yet; leave it out"
            )))
        } else {
            Ok(())
        }
    };
    let grammar = grammar(s)?;
    pending("lora", s.lora.as_ref().is_some_and(|v| !is_empty_json(v)))?;
    pending("n_indent", s.n_indent.is_some_and(|n| n > 0))?;
    if s.min_keep.is_some_and(|k| k < 0) {
        return Err(bad("\"min_keep\" is negative".into()));
    }
    let id_slot = match s.id_slot {
        None => None,
        Some(id) if id < 0 => None,
        Some(id) => match usize::try_from(id) {
            Ok(id) if id < limits.n_slots => Some(id),
            _ => {
                return Err(ServerError::UnknownSlot {
                    id: usize::try_from(id).unwrap_or(usize::MAX),
                    n_slots: limits.n_slots,
                })
            }
        },
    };
    let stop = match &s.stop {
        None => Vec::new(),
        Some(Stop::One(s)) => vec![s.clone()],
        Some(Stop::Many(v)) => v.clone(),
    };
    let probs = match (s.n_probs, &s.logprobs) {
        (Some(n), _) if n > 0 => n.min(20) as usize,
        (_, Some(serde_json::Value::Bool(true))) => {
            s.top_logprobs.unwrap_or(0).clamp(0, 20) as usize
        }
        (_, Some(serde_json::Value::Number(n))) => n.as_i64().unwrap_or(0).clamp(0, 20) as usize,
        _ => 0,
    };
    let wants_probs = s.n_probs.is_some_and(|n| n > 0)
        || matches!(
            s.logprobs,
            Some(serde_json::Value::Bool(true) | serde_json::Value::Number(_))
        );
    if s.cache_salt.as_deref().is_some_and(str::is_empty) {
        return Err(ServerError::BadRequest(
            "cache_salt must be a non-empty string".into(),
        ));
    }
    if s.cache_ttl.is_some_and(|t| t <= 0) {
        return Err(ServerError::BadRequest(
            "cache_ttl must be a positive number of seconds".into(),
        ));
    }
    Ok(GenParams {
        cache_salt: s.cache_salt.clone(),
        cache_ttl: s.cache_ttl.map(|t| t as u64),
        namespace: None,
        max_tokens,
        sampler,
        stop,
        cache_prompt: s.cache_prompt.unwrap_or(limits.cache_prompt),
        id_slot,
        ignore_eos: s.ignore_eos.unwrap_or(limits.ignore_eos),
        n_probs: wants_probs.then_some(probs),
        post_sampling_probs: s.post_sampling_probs.unwrap_or(false),
        t_max_predict_ms: s.t_max_predict_ms.filter(|&t| t > 0).map(|t| t as u64),
        n_keep: s.n_keep.unwrap_or(limits.n_keep),
        n_discard: s.n_discard.map_or(0, |n| usize::try_from(n).unwrap_or(0)),
        context_shift: limits.context_shift,
        cache_reuse: s
            .n_cache_reuse
            .map_or(limits.cache_reuse, |n| usize::try_from(n).unwrap_or(0)),
        // Set by the chat handlers, which know the template and the prompt.
        reasoning_budget: None,
        return_progress: s.return_progress.unwrap_or(false),
        grammar,
        bias: match &s.logit_bias {
            None => Vec::new(),
            Some(v) => logit_bias(v, limits)?,
        },
        dry_breakers: s
            .dry_sequence_breakers
            .clone()
            .or_else(|| limits.dry_breakers.clone()),
        warm: false,
        speculative: crate::scheduler::SpecRequest {
            n_max: s.spec_n_max.map(|n| usize::try_from(n).unwrap_or(0)),
            n_min: s.spec_n_min.map(|n| usize::try_from(n).unwrap_or(0)),
            p_min: s
                .spec_p_min
                .filter(|p| p.is_finite())
                .map(|p| p.clamp(0.0, 1.0)),
        },
    })
}

/// The request's sampler settings over the server's defaults, checked: finite numbers, and the
/// ranges the chat accepts too (and those of the other samplers).
fn sampler_params(limits: &Limits, s: &Sampling, seed: u64) -> Result<SamplerParams> {
    let bad = |what: String| ServerError::BadRequest(what);
    let d = &limits.sampler;
    let sampler = SamplerParams {
        temperature: s.temperature.unwrap_or(d.temperature),
        // llama-server reads a top-k of 0 or less as off.
        top_k: s.top_k.map_or(d.top_k, |k| usize::try_from(k).unwrap_or(0)),
        top_p: s.top_p.unwrap_or(d.top_p),
        min_p: s.min_p.unwrap_or(d.min_p),
        repeat_penalty: s.repeat_penalty.unwrap_or(d.repeat_penalty),
        repeat_last_n: match s.repeat_last_n {
            None => d.repeat_last_n,
            Some(n) if n < 0 => limits.n_ctx,
            Some(n) => n as usize,
        },
        frequency_penalty: s.frequency_penalty.unwrap_or(d.frequency_penalty),
        presence_penalty: s.presence_penalty.unwrap_or(d.presence_penalty),
        seed,
        typical_p: s.typical_p.unwrap_or(d.typical_p),
        xtc_probability: s.xtc_probability.unwrap_or(d.xtc_probability),
        xtc_threshold: s.xtc_threshold.unwrap_or(d.xtc_threshold),
        dry_multiplier: s.dry_multiplier.unwrap_or(d.dry_multiplier),
        dry_base: s.dry_base.unwrap_or(d.dry_base),
        dry_allowed_length: s
            .dry_allowed_length
            .map_or(d.dry_allowed_length, |n| usize::try_from(n).unwrap_or(0)),
        dry_penalty_last_n: match s.dry_penalty_last_n {
            None => d.dry_penalty_last_n,
            Some(n) if n < 0 => usize::MAX,
            Some(n) => n as usize,
        },
        mirostat: match s.mirostat {
            None => d.mirostat,
            Some(m @ 0..=2) => m as u8,
            Some(m) => return Err(bad(format!("\"mirostat\" is {m}; 0, 1 or 2 expected"))),
        },
        mirostat_tau: s.mirostat_tau.unwrap_or(d.mirostat_tau),
        mirostat_eta: s.mirostat_eta.unwrap_or(d.mirostat_eta),
        top_n_sigma: s.top_n_sigma.unwrap_or(d.top_n_sigma),
        min_keep: s
            .min_keep
            .map_or(d.min_keep, |k| usize::try_from(k).unwrap_or(0)),
        dynatemp_range: s.dynatemp_range.unwrap_or(d.dynatemp_range),
        dynatemp_exponent: s.dynatemp_exponent.unwrap_or(d.dynatemp_exponent),
        samplers: match &s.samplers {
            None => d.samplers.clone(),
            Some(v) => sampler_chain(v)?,
        },
        ..d.clone()
    };
    // JSON numbers past f32's range arrive as infinities.
    for (name, x) in [
        ("temperature", sampler.temperature),
        ("top_p", sampler.top_p),
        ("min_p", sampler.min_p),
        ("repeat_penalty", sampler.repeat_penalty),
        ("frequency_penalty", sampler.frequency_penalty),
        ("presence_penalty", sampler.presence_penalty),
    ] {
        if !x.is_finite() {
            return Err(bad(format!(
                "\"{name}\" is out of range for a 32-bit float"
            )));
        }
    }
    // The ranges the chat accepts too, and those of the other samplers.
    sampler.check().map_err(|e| bad(e.to_string()))?;
    Ok(sampler)
}

/// The grammar a request's output must follow: llama-server's `grammar` (GBNF) or
/// `json_schema`, or OpenAI's `response_format` (`json_object`, with an optional `schema`, or
/// `json_schema` with its `schema`); `None` for free text.
fn grammar(s: &Sampling) -> Result<Option<Grammar>> {
    use serde_json::Value;
    let bad = |what: String| ServerError::BadRequest(what);
    if let Some(g) = s.grammar.as_ref().filter(|g| !g.trim().is_empty()) {
        return Ok(Some(Grammar::Gbnf(g.clone())));
    }
    if let Some(schema) = s.json_schema.as_ref().filter(|v| !is_empty_json(v)) {
        return Ok(Some(Grammar::JsonSchema(schema.clone())));
    }
    let Some(format) = s.response_format.as_ref().filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    if format
        .get("schema")
        .is_some_and(|v| !v.is_object() && !v.is_null())
    {
        return Err(bad(format!(
            "\"response_format\": its schema is {}, not a JSON schema object",
            format["schema"]
        )));
    }
    let schema = |v: Option<&Value>| match v {
        Some(schema) if schema.is_object() => Some(Grammar::JsonSchema(schema.clone())),
        _ => None,
    };
    match format.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(
            schema(format.get("schema")).unwrap_or(Grammar::JsonObject),
        )),
        Some("json_schema") => {
            let inner = format.get("json_schema").and_then(|j| j.get("schema"));
            schema(inner.or_else(|| format.get("schema")))
                .map(Some)
                .ok_or_else(|| {
                    bad("\"response_format\": json_schema needs a \"schema\" object".into())
                })
        }
        _ => Err(bad(format!(
            "\"response_format\" is {format}; type text, json_object or json_schema expected"
        ))),
    }
}

/// llama-server's `samplers`: a list of names, or a string of letters (`"kfypmt"`).
fn sampler_chain(v: &serde_json::Value) -> Result<Vec<engine::sampling::SamplerKind>> {
    use engine::sampling::{sampler_chain_from_letters, sampler_chain_from_names};
    let bad = |what: String| ServerError::BadRequest(what);
    match v {
        serde_json::Value::String(letters) => {
            let (chain, unknown) = sampler_chain_from_letters(letters);
            match unknown.first() {
                Some(c) => Err(bad(format!(
                    "\"samplers\": no sampler has the letter {c:?}"
                ))),
                None => Ok(chain),
            }
        }
        serde_json::Value::Array(items) => {
            let names = items
                .iter()
                .map(|n| {
                    n.as_str()
                        .map(str::to_owned)
                        .ok_or_else(|| bad(format!("\"samplers\": {n} is not a name")))
                })
                .collect::<Result<Vec<_>>>()?;
            let (chain, unknown) = sampler_chain_from_names(&names);
            match unknown.first() {
                Some(n) => Err(bad(format!("\"samplers\": no sampler is named {n:?}"))),
                None => Ok(chain),
            }
        }
        other => Err(bad(format!(
            "\"samplers\" is {other}; a list of names expected"
        ))),
    }
}

/// A `logit_bias` entry's target before tokenization: an id, or text whose tokens all get it.
#[derive(Clone, Debug, PartialEq)]
pub enum BiasTarget {
    /// A token id.
    Token(u32),
    /// Text, tokenized without special tokens.
    Text(String),
}

/// `logit_bias` in llama-server's form (`[[id or text, bias or false], ...]`) or OpenAI's
/// (`{"id or text": bias}`); `false` bans the token.
fn logit_bias(v: &serde_json::Value, limits: &Limits) -> Result<Vec<(BiasTarget, f32)>> {
    use serde_json::Value;
    let bad = |what: String| ServerError::BadRequest(format!("\"logit_bias\": {what}"));
    let bias = |b: &Value| -> Result<f32> {
        match b {
            Value::Bool(false) => Ok(f32::NEG_INFINITY),
            Value::Number(n) => {
                let x = n.as_f64().unwrap_or(f64::NAN) as f32;
                if x.is_finite() {
                    Ok(x)
                } else {
                    Err(bad(format!("{n} is not a finite bias")))
                }
            }
            other => Err(bad(format!("{other} is not a bias"))),
        }
    };
    let target = |t: &Value| -> Result<BiasTarget> {
        match t {
            Value::Number(n) => Ok(BiasTarget::Token(token_id(n, limits)?)),
            Value::String(s) => Ok(BiasTarget::Text(s.clone())),
            other => Err(bad(format!("{other} is not a token"))),
        }
    };
    match v {
        Value::Null => Ok(Vec::new()),
        Value::Array(pairs) => pairs
            .iter()
            .map(|pair| match pair.as_array().map(Vec::as_slice) {
                Some([t, b]) => Ok((target(t)?, bias(b)?)),
                _ => Err(bad(format!("{pair} is not a [token, bias] pair"))),
            })
            .collect(),
        Value::Object(map) => map
            .iter()
            .map(|(k, b)| {
                let t = match k.parse::<u32>() {
                    Ok(id) => {
                        check_tokens(&[id], limits)?;
                        BiasTarget::Token(id)
                    }
                    Err(_) => BiasTarget::Text(k.clone()),
                };
                Ok((t, bias(b)?))
            })
            .collect(),
        other => Err(bad(format!("{other} is neither a list nor an object"))),
    }
}

/// `null`, `[]`, `{}` or `""`.
fn is_empty_json(v: &serde_json::Value) -> bool {
    match v {
        serde_json::Value::Null => true,
        serde_json::Value::Array(a) => a.is_empty(),
        serde_json::Value::Object(o) => o.is_empty(),
        serde_json::Value::String(s) => s.is_empty(),
        _ => false,
    }
}

/// A seed for requests that ask for a random one.
fn random_seed() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = kvstore::since_epoch().as_nanos() as u64;
    nanos
        ^ NEXT
            .fetch_add(1, Ordering::Relaxed)
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
}
