//! Request bodies: from the bytes a client sends to the checked values the handlers use.
//!
//! Nothing here needs the model: what a check compares against (context, vocabulary, slots,
//! the command line's defaults) comes in a [`Limits`]. Every function gives either the checked
//! request or a [`ServerError`] whose status is 400 or 413, and none panics on any input. The
//! HTTP handlers call these functions; so does the fuzz target in `server/fuzz`.
//!
//! A checked request keeps these bounds:
//! - every sampling float is finite, and `id_slot` names an existing slot;
//! - a chat has at least one message;
//! - a prompt given as token ids (and a `/detokenize` list) holds ids inside the vocabulary,
//!   and such a prompt is not empty and leaves one position of the context to generate;
//! - a slot action names an existing slot, and a save or restore names a plain file name.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use engine::chat::Message;
use engine::sampling::SamplerParams;
use serde::de::DeserializeOwned;
use serde::Deserialize;

use crate::error::{Result, ServerError};
use crate::scheduler::{GenParams, SlotAction};

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
    /// Default temperature (`--temp`).
    pub temp: f32,
    /// Default seed, negative for a random one per request (`--seed`).
    pub seed: i64,
}

/// One chat message as clients send it.
#[derive(Deserialize)]
struct ChatMessage {
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

/// `POST /v1/chat/completions` body as sent.
#[derive(Deserialize)]
struct ChatBody {
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
enum PromptBody {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<u32>),
}

/// `POST /v1/completions` and `POST /completion` body as sent.
#[derive(Deserialize)]
struct CompletionBody {
    prompt: PromptBody,
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
    messages: Vec<ChatMessage>,
}

/// `POST /slots/{id}` body as sent.
#[derive(Default, Deserialize)]
struct SlotBody {
    filename: Option<String>,
}

/// A checked chat request.
#[derive(Debug)]
pub struct ChatRequest {
    /// The conversation (never empty).
    pub messages: Vec<Message>,
    /// How to generate.
    pub params: GenParams,
    /// Answer as server-sent events.
    pub stream: bool,
}

/// A completion prompt.
#[derive(Debug, PartialEq, Eq)]
pub enum Prompt {
    /// Text, tokenized with the model's special tokens.
    Text(String),
    /// Token ids (checked with [`check_prompt`]).
    Tokens(Vec<u32>),
}

/// A checked completion request.
#[derive(Debug)]
pub struct CompletionRequest {
    /// The prompt.
    pub prompt: Prompt,
    /// How to generate.
    pub params: GenParams,
    /// Answer as server-sent events.
    pub stream: bool,
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
    let messages = chat_messages(&body.messages)?;
    let max = body
        .max_completion_tokens
        .or(body.max_tokens)
        .or(body.n_predict);
    let params = gen_params(limits, &body.sampling, max)?;
    Ok(ChatRequest {
        messages,
        params,
        stream: body.sampling.stream,
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
    let prompt = match body.prompt {
        PromptBody::Text(t) => Prompt::Text(t),
        PromptBody::Texts(mut ts) if ts.len() == 1 => Prompt::Text(ts.remove(0)),
        PromptBody::Texts(ts) => {
            return Err(ServerError::BadRequest(format!(
                "one prompt per request is supported, not {}",
                ts.len()
            )))
        }
        PromptBody::Tokens(ids) => {
            check_prompt(&ids, limits)?;
            Prompt::Tokens(ids)
        }
    };
    Ok(CompletionRequest {
        prompt,
        params,
        stream: body.sampling.stream,
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

/// An `/apply-template` body: its messages (never empty).
pub fn apply_template(bytes: &[u8], limits: &Limits) -> Result<Vec<Message>> {
    let body: TemplateBody = json_body(bytes, limits.max_body)?;
    chat_messages(&body.messages)
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
        Some("save") => SlotAction::Save(filename()?),
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
        && !name.starts_with(engine::store::TAIL_PREFIX)
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

/// The engine's messages from the client's.
fn chat_messages(messages: &[ChatMessage]) -> Result<Vec<Message>> {
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

/// The generation settings of a request, with the server's defaults.
fn gen_params(limits: &Limits, s: &Sampling, max_tokens: Option<i64>) -> Result<GenParams> {
    let max_tokens = match max_tokens.filter(|&m| m >= 0).unwrap_or(limits.n_predict) {
        m if m < 0 => usize::MAX,
        m => usize::try_from(m).unwrap_or(usize::MAX),
    };
    let seed = match s.seed.filter(|&s| s >= 0).unwrap_or(limits.seed) {
        s if s < 0 => random_seed(),
        s => s.unsigned_abs(),
    };
    let d = SamplerParams::default();
    let sampler = SamplerParams {
        temperature: s.temperature.unwrap_or(limits.temp),
        top_k: s.top_k.unwrap_or(d.top_k),
        top_p: s.top_p.unwrap_or(d.top_p),
        min_p: s.min_p.unwrap_or(d.min_p),
        repeat_penalty: s.repeat_penalty.unwrap_or(d.repeat_penalty),
        frequency_penalty: s.frequency_penalty.unwrap_or(d.frequency_penalty),
        presence_penalty: s.presence_penalty.unwrap_or(d.presence_penalty),
        seed,
        ..d
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
            return Err(ServerError::BadRequest(format!(
                "\"{name}\" is out of range for a 32-bit float"
            )));
        }
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
    Ok(GenParams {
        max_tokens,
        sampler,
        stop,
        cache_prompt: s.cache_prompt.unwrap_or(true),
        id_slot,
        ignore_eos: s.ignore_eos,
    })
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

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        Limits {
            max_body: 1 << 20,
            n_ctx: 8,
            n_vocab: 100,
            n_slots: 2,
            n_predict: -1,
            temp: 0.8,
            seed: 5,
        }
    }

    fn status(e: &ServerError) -> u16 {
        e.status().as_u16()
    }

    #[test]
    fn slot_filenames_cannot_leave_the_store() {
        for bad in ["", "../x", "a/b", "/abs", "a\\b", "..", ".hidden", "a..b"] {
            assert!(check_filename(bad).is_err(), "{bad:?} was accepted");
        }
        for good in ["chat1", "agent.v2", "a-b_c"] {
            assert!(check_filename(good).is_ok(), "{good:?} was refused");
        }
    }

    #[test]
    fn a_body_over_the_limit_is_413_and_bad_json_is_400() {
        let small = Limits {
            max_body: 10,
            ..limits()
        };
        let e = tokenize(br#"{"content": "too long"}"#, &small).unwrap_err();
        assert_eq!(status(&e), 413);
        let e = tokenize(br#"{"content": 1}"#, &limits()).unwrap_err();
        assert!(matches!(e, ServerError::BadJson { .. }), "{e}");
    }

    #[test]
    fn the_length_field_that_wins_depends_on_the_endpoint() {
        let body = br#"{"prompt": [1, 2], "max_tokens": 3, "n_predict": 4}"#;
        let openai = completion(body, &limits(), CompletionApi::OpenAi).unwrap();
        let native = completion(body, &limits(), CompletionApi::Native).unwrap();
        assert_eq!(openai.params.max_tokens, 3);
        assert_eq!(native.params.max_tokens, 4);
        assert_eq!(native.prompt, Prompt::Tokens(vec![1, 2]));
        // Unset and negative lengths fall back to the server's default (-1: no limit).
        let chat = chat(
            br#"{"messages": [{"role": "user"}], "max_tokens": -3}"#,
            &limits(),
        )
        .unwrap();
        assert_eq!(chat.params.max_tokens, usize::MAX);
        assert_eq!(chat.params.sampler.seed, 5);
    }

    #[test]
    fn token_prompts_and_slots_are_checked_against_the_server() {
        let l = limits();
        for (body, code) in [
            (&br#"{"prompt": []}"#[..], 400),
            (br#"{"prompt": [1, 2, 3, 4, 5, 6, 7, 8]}"#, 400),
            (br#"{"prompt": [100]}"#, 400),
            (br#"{"prompt": ["a", "b"]}"#, 400),
            (br#"{"prompt": "x", "id_slot": 2}"#, 400),
        ] {
            let e = completion(body, &l, CompletionApi::Native).unwrap_err();
            assert_eq!(status(&e), code, "{e}");
        }
        assert!(detokenize(br#"{"tokens": [99, 100]}"#, &l).is_err());
        assert_eq!(detokenize(br#"{"tokens": [99]}"#, &l).unwrap(), vec![99]);
        assert!(matches!(
            slot_action("1", Some("erase"), b"", &l),
            Ok((1, SlotAction::Erase))
        ));
        assert!(slot_action("2", Some("erase"), b"", &l).is_err());
        assert!(slot_action("0", Some("save"), br#"{"filename": "../x"}"#, &l).is_err());
        assert!(slot_action("0", None, b"", &l).is_err());
    }

    #[test]
    fn sampling_values_past_f32_are_refused() {
        // 1e39 is a valid JSON number but no finite f32: it would reach the sampler as infinity.
        for field in [
            "temperature",
            "top_p",
            "min_p",
            "repeat_penalty",
            "frequency_penalty",
            "presence_penalty",
        ] {
            for value in ["1e39", "-1e39"] {
                let body = format!(r#"{{"prompt": "x", "{field}": {value}}}"#);
                let e = completion(body.as_bytes(), &limits(), CompletionApi::OpenAi).unwrap_err();
                assert_eq!(status(&e), 400, "{field} = {value}: {e}");
                assert!(e.to_string().contains(field), "{e}");
            }
        }
        let ok = completion(
            br#"{"prompt": "x", "temperature": 3e38}"#,
            &limits(),
            CompletionApi::OpenAi,
        )
        .unwrap();
        assert_eq!(ok.params.sampler.temperature, 3e38);
    }
}
