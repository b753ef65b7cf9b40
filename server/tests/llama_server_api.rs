//! llama-server's request fields and response shapes, as its documentation describes them, on a
//! tiny model: probabilities, logit biases, several choices and prompts, token ids in answers,
//! picked fields, prompt progress, `n_predict: 0`, the stream's usage chunk, context errors,
//! metrics under llama-server's names, CORS, several API keys, `--no-slots` and the page at
//! `/`.

mod common;

use common::Env;
use serde_json::{json, Value};

fn events(raw: &[String]) -> Vec<Value> {
    raw.iter()
        .filter(|e| *e != "[DONE]")
        .map(|e| serde_json::from_str(e).unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completion_answers_carry_tokens_probabilities_and_settings() {
    let env = Env::new();
    let srv = env.start(&["-np", "2", "-n", "6"]).await;

    // The native object, with the generated ids and llama-server's fields.
    let (status, r) = srv
        .post(
            "/completion",
            &json!({"prompt": "hello there", "n_predict": 4, "temperature": 0,
                    "return_tokens": true, "n_probs": 3, "ignore_eos": true}),
        )
        .await;
    assert_eq!(status, 200, "{r}");
    let tokens = r["tokens"].as_array().unwrap();
    assert_eq!(tokens.len(), 4, "{r}");
    assert_eq!(r["stop_type"], "limit");
    assert_eq!(r["truncated"], false);
    assert!(r["has_new_line"].is_boolean());
    assert_eq!(r["generation_settings"]["n_predict"], 4);
    assert_eq!(r["stopping_word"], "");
    // The ids are the text: detokenized, they give the content.
    let (_, text) = srv.post("/detokenize", &json!({"tokens": tokens})).await;
    assert_eq!(text["content"], r["content"]);
    // One probability entry per token, the chosen one first among the top ones (greedy).
    let probs = r["completion_probabilities"].as_array().unwrap();
    assert_eq!(probs.len(), 4);
    for (p, id) in probs.iter().zip(tokens) {
        assert_eq!(&p["id"], id);
        assert!(p["logprob"].as_f64().unwrap() <= 0.0);
        let top = p["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3);
        assert_eq!(&top[0]["id"], id, "greedy picks the most likely token");
        assert!(top[0]["logprob"].as_f64() >= top[1]["logprob"].as_f64());
    }

    // The server's `-n 6` is the default; a request may ask for more.
    let (_, default) = srv
        .post(
            "/completion",
            &json!({"prompt": "hello", "ignore_eos": true}),
        )
        .await;
    assert_eq!(default["timings"]["predicted_n"], 6, "{default}");
    let (_, more) = srv
        .post(
            "/completion",
            &json!({"prompt": "hello", "n_predict": 9, "ignore_eos": true}),
        )
        .await;
    assert_eq!(more["timings"]["predicted_n"], 9, "{more}");

    // `n_predict: 0` evaluates the prompt and generates nothing.
    let (status, zero) = srv
        .post("/completion", &json!({"prompt": "hello", "n_predict": 0}))
        .await;
    assert_eq!(status, 200, "{zero}");
    assert_eq!(zero["content"], "");
    assert_eq!(zero["tokens_predicted"], 0);

    // Only the fields asked for, under their paths.
    let (_, picked) = srv
        .post(
            "/completion",
            &json!({"prompt": "hello", "n_predict": 2,
                    "response_fields": ["content", "generation_settings/n_predict"]}),
        )
        .await;
    let keys: Vec<&String> = picked.as_object().unwrap().keys().collect();
    assert_eq!(keys.len(), 2, "{picked}");
    assert_eq!(picked["generation_settings/n_predict"], 2);
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_banned_token_is_never_generated_in_either_bias_form() {
    let env = Env::new();
    let srv = env.start(&[]).await;
    let body = |bias: Value| {
        json!({"prompt": "abc", "n_predict": 8, "temperature": 0, "ignore_eos": true,
               "return_tokens": true, "logit_bias": bias})
    };
    let (_, free) = srv.post("/completion", &body(Value::Null)).await;
    let first = free["tokens"][0].as_u64().unwrap();
    for bias in [
        json!([[first, false]]),
        json!({ first.to_string(): -100 }),
        json!([[first, -1e30]]),
    ] {
        let (status, r) = srv.post("/completion", &body(bias.clone())).await;
        assert_eq!(status, 200, "{r}");
        let ids: Vec<u64> = r["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_u64().unwrap())
            .collect();
        assert!(!ids.contains(&first), "{bias}: {ids:?}");
    }
    // A bias on text bans every token of that text.
    let piece = srv.post("/detokenize", &json!({"tokens": [first]})).await.1["content"]
        .as_str()
        .unwrap()
        .to_owned();
    let (_, r) = srv
        .post("/completion", &body(json!([[piece, false]])))
        .await;
    assert!(
        !r["tokens"].as_array().unwrap().contains(&json!(first)),
        "{r}"
    );
    // Nonsense is refused, not ignored.
    for bad in [json!([[first]]), json!("x"), json!([["a", "b"]])] {
        let (status, _) = srv.post("/completion", &body(bad)).await;
        assert_eq!(status, 400);
    }
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_prompts_and_choices_in_one_request() {
    let env = Env::new();
    let srv = env.start(&["-np", "2"]).await;
    let (_, ids) = srv.post("/tokenize", &json!({"content": "hello"})).await;
    let ids = ids["tokens"].clone();
    let (status, r) = srv
        .post(
            "/completion",
            &json!({"prompt": [ids, "hello", {"prompt_string": "hello"}], "n_predict": 3,
                    "temperature": 0}),
        )
        .await;
    assert_eq!(status, 200, "{r}");
    let all = r.as_array().expect("a list for several prompts");
    assert_eq!(all.len(), 3);
    for (i, one) in all.iter().enumerate() {
        assert_eq!(one["index"], i);
        assert_eq!(
            one["content"], all[0]["content"],
            "same prompt, same greedy text"
        );
    }
    // OpenAI's `n`: that many choices.
    let (status, chat) = srv
        .post(
            "/v1/chat/completions",
            &json!({"messages": [{"role": "user", "content": "hi"}], "n": 3, "max_tokens": 3}),
        )
        .await;
    assert_eq!(status, 200, "{chat}");
    let choices = chat["choices"].as_array().unwrap();
    let indexes: Vec<u64> = choices
        .iter()
        .map(|c| c["index"].as_u64().unwrap())
        .collect();
    assert_eq!(indexes, [0, 1, 2]);
    assert!(chat["system_fingerprint"]
        .as_str()
        .unwrap()
        .starts_with('b'));
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stream_ends_with_a_usage_chunk_and_can_report_progress() {
    let env = Env::new();
    let srv = env.start(&["-ub", "16"]).await;
    let (status, _, raw) = srv
        .post_stream(
            "/v1/chat/completions",
            &json!({"messages": [{"role": "user", "content": "a long enough prompt to take a few chunks"}],
                    "max_tokens": 3, "stream": true, "return_progress": true,
                    "logprobs": true, "top_logprobs": 2}),
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(raw.last().map(String::as_str), Some("[DONE]"));
    let evs = events(&raw);
    let last = evs.last().unwrap();
    assert_eq!(last["choices"], json!([]), "{last}");
    let usage = &last["usage"];
    assert!(usage["prompt_tokens"].as_u64().unwrap() > 16);
    let progress: Vec<&Value> = evs
        .iter()
        .filter_map(|e| e.get("prompt_progress"))
        .collect();
    assert!(progress.len() >= 2, "{evs:?}");
    let total = progress[0]["total"].as_u64().unwrap();
    assert_eq!(total, usage["prompt_tokens"].as_u64().unwrap());
    assert_eq!(progress.last().unwrap()["processed"], total);
    // Every text chunk carries its tokens' log-probabilities.
    for e in &evs {
        if let Some(c) = e["choices"].get(0) {
            if c["delta"]["content"]
                .as_str()
                .is_some_and(|t| !t.is_empty())
            {
                assert!(
                    !c["logprobs"]["content"].as_array().unwrap().is_empty(),
                    "{e}"
                );
            }
        }
    }
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_token_cut_inside_a_character_goes_out_with_its_text() {
    let env = Env::new();
    let srv = env.start(&[]).await;
    // Byte tokens 0xE2 and 0x82 (the tiny vocabulary's ids are the bytes) begin a three-byte
    // character that never completes: every token leaves bytes held, and some push out a
    // replacement character while holding the next one.
    for (first, then) in [(0xE2, 0xE2), (0xE2, 0x82), (0x82, 0xE2)] {
        let (status, _, raw) = srv
            .post_stream(
                "/v1/chat/completions",
                &json!({"messages": [{"role": "user", "content": "hi"}],
                        "max_tokens": 4, "stream": true, "logprobs": true,
                        "temperature": 0, "ignore_eos": true,
                        "logit_bias": [[first, 60], [then, 50]]}),
            )
            .await;
        assert_eq!(status, 200);
        let (mut text, mut tokens) = (String::new(), String::new());
        for e in events(&raw) {
            let Some(c) = e["choices"].get(0) else {
                continue;
            };
            let delta = c["delta"]["content"].as_str().unwrap_or("");
            let probs = c["logprobs"]["content"].as_array();
            assert!(
                delta.is_empty() || probs.is_some_and(|p| !p.is_empty()),
                "text without its tokens: {e}"
            );
            text.push_str(delta);
            for p in probs.into_iter().flatten() {
                tokens.extend(
                    p["bytes"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|b| b.as_u64().unwrap() as u8 as char),
                );
            }
        }
        let bytes: Vec<u8> = tokens.chars().map(|c| c as u8).collect();
        assert_eq!(bytes.len(), 4, "{raw:?}");
        assert_eq!(text, String::from_utf8_lossy(&bytes), "{raw:?}");
    }
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_have_llama_servers_types() {
    let env = Env::new();
    let srv = env.start(&[]).await;
    let long = "x".repeat(600);
    let (status, e) = srv.post("/completion", &json!({"prompt": long})).await;
    assert_eq!(status, 400, "{e}");
    assert_eq!(e["error"]["type"], "exceed_context_size_error");
    assert_eq!(e["error"]["n_ctx"], 512);
    assert!(e["error"]["n_prompt_tokens"].as_u64().unwrap() > 512);
    for bad in [
        json!({"prompt": "x", "samplers": ["no_such_sampler"]}),
        json!({"prompt": "x", "mirostat": 3}),
        json!({"prompt": "x", "typical_p": 0}),
        json!({"prompt": "x", "top_p": -3}),
        json!({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                            {"role": "assistant", "content": "c"}]}),
    ] {
        let path = if bad.get("messages").is_some() {
            "/v1/chat/completions"
        } else {
            "/completion"
        };
        let (status, e) = srv.post(path, &bad).await;
        assert_eq!(status, 400, "{bad}: {e}");
        common::assert_error(&e, 400);
    }
    // A field for a capability the server lacks is refused, never ignored.
    let (status, e) = srv
        .post(
            "/completion",
            &json!({"prompt": "x", "lora": [{"id": 0, "scale": 1}]}),
        )
        .await;
    assert_eq!(status, 501, "{e}");
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_cors_keys_slots_and_the_page() {
    let env = Env::new();
    let srv = env
        .start(&[
            "--metrics",
            "--no-slots",
            "--api-key",
            "k1,k2",
            "--cors-origins",
            "localhost",
        ])
        .await;
    let client = &srv.client;
    let req = |key: &str| {
        client
            .post(format!("{}/completion", srv.url))
            .bearer_auth(key)
            .json(&json!({"prompt": "hi", "n_predict": 2}))
    };
    assert_eq!(req("k2").send().await.unwrap().status(), 200);
    assert_eq!(req("k1").send().await.unwrap().status(), 200);
    assert_eq!(req("k3").send().await.unwrap().status(), 401);

    let metrics = client
        .get(format!("{}/metrics", srv.url))
        .bearer_auth("k1")
        .send()
        .await
        .unwrap();
    assert!(metrics.headers().contains_key("process-start-time-unix"));
    let text = metrics.text().await.unwrap();
    for name in [
        "llamacpp:prompt_tokens_total",
        "llamacpp:n_decode_total",
        "llamacpp:requests_processing",
    ] {
        assert!(
            text.contains(&format!("# TYPE {name} ")),
            "{name} in\n{text}"
        );
    }
    assert!(text.contains("llamacpp:requests_processing 0\n"), "{text}");

    // A preflight needs no key; only a page served from this machine may read the answers.
    let preflight = |origin: &str| {
        client
            .request(reqwest::Method::OPTIONS, format!("{}/completion", srv.url))
            .header("Origin", origin)
            .header("Access-Control-Request-Method", "POST")
            .send()
    };
    let ok = preflight("http://localhost:3000").await.unwrap();
    assert_eq!(ok.status(), 200);
    assert_eq!(
        ok.headers()["access-control-allow-origin"],
        "http://localhost:3000"
    );
    let evil = preflight("http://localhost.evil.com").await.unwrap();
    assert!(!evil.headers().contains_key("access-control-allow-origin"));

    let slots = client
        .get(format!("{}/slots", srv.url))
        .bearer_auth("k1")
        .send()
        .await
        .unwrap();
    assert_eq!(slots.status(), 501);
    // The page at `/` needs no key.
    let page = client.get(format!("{}/", srv.url)).send().await.unwrap();
    assert_eq!(page.status(), 200);
    assert!(page.text().await.unwrap().starts_with("<!doctype html>"));
    srv.stop().await;

    let srv = env.start(&["--no-ui"]).await;
    assert_eq!(srv.get("/").await.0, 404);
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_tool_call_comes_back_as_tool_calls_whole_and_streamed() {
    let env = Env::new();
    let srv = env.start(&[]).await;
    let tools = json!([{
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {
                "type": "object",
                "properties": { "city": { "enum": ["Paris", "Rome", "Oslo"] } },
                "required": ["city"],
                "additionalProperties": false,
            },
        },
    }]);
    let body = |stream: bool| {
        json!({"messages": [{"role": "user", "content": "weather in Paris?"}], "tools": tools,
               "tool_choice": "required", "max_tokens": 200, "seed": 3, "stream": stream})
    };
    let (status, whole) = srv.post("/v1/chat/completions", &body(false)).await;
    assert_eq!(status, 200, "{whole}");
    let choice = &whole["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{whole}");
    let call = &choice["message"]["tool_calls"][0];
    assert_eq!(call["type"], "function");
    assert_eq!(call["function"]["name"], "get_weather");
    let args: Value =
        serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
    assert!(
        ["Paris", "Rome", "Oslo"].contains(&args["city"].as_str().unwrap()),
        "{args}"
    );

    // Streamed: a first delta names the call, the next ones carry its arguments.
    let (status, _, raw) = srv.post_stream("/v1/chat/completions", &body(true)).await;
    assert_eq!(status, 200);
    let mut name = String::new();
    let mut arguments = String::new();
    let mut reason = Value::Null;
    for e in events(&raw) {
        let Some(c) = e["choices"].get(0) else {
            continue;
        };
        if let Some(calls) = c["delta"]["tool_calls"].as_array() {
            for d in calls {
                assert_eq!(d["index"], 0);
                if let Some(n) = d["function"]["name"].as_str() {
                    assert!(d["id"].is_string());
                    name.push_str(n);
                }
                arguments.push_str(d["function"]["arguments"].as_str().unwrap_or(""));
            }
        }
        if !c["finish_reason"].is_null() {
            reason = c["finish_reason"].clone();
        }
    }
    assert_eq!(name, "get_weather");
    assert_eq!(reason, "tool_calls");
    // The same seed, the same call.
    assert_eq!(arguments, call["function"]["arguments"].as_str().unwrap());
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn context_shift_lets_a_generation_run_past_its_context() {
    let env = Env::new();
    // `-c 64` after the common options' 512: the later value counts, as in llama-server.
    let body = json!({"prompt": "hello there, how are you", "n_predict": 150,
                      "ignore_eos": true, "temperature": 0});
    let plain = env
        .start(&["-np", "1", "-c", "64", "--no-kv-unified"])
        .await;
    let (status, r) = plain.post("/completion", &body).await;
    assert_eq!(status, 200, "{r}");
    let n_prompt = r["tokens_evaluated"].as_u64().unwrap();
    // Without a shift the generation stops where the context is full.
    let stopped = r["tokens_predicted"].as_u64().unwrap();
    assert!(n_prompt + stopped <= 64, "{r}");
    assert_eq!(r["stop_type"], "limit");
    assert_eq!(r["truncated"], false);
    plain.stop().await;

    let shifting = env
        .start(&[
            "-np",
            "1",
            "-c",
            "64",
            "--no-kv-unified",
            "--context-shift",
            "--keep",
            "4",
        ])
        .await;
    let (status, r) = shifting.post("/completion", &body).await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["tokens_predicted"], 150, "{r}");
    assert_eq!(r["truncated"], true);
    assert_eq!(r["stop_type"], "limit");
    assert_eq!(r["generation_settings"]["n_discard"], 0, "{r}");
    // A short generation does not shift.
    let (_, r) = shifting
        .post(
            "/completion",
            &json!({"prompt": "hi", "n_predict": 3, "ignore_eos": true}),
        )
        .await;
    assert_eq!(r["truncated"], false, "{r}");
    // A request's n_discard larger than what can go is held to all but one token.
    let (status, r) = shifting
        .post(
            "/completion",
            &json!({"prompt": "hello there", "n_predict": 100, "ignore_eos": true,
                    "n_keep": -1, "n_discard": 1000}),
        )
        .await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["tokens_predicted"], 100, "{r}");
    // The settings echo the request's n_discard (0, the default, drops half).
    assert_eq!(r["generation_settings"]["n_discard"], 1000, "{r}");
    assert_eq!(r["generation_settings"]["n_keep"], -1, "{r}");
    shifting.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn post_props_is_served_with_the_option_and_changes_nothing_silently() {
    let env = Env::new();
    let plain = env.start(&[]).await;
    let (status, r) = plain.post("/props", &json!({})).await;
    assert_eq!(status, 501, "{r}");
    assert!(
        r["error"]["message"].as_str().unwrap().contains("--props"),
        "{r}"
    );
    plain.stop().await;

    let srv = env.start(&["--props"]).await;
    let (status, r) = srv.post("/props", &json!({})).await;
    assert_eq!((status, &r["success"]), (200, &json!(true)), "{r}");
    // No property can be changed: a field is refused by name, not ignored.
    let (status, r) = srv.post("/props", &json!({"n_predict": 5})).await;
    assert_eq!(status, 400, "{r}");
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains("n_predict"),
        "{r}"
    );
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_reuse_moves_a_later_chunk_of_the_cached_prompt_into_place() {
    let env = Env::new();
    // A prompt, then the same without its middle part (a message deleted from a chat).
    let head = "a".repeat(100);
    let middle = "x".repeat(60);
    let tail = "b".repeat(150);
    let full = json!({"prompt": format!("{head}{middle}{tail}"), "n_predict": 2});
    let cut = json!({"prompt": format!("{head}{tail}"), "n_predict": 2});
    for (options, reused) in [(&[][..], false), (&["--cache-reuse", "16"][..], true)] {
        let mut argv = vec!["--no-cache", "-np", "1"];
        argv.extend_from_slice(options);
        let srv = env.start(&argv).await;
        let (_, first) = srv.post("/completion", &full).await;
        assert_eq!(first["timings"]["cache_n"], 0);
        let (status, r) = srv.post("/completion", &cut).await;
        assert_eq!(status, 200, "{r}");
        let n_prompt = r["tokens_evaluated"].as_u64().unwrap();
        let cache_n = r["timings"]["cache_n"].as_u64().unwrap();
        if reused {
            // Everything but the last token: the head by prefix, the tail moved into place.
            assert_eq!(cache_n, n_prompt - 1, "{r}");
        } else {
            assert_eq!(cache_n, 100, "by prefix only: {r}");
        }
        // A sequence with moved KV is not kept (the first prompt's sequence became it): the
        // same prompt again is computed, never served from the moved pages.
        let (_, again) = srv.post("/completion", &cut).await;
        if reused {
            assert_eq!(again["timings"]["cache_n"], 0, "{again}");
        }
        srv.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reasoning_budget_closes_the_thinking_block_after_its_tokens() {
    // A template that opens a thinking block for the reply, as Qwen3's and DeepSeek's do.
    let env = Env::with_template(Some(
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n\
         {% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}",
    ));
    let body = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 40,
                      "temperature": 0, "ignore_eos": true});
    let unbounded = env.start(&[]).await;
    let (status, free) = unbounded.post("/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{free}");
    unbounded.stop().await;

    let bounded = env.start(&["--reasoning-budget", "5"]).await;
    let (status, r) = bounded.post("/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{r}");
    bounded.stop().await;
    let message = &r["choices"][0]["message"];
    let reasoning = message["reasoning_content"].as_str().unwrap_or("");
    let content = message["content"].as_str().unwrap_or("");
    // Five tokens of the byte vocabulary at most, then the end tag, then the reply.
    assert!(reasoning.trim().chars().count() <= 5, "{r}");
    assert!(!content.is_empty(), "{r}");
    assert_eq!(r["usage"]["completion_tokens"], 40, "{r}");
    // Unbounded, the model thinks for longer than that (its reply never closes the block).
    let free_reasoning = free["choices"][0]["message"]["reasoning_content"]
        .as_str()
        .unwrap_or("");
    assert!(free_reasoning.chars().count() > 5, "{free}");
}
