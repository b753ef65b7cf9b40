//! Request bodies: from the bytes a client sends to the checked values the handlers use.
//!
//! Nothing here needs the model: what a check compares against (context, vocabulary, slots,
//! the command line's defaults) comes in a [`Limits`]. Every function gives either the checked
//! request or a [`ServerError`] whose status is 400 or 413 (501 for a field asking for a
//! capability this server lacks), and none panics on any input. The
//! HTTP handlers call these functions; so does the fuzz target in `server/fuzz`.
//!
//! A checked request keeps these bounds:
//! - every sampling float is finite, and `id_slot` names an existing slot;
//! - a chat has at least one message;
//! - a prompt given as token ids (and a `/detokenize` list) holds ids inside the vocabulary,
//!   and such a prompt is not empty and leaves one position of the context to generate;
//! - a slot action names an existing slot, and a save or restore names a plain file name.

pub use engine::constraint::Grammar;
pub use engine::sampling::SamplerParams;
use serde::de::DeserializeOwned;
use serde::Deserialize;

use crate::error::{Result, ServerError};
use crate::scheduler::{GenParams, SlotAction};

mod sampling;

use sampling::gen_params;
pub use sampling::BiasTarget;

/// Longest slot filename.
pub const MAX_FILENAME: usize = 100;

/// What request checks compare against: the server's figures and defaults.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Largest body accepted, in bytes (`--max-body`).
    pub max_body: usize,
    /// Positions per request.
    pub n_ctx: usize,
    /// Tokens in the vocabulary.
    pub n_vocab: usize,
    /// Slots.
    pub n_slots: usize,
    /// Default tokens to generate, negative for as many as the context allows (`-n`).
    pub n_predict: i64,
    /// Default seed, negative for a random one per request (`--seed`).
    pub seed: i64,
    /// The command line's sampling defaults (`--temp`, `--top-k`, …; its seed is unused).
    pub sampler: SamplerParams,
    /// Requests ignore end-of-generation tokens unless they say otherwise (`--ignore-eos`).
    pub ignore_eos: bool,
    /// Requests reuse cached prompts unless they say otherwise (`--no-cache-prompt` clears).
    pub cache_prompt: bool,
    /// DRY's sequence breakers unless a request gives its own (`None`: llama-server's).
    pub dry_breakers: Option<Vec<String>>,
    /// A generation that fills its context drops older tokens and goes on (`--context-shift`).
    pub context_shift: bool,
    /// Prompt tokens a context shift keeps unless a request says otherwise (`--keep`).
    pub n_keep: i64,
    /// Smallest chunk reused by shifting unless a request says otherwise (`--cache-reuse`).
    pub cache_reuse: usize,
}

/// `stop`: one string or several.
#[derive(Deserialize)]
#[serde(untagged)]
enum Stop {
    One(String),
    Many(Vec<String>),
}

/// Settings every generating endpoint accepts: llama-server's and OpenAI's names.
#[derive(Default, Deserialize)]
struct Sampling {
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<i64>,
    min_p: Option<f32>,
    seed: Option<i64>,
    repeat_penalty: Option<f32>,
    repeat_last_n: Option<i64>,
    frequency_penalty: Option<f32>,
    presence_penalty: Option<f32>,
    stop: Option<Stop>,
    cache_prompt: Option<bool>,
    cache_salt: Option<String>,
    cache_ttl: Option<i64>,
    id_slot: Option<i64>,
    ignore_eos: Option<bool>,
    #[serde(default)]
    stream: bool,
    /// llama-server's `n_probs`: the most likely tokens at each step, with probabilities.
    n_probs: Option<i64>,
    post_sampling_probs: Option<bool>,
    /// OpenAI's `logprobs` (a bool for chat, a count for completions) and `top_logprobs`.
    logprobs: Option<serde_json::Value>,
    top_logprobs: Option<i64>,
    n: Option<i64>,
    return_tokens: Option<bool>,
    response_fields: Option<Vec<String>>,
    timings_per_token: Option<bool>,
    return_progress: Option<bool>,
    /// llama-server's per-request speculative settings.
    #[serde(rename = "speculative.n_max")]
    spec_n_max: Option<i64>,
    #[serde(rename = "speculative.n_min")]
    spec_n_min: Option<i64>,
    #[serde(rename = "speculative.p_min")]
    spec_p_min: Option<f32>,
    t_max_predict_ms: Option<i64>,
    n_indent: Option<i64>,
    n_keep: Option<i64>,
    n_discard: Option<i64>,
    n_cache_reuse: Option<i64>,
    min_keep: Option<i64>,
    verbose: Option<bool>,
    logit_bias: Option<serde_json::Value>,
    typical_p: Option<f32>,
    xtc_probability: Option<f32>,
    xtc_threshold: Option<f32>,
    dry_multiplier: Option<f32>,
    dry_base: Option<f32>,
    dry_allowed_length: Option<i64>,
    dry_penalty_last_n: Option<i64>,
    dry_sequence_breakers: Option<Vec<String>>,
    mirostat: Option<i64>,
    mirostat_tau: Option<f32>,
    mirostat_eta: Option<f32>,
    top_n_sigma: Option<f32>,
    dynatemp_range: Option<f32>,
    dynatemp_exponent: Option<f32>,
    samplers: Option<serde_json::Value>,
    // Pending: accepted at their "off" values only.
    grammar: Option<String>,
    json_schema: Option<serde_json::Value>,
    response_format: Option<serde_json::Value>,
    lora: Option<serde_json::Value>,
}

/// `POST /v1/chat/completions` body as sent.
#[derive(Deserialize)]
struct ChatBody {
    #[serde(flatten)]
    chat: ChatFields,
    max_tokens: Option<i64>,
    max_completion_tokens: Option<i64>,
    n_predict: Option<i64>,
    #[serde(flatten)]
    sampling: Sampling,
}

/// `POST /v1/completions` and `POST /completion` body as sent; the prompt is read by
/// [`prompts`].
#[derive(Deserialize)]
struct CompletionBody {
    prompt: Option<serde_json::Value>,
    max_tokens: Option<i64>,
    n_predict: Option<i64>,
    #[serde(flatten)]
    sampling: Sampling,
}

/// `POST /tokenize` body as sent.
#[derive(Deserialize)]
struct TokenizeBody {
    content: String,
    #[serde(default)]
    add_special: bool,
    #[serde(default = "yes")]
    parse_special: bool,
    #[serde(default)]
    with_pieces: bool,
}

fn yes() -> bool {
    true
}

/// `POST /detokenize` body as sent.
#[derive(Deserialize)]
struct DetokenizeBody {
    tokens: Vec<u32>,
}

/// `POST /apply-template` body as sent.
#[derive(Deserialize)]
struct TemplateBody {
    #[serde(flatten)]
    chat: ChatFields,
}

/// What a chat body gives the template: OpenAI's and llama-server's fields.
#[derive(Deserialize)]
struct ChatFields {
    messages: Option<serde_json::Value>,
    tools: Option<Vec<serde_json::Value>>,
    tool_choice: Option<serde_json::Value>,
    parallel_tool_calls: Option<bool>,
    add_generation_prompt: Option<bool>,
    continue_final_message: Option<bool>,
    chat_template_kwargs: Option<serde_json::Map<String, serde_json::Value>>,
    reasoning_format: Option<String>,
}

/// `POST /slots/{id}` body as sent.
#[derive(Default, Deserialize)]
struct SlotBody {
    filename: Option<String>,
    #[serde(default)]
    overwrite: bool,
}

/// How a response is shaped, beyond what is generated.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Output {
    /// Answer as server-sent events.
    pub stream: bool,
    /// llama-server: the generated token ids in `tokens`.
    pub return_tokens: bool,
    /// llama-server: only these fields (`a/b` picks a nested one), when not empty.
    pub response_fields: Vec<String>,
    /// Choices per prompt (OpenAI's `n`).
    pub n: usize,
    /// Probabilities asked for: llama-server's `n_probs`, or OpenAI's `logprobs`.
    pub probs: Option<Probs>,
    /// llama-server: timings in every streamed chunk.
    pub timings_per_token: bool,
    /// llama-server: the prompt in `__verbose` (`None`: the server's `--verbose`).
    pub verbose: Option<bool>,
}

/// Which probabilities a response reports for each generated token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Probs {
    /// The most likely tokens listed beside the chosen one.
    pub top: usize,
    /// Probabilities after the sampler chain (llama-server's `post_sampling_probs`) rather
    /// than log-probabilities of the model's distribution.
    pub post_sampling: bool,
}

/// A checked chat: what the template renders, and how the reply is read.
#[derive(Clone, Debug, Default)]
pub struct Chat {
    /// The messages, OpenAI's objects (never empty; each has a string `role`, and a `content`
    /// that is a string, null or a list of text parts).
    pub messages: Vec<serde_json::Value>,
    /// Tools the template is given (`None` when absent or empty).
    pub tools: Option<Vec<serde_json::Value>>,
    /// OpenAI's `tool_choice` as sent (`None`: `auto`).
    pub tool_choice: Option<serde_json::Value>,
    /// Several tool calls in one reply may be made.
    pub parallel_tool_calls: bool,
    /// End the prompt where the assistant's reply starts.
    pub add_generation_prompt: bool,
    /// Continue the final assistant message (`Some(true)` asked, `None` not said).
    pub continue_final_message: Option<bool>,
    /// Template variables of this request (`chat_template_kwargs`).
    pub kwargs: serde_json::Map<String, serde_json::Value>,
    /// Where reasoning goes in the reply (`None`: the server's `--reasoning-format`).
    pub reasoning_format: Option<String>,
}

/// A checked chat request.
#[derive(Debug)]
pub struct ChatRequest {
    /// The conversation and what the template gets.
    pub chat: Chat,
    /// How to generate.
    pub params: GenParams,
    /// How to answer.
    pub output: Output,
}

/// One piece of a prompt: text to tokenize or a token id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Piece {
    /// Text, tokenized with the model's special tokens (a beginning-of-sequence token is added
    /// when the prompt starts with text).
    Text(String),
    /// A token id (checked against the vocabulary).
    Token(u32),
}

/// A completion prompt: its pieces in order (never empty).
pub type Prompt = Vec<Piece>;

/// A checked completion request.
#[derive(Debug)]
pub struct CompletionRequest {
    /// The prompts (one or more; each gets its own answer).
    pub prompts: Vec<Prompt>,
    /// How to generate.
    pub params: GenParams,
    /// How to answer.
    pub output: Output,
}

/// Which completion endpoint a body came to: they differ in which length field wins.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompletionApi {
    /// OpenAI's `/v1/completions`: `max_tokens` before `n_predict`.
    OpenAi,
    /// llama.cpp's `/completion`: `n_predict` before `max_tokens`.
    Native,
}

/// A checked `/tokenize` request.
#[derive(Debug, PartialEq, Eq)]
pub struct TokenizeRequest {
    /// The text.
    pub content: String,
    /// Add the beginning-of-sequence token.
    pub add_special: bool,
    /// Read special tokens' texts as those tokens.
    pub parse_special: bool,
    /// Answer each id with its text.
    pub with_pieces: bool,
}

/// Parses a JSON body into `T`: over `max_body` bytes is 413, anything that does not parse
/// is 400. An empty (or all-whitespace) body reads as `null`, for endpoints whose body is
/// optional.
pub fn json_body<T: DeserializeOwned>(bytes: &[u8], max_body: usize) -> Result<T> {
    if bytes.len() > max_body {
        return Err(ServerError::BodyTooLarge { limit: max_body });
    }
    let text: &[u8] = if bytes.iter().all(u8::is_ascii_whitespace) {
        b"null"
    } else {
        bytes
    };
    serde_json::from_slice(text).map_err(|e| ServerError::BadJson {
        reason: e.to_string(),
    })
}

/// A `/v1/chat/completions` body.
pub fn chat(bytes: &[u8], limits: &Limits) -> Result<ChatRequest> {
    let body: ChatBody = json_body(bytes, limits.max_body)?;
    let chat = chat_fields(body.chat)?;
    let max = body
        .max_completion_tokens
        .or(body.max_tokens)
        .or(body.n_predict);
    let params = gen_params(limits, &body.sampling, max)?;
    let output = output(&body.sampling, CompletionApi::OpenAi, true)?;
    Ok(ChatRequest {
        chat,
        params,
        output,
    })
}

/// A `/v1/completions` or `/completion` body.
pub fn completion(bytes: &[u8], limits: &Limits, api: CompletionApi) -> Result<CompletionRequest> {
    let body: CompletionBody = json_body(bytes, limits.max_body)?;
    let max = match api {
        CompletionApi::OpenAi => body.max_tokens.or(body.n_predict),
        CompletionApi::Native => body.n_predict.or(body.max_tokens),
    };
    let params = gen_params(limits, &body.sampling, max)?;
    let prompts = prompts(body.prompt.as_ref(), limits)?;
    let output = output(&body.sampling, api, false)?;
    Ok(CompletionRequest {
        prompts,
        params,
        output,
    })
}

/// Longest list of prompts in one request.
pub const MAX_PROMPTS: usize = 64;

/// The prompts of a completion body, as llama-server reads `prompt`: a string; token ids; a
/// list mixing ids and strings (one prompt); `{"prompt_string": ...}`; or a list of any of
/// those but the mixed one (several prompts).
pub fn prompts(prompt: Option<&serde_json::Value>, limits: &Limits) -> Result<Vec<Prompt>> {
    use serde_json::Value;
    let Some(prompt) = prompt else {
        return Err(ServerError::BadRequest("\"prompt\" is required".into()));
    };
    let bad = |what: String| ServerError::BadRequest(what);
    let one = |v: &Value| -> Result<Prompt> {
        let piece = |v: &Value| -> Result<Piece> {
            match v {
                Value::String(s) => Ok(Piece::Text(s.clone())),
                Value::Number(n) => Ok(Piece::Token(token_id(n, limits)?)),
                other => Err(bad(format!(
                    "a prompt holds strings and token ids, not {other}"
                ))),
            }
        };
        let pieces = match v {
            Value::String(s) => vec![Piece::Text(s.clone())],
            Value::Array(items) => items.iter().map(piece).collect::<Result<_>>()?,
            Value::Object(map) => {
                if map.contains_key("multimodal_data") {
                    return Err(ServerError::NotEnabled {
                        what: "multimodal prompts",
                        how: "this server reads text only",
                    });
                }
                match map.get("prompt_string") {
                    Some(Value::String(s)) => vec![Piece::Text(s.clone())],
                    _ => return Err(bad("a prompt object needs \"prompt_string\"".into())),
                }
            }
            other => return Err(bad(format!("{other} is not a prompt"))),
        };
        if pieces.is_empty() {
            return Err(bad("the prompt is empty".into()));
        }
        Ok(pieces)
    };
    let list: Vec<Prompt> = match prompt {
        // A list with a token id at its top level is one prompt mixing ids and text.
        Value::Array(items) if !items.iter().any(Value::is_number) => {
            if items.is_empty() {
                return Err(bad("the prompt is empty".into()));
            }
            items.iter().map(one).collect::<Result<_>>()?
        }
        v => vec![one(v)?],
    };
    if list.len() > MAX_PROMPTS {
        return Err(bad(format!(
            "{} prompts in one request; at most {MAX_PROMPTS}",
            list.len()
        )));
    }
    Ok(list)
}

/// The response's shape from a body's settings.
fn output(s: &Sampling, api: CompletionApi, chat: bool) -> Result<Output> {
    let n = match s.n {
        None => 1,
        Some(n) if (1..=16).contains(&n) => n as usize,
        Some(n) => {
            return Err(ServerError::BadRequest(format!(
                "\"n\" is {n}; 1 to 16 are served"
            )))
        }
    };
    // OpenAI's chat `logprobs` is a bool with `top_logprobs`; its completions' `logprobs` is
    // the count; llama-server's `n_probs` is the count on every endpoint.
    let count = |v: i64, field: &str| -> Result<usize> {
        if (0..=20).contains(&v) {
            Ok(v as usize)
        } else {
            Err(ServerError::BadRequest(format!(
                "\"{field}\" is {v}; 0 to 20 are served"
            )))
        }
    };
    let openai = match (&s.logprobs, chat) {
        (None | Some(serde_json::Value::Null), _) => None,
        (Some(serde_json::Value::Bool(false)), _) => None,
        (Some(serde_json::Value::Bool(true)), _) => {
            Some(count(s.top_logprobs.unwrap_or(0), "top_logprobs")?)
        }
        (Some(serde_json::Value::Number(k)), false) => {
            Some(count(k.as_i64().unwrap_or(-1), "logprobs")?)
        }
        (Some(other), _) => {
            return Err(ServerError::BadRequest(format!(
                "\"logprobs\" is {other}; {} expected",
                if chat { "true or false" } else { "a count" }
            )))
        }
    };
    let native = match s.n_probs {
        None | Some(0) => None,
        Some(k) => Some(count(k, "n_probs")?),
    };
    let probs = native.or(openai).map(|top| Probs {
        top,
        post_sampling: s.post_sampling_probs.unwrap_or(false),
    });
    let _ = api;
    Ok(Output {
        stream: s.stream,
        return_tokens: s.return_tokens.unwrap_or(false),
        response_fields: s.response_fields.clone().unwrap_or_default(),
        n,
        probs,
        timings_per_token: s.timings_per_token.unwrap_or(false),
        verbose: s.verbose,
    })
}

/// A `/tokenize` body.
pub fn tokenize(bytes: &[u8], limits: &Limits) -> Result<TokenizeRequest> {
    let body: TokenizeBody = json_body(bytes, limits.max_body)?;
    Ok(TokenizeRequest {
        content: body.content,
        add_special: body.add_special,
        parse_special: body.parse_special,
        with_pieces: body.with_pieces,
    })
}

/// A `/detokenize` body: its ids, every one inside the vocabulary.
pub fn detokenize(bytes: &[u8], limits: &Limits) -> Result<Vec<u32>> {
    let body: DetokenizeBody = json_body(bytes, limits.max_body)?;
    check_tokens(&body.tokens, limits)?;
    Ok(body.tokens)
}

/// An `/apply-template` body: the chat to render.
pub fn apply_template(bytes: &[u8], limits: &Limits) -> Result<Chat> {
    let body: TemplateBody = json_body(bytes, limits.max_body)?;
    chat_fields(body.chat)
}

/// A `/slots/{id}?action=...` request: the path's id, the query's action and the body (a
/// `filename` for save and restore). Gives the slot and what to do with it.
pub fn slot_action(
    id: &str,
    action: Option<&str>,
    bytes: &[u8],
    limits: &Limits,
) -> Result<(usize, SlotAction)> {
    let body: Option<SlotBody> = json_body(bytes, limits.max_body)?;
    let id: usize = id
        .parse()
        .map_err(|_| ServerError::BadRequest(format!("slot id {id:?} is not a number")))?;
    if id >= limits.n_slots {
        return Err(ServerError::UnknownSlot {
            id,
            n_slots: limits.n_slots,
        });
    }
    let body = body.unwrap_or_default();
    let filename = || -> Result<String> {
        let name = body
            .filename
            .clone()
            .ok_or_else(|| ServerError::BadRequest("\"filename\" is required".into()))?;
        check_filename(&name)?;
        Ok(name)
    };
    let action = match action {
        Some("save") => SlotAction::Save {
            name: filename()?,
            overwrite: body.overwrite,
        },
        Some("restore") => SlotAction::Restore(filename()?),
        Some("erase") => SlotAction::Erase,
        Some(other) => {
            return Err(ServerError::BadRequest(format!(
                "unknown action {other:?}: save, restore or erase"
            )))
        }
        None => return Err(ServerError::BadRequest("the query needs ?action=".into())),
    };
    Ok((id, action))
}

/// A prompt the scheduler can take: not empty, one position short of the context at most,
/// every id inside the vocabulary.
pub fn check_prompt(prompt: &[u32], limits: &Limits) -> Result<()> {
    if prompt.is_empty() {
        return Err(ServerError::BadRequest("the prompt is empty".into()));
    }
    if prompt.len() >= limits.n_ctx {
        return Err(ServerError::PromptTooLong {
            n_prompt: prompt.len(),
            n_ctx: limits.n_ctx,
        });
    }
    check_tokens(prompt, limits)
}

/// A JSON number as a token id inside the vocabulary.
fn token_id(n: &serde_json::Number, limits: &Limits) -> Result<u32> {
    let id = n
        .as_u64()
        .and_then(|id| u32::try_from(id).ok())
        .ok_or_else(|| ServerError::BadRequest(format!("{n} is not a token id")))?;
    check_tokens(&[id], limits)?;
    Ok(id)
}

/// Every id inside the vocabulary.
fn check_tokens(tokens: &[u32], limits: &Limits) -> Result<()> {
    match tokens.iter().find(|&&t| t as usize >= limits.n_vocab) {
        Some(&id) => Err(ServerError::BadToken {
            id,
            n_vocab: limits.n_vocab,
        }),
        None => Ok(()),
    }
}

/// A slot filename is a checkpoint name: no path separators, no `..`, nothing hidden, not a
/// name of the prompt cache's own tails, at most [`MAX_FILENAME`] bytes.
pub fn check_filename(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= MAX_FILENAME
        && !name.starts_with('.')
        && !name.starts_with(promptcache::TAIL_PREFIX)
        && !name.contains("..")
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if ok {
        Ok(())
    } else {
        Err(ServerError::BadFilename { name: name.into() })
    }
}

/// A chat's fields checked: messages as llama-server accepts them (objects with a string
/// role and a content that is a string, null or text parts; a conversation does not end with
/// two assistant messages), and `add_generation_prompt` with `continue_final_message` not both.
fn chat_fields(f: ChatFields) -> Result<Chat> {
    use serde_json::Value;
    let bad = |what: String| ServerError::BadRequest(what);
    let messages = match f.messages {
        Some(Value::Array(m)) if !m.is_empty() => m,
        Some(Value::Array(_)) => return Err(bad("\"messages\" is empty".into())),
        Some(other) => return Err(bad(format!("\"messages\" is {other}; a list expected"))),
        None => return Err(bad("\"messages\" is required".into())),
    };
    for (i, m) in messages.iter().enumerate() {
        let Some(obj) = m.as_object() else {
            return Err(bad(format!("message {i} is not an object")));
        };
        match obj.get("role") {
            Some(Value::String(_)) => {}
            _ => return Err(bad(format!("message {i} has no string \"role\""))),
        }
        match obj.get("content") {
            None | Some(Value::Null | Value::String(_)) => {}
            Some(Value::Array(parts)) => {
                for p in parts {
                    match (p.get("type").and_then(Value::as_str), p.get("text")) {
                        (Some("text"), Some(Value::String(_))) => {}
                        (Some(kind @ ("image_url" | "input_audio" | "image" | "file")), _) => {
                            return Err(ServerError::Unsupported(format!(
                                "content parts of type {kind:?} need a multimodal model; this server reads text"
                            )))
                        }
                        _ => return Err(bad(format!("message {i}: {p} is not a text part"))),
                    }
                }
            }
            Some(other) => {
                return Err(bad(format!(
                    "message {i}: content {other} is neither text nor a list of parts"
                )))
            }
        }
    }
    let role = |m: &Value| m.get("role").and_then(Value::as_str).map(str::to_owned);
    if let [.., a, b] = messages.as_slice() {
        if role(a).as_deref() == Some("assistant") && role(b).as_deref() == Some("assistant") {
            return Err(bad(
                "the conversation ends with two assistant messages".into()
            ));
        }
    }
    let add_generation_prompt = f.add_generation_prompt.unwrap_or(true);
    if f.continue_final_message == Some(true) {
        if f.add_generation_prompt == Some(true) {
            return Err(bad(
                "\"continue_final_message\" and \"add_generation_prompt\" cannot both be true"
                    .into(),
            ));
        }
        if messages.last().and_then(role).as_deref() != Some("assistant") {
            return Err(bad(
                "\"continue_final_message\" needs a final assistant message".into(),
            ));
        }
    }
    if let Some(Value::String(choice)) = &f.tool_choice {
        if !matches!(choice.as_str(), "auto" | "none" | "required") {
            return Err(bad(format!(
                "\"tool_choice\" is {choice:?}: auto, none or required"
            )));
        }
    }
    Ok(Chat {
        messages,
        tools: f.tools.filter(|t| !t.is_empty()),
        tool_choice: f.tool_choice,
        parallel_tool_calls: f.parallel_tool_calls.unwrap_or(false),
        add_generation_prompt: add_generation_prompt && f.continue_final_message != Some(true),
        continue_final_message: f.continue_final_message,
        kwargs: f.chat_template_kwargs.unwrap_or_default(),
        reasoning_format: f.reasoning_format,
    })
}

/// A body's `cache_ttl` in seconds: a positive integer when given; the error says why not.
pub fn cache_ttl(body: &serde_json::Value) -> std::result::Result<Option<u64>, &'static str> {
    match body.get("cache_ttl") {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .filter(|&t| t > 0)
            .map(Some)
            .ok_or("cache_ttl must be a positive number of seconds"),
    }
}

/// A body's `cache_salt` (vLLM's field): a non-empty string when given; the error says why not.
pub fn cache_salt(body: &serde_json::Value) -> std::result::Result<Option<String>, &'static str> {
    match body.get("cache_salt") {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::String(s)) if !s.is_empty() => Ok(Some(s.clone())),
        Some(_) => Err("cache_salt must be a non-empty string"),
    }
}

/// The settings a request that sets nothing generates with (`/props` shows them).
pub fn defaults(limits: &Limits) -> Result<(GenParams, Output)> {
    let none = Sampling::default();
    Ok((
        gen_params(limits, &none, None)?,
        output(&none, CompletionApi::Native, false)?,
    ))
}

#[cfg(test)]
mod tests;
