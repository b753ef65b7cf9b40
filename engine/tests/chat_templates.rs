//! `ChatTemplate::render_request`: llama-server's template behaviour (its `test_template.py`
//! cases: reasoning on/off/auto, today's date, the generation prompt), assistant prefill, tool
//! calls, kwargs, and the same renders through the renderer process.

use std::path::{Path, PathBuf};
use std::time::Duration;

use engine::chat::sandbox::{self, Limits};
use engine::chat::{prompt_opens_thinking, ChatTemplate, Reasoning, RenderRequest};
use engine::Error;
use serde_json::{json, Value as Json};

const DEEPSEEK_R1: &str =
    include_str!("fixtures/templates/deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja");
const QWQ: &str = include_str!("fixtures/templates/Qwen-QwQ-32B.jinja");
const QWEN3: &str = include_str!("fixtures/templates/Qwen-Qwen3-0.6B.jinja");

/// The renderer's `main` when the sandbox test starts this executable as the renderer.
#[test]
fn renderer_entry() {
    sandbox::serve_if_renderer();
}

/// test_template.py's `TEST_TOOL`.
fn test_tool() -> Json {
    json!({
        "type": "function",
        "function": {
            "name": "test",
            "description": "",
            "parameters": {
                "type": "object",
                "properties": {"success": {"type": "boolean", "const": true}},
                "required": ["success"],
            },
        },
    })
}

fn user(text: &str) -> Json {
    json!({"role": "user", "content": text})
}

fn assistant(text: &str) -> Json {
    json!({"role": "assistant", "content": text})
}

fn request(messages: Vec<Json>, tools: Option<Vec<Json>>, reasoning: Reasoning) -> RenderRequest {
    RenderRequest {
        tools,
        reasoning,
        ..RenderRequest::new(messages)
    }
}

/// Turns the sandbox on, with this executable as the renderer: every test of this file renders
/// there (a process chooses once), and compares with renders in process (`render_here`).
fn turn_on() {
    let exe = std::env::current_exe().unwrap();
    let args = [
        "renderer_entry",
        "--exact",
        "--nocapture",
        "--test-threads=1",
    ];
    let limits = Limits {
        memory_bytes: 512 << 20,
        time: Duration::from_secs(5),
    };
    sandbox::enable(exe, args.iter().map(Into::into).collect(), limits);
}

fn template(source: &str) -> ChatTemplate {
    turn_on();
    ChatTemplate::new(source, "<s>", "</s>").unwrap()
}

/// DeepSeek R1 and QwQ as their authors publish them: without llama.cpp's `enable_thinking`
/// edit, the engine must close the block itself.
fn unedited(source: &str) -> String {
    let edits = [
        "{% if not enable_thinking %}{{- '</think>' -}}{% endif %}",
        "{%- if not enable_thinking -%}{{- '</think>' -}}{%- endif -%}",
    ];
    let mut s = source.to_string();
    let before = s.len();
    for e in edits {
        s = s.replace(e, "");
    }
    assert!(s.len() < before, "the fixture has the edit");
    assert!(!s.contains("enable_thinking"));
    s
}

/// Command R7B's shape: the generation prompt ends at `<|CHATBOT_TOKEN|>` and the system
/// preamble teaches `<|START_THINKING|>`; `handles_thinking` adds what llama.cpp's copy adds.
fn command_r7b(handles_thinking: bool) -> String {
    let end = if handles_thinking {
        "{%- if not enable_thinking -%}<|START_THINKING|><|END_THINKING|>{%- endif %}"
    } else {
        ""
    };
    format!(
        "{{{{ bos_token }}}}<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>Plan between <|START_THINKING|> and \
         <|END_THINKING|>.{{% if tools %}} Tools: {{{{ tools | tojson }}}}{{% endif %}}<|END_OF_TURN_TOKEN|>\
         {{% for m in messages %}}<|START_OF_TURN_TOKEN|>{{% if m.role == 'user' %}}<|USER_TOKEN|>\
         {{% else %}}<|CHATBOT_TOKEN|>{{% endif %}}{{{{ m.content }}}}<|END_OF_TURN_TOKEN|>{{% endfor %}}\
         {{% if add_generation_prompt %}}<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>{end}{{% endif %}}"
    )
}

/// test_template.py's `test_reasoning`, for each of its `tools` values.
#[test]
fn reasoning_on_off_auto_as_llama_server() {
    let r1_unedited = unedited(DEEPSEEK_R1);
    let qwq_unedited = unedited(QWQ);
    let (r7b, r7b_edited) = (command_r7b(false), command_r7b(true));
    let cases: &[(&str, &str, Reasoning, &str)] = &[
        ("r1", DEEPSEEK_R1, Reasoning::On, "<think>\n"),
        ("r1", DEEPSEEK_R1, Reasoning::Auto, "<think>\n"),
        ("r1", DEEPSEEK_R1, Reasoning::Off, "<think>\n</think>"),
        (
            "r1 unedited",
            &r1_unedited,
            Reasoning::On,
            "<｜Assistant｜><think>\n",
        ),
        ("r1 unedited", &r1_unedited, Reasoning::Auto, "<think>\n"),
        (
            "r1 unedited",
            &r1_unedited,
            Reasoning::Off,
            "<｜Assistant｜><think>\n</think>",
        ),
        ("qwen3", QWEN3, Reasoning::Auto, "<|im_start|>assistant\n"),
        (
            "qwen3",
            QWEN3,
            Reasoning::Off,
            "<|im_start|>assistant\n<think>\n\n</think>\n\n",
        ),
        (
            "qwq",
            QWQ,
            Reasoning::Auto,
            "<|im_start|>assistant\n<think>\n",
        ),
        (
            "qwq",
            QWQ,
            Reasoning::Off,
            "<|im_start|>assistant\n<think>\n</think>",
        ),
        (
            "qwq unedited",
            &qwq_unedited,
            Reasoning::Auto,
            "<|im_start|>assistant\n<think>\n",
        ),
        (
            "qwq unedited",
            &qwq_unedited,
            Reasoning::Off,
            "<|im_start|>assistant\n<think>\n</think>",
        ),
        (
            "r7b",
            &r7b,
            Reasoning::Auto,
            "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>",
        ),
        (
            "r7b",
            &r7b,
            Reasoning::Off,
            "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|><|START_THINKING|><|END_THINKING|>",
        ),
        (
            "r7b edited",
            &r7b_edited,
            Reasoning::Auto,
            "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>",
        ),
        (
            "r7b edited",
            &r7b_edited,
            Reasoning::Off,
            "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|><|START_THINKING|><|END_THINKING|>",
        ),
    ];
    for (name, source, reasoning, end) in cases {
        let t = template(source);
        for tools in [None, Some(vec![]), Some(vec![test_tool()])] {
            let with_tool = tools.as_ref().is_some_and(|t| !t.is_empty());
            let req = request(vec![user("What is today?")], tools, *reasoning);
            let prompt = t.render_request(&req).unwrap();
            assert!(
                prompt.ends_with(end),
                "{name} {reasoning:?} tool={with_tool}: {prompt:?}"
            );
            // The tool reaches templates that describe tools, and only when there is one.
            if *name == "qwen3" || *name == "r7b" {
                assert_eq!(
                    prompt.contains("\"success\""),
                    with_tool,
                    "{name}: {prompt:?}"
                );
            }
            let open = *reasoning != Reasoning::Off && end.ends_with("<think>\n");
            assert_eq!(prompt_opens_thinking(&prompt), open, "{name} {reasoning:?}");
        }
    }
    // The whole DeepSeek prompt, reasoning off.
    turn_on();
    let t = ChatTemplate::new(&r1_unedited, "<｜begin▁of▁sentence｜>", "").unwrap();
    let req = request(
        vec![json!({"role": "system", "content": "Sys."}), user("Hi")],
        None,
        Reasoning::Off,
    );
    assert_eq!(
        t.render_request(&req).unwrap(),
        "<｜begin▁of▁sentence｜>Sys.<｜User｜>Hi<｜Assistant｜><think>\n</think>"
    );
    // `enable_thinking` in the kwargs wins over the reasoning setting.
    let mut req = request(vec![user("Hi")], None, Reasoning::On);
    req.kwargs.insert("enable_thinking".into(), json!(false));
    assert!(t
        .render_request(&req)
        .unwrap()
        .ends_with("<think>\n</think>"));
    req.kwargs.insert("enable_thinking".into(), json!(true));
    req.reasoning = Reasoning::Off;
    assert!(t.render_request(&req).unwrap().ends_with("<think>\n"));
}

/// Today's date as the system formats it in the C locale.
fn today(format: &str) -> String {
    let out = std::process::Command::new("date")
        .arg(format!("+{format}"))
        .env("LC_ALL", "C")
        .output()
        .expect("the date command");
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// Llama 3.3's way with the date: `date_string`, with a stale default when it is undefined.
const LLAMA33_LIKE: &str = r#"{{- bos_token }}
{%- if not date_string is defined %}
    {%- set date_string = "26 Jul 2024" %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{%- if tools is not none %}
    {{- "Environment: ipython\n" }}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\n" }}
{{- "Today Date: " + date_string + "\n\n" }}
{%- if tools is not none %}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
{%- endif %}
{{- "<|eot_id|>" }}
{%- for message in messages %}
    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
"#;

/// test_template.py's `test_date_inside_prompt`: Llama 3.3 reads `date_string` ("%d %b %Y"),
/// firefunction-v2 `datetime` ("%b %d %Y"); Llama 3.2 calls `strftime_now`.
#[test]
fn todays_date_inside_the_prompt() {
    let firefunction_like = "{%- set suffix = 'Functions.' + '\\nToday is ' + datetime + '.' -%}\
        {{- bos_token + '<|start_header_id|>system<|end_header_id|>\\n\\n' + suffix + '<|eot_id|>' -}}\
        {%- for m in messages -%}{{- '<|start_header_id|>' + m.role + '<|end_header_id|>\\n\\n' + m.content + '<|eot_id|>' -}}{%- endfor -%}";
    let strftime_like =
        "{%- set date_string = strftime_now('%d %b %Y') -%}Today Date: {{ date_string }} \
        ({{ strftime_now('%A %B %-d, %Y') }})";
    let cases = [
        (LLAMA33_LIKE, "%d %b %Y"),
        (firefunction_like, "%b %d %Y"),
        (strftime_like, "%d %b %Y"),
        (strftime_like, "%A %B %-d, %Y"),
    ];
    for (source, format) in cases {
        let t = template(source);
        for tools in [None, Some(vec![]), Some(vec![test_tool()])] {
            let req = request(vec![user("What is today?")], tools, Reasoning::Auto);
            let prompt = t.render_request(&req).unwrap();
            let want = today(format);
            assert!(prompt.contains(&want), "{want:?} in {prompt:?}");
            assert!(!prompt.contains("26 Jul 2024"), "{prompt}");
        }
    }
    // Llama 3.3 describes the tool with `tojson(indent=4)`, as Python would.
    let req = request(vec![user("Hi")], Some(vec![test_tool()]), Reasoning::Auto);
    let prompt = template(LLAMA33_LIKE).render_request(&req).unwrap();
    assert!(prompt.contains("Environment: ipython\n"), "{prompt}");
    assert!(
        prompt.contains("\"success\": {\n                    \"type\": \"boolean\",\n                    \"const\": true\n"),
        "{prompt}"
    );
    // A date given in the kwargs wins.
    let mut req = request(vec![user("Hi")], None, Reasoning::Auto);
    req.kwargs
        .insert("date_string".into(), json!("01 Jan 2000"));
    let prompt = template(LLAMA33_LIKE).render_request(&req).unwrap();
    assert!(prompt.contains("Today Date: 01 Jan 2000\n"), "{prompt}");
}

/// test_template.py's `test_add_generation_prompt`.
#[test]
fn generation_prompt_only_when_asked() {
    let t = template(LLAMA33_LIKE);
    for add in [false, true] {
        let mut req = request(vec![user("What is today?")], None, Reasoning::Auto);
        req.add_generation_prompt = add;
        let prompt = t.render_request(&req).unwrap();
        assert_eq!(
            prompt.contains("<|start_header_id|>assistant<|end_header_id|>"),
            add,
            "{prompt}"
        );
        assert!(
            prompt.starts_with("<s><|start_header_id|>system"),
            "{prompt}"
        );
    }
}

#[test]
fn continue_final_message_ends_inside_the_assistant_message() {
    let chatml = ChatTemplate::chatml();
    let mut req = request(vec![user("Hi"), assistant("Hel")], None, Reasoning::Auto);
    req.continue_final_message = true;
    assert_eq!(
        chatml.render_request(&req).unwrap(),
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHel"
    );
    // Qwen3 wraps the final assistant turn's (empty) reasoning around the content.
    assert_eq!(
        template(QWEN3).render_request(&req).unwrap(),
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nHel"
    );
    // The built-in Llama 3 template trims contents: the prefill keeps its own end.
    let llama3 = ChatTemplate::builtin("llama3", "", "").unwrap();
    let mut req = request(vec![user("Hi"), assistant(" Sure,")], None, Reasoning::Auto);
    req.continue_final_message = true;
    assert_eq!(
        llama3.render_request(&req).unwrap(),
        "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>\
         <|start_header_id|>assistant<|end_header_id|>\n\nSure,"
    );
    // A template that drops assistant contents: the prefill follows a generation prompt.
    let dropping = template(
        "{% for m in messages %}<{{ m.role }}>{% if m.role != 'assistant' %}{{ m.content }}{% endif %}\
         {% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}",
    );
    let mut req = request(vec![user("Hi"), assistant("Hel")], None, Reasoning::Auto);
    req.continue_final_message = true;
    assert_eq!(
        dropping.render_request(&req).unwrap(),
        "<user>Hi<assistant>Hel"
    );
    // A prefill in text parts: a blank line between them, as llama-server writes it; the
    // parts of earlier messages are joined by one newline.
    let parts = |a: &str, b: &str| serde_json::json!([{ "type": "text", "text": a }, { "type": "text", "text": b }]);
    let mut req = request(
        vec![
            serde_json::json!({ "role": "user", "content": parts("Hi", "there") }),
            serde_json::json!({ "role": "assistant", "content": parts("Wh", "ill") }),
        ],
        None,
        Reasoning::Auto,
    );
    req.continue_final_message = true;
    assert_eq!(
        chatml.render_request(&req).unwrap(),
        "<|im_start|>user\nHi\nthere<|im_end|>\n<|im_start|>assistant\nWh\n\nill"
    );
    assert_eq!(
        dropping.render_request(&req).unwrap(),
        "<user>Hi\nthere<assistant>Wh\n\nill"
    );
    // Without a final assistant message it is a plain generation prompt; without
    // continue_final_message the assistant message is closed.
    let mut req = request(vec![user("Hi")], None, Reasoning::Auto);
    req.continue_final_message = true;
    assert_eq!(
        chatml.render_request(&req).unwrap(),
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    );
    let mut req = request(vec![user("Hi"), assistant("Hel")], None, Reasoning::Auto);
    req.add_generation_prompt = false;
    assert!(chatml
        .render_request(&req)
        .unwrap()
        .ends_with("Hel<|im_end|>\n"));
}

fn tool_conversation() -> Vec<Json> {
    vec![
        user("Weather in Paris?"),
        json!({
            "role": "assistant",
            "content": null,
            "tool_calls": [{
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
            }],
        }),
        json!({"role": "tool", "tool_call_id": "call_1", "content": "18C"}),
    ]
}

#[test]
fn tool_calls_and_results_reach_the_template() {
    let req = request(tool_conversation(), None, Reasoning::Auto);
    assert_eq!(
        template(QWQ).render_request(&req).unwrap(),
        "<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n<tool_call>\n\
         {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call><|im_end|>\n\
         <|im_start|>user\n<tool_response>\n18C\n</tool_response><|im_end|>\n\
         <|im_start|>assistant\n<think>\n"
    );
    // Arguments are a mapping to templates, printed as the text they came as.
    let cases = [
        (
            "{% for m in messages %}{% for c in m.tool_calls or [] %}\
             {{ c.function.arguments is mapping }} {{ c.function.arguments }} \
             {% for k, v in c.function.arguments.items() %}{{ k }}={{ v }}{% endfor %} \
             {{ c.function.arguments['city'] }}{% endfor %}{% endfor %}",
            "True {\"city\":\"Paris\"} city=Paris Paris",
        ),
        // A template that concatenates them as strings gets strings.
        (
            "{% for m in messages %}{% for c in m.tool_calls or [] %}\
             {{ 'args=' + c.function.arguments }}{% endfor %}{% endfor %}",
            "args={\"city\":\"Paris\"}",
        ),
        // Null content with tool calls is empty text; the tool result keeps its id.
        (
            "{% for m in messages %}[{{ m.content }}|{{ m.tool_call_id }}]{% endfor %}",
            "[Weather in Paris?|][|][18C|call_1]",
        ),
    ];
    for (source, want) in cases {
        assert_eq!(template(source).render_request(&req).unwrap(), want);
    }
    // Arguments that are not a JSON object stay text.
    let mut messages = tool_conversation();
    messages[1]["tool_calls"][0]["function"]["arguments"] = json!("not json");
    let req = request(messages, None, Reasoning::Auto);
    let t = template(
        "{% for c in messages[1].tool_calls %}{{ c.function.arguments is string }}{% endfor %}",
    );
    assert_eq!(t.render_request(&req).unwrap(), "True");
}

#[test]
fn variables_kwargs_and_content_parts() {
    let t = template(
        "{{ bos_token }}{{ eos_token }}|{{ tools is defined }}|{{ custom }}|{{ reasoning_effort }}|\
         {{ add_generation_prompt }}|{% for m in messages %}{{ m.role }}:{{ m.content }};{% endfor %}",
    );
    let messages = vec![
        json!({"role": "developer", "content": "Dev."}),
        json!({"role": "user", "content": [
            {"type": "text", "text": "a"},
            {"type": "image_url", "image_url": {"url": "x"}},
            {"type": "text", "text": "b"},
        ]}),
    ];
    let mut req = request(messages, Some(vec![]), Reasoning::Auto);
    req.kwargs.insert("custom".into(), json!("X"));
    req.kwargs.insert("reasoning_effort".into(), json!("high"));
    // Kwargs cannot replace the messages or the generation prompt.
    req.kwargs.insert("messages".into(), json!([]));
    req.kwargs
        .insert("add_generation_prompt".into(), json!(false));
    assert_eq!(
        t.render_request(&req).unwrap(),
        "<s></s>|False|X|high|True|system:Dev.;user:a\nb;"
    );
    req.tools = Some(vec![test_tool()]);
    assert!(t.render_request(&req).unwrap().contains("|True|X|"));
}

#[test]
fn harmony_templates_read_the_reasoning_as_thinking() {
    // As llama-server for gpt-oss: `reasoning_content` is copied to `thinking`; a message with
    // tool calls then has no content.
    let t = template(
        "{# <|channel|> #}{% for m in messages %}{{ m.role }}:{{ m.thinking }}:\
         {{ m.content is defined }};{% endfor %}",
    );
    let mut messages = tool_conversation();
    messages[1]["reasoning_content"] = json!("Need the weather.");
    messages.push(json!({"role": "assistant", "content": "Sunny.", "reasoning_content": "Easy."}));
    let req = request(messages.clone(), None, Reasoning::Auto);
    let got = t.render_request(&req).unwrap();
    assert!(
        got.contains("assistant:Need the weather.:False;")
            && got.ends_with("assistant:Easy.:True;"),
        "{got}"
    );
    // Other templates see the messages as sent.
    let plain = template(
        "{% for m in messages %}{{ m.role }}:{{ m.thinking is defined }}:\
         {{ m.content is defined }};{% endfor %}",
    );
    let got = plain
        .render_request(&request(messages, None, Reasoning::Auto))
        .unwrap();
    assert!(got.contains("assistant:False:True;"), "{got}");
}

#[test]
fn template_errors_are_errors() {
    let t = template("{{ raise_exception('no tools here') }}");
    let req = request(vec![user("Hi")], None, Reasoning::Auto);
    match t.render_request_here(&req) {
        Err(Error::ChatTemplate(e)) => assert!(e.to_string().contains("no tools here"), "{e}"),
        other => panic!("{other:?}"),
    }
}

/// The same renders in the renderer process, and a hostile template still bounded there.
#[test]
fn render_requests_in_the_renderer() {
    turn_on();
    assert!(sandbox::active().is_some());
    let mut req = request(tool_conversation(), Some(vec![test_tool()]), Reasoning::Off);
    req.kwargs.insert("custom".into(), json!({"k": [1, 2]}));
    for source in [QWQ, QWEN3, DEEPSEEK_R1, &unedited(QWQ)] {
        let t = template(source);
        assert!(!t.is_reviewed());
        assert_eq!(
            t.render_request(&req).unwrap(),
            t.render_request_here(&req).unwrap()
        );
    }
    let mut cont = request(vec![user("Hi"), assistant("Hel")], None, Reasoning::Auto);
    cont.continue_final_message = true;
    let t = template(QWEN3);
    assert!(t
        .render_request(&cont)
        .unwrap()
        .ends_with("</think>\n\nHel"));

    let doubling = "{% set ns = namespace(x=messages[0].content) %}{% for i in range(60) %}\
                    {% set ns.x = ns.x ~ ns.x %}{% endfor %}{{ ns.x|length }}";
    match template(doubling).render_request(&req) {
        Err(Error::TemplateRenderer(e)) => assert!(e.contains("died"), "{e}"),
        other => panic!("{other:?}"),
    }
    let looping = "{% for i in range(1000000000) %}{{ tools | tojson }}{% endfor %}";
    assert!(template(looping).render_request(&req).is_err());
    // And the renderer serves the next request.
    assert_eq!(
        template(QWQ).render_request(&req).unwrap(),
        template(QWQ).render_request_here(&req).unwrap()
    );
}

/// The directory of llama.cpp's templates that may not be committed here:
/// `$LLAMA_CPP_TEMPLATES`, else `<workspace>/models/templates` (`cargo xtask fetch-templates`).
/// Absent: `None` with a note, and under CI (`CI` set) a panic, so the test cannot pass by
/// skipping.
fn llama_cpp_templates() -> Option<PathBuf> {
    let dir = std::env::var_os("LLAMA_CPP_TEMPLATES")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/templates"));
    if dir.join(format!("{R7B}.jinja")).is_file() {
        return Some(dir);
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "CI must render llama.cpp's templates, but {} has none (run `cargo xtask fetch-templates`)",
        dir.display()
    );
    eprintln!(
        "skipped: no llama.cpp templates in {} (run `cargo xtask fetch-templates`)",
        dir.display()
    );
    None
}

/// llama.cpp's template of Command R7B with tools.
const R7B: &str = "CohereForAI-c4ai-command-r7b-12-2024-tool_use";

/// llama.cpp's own copies of the templates `test_template.py` uses (see
/// [`llama_cpp_templates`]).
#[test]
fn llama_cpp_reference_templates() {
    let Some(dir) = llama_cpp_templates() else {
        return;
    };
    let read = |name: &str| {
        let path = dir.join(format!("{name}.jinja"));
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    };
    let r7b = read(R7B);
    for (reasoning, end) in [
        (Reasoning::Auto, "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"),
        (
            Reasoning::Off,
            "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|><|START_THINKING|><|END_THINKING|>",
        ),
    ] {
        for tools in [None, Some(vec![]), Some(vec![test_tool()])] {
            let req = request(vec![user("What is today?")], tools, reasoning);
            let prompt = template(&r7b).render_request(&req).unwrap();
            assert!(prompt.ends_with(end), "{prompt}");
        }
    }
    for (name, format) in [
        ("meta-llama-Llama-3.3-70B-Instruct", "%d %b %Y"),
        ("fireworks-ai-llama-3-firefunction-v2", "%b %d %Y"),
    ] {
        let t = template(&read(name));
        for tools in [None, Some(vec![]), Some(vec![test_tool()])] {
            let req = request(vec![user("What is today?")], tools, Reasoning::Auto);
            let prompt = t.render_request(&req).unwrap();
            assert!(prompt.contains(&today(format)), "{name}: {prompt}");
        }
    }
    let t = template(&read("meta-llama-Llama-3.3-70B-Instruct"));
    for add in [false, true] {
        let mut req = request(vec![user("What is today?")], None, Reasoning::Auto);
        req.add_generation_prompt = add;
        let prompt = t.render_request(&req).unwrap();
        assert_eq!(
            prompt.contains("<|start_header_id|>assistant<|end_header_id|>"),
            add
        );
    }
}
