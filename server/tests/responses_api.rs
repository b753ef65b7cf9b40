//! OpenAI's Responses API on a tiny model: the response object, the streamed events in order,
//! function calls and their outputs, stored responses (get, delete, `store: false`), and a
//! conversation continued by `previous_response_id` after a restart, its prompt read from the
//! prompt cache on disk.

mod common;

use common::{Env, TestServer};
use serde_json::{json, Value};

/// ChatML that renders tools, tool calls and tool results, with Hermes' `<tool_call>` marker.
const TOOL_TEMPLATE: &str = r#"
{%- if tools %}<|im_start|>system
Tools:{% for t in tools %} {{ t.function.name }}{% endfor %}
Call one as <tool_call>{"name": .., "arguments": ..}</tool_call><|im_end|>
{% endif %}
{%- for m in messages %}<|im_start|>{{ m.role }}
{% if m.content is string %}{{ m.content }}{% elif m.content %}{% for p in m.content %}{{ p.text }}{% endfor %}{% endif %}
{%- if m.tool_calls %}{% for c in m.tool_calls %}<tool_call>{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}}</tool_call>{% endfor %}{% endif %}
{%- if m.tool_call_id %} [{{ m.tool_call_id }}]{% endif %}<|im_end|>
{% endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"#;

async fn delete(srv: &TestServer, path: &str) -> (u16, Value) {
    let resp = srv
        .client
        .delete(format!("{}{path}", srv.url))
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap())
}

/// The text of a response's message items.
fn output_text(r: &Value) -> String {
    r["output"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["type"] == "message")
        .flat_map(|i| i["content"].as_array().unwrap().iter())
        .map(|p| p["text"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_has_openais_shape_and_its_prompt_is_the_chat() {
    let env = Env::new();
    let srv = env.start(&[]).await;
    let (status, r) = srv
        .post(
            "/v1/responses",
            &json!({
                "model": "gpt-test",
                "instructions": "Book",
                "input": [{"role": "user", "content": "What is the best book"}],
                "max_output_tokens": 5,
                "temperature": 0,
                "metadata": {"k": "v"}
            }),
        )
        .await;
    assert_eq!(status, 200, "{r}");
    assert!(r["id"].as_str().unwrap().starts_with("resp_"), "{r}");
    assert_eq!(r["object"], "response");
    let item = &r["output"][0];
    assert_eq!(item["type"], "message", "{r}");
    assert!(item["id"].as_str().unwrap().starts_with("msg_"));
    assert_eq!(item["role"], "assistant");
    assert_eq!(item["content"][0]["type"], "output_text");
    assert_eq!(item["content"][0]["annotations"], json!([]));
    let usage = &r["usage"];
    let (input, output) = (
        usage["input_tokens"].as_u64().unwrap(),
        usage["output_tokens"].as_u64().unwrap(),
    );
    assert_eq!(usage["total_tokens"].as_u64().unwrap(), input + output);
    assert_eq!(
        r["status"] == "incomplete",
        output == 5,
        "status {} after {output} tokens",
        r["status"]
    );
    assert_eq!(r["metadata"], json!({"k": "v"}));

    // `instructions` and `input` are the system and user messages of the chat.
    let (_, chat) = srv
        .post(
            "/v1/chat/completions/input_tokens",
            &json!({"messages": [
                {"role": "system", "content": "Book"},
                {"role": "user", "content": "What is the best book"}
            ]}),
        )
        .await;
    assert_eq!(chat["input_tokens"], input);

    // A string input is one user message.
    let (status, s) = srv
        .post(
            "/v1/responses",
            &json!({"input": "Hi", "max_output_tokens": 2, "store": false}),
        )
        .await;
    assert_eq!(status, 200, "{s}");
    // Not stored when asked not to be.
    let (status, body) = srv
        .get(&format!("/v1/responses/{}", s["id"].as_str().unwrap()))
        .await;
    assert_eq!(status, 404, "{body}");
    common::assert_error(&body, 404);
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_response_sends_the_events_in_order() {
    let env = Env::new();
    let srv = env.start(&[]).await;
    let body = |stream: bool| {
        json!({
            "input": [{"role": "system", "content": "Book"}, {"role": "user", "content": "What is the best book"}],
            "max_output_tokens": 8,
            "temperature": 0,
            "stream": stream,
        })
    };
    let (_, whole) = srv.post("/v1/responses", &body(false)).await;
    let (status, events) = common::named_events(&srv, "/v1/responses", &body(true)).await;
    assert_eq!(status, 200);
    for (i, (name, data)) in events.iter().enumerate() {
        assert_eq!(data["type"], name.as_str(), "{data}");
        assert_eq!(data["sequence_number"], i, "{data}");
    }
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    let n = names.len();
    assert_eq!(
        names[..4],
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added"
        ],
        "{names:?}"
    );
    assert!(
        names[4..n - 4]
            .iter()
            .all(|e| *e == "response.output_text.delta"),
        "{names:?}"
    );
    assert_eq!(
        names[n - 4..],
        [
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed"
        ]
    );
    let created = &events[0].1["response"];
    assert!(created["id"].as_str().unwrap().starts_with("resp_"));
    assert_eq!(created["status"], "in_progress");
    let msg_id = events[2].1["item"]["id"].as_str().unwrap().to_owned();
    assert!(msg_id.starts_with("msg_"));
    let deltas: String = events[4..n - 4]
        .iter()
        .map(|(_, d)| {
            assert_eq!(d["item_id"], msg_id.as_str());
            d["delta"].as_str().unwrap()
        })
        .collect();
    let done = &events[n - 1].1["response"];
    assert_eq!(done["id"], created["id"]);
    assert_eq!(events[n - 2].1["item"]["id"], msg_id.as_str());
    assert_eq!(events[n - 4].1["text"], deltas.as_str());
    assert_eq!(output_text(done), deltas);
    // The same greedy reply as the whole response's.
    assert_eq!(deltas, output_text(&whole));
    assert_eq!(
        done["usage"]["output_tokens"],
        whole["usage"]["output_tokens"]
    );
    assert_eq!(done["status"], whole["status"]);

    // The stored response is the streamed one.
    let (status, got) = srv
        .get(&format!("/v1/responses/{}", done["id"].as_str().unwrap()))
        .await;
    assert_eq!(status, 200, "{got}");
    assert_eq!(got["output"], done["output"]);
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_function_call_and_its_output_continue_by_previous_response_id() {
    let env = Env::with_template(Some(TOOL_TEMPLATE));
    // Memory only: the store works without a cache directory too.
    let srv = env.start(&["--no-cache"]).await;
    let tool = json!({
        "type": "function",
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
            "required": ["city"],
            "additionalProperties": false
        }
    });
    let (status, first) = srv
        .post(
            "/v1/responses",
            &json!({
                "input": "Weather in Paris?",
                "tools": [tool],
                "tool_choice": {"type": "function", "name": "get_weather"},
                "parallel_tool_calls": false,
                "max_output_tokens": 300,
                "temperature": 0,
            }),
        )
        .await;
    assert_eq!(status, 200, "{first}");
    let call = first["output"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["type"] == "function_call")
        .unwrap_or_else(|| panic!("{first}"))
        .clone();
    assert_eq!(call["name"], "get_weather");
    let call_id = call["call_id"].as_str().unwrap();
    assert_eq!(call["id"], format!("fc_{call_id}"));
    let args: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
    assert!(
        ["Paris", "Rome"].contains(&args["city"].as_str().unwrap()),
        "{call}"
    );

    let (status, second) = srv
        .post(
            "/v1/responses",
            &json!({
                "previous_response_id": first["id"],
                "input": [{"type": "function_call_output", "call_id": call_id, "output": "Sunny"}],
                "tools": [tool],
                "max_output_tokens": 3,
                "temperature": 0,
            }),
        )
        .await;
    assert_eq!(status, 200, "{second}");
    assert_eq!(second["previous_response_id"], first["id"]);

    // Its prompt is the whole conversation as a chat.
    let (_, chat) = srv
        .post(
            "/v1/chat/completions/input_tokens",
            &json!({
                "tools": [{"type": "function", "function": {
                    "name": "get_weather",
                    "description": "The weather in a city",
                    "parameters": tool["parameters"].clone()
                }}],
                "messages": [
                    {"role": "user", "content": "Weather in Paris?"},
                    {"role": "assistant", "content": "", "tool_calls": [{"id": call_id, "type": "function",
                        "function": {"name": "get_weather", "arguments": call["arguments"].clone()}}]},
                    {"role": "tool", "tool_call_id": call_id, "content": "Sunny"}
                ]
            }),
        )
        .await;
    assert_eq!(
        second["usage"]["input_tokens"], chat["input_tokens"],
        "{chat}"
    );

    // An unknown previous response is 404, naming the parameter.
    let (status, body) = srv
        .post(
            "/v1/responses",
            &json!({"previous_response_id": "resp_nothere", "input": "Hi"}),
        )
        .await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["error"]["param"], "previous_response_id");
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversation_continues_by_id_after_a_restart_from_the_cache() {
    let env = Env::new();
    let srv = env.start(&[]).await;
    let (status, first) = srv
        .post(
            "/v1/responses",
            &json!({
                "input": [{"role": "user", "content": format!("Read this: {}", "abcdefgh ".repeat(30))}],
                "max_output_tokens": 4,
                "temperature": 0,
            }),
        )
        .await;
    assert_eq!(status, 200, "{first}");
    let id = first["id"].as_str().unwrap().to_owned();
    assert_eq!(first["usage"]["input_tokens_details"]["cached_tokens"], 0);
    srv.stop().await;

    let srv = env.start(&[]).await;
    let (status, got) = srv.get(&format!("/v1/responses/{id}")).await;
    assert_eq!(status, 200, "{got}");
    assert_eq!(got["output"], first["output"]);
    let (status, next) = srv
        .post(
            "/v1/responses",
            &json!({"previous_response_id": id, "input": "And then?", "max_output_tokens": 3, "temperature": 0}),
        )
        .await;
    assert_eq!(status, 200, "{next}");
    let cached = next["usage"]["input_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert!(
        cached >= 64,
        "the first turn's prompt should come from disk: {next}"
    );
    assert!(
        next["usage"]["input_tokens"].as_u64().unwrap()
            > first["usage"]["input_tokens"].as_u64().unwrap()
    );

    // Delete, then it is gone; ids that are not ours are never paths.
    let (status, body) = delete(&srv, &format!("/v1/responses/{id}")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body,
        json!({"id": id, "object": "response", "deleted": true})
    );
    let (status, body) = srv.get(&format!("/v1/responses/{id}")).await;
    assert_eq!(status, 404);
    common::assert_error(&body, 404);
    let (status, _) = delete(&srv, &format!("/v1/responses/{id}")).await;
    assert_eq!(status, 404);
    let (status, _) = srv.get("/v1/responses/resp_..%2F..%2Fx").await;
    assert_eq!(status, 404);
    assert!(env.cache().join("responses").is_dir());
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_are_refused_in_openais_shape() {
    let env = Env::new();
    let srv = env.start(&[]).await;
    for (body, code) in [
        (json!({"max_output_tokens": 3}), 400),
        (json!({"input": "Hi", "frobnicate": 1}), 400),
        (
            json!({"input": "Hi", "tools": [{"type": "web_search"}]}),
            501,
        ),
        (
            json!({"input": [{"type": "item_reference", "id": "x"}]}),
            501,
        ),
        (json!({"input": "Hi", "background": true}), 501),
        (json!({"input": "Hi", "truncation": "auto"}), 501),
        (json!({"input": "Hi", "truncation": "sometimes"}), 400),
        (
            json!({"input": "Hi", "include": ["message.output_text.logprobs"]}),
            501,
        ),
        (json!({"input": "Hi", "max_tool_calls": 3}), 501),
        (json!({"input": "Hi", "max_tool_calls": "many"}), 400),
    ] {
        let (status, r) = srv.post("/v1/responses", &body).await;
        assert_eq!(status, code, "{body}: {r}");
        common::assert_error(&r, code);
    }
    // What is served: no truncation, encrypted reasoning (there is none to carry), and at
    // most one call when parallel calls are off.
    for body in [
        json!({"input": "Hi", "max_output_tokens": 4, "truncation": "disabled"}),
        json!({"input": "Hi", "max_output_tokens": 4, "include": ["reasoning.encrypted_content"]}),
        json!({"input": "Hi", "max_output_tokens": 4, "max_tool_calls": 1}),
        json!({"input": "Hi", "max_output_tokens": 4, "max_tool_calls": 5,
               "parallel_tool_calls": false}),
    ] {
        let (status, r) = srv.post("/v1/responses", &body).await;
        assert_eq!(status, 200, "{body}: {r}");
    }
    srv.stop().await;
}
