//! Google Cloud Vertex AI's prediction protocol (`AIP_MODE=PREDICTION`, here by the hidden
//! options of the same names): `{"instances"}` in, `{"predictions"}` out, each instance sent
//! to the endpoint its `@requestFormat` names; malformed requests and instances.

mod common;

use common::Env;
use serde_json::{json, Value};

const GCP: &[&str] = &["--aip-mode", "PREDICTION", "--aip-http-port", "0"];

fn chat(content: &str) -> Value {
    json!({
        "@requestFormat": "chatCompletions",
        "max_tokens": 4,
        "temperature": 0,
        "messages": [{"role": "user", "content": content}],
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_go_to_their_endpoints_in_order() {
    let env = Env::new();
    let srv = env.start(&[GCP, &["-np", "2"]].concat()).await;
    let mut streamed = chat("world");
    streamed["stream"] = json!(true);
    let body = json!({"instances": [
        chat("hello"),
        streamed,
        {"@requestFormat": "/tokenize", "content": "hello world"},
        {"@requestFormat": "applyTemplate", "messages": [{"role": "user", "content": "hi"}]},
        {"@requestFormat": "completion", "prompt": "once", "n_predict": 2},
    ]});
    let (status, res) = srv.post("/predict", &body).await;
    assert_eq!(status, 200, "{res}");
    let p = res["predictions"].as_array().unwrap();
    assert_eq!(p.len(), 5, "{res}");
    for chat in &p[..2] {
        assert_eq!(chat["object"], "chat.completion", "{chat}");
        assert_eq!(chat["choices"][0]["message"]["role"], "assistant");
    }
    // The same greedy request answers the same whether it asked to stream or not.
    let (_, direct) = srv
        .post(
            "/v1/chat/completions",
            &json!({"max_tokens": 4, "temperature": 0,
                    "messages": [{"role": "user", "content": "world"}]}),
        )
        .await;
    assert_eq!(
        p[1]["choices"][0]["message"]["content"],
        direct["choices"][0]["message"]["content"]
    );
    let (_, tokens) = srv
        .post("/tokenize", &json!({"content": "hello world"}))
        .await;
    assert_eq!(p[2], tokens);
    assert!(p[3]["prompt"].as_str().unwrap().contains("hi"), "{}", p[3]);
    assert!(p[4]["content"].is_string(), "{}", p[4]);
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_and_bad_instances() {
    let env = Env::new();
    let srv = env.start(GCP).await;
    // The request itself: 400.
    for body in [
        json!({}),
        json!({"instances": {"@requestFormat": "completion"}}),
        json!([1, 2]),
        json!({"instances": vec![json!({}); 129]}),
    ] {
        let (status, res) = srv.post("/predict", &body).await;
        assert_eq!(status, 400, "{body}: {res}");
        common::assert_error(&res, 400);
    }
    let resp = srv
        .client
        .post(format!("{}/predict", srv.url))
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 400);
    // An instance: an error in its place, the others answered.
    let body = json!({"instances": [
        "not an object",
        {"prompt": "no format"},
        {"@requestFormat": 7},
        {"@requestFormat": "noSuchEndpoint"},
        {"@requestFormat": "completion"},
        {"@requestFormat": "tokenize", "content": "ok"},
    ]});
    let (status, res) = srv.post("/predict", &body).await;
    assert_eq!(status, 200, "{res}");
    let p = res["predictions"].as_array().unwrap();
    assert_eq!(p.len(), 6);
    for e in &p[..5] {
        common::assert_error(e, 400);
    }
    assert!(p[3]["error"]["message"]
        .as_str()
        .unwrap()
        .contains("noSuchEndpoint"));
    assert!(p[5]["tokens"].is_array(), "{}", p[5]);
    // Outside prediction mode there is no predict route.
    let plain = env.start(&[]).await;
    let (status, _) = plain.post("/predict", &json!({"instances": []})).await;
    assert_eq!(status, 404);
    plain.stop().await;
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn named_routes_under_the_prefix() {
    let env = Env::new();
    let args = [
        GCP,
        &[
            "--aip-predict-route",
            "v1/endpoints/e1:predict",
            "--aip-health-route",
            "/ping",
            "--api-prefix",
            "/llm",
        ],
    ]
    .concat();
    let srv = env.start(&args).await;
    let (status, health) = srv.get("/llm/ping").await;
    assert_eq!((status, health), (200, json!({"status": "ok"})));
    let body = json!({"instances": [{"@requestFormat": "tokenize", "content": "a"}]});
    let (status, res) = srv.post("/llm/v1/endpoints/e1:predict", &body).await;
    assert_eq!(status, 200, "{res}");
    assert!(res["predictions"][0]["tokens"].is_array(), "{res}");
    let (status, _) = srv.post("/predict", &body).await;
    assert_eq!(status, 404);
    srv.stop().await;
    // A predict route that is one of the server's own is refused at start.
    let argv = [
        "llama-hdd-server",
        "-m",
        "x.gguf",
        "--aip-mode",
        "PREDICTION",
        "--aip-predict-route",
        "/completion",
    ];
    let err = server::args::Args::parse_from_argv(argv)
        .unwrap()
        .check()
        .unwrap_err();
    assert!(err.to_string().contains("AIP_PREDICT_ROUTE"), "{err}");
}
