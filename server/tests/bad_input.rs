//! Every kind of bad input gets its status and an OpenAI-style error object, and leaves the
//! server serving.

mod common;

use common::{assert_error, Env};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_bodies_are_400() {
    let env = Env::new();
    let srv = env.start(&["--max-body", "4KiB"]).await;
    let url = |p: &str| format!("{}{p}", srv.url);
    let raw = |path: &'static str, body: &'static str| {
        let req = srv
            .client
            .post(url(path))
            .header("content-type", "application/json")
            .body(body);
        async move {
            let resp = req.send().await.unwrap();
            let status = resp.status().as_u16();
            (status, resp.json::<serde_json::Value>().await.unwrap())
        }
    };
    for (path, body) in [
        (
            "/v1/chat/completions",
            "{\"messages\": [ {\"role\": \"user\"",
        ),
        ("/v1/chat/completions", "{\"messages\": \"hello\"}"),
        (
            "/v1/chat/completions",
            "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"max_tokens\": \"ten\"}",
        ),
        ("/v1/chat/completions", "{\"messages\": []}"),
        ("/completion", "{\"prompt\": 12}"),
        ("/completion", "{\"prompt\": \"\"}"),
        ("/completion", "{\"prompt\": [1, 99999]}"),
        ("/tokenize", "[]"),
        ("/detokenize", "{\"tokens\": [-1]}"),
        ("/detokenize", "{\"tokens\": [100000]}"),
    ] {
        let (status, body) = raw(path, body).await;
        assert_eq!(status, 400, "{path} {body}");
        assert_error(&body, 400);
        assert_eq!(body["error"]["type"], "invalid_request_error");
    }

    // A prompt longer than the context (512 positions here) says so.
    let (status, body) = srv
        .post("/completion", &json!({"prompt": "x".repeat(600)}))
        .await;
    assert_eq!(status, 400);
    assert_error(&body, 400);
    let msg = body["error"]["message"].as_str().unwrap();
    assert!(msg.contains("context") && msg.contains("600"), "{msg}");

    // Over the body limit.
    let (status, body) = srv
        .post("/completion", &json!({"prompt": "x".repeat(5000)}))
        .await;
    assert_eq!(status, 413, "{body}");
    assert_error(&body, 413);

    // Slots: unknown ids, bad actions, filenames that could leave the store or take the
    // prompt cache's own names.
    for (path, body) in [
        ("/slots/7?action=erase", json!({})),
        ("/slots/abc?action=erase", json!({})),
        ("/slots/0?action=explode", json!({})),
        ("/slots/0?action=save", json!({"filename": "../escape"})),
        ("/slots/0?action=save", json!({"filename": "a/b"})),
        ("/slots/0?action=save", json!({"filename": "/etc/passwd"})),
        ("/slots/0?action=restore", json!({"filename": ".."})),
        ("/slots/0?action=restore", json!({"filename": "_tail-0123"})),
        ("/slots/0?action=save", json!({})),
    ] {
        let (status, resp) = srv.post(path, &body).await;
        assert_eq!(status, 400, "{path} {body} -> {resp}");
        assert_error(&resp, 400);
    }
    let (status, body) = srv
        .post("/completion", &json!({"prompt": "hi", "id_slot": 9}))
        .await;
    assert_eq!(status, 400, "{body}");

    // Still serving.
    let (status, body) = srv
        .post("/completion", &json!({"prompt": "hi", "n_predict": 2}))
        .await;
    assert_eq!(status, 200, "{body}");
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_key_is_required_except_for_health() {
    let env = Env::new();
    let key_file = env.dir.path().join("key");
    std::fs::write(&key_file, "sesame-123\n").unwrap();
    let key_path = key_file.display().to_string();
    let srv = env.start(&["--api-key-file", &key_path]).await;
    let body = json!({"prompt": "hi", "n_predict": 1});
    let send = |auth: Option<&'static str>| {
        let mut req = srv
            .client
            .post(format!("{}/completion", srv.url))
            .json(&body);
        if let Some(a) = auth {
            req = req.header("authorization", a);
        }
        async move { req.send().await.unwrap() }
    };
    for auth in [
        None,
        Some("Bearer wrong"),
        Some("Bearer sesame-12"),
        Some("sesame-123"),
    ] {
        let resp = send(auth).await;
        assert_eq!(resp.status().as_u16(), 401, "{auth:?}");
        assert_error(&resp.json().await.unwrap(), 401);
    }
    assert_eq!(send(Some("Bearer sesame-123")).await.status().as_u16(), 200);
    assert_eq!(srv.get("/health").await.0, 200);
    // As llama-server: the model list is public, everything else needs the key.
    assert_eq!(srv.get("/v1/models").await.0, 200);
    assert_eq!(srv.get("/props").await.0, 401);
    srv.stop().await;
}

#[test]
fn the_command_line_refuses_unknown_flags_and_lists_all_in_help() {
    let err = server::Args::parse_from_argv(["llama-hdd-server", "-m", "x.gguf", "--frobnicate"])
        .unwrap_err();
    assert!(err.to_string().contains("--frobnicate"), "{err}");
    let help = server::Args::parse_from_argv(["llama-hdd-server", "--help"])
        .unwrap_err()
        .to_string();
    for flag in [
        "--model",
        "--host",
        "--port",
        "--ctx-size",
        "--parallel",
        "--threads",
        "--n-predict",
        "--temp",
        "--seed",
        "--api-key",
        "--api-key-file",
        "--slot-save-path",
        "--metrics",
        "--alias",
        "--cache-dir",
        "--cache-ram",
        "--cache-disk",
        "--no-cache",
        "--cache-type-k",
        "--cache-type-v",
        "--n-gpu-layers",
    ] {
        assert!(help.contains(flag), "{flag} missing from --help:\n{help}");
    }
    let args = server::Args::parse_from_argv(["s", "-m", "x.gguf", "-ngl", "99"]).unwrap();
    assert_eq!(args.n_gpu_layers, "99");
    let args = server::Args::parse_from_argv(["s", "-m", "x.gguf", "-ngl=3"]).unwrap();
    assert_eq!(args.n_gpu_layers, "3");
    let args =
        server::Args::parse_from_argv(["s", "-m", "x.gguf", "-np", "6", "-c", "100"]).unwrap();
    assert_eq!((args.parallel, args.ctx_size), (6, 100));
    let args =
        server::Args::parse_from_argv(["s", "-m", "x.gguf", "-ctk", "q8_0", "-ctv=q8_0"]).unwrap();
    assert_eq!(
        (args.cache_type_k, args.cache_type_v),
        (engine::KvType::Q8_0, engine::KvType::Q8_0)
    );
    assert!(server::Args::parse_from_argv(["s", "-m", "x.gguf", "-ctk", "q3"]).is_err());
    let bad = server::Args::parse_from_argv(["s", "-m", "x.gguf", "--cache-disk", "lots"])
        .unwrap()
        .check();
    assert!(bad.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_chat_template_fails_its_request_in_the_renderer_and_the_server_goes_on() {
    // As the binary does at start: unreviewed templates render in a child process (this test
    // executable, running only `common::renderer_entry`).
    common::sandbox_on();
    assert!(engine::chat::sandbox::active().is_some());
    // ChatML, except that a message saying "boom" doubles a string sixty times.
    let hostile = "{% for m in messages %}{% if m['content'] == 'boom' %}\
                   {% set ns = namespace(x='ab') %}{% for i in range(60) %}\
                   {% set ns.x = ns.x ~ ns.x %}{% endfor %}{% endif %}\
                   <|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}\
                   {% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
    let env = Env::with_template(Some(hostile));
    let srv = env.start(&[]).await;
    let chat = |text: &str| json!({"messages": [{"role": "user", "content": text}], "max_tokens": 2, "temperature": 0});
    let (status, body) = srv.post("/v1/chat/completions", &chat("boom")).await;
    assert_error(&body, status);
    assert_eq!(status, 500, "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("renderer") && message.contains("memory allocation"),
        "{message}"
    );
    let (status, body) = srv
        .post(
            "/apply-template",
            &json!({"messages": [{"role": "user", "content": "hi"}]}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["prompt"],
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    );
    let (status, body) = srv.post("/v1/chat/completions", &chat("hello")).await;
    assert_eq!(status, 200, "{body}");
    srv.stop().await;
}

/// GPU layers asked of a build without a GPU backend: the server does not start, and says why.
#[cfg(not(any(feature = "cuda", feature = "metal")))]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpu_layers_without_a_gpu_build_are_refused_with_the_way_out() {
    let env = Env::new();
    let model = env.model.display().to_string();
    let args = server::Args::parse_from_argv(["s", "-m", &model, "--port", "0", "-ngl", "1"])
        .unwrap()
        .check()
        .unwrap();
    let err = match server::Server::bind(args).await {
        Ok(_) => panic!("a CPU-only build started with GPU layers"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains("no GPU") && err.contains("--n-gpu-layers 0"),
        "{err}"
    );
}
