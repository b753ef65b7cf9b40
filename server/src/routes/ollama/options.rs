//! What an Ollama request says about how to generate (`options`, `format`, `think`,
//! `logprobs`, `keep_alive`) written as the fields of the body the server's request readers
//! take, so the sampler, grammars and template see them as they see the OpenAI chat's.

use serde_json::{json, Map, Value};

use super::OllamaError;
use crate::routes::AppState;

/// Options Ollama and this server name alike: each goes to the request as it is.
const SAME: &[&str] = &[
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "typical_p",
    "repeat_penalty",
    "repeat_last_n",
    "presence_penalty",
    "frequency_penalty",
    "seed",
    "mirostat",
    "mirostat_tau",
    "mirostat_eta",
    // llama-server's samplers, which an Ollama client may send among its options too.
    "xtc_probability",
    "xtc_threshold",
    "dry_multiplier",
    "dry_base",
    "dry_allowed_length",
    "dry_penalty_last_n",
    "top_n_sigma",
    "dynatemp_range",
    "dynatemp_exponent",
    "min_keep",
];

/// Options that only tune how Ollama loads a model or where it runs it: the model here is
/// loaded once at start with the command line's settings, so they have no effect on a
/// request. `tfs_z` and `penalize_newline` are samplers llama.cpp no longer has (Ollama
/// ignores them too).
pub(super) const LOAD_TIME: &[&str] = &[
    "numa",
    "num_batch",
    "num_gpu",
    "main_gpu",
    "low_vram",
    "f16_kv",
    "logits_all",
    "vocab_only",
    "use_mmap",
    "use_mlock",
    "embedding_only",
    "num_thread",
    "tfs_z",
    "penalize_newline",
];

/// What the options say beyond the body's fields.
#[derive(Debug, Default)]
pub(super) struct Extras {
    /// `num_ctx`: prompt and reply together stop there when it is under the server's context.
    pub num_ctx: Option<usize>,
    /// `logprobs` was asked for.
    pub logprobs: bool,
}

/// Writes `body`'s generation settings into `out` (the body given to the request readers).
pub(super) fn apply(
    st: &AppState,
    body: &Map<String, Value>,
    out: &mut Map<String, Value>,
) -> Result<Extras, OllamaError> {
    let mut extras = Extras::default();
    match body.get("options") {
        None | Some(Value::Null) => {}
        Some(Value::Object(options)) => {
            for (name, value) in options {
                if !value.is_null() {
                    extras.num_ctx = extras.num_ctx.or(option(st, name, value, out)?);
                }
            }
        }
        Some(other) => {
            return Err(OllamaError::bad(format!(
                "options: {other} is not an object"
            )))
        }
    }
    format(body.get("format"), out)?;
    think(body.get("think"), out)?;
    extras.logprobs = logprobs(body, out)?;
    keep_alive(body.get("keep_alive"))?;
    Ok(extras)
}

/// One option written into `out`; `num_ctx` is given back.
fn option(
    st: &AppState,
    name: &str,
    value: &Value,
    out: &mut Map<String, Value>,
) -> Result<Option<usize>, OllamaError> {
    let number = || {
        if value.is_number() {
            Ok(value.clone())
        } else {
            Err(OllamaError::bad(format!(
                "options.{name}: {value} is not a number"
            )))
        }
    };
    match name {
        _ if SAME.contains(&name) => {
            out.insert(name.into(), number()?);
        }
        "num_predict" => {
            // Ollama's -1 (no limit) and -2 (fill the context): until the context is full.
            let n = number()?.as_i64().ok_or_else(|| {
                OllamaError::bad(format!("options.num_predict: {value} is not an integer"))
            })?;
            out.insert("n_predict".into(), json!(if n < 0 { i64::MAX } else { n }));
        }
        // llama-server's own: generation goes on past end-of-generation tokens.
        "ignore_eos" => match value {
            Value::Bool(_) => {
                out.insert(name.into(), value.clone());
            }
            _ => {
                return Err(OllamaError::bad(format!(
                    "options.ignore_eos: {value} is not a boolean"
                )))
            }
        },
        "num_keep" => {
            out.insert("n_keep".into(), number()?);
        }
        "stop" => {
            let ok = value.is_string()
                || value
                    .as_array()
                    .is_some_and(|a| a.iter().all(Value::is_string));
            if !ok {
                return Err(OllamaError::bad(format!(
                    "options.stop: {value} is not a list of strings"
                )));
            }
            out.insert("stop".into(), value.clone());
        }
        "num_ctx" => {
            return match number()?.as_u64() {
                Some(n) if n > 0 => Ok(Some(usize::try_from(n).unwrap_or(usize::MAX))),
                _ => Err(OllamaError::bad(format!(
                    "options.num_ctx: {value} is not a positive integer"
                ))),
            };
        }
        _ if LOAD_TIME.contains(&name) => {}
        // Ollama ignores options it does not know, with a warning in its log: so does this
        // server.
        _ => st
            .metrics
            .log(format!("ollama: option {name:?} is not known; ignored")),
    }
    Ok(None)
}

/// `format`: `"json"` (any JSON object) or a JSON schema, through the JSON grammar.
fn format(format: Option<&Value>, out: &mut Map<String, Value>) -> Result<(), OllamaError> {
    match format {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) if s.is_empty() => {}
        Some(Value::String(s)) if s == "json" => {
            out.insert("response_format".into(), json!({ "type": "json_object" }));
        }
        Some(schema @ Value::Object(_)) => {
            out.insert("json_schema".into(), schema.clone());
        }
        Some(other) => {
            return Err(OllamaError::bad(format!(
                "format: {other} is neither \"json\" nor a JSON schema object"
            )))
        }
    }
    Ok(())
}

/// `think`: true or false (the template's `enable_thinking`), or an effort (`low`, `medium`,
/// `high`: thinking on, with the template's `reasoning_effort`).
fn think(think: Option<&Value>, out: &mut Map<String, Value>) -> Result<(), OllamaError> {
    let (on, effort) = match think {
        None | Some(Value::Null) => return Ok(()),
        Some(Value::Bool(b)) => (*b, None),
        Some(Value::String(s)) if matches!(s.as_str(), "low" | "medium" | "high") => {
            (true, Some(s.clone()))
        }
        Some(other) => {
            return Err(OllamaError::bad(format!(
                "think: {other} is not true, false, \"low\", \"medium\" or \"high\""
            )))
        }
    };
    let kwargs = out
        .entry("chat_template_kwargs")
        .or_insert_with(|| json!({}));
    if let Some(k) = kwargs.as_object_mut() {
        k.insert("enable_thinking".into(), json!(on));
        if let Some(effort) = effort {
            k.insert("reasoning_effort".into(), json!(effort));
        }
    }
    Ok(())
}

/// `logprobs` and `top_logprobs` (0 to 20): whether probabilities were asked for.
fn logprobs(body: &Map<String, Value>, out: &mut Map<String, Value>) -> Result<bool, OllamaError> {
    let on = match body.get("logprobs") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(v) => return Err(OllamaError::bad(format!("logprobs: {v} is not a boolean"))),
    };
    let top = match body.get("top_logprobs") {
        None | Some(Value::Null) => 0,
        Some(v) => match v.as_u64() {
            Some(n) if n <= 20 => n,
            _ => {
                return Err(OllamaError::bad(format!(
                    "top_logprobs: {v} is not an integer from 0 to 20"
                )))
            }
        },
    };
    if on {
        out.insert("logprobs".into(), json!(true));
        out.insert("top_logprobs".into(), json!(top));
    }
    Ok(on)
}

/// `keep_alive`: a duration (`"5m"`, seconds as a number, a negative one for ever). The model
/// stays loaded as long as the server runs, so it changes nothing; a value of another type is
/// refused.
fn keep_alive(v: Option<&Value>) -> Result<(), OllamaError> {
    match v {
        None | Some(Value::Null | Value::String(_) | Value::Number(_)) => Ok(()),
        Some(other) => Err(OllamaError::bad(format!(
            "keep_alive: {other} is not a duration"
        ))),
    }
}

/// Caps a generation of `max_tokens` after a prompt of `n_prompt` tokens so that prompt and
/// reply fit `num_ctx` (the server's context bounds both anyway). A prompt that already
/// fills `num_ctx` is not truncated, as Ollama would: it is evaluated whole and only the
/// server's context bounds its reply.
pub(super) fn cap_to_num_ctx(max_tokens: &mut usize, n_prompt: usize, num_ctx: Option<usize>) {
    if let Some(n) = num_ctx.filter(|&n| n > n_prompt) {
        *max_tokens = (*max_tokens).min(n - n_prompt);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_think_and_logprobs_become_request_fields() {
        let mut out = Map::new();
        format(Some(&json!("json")), &mut out).unwrap();
        assert_eq!(out["response_format"], json!({ "type": "json_object" }));
        let schema = json!({ "type": "object", "properties": { "a": { "type": "integer" } } });
        format(Some(&schema), &mut out).unwrap();
        assert_eq!(out["json_schema"], schema);
        assert!(format(Some(&json!("xml")), &mut out).is_err());
        assert!(format(Some(&json!(3)), &mut out).is_err());

        think(Some(&json!("high")), &mut out).unwrap();
        assert_eq!(
            out["chat_template_kwargs"],
            json!({ "enable_thinking": true, "reasoning_effort": "high" })
        );
        assert!(think(Some(&json!("max")), &mut out).is_err());

        let body = json!({ "logprobs": true, "top_logprobs": 3 });
        assert!(logprobs(body.as_object().unwrap(), &mut out).unwrap());
        assert_eq!(out["top_logprobs"], 3);
        let body = json!({ "logprobs": true, "top_logprobs": 21 });
        assert!(logprobs(body.as_object().unwrap(), &mut out).is_err());
        assert!(keep_alive(Some(&json!({ "m": 5 }))).is_err());
        assert!(keep_alive(Some(&json!("5m"))).is_ok());
    }

    #[test]
    fn num_ctx_caps_the_reply() {
        let mut max = usize::MAX;
        cap_to_num_ctx(&mut max, 100, Some(128));
        assert_eq!(max, 28);
        // A prompt over num_ctx is bounded by the server's context only.
        let mut max = usize::MAX;
        cap_to_num_ctx(&mut max, 200, Some(128));
        assert_eq!(max, usize::MAX);
        let mut max = 5;
        cap_to_num_ctx(&mut max, 10, None);
        assert_eq!(max, 5);
    }
}
