//! A Responses request as a chat request: its fields, tools and `input` items, and a
//! conversation's items as chat messages.

use axum::response::IntoResponse;
use serde_json::{json, Map, Value};

use super::{bad, Asked, Fail, KNOWN};
use crate::error::ServerError;
use crate::routes::turn;

/// The chat body of a request (messages set by the caller) and what else it asks.
pub(super) fn convert(obj: &Map<String, Value>) -> Result<(Value, Asked), Fail> {
    let mut chat = Map::new();
    for (k, v) in obj {
        if turn::LLAMA_FIELDS.contains(&k.as_str()) {
            chat.insert(k.clone(), v.clone());
        } else if !KNOWN.contains(&k.as_str()) {
            return Err(bad(format!("Unknown parameter: '{k}'.")));
        }
    }
    refuse_unsupported(obj)?;
    let max_calls = match obj.get("max_tool_calls") {
        None | Some(Value::Null) => None,
        Some(v) => Some(
            v.as_u64()
                .ok_or_else(|| bad("'max_tool_calls' must be a count"))?,
        ),
    };
    let input = match obj.get("input") {
        Some(Value::String(s)) => vec![json!({
            "type": "message",
            "role": "user",
            "content": [{ "type": "input_text", "text": s }],
        })],
        Some(Value::Array(items)) => items.clone(),
        Some(_) => return Err(bad("'input' must be a string or a list of items")),
        None => return Err(bad("'input' is required")),
    };
    let instructions = match obj.get("instructions") {
        None | Some(Value::Null) => Value::Null,
        Some(Value::String(s)) => json!(s),
        Some(_) => return Err(bad("'instructions' must be a string")),
    };
    let previous = match obj.get("previous_response_id") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => return Err(bad("'previous_response_id' must be a string")),
    };
    let mut tools = Vec::new();
    if let Some(list) = obj.get("tools").filter(|t| !t.is_null()) {
        let list = list
            .as_array()
            .ok_or_else(|| bad("'tools' must be a list"))?;
        for t in list {
            tools.push(convert_tool(t)?);
        }
    }
    if !tools.is_empty() {
        chat.insert("tools".into(), Value::Array(tools.clone()));
    }
    let choice = obj.get("tool_choice").filter(|c| !c.is_null());
    if let Some(c) = choice {
        let openai = match c {
            Value::String(s) if matches!(s.as_str(), "auto" | "none" | "required") => c.clone(),
            Value::Object(o) if o.get("type").and_then(Value::as_str) == Some("function") => {
                let name = o
                    .get("name")
                    .or_else(|| o.get("function").and_then(|f| f.get("name")))
                    .and_then(Value::as_str)
                    .ok_or_else(|| bad("'tool_choice' of type function needs a name"))?;
                json!({ "type": "function", "function": { "name": name } })
            }
            other => {
                return Err(unsupported(&format!(
                    "'tool_choice' {other} is not supported: auto, none, required or a function"
                )))
            }
        };
        chat.insert("tool_choice".into(), openai);
    }
    let parallel = obj
        .get("parallel_tool_calls")
        .and_then(Value::as_bool)
        .unwrap_or(true);
    // `max_tool_calls`: 0 is no tool call, 1 one call at most; more than one cannot be held
    // to a count by the grammar, so it is refused rather than ignored.
    let parallel = match max_calls {
        None => parallel,
        Some(0) => {
            chat.insert("tool_choice".into(), json!("none"));
            false
        }
        Some(1) => false,
        Some(_) if !parallel => false,
        Some(n) => {
            return Err(unsupported(&format!(
                "\"max_tool_calls\": {n}: calls are not counted; give 0 or 1, or \
                 \"parallel_tool_calls\": false"
            )))
        }
    };
    chat.insert("parallel_tool_calls".into(), json!(parallel));
    match obj.get("max_output_tokens") {
        None | Some(Value::Null) => {}
        Some(v) => match v.as_i64() {
            Some(n) if n >= 1 => {
                chat.insert("max_tokens".into(), json!(n));
            }
            _ => {
                return Err(bad(format!(
                    "'max_output_tokens' is {v}; an integer of at least 1 is required"
                )))
            }
        },
    }
    let stream = match obj.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(v) => return Err(bad(format!("'stream' is {v}; a boolean is required"))),
    };
    chat.insert("stream".into(), json!(stream));
    let store = obj.get("store").and_then(Value::as_bool).unwrap_or(true);
    text_format(obj, &mut chat)?;
    if let Some(effort) = obj
        .get("reasoning")
        .and_then(|r| r.get("effort"))
        .and_then(Value::as_str)
    {
        // Templates that take an effort (gpt-oss) read `reasoning_effort`.
        let kwargs = chat
            .entry("chat_template_kwargs")
            .or_insert_with(|| json!({}));
        if let Some(k) = kwargs.as_object_mut() {
            k.entry("reasoning_effort").or_insert(json!(effort));
        }
    }
    let echo = echo(obj, choice, parallel, store, &instructions);
    Ok((
        Value::Object(chat),
        Asked {
            stream,
            store,
            instructions,
            previous,
            input,
            echo,
        },
    ))
}

/// A refusal of what this server does not do (501).
fn unsupported(what: &str) -> Fail {
    Fail::new(ServerError::Unsupported(what.into()).into_response())
}

/// Refuses the fields asking what this server does not do: background responses, conversation
/// objects, stored prompts, automatic truncation, and `include` of anything but encrypted
/// reasoning.
fn refuse_unsupported(obj: &Map<String, Value>) -> Result<(), Fail> {
    if obj.get("background").and_then(Value::as_bool) == Some(true) {
        return Err(unsupported(
            "\"background\": responses are generated while the request waits",
        ));
    }
    if obj.get("conversation").is_some_and(|c| !c.is_null()) {
        return Err(unsupported(
            "\"conversation\": this server keeps no conversation objects; use previous_response_id",
        ));
    }
    if obj.get("prompt").is_some_and(|c| !c.is_null()) {
        return Err(unsupported(
            "\"prompt\": this server has no stored prompt templates",
        ));
    }
    match obj.get("truncation") {
        None | Some(Value::Null) => {}
        Some(Value::String(t)) if t == "disabled" => {}
        Some(Value::String(t)) if t == "auto" => {
            return Err(unsupported(
                "\"truncation\": \"auto\": a conversation longer than the context is refused \
                 (as with \"disabled\"), not cut",
            ))
        }
        Some(other) => {
            return Err(bad(format!(
                "'truncation' is {other}; 'disabled' or 'auto'"
            )))
        }
    }
    // Encrypted reasoning has nothing to carry here: reasoning items hold their text, which
    // the client sends back as it is. Nothing else that `include` can ask for is produced.
    if let Some(list) = obj.get("include").filter(|v| !v.is_null()) {
        let list = list
            .as_array()
            .ok_or_else(|| bad("'include' must be a list"))?;
        if let Some(x) = list
            .iter()
            .find(|x| x.as_str() != Some("reasoning.encrypted_content"))
        {
            return Err(unsupported(&format!(
                "\"include\": {x} is not produced by this server"
            )));
        }
    }
    Ok(())
}

/// `text.format` as the chat's `response_format` or `json_schema`.
fn text_format(obj: &Map<String, Value>, chat: &mut Map<String, Value>) -> Result<(), Fail> {
    if let Some(format) = obj
        .get("text")
        .and_then(|t| t.get("format"))
        .filter(|f| !f.is_null())
    {
        match format.get("type").and_then(Value::as_str) {
            Some("text") => {}
            Some("json_object") => {
                chat.insert("response_format".into(), json!({ "type": "json_object" }));
            }
            Some("json_schema") => {
                let schema = format
                    .get("schema")
                    .filter(|s| s.is_object())
                    .ok_or_else(|| bad("'text.format' json_schema needs a 'schema' object"))?;
                chat.insert("json_schema".into(), schema.clone());
            }
            _ => {
                return Err(bad(format!(
                    "'text.format' {format} is not text, json_object or json_schema"
                )))
            }
        }
    }
    Ok(())
}

/// The request's settings as the response echoes them.
fn echo(
    obj: &Map<String, Value>,
    choice: Option<&Value>,
    parallel: bool,
    store: bool,
    instructions: &Value,
) -> Map<String, Value> {
    let mut echo = Map::new();
    for key in [
        "max_output_tokens",
        "temperature",
        "top_p",
        "metadata",
        "user",
        "reasoning",
        "text",
    ] {
        echo.insert(key.into(), obj.get(key).cloned().unwrap_or(Value::Null));
    }
    echo.insert(
        "tools".into(),
        Value::Array(
            obj.get("tools")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default(),
        ),
    );
    echo.insert(
        "tool_choice".into(),
        choice.cloned().unwrap_or_else(|| json!("auto")),
    );
    echo.insert("parallel_tool_calls".into(), json!(parallel));
    echo.insert("store".into(), json!(store));
    echo.insert("instructions".into(), instructions.clone());
    echo.insert(
        "truncation".into(),
        obj.get("truncation")
            .cloned()
            .unwrap_or_else(|| json!("disabled")),
    );
    echo
}

/// A Responses function tool as an OpenAI chat tool; other kinds of tools are refused.
fn convert_tool(t: &Value) -> Result<Value, Fail> {
    match t.get("type").and_then(Value::as_str) {
        Some("function") => {}
        other => {
            return Err(Fail::new(
                ServerError::Unsupported(format!(
                    "tools of type {} are not supported; only function tools",
                    other.unwrap_or("(none)")
                ))
                .into_response(),
            ))
        }
    }
    // The chat form (`function: {...}`) is read too.
    let f = t.get("function").unwrap_or(t);
    let name = f
        .get("name")
        .and_then(Value::as_str)
        .ok_or_else(|| bad("a function tool needs a 'name'"))?;
    let mut function = json!({
        "name": name,
        "parameters": f.get("parameters").filter(|p| p.is_object()).cloned().unwrap_or_else(|| json!({ "type": "object" })),
    });
    if let Some(d) = f.get("description").and_then(Value::as_str) {
        function["description"] = json!(d);
    }
    Ok(json!({ "type": "function", "function": function }))
}

/// The text of a message's content: a string, or text parts (`input_text`, `output_text`,
/// `text`, `refusal`); images and files are for multimodal models.
fn content_parts(content: &Value) -> Result<Value, Fail> {
    let parts = match content {
        Value::String(s) => return Ok(json!(s)),
        Value::Array(parts) => parts,
        Value::Null => return Ok(json!("")),
        other => {
            return Err(bad(format!(
                "message content {other} is neither text nor parts"
            )))
        }
    };
    let mut out = Vec::new();
    for p in parts {
        match p.get("type").and_then(Value::as_str) {
            Some("input_text" | "output_text" | "text") => {
                let text = p
                    .get("text")
                    .and_then(Value::as_str)
                    .ok_or_else(|| bad(format!("content part {p} has no 'text'")))?;
                out.push(json!({ "type": "text", "text": text }));
            }
            Some("refusal") => {
                let text = p.get("refusal").and_then(Value::as_str).unwrap_or("");
                out.push(json!({ "type": "text", "text": text }));
            }
            Some("input_image" | "input_file" | "input_audio") => return Err(Fail::new(
                ServerError::Unsupported(
                    "image, file and audio input need a multimodal model; this server reads text"
                        .into(),
                )
                .into_response(),
            )),
            _ => return Err(bad(format!("content part {p} is not understood"))),
        }
    }
    Ok(Value::Array(out))
}

/// The plain text of converted content.
fn flat(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts.iter().filter_map(|p| p["text"].as_str()).collect(),
        _ => String::new(),
    }
}

/// A conversation's items as OpenAI chat messages. An assistant's reasoning, text and calls
/// of one turn (consecutive items) make one assistant message.
pub(super) fn to_messages(items: &[Value]) -> Result<Vec<Value>, Fail> {
    let mut out: Vec<Value> = Vec::new();
    for item in items {
        let kind =
            item.get("type")
                .and_then(Value::as_str)
                .unwrap_or(if item.get("role").is_some() {
                    "message"
                } else {
                    ""
                });
        let last_assistant = out.last().is_some_and(|m| m["role"] == "assistant");
        match kind {
            "message" => {
                let role = match item.get("role").and_then(Value::as_str) {
                    Some("developer") => "system",
                    Some(r @ ("user" | "system" | "assistant")) => r,
                    other => {
                        return Err(bad(format!(
                            "a message's role is {other:?}: user, system, developer or assistant"
                        )))
                    }
                };
                let content = content_parts(item.get("content").unwrap_or(&Value::Null))?;
                if role != "assistant" {
                    out.push(json!({ "role": role, "content": content }));
                    continue;
                }
                let text = flat(&content);
                match out.last_mut() {
                    Some(m) if last_assistant && m.get("tool_calls").is_none() => {
                        let joined = format!("{}{text}", flat(&m["content"]));
                        m["content"] = json!(joined);
                    }
                    _ => out.push(json!({ "role": "assistant", "content": text })),
                }
            }
            "function_call" => {
                let (Some(call_id), Some(name)) = (
                    item.get("call_id").and_then(Value::as_str),
                    item.get("name").and_then(Value::as_str),
                ) else {
                    return Err(bad("a function_call item needs 'call_id' and 'name'"));
                };
                let arguments = match item.get("arguments") {
                    Some(Value::String(s)) => s.clone(),
                    None | Some(Value::Null) => "{}".into(),
                    Some(v) => v.to_string(),
                };
                let call = json!({
                    "id": call_id,
                    "type": "function",
                    "function": { "name": name, "arguments": arguments },
                });
                match out.last_mut() {
                    Some(m) if last_assistant => match m["tool_calls"].as_array_mut() {
                        Some(calls) => calls.push(call),
                        None => m["tool_calls"] = json!([call]),
                    },
                    _ => out
                        .push(json!({ "role": "assistant", "content": "", "tool_calls": [call] })),
                }
            }
            "function_call_output" => {
                let call_id = item
                    .get("call_id")
                    .and_then(Value::as_str)
                    .ok_or_else(|| bad("a function_call_output item needs 'call_id'"))?;
                let content = match item.get("output") {
                    Some(Value::String(s)) => s.clone(),
                    Some(v @ Value::Array(_)) => flat(&content_parts(v)?),
                    _ => return Err(bad("a function_call_output item needs an 'output'")),
                };
                out.push(json!({ "role": "tool", "tool_call_id": call_id, "content": content }));
            }
            "reasoning" => {
                let texts = |key: &str| -> String {
                    item.get(key)
                        .and_then(Value::as_array)
                        .map(|a| a.iter().filter_map(|p| p["text"].as_str()).collect())
                        .unwrap_or_default()
                };
                let mut text = texts("content");
                if text.is_empty() {
                    text = texts("summary");
                }
                out.push(json!({ "role": "assistant", "content": "", "reasoning_content": text }));
            }
            other => {
                return Err(Fail::new(
                    ServerError::Unsupported(format!(
                        "input items of type {other:?} are not supported"
                    ))
                    .into_response(),
                ))
            }
        }
    }
    Ok(out)
}
