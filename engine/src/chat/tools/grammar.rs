//! [`tool_grammar`]: Lark grammars that allow only tool calls in a family's syntax.

use serde_json::{json, Value};

use super::{ToolChoice, ToolFormat};
use crate::constraint::Grammar;

/// `s` as a Lark string literal (JSON's syntax).
fn lit(s: &str) -> String {
    Value::String(s.into()).to_string()
}

/// `schema` with short whitespace runs between JSON tokens and lenient handling of keywords
/// llguidance does not know, unless it sets `x-guidance` itself; its objects admit only the
/// keys they list, as llama.cpp reads a tool's parameters.
fn with_guidance(schema: &Value) -> Value {
    let mut schema = schema.clone();
    crate::constraint::close_objects(&mut schema);
    if let Some(o) = schema.as_object_mut() {
        o.entry("x-guidance").or_insert_with(
            || json!({"whitespace_pattern": crate::constraint::JSON_WHITESPACE, "lenient": true}),
        );
    }
    schema
}

/// `s` with the characters a regex gives meaning to (and Lark's `/`) escaped.
fn regex_escape(s: &str) -> String {
    let mut out = String::new();
    for c in s.chars() {
        if c.is_ascii_punctuation() {
            out.push('\\');
        }
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c => out.push(c),
        }
    }
    out
}

/// The parameters of tool `k` as Qwen's XML writes them, in the schema's order, the required
/// ones mandatory: a string's value is raw text (an enum's one of its values, a length within
/// the schema's bounds) up to `\n</parameter>`, any other value JSON valid against its schema.
fn xml_parameters(k: usize, schema: &Value, rules: &mut Vec<String>) -> String {
    let Some(props) = schema.get("properties").and_then(Value::as_object) else {
        return lit("");
    };
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let mut seq = Vec::new();
    for (i, (key, sub)) in props.iter().enumerate() {
        let head = lit(&format!("<parameter={key}>\n"));
        let strings: Option<Vec<&str>> = sub
            .get("enum")
            .and_then(Value::as_array)
            .and_then(|e| e.iter().map(Value::as_str).collect());
        let is_string = sub.get("type").and_then(Value::as_str) == Some("string");
        let item = if is_string || strings.is_some() {
            // The value and its closing tag in one terminal, which holds `</parameter>` only
            // at its end.
            let value = match strings {
                Some(values) => format!(
                    "({})",
                    values
                        .iter()
                        .map(|v| regex_escape(v))
                        .collect::<Vec<_>>()
                        .join("|")
                ),
                None => {
                    let bound = |key: &str| sub.get(key).and_then(Value::as_u64);
                    match (bound("minLength"), bound("maxLength")) {
                        (None, None) => "(?s:.)*".to_string(),
                        (min, max) => format!(
                            "(?s:.){{{},{}}}",
                            min.unwrap_or(0),
                            max.map(|m| m.to_string()).unwrap_or_default()
                        ),
                    }
                }
            };
            let name = format!("XML_{k}_{i}");
            rules.push(format!(
                "{name}: /{value}\\n<\\/parameter>\\n/ & ~/(?s:.)*<\\/parameter>(?s:.)(?s:.)+/"
            ));
            format!("{head} {name}")
        } else {
            let name = format!("xml_{k}_{i}");
            rules.push(format!("{name}: %json {}", with_guidance(sub)));
            format!("{head} {name} {}", lit("\n</parameter>\n"))
        };
        let optional = if required.contains(&key.as_str()) {
            ""
        } else {
            "?"
        };
        seq.push(format!("({item}){optional}"));
    }
    if seq.is_empty() {
        return lit("");
    }
    seq.join(" ")
}

/// A grammar that allows only tool calls in `format`'s syntax whose arguments validate
/// against the tool's `parameters` schema: exactly one call, or when `parallel` one or more.
/// `tools` are OpenAI tools (`{"type": "function", "function": {"name", "description",
/// "parameters"}}`). [`ToolChoice::Required`] allows any of the tools,
/// [`ToolChoice::Named`] only that one; [`ToolChoice::Auto`] and [`ToolChoice::None`] give
/// `None` (free text), as do no tools and a name that no tool has.
pub fn tool_grammar(
    tools: &[Value],
    choice: ToolChoice,
    parallel: bool,
    format: ToolFormat,
) -> Option<Grammar> {
    let functions: Vec<(&str, Value)> = tools
        .iter()
        .filter_map(|t| {
            let f = t.get("function").unwrap_or(t);
            let name = f.get("name")?.as_str()?;
            let schema = f
                .get("parameters")
                .filter(|p| p.is_object())
                .cloned()
                .unwrap_or_else(|| json!({"type": "object"}));
            Some((name, schema))
        })
        .filter(|(name, _)| match &choice {
            ToolChoice::Named(n) => n == name,
            _ => true,
        })
        .collect();
    if matches!(choice, ToolChoice::Auto | ToolChoice::None) || functions.is_empty() {
        return None;
    }
    let mut rules = Vec::new();
    let mut alternatives = Vec::new();
    for (k, (name, schema)) in functions.iter().enumerate() {
        rules.push(format!("args_{k}: %json {}", with_guidance(schema)));
        let body = match format {
            ToolFormat::QwenXml => format!(
                "{} {} {}",
                lit(&format!("<tool_call>\n<function={name}>\n")),
                xml_parameters(k, schema, &mut rules),
                lit("</function>\n</tool_call>")
            ),
            ToolFormat::Hermes => format!(
                "{} args_{k} {}",
                lit(&format!(
                    "<tool_call>\n{{\"name\": {}, \"arguments\": ",
                    lit(name)
                )),
                lit("}\n</tool_call>")
            ),
            ToolFormat::Llama3 => format!(
                "{} args_{k} {}",
                lit(&format!("{{\"name\": {}, \"parameters\": ", lit(name))),
                lit("}")
            ),
            ToolFormat::Mistral => format!(
                "{} args_{k} {} CALL_ID {}",
                lit(&format!("{{\"name\": {}, \"arguments\": ", lit(name))),
                lit(", \"id\": "),
                lit("}")
            ),
            ToolFormat::MistralArgs => {
                format!("{} args_{k}", lit(&format!("[TOOL_CALLS]{name}[ARGS]")))
            }
            ToolFormat::Generic => format!(
                "{} args_{k} {}",
                lit(&format!("{{\"name\": {}, \"arguments\": ", lit(name))),
                lit("}")
            ),
        };
        rules.push(format!("call_{k}: {body}"));
        alternatives.push(format!("call_{k}"));
    }
    rules.push(format!("call: {}", alternatives.join(" | ")));
    let start = match (format, parallel) {
        (ToolFormat::Hermes | ToolFormat::QwenXml | ToolFormat::Llama3, false) => "call".into(),
        (ToolFormat::Hermes | ToolFormat::QwenXml | ToolFormat::Llama3, true) => {
            format!("call ({} call)*", lit("\n"))
        }
        (ToolFormat::Mistral, false) => format!("{} call {}", lit("[TOOL_CALLS]["), lit("]")),
        (ToolFormat::Mistral, true) => format!(
            "{} call ({} call)* {}",
            lit("[TOOL_CALLS]["),
            lit(", "),
            lit("]")
        ),
        (ToolFormat::MistralArgs, false) => "call".to_string(),
        (ToolFormat::MistralArgs, true) => "call+".to_string(),
        (ToolFormat::Generic, false) => format!("{} call {}", lit("{\"tool_call\": "), lit("}")),
        (ToolFormat::Generic, true) => format!(
            "{} call ({} call)* {}",
            lit("{\"tool_calls\": ["),
            lit(", "),
            lit("]}")
        ),
    };
    let mut lark = format!("start: {start}\n");
    for r in rules {
        lark.push_str(&r);
        lark.push('\n');
    }
    if format == ToolFormat::Mistral {
        lark.push_str("CALL_ID: /\"[a-zA-Z0-9]{9}\"/\n");
    }
    Some(Grammar::Lark(lark))
}
