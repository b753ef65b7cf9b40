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
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::{AppState, RawBody};
use crate::error::{Result, ServerError};
use crate::request::{self, CompletionApi, Limits, Prompt};
use crate::scheduler::{Command, Event, Finish, FinishReason, GenParams, Job};

/// `POST /v1/chat/completions`.
pub async fn chat(State(st): State<Arc<AppState>>, RawBody(body): RawBody) -> Result<Response> {
    let limits = st.limits();
    let req = request::chat(&body, &limits)?;
    let text = super::render_chat(&st, req.messages.clone()).await?;
    let prompt = chat_tokens(&st, &text)?;
    let mut rx = submit(&st, &limits, prompt.clone(), req.params)?;
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
    if !req.stream {
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
    RawBody(body): RawBody,
) -> Result<Response> {
    let limits = st.limits();
    let req = request::completion(&body, &limits, CompletionApi::OpenAi)?;
    let prompt = prompt_tokens(&st, req.prompt)?;
    let mut rx = submit(&st, &limits, prompt, req.params)?;
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
    if !req.stream {
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
    RawBody(body): RawBody,
) -> Result<Response> {
    let limits = st.limits();
    let req = request::completion(&body, &limits, CompletionApi::Native)?;
    let prompt = prompt_tokens(&st, req.prompt)?;
    let mut rx = submit(&st, &limits, prompt, req.params)?;
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
    if !req.stream {
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
fn prompt_tokens(st: &AppState, prompt: Prompt) -> Result<Vec<u32>> {
    match prompt {
        Prompt::Text(t) => Ok(st.model.tokenizer().encode(&t, true, true)?),
        Prompt::Tokens(ids) => Ok(ids),
    }
}

/// Checks the prompt and queues it; the receiver gets the request's events.
fn submit(
    st: &AppState,
    limits: &Limits,
    prompt: Vec<u32>,
    params: GenParams,
) -> Result<mpsc::UnboundedReceiver<Event>> {
    request::check_prompt(&prompt, limits)?;
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
