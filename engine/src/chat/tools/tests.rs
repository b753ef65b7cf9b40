//! Tests of tool-call detection, parsing (whole and streamed) and grammars.

use super::*;
use crate::constraint::Grammar;

fn parse(text: &str, format: ToolFormat) -> (String, Vec<(String, String)>) {
    let (content, calls) = parse_tool_calls(text, format);
    let calls = calls.into_iter().map(|c| (c.name, c.arguments)).collect();
    (content, calls)
}

fn call(name: &str, args: &str) -> (String, String) {
    (name.into(), args.into())
}

#[test]
fn detects_formats_from_templates() {
    assert_eq!(
        detect_tool_format("{{- '<tool_call>\\n' }}"),
        ToolFormat::Hermes
    );
    assert_eq!(
        detect_tool_format("'<tool_call>\\n<function=' + name + '>\\n<parameter=' + k"),
        ToolFormat::QwenXml
    );
    assert_eq!(
        detect_tool_format("{{- \"[TOOL_CALLS][\" }}"),
        ToolFormat::Mistral
    );
    assert_eq!(
        detect_tool_format("'[TOOL_CALLS]' + name + '[ARGS]'"),
        ToolFormat::MistralArgs
    );
    assert_eq!(
        detect_tool_format("{{- \"<|python_tag|>\" + tool_call.name }}"),
        ToolFormat::Llama3
    );
    assert_eq!(
        detect_tool_format(crate::chat::CHATML_TEMPLATE),
        ToolFormat::Generic
    );
}

#[test]
fn hermes_calls_and_content() {
    let text = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";
    let (content, calls) = parse(text, ToolFormat::Hermes);
    assert_eq!(content, "Let me check.");
    assert_eq!(
        calls,
        vec![
            call("get_weather", "{\"location\": \"Paris\"}"),
            call("get_time", "{}")
        ]
    );
    // Arguments as a string of JSON, keys in another order, no closing tag.
    let text = "<tool_call>{\"arguments\": \"{\\\"a\\\": 1}\", \"name\": \"f\"}";
    assert_eq!(
        parse(text, ToolFormat::Hermes).1,
        vec![call("f", "{\"a\": 1}")]
    );
    // No arguments at all.
    let text = "<tool_call>{\"name\": \"f\"}</tool_call>";
    assert_eq!(parse(text, ToolFormat::Hermes).1, vec![call("f", "{}")]);
}

#[test]
fn malformed_calls_stay_content() {
    for text in [
        "<tool_call>not json</tool_call>",
        "<tool_call>{\"nome\": \"f\"}</tool_call>",
        "<tool_call>{\"name\": 3}</tool_call> after",
        "<tool_call>{\"arguments\": {}",
        "<tool_call>",
        "a <tool_ca",
    ] {
        let (content, calls) = parse(text, ToolFormat::Hermes);
        assert!(calls.is_empty(), "{text}: {calls:?}");
        assert_eq!(content, text);
    }
}

#[test]
fn llama3_json_builtin_and_code() {
    let text = "{\"name\": \"get_weather\", \"parameters\": {\"location\": \"Paris\"}}";
    assert_eq!(
        parse(text, ToolFormat::Llama3),
        (
            String::new(),
            vec![call("get_weather", "{\"location\": \"Paris\"}")]
        )
    );
    let text = "{\"type\": \"function\", \"name\": \"f\", \"parameters\": {\"x\": [1, {\"y\": \"}\"}]}}; {\"name\": \"g\", \"parameters\": {}}";
    assert_eq!(
        parse(text, ToolFormat::Llama3).1,
        vec![call("f", "{\"x\": [1, {\"y\": \"}\"}]}"), call("g", "{}")]
    );
    let text = "<|python_tag|>brave_search.call(query=\"today's weather\", count=3)";
    assert_eq!(
        parse(text, ToolFormat::Llama3).1,
        vec![call(
            "brave_search",
            "{\"query\": \"today's weather\", \"count\": 3}"
        )]
    );
    let text = "<|python_tag|>print(\"hi\")\nx = 1";
    assert_eq!(
        parse(text, ToolFormat::Llama3).1,
        vec![call("python", "{\"code\": \"print(\\\"hi\\\")\\nx = 1\"}")]
    );
    // JSON that is not a call is content.
    let text = "Here: {\"a\": 1} and {\"type\": \"x\", \"name\": \"f\", \"parameters\": {}}";
    assert_eq!(parse(text, ToolFormat::Llama3), (text.to_string(), vec![]));
}

#[test]
fn llama3_json_calls_as_llama_server_takes_them() {
    // Content, then the call as the reply's first `{`, and nothing after it but another call.
    let text = "Let me check. {\"name\": \"f\", \"parameters\": {\"x\": 1}}";
    assert_eq!(
        parse(text, ToolFormat::Llama3),
        ("Let me check.".into(), vec![call("f", "{\"x\": 1}")])
    );
    for text in [
        // Text after the object: a reply that shows JSON, not a call.
        "Like this: {\"name\": \"f\", \"parameters\": {}}. Then run it.",
        // Python's True is not JSON.
        "f(True, {\"name\": \"f\", \"parameters\": {\"ok\": True}})",
        // An object cut off by the end of the reply.
        "{\"name\": \"f\", \"parameters\": {\"x\": 1",
        // Not the content's first `{`.
        "Set {a}, then {\"name\": \"f\", \"parameters\": {}}",
    ] {
        assert_eq!(parse(text, ToolFormat::Llama3), (text.to_string(), vec![]));
    }
}

#[test]
fn llama3_json_calls_are_decided_when_the_reply_ends() {
    let text = "So: {\"name\": \"f\", \"parameters\": {\"x\": 1}} and more";
    let mut s = ToolCallStream::with_seed(ToolFormat::Llama3, 0);
    let mut events = Vec::new();
    for piece in text.split_inclusive(' ') {
        events.extend(s.push(piece));
    }
    // The object is held: only the content before it went out while the reply streamed.
    assert_eq!(events, vec![ToolCallEvent::Content("So:".into())]);
    events.extend(s.finish());
    let (content, calls) = s.into_parts();
    assert!(calls.is_empty(), "{calls:?}");
    assert_eq!(content, text, "{events:?}");
    // The same object at the reply's end is a call, streamed or not.
    let text = "So: {\"name\": \"f\", \"parameters\": {\"x\": 1}}";
    let mut s = ToolCallStream::with_seed(ToolFormat::Llama3, 0);
    for piece in text.split_inclusive(' ') {
        s.push(piece);
    }
    s.finish();
    let (content, calls) = s.into_parts();
    assert_eq!(content, "So:");
    assert_eq!(calls.len(), 1);
    assert_eq!(
        (calls[0].name.as_str(), calls[0].arguments.as_str()),
        ("f", "{\"x\": 1}")
    );
}

#[test]
fn mistral_both_forms_and_ids() {
    let text = "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {\"a\": 1}, \"id\": \"abcDEF123\"}, {\"name\": \"g\", \"arguments\": {}}]";
    let (content, calls) = parse_tool_calls(text, ToolFormat::Mistral);
    assert_eq!(content, "");
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[0].id, "abcDEF123");
    assert_eq!(
        (calls[0].name.as_str(), calls[0].arguments.as_str()),
        ("f", "{\"a\": 1}")
    );
    assert_eq!(calls[1].id.len(), 9);
    assert!(calls[1].id.bytes().all(|b| b.is_ascii_alphanumeric()));
    let text = "Sure.[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}[TOOL_CALLS]get_time[CALL_ID]x1[ARGS]{}";
    let (content, calls) = parse_tool_calls(text, ToolFormat::MistralArgs);
    assert_eq!(content, "Sure.");
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[0].arguments, "{\"city\": \"Paris\"}");
    assert_eq!(
        (calls[1].name.as_str(), calls[1].id.as_str()),
        ("get_time", "x1")
    );
    assert_eq!(parse("[TOOL_CALLS] oops", ToolFormat::Mistral).1, vec![]);
}

#[test]
fn generic_forms() {
    let text = "{\"tool_call\": {\"name\": \"f\", \"arguments\": {\"a\": 1}}}";
    assert_eq!(
        parse(text, ToolFormat::Generic),
        (String::new(), vec![call("f", "{\"a\": 1}")])
    );
    let text = " {\"tool_calls\": [{\"name\": \"f\", \"arguments\": {}}, {\"name\": \"g\", \"arguments\": \"{}\"}]}";
    assert_eq!(
        parse(text, ToolFormat::Generic).1,
        vec![call("f", "{}"), call("g", "{}")]
    );
    let text = "{\"response\": \"Hello \\\"you\\\"\"}";
    assert_eq!(
        parse(text, ToolFormat::Generic),
        ("Hello \"you\"".into(), vec![])
    );
    for text in [
        "{\"other\": 1}",
        "plain {\"tool_call\": {\"name\": \"f\"}}",
        "{\"tool_call\":",
    ] {
        assert_eq!(parse(text, ToolFormat::Generic), (text.to_string(), vec![]));
    }
}

#[test]
fn ids_are_unique_and_follow_the_seed() {
    let text = "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>".repeat(50);
    let ids = |seed| {
        let mut s = ToolCallStream::with_seed(ToolFormat::Hermes, seed);
        s.push(&text);
        s.finish();
        s.into_parts()
            .1
            .into_iter()
            .map(|c| c.id)
            .collect::<Vec<_>>()
    };
    let a = ids(1);
    assert_eq!(a.len(), 50);
    assert_eq!(a, ids(1));
    assert_ne!(a, ids(2));
    let unique: std::collections::HashSet<_> = a.iter().collect();
    assert_eq!(unique.len(), 50);
    assert!(a
        .iter()
        .all(|id| id.len() == 9 && id.bytes().all(|b| b.is_ascii_alphanumeric())));
}

#[test]
fn streaming_holds_back_marker_prefixes() {
    let mut s = ToolCallStream::with_seed(ToolFormat::Hermes, 0);
    assert_eq!(
        s.push("Hi <tool"),
        vec![ToolCallEvent::Content("Hi".into())]
    );
    assert_eq!(s.push("_call>{\"name\": \"f\", "), vec![]);
    let ev = s.push("\"arguments\": {\"a\"");
    assert!(matches!(&ev[0], ToolCallEvent::CallStart { index: 0, name, .. } if name == "f"));
    assert_eq!(
        ev[1],
        ToolCallEvent::Arguments {
            index: 0,
            fragment: "{\"a\"".into()
        }
    );
    let ev = s.push(": 2}}</tool_call> done");
    assert_eq!(
        ev,
        vec![
            ToolCallEvent::Arguments {
                index: 0,
                fragment: ": 2}".into()
            },
            ToolCallEvent::Content("done".into())
        ]
    );
    assert_eq!(s.finish(), vec![]);
    let delta = ToolCallEvent::Arguments {
        index: 0,
        fragment: "x".into(),
    }
    .to_openai_delta();
    assert_eq!(delta["tool_calls"][0]["function"]["arguments"], "x");
}

#[test]
fn grammars_only_for_required_and_named() {
    let tools = vec![
        json!({"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}),
    ];
    assert!(tool_grammar(&tools, ToolChoice::Auto, false, ToolFormat::Hermes).is_none());
    assert!(tool_grammar(&tools, ToolChoice::None, false, ToolFormat::Hermes).is_none());
    assert!(tool_grammar(
        &tools,
        ToolChoice::Named("g".into()),
        false,
        ToolFormat::Hermes
    )
    .is_none());
    assert!(tool_grammar(&[], ToolChoice::Required, false, ToolFormat::Hermes).is_none());
    let Some(Grammar::Lark(g)) =
        tool_grammar(&tools, ToolChoice::Required, true, ToolFormat::Hermes)
    else {
        panic!()
    };
    assert!(g.contains("%json"), "{g}");
    assert_eq!(
        ToolChoice::from_openai(&json!({"type": "function", "function": {"name": "f"}})),
        Some(ToolChoice::Named("f".into()))
    );
}
