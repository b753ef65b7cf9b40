//! `POST /api/generate`: a prompt, rendered with the model's chat template (with `system`),
//! with the request's `template` (the subset of [`super::template`]), or sent as it is
//! (`raw`). `context`, the tokens an earlier answer gave back, goes before it; the answer
//! gives back the tokens of prompt and reply as the next `context`, as llama.cpp's old API
//! did.

use std::sync::Arc;
use std::time::Instant;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde_json::{json, Map, Value};

use super::options::{self, Extras};
use super::template::{self, Values};
use super::{parse_body, refuse_set, stream_flag, Line, Meta, OllamaError};
use crate::error::ServerError;
use crate::request::{self, CompletionApi};
use crate::routes::turn::{self, Reader};
use crate::routes::{generate, sse, AppState, ClientKey, RawBody};
use crate::scheduler::Event;

/// `POST /api/generate`.
pub async fn generate(
    State(st): State<Arc<AppState>>,
    Extension(client): Extension<ClientKey>,
    body: Result<RawBody, ServerError>,
) -> Response {
    match create(st, client, body).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

/// The fields of a generate request.
const KNOWN: &[&str] = &[
    "model",
    "prompt",
    "suffix",
    "system",
    "template",
    "context",
    "raw",
    "images",
    "format",
    "options",
    "stream",
    "keep_alive",
    "think",
    "logprobs",
    "top_logprobs",
    "width",
    "height",
    "steps",
];

/// A generate request's fields, checked.
struct Fields<'a> {
    prompt: &'a str,
    suffix: &'a str,
    system: &'a str,
    template: &'a str,
    raw: bool,
    context: Vec<u32>,
}

/// A generation queued: its run, its prompt's tokens, and how its text is read.
struct Queued {
    run: generate::Run,
    prompt: Vec<u32>,
    /// Splits thinking out of a reply rendered with the chat template; `None` for a raw or
    /// templated prompt, whose reply is given as it is.
    reader: Option<Reader>,
}

async fn create(
    st: Arc<AppState>,
    client: ClientKey,
    body: Result<RawBody, ServerError>,
) -> Result<Response, OllamaError> {
    let started = Instant::now();
    let body = parse_body(body)?;
    super::log_unknown(&st, "/api/generate", &body, KNOWN);
    let mut meta = Meta::new(&st, &body, started);
    let stream = stream_flag(&body)?;
    let fields = fields(&body)?;
    let mut sampling = Map::new();
    let extras = options::apply(&st, &body, &mut sampling)?;
    if fields.prompt.is_empty() {
        let mut extra = Map::new();
        extra.insert("response".into(), json!(""));
        return Ok(meta.loaded(extra));
    }
    let queued = if fields.raw || !fields.template.is_empty() {
        queue_text(&st, &client, &fields, sampling, &extras)?
    } else {
        queue_chat(&st, &client, &fields, sampling, &extras).await?
    };
    meta.queued = started.elapsed();
    let Queued {
        run,
        prompt,
        mut reader,
    } = queued;
    let model = Arc::clone(&st.model);
    if !stream {
        let reply = generate::collect_all(vec![run])
            .await?
            .pop()
            .ok_or(ServerError::ShuttingDown)?;
        let (mut content, mut thinking) = read(&mut reader, &reply.text);
        let (c, t) = finish(&mut reader);
        content.push_str(&c);
        thinking.push_str(&t);
        let f = &reply.finish;
        let mut v = meta.done(f);
        v.insert("response".into(), json!(content));
        if !thinking.is_empty() {
            v.insert("thinking".into(), json!(thinking));
        }
        v.insert("context".into(), context_after(&prompt, &f.tokens));
        if extras.logprobs {
            v.insert(
                "logprobs".into(),
                super::logprobs(model.tokenizer(), &f.probs),
            );
        }
        return Ok(Json(Value::Object(v)).into_response());
    }
    let want_probs = extras.logprobs;
    let format = move |_, ev: Event| -> Vec<Line> {
        match ev {
            Event::Progress(_) => Vec::new(),
            Event::Text(chunk) => {
                let probs = want_probs.then(|| super::logprobs(model.tokenizer(), &chunk.probs));
                line(&meta, read(&mut reader, &chunk.text), probs)
                    .into_iter()
                    .collect()
            }
            Event::Done(f) => {
                let mut out: Vec<Line> =
                    line(&meta, finish(&mut reader), None).into_iter().collect();
                let mut last = meta.done(&f);
                last.insert("response".into(), json!(""));
                last.insert("context".into(), context_after(&prompt, &f.tokens));
                out.push(Line(Value::Object(last)));
                out
            }
            Event::Failed(e) => vec![Line(OllamaError::from(e).json())],
        }
    };
    Ok(sse::stream(vec![run], format, Vec::new()).await?)
}

/// The request's prompt fields, checked: strings, `raw` a boolean, `context` token ids; images
/// and image generation refused by name.
fn fields(body: &Map<String, Value>) -> Result<Fields<'_>, OllamaError> {
    let text = |name: &str| match body.get(name) {
        None | Some(Value::Null) => Ok(""),
        Some(Value::String(s)) => Ok(s.as_str()),
        Some(other) => Err(OllamaError::bad(format!("{name}: {other} is not a string"))),
    };
    if body.get("images").is_some_and(|v| !v.is_null()) {
        let empty = body["images"].as_array().is_some_and(Vec::is_empty);
        if !empty {
            return Err(OllamaError::no_images("images"));
        }
    }
    for field in ["width", "height", "steps"] {
        refuse_set(
            body,
            field,
            "image generation is not supported: this server runs a text model",
        )?;
    }
    let raw = match body.get("raw") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(other) => return Err(OllamaError::bad(format!("raw: {other} is not a boolean"))),
    };
    let context = match body.get("context") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(ids)) => ids
            .iter()
            .map(|id| {
                id.as_u64()
                    .and_then(|id| u32::try_from(id).ok())
                    .ok_or_else(|| OllamaError::bad(format!("context: {id} is not a token id")))
            })
            .collect::<Result<_, _>>()?,
        Some(other) => {
            return Err(OllamaError::bad(format!(
                "context: {other} is not a list of token ids"
            )))
        }
    };
    let f = Fields {
        prompt: text("prompt")?,
        suffix: text("suffix")?,
        system: text("system")?,
        template: text("template")?,
        raw,
        context,
    };
    if f.raw {
        let why = "a raw prompt is sent as it is: write it into the prompt";
        refuse_set(body, "system", why)?;
        refuse_set(body, "suffix", why)?;
        refuse_set(
            body,
            "template",
            "a raw prompt is rendered with no template",
        )?;
    } else if f.template.is_empty() && !f.suffix.is_empty() {
        return Err(OllamaError::bad(
            "suffix: the model's chat template has no fill-in-the-middle slot; send a template \
             with {{ .Prompt }} and {{ .Suffix }} (and the model's infill tokens), or leave \
             suffix out",
        ));
    }
    Ok(f)
}

/// Queues a prompt rendered with the model's chat template (a system message, then the
/// prompt as the user's), after the request's `context`.
async fn queue_chat(
    st: &Arc<AppState>,
    client: &ClientKey,
    f: &Fields<'_>,
    mut body: Map<String, Value>,
    extras: &Extras,
) -> Result<Queued, OllamaError> {
    let mut messages = Vec::new();
    if !f.system.is_empty() {
        messages.push(json!({ "role": "system", "content": f.system }));
    }
    messages.push(json!({ "role": "user", "content": f.prompt }));
    body.insert("messages".into(), Value::Array(messages));
    let req = turn::chat_request(st, Value::Object(body))?;
    let mut turn = turn::prepare(st, &req).await?;
    if !f.context.is_empty() {
        // The rendered turn continues the earlier tokens: no beginning-of-sequence token.
        let mut tokens = f.context.clone();
        tokens.extend(st.model.tokenizer().encode(&turn.text, false, true)?);
        turn.prompt = tokens;
    }
    options::cap_to_num_ctx(
        &mut turn.params.max_tokens,
        turn.prompt.len(),
        extras.num_ctx,
    );
    let run = turn.start(st, client)?;
    Ok(Queued {
        run,
        reader: Some(turn.reader()),
        prompt: turn.prompt,
    })
}

/// Queues a raw prompt, or one rendered with the request's template, after the request's
/// `context`, through the completion endpoint's reader.
fn queue_text(
    st: &Arc<AppState>,
    client: &ClientKey,
    f: &Fields<'_>,
    mut body: Map<String, Value>,
    extras: &Extras,
) -> Result<Queued, OllamaError> {
    let text = if f.raw {
        f.prompt.to_owned()
    } else {
        let values = Values {
            system: f.system,
            prompt: f.prompt,
            suffix: f.suffix,
        };
        template::render(f.template, &values)?
    };
    let tok = st.model.tokenizer();
    let mut prompt = f.context.clone();
    prompt.extend(tok.encode(&text, f.context.is_empty(), true)?);
    body.insert("prompt".into(), json!(prompt));
    // Only the chat template reads `think`; a raw reply is given as it is.
    body.remove("chat_template_kwargs");
    let mut limits = st.limits();
    // The body was held to the size limit as sent; its conversion is not.
    limits.max_body = usize::MAX;
    let bytes =
        serde_json::to_vec(&Value::Object(body)).map_err(|e| OllamaError::bad(e.to_string()))?;
    let req = request::completion(&bytes, &limits, CompletionApi::Native)?;
    let mut params = generate::resolve(st, req.params)?;
    options::cap_to_num_ctx(&mut params.max_tokens, prompt.len(), extras.num_ctx);
    let run = generate::submit_all(
        st,
        client,
        &limits,
        std::slice::from_ref(&prompt),
        &params,
        1,
    )?
    .pop()
    .ok_or(ServerError::ShuttingDown)?;
    Ok(Queued {
        run,
        prompt,
        reader: None,
    })
}

/// The text and thinking of more of the reply.
fn read(reader: &mut Option<Reader>, text: &str) -> (String, String) {
    match reader {
        Some(r) => super::split(r.feed(text)),
        None => (text.to_owned(), String::new()),
    }
}

/// The text and thinking held back until the reply's end.
fn finish(reader: &mut Option<Reader>) -> (String, String) {
    match reader {
        Some(r) => super::split(r.finish()),
        None => Default::default(),
    }
}

/// The streamed line of more of the reply; none when there is nothing to say.
fn line(meta: &Meta, (content, thinking): (String, String), probs: Option<Value>) -> Option<Line> {
    if content.is_empty() && thinking.is_empty() && probs.is_none() {
        return None;
    }
    let mut m = meta.head();
    m.insert("response".into(), json!(content));
    if !thinking.is_empty() {
        m.insert("thinking".into(), json!(thinking));
    }
    if let Some(p) = probs {
        m.insert("logprobs".into(), p);
    }
    Some(Line(Value::Object(m)))
}

/// The `context` an answer gives back: the prompt's tokens, then the reply's.
fn context_after(prompt: &[u32], reply: &[u32]) -> Value {
    json!(prompt.iter().chain(reply).collect::<Vec<_>>())
}
