//! Tool calls (`engine::chat::tools`): streamed parses that match whole ones on every chunking,
//! grammars whose random walks on a tiny model always parse into valid calls, and the real
//! model forced to call a tool.

mod common;

use std::sync::Arc;

use engine::chat::tools::{
    parse_tool_calls, tool_grammar, ToolCall, ToolCallEvent, ToolCallStream, ToolChoice, ToolFormat,
};
use engine::constraint::{Constraint, Vocab};
use engine::sampling::{Sampler, SamplerParams};
use engine::testing::{SplitMix64, TinyChatModel};
use engine::{ContextParams, Model, Session};
use serde_json::{json, Value};

const FORMATS: [ToolFormat; 6] = [
    ToolFormat::Hermes,
    ToolFormat::QwenXml,
    ToolFormat::Llama3,
    ToolFormat::Mistral,
    ToolFormat::MistralArgs,
    ToolFormat::Generic,
];

/// Replies in each format: calls, content around them, near misses, cut-off calls.
fn corpus(format: ToolFormat) -> Vec<&'static str> {
    match format {
        ToolFormat::Hermes => vec![
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Paris, France\"}}\n</tool_call>",
            "I'll check both.\n\n<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": \"}{\\\"\", \"y\": [1, 2]}}\n</tool_call>\n<tool_call>\n{\"name\": \"b\", \"arguments\": \"{\\\"z\\\": true}\"}\n</tool_call>\nDone.",
            "<tool_call>{\"arguments\": {\"q\": \"é漢\"}, \"name\": \"search\"}</tool_call>",
            "a < b and <tool_call> is a tag; <tool_call>{\"nam\": 1}</tool_call> <tool_cal",
            "text <tool_call>\n{\"name\": \"cut\", \"arguments\": {\"code\": \"print(",
            "<tool_call>{\"name\": \"f\"}</tool_call><tool_call>{\"name\": \"g\", \"arguments\": {}} trailing",
            "   leading and trailing   \n",
        ],
        ToolFormat::QwenXml => vec![
            "<tool_call>\n<function=get_weather>\n<parameter=location>\nParis, France\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
            "I will run it.\n<tool_call>\n<function=python>\n<parameter=code>\nx = \"</param\"\nprint(x < 2)\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=noargs>\n</function>\n</tool_call>",
            "<tool_call>\n{\"name\": \"json_style\", \"arguments\": {\"a\": [true]}}\n</tool_call>",
            "<tool_call>\n<function=cut>\n<parameter=a>\n{\"k\": 1}\n</parameter>\n<parameter=b>\nunfinished",
            "<tool_call>\n<function=bad name\n</tool_call> <tool_call><funct",
        ],
        ToolFormat::Llama3 => vec![
            "{\"name\": \"get_weather\", \"parameters\": {\"location\": \"Paris\"}}",
            "{\"type\": \"function\", \"name\": \"f\", \"parameters\": {\"a\": {\"b\": \"{\"}}}; {\"name\": \"g\", \"parameters\": {}}",
            "Use {braces} and {\"name\": 3} or {\"key\": \"v\"}, then {\"name\": \"h\", \"parameters\": {\"n\": 1}}",
            "<|python_tag|>brave_search.call(query=\"weather in Paris, today\")",
            "<|python_tag|>wolfram_alpha.call(query='2+2', n=2, ok=True)<|python_tag|>print('x')",
            "<|python_tag|>import os\nprint(os.getcwd())\n",
            "<|python_tag|>{\"name\": \"f\", \"parameters\": {\"x\": 1}}",
            "almost <|python_ta",
        ],
        ToolFormat::Mistral | ToolFormat::MistralArgs => vec![
            "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Paris\"}, \"id\": \"a1b2c3d4e\"}]",
            "Calling.[TOOL_CALLS] [{\"name\": \"f\", \"arguments\": {}}, {\"name\": \"g\", \"arguments\": {\"k\": [\"]\"]}, \"id\": \"123456789\"}]",
            "[TOOL_CALLS]get_weather[ARGS]{\"location\": \"Paris\"}[TOOL_CALLS]get_time[CALL_ID]abc123def[ARGS]{}",
            "[TOOL_CALLS]broken name[ARGS]{} and [TOOL_CALLS][{\"x\": 1}] [TOOL_CA",
            "[TOOL_CALLS]cut[ARGS]{\"a\": \"unfinished",
            "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {\"a\": 1}}, oops",
        ],
        ToolFormat::Generic => vec![
            "{\"tool_call\": {\"name\": \"get_weather\", \"arguments\": {\"location\": \"Paris\"}}}",
            "{\n  \"tool_calls\": [\n    {\"name\": \"a\", \"arguments\": {\"x\": 1}},\n    {\"name\": \"b\", \"arguments\": {}}\n  ]\n}",
            "{\"response\": \"Hello, \\\"world\\\" \\u00e9\"}",
            "{\"other\": \"json\"}",
            "Plain text answer.",
            "{\"tool_call\": {\"name\": \"cut\", \"arguments\": {",
        ],
    }
}

/// The content and calls a stream gives when fed `chunks`, rebuilt from its events alone,
/// checking that each call starts before its arguments and calls come in order.
fn streamed(format: ToolFormat, chunks: &[&str], seed: u64) -> (String, Vec<ToolCall>) {
    let mut s = ToolCallStream::with_seed(format, seed);
    let mut events = Vec::new();
    for c in chunks {
        events.extend(s.push(c));
    }
    events.extend(s.finish());
    let mut content = String::new();
    let mut calls: Vec<ToolCall> = Vec::new();
    for e in events {
        // Every event turns into an OpenAI delta.
        let delta = e.to_openai_delta();
        assert!(delta.is_object());
        match e {
            ToolCallEvent::Content(t) => {
                assert!(!t.is_empty());
                content.push_str(&t);
            }
            ToolCallEvent::CallStart { index, id, name } => {
                assert_eq!(index, calls.len());
                calls.push(ToolCall {
                    id,
                    name,
                    arguments: String::new(),
                });
            }
            ToolCallEvent::Arguments { index, fragment } => {
                assert!(index + 1 == calls.len(), "arguments of an earlier call");
                assert!(!fragment.is_empty());
                calls[index].arguments.push_str(&fragment);
            }
        }
    }
    let (c2, calls2) = s.into_parts();
    assert_eq!((&content, &calls), (&c2, &calls2));
    (content, calls)
}

/// Splits `text` at the byte offsets `cuts` (kept on char boundaries).
fn split<'a>(text: &'a str, cuts: &[usize]) -> Vec<&'a str> {
    let mut pieces = Vec::new();
    let mut last = 0;
    for &c in cuts {
        if c > last && c < text.len() && text.is_char_boundary(c) {
            pieces.push(&text[last..c]);
            last = c;
        }
    }
    pieces.push(&text[last..]);
    pieces
}

#[test]
fn streamed_parses_match_whole_parses_on_every_chunking() {
    let mut rng = SplitMix64(5);
    for format in FORMATS {
        for text in corpus(format) {
            let whole = streamed(format, &[text], 9);
            // The whole parse with a random seed gives the same calls but other ids.
            let (content, calls) = parse_tool_calls(text, format);
            assert_eq!(content, whole.0, "{format:?} {text:?}");
            assert_eq!(calls.len(), whole.1.len());
            for (a, b) in calls.iter().zip(&whole.1) {
                assert_eq!((&a.name, &a.arguments), (&b.name, &b.arguments));
            }
            // Byte by byte, every split in two, random chunkings.
            let bytes: Vec<usize> = (1..text.len()).collect();
            assert_eq!(streamed(format, &split(text, &bytes), 9), whole, "{text:?}");
            for cut in 1..text.len() {
                assert_eq!(
                    streamed(format, &split(text, &[cut]), 9),
                    whole,
                    "{format:?} {text:?} cut at {cut}"
                );
            }
            for _ in 0..30 {
                let mut cuts: Vec<usize> = (0..rng.next_u64() % 8)
                    .map(|_| (rng.next_u64() % text.len().max(1) as u64) as usize)
                    .collect();
                cuts.sort_unstable();
                let chunks = split(text, &cuts);
                assert_eq!(streamed(format, &chunks, 9), whole, "{chunks:?}");
            }
        }
    }
}

#[test]
fn realistic_replies_parse_into_expected_calls() {
    let expect = |format, text: &str, content: &str, calls: &[(&str, Value)]| {
        let (c, got) = parse_tool_calls(text, format);
        assert_eq!(c, content, "{format:?} {text:?}");
        assert_eq!(got.len(), calls.len(), "{format:?} {text:?}: {got:?}");
        for (g, (name, args)) in got.iter().zip(calls) {
            assert_eq!(g.name, *name);
            let parsed: Value = serde_json::from_str(&g.arguments).unwrap();
            assert_eq!(&parsed, args, "{text:?}");
        }
    };
    let weather = json!({"location": "Paris, France"});
    // Qwen 2.5 / Hermes 2 Pro.
    expect(
        ToolFormat::Hermes,
        "<tool_call>\n{\"name\": \"get_current_weather\", \"arguments\": {\"location\": \"Paris, France\"}}\n</tool_call>",
        "",
        &[("get_current_weather", weather.clone())],
    );
    // Qwen 3 thinks first (the reasoning split happens before), then calls.
    expect(
        ToolFormat::Hermes,
        "Let me look that up.\n\n<tool_call>\n{\"name\": \"python\", \"arguments\": {\"code\": \"print('hello world')\"}}\n</tool_call>",
        "Let me look that up.",
        &[("python", json!({"code": "print('hello world')"}))],
    );
    // Qwen3-Coder, Qwen 3.5.
    expect(
        ToolFormat::QwenXml,
        "<tool_call>\n<function=get_current_weather>\n<parameter=location>\nParis, France\n</parameter>\n</function>\n</tool_call>",
        "",
        &[("get_current_weather", weather.clone())],
    );
    expect(
        ToolFormat::QwenXml,
        "Running.\n<tool_call>\n<function=python>\n<parameter=code>\nprint(1)\nprint(2)\n</parameter>\n<parameter=timeout>\n30\n</parameter>\n<parameter=opts>\n{\"a\": [1]}\n</parameter>\n</function>\n</tool_call>",
        "Running.",
        &[("python", json!({"code": "print(1)\nprint(2)", "timeout": 30, "opts": {"a": [1]}}))],
    );
    // Llama 3.1/3.2/3.3.
    expect(
        ToolFormat::Llama3,
        "{\"name\": \"get_current_weather\", \"parameters\": {\"location\": \"Paris, France\"}}",
        "",
        &[("get_current_weather", weather.clone())],
    );
    expect(
        ToolFormat::Llama3,
        "<|python_tag|>{\"type\": \"function\", \"name\": \"test\", \"parameters\": {\"success\": true}}",
        "",
        &[("test", json!({"success": true}))],
    );
    expect(
        ToolFormat::Llama3,
        "<|python_tag|>brave_search.call(query=\"llama.cpp\")",
        "",
        &[("brave_search", json!({"query": "llama.cpp"}))],
    );
    // Mistral Nemo, Mistral Small 3.2.
    expect(
        ToolFormat::Mistral,
        "[TOOL_CALLS][{\"name\": \"get_current_weather\", \"arguments\": {\"location\": \"Paris, France\"}, \"id\": \"123456789\"}]",
        "",
        &[("get_current_weather", weather.clone())],
    );
    expect(
        ToolFormat::MistralArgs,
        "[TOOL_CALLS]get_current_weather[ARGS]{\"location\": \"Paris, France\"}",
        "",
        &[("get_current_weather", weather.clone())],
    );
    // llama-server's generic form.
    expect(
        ToolFormat::Generic,
        "{\"tool_call\": {\"name\": \"get_current_weather\", \"arguments\": {\"location\": \"Paris, France\"}}}",
        "",
        &[("get_current_weather", weather)],
    );
    expect(
        ToolFormat::Generic,
        "{\"response\": \"It is sunny.\"}",
        "It is sunny.",
        &[],
    );
}

// ---- grammars ----

fn tools() -> Vec<Value> {
    vec![
        json!({"type": "function", "function": {
            "name": "get_weather",
            "description": "Get the weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "location": {"type": "string", "minLength": 1, "maxLength": 8},
                    "unit": {"enum": ["c", "f"]}
                },
                "required": ["location"],
                "additionalProperties": false
            }
        }}),
        json!({"type": "function", "function": {
            "name": "set_flag",
            "description": "Set a flag.",
            "parameters": {
                "type": "object",
                "properties": {
                    "on": {"type": "boolean"},
                    "level": {"type": "integer", "minimum": 0, "maximum": 9}
                },
                "required": ["on", "level"],
                "additionalProperties": false
            }
        }}),
    ]
}

/// Checks `call` against the tool of its name in [`tools`]: required keys, no others, types.
fn validate(call: &ToolCall) -> Result<(), String> {
    let args: Value =
        serde_json::from_str(&call.arguments).map_err(|e| format!("{e}: {:?}", call.arguments))?;
    let obj = args.as_object().ok_or("arguments are not an object")?;
    let ok = match call.name.as_str() {
        "get_weather" => {
            let loc = obj.get("location").and_then(Value::as_str);
            loc.is_some_and(|l| (1..=8).contains(&l.chars().count()))
                && obj.get("unit").is_none_or(|u| u == "c" || u == "f")
                && obj.keys().all(|k| k == "location" || k == "unit")
        }
        "set_flag" => {
            obj.get("on").is_some_and(Value::is_boolean)
                && obj
                    .get("level")
                    .and_then(Value::as_i64)
                    .is_some_and(|l| (0..=9).contains(&l))
                && obj.len() == 2
        }
        other => return Err(format!("unknown tool {other}")),
    };
    if ok {
        Ok(())
    } else {
        Err(format!("{} {}", call.name, call.arguments))
    }
}

fn tiny_model() -> Arc<Model> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    TinyChatModel {
        letter_merges: true,
        ..Default::default()
    }
    .write(&path)
    .unwrap();
    Model::load(&path).unwrap()
}

#[test]
fn grammar_walks_on_a_tiny_model_always_parse_into_valid_calls() {
    let model = tiny_model();
    let tok = model.tokenizer();
    let vocab = Vocab::new(tok).unwrap();
    let n = tok.n_vocab();
    let eog = vocab.eog_tokens().to_vec();
    let closers: Vec<u32> = ["\"", "}", "]", "\n"]
        .iter()
        .filter_map(|s| tok.token_id(s))
        .collect();
    let mut rng = SplitMix64(17);
    let tools = tools();
    for format in FORMATS {
        for (choice, parallel) in [
            (ToolChoice::Required, false),
            (ToolChoice::Required, true),
            (ToolChoice::Named("set_flag".into()), false),
        ] {
            let grammar = tool_grammar(&tools, choice.clone(), parallel, format).unwrap();
            let mut names = std::collections::HashSet::new();
            for walk in 0..12 {
                let mut c = Constraint::new(&vocab, &grammar)
                    .unwrap_or_else(|e| panic!("{format:?}: {e}\n{grammar:?}"));
                let mut text = Vec::new();
                let mut ended = false;
                for _ in 0..600 {
                    let mut logits = vec![0.0f32; n];
                    c.mask_logits(&mut logits).unwrap();
                    let allowed: Vec<u32> = (0..n as u32)
                        .filter(|&t| logits[t as usize] == 0.0)
                        .collect();
                    assert!(!allowed.is_empty(), "{:?}", String::from_utf8_lossy(&text));
                    let end = allowed.iter().find(|t| eog.contains(t));
                    // End when possible most of the time; else prefer closing strings and
                    // objects half of the time, to keep walks short.
                    let t = match end {
                        Some(&e) if !rng.next_u64().is_multiple_of(4) => e,
                        _ => {
                            let close = closers
                                .iter()
                                .find(|t| allowed.contains(t) && rng.next_u64().is_multiple_of(2));
                            match close {
                                Some(&t) => t,
                                None => allowed[(rng.next_u64() % allowed.len() as u64) as usize],
                            }
                        }
                    };
                    c.accept(t).unwrap();
                    if eog.contains(&t) {
                        ended = true;
                        break;
                    }
                    text.extend_from_slice(tok.visible_bytes(t));
                    if c.is_done() {
                        ended = true;
                        break;
                    }
                }
                let text = String::from_utf8(text).unwrap();
                assert!(ended, "{format:?} walk {walk}: no end: {text:?}");
                let (content, calls) = parse_tool_calls(&text, format);
                assert_eq!(content, "", "{format:?}: {text:?}");
                assert!(!calls.is_empty(), "{format:?}: {text:?}");
                if !parallel {
                    assert_eq!(calls.len(), 1, "{format:?}: {text:?}");
                }
                for call in &calls {
                    validate(call).unwrap_or_else(|e| panic!("{format:?}: {e} in {text:?}"));
                    if let ToolChoice::Named(n) = &choice {
                        assert_eq!(&call.name, n);
                    }
                    names.insert(call.name.clone());
                    if format == ToolFormat::Mistral {
                        assert_eq!(call.id.len(), 9);
                    }
                }
            }
            if choice == ToolChoice::Required {
                assert_eq!(names.len(), 2, "{format:?}: walks called only {names:?}");
            }
        }
    }
}

#[test]
fn real_model_required_tool_call_greedy() {
    let Some(path) = common::real_model_path() else {
        eprintln!("skipped: models/SmolLM2-135M-Instruct.Q4_1.gguf is absent");
        return;
    };
    let model = Model::load(&path).unwrap();
    let vocab = Vocab::new(model.tokenizer()).unwrap();
    let mut session = Session::new(
        model.clone(),
        ContextParams {
            n_ctx: 1024,
            ..Default::default()
        },
    )
    .unwrap();
    let tools = tools();
    let tool_list: Vec<String> = tools.iter().map(|t| t["function"].to_string()).collect();
    let prompt = format!(
        "<|im_start|>system\nYou may call these tools:\n<tools>\n{}\n</tools>\nCall a tool as \
         <tool_call>\n{{\"name\": <name>, \"arguments\": <arguments>}}\n</tool_call><|im_end|>\n\
         <|im_start|>user\nWhat is the weather in Paris?<|im_end|>\n<|im_start|>assistant\n",
        tool_list.join("\n")
    );
    for (choice, parallel, format) in [
        (ToolChoice::Required, false, ToolFormat::Hermes),
        (
            ToolChoice::Named("get_weather".into()),
            false,
            ToolFormat::Hermes,
        ),
        (ToolChoice::Required, false, ToolFormat::Generic),
        (ToolChoice::Required, false, ToolFormat::Llama3),
        (ToolChoice::Required, false, ToolFormat::QwenXml),
    ] {
        let grammar = tool_grammar(&tools, choice.clone(), parallel, format).unwrap();
        let mut c = Constraint::new(&vocab, &grammar).unwrap();
        let mut sampler = Sampler::new(SamplerParams::greedy());
        session.truncate(0).unwrap();
        let mut logits = session.feed_text(&prompt).unwrap().to_vec();
        let tok = model.tokenizer();
        let mut out = Vec::new();
        let mut ended = false;
        for _ in 0..200 {
            c.mask_logits(&mut logits).unwrap();
            let token = sampler.sample(&logits, session.tokens());
            c.accept(token).unwrap();
            if tok.is_eog(token) {
                ended = true;
                break;
            }
            out.extend_from_slice(tok.token_bytes(token));
            if c.is_done() {
                ended = true;
                break;
            }
            logits = session.feed(&[token]).unwrap().to_vec();
        }
        let text = String::from_utf8_lossy(&out).into_owned();
        eprintln!("{format:?} {choice:?}: {text}");
        assert!(ended, "no end in 200 tokens: {text:?}");
        let (content, calls) = parse_tool_calls(&text, format);
        assert_eq!(content, "", "{text:?}");
        assert!(!calls.is_empty(), "{text:?}");
        for call in &calls {
            validate(call).unwrap_or_else(|e| panic!("{e} in {text:?}"));
        }
        if let ToolChoice::Named(n) = &choice {
            assert_eq!(&calls[0].name, n);
        }
    }
}

/// Feeds `text` byte by byte; whether every byte was allowed and the grammar may end there.
fn accepts(c: &mut Constraint, model: &Model, text: &str) -> bool {
    let alphabet = engine::testing::byte_alphabet();
    let tok = model.tokenizer();
    for b in text.bytes() {
        let t = tok.token_id(&alphabet[b as usize].to_string()).unwrap();
        if !c.is_allowed(t).unwrap() {
            return false;
        }
        c.accept(t).unwrap();
    }
    c.can_end()
}

#[test]
fn xml_string_values_end_only_at_their_closing_tag() {
    let model = tiny_model();
    let vocab = Vocab::new(model.tokenizer()).unwrap();
    let tools = [
        json!({"type": "function", "function": {"name": "run", "parameters": {
            "type": "object",
            "properties": {"code": {"type": "string"}, "n": {"type": "integer"}},
            "required": ["code"]
        }}}),
    ];
    let grammar = tool_grammar(&tools, ToolChoice::Required, false, ToolFormat::QwenXml).unwrap();
    let head = "<tool_call>\n<function=run>\n<parameter=code>\n";
    for (text, ok) in [
        (format!("{head}a < b\n</param\n</parameter>\n</function>\n</tool_call>"), true),
        (format!("{head}\n</parameter>\n<parameter=n>\n42\n</parameter>\n</function>\n</tool_call>"), true),
        (format!("{head}x</parameter>y\n</parameter>\n</function>\n</tool_call>"), false),
        (format!("{head}x\n</parameter>\n<parameter=n>\n\"s\"\n</parameter>\n</function>\n</tool_call>"), false),
        (format!("{head}x\n</parameter>\n</function>\n"), false),
    ] {
        let mut c = Constraint::new(&vocab, &grammar).unwrap();
        assert_eq!(accepts(&mut c, &model, &text), ok, "{text:?}");
        if ok {
            let (content, calls) = parse_tool_calls(&text, ToolFormat::QwenXml);
            assert_eq!((content.as_str(), calls.len()), ("", 1), "{text:?}");
            assert!(serde_json::from_str::<Value>(&calls[0].arguments).is_ok());
        }
    }
}
