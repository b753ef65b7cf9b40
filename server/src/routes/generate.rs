//! The generating endpoints: `/v1/chat/completions`, `/v1/completions` (OpenAI's shapes) and
//! `/completion` (llama.cpp's native one), streamed as server-sent events or answered whole.
//!
//! A handler tokenizes on its own thread, checks the prompt against the context, hands a
//! [`Job`] to the scheduler and turns the events it gets back into JSON. When the client goes
//! away the handler's receiver is dropped, which cancels the generation at the next step.

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::Json;
use engine::chat::Message;
use engine::sampling::SamplerParams;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::{AppState, JsonBody};
use crate::error::{Result, ServerError};
use crate::scheduler::{Command, Event, Finish, FinishReason, GenParams, Job};

/// One chat message as clients send it.
#[derive(Deserialize)]
pub struct ChatMessage {
    role: String,
    #[serde(default)]
    content: Option<Content>,
}

/// Message content: a string, or OpenAI's list of parts (only text parts are supported).
#[derive(Deserialize)]
#[serde(untagged)]
enum Content {
    Text(String),
    Parts(Vec<Part>),
}

#[derive(Deserialize)]
struct Part {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    text: Option<String>,
}

/// `stop`: one string or several.
#[derive(Deserialize)]
#[serde(untagged)]
enum Stop {
    One(String),
    Many(Vec<String>),
}

/// Settings every generating endpoint accepts.
#[derive(Default, Deserialize)]
struct Sampling {
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<usize>,
    min_p: Option<f32>,
    seed: Option<i64>,
    repeat_penalty: Option<f32>,
    frequency_penalty: Option<f32>,
    presence_penalty: Option<f32>,
    stop: Option<Stop>,
    cache_prompt: Option<bool>,
    id_slot: Option<i64>,
    #[serde(default)]
    ignore_eos: bool,
    #[serde(default)]
    stream: bool,
}

/// `POST /v1/chat/completions` body.
#[derive(Deserialize)]
pub struct ChatRequest {
    messages: Vec<ChatMessage>,
    max_tokens: Option<i64>,
    max_completion_tokens: Option<i64>,
    n_predict: Option<i64>,
    #[serde(flatten)]
    sampling: Sampling,
}

/// A prompt as text, one text in a list, or token ids.
#[derive(Deserialize)]
#[serde(untagged)]
enum Prompt {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<u32>),
}

/// `POST /v1/completions` and `POST /completion` body.
#[derive(Deserialize)]
pub struct CompletionRequest {
    prompt: Prompt,
    max_tokens: Option<i64>,
    n_predict: Option<i64>,
    #[serde(flatten)]
    sampling: Sampling,
}

/// The engine's messages from the client's.
pub fn chat_messages(messages: &[ChatMessage]) -> Result<Vec<Message>> {
    if messages.is_empty() {
        return Err(ServerError::BadRequest("\"messages\" is empty".into()));
    }
    messages
        .iter()
        .map(|m| {
            let content = match &m.content {
                None => String::new(),
                Some(Content::Text(t)) => t.clone(),
                Some(Content::Parts(parts)) => {
                    let mut text = String::new();
                    for p in parts {
                        match (p.kind.as_str(), &p.text) {
                            ("text", Some(t)) => text.push_str(t),
                            (kind, _) => {
                                return Err(ServerError::BadRequest(format!(
                                    "content parts of type {kind:?} are not supported"
                                )))
                            }
                        }
                    }
                    text
                }
            };
            Ok(Message::new(m.role.clone(), content))
        })
        .collect()
}

/// `POST /v1/chat/completions`.
pub async fn chat(
    State(st): State<Arc<AppState>>,
    JsonBody(req): JsonBody<ChatRequest>,
) -> Result<Response> {
    let messages = chat_messages(&req.messages)?;
    let text = st.model.chat_template().render(&messages, true)?;
    let prompt = chat_tokens(&st, &text)?;
    let max = req
        .max_completion_tokens
        .or(req.max_tokens)
        .or(req.n_predict);
    let params = gen_params(&st, &req.sampling, max)?;
    let mut rx = submit(&st, prompt.clone(), params)?;
    let (id, created, model) = (new_id("chatcmpl"), unix_now(), st.config.alias.clone());
    let remember = move |st: &AppState, reply: &str, f: &Finish| {
        // A reply cut at a stop string is not the text of its tokens.
        if matches!(
            f.reason,
            FinishReason::EndOfGeneration | FinishReason::Length
        ) {
            let mut tokens = prompt.clone();
            tokens.extend_from_slice(&f.tokens);
            if let Ok(mut texts) = st.texts.lock() {
                texts.insert(format!("{text}{reply}"), tokens);
            }
        }
    };
    if !req.sampling.stream {
        let (reply, f) = collect(&mut rx).await?;
        remember(&st, &reply, &f);
        return Ok(Json(json!({
            "id": id,
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": [{
                "index": 0,
                "message": { "role": "assistant", "content": reply },
                "finish_reason": f.reason.as_openai(),
            }],
            "usage": usage(&f),
            "timings": timings(&f),
        }))
        .into_response());
    }
    let chunk = move |delta: Value, finish: Value| {
        json!({
            "id": id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [{ "index": 0, "delta": delta, "finish_reason": finish }],
        })
    };
    let mut reply = String::new();
    let mut started = false;
    let st2 = Arc::clone(&st);
    sse(rx, move |ev| {
        let mut out = Vec::new();
        if !started {
            started = true;
            out.push(
                chunk(json!({ "role": "assistant", "content": null }), Value::Null).to_string(),
            );
        }
        match ev {
            Event::Text(t) => {
                reply.push_str(&t);
                out.push(chunk(json!({ "content": t }), Value::Null).to_string());
            }
            Event::Done(f) => {
                remember(&st2, &reply, &f);
                let mut last = chunk(json!({}), json!(f.reason.as_openai()));
                last["usage"] = usage(&f);
                last["timings"] = timings(&f);
                out.push(last.to_string());
                out.push("[DONE]".to_owned());
            }
            Event::Failed(e) => out.push(e.to_json().to_string()),
        }
        out
    })
    .await
}

/// The tokens of a rendered chat prompt: the longest text evaluated before (an earlier turn
/// with its reply) keeps the tokens it was evaluated as; only the rest is tokenized.
fn chat_tokens(st: &AppState, text: &str) -> Result<Vec<u32>> {
    let tok = st.model.tokenizer();
    let known = st
        .texts
        .lock()
        .ok()
        .and_then(|mut t| t.longest_prefix(text));
    match known {
        Some((n, mut tokens)) => {
            tokens.extend(tok.encode(&text[n..], false, true)?);
            let fresh = tok.encode(text, true, true)?;
            if fresh != tokens {
                if let Ok(mut t) = st.texts.lock() {
                    t.retokenize_mismatches += 1;
                }
            }
            Ok(tokens)
        }
        None => Ok(tok.encode(text, true, true)?),
    }
}

/// `POST /v1/completions`.
pub async fn completions(
    State(st): State<Arc<AppState>>,
    JsonBody(req): JsonBody<CompletionRequest>,
) -> Result<Response> {
    let prompt = prompt_tokens(&st, &req.prompt)?;
    let params = gen_params(&st, &req.sampling, req.max_tokens.or(req.n_predict))?;
    let mut rx = submit(&st, prompt, params)?;
    let (id, created, model) = (new_id("cmpl"), unix_now(), st.config.alias.clone());
    let body = move |text: &str, finish: Value| {
        json!({
            "id": id,
            "object": "text_completion",
            "created": created,
            "model": model,
            "choices": [{ "text": text, "index": 0, "logprobs": null, "finish_reason": finish }],
        })
    };
    if !req.sampling.stream {
        let (text, f) = collect(&mut rx).await?;
        let mut out = body(&text, json!(f.reason.as_openai()));
        out["usage"] = usage(&f);
        out["timings"] = timings(&f);
        return Ok(Json(out).into_response());
    }
    sse(rx, move |ev| match ev {
        Event::Text(t) => vec![body(&t, Value::Null).to_string()],
        Event::Done(f) => {
            let mut last = body("", json!(f.reason.as_openai()));
            last["usage"] = usage(&f);
            last["timings"] = timings(&f);
            vec![last.to_string(), "[DONE]".to_owned()]
        }
        Event::Failed(e) => vec![e.to_json().to_string()],
    })
    .await
}

/// `POST /completion`: llama.cpp's native endpoint.
pub async fn completion(
    State(st): State<Arc<AppState>>,
    JsonBody(req): JsonBody<CompletionRequest>,
) -> Result<Response> {
    let prompt = prompt_tokens(&st, &req.prompt)?;
    let params = gen_params(&st, &req.sampling, req.n_predict.or(req.max_tokens))?;
    let mut rx = submit(&st, prompt, params)?;
    let model = st.config.alias.clone();
    let last = move |content: &str, f: &Finish| {
        json!({
            "content": content,
            "id_slot": f.slot,
            "stop": true,
            "model": model,
            "tokens_predicted": f.predicted_n,
            "tokens_evaluated": f.n_prompt,
            "tokens_cached": f.cache_n,
            "stop_type": match f.reason {
                FinishReason::EndOfGeneration => "eos",
                FinishReason::StopString => "word",
                FinishReason::Length => "limit",
                FinishReason::Cancelled => "none",
            },
            "truncated": false,
            "timings": timings(f),
        })
    };
    if !req.sampling.stream {
        let (text, f) = collect(&mut rx).await?;
        return Ok(Json(last(&text, &f)).into_response());
    }
    sse(rx, move |ev| match ev {
        Event::Text(t) => vec![json!({ "content": t, "stop": false, "index": 0 }).to_string()],
        Event::Done(f) => vec![last("", &f).to_string()],
        Event::Failed(e) => vec![e.to_json().to_string()],
    })
    .await
}

/// A completion prompt as tokens (text is tokenized with the model's special tokens).
fn prompt_tokens(st: &AppState, prompt: &Prompt) -> Result<Vec<u32>> {
    let tok = st.model.tokenizer();
    match prompt {
        Prompt::Text(t) => Ok(tok.encode(t, true, true)?),
        Prompt::Texts(ts) if ts.len() == 1 => Ok(tok.encode(&ts[0], true, true)?),
        Prompt::Texts(ts) => Err(ServerError::BadRequest(format!(
            "one prompt per request is supported, not {}",
            ts.len()
        ))),
        Prompt::Tokens(ids) => Ok(ids.clone()),
    }
}

/// The generation settings of a request, with the server's defaults.
fn gen_params(st: &AppState, s: &Sampling, max_tokens: Option<i64>) -> Result<GenParams> {
    let args = &st.config.args;
    let max_tokens = match max_tokens.filter(|&m| m >= 0).unwrap_or(args.n_predict) {
        m if m < 0 => usize::MAX,
        m => m as usize,
    };
    let seed = match s.seed.filter(|&s| s >= 0).unwrap_or(args.seed) {
        s if s < 0 => random_seed(),
        s => s as u64,
    };
    let d = SamplerParams::default();
    let sampler = SamplerParams {
        temperature: s.temperature.unwrap_or(args.temp),
        top_k: s.top_k.unwrap_or(d.top_k),
        top_p: s.top_p.unwrap_or(d.top_p),
        min_p: s.min_p.unwrap_or(d.min_p),
        repeat_penalty: s.repeat_penalty.unwrap_or(d.repeat_penalty),
        frequency_penalty: s.frequency_penalty.unwrap_or(d.frequency_penalty),
        presence_penalty: s.presence_penalty.unwrap_or(d.presence_penalty),
        seed,
        ..d
    };
    let id_slot = match s.id_slot {
        None => None,
        Some(id) if id < 0 => None,
        Some(id) if (id as usize) < st.n_slots => Some(id as usize),
        Some(id) => {
            return Err(ServerError::UnknownSlot {
                id: id as usize,
                n_slots: st.n_slots,
            })
        }
    };
    let stop = match &s.stop {
        None => Vec::new(),
        Some(Stop::One(s)) => vec![s.clone()],
        Some(Stop::Many(v)) => v.clone(),
    };
    Ok(GenParams {
        max_tokens,
        sampler,
        stop,
        cache_prompt: s.cache_prompt.unwrap_or(true),
        id_slot,
        ignore_eos: s.ignore_eos,
    })
}

/// Checks the prompt and queues it; the receiver gets the request's events.
fn submit(
    st: &AppState,
    prompt: Vec<u32>,
    params: GenParams,
) -> Result<mpsc::UnboundedReceiver<Event>> {
    if prompt.is_empty() {
        return Err(ServerError::BadRequest("the prompt is empty".into()));
    }
    if prompt.len() >= st.n_ctx {
        return Err(ServerError::PromptTooLong {
            n_prompt: prompt.len(),
            n_ctx: st.n_ctx,
        });
    }
    let n_vocab = st.model.hparams().n_vocab;
    if let Some(&id) = prompt.iter().find(|&&t| t as usize >= n_vocab) {
        return Err(ServerError::BadToken { id, n_vocab });
    }
    let (events, rx) = mpsc::unbounded_channel();
    st.tx
        .send(Command::Generate(Job {
            prompt,
            params,
            events,
        }))
        .map_err(|_| ServerError::ShuttingDown)?;
    Ok(rx)
}

/// Waits for the whole text.
async fn collect(rx: &mut mpsc::UnboundedReceiver<Event>) -> Result<(String, Finish)> {
    let mut text = String::new();
    while let Some(ev) = rx.recv().await {
        match ev {
            Event::Text(t) => text.push_str(&t),
            Event::Done(f) => return Ok((text, *f)),
            Event::Failed(e) => return Err(e),
        }
    }
    Err(ServerError::ShuttingDown)
}

/// A server-sent event stream of `format`'s payloads. The first event is awaited before the
/// response starts, so a request that fails at once gets its error status. When the client
/// leaves, the stream and with it the receiver are dropped, which cancels the generation.
async fn sse<F>(mut rx: mpsc::UnboundedReceiver<Event>, mut format: F) -> Result<Response>
where
    F: FnMut(Event) -> Vec<String> + Send + 'static,
{
    let first = match rx.recv().await {
        Some(Event::Failed(e)) => return Err(e),
        Some(ev) => ev,
        None => return Err(ServerError::ShuttingDown),
    };
    let (tx, body_rx) = mpsc::channel::<std::result::Result<Bytes, Infallible>>(64);
    tokio::spawn(async move {
        let mut next = Some(first);
        loop {
            let ev = match next.take() {
                Some(ev) => ev,
                None => tokio::select! {
                    _ = tx.closed() => return,
                    ev = rx.recv() => match ev {
                        Some(ev) => ev,
                        None => return,
                    },
                },
            };
            let end = !matches!(ev, Event::Text(_));
            for data in format(ev) {
                let bytes = Bytes::from(format!("data: {data}\n\n"));
                if tx.send(Ok(bytes)).await.is_err() {
                    return;
                }
            }
            if end {
                return;
            }
        }
    });
    Ok((
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(ReceiverStream::new(body_rx)),
    )
        .into_response())
}

/// OpenAI's `usage`, with the cached prompt tokens.
fn usage(f: &Finish) -> Value {
    json!({
        "prompt_tokens": f.n_prompt,
        "completion_tokens": f.predicted_n,
        "total_tokens": f.n_prompt + f.predicted_n,
        "prompt_tokens_details": { "cached_tokens": f.cache_n },
    })
}

/// llama-server's `timings`.
fn timings(f: &Finish) -> Value {
    let per = |n: usize, ms: f64| {
        if n == 0 {
            (0.0, 0.0)
        } else {
            (
                ms / n as f64,
                if ms > 0.0 { n as f64 * 1e3 / ms } else { 0.0 },
            )
        }
    };
    let (p_tok, p_sec) = per(f.prompt_n, f.prompt_ms);
    let (g_tok, g_sec) = per(f.predicted_n, f.predicted_ms);
    json!({
        "cache_n": f.cache_n,
        "prompt_n": f.prompt_n,
        "prompt_ms": f.prompt_ms,
        "prompt_per_token_ms": p_tok,
        "prompt_per_second": p_sec,
        "predicted_n": f.predicted_n,
        "predicted_ms": f.predicted_ms,
        "predicted_per_token_ms": g_tok,
        "predicted_per_second": g_sec,
    })
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A response id unique within this process (and, by the time in it, across restarts).
fn new_id(prefix: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}-{:x}{n:04x}", unix_now())
}

/// A seed for requests that ask for a random one.
fn random_seed() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    nanos
        ^ NEXT
            .fetch_add(1, Ordering::Relaxed)
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
}
