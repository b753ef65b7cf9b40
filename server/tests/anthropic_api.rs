//! Anthropic's Messages API on a tiny model: the request converted to the chat the template
//! renders (checked against the same chat sent in OpenAI's form), the message's shape, the
//! streamed events in order, forced tool use, `count_tokens` and errors in Anthropic's shape.

mod common;

use common::Env;
use serde_json::{json, Value};

/// A ChatML template that renders tools, tool calls, tool results and reasoning, with
/// Hermes' `<tool_call>` marker (so replies are parsed, and forced, as Hermes calls).
pub const TOOL_TEMPLATE: &str = r#"
{%- if tools %}<|im_start|>system
Tools:{% for t in tools %} {{ t.function.name }}{% endfor %}
Call one as <tool_call>{"name": .., "arguments": ..}</tool_call><|im_end|>
{% endif %}
{%- for m in messages %}<|im_start|>{{ m.role }}
{% if m.reasoning_content %}<think>{{ m.reasoning_content }}</think>{% endif %}
{%- if m.content is string %}{{ m.content }}{% elif m.content %}{% for p in m.content %}{{ p.text }}{% endfor %}{% endif %}
{%- if m.tool_calls %}{% for c in m.tool_calls %}<tool_call>{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}}</tool_call>{% endfor %}{% endif %}
{%- if m.tool_call_id %} [{{ m.tool_call_id }}]{% endif %}<|im_end|>
{% endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"#;

fn weather_tool() -> Value {
    json!({
        "name": "get_weather",
        "description": "The weather in a city",
        "input_schema": {
            "type": "object",
            "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
            "required": ["city"],
            "additionalProperties": false
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_has_anthropics_shape_and_counts_its_cached_tokens() {
    let env = Env::new();
    let srv = env.start(&[]).await;
    let body = json!({
        "model": "claude-test",
        "max_tokens": 6,
        "temperature": 0,
        "system": "You are terse.",
        "metadata": {"user_id": "u1"},
        "messages": [{"role": "user", "content": "Say hello"}]
    });
    let (status, msg) = srv.post("/v1/messages", &body).await;
    assert_eq!(status, 200, "{msg}");
    assert!(msg["id"].as_str().unwrap().starts_with("msg_"), "{msg}");
    assert_eq!(msg["type"], "message");
    assert_eq!(msg["role"], "assistant");
    assert_eq!(msg["content"][0]["type"], "text", "{msg}");
    assert!(msg.get("timings").is_none());
    let out = msg["usage"]["output_tokens"].as_u64().unwrap();
    let reason = msg["stop_reason"].as_str().unwrap();
    assert!(
        (reason == "max_tokens") == (out == 6) && (reason == "max_tokens" || reason == "end_turn"),
        "{reason} after {out} tokens"
    );

    // count_tokens renders the same prompt (it needs no max_tokens).
    let mut count_body = body.clone();
    count_body.as_object_mut().unwrap().remove("max_tokens");
    let (status, count) = srv.post("/v1/messages/count_tokens", &count_body).await;
    assert_eq!(status, 200, "{count}");
    assert_eq!(count.as_object().unwrap().len(), 1, "{count}");
    let n = count["input_tokens"].as_u64().unwrap();
    let usage = &msg["usage"];
    assert_eq!(
        usage["input_tokens"].as_u64().unwrap()
            + usage["cache_read_input_tokens"].as_u64().unwrap(),
        n,
        "{usage}"
    );

    // The same prompt again is read from the cache: all but its last token.
    let (_, again) = srv.post("/v1/messages", &body).await;
    assert_eq!(again["usage"]["cache_read_input_tokens"], n - 1, "{again}");
    assert_eq!(again["usage"]["input_tokens"], 1, "{again}");
    assert_eq!(again["content"], msg["content"]);

    // An empty conversation is accepted, as llama-server accepts it.
    let (status, empty) = srv
        .post("/v1/messages", &json!({"max_tokens": 2, "messages": []}))
        .await;
    assert_eq!(status, 200, "{empty}");
    assert_eq!(empty["type"], "message");
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocks_tools_and_results_render_as_the_equivalent_openai_chat() {
    let env = Env::with_template(Some(TOOL_TEMPLATE));
    let srv = env.start(&[]).await;
    let anthropic = json!({
        "model": "x",
        "system": [{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}],
        "tools": [weather_tool()],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "I should call the tool.", "signature": ""},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "Sunny, 25C"}]},
                {"type": "text", "text": "And now?"}
            ]}
        ]
    });
    let openai = json!({
        "tools": [{"type": "function", "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": weather_tool()["input_schema"].clone()
        }}],
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "", "reasoning_content": "I should call the tool.",
             "tool_calls": [{"id": "toolu_1", "type": "function",
                             "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "toolu_1", "content": "Sunny, 25C"},
            {"role": "user", "content": "And now?"}
        ]
    });
    let (status, a) = srv.post("/v1/messages/count_tokens", &anthropic).await;
    assert_eq!(status, 200, "{a}");
    let (status, o) = srv.post("/v1/chat/completions/input_tokens", &openai).await;
    assert_eq!(status, 200, "{o}");
    assert_eq!(a["input_tokens"], o["input_tokens"]);

    // Each part counts: without the thinking block, or with the result as a string, the
    // prompt changes accordingly.
    let mut no_thinking = anthropic.clone();
    no_thinking["messages"][1]["content"]
        .as_array_mut()
        .unwrap()
        .remove(0);
    let (_, fewer) = srv.post("/v1/messages/count_tokens", &no_thinking).await;
    let thinking_tokens = "<think>I should call the tool.</think>".len() as u64;
    assert_eq!(
        fewer["input_tokens"].as_u64().unwrap() + thinking_tokens,
        a["input_tokens"].as_u64().unwrap()
    );
    let mut as_string = anthropic.clone();
    as_string["messages"][2]["content"][0]["content"] = json!("Sunny, 25C");
    let (_, same) = srv.post("/v1/messages/count_tokens", &as_string).await;
    assert_eq!(same["input_tokens"], a["input_tokens"]);
    srv.stop().await;
}

/// The event names of a stream, checked against each payload's `type`.
fn names(events: &[(String, Value)]) -> Vec<&str> {
    for (name, data) in events {
        assert_eq!(data["type"], name.as_str(), "{name}: {data}");
    }
    events.iter().map(|(n, _)| n.as_str()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_message_sends_anthropics_events_in_order() {
    let env = Env::new();
    let srv = env.start(&[]).await;
    let body = |stream: bool| {
        json!({
            "max_tokens": 8,
            "temperature": 0,
            "stream": stream,
            "messages": [{"role": "user", "content": "Say hello"}]
        })
    };
    let (_, whole) = srv.post("/v1/messages", &body(false)).await;
    let (status, events) = common::named_events(&srv, "/v1/messages", &body(true)).await;
    assert_eq!(status, 200);
    let names = names(&events);
    let n = names.len();
    assert_eq!(names[0], "message_start", "{names:?}");
    assert_eq!(names[1], "content_block_start", "{names:?}");
    assert!(
        names[2..n - 3].iter().all(|e| *e == "content_block_delta"),
        "{names:?}"
    );
    assert_eq!(
        &names[n - 3..],
        ["content_block_stop", "message_delta", "message_stop"]
    );

    let start = &events[0].1["message"];
    assert_eq!(start["content"], json!([]));
    assert_eq!(start["role"], "assistant");
    assert!(
        start["usage"]["input_tokens"].as_u64().unwrap() > 0,
        "{start}"
    );
    assert_eq!(
        events[1].1["content_block"],
        json!({"type": "text", "text": ""})
    );
    let text: String = events[2..n - 3]
        .iter()
        .map(|(_, d)| {
            assert_eq!(d["index"], 0);
            assert_eq!(d["delta"]["type"], "text_delta");
            d["delta"]["text"].as_str().unwrap()
        })
        .collect();
    assert_eq!(text, whole["content"][0]["text"].as_str().unwrap());
    let delta = &events[n - 2].1;
    assert_eq!(delta["delta"]["stop_reason"], whole["stop_reason"]);
    assert_eq!(
        delta["usage"]["output_tokens"],
        whole["usage"]["output_tokens"]
    );
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_tool_gives_a_tool_use_block_whole_and_streamed() {
    let env = Env::with_template(Some(TOOL_TEMPLATE));
    let srv = env.start(&[]).await;
    let body = |stream: bool| {
        json!({
            "max_tokens": 300,
            "temperature": 0,
            "stream": stream,
            "tools": [weather_tool()],
            "tool_choice": {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": true},
            "messages": [{"role": "user", "content": "Weather in Paris?"}]
        })
    };
    let (status, msg) = srv.post("/v1/messages", &body(false)).await;
    assert_eq!(status, 200, "{msg}");
    let content = msg["content"].as_array().unwrap();
    let call = content
        .iter()
        .find(|b| b["type"] == "tool_use")
        .unwrap_or_else(|| panic!("{msg}"));
    assert_eq!(call["name"], "get_weather");
    assert!(
        ["Paris", "Rome"].contains(&call["input"]["city"].as_str().unwrap_or("")),
        "{msg}"
    );
    assert!(!call["id"].as_str().unwrap().is_empty());
    assert_eq!(msg["stop_reason"], "tool_use", "{msg}");

    let (status, events) = common::named_events(&srv, "/v1/messages", &body(true)).await;
    assert_eq!(status, 200);
    let names = names(&events);
    assert_eq!(names.last(), Some(&"message_stop"));
    let (index, start) = events
        .iter()
        .find(|(n, d)| n == "content_block_start" && d["content_block"]["type"] == "tool_use")
        .map(|(_, d)| (d["index"].clone(), d))
        .unwrap_or_else(|| panic!("{names:?}"));
    assert_eq!(start["content_block"]["name"], "get_weather");
    let json_text: String = events
        .iter()
        .filter(|(_, d)| d["index"] == index && d["delta"]["type"] == "input_json_delta")
        .map(|(_, d)| d["delta"]["partial_json"].as_str().unwrap())
        .collect();
    let input: Value = serde_json::from_str(&json_text).unwrap();
    assert_eq!(input, call["input"]);
    // Every block that starts stops, in order of their indices.
    let starts: Vec<&Value> = events
        .iter()
        .filter(|(n, _)| n == "content_block_start")
        .map(|(_, d)| &d["index"])
        .collect();
    let stops: Vec<&Value> = events
        .iter()
        .filter(|(n, _)| n == "content_block_stop")
        .map(|(_, d)| &d["index"])
        .collect();
    assert_eq!(starts, stops);
    let delta = events.iter().find(|(n, _)| n == "message_delta").unwrap();
    assert_eq!(delta.1["delta"]["stop_reason"], "tool_use");
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_answer_in_anthropics_shape() {
    let env = Env::new();
    let srv = env.start(&["--api-key", "secret"]).await;
    let anthropic_error = |body: &Value, kind: &str| {
        assert_eq!(body["type"], "error", "{body}");
        assert_eq!(body["error"]["type"], kind, "{body}");
        assert!(
            !body["error"]["message"].as_str().unwrap().is_empty(),
            "{body}"
        );
    };
    let ok = json!({"max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]});

    // No key, then Anthropic's `x-api-key`.
    let (status, body) = srv.post("/v1/messages", &ok).await;
    assert_eq!(status, 401);
    anthropic_error(&body, "authentication_error");
    let post = |body: Value| {
        let req = srv
            .client
            .post(format!("{}/v1/messages", srv.url))
            .header("x-api-key", "secret")
            .json(&body);
        async move {
            let resp = req.send().await.unwrap();
            let status = resp.status().as_u16();
            (status, resp.json::<Value>().await.unwrap())
        }
    };
    let (status, body) = post(ok.clone()).await;
    assert_eq!(status, 200, "{body}");

    let (status, body) = post(json!({"max_tokens": 5})).await;
    assert_eq!(status, 400);
    anthropic_error(&body, "invalid_request_error");
    let (status, body) = post(json!({"max_tokens": 5, "messages": [], "frobnicate": true})).await;
    assert_eq!(status, 400);
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("frobnicate"),
        "{body}"
    );
    let (status, body) =
        post(json!({"max_tokens": 0, "messages": [{"role": "user", "content": "Hi"}]})).await;
    assert_eq!(status, 400, "{body}");
    anthropic_error(&body, "invalid_request_error");
    // A server tool is a capability this server lacks.
    let (status, body) = post(json!({
        "max_tokens": 5,
        "tools": [{"type": "web_search_20250305", "name": "web_search"}],
        "messages": [{"role": "user", "content": "Hi"}]
    }))
    .await;
    assert_eq!(status, 501, "{body}");
    anthropic_error(&body, "invalid_request_error");
    // Images need a multimodal model (llama-server answers 500 with this message).
    let (status, body) = post(json!({
        "max_tokens": 5,
        "messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}},
            {"type": "text", "text": "What is this?"}
        ]}]
    }))
    .await;
    assert_eq!(status, 500, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("image input is not supported"),
        "{body}"
    );
    srv.stop().await;
}
