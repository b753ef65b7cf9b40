//! The harmony reader on replies as gpt-oss writes them, whole and streamed in every split.

use super::*;

/// Reasoning, then a call of `get_weather` (recipient in the channel's header), as gpt-oss
/// answers a request with tools.
const CALL: &str = "<|channel|>analysis<|message|>Need the weather.<|end|>\
<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json\
<|message|>{\"city\":\"Paris\"}";

/// Reasoning, a preamble, then the final answer.
const ANSWER: &str = "<|channel|>analysis<|message|>The user greets.<|end|>\
<|start|>assistant<|channel|>commentary<|message|>One moment.<|end|>\
<|start|>assistant<|channel|>final<|message|>Hello! How can I help?";

fn names(calls: &[ToolCall]) -> Vec<(&str, &str)> {
    calls
        .iter()
        .map(|c| (c.name.as_str(), c.arguments.as_str()))
        .collect()
}

#[test]
fn analysis_is_reasoning_and_final_and_preambles_are_content() {
    let (r, c, calls) = parse_harmony(ANSWER, ReasoningFormat::Auto, false);
    assert_eq!(r.as_deref(), Some("The user greets."));
    assert_eq!(c, "One moment.Hello! How can I help?");
    assert!(calls.is_empty());
}

#[test]
fn a_message_to_a_function_is_a_call() {
    let (r, c, calls) = parse_harmony(CALL, ReasoningFormat::Auto, true);
    assert_eq!(r.as_deref(), Some("Need the weather."));
    assert_eq!(c, "");
    assert_eq!(names(&calls), [("get_weather", "{\"city\":\"Paris\"}")]);
    assert_eq!(calls[0].id.len(), 9);
    // The recipient may come in the role's header instead, the content type without
    // `<|constrain|>`; the text may hold the `<|call|>` that ended generation.
    let in_role = "<|channel|>analysis<|message|>x<|end|><|start|>assistant to=functions.add\
<|channel|>commentary json<|message|>{\"a\":1}<|call|>";
    let (_, c, calls) = parse_harmony(in_role, ReasoningFormat::Auto, true);
    assert_eq!(
        (c.as_str(), names(&calls)),
        ("", vec![("add", "{\"a\":1}")])
    );
    // Two calls in one reply.
    let two = format!(
        "{CALL}<|end|><|start|>assistant<|channel|>commentary to=functions.time<|message|>{{}}"
    );
    let (_, _, calls) = parse_harmony(&two, ReasoningFormat::Auto, true);
    assert_eq!(
        names(&calls),
        [("get_weather", "{\"city\":\"Paris\"}"), ("time", "{}")]
    );
    assert_ne!(calls[0].id, calls[1].id);
}

#[test]
fn calls_without_tools_and_built_in_tools_are_dropped() {
    // As llama-server: a request without tools reads no call, and a message to a recipient
    // that is not a function (a built-in tool) shows nothing.
    let (r, c, calls) = parse_harmony(CALL, ReasoningFormat::Auto, false);
    assert_eq!((r.as_deref(), c.as_str()), (Some("Need the weather."), ""));
    assert!(calls.is_empty());
    let browser = "<|channel|>analysis<|message|>Search.<|end|><|start|>assistant\
<|channel|>commentary to=browser.search <|constrain|>json<|message|>{\"q\":\"x\"}<|end|>\
<|start|>assistant<|channel|>final<|message|>Done.";
    let (_, c, calls) = parse_harmony(browser, ReasoningFormat::Auto, true);
    assert_eq!(c, "Done.");
    assert!(calls.is_empty());
}

#[test]
fn reasoning_formats_keep_the_analysis_in_the_content_as_asked() {
    let (r, c, _) = parse_harmony(ANSWER, ReasoningFormat::None, false);
    assert_eq!(r, None);
    assert_eq!(
        c,
        "<|channel|>analysis<|message|>The user greets.<|end|>One moment.Hello! How can I help?"
    );
    let (r, c2, _) = parse_harmony(ANSWER, ReasoningFormat::DeepseekLegacy, false);
    assert_eq!(r.as_deref(), Some("The user greets."));
    assert_eq!(c2, c);
}

#[test]
fn a_reply_that_does_not_speak_harmony_is_content() {
    for text in ["Just text.", "<b>bold</b>", "  to be or not", ""] {
        let (r, c, calls) = parse_harmony(text, ReasoningFormat::Auto, true);
        assert_eq!((r, c.as_str(), calls.len()), (None, text, 0), "{text:?}");
    }
    // A reply cut off inside its first header keeps its text.
    let (r, c, _) = parse_harmony("<|channel|>anal", ReasoningFormat::Auto, false);
    assert_eq!((r, c.as_str()), (None, "<|channel|>anal"));
    // One cut off inside its reasoning has reasoning only.
    let (r, c, _) = parse_harmony(
        "<|channel|>analysis<|message|>Thinking<|e",
        ReasoningFormat::Auto,
        false,
    );
    assert_eq!((r.as_deref(), c.as_str()), (Some("Thinking<|e"), ""));
}

#[test]
fn every_split_of_the_stream_gives_the_whole_parse() {
    for (text, tools) in [(ANSWER, false), (CALL, true), ("plain <|end text", false)] {
        for format in [
            ReasoningFormat::Auto,
            ReasoningFormat::None,
            ReasoningFormat::DeepseekLegacy,
        ] {
            let (want_r, want_c, want_calls) = parse_harmony(text, format, tools);
            let bounds: Vec<usize> = (0..=text.len())
                .filter(|&i| text.is_char_boundary(i))
                .collect();
            for w in bounds.windows(2).map(|w| w[1]).chain([1]) {
                // Pieces of `w` bytes (every size up to the whole), then single characters.
                let mut s = HarmonyStream::new(format, tools);
                let (mut r, mut c, mut starts, mut args) =
                    (String::new(), String::new(), Vec::new(), String::new());
                let mut take = |(rs, events): (String, Vec<ToolCallEvent>)| {
                    r.push_str(&rs);
                    for e in events {
                        match e {
                            ToolCallEvent::Content(x) => c.push_str(&x),
                            ToolCallEvent::CallStart { name, .. } => starts.push(name),
                            ToolCallEvent::Arguments { fragment, .. } => args.push_str(&fragment),
                        }
                    }
                };
                let mut at = 0;
                while at < text.len() {
                    let mut end = (at + w).min(text.len());
                    while !text.is_char_boundary(end) {
                        end += 1;
                    }
                    take(s.feed(&text[at..end]));
                    at = end;
                }
                take(s.finish());
                assert_eq!(want_r.clone().unwrap_or_default(), r, "{text:?} by {w}");
                assert_eq!(want_c, c, "{text:?} by {w}");
                let names: Vec<&str> = want_calls.iter().map(|c| c.name.as_str()).collect();
                assert_eq!(names, starts, "{text:?} by {w}");
                let all: String = want_calls.iter().map(|c| c.arguments.as_str()).collect();
                assert_eq!(all, args, "{text:?} by {w}");
            }
        }
    }
}

#[test]
fn the_template_is_recognised_by_its_channels() {
    assert!(is_harmony(
        "{{- '<|start|>assistant<|channel|>final<|message|>' }}"
    ));
    assert!(!is_harmony("{{- '<|im_start|>assistant\n' }}"));
}
