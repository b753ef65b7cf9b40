//! The JSON shapes of generated answers: OpenAI's chat completion and completion objects and
//! chunks, and llama-server's native `/completion` objects, with their usage, timings,
//! probabilities and generation settings.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use engine::chat::tools::ToolCallEvent;
use engine::sampling::TokenProb;
use engine::tokenizer::Tokenizer;
use serde_json::{json, Map, Value};

use super::turn::{Piece, Reader, Turn};
use super::AppState;
use crate::request::Output;
use crate::scheduler::{Chunk, Event, Finish, FinishReason, GenParams, Progress, TokenProbs};

/// One finished generation.
#[derive(Debug)]
pub struct Reply {
    /// Its index among the response's choices.
    pub index: usize,
    /// Its whole text.
    pub text: String,
    /// Its figures.
    pub finish: Finish,
}

/// What every object of one response shares.
#[derive(Clone, Debug)]
pub struct Meta {
    /// The response's id.
    pub id: String,
    /// When it was created (Unix seconds).
    pub created: u64,
    /// The model's name.
    pub model: String,
}

impl Meta {
    /// A new response of `st`'s model, its id starting with `prefix`.
    pub fn new(st: &Arc<AppState>, prefix: &str) -> Meta {
        Meta {
            id: new_id(prefix),
            created: kvstore::unix_now(),
            model: st.config.alias.clone(),
        }
    }
}

/// The build, as OpenAI's `system_fingerprint` (llama-server's start with `b`).
pub const FINGERPRINT: &str = concat!("b", env!("CARGO_PKG_VERSION"), "-llama-hdd");

/// OpenAI's `finish_reason`.
fn finish_reason(f: &Finish) -> &'static str {
    f.reason.as_openai()
}

/// OpenAI's `usage`, with the cached prompt tokens.
pub fn usage(f: &Finish) -> Value {
    json!({
        "prompt_tokens": f.n_prompt,
        "completion_tokens": f.predicted_n,
        "total_tokens": f.n_prompt + f.predicted_n,
        "prompt_tokens_details": { "cached_tokens": f.cache_n },
    })
}

/// The usage of several generations of one request: the prompts counted once per choice.
fn usage_all(replies: &[&Finish]) -> Value {
    let (p, c, cached) = replies.iter().fold((0, 0, 0), |(p, c, k), f| {
        (p + f.n_prompt, c + f.predicted_n, k + f.cache_n)
    });
    json!({
        "prompt_tokens": p,
        "completion_tokens": c,
        "total_tokens": p + c,
        "prompt_tokens_details": { "cached_tokens": cached },
    })
}

/// llama-server's `timings`. The generation rate counts decode steps: the first token comes
/// from the prompt's last batch, so `n` tokens took `n - 1` steps.
pub fn timings(f: &Finish) -> Value {
    let per = |n: usize, ms: f64| {
        if n == 0 || ms <= 0.0 {
            (0.0, 0.0)
        } else {
            (ms / n as f64, n as f64 * 1e3 / ms)
        }
    };
    let (p_tok, p_sec) = per(f.prompt_n, f.prompt_ms);
    let (g_tok, g_sec) = per(f.predicted_n.saturating_sub(1), f.predicted_ms);
    let mut t = json!({
        "cache_n": f.cache_n,
        "prompt_n": f.prompt_n,
        "prompt_ms": f.prompt_ms,
        "prompt_per_token_ms": p_tok,
        "prompt_per_second": p_sec,
        "predicted_n": f.predicted_n,
        "predicted_ms": f.predicted_ms,
        "predicted_per_token_ms": g_tok,
        "predicted_per_second": g_sec,
    });
    // As llama-server: only when drafts were verified.
    if f.drafts.drafted > 0 {
        t["draft_n"] = json!(f.drafts.drafted);
        t["draft_n_accepted"] = json!(f.drafts.accepted);
    }
    t
}

/// llama-server's `prompt_progress`.
pub fn progress(p: &Progress) -> Value {
    json!({
        "total": p.total,
        "cache": p.cache,
        "processed": p.processed,
        "time_ms": p.time_ms,
    })
}

/// llama-server's `timings` while a prompt is evaluated: nothing generated yet.
pub fn progress_timings(p: &Progress) -> Value {
    let n = p.processed.saturating_sub(p.cache);
    let ms = if n == 0 { 0.0 } else { p.time_ms };
    json!({
        "cache_n": p.cache,
        "prompt_n": n,
        "prompt_ms": ms,
        "prompt_per_token_ms": if n > 0 { ms / n as f64 } else { 0.0 },
        "prompt_per_second": if ms > 0.0 { n as f64 * 1e3 / ms } else { 0.0 },
        "predicted_n": 0,
        "predicted_ms": 0.0,
        "predicted_per_token_ms": 0.0,
        "predicted_per_second": 0.0,
    })
}

/// One token as the probability lists show it: id, text, bytes, and its log-probability (or
/// probability, after sampling).
fn prob_entry(tok: &Tokenizer, p: &TokenProb, post_sampling: bool) -> Value {
    let bytes = tok.token_bytes(p.id);
    let mut v = json!({
        "id": p.id,
        "token": String::from_utf8_lossy(bytes),
        "bytes": bytes,
    });
    if post_sampling {
        v["prob"] = json!(p.prob);
    } else {
        // JSON has no -inf: an impossible token shows as a very unlikely one.
        v["logprob"] = json!(if p.logprob.is_finite() {
            p.logprob
        } else {
            -9999.0
        });
    }
    v
}

/// llama-server's `completion_probabilities` entries (and OpenAI chat's `logprobs.content`).
fn probs_json(tok: &Tokenizer, probs: &[TokenProbs], post_sampling: bool) -> Vec<Value> {
    probs
        .iter()
        .map(|p| {
            let mut v = prob_entry(tok, &p.prob, post_sampling);
            let top: Vec<Value> = p
                .top
                .iter()
                .filter(|t| !post_sampling || t.prob > 0.0)
                .map(|t| prob_entry(tok, t, post_sampling))
                .collect();
            v[if post_sampling {
                "top_probs"
            } else {
                "top_logprobs"
            }] = Value::Array(top);
            v
        })
        .collect()
}

/// The settings a generation ran with, as llama-server's `generation_settings`.
pub fn generation_settings(p: &GenParams, output: &Output, st: &AppState) -> Value {
    let s = &p.sampler;
    let n_predict = if p.max_tokens == usize::MAX {
        -1
    } else {
        p.max_tokens as i64
    };
    let chain: Vec<&str> = s.samplers.iter().map(|k| k.name()).collect();
    // JSON has no infinity: a ban shows as a null bias, as llama-server writes it.
    let bias: Vec<Value> = s
        .logit_bias
        .iter()
        .map(|&(id, b)| json!({ "token": id, "bias": if b.is_finite() { json!(b) } else { Value::Null } }))
        .collect();
    let mut v = json!({
        "n_ctx": st.n_ctx,
        "n_predict": n_predict,
        "max_tokens": n_predict,
        "seed": s.seed,
        "temperature": s.temperature,
        "dynatemp_range": s.dynatemp_range,
        "dynatemp_exponent": s.dynatemp_exponent,
        "top_k": s.top_k,
        "top_p": s.top_p,
        "min_p": s.min_p,
        "top_n_sigma": s.top_n_sigma,
        "xtc_probability": s.xtc_probability,
        "xtc_threshold": s.xtc_threshold,
        "typical_p": s.typical_p,
        "repeat_last_n": s.repeat_last_n.min(i64::MAX as usize),
        "repeat_penalty": s.repeat_penalty,
        "presence_penalty": s.presence_penalty,
        "frequency_penalty": s.frequency_penalty,
    });
    let more = json!({
        "dry_multiplier": s.dry_multiplier,
        "dry_base": s.dry_base,
        "dry_allowed_length": s.dry_allowed_length,
        "dry_penalty_last_n": if s.dry_penalty_last_n == usize::MAX { -1 } else { s.dry_penalty_last_n as i64 },
        "dry_sequence_breakers": p.dry_breakers.clone().unwrap_or_else(|| {
            engine::sampling::DEFAULT_DRY_SEQUENCE_BREAKERS.iter().map(|b| (*b).to_owned()).collect()
        }),
        "mirostat": s.mirostat,
        "mirostat_tau": s.mirostat_tau,
        "mirostat_eta": s.mirostat_eta,
        "adaptive_target": -1.0,
        "adaptive_decay": 0.9,
        "stop": p.stop,
        "n_keep": p.n_keep,
        "n_discard": p.n_discard,
        "ignore_eos": p.ignore_eos,
        "stream": output.stream,
        "logit_bias": bias,
        "n_probs": output.probs.map_or(0, |pr| pr.top),
        "min_keep": s.min_keep,
        "grammar": "",
        "samplers": chain,
        "timings_per_token": output.timings_per_token,
        "post_sampling_probs": output.probs.is_some_and(|pr| pr.post_sampling),
        "cache_prompt": p.cache_prompt,
        "id_slot": p.id_slot.map_or(-1, |i| i as i64),
        "lora": [],
    });
    if let (Some(a), Value::Object(b)) = (v.as_object_mut(), more) {
        a.extend(b);
    }
    v
}

/// llama-server's `stop_type`.
fn stop_type(f: &Finish) -> &'static str {
    match f.reason {
        FinishReason::EndOfGeneration => "eos",
        FinishReason::StopString => "word",
        FinishReason::Length => "limit",
        FinishReason::Cancelled => "none",
    }
}

/// llama-server's final `/completion` object for one generation whose text is `content`,
/// cut to `response_fields` when the request named some.
pub fn native_final(
    meta: &Meta,
    r: &Reply,
    content: &str,
    output: &Output,
    settings: &Value,
    prompt: &str,
    tok: &Tokenizer,
) -> Value {
    let f = &r.finish;
    let mut v = json!({
        "index": r.index,
        "content": content,
        "tokens": if output.return_tokens { json!(f.tokens) } else { json!([]) },
        "id_slot": f.slot,
        "stop": true,
        "model": meta.model,
        "tokens_predicted": f.predicted_n,
        "tokens_evaluated": f.n_prompt,
        "generation_settings": settings,
        "prompt": prompt,
        "has_new_line": r.text.contains('\n') || content.contains('\n'),
        "truncated": f.truncated,
        "stop_type": stop_type(f),
        "stopping_word": f.stopping_word,
        "tokens_cached": f.cache_n,
        "timings": timings(f),
    });
    if let Some(p) = output.probs {
        v["completion_probabilities"] = Value::Array(probs_json(tok, &f.probs, p.post_sampling));
    }
    if output.response_fields.is_empty() {
        v
    } else {
        pick_fields(&v, &output.response_fields)
    }
}

/// Only the fields named, each under its path as given (`a/b` is field `b` of `a`).
fn pick_fields(v: &Value, fields: &[String]) -> Value {
    let mut out = Map::new();
    for path in fields {
        let found = path
            .split('/')
            .try_fold(v, |v, key| v.get(key))
            .cloned()
            .unwrap_or(Value::Null);
        out.insert(path.clone(), found);
    }
    Value::Object(out)
}

/// A streamed `/completion` chunk.
pub fn native_chunk(
    meta: &Meta,
    index: usize,
    chunk: &Chunk,
    output: &Output,
    tok: &Tokenizer,
) -> Value {
    let mut v = json!({
        "index": index,
        "content": chunk.text,
        "tokens": chunk.tokens,
        "stop": false,
        "id_slot": -1,
        "model": meta.model,
    });
    if let Some(p) = output.probs {
        v["completion_probabilities"] =
            Value::Array(probs_json(tok, &chunk.probs, p.post_sampling));
    }
    v
}

/// OpenAI's `logprobs` object of a choice.
fn openai_logprobs(tok: &Tokenizer, probs: &[TokenProbs]) -> Value {
    json!({ "content": probs_json(tok, probs, false) })
}

/// The whole `/v1/chat/completions` answer.
pub fn chat_whole(
    meta: &Meta,
    replies: &[Reply],
    output: &Output,
    turn: &Turn,
    tok: &Tokenizer,
) -> Value {
    let choices: Vec<Value> = replies
        .iter()
        .map(|r| {
            let parsed = turn.read(&r.text);
            let mut message = json!({ "role": "assistant", "content": parsed.content });
            if !parsed.reasoning.is_empty() {
                message["reasoning_content"] = json!(parsed.reasoning);
            }
            let reason = if parsed.calls.is_empty() {
                finish_reason(&r.finish)
            } else {
                if parsed.content.is_empty() {
                    message["content"] = Value::Null;
                }
                message["tool_calls"] =
                    Value::Array(parsed.calls.iter().map(|c| c.to_openai()).collect());
                "tool_calls"
            };
            let mut c = json!({
                "index": r.index,
                "message": message,
                "finish_reason": reason,
            });
            if output.probs.is_some() {
                c["logprobs"] = openai_logprobs(tok, &r.finish.probs);
            }
            c
        })
        .collect();
    whole(meta, "chat.completion", choices, replies)
}

/// The state of a streamed chat answer over its choices.
pub struct ChatStream {
    meta: Meta,
    output: Output,
    readers: Vec<Reader>,
    called: Vec<bool>,
    started: Vec<bool>,
    finishes: Vec<Option<Finish>>,
}

impl ChatStream {
    /// A stream of `n` choices.
    pub fn new(meta: Meta, output: Output, readers: Vec<Reader>) -> ChatStream {
        let n = readers.len();
        ChatStream {
            meta,
            output,
            readers,
            called: vec![false; n],
            started: vec![false; n],
            finishes: (0..n).map(|_| None).collect(),
        }
    }

    /// The text of choice `index` so far.
    pub fn text(&self, index: usize) -> &str {
        self.readers[index].text()
    }

    fn chunk(&self, choices: Value) -> Value {
        json!({
            "id": self.meta.id,
            "object": "chat.completion.chunk",
            "created": self.meta.created,
            "model": self.meta.model,
            "system_fingerprint": FINGERPRINT,
            "choices": choices,
        })
    }

    /// OpenAI's deltas for the pieces of choice `index`'s reply: reasoning, content and tool
    /// calls (a call's first delta names it; the next ones add to its arguments).
    fn deltas(&mut self, index: usize, pieces: Vec<Piece>) -> Vec<Value> {
        pieces
            .into_iter()
            .map(|p| match p {
                Piece::Reasoning(r) => json!({ "reasoning_content": r }),
                Piece::Reply(e) => {
                    if matches!(e, ToolCallEvent::CallStart { .. }) {
                        self.called[index] = true;
                    }
                    e.to_openai_delta()
                }
            })
            .collect()
    }

    /// The payloads for one event of choice `index`; after the last choice's end, the usage
    /// in a chunk of its own with no choices.
    pub fn event(&mut self, index: usize, ev: Event, tok: &Tokenizer) -> Vec<String> {
        let mut out = Vec::new();
        if !self.started[index] {
            self.started[index] = true;
            out.push(
                self.chunk(json!([{
                    "index": index,
                    "delta": { "role": "assistant", "content": null },
                    "finish_reason": null,
                }]))
                .to_string(),
            );
        }
        match ev {
            Event::Text(c) => {
                let pieces = self.readers[index].feed(&c.text);
                let mut deltas = self.deltas(index, pieces);
                // A chunk whose text is held back (a tag may be starting) sends nothing, or,
                // when probabilities were asked for, an empty delta with its tokens'.
                if deltas.is_empty() && self.output.probs.is_some() {
                    deltas.push(json!({}));
                }
                let n = deltas.len();
                for (i, delta) in deltas.into_iter().enumerate() {
                    let mut choice = json!({
                        "index": index,
                        "delta": delta,
                        "finish_reason": null,
                    });
                    if self.output.probs.is_some() && i + 1 == n {
                        choice["logprobs"] = openai_logprobs(tok, &c.probs);
                    }
                    out.push(self.chunk(json!([choice])).to_string());
                }
            }
            Event::Progress(p) => {
                let mut chunk = self.chunk(json!([]));
                chunk["prompt_progress"] = progress(&p);
                out.push(chunk.to_string());
            }
            Event::Done(f) => {
                let pieces = self.readers[index].finish();
                for delta in self.deltas(index, pieces) {
                    out.push(
                        self.chunk(
                            json!([{ "index": index, "delta": delta, "finish_reason": null }]),
                        )
                        .to_string(),
                    );
                }
                let reason = if self.called[index] {
                    "tool_calls"
                } else {
                    finish_reason(&f)
                };
                out.push(
                    self.chunk(json!([{
                        "index": index,
                        "delta": {},
                        "finish_reason": reason,
                    }]))
                    .to_string(),
                );
                self.finishes[index] = Some(*f);
                if self.finishes.iter().all(Option::is_some) {
                    let all: Vec<&Finish> = self.finishes.iter().flatten().collect();
                    let mut last = self.chunk(json!([]));
                    last["usage"] = usage_all(&all);
                    if let Some(first) = all.first() {
                        last["timings"] = timings(first);
                    }
                    out.push(last.to_string());
                }
            }
            Event::Failed(e) => out.push(e.to_json().to_string()),
        }
        out
    }
}

/// The whole `/v1/completions` answer.
pub fn openai_completion_whole(
    meta: &Meta,
    replies: &[Reply],
    output: &Output,
    tok: &Tokenizer,
) -> Value {
    let choices: Vec<Value> = replies
        .iter()
        .map(|r| {
            json!({
                "text": r.text,
                "index": r.index,
                "logprobs": output.probs.map(|_| openai_logprobs(tok, &r.finish.probs)),
                "finish_reason": finish_reason(&r.finish),
            })
        })
        .collect();
    whole(meta, "text_completion", choices, replies)
}

/// The payloads of one event of a streamed `/v1/completions` answer.
pub fn openai_completion_event(
    meta: &Meta,
    output: &Output,
    index: usize,
    ev: Event,
    tok: &Tokenizer,
) -> Vec<String> {
    let body = |text: &str, finish: Value, logprobs: Value| {
        json!({
            "id": meta.id,
            "object": "text_completion",
            "created": meta.created,
            "model": meta.model,
            "system_fingerprint": FINGERPRINT,
            "choices": [{ "text": text, "index": index, "logprobs": logprobs, "finish_reason": finish }],
        })
    };
    match ev {
        Event::Text(c) => {
            let lp = if output.probs.is_some() {
                openai_logprobs(tok, &c.probs)
            } else {
                Value::Null
            };
            vec![body(&c.text, Value::Null, lp).to_string()]
        }
        Event::Progress(_) => Vec::new(),
        Event::Done(f) => {
            let mut last = body("", json!(finish_reason(&f)), Value::Null);
            last["usage"] = usage(&f);
            last["timings"] = timings(&f);
            vec![last.to_string()]
        }
        Event::Failed(e) => vec![e.to_json().to_string()],
    }
}

/// A response id unique within this process (and, by the time in it, across restarts).
pub fn new_id(prefix: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}-{:x}{n:04x}", kvstore::unix_now())
}

/// An OpenAI answer that is not streamed: its `object`, its choices, the usage of every reply
/// and the first reply's timings (llama-server's extension).
fn whole(meta: &Meta, object: &str, choices: Vec<Value>, replies: &[Reply]) -> Value {
    let finishes: Vec<&Finish> = replies.iter().map(|r| &r.finish).collect();
    let mut v = json!({
        "id": meta.id,
        "object": object,
        "created": meta.created,
        "model": meta.model,
        "system_fingerprint": FINGERPRINT,
        "choices": choices,
        "usage": usage_all(&finishes),
    });
    if let Some(r) = replies.first() {
        v["timings"] = timings(&r.finish);
    }
    v
}
