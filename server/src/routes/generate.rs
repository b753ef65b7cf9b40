//! The generating endpoints: `/v1/chat/completions`, `/v1/completions` (OpenAI's shapes) and
//! `/completion` (llama.cpp's native one), streamed as server-sent events or answered whole.
//!
//! A handler tokenizes on its own thread, checks each prompt against the context, hands one
//! [`Job`] per prompt and choice to the scheduler and turns the events it gets back into JSON
//! (the shapes are in [`super::shape`]). When the client goes away the handler's receivers are
//! dropped, which cancels the generations at the next step.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::shape::{self, Reply};
use super::{sse, AppState, RawBody};
use crate::error::{Result, ServerError};
use crate::request::{self, CompletionApi, Limits, Piece, Prompt};
use crate::scheduler::{Command, Event, GenParams, Job};

/// `POST /v1/chat/completions`: the reply read as reasoning, text and tool calls (the tools'
/// family format, from the template), whole or streamed as OpenAI streams them.
pub async fn chat(
    State(st): State<Arc<AppState>>,
    Extension(client): Extension<super::ClientKey>,
    RawBody(body): RawBody,
) -> Result<Response> {
    let limits = st.limits();
    let req = request::chat(&body, &limits)?;
    let turn = Arc::new(super::turn::prepare(&st, &req).await?);
    let runs = submit_all(
        &st,
        &client,
        &limits,
        std::slice::from_ref(&turn.prompt),
        &turn.params,
        req.output.n,
    )?;
    let verbose = req
        .output
        .verbose
        .unwrap_or(st.config.args.verbose)
        .then(|| st.model.tokenizer().decode(&turn.prompt));
    let meta = shape::Meta::new(&st, "chatcmpl");
    let tok = Arc::clone(&st.model);
    if !req.output.stream {
        let replies = collect_all(runs).await?;
        for r in &replies {
            turn.remember(&st, &client, &r.text, &r.finish);
        }
        let mut body = shape::chat_whole(&meta, &replies, &req.output, &turn, tok.tokenizer());
        if let Some(prompt) = verbose {
            body["__verbose"] = json!({ "prompt": prompt });
        }
        return Ok(Json(body).into_response());
    }
    let readers = (0..runs.len()).map(|_| turn.reader()).collect();
    let mut state = shape::ChatStream::new(meta, req.output.clone(), readers);
    let st2 = Arc::clone(&st);
    sse::stream(
        runs,
        move |index, ev| {
            if let Event::Done(f) = &ev {
                turn.remember(&st2, &client, state.text(index), f);
            }
            state.event(index, ev, tok.tokenizer())
        },
        vec![sse::DONE.to_owned()],
    )
    .await
}

/// `POST /chat/completions/input_tokens`: how many tokens a chat's prompt takes.
pub async fn chat_input_tokens(
    State(st): State<Arc<AppState>>,
    RawBody(body): RawBody,
) -> Result<Json<Value>> {
    super::info::rouse(&st).await;
    let limits = st.limits();
    let req = request::chat(&body, &limits)?;
    let text = super::render_chat(&st, &req.chat).await?;
    let prompt = chat_tokens(&st, text).await?;
    Ok(Json(
        json!({ "object": "response.input_tokens", "input_tokens": prompt.len() }),
    ))
}

/// Keeps `text` (a prompt and its reply) with the tokens it was evaluated as, in the index at
/// once (its files are written by the index's own thread) and, with a remote tier, in Redis
/// (off this thread), so the next turn keeps them on any replica.
pub(super) fn remember_text(st: &AppState, text: String, tokens: Vec<u32>) {
    if let Some(store) = st.store.as_ref().filter(|s| s.has_remote()) {
        if let Some(entry) = crate::texts::remote_entry(&text, &tokens) {
            let store = Arc::clone(store);
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn_blocking(move || {
                    let _ = store.push_remote_values(crate::texts::REMOTE_KIND, &[entry]);
                });
            }
        }
    }
    if let Ok(mut texts) = st.texts.lock() {
        texts.insert(text, tokens);
    }
}

/// With a remote tier: the longest entry in Redis that `text` starts with and that is longer
/// than `local` bytes. An entry ends where a reply ended, so the candidates are the places
/// where an end-of-generation token's text follows in `text` (the last few turns), asked for
/// in one round trip.
fn remote_text(st: &AppState, text: &str, local: usize) -> Option<(usize, Vec<u32>)> {
    let store = st.store.as_ref().filter(|s| s.has_remote())?;
    let tok = st.model.tokenizer();
    let markers: Vec<&str> = tok
        .eog_tokens()
        .iter()
        .map(|&t| tok.token_text(t))
        .filter(|m| !m.is_empty())
        .collect();
    let mut ends: Vec<usize> = markers
        .iter()
        .flat_map(|m| text.match_indices(m).map(|(i, _)| i))
        .filter(|&i| i > local)
        .collect();
    ends.sort_unstable_by(|a, b| b.cmp(a));
    ends.dedup();
    ends.truncate(8);
    if ends.is_empty() {
        return None;
    }
    let names: Vec<String> = ends
        .iter()
        .map(|&i| crate::texts::remote_name(&text[..i]))
        .collect();
    let values = store.fetch_remote_values(crate::texts::REMOTE_KIND, &names);
    let (end, tokens) = ends.iter().zip(values).find_map(|(&i, v)| {
        crate::texts::remote_tokens(&text[..i], &v?).map(|tokens| (i, tokens))
    })?;
    if let Ok(mut texts) = st.texts.lock() {
        texts.insert(text[..end].to_owned(), tokens.clone());
        texts.remote_hits += 1;
    }
    Some((end, tokens))
}

/// The tokens of a rendered chat prompt: the longest text evaluated before (an earlier turn
/// with its reply, here or, with a remote tier, on another replica) keeps the tokens it was
/// evaluated as; only the rest is tokenized. On a blocking thread: it may ask Redis, and it
/// checks the result against a whole tokenization.
pub(super) async fn chat_tokens(st: &Arc<AppState>, text: String) -> Result<Vec<u32>> {
    let st = Arc::clone(st);
    tokio::task::spawn_blocking(move || chat_tokens_here(&st, &text))
        .await
        .map_err(|_| ServerError::ShuttingDown)?
}

/// [`chat_tokens`] on this thread.
fn chat_tokens_here(st: &AppState, text: &str) -> Result<Vec<u32>> {
    let tok = st.model.tokenizer();
    let local = st
        .texts
        .lock()
        .ok()
        .and_then(|mut t| t.longest_prefix(text));
    let known = remote_text(st, text, local.as_ref().map_or(0, |l| l.0)).or(local);
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
    Extension(client): Extension<super::ClientKey>,
    RawBody(body): RawBody,
) -> Result<Response> {
    complete(st, client, body, CompletionApi::OpenAi).await
}

/// `POST /completion`: llama.cpp's native endpoint.
pub async fn completion(
    State(st): State<Arc<AppState>>,
    Extension(client): Extension<super::ClientKey>,
    RawBody(body): RawBody,
) -> Result<Response> {
    complete(st, client, body, CompletionApi::Native).await
}

/// Both completion endpoints: every prompt (and choice) of the request generated at once.
async fn complete(
    st: Arc<AppState>,
    client: super::ClientKey,
    body: Bytes,
    api: CompletionApi,
) -> Result<Response> {
    let limits = st.limits();
    let req = request::completion(&body, &limits, api)?;
    let prompts = req
        .prompts
        .iter()
        .map(|p| prompt_tokens(&st, p))
        .collect::<Result<Vec<_>>>()?;
    let params = resolve(&st, req.params)?;
    let runs = submit_all(&st, &client, &limits, &prompts, &params, req.output.n)?;
    let meta = shape::Meta::new(&st, "cmpl");
    let tok = Arc::clone(&st.model);
    let settings = shape::generation_settings(&params, &req.output, &st);
    let prompt_texts: Vec<String> = prompts
        .iter()
        .map(|p| st.model.tokenizer().decode(p))
        .collect();
    let n_choices = req.output.n;
    let prompt_of = move |index: usize| prompt_texts[index / n_choices].clone();
    if !req.output.stream {
        let replies = collect_all(runs).await?;
        let body = match api {
            CompletionApi::OpenAi => {
                shape::openai_completion_whole(&meta, &replies, &req.output, tok.tokenizer())
            }
            CompletionApi::Native => {
                let mut all: Vec<Value> = replies
                    .iter()
                    .map(|r| {
                        shape::native_final(
                            &meta,
                            r,
                            &r.text,
                            &req.output,
                            &settings,
                            &prompt_of(r.index),
                            tok.tokenizer(),
                        )
                    })
                    .collect();
                if all.len() == 1 {
                    all.remove(0)
                } else {
                    Value::Array(all)
                }
            }
        };
        return Ok(Json(body).into_response());
    }
    match api {
        CompletionApi::OpenAi => {
            let output = req.output.clone();
            sse::stream(
                runs,
                move |index, ev| {
                    shape::openai_completion_event(&meta, &output, index, ev, tok.tokenizer())
                },
                vec![sse::DONE.to_owned()],
            )
            .await
        }
        CompletionApi::Native => {
            let output = req.output.clone();
            let mut reply_texts = vec![String::new(); runs.len()];
            sse::stream(
                runs,
                move |index, ev| match ev {
                    Event::Text(chunk) => {
                        reply_texts[index].push_str(&chunk.text);
                        vec![
                            shape::native_chunk(&meta, index, &chunk, &output, tok.tokenizer())
                                .to_string(),
                        ]
                    }
                    Event::Progress(p) => {
                        let mut v = json!({
                            "index": index,
                            "content": "",
                            "tokens": [],
                            "stop": false,
                            "prompt_progress": shape::progress(&p),
                        });
                        if output.timings_per_token {
                            v["timings"] = shape::progress_timings(&p);
                        }
                        vec![v.to_string()]
                    }
                    Event::Done(f) => {
                        let r = Reply {
                            index,
                            text: String::new(),
                            finish: *f,
                        };
                        let mut last = shape::native_final(
                            &meta,
                            &r,
                            "",
                            &output,
                            &settings,
                            &prompt_of(index),
                            tok.tokenizer(),
                        );
                        // The stream's last event carries no text of its own.
                        if let Some(o) = last.as_object_mut() {
                            o.insert("tokens".into(), json!([]));
                            o.remove("completion_probabilities");
                        }
                        vec![last.to_string()]
                    }
                    Event::Failed(e) => vec![e.to_json().to_string()],
                },
                Vec::new(),
            )
            .await
        }
    }
}

/// A completion prompt as tokens: text pieces tokenized with the model's special tokens (a
/// beginning-of-sequence token added when the prompt starts with text), ids as they are.
pub(super) fn prompt_tokens(st: &AppState, prompt: &Prompt) -> Result<Vec<u32>> {
    let tok = st.model.tokenizer();
    let mut out = Vec::new();
    for (i, piece) in prompt.iter().enumerate() {
        match piece {
            Piece::Text(t) => out.extend(tok.encode(t, i == 0, true)?),
            Piece::Token(id) => out.push(*id),
        }
    }
    Ok(out)
}

/// One generation in flight: its place in the response and its events.
pub(super) struct Run {
    /// Its index among the response's choices (prompt-major, then choice).
    pub index: usize,
    /// What the scheduler sends it.
    pub rx: mpsc::UnboundedReceiver<Event>,
}

/// Checks every prompt, then queues `n` generations of each (the k-th choice with seed
/// `seed + k`): nothing is queued unless every prompt fits.
pub(super) fn submit_all(
    st: &AppState,
    client: &super::ClientKey,
    limits: &Limits,
    prompts: &[Vec<u32>],
    params: &GenParams,
    n: usize,
) -> Result<Vec<Run>> {
    for p in prompts {
        request::check_prompt(p, limits)?;
    }
    let constraint = match &params.grammar {
        None => None,
        Some(g) => {
            // Compiling may take a while (it runs on a thread of the engine's own); this
            // worker's other tasks move to other workers meanwhile.
            let compiled = off_worker(|| {
                let vocab = st.vocab()?;
                engine::constraint::Constraint::new(&vocab, g)
                    .map_err(|e| ServerError::BadRequest(format!("invalid grammar: {e}")))
            });
            Some(compiled?)
        }
    };
    let mut runs = Vec::with_capacity(prompts.len() * n);
    for p in prompts {
        for k in 0..n {
            let mut params = params.clone();
            params.sampler.seed = params.sampler.seed.wrapping_add(k as u64);
            params.namespace = st.namespace(client, params.cache_salt.as_deref());
            let (events, rx) = mpsc::unbounded_channel();
            st.tx
                .send(Command::Generate(Box::new(Job {
                    prompt: p.clone(),
                    params,
                    events,
                    constraint: constraint.clone(),
                })))
                .map_err(|_| ServerError::ShuttingDown)?;
            runs.push(Run {
                index: runs.len(),
                rx,
            });
        }
    }
    Ok(runs)
}

/// Runs the blocking `f` on this thread without stalling the tasks queued behind it: on a
/// multi-threaded runtime they are handed to other workers first.
pub(super) fn off_worker<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(f)
        }
        _ => f(),
    }
}

/// Tokenizes what a request gave as text: `logit_bias` targets (every token of the text gets
/// the bias) and DRY's sequence breakers (llama-server's defaults when none were given); and,
/// as llama-server does, turns `ignore_eos` into a ban of every end-of-generation token.
pub(super) fn resolve(st: &AppState, mut params: GenParams) -> Result<GenParams> {
    let tok = st.model.tokenizer();
    if params.ignore_eos {
        for &id in tok.eog_tokens() {
            params.sampler.logit_bias.push((id, f32::NEG_INFINITY));
        }
    }
    for (target, bias) in std::mem::take(&mut params.bias) {
        match target {
            request::BiasTarget::Token(id) => params.sampler.logit_bias.push((id, bias)),
            request::BiasTarget::Text(text) => {
                for id in tok.encode(&text, false, false)? {
                    params.sampler.logit_bias.push((id, bias));
                }
            }
        }
    }
    if params.sampler.dry_multiplier > 0.0 {
        let defaults: Vec<String> = engine::sampling::DEFAULT_DRY_SEQUENCE_BREAKERS
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
        let breakers = params.dry_breakers.take().unwrap_or(defaults);
        params.sampler.dry_sequence_breakers = engine::sampling::dry_breakers_from_strings(
            &breakers,
            st.model.hparams().n_vocab,
            |id| tok.token_bytes(id).to_vec(),
            |text| tok.encode(text, false, false).unwrap_or_default(),
        );
    }
    Ok(params)
}

/// Waits for every generation's whole text; the first failure fails the request.
pub(super) async fn collect_all(runs: Vec<Run>) -> Result<Vec<Reply>> {
    let mut replies = Vec::with_capacity(runs.len());
    for mut run in runs {
        let mut text = String::new();
        let finish = loop {
            match run.rx.recv().await {
                Some(Event::Text(chunk)) => {
                    text.push_str(&chunk.text);
                }
                Some(Event::Progress(_)) => {}
                Some(Event::Done(f)) => break *f,
                Some(Event::Failed(e)) => return Err(e),
                None => return Err(ServerError::ShuttingDown),
            }
        };
        replies.push(Reply {
            index: run.index,
            text,
            finish,
        });
    }
    Ok(replies)
}
