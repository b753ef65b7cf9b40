//! Ollama's API on a tiny model: chat and generate whole and as NDJSON lines (the last with
//! `done` and the figures), `options` reaching the sampler (`num_predict` cuts the reply with
//! `done_reason` `length`), `context` given back and continued, `raw` and `template` prompts,
//! `format` through the JSON grammar, tool calls with object arguments, the model endpoints'
//! shapes, refused endpoints and fields, and errors in Ollama's shape behind API keys.

mod common;

use common::{Env, TestServer};
use serde_json::{json, Value};

/// Posts `body` and reads the answer as NDJSON: the status, the content type and every line
/// parsed (each must be one JSON object).
async fn ndjson(srv: &TestServer, path: &str, body: &Value) -> (u16, String, Vec<Value>) {
    let resp = srv
        .client
        .post(format!("{}{path}", srv.url))
        .json(body)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let ctype = resp
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    let text = resp.text().await.unwrap();
    assert!(text.ends_with('\n'), "{text:?}");
    let lines = text
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap_or_else(|e| panic!("{e}: {l:?}")))
        .collect();
    (status, ctype, lines)
}

/// The fields of a final object: `done`, a reason, and every figure a non-negative integer.
fn assert_done(v: &Value) {
    assert_eq!(v["done"], true, "{v}");
    assert!(
        ["stop", "length"].contains(&v["done_reason"].as_str().unwrap_or("")),
        "{v}"
    );
    for k in [
        "total_duration",
        "load_duration",
        "prompt_eval_count",
        "prompt_eval_duration",
        "eval_count",
        "eval_duration",
    ] {
        assert!(v[k].as_u64().is_some(), "{k} in {v}");
    }
    assert!(v["total_duration"].as_u64().unwrap() > 0, "{v}");
    assert!(v["prompt_eval_count"].as_u64().unwrap() > 0, "{v}");
    created_at(v);
}

/// `created_at` is RFC 3339 in UTC.
fn created_at(v: &Value) {
    let t = v["created_at"].as_str().unwrap_or_else(|| panic!("{v}"));
    let b = t.as_bytes();
    assert!(
        t.len() >= 20 && b[4] == b'-' && b[10] == b'T' && b[13] == b':' && t.ends_with('Z'),
        "{t}"
    );
}

/// The error shape: `{"error": "..."}` and nothing else.
fn assert_error(body: &Value, contains: &str) {
    let msg = body["error"].as_str().unwrap_or_else(|| panic!("{body}"));
    assert_eq!(body.as_object().unwrap().len(), 1, "{body}");
    assert!(msg.contains(contains), "{msg:?} lacks {contains:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_whole_and_streamed_as_ndjson_agree() {
    let env = Env::new();
    let srv = env.start(&[]).await;
    let body = |stream: Option<bool>| {
        let mut b = json!({
            "model": "tiny:latest",
            "messages": [
                {"role": "system", "content": "You are terse."},
                {"role": "user", "content": "Say hello"}
            ],
            "options": {"temperature": 0, "num_predict": 8, "seed": 3, "num_thread": 4},
            "keep_alive": "5m"
        });
        if let Some(s) = stream {
            b["stream"] = json!(s);
        }
        b
    };
    let (status, whole) = srv.post("/api/chat", &body(Some(false))).await;
    assert_eq!(status, 200, "{whole}");
    assert_eq!(whole["model"], "tiny:latest");
    assert_eq!(whole["message"]["role"], "assistant");
    assert!(whole["message"]["content"].is_string(), "{whole}");
    assert_done(&whole);
    let n = whole["eval_count"].as_u64().unwrap();
    assert!(n <= 8, "{whole}");
    assert_eq!(whole["done_reason"] == "length", n == 8, "{whole}");

    // Ollama streams unless told otherwise.
    let (status, ctype, lines) = ndjson(&srv, "/api/chat", &body(None)).await;
    assert_eq!(status, 200);
    assert_eq!(ctype, "application/x-ndjson");
    let (last, rest) = lines.split_last().unwrap();
    assert_done(last);
    assert_eq!(last["message"]["content"], "");
    assert_eq!(last["done_reason"], whole["done_reason"]);
    assert_eq!(last["eval_count"], whole["eval_count"]);
    let text: String = rest
        .iter()
        .map(|l| {
            assert_eq!(l["done"], false, "{l}");
            assert_eq!(l["model"], "tiny:latest");
            created_at(l);
            l["message"]["content"].as_str().unwrap()
        })
        .collect();
    assert_eq!(text, whole["message"]["content"].as_str().unwrap());

    // An empty chat loads the model, as Ollama's clients expect.
    let (status, load) = srv.post("/api/chat", &json!({"model": "x"})).await;
    assert_eq!(status, 200, "{load}");
    assert_eq!(load["done_reason"], "load");
    assert_eq!(load["done"], true);
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn options_reach_the_sampler_and_num_predict_cuts_with_length() {
    let env = Env::new();
    let srv = env.start(&[]).await;
    let ask = |options: Value| {
        json!({
            "stream": false,
            "messages": [{"role": "user", "content": "Count"}],
            "options": options,
        })
    };
    let (status, cut) = srv
        .post(
            "/api/chat",
            &ask(json!({"num_predict": 3, "ignore_eos": true, "temperature": 0})),
        )
        .await;
    assert_eq!(status, 200, "{cut}");
    assert_eq!(cut["eval_count"], 3, "{cut}");
    assert_eq!(cut["done_reason"], "length");
    // num_ctx caps prompt and reply together.
    let prompt = cut["prompt_eval_count"].as_u64().unwrap();
    let (_, capped) = srv
        .post(
            "/api/chat",
            &ask(
                json!({"num_predict": -1, "ignore_eos": true, "num_ctx": prompt + 2,
                        "top_k": 1}),
            ),
        )
        .await;
    assert_eq!(capped["done_reason"], "length", "{capped}");
    assert!(capped["eval_count"].as_u64().unwrap() <= 2, "{capped}");
    // Every sampler option is checked as the OpenAI chat checks it.
    let (status, body) = srv
        .post("/api/chat", &ask(json!({"temperature": "hot"})))
        .await;
    assert_eq!(status, 400);
    assert_error(&body, "options.temperature");
    let (status, body) = srv.post("/api/chat", &ask(json!({"top_p": 7}))).await;
    assert_eq!(status, 400, "{body}");
    assert!(body["error"].is_string(), "{body}");
    // Seeded sampling repeats itself.
    let sampled = json!({"num_predict": 6, "temperature": 1.5, "seed": 42, "repeat_penalty": 1.1,
                         "presence_penalty": 0.5, "frequency_penalty": 0.5, "top_p": 0.9,
                         "min_p": 0.01, "repeat_last_n": 16, "stop": ["zzz"], "mirostat": 0});
    let (_, a) = srv.post("/api/chat", &ask(sampled.clone())).await;
    let (_, b) = srv.post("/api/chat", &ask(sampled)).await;
    assert_eq!(a["message"], b["message"], "{a} {b}");
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generate_gives_back_a_context_that_continues() {
    let env = Env::new();
    let srv = env.start(&[]).await;
    let first = json!({
        "model": "m", "prompt": "Hello", "system": "Be brief.", "stream": false,
        "options": {"temperature": 0, "num_predict": 4, "ignore_eos": true}
    });
    let (status, a) = srv.post("/api/generate", &first).await;
    assert_eq!(status, 200, "{a}");
    assert_done(&a);
    assert_eq!(a["done_reason"], "length");
    let context: Vec<u64> = serde_json::from_value(a["context"].clone()).unwrap();
    // The context is the rendered prompt's tokens, then the reply's.
    let (_, rendered) = srv
        .post(
            "/apply-template",
            &json!({"messages": [{"role": "system", "content": "Be brief."},
                                 {"role": "user", "content": "Hello"}]}),
        )
        .await;
    let (_, ids) = srv
        .post(
            "/tokenize",
            &json!({"content": rendered["prompt"], "add_special": true}),
        )
        .await;
    let ids: Vec<u64> = serde_json::from_value(ids["tokens"].clone()).unwrap();
    assert_eq!(context.len(), ids.len() + 4, "{a}");
    assert_eq!(&context[..ids.len()], &ids[..]);
    let (_, reply) = srv
        .post("/detokenize", &json!({"tokens": &context[ids.len()..]}))
        .await;
    assert_eq!(reply["content"], a["response"]);

    // The next request goes on from there, streamed, and its context starts with the first.
    let next = json!({
        "prompt": "And again", "context": context,
        "options": {"temperature": 0, "num_predict": 3, "ignore_eos": true}
    });
    let (status, ctype, lines) = ndjson(&srv, "/api/generate", &next).await;
    assert_eq!((status, ctype.as_str()), (200, "application/x-ndjson"));
    let last = lines.last().unwrap();
    assert_done(last);
    assert_eq!(last["response"], "");
    let more: Vec<u64> = serde_json::from_value(last["context"].clone()).unwrap();
    assert!(more.len() > context.len() + 3, "{last}");
    assert_eq!(&more[..context.len()], &context[..]);
    // The first context came from the cache: only the new turn was evaluated.
    assert!(
        last["prompt_eval_count"].as_u64().unwrap() < more.len() as u64 - 3,
        "{last}"
    );
    // A context holding an id outside the vocabulary is refused.
    let (status, body) = srv
        .post(
            "/api/generate",
            &json!({"prompt": "x", "context": [1, 99999999], "stream": false}),
        )
        .await;
    assert_eq!(status, 400);
    assert_error(&body, "99999999");
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_and_templated_prompts_are_sent_as_written() {
    let env = Env::new();
    let srv = env.start(&[]).await;
    let opts = json!({"temperature": 0, "num_predict": 2, "ignore_eos": true});
    let (status, raw) = srv
        .post(
            "/api/generate",
            &json!({"prompt": "<|im_start|>user\nHi", "raw": true, "stream": false, "options": opts}),
        )
        .await;
    assert_eq!(status, 200, "{raw}");
    let (_, ids) = srv
        .post(
            "/tokenize",
            &json!({"content": "<|im_start|>user\nHi", "add_special": true}),
        )
        .await;
    let ids = ids["tokens"].as_array().unwrap();
    assert_eq!(raw["context"].as_array().unwrap()[..ids.len()], ids[..]);
    // The same prompt through a template of the supported subset.
    let (status, templated) = srv
        .post(
            "/api/generate",
            &json!({"prompt": "Hi", "stream": false, "options": opts,
                    "template": "{{ if .System }}{{ .System }}{{ end }}<|im_start|>user\n{{ .Prompt }}{{ .Response }}<|im_end|>"}),
        )
        .await;
    assert_eq!(status, 200, "{templated}");
    assert_eq!(templated["context"], raw["context"]);
    assert_eq!(templated["response"], raw["response"]);
    // A template beyond the subset, a suffix without a template slot, and a system prompt
    // beside a raw prompt are refused by name.
    for (body, field) in [
        (
            json!({"prompt": "x", "template": "{{ range .Messages }}{{ end }}"}),
            "template",
        ),
        (json!({"prompt": "x", "suffix": "y"}), "suffix"),
        (json!({"prompt": "x", "raw": true, "system": "s"}), "system"),
        (json!({"prompt": "x", "raw": "yes"}), "raw"),
        (json!({"prompt": 3}), "prompt"),
    ] {
        let (status, e) = srv.post("/api/generate", &body).await;
        assert_eq!(status, 400, "{body}: {e}");
        assert_error(&e, field);
    }
    // An empty prompt loads the model.
    let (status, load) = srv.post("/api/generate", &json!({"model": "m"})).await;
    assert_eq!(status, 200);
    assert_eq!(
        (load["done_reason"].as_str(), load["response"].as_str()),
        (Some("load"), Some(""))
    );
    srv.stop().await;
}

fn city_schema() -> Value {
    json!({
        "type": "object",
        "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
        "required": ["city"],
        "additionalProperties": false
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn format_constrains_the_reply_to_json() {
    let env = Env::new();
    let srv = env.start(&[]).await;
    let ask = |format: Value| {
        json!({
            "stream": false, "format": format, "options": {"temperature": 0, "num_predict": 200},
            "messages": [{"role": "user", "content": "Which city?"}]
        })
    };
    let (status, v) = srv.post("/api/chat", &ask(city_schema())).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["done_reason"], "stop", "{v}");
    let parsed: Value = serde_json::from_str(v["message"]["content"].as_str().unwrap()).unwrap();
    assert!(
        ["Paris", "Rome"].contains(&parsed["city"].as_str().unwrap()),
        "{parsed}"
    );
    // Generate takes the same format.
    let (status, g) = srv
        .post(
            "/api/generate",
            &json!({"prompt": "Which city?", "stream": false, "format": city_schema(),
                    "options": {"temperature": 0, "num_predict": 200}}),
        )
        .await;
    assert_eq!(status, 200, "{g}");
    let parsed: Value = serde_json::from_str(g["response"].as_str().unwrap()).unwrap();
    assert!(parsed["city"].is_string(), "{parsed}");
    // "json" is any JSON object: the reply opens one.
    let (status, j) = srv.post("/api/chat", &ask(json!("json"))).await;
    assert_eq!(status, 200, "{j}");
    assert!(
        j["message"]["content"]
            .as_str()
            .unwrap()
            .trim_start()
            .starts_with('{'),
        "{j}"
    );
    let (status, e) = srv.post("/api/chat", &ask(json!("yaml"))).await;
    assert_eq!(status, 400);
    assert_error(&e, "format");
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_calls_come_back_with_object_arguments_and_go_back_in() {
    // The default template writes no tool markers: a reply that is one JSON object
    // `{"tool_call": ...}` is a call, which `format` forces here.
    let env = Env::new();
    let srv = env.start(&[]).await;
    let tools = json!([{"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city",
        "parameters": city_schema()
    }}]);
    let forced = json!({
        "type": "object",
        "properties": {"tool_call": {
            "type": "object",
            "properties": {"name": {"const": "get_weather"}, "arguments": city_schema()},
            "required": ["name", "arguments"], "additionalProperties": false
        }},
        "required": ["tool_call"], "additionalProperties": false
    });
    let body = |stream: bool| {
        json!({
            "stream": stream, "tools": tools, "format": forced,
            "options": {"temperature": 0, "num_predict": 300},
            "messages": [{"role": "user", "content": "Weather in Paris?"}]
        })
    };
    let (status, v) = srv.post("/api/chat", &body(false)).await;
    assert_eq!(status, 200, "{v}");
    let call = &v["message"]["tool_calls"][0];
    assert_eq!(call["function"]["name"], "get_weather", "{v}");
    assert!(call["function"]["arguments"]["city"].is_string(), "{v}");
    assert_eq!(v["message"]["content"], "");

    let (status, _, lines) = ndjson(&srv, "/api/chat", &body(true)).await;
    assert_eq!(status, 200);
    let streamed: Vec<&Value> = lines
        .iter()
        .filter_map(|l| l["message"]["tool_calls"].as_array())
        .flatten()
        .collect();
    assert_eq!(streamed.len(), 1, "{lines:?}");
    assert_eq!(streamed[0]["function"], call["function"]);
    assert_done(lines.last().unwrap());

    // The call and its result go back as Ollama's clients send them.
    let history = json!({
        "stream": false, "tools": tools, "options": {"num_predict": 2},
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_name": "get_weather", "content": "Sunny"},
            {"role": "user", "content": "Thanks"}
        ],
        "think": false
    });
    let (status, v) = srv.post("/api/chat", &history).await;
    assert_eq!(status, 200, "{v}");
    assert_done(&v);
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn model_endpoints_describe_the_one_model() {
    let env = Env::new();
    let srv = env.start(&["--alias", "tiny-chat"]).await;
    let (status, tags) = srv.get("/api/tags").await;
    assert_eq!(status, 200, "{tags}");
    let m = &tags["models"][0];
    assert_eq!(m["name"], "tiny-chat");
    assert_eq!(m["model"], "tiny-chat");
    assert!(m["size"].as_u64().unwrap() > 0);
    assert!(m["digest"].as_str().unwrap().starts_with("sha256:"));
    created_at(&json!({"created_at": m["modified_at"]}));
    let details = &m["details"];
    assert_eq!(details["format"], "gguf");
    assert_eq!(details["family"], "llama");
    assert!(
        !details["parameter_size"].as_str().unwrap().is_empty(),
        "{details}"
    );
    assert!(details["quantization_level"].is_string());

    let (status, show) = srv.post("/api/show", &json!({"model": "tiny-chat"})).await;
    assert_eq!(status, 200, "{show}");
    assert_eq!(show["details"], *details);
    assert_eq!(show["model_info"]["general.architecture"], "llama");
    assert!(
        show["model_info"]["general.parameter_count"]
            .as_u64()
            .unwrap()
            > 0
    );
    assert!(show["model_info"]["tokenizer.ggml.tokens"].is_null());
    assert!(show["template"].as_str().unwrap().contains("im_start"));
    assert!(show["parameters"].as_str().unwrap().contains("temperature"));
    assert!(show["modelfile"].as_str().unwrap().contains("FROM "));
    assert_eq!(show["capabilities"][0], "completion");
    let (_, verbose) = srv
        .post("/api/show", &json!({"model": "x", "verbose": true}))
        .await;
    assert!(
        verbose["model_info"]["tokenizer.ggml.tokens"]
            .as_array()
            .unwrap()
            .len()
            > 256
    );

    let (status, ps) = srv.get("/api/ps").await;
    assert_eq!(status, 200, "{ps}");
    let p = &ps["models"][0];
    assert_eq!(p["name"], "tiny-chat");
    assert_eq!(p["context_length"], 512);
    assert_eq!(p["size_vram"], 0);
    assert_eq!(p["digest"], m["digest"]);
    assert!(p["expires_at"].as_str().unwrap().ends_with('Z'));

    let (status, v) = srv.get("/api/version").await;
    assert_eq!(status, 200);
    assert!(v["version"].as_str().unwrap().contains('.'));
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn management_endpoints_images_and_bad_bodies_are_refused_in_ollamas_shape() {
    let env = Env::new();
    let srv = env.start(&["--api-key", "secret"]).await;
    let send = |method: reqwest::Method, path: &'static str, body: Value| {
        let srv = &srv;
        async move { srv.send_as("secret", method, path, Some(&body)).await }
    };
    use reqwest::Method;
    for path in ["/api/pull", "/api/push", "/api/create", "/api/copy"] {
        let (status, body) = send(Method::POST, path, json!({"model": "llama3"})).await;
        assert_eq!(status, 501, "{path}: {body}");
        assert_error(&body, "started with");
    }
    let (status, body) = send(Method::DELETE, "/api/delete", json!({"model": "x"})).await;
    assert_eq!(status, 501);
    assert_error(&body, "deleting");
    let (status, body) = send(Method::GET, "/api/nothing", json!({})).await;
    assert_eq!(status, 404);
    assert_error(&body, "/api/nothing");

    // Images are refused by name, in chat messages and in generate.
    let (status, body) = send(
        Method::POST,
        "/api/chat",
        json!({"messages": [{"role": "user", "content": "What is this?", "images": ["iVBORw0KGgo="]}]}),
    )
    .await;
    assert_eq!(status, 400);
    assert_error(&body, "messages[0].images");
    let (status, body) = send(
        Method::POST,
        "/api/generate",
        json!({"prompt": "What is this?", "images": ["iVBORw0KGgo="]}),
    )
    .await;
    assert_eq!(status, 400);
    assert_error(&body, "images");

    // Bodies that are not what the endpoint reads.
    let resp = srv
        .client
        .post(format!("{}/api/chat", srv.url))
        .bearer_auth("secret")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 400);
    assert_error(&resp.json().await.unwrap(), "invalid request body");
    for (path, body, field) in [
        ("/api/chat", json!([1, 2]), "JSON object"),
        ("/api/chat", json!({"messages": "hi"}), "messages"),
        (
            "/api/chat",
            json!({"messages": [], "stream": "no"}),
            "stream",
        ),
        (
            "/api/chat",
            json!({"messages": [], "options": [1]}),
            "options",
        ),
        (
            "/api/chat",
            json!({"messages": [], "think": "max"}),
            "think",
        ),
        ("/api/chat", json!({"messages": [], "tools": {}}), "tools"),
        ("/api/embed", json!({"input": "x"}), "--embedding"),
    ] {
        let (status, e) = send(Method::POST, path, body.clone()).await;
        assert!(status == 400 || status == 501, "{body}: {status} {e}");
        assert_error(&e, field);
    }

    // Every endpoint needs the key, as the rest of the API does; the answer is Ollama's shape.
    let (status, body) = srv.get("/api/tags").await;
    assert_eq!(status, 401);
    assert_error(&body, "API key");
    let (status, body) = srv
        .send_as("wrong", Method::GET, "/api/version", None)
        .await;
    assert_eq!(status, 401, "{body}");
    let (status, _) = srv.send_as("secret", Method::GET, "/api/tags", None).await;
    assert_eq!(status, 200);
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embed_and_embeddings_give_pooled_vectors() {
    let env = Env::new();
    let srv = env.start(&["--embedding", "--pooling", "mean"]).await;
    let (status, v) = srv
        .post(
            "/api/embed",
            &json!({"model": "m", "input": ["Hello", "world"]}),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    let vectors = v["embeddings"].as_array().unwrap();
    assert_eq!(vectors.len(), 2);
    let norm: f64 = vectors[0]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap().powi(2))
        .sum();
    assert!((norm - 1.0).abs() < 1e-4, "{norm}");
    assert!(v["prompt_eval_count"].as_u64().unwrap() >= 2);
    assert_eq!(v["model"], "m");
    let (_, short) = srv
        .post("/api/embed", &json!({"input": "Hello", "dimensions": 4}))
        .await;
    assert_eq!(
        short["embeddings"][0].as_array().unwrap().len(),
        4,
        "{short}"
    );
    // Too long for the context: cut unless truncate is false.
    let long = "word ".repeat(600);
    let (status, _) = srv.post("/api/embed", &json!({"input": long})).await;
    assert_eq!(status, 200);
    let (status, e) = srv
        .post("/api/embed", &json!({"input": long, "truncate": false}))
        .await;
    assert_eq!(status, 400);
    assert_error(&e, "truncate");

    let (status, old) = srv
        .post("/api/embeddings", &json!({"model": "m", "prompt": "Hello"}))
        .await;
    assert_eq!(status, 200, "{old}");
    let old = old["embedding"].as_array().unwrap();
    assert_eq!(old.len(), vectors[0].as_array().unwrap().len());
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thinking_is_split_into_its_own_field_whole_and_streamed() {
    // A template that opens a thinking block for the reply (as Qwen3's does); the budget
    // closes it after five tokens, so the reply has both thinking and text.
    let env = Env::with_template(Some(
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n\
         {% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}",
    ));
    let srv = env.start(&["--reasoning-budget", "5"]).await;
    let chat = |stream: bool| {
        json!({"stream": stream, "think": true,
               "messages": [{"role": "user", "content": "hi"}],
               "options": {"temperature": 0, "num_predict": 30, "ignore_eos": true}})
    };
    let (status, whole) = srv.post("/api/chat", &chat(false)).await;
    assert_eq!(status, 200, "{whole}");
    let thinking = whole["message"]["thinking"].as_str().unwrap_or("");
    let content = whole["message"]["content"].as_str().unwrap();
    assert!(
        !thinking.trim().is_empty() && !content.is_empty(),
        "{whole}"
    );
    assert!(!content.contains("</think>"), "{whole}");
    let (_, _, lines) = ndjson(&srv, "/api/chat", &chat(true)).await;
    let field = |name: &str| -> String {
        lines
            .iter()
            .filter_map(|l| l["message"][name].as_str())
            .collect()
    };
    assert_eq!(field("thinking"), thinking);
    assert_eq!(field("content"), content);

    // Generate splits it the same way.
    let (status, g) = srv
        .post(
            "/api/generate",
            &json!({"prompt": "hi", "stream": false,
                    "options": {"temperature": 0, "num_predict": 30, "ignore_eos": true}}),
        )
        .await;
    assert_eq!(status, 200, "{g}");
    assert_eq!(g["thinking"], whole["message"]["thinking"], "{g}");
    assert_eq!(g["response"], whole["message"]["content"], "{g}");
    srv.stop().await;
}
