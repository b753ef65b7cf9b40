//! Rendering OpenAI-style requests ([`RenderRequest`]): message normalization, tool-call
//! arguments, the template variables transformers and llama-server provide, assistant prefill
//! (`continue_final_message`) and closing an open thinking block when reasoning is off.

use std::fmt;
use std::sync::Arc;

use minijinja::value::{Enumerator, Kwargs, Object, ObjectRepr, Value, ValueKind};
use minijinja::{Error as JinjaError, ErrorKind};
use serde_json::{json, Map, Value as Json};

use super::{clock, ChatTemplate};
use crate::{Error, Result};

/// Whether the model should reason before answering (llama-server's `--reasoning`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Reasoning {
    /// Reasoning on.
    On,
    /// Reasoning off: `enable_thinking` is false, and a generation prompt that leaves a thinking
    /// block open gets it closed.
    Off,
    /// The template's default (treated as on: `enable_thinking` is true).
    #[default]
    Auto,
}

impl Reasoning {
    fn name(self) -> &'static str {
        match self {
            Reasoning::On => "on",
            Reasoning::Off => "off",
            Reasoning::Auto => "auto",
        }
    }

    /// Parses `on`, `off` or `auto`.
    pub fn parse(s: &str) -> Option<Reasoning> {
        Some(match s {
            "on" => Reasoning::On,
            "off" => Reasoning::Off,
            "auto" => Reasoning::Auto,
            _ => return None,
        })
    }
}

/// What to render: an OpenAI chat-completions request's template inputs.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RenderRequest {
    /// Message objects: `role`, `content` (a string, null, or a list of `{"type": "text",
    /// "text": ...}` parts), and optionally `tool_calls`, `tool_call_id`, `name`,
    /// `reasoning_content`.
    pub messages: Vec<Json>,
    /// Tool definitions; the template sees no `tools` variable when this is `None` or empty.
    pub tools: Option<Vec<Json>>,
    /// End with the start of an assistant reply.
    pub add_generation_prompt: bool,
    /// When the last message is the assistant's, end inside it, so that generation continues
    /// its content (no end of turn, no generation prompt). Ignored otherwise.
    pub continue_final_message: bool,
    /// Extra template variables (`chat_template_kwargs`), e.g. `enable_thinking`,
    /// `reasoning_effort`; they override the defaults of the same name.
    pub kwargs: Map<String, Json>,
    /// Reasoning on or off.
    pub reasoning: Reasoning,
}

impl RenderRequest {
    /// A request for `messages` with a generation prompt and nothing else.
    pub fn new(messages: Vec<Json>) -> RenderRequest {
        RenderRequest {
            messages,
            add_generation_prompt: true,
            ..RenderRequest::default()
        }
    }

    /// The request as JSON (for the renderer process).
    pub fn to_json(&self) -> Json {
        json!({
            "messages": self.messages,
            "tools": self.tools,
            "add_generation_prompt": self.add_generation_prompt,
            "continue_final_message": self.continue_final_message,
            "kwargs": self.kwargs,
            "reasoning": self.reasoning.name(),
        })
    }

    /// The inverse of [`to_json`](Self::to_json).
    pub fn from_json(v: &Json) -> Option<RenderRequest> {
        Some(RenderRequest {
            messages: v["messages"].as_array()?.clone(),
            tools: match &v["tools"] {
                Json::Null => None,
                t => Some(t.as_array()?.clone()),
            },
            add_generation_prompt: v["add_generation_prompt"].as_bool()?,
            continue_final_message: v["continue_final_message"].as_bool()?,
            kwargs: v["kwargs"].as_object()?.clone(),
            reasoning: Reasoning::parse(v["reasoning"].as_str()?)?,
        })
    }

    /// Bytes of text in the request, which its render's fuel and output budget grow with.
    pub(super) fn size(&self) -> usize {
        let len = |v: &Json| serde_json::to_string(v).map_or(0, |s| s.len());
        self.messages.iter().map(len).sum::<usize>()
            + self.tools.iter().flatten().map(len).sum::<usize>()
            + self.kwargs.values().map(len).sum::<usize>()
    }
}

/// Whether a prompt ends inside an open reasoning block (`<think>` or Command R7B's
/// `<|START_THINKING|>` with nothing after it but whitespace), so that the reply starts with
/// reasoning.
pub fn prompt_opens_thinking(prompt: &str) -> bool {
    let p = prompt.trim_end();
    p.ends_with("<think>") || p.ends_with("<|START_THINKING|>")
}

/// Appended to the final message's content to find where a continued message's content ends.
const MARKER: &str = "\u{2}llama-hdd:continue\u{3}";

/// A tool call's `arguments`, parsed from the JSON text OpenAI sends: a mapping to templates
/// (`.items()`, `['key']`, `| tojson`), and the original text where printed (`{{ arguments }}`).
#[derive(Debug)]
struct Arguments {
    text: String,
    map: Value,
}

impl Object for Arguments {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Map
    }

    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        self.map.get_item(key).ok().filter(|v| !v.is_undefined())
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        match self.map.try_iter() {
            Ok(keys) => Enumerator::Values(keys.collect()),
            Err(_) => Enumerator::Empty,
        }
    }

    fn render(self: &Arc<Self>, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// A JSON value as a template value.
fn to_value(v: &Json) -> Value {
    match v {
        Json::Null => Value::from(()),
        Json::Bool(b) => Value::from(*b),
        Json::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => Value::from(i),
            (None, Some(u)) => Value::from(u),
            _ => Value::from(n.as_f64().unwrap_or(f64::NAN)),
        },
        Json::String(s) => Value::from(s.as_str()),
        Json::Array(a) => a.iter().map(to_value).collect(),
        Json::Object(o) => o.iter().map(|(k, x)| (k.as_str(), to_value(x))).collect(),
    }
}

/// The messages as template values, tool-call arguments parsed when `parse_arguments`; returns
/// whether any arguments were.
fn messages_value(messages: &[Json], parse_arguments: bool) -> (Value, bool) {
    let mut any = false;
    let values = messages
        .iter()
        .map(|m| {
            let Json::Object(fields) = m else {
                return to_value(m);
            };
            fields
                .iter()
                .map(|(k, v)| {
                    let v = match (k.as_str(), v) {
                        ("tool_calls", Json::Array(calls)) if parse_arguments => calls
                            .iter()
                            .map(|call| tool_call_value(call, &mut any))
                            .collect(),
                        _ => to_value(v),
                    };
                    (k.as_str(), v)
                })
                .collect::<Value>()
        })
        .collect();
    (values, any)
}

/// A tool call with its `function.arguments` parsed into [`Arguments`] when they are the JSON
/// text of an object.
fn tool_call_value(call: &Json, any: &mut bool) -> Value {
    let Json::Object(fields) = call else {
        return to_value(call);
    };
    fields
        .iter()
        .map(|(k, v)| {
            let v = match (k.as_str(), v) {
                ("function", Json::Object(function)) => function
                    .iter()
                    .map(|(fk, fv)| {
                        let parsed = match (fk.as_str(), fv) {
                            ("arguments", Json::String(text)) => {
                                match serde_json::from_str::<Json>(text) {
                                    Ok(obj @ Json::Object(_)) => {
                                        Some(Value::from_object(Arguments {
                                            text: text.clone(),
                                            map: to_value(&obj),
                                        }))
                                    }
                                    _ => None,
                                }
                            }
                            _ => None,
                        };
                        if parsed.is_some() {
                            *any = true;
                        }
                        let value = parsed.unwrap_or_else(|| to_value(fv));
                        (fk.as_str(), value)
                    })
                    .collect(),
                _ => to_value(v),
            };
            (k.as_str(), v)
        })
        .collect()
}

/// Messages as templates expect them: text parts joined into one string (with newlines, as
/// llama-server does), `""` for the missing or null content of a message with tool calls, and
/// the `developer` role as `system`, except for GPT-OSS's Harmony templates (`harmony`), which
/// know it, and which read an assistant's reasoning as `thinking`: llama-server copies
/// `reasoning_content` there, and drops the content of such a message with tool calls.
fn normalize(messages: &[Json], harmony: bool) -> Vec<Json> {
    messages
        .iter()
        .map(|m| {
            let mut m = m.clone();
            if let Json::Object(fields) = &mut m {
                if let Some(Json::Array(parts)) = fields.get("content") {
                    let text = join_text_parts(parts, "\n");
                    fields.insert("content".into(), Json::String(text));
                }
                let has_calls = fields.get("tool_calls").is_some_and(|c| !c.is_null());
                if has_calls && fields.get("content").is_none_or(Json::is_null) {
                    fields.insert("content".into(), Json::String(String::new()));
                }
                if !harmony && fields.get("role").and_then(Json::as_str) == Some("developer") {
                    fields.insert("role".into(), Json::String("system".into()));
                }
                if let (true, Some(Json::String(r))) = (harmony, fields.get("reasoning_content")) {
                    let thinking = Json::String(r.clone());
                    fields.insert("thinking".into(), thinking);
                    if fields
                        .get("tool_calls")
                        .and_then(Json::as_array)
                        .is_some_and(|c| !c.is_empty())
                    {
                        fields.remove("content");
                    }
                }
            }
            m
        })
        .collect()
}

/// The text of `parts` (OpenAI content parts) joined with `sep`; other kinds of part are left
/// out.
fn join_text_parts(parts: &[Json], sep: &str) -> String {
    let text: Vec<&str> = parts
        .iter()
        .filter(|p| p["type"] == "text" || p["type"].is_null())
        .filter_map(|p| p["text"].as_str())
        .collect();
    text.join(sep)
}

impl ChatTemplate {
    /// Renders `req` in this process, bounded by fuel and output only (see
    /// [`render_request`](Self::render_request)).
    pub fn render_request_here(&self, req: &RenderRequest) -> Result<String> {
        let harmony = super::harmony::is_harmony(&self.source);
        let mut messages = normalize(&req.messages, harmony);
        let continuing = req.continue_final_message
            && messages.last().and_then(|m| m["role"].as_str()) == Some("assistant");
        let mut marker = MARKER.to_string();
        if continuing {
            let input = serde_json::to_string(&req.messages).unwrap_or_default();
            while input.contains(&marker) || self.source.contains(&marker) {
                marker.push('\u{3}');
            }
            // The message being continued has its text parts joined by a blank line, as
            // llama-server writes a prefilled reply.
            if let Some(Json::Array(parts)) = req.messages.last().map(|m| &m["content"]) {
                let text = join_text_parts(parts, "\n\n");
                if let Some(last) = messages.last_mut().and_then(Json::as_object_mut) {
                    last.insert("content".into(), Json::String(text));
                }
            }
            let last = messages.last_mut().and_then(Json::as_object_mut);
            if let Some(last) = last {
                let content = last.get("content").and_then(Json::as_str).unwrap_or("");
                let content = format!("{content}{marker}");
                last.insert("content".into(), Json::String(content));
            }
        }
        let thinking = match req.kwargs.get("enable_thinking") {
            Some(Json::Bool(b)) => *b,
            _ => req.reasoning != Reasoning::Off,
        };
        let add_generation_prompt = req.add_generation_prompt && !continuing;
        let size = req.size();
        let prompt = self.render_messages(req, &messages, add_generation_prompt, thinking, size)?;
        if continuing {
            if let Some(at) = prompt.rfind(&marker) {
                return Ok(prompt[..at].replace(&marker, ""));
            }
            // The template dropped the content: continue after a generation prompt instead.
            let content = messages
                .last()
                .map(|m| m["content"].as_str().unwrap_or("").replace(&marker, ""));
            let before = &messages[..messages.len() - 1];
            let prompt = self.render_messages(req, before, true, thinking, size)?;
            return Ok(prompt + &content.unwrap_or_default());
        }
        Ok(if add_generation_prompt && !thinking {
            self.close_thinking(prompt)
        } else {
            prompt
        })
    }

    /// A generation prompt left inside an open thinking block, closed, as llama.cpp does when
    /// reasoning is off: `<think>\n` gets `</think>`; Command R7B's templates get
    /// `<|START_THINKING|><|END_THINKING|>`.
    fn close_thinking(&self, mut prompt: String) -> String {
        if prompt.ends_with("<think>\n") || prompt.ends_with("<think>") {
            prompt.push_str("</think>");
        } else if self.source.contains("<|START_THINKING|>") {
            if prompt.ends_with("<|START_THINKING|>") {
                prompt.push_str("<|END_THINKING|>");
            } else if prompt.ends_with("<|CHATBOT_TOKEN|>") {
                prompt.push_str("<|START_THINKING|><|END_THINKING|>");
            }
        }
        prompt
    }

    /// One render of `messages` with the request's other variables: tool-call arguments as
    /// mappings first, and as the JSON text they came as when the template fails on mappings.
    fn render_messages(
        &self,
        req: &RenderRequest,
        messages: &[Json],
        add_generation_prompt: bool,
        thinking: bool,
        size: usize,
    ) -> Result<String> {
        let now = clock::now();
        let mut vars: Vec<(String, Value)> = vec![
            ("bos_token".into(), Value::from(self.bos_token.as_str())),
            ("eos_token".into(), Value::from(self.eos_token.as_str())),
            ("enable_thinking".into(), Value::from(thinking)),
            (
                "date_string".into(),
                Value::from(clock::strftime(&now, "%d %b %Y")),
            ),
            (
                "datetime".into(),
                Value::from(clock::strftime(&now, "%b %d %Y")),
            ),
        ];
        for (k, v) in &req.kwargs {
            if !matches!(k.as_str(), "messages" | "tools" | "add_generation_prompt") {
                vars.retain(|(name, _)| name != k);
                vars.push((k.clone(), to_value(v)));
            }
        }
        let tools = req.tools.as_ref().filter(|t| !t.is_empty());
        // firefunction-v2 reads the tools as JSON text from `functions`, which llama.cpp
        // provides (indented by 2) to templates that call functions with `functools[`.
        if self.source.contains("functools[") && !req.kwargs.contains_key("functions") {
            let text = match tools {
                Some(tools) => serde_json::to_string_pretty(tools).unwrap_or_default(),
                None => String::new(),
            };
            vars.push(("functions".into(), Value::from(text)));
        }
        if let Some(tools) = tools {
            let tools: Value = tools.iter().map(to_value).collect();
            vars.push(("tools".into(), tools));
        }
        vars.push((
            "add_generation_prompt".into(),
            Value::from(add_generation_prompt),
        ));
        let (fuel, output) = super::limits_for(
            messages.len() + req.tools.as_ref().map_or(0, Vec::len),
            size,
        );
        let with = |parse: bool| {
            let (messages, parsed) = messages_value(messages, parse);
            let ctx: Value = vars
                .iter()
                .cloned()
                .chain(std::iter::once(("messages".to_string(), messages)))
                .collect();
            (self.render_value(ctx, fuel, output), parsed)
        };
        match with(true) {
            (Err(Error::ChatTemplate(_)), true) => with(false).0,
            (result, _) => result,
        }
    }
}

/// The most nesting `tojson` writes.
const JSON_DEPTH: usize = 128;
/// The widest indent `tojson` accepts.
const MAX_INDENT: usize = 64;

/// transformers' `tojson`: Python's `json.dumps(value, ensure_ascii=False, indent=indent,
/// separators=separators, sort_keys=sort_keys)`, e.g. `{"a": [1, 2.0]}`.
pub fn tojson(
    value: &Value,
    indent: Option<Value>,
    kwargs: Kwargs,
) -> std::result::Result<String, JinjaError> {
    let bad = |what: &str| JinjaError::new(ErrorKind::InvalidOperation, format!("tojson: {what}"));
    let indent = match indent.or(kwargs.get::<Option<Value>>("indent")?) {
        None => None,
        Some(v) if v.is_none() || v.is_undefined() => None,
        Some(v) => match v.as_str() {
            Some(s) => Some(s.to_string()),
            None => {
                let n = usize::try_from(v).map_err(|_| bad("indent must be a number"))?;
                Some(" ".repeat(n.min(MAX_INDENT)))
            }
        },
    };
    if indent.as_ref().is_some_and(|s| s.len() > MAX_INDENT) {
        return Err(bad("indent too wide"));
    }
    let ensure_ascii = kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false);
    let sort_keys = kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false);
    let (item_sep, key_sep) = match kwargs.get::<Option<Value>>("separators")? {
        Some(seps) if !seps.is_none() => {
            let parts: Vec<Value> = seps.try_iter()?.collect();
            match parts.as_slice() {
                [a, b] => match (a.as_str(), b.as_str()) {
                    (Some(a), Some(b)) => (a.to_string(), b.to_string()),
                    _ => return Err(bad("separators must be two strings")),
                },
                _ => return Err(bad("separators must be two strings")),
            }
        }
        _ if indent.is_some() => (",".to_string(), ": ".to_string()),
        _ => (", ".to_string(), ": ".to_string()),
    };
    let w = JsonWriter {
        indent,
        item_sep,
        key_sep,
        ensure_ascii,
        sort_keys,
    };
    let mut out = String::new();
    w.write(value, 0, &mut out)?;
    Ok(out)
}

struct JsonWriter {
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    ensure_ascii: bool,
    sort_keys: bool,
}

impl JsonWriter {
    fn newline(&self, level: usize, out: &mut String) {
        if let Some(indent) = &self.indent {
            out.push('\n');
            for _ in 0..level {
                out.push_str(indent);
            }
        }
    }

    fn write(
        &self,
        v: &Value,
        level: usize,
        out: &mut String,
    ) -> std::result::Result<(), JinjaError> {
        if level > JSON_DEPTH {
            return Err(JinjaError::new(
                ErrorKind::InvalidOperation,
                "tojson: value nested too deeply (or circular)",
            ));
        }
        match v.kind() {
            ValueKind::Undefined | ValueKind::None => out.push_str("null"),
            ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
            ValueKind::Number if v.is_integer() => out.push_str(&v.to_string()),
            ValueKind::Number => {
                out.push_str(&py_float(f64::try_from(v.clone()).unwrap_or(f64::NAN)))
            }
            ValueKind::String => self.string(v.as_str().unwrap_or_default(), out),
            ValueKind::Bytes => self.string(
                &String::from_utf8_lossy(v.as_bytes().unwrap_or_default()),
                out,
            ),
            ValueKind::Map => {
                let mut keys: Vec<Value> = v.try_iter()?.collect();
                if keys.is_empty() {
                    out.push_str("{}");
                    return Ok(());
                }
                let key_text = |k: &Value| match k.kind() {
                    ValueKind::String => k.as_str().unwrap_or_default().to_string(),
                    ValueKind::None | ValueKind::Undefined => "null".into(),
                    ValueKind::Bool => if k.is_true() { "true" } else { "false" }.into(),
                    ValueKind::Number if !k.is_integer() => {
                        py_float(f64::try_from(k.clone()).unwrap_or(f64::NAN))
                    }
                    _ => k.to_string(),
                };
                if self.sort_keys {
                    keys.sort_by_key(|k| key_text(k));
                }
                out.push('{');
                for (i, k) in keys.iter().enumerate() {
                    if i > 0 {
                        out.push_str(&self.item_sep);
                    }
                    self.newline(level + 1, out);
                    self.string(&key_text(k), out);
                    out.push_str(&self.key_sep);
                    self.write(&v.get_item(k)?, level + 1, out)?;
                }
                self.newline(level, out);
                out.push('}');
            }
            ValueKind::Seq | ValueKind::Iterable => {
                let items: Vec<Value> = v.try_iter()?.collect();
                if items.is_empty() {
                    out.push_str("[]");
                    return Ok(());
                }
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push_str(&self.item_sep);
                    }
                    self.newline(level + 1, out);
                    self.write(item, level + 1, out)?;
                }
                self.newline(level, out);
                out.push(']');
            }
            _ => self.string(&v.to_string(), out),
        }
        Ok(())
    }

    fn string(&self, s: &str, out: &mut String) {
        out.push('"');
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '\u{8}' => out.push_str("\\b"),
                '\u{c}' => out.push_str("\\f"),
                c if (c as u32) < 0x20 || (self.ensure_ascii && !(' '..='~').contains(&c)) => {
                    let mut buf = [0u16; 2];
                    for unit in c.encode_utf16(&mut buf) {
                        out.push_str(&format!("\\u{unit:04x}"));
                    }
                }
                c => out.push(c),
            }
        }
        out.push('"');
    }
}

/// Python's `repr(float)`: the shortest digits that round-trip, in exponent form below 1e-4 and
/// from 1e16 (`1e-05`, `1e+16`), with `.0` on whole numbers.
pub fn py_float(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    if f == 0.0 || (-4..16).contains(&exp) {
        let fixed = f.to_string();
        if fixed.contains('.') {
            fixed
        } else {
            fixed + ".0"
        }
    } else {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{mantissa}e{sign}{:02}", exp.abs())
    }
}

/// `strftime_now(format)`: the local time formatted as Python's `strftime` does.
pub fn strftime_now(format: String) -> String {
    clock::strftime(&clock::now(), &format)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dumps(template: &str, value: Json) -> String {
        let mut env = minijinja::Environment::new();
        env.add_filter("tojson", tojson);
        env.render_str(
            template,
            minijinja::context! { v => Value::from_serialize(&value) },
        )
        .unwrap()
    }

    #[test]
    fn tojson_writes_like_python_json_dumps() {
        let v = json!({"b": [1, 2.5, 1e-5, 1e16, 3.0], "a": "é\"\n<&>", "c": {}, "d": [], "e": null, "f": true});
        // Keys keep their order, as in a Python dict (serde_json's `preserve_order`).
        assert_eq!(
            dumps("{{ v | tojson }}", v.clone()),
            r#"{"b": [1, 2.5, 1e-05, 1e+16, 3.0], "a": "é\"\n<&>", "c": {}, "d": [], "e": null, "f": true}"#
        );
        assert_eq!(
            dumps("{{ v.b | tojson(indent=2) }}", v.clone()),
            "[\n  1,\n  2.5,\n  1e-05,\n  1e+16,\n  3.0\n]"
        );
        assert_eq!(
            dumps(
                "{{ v | tojson(indent=1, sort_keys=true) }}",
                json!({"y": {"z": 1}, "x": [true]})
            ),
            "{\n \"x\": [\n  true\n ],\n \"y\": {\n  \"z\": 1\n }\n}"
        );
        assert_eq!(
            dumps(
                "{{ v.a | tojson(ensure_ascii=true) }}",
                json!({"a": "é😀\u{1}"})
            ),
            r#""\u00e9\ud83d\ude00\u0001""#
        );
        assert_eq!(
            dumps(
                "{{ v | tojson(separators=(',', ':')) }}",
                json!({"a": [1, 2]})
            ),
            r#"{"a":[1,2]}"#
        );
        assert_eq!(py_float(-0.0), "-0.0");
        assert_eq!(py_float(123456789012345.6), "123456789012345.6");
        assert_eq!(py_float(0.0001), "0.0001");
        assert_eq!(py_float(1.5e300), "1.5e+300");
    }

    #[test]
    fn tojson_refuses_circular_values() {
        let mut env = minijinja::Environment::new();
        env.add_filter("tojson", tojson);
        let t = "{% set ns = namespace(a=1) %}{% set ns.me = ns %}{{ ns | tojson }}";
        let e = env.render_str(t, ()).unwrap_err();
        assert!(e.to_string().contains("nested too deeply"), "{e}");
    }

    #[test]
    fn requests_round_trip_through_json() {
        let mut req = RenderRequest::new(vec![json!({"role": "user", "content": "hi"})]);
        req.tools = Some(vec![json!({"type": "function"})]);
        req.continue_final_message = true;
        req.reasoning = Reasoning::Off;
        req.kwargs.insert("x".into(), json!([1]));
        assert_eq!(RenderRequest::from_json(&req.to_json()), Some(req));
    }
}
