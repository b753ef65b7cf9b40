//! Router mode: the binary started without `-m` serves the models of `--models-dir`, each in a
//! process of its own, loaded when a request names it. A model unloaded to make room and
//! loaded again answers from its cache on disk; a model whose file cannot be loaded is said to
//! have failed; without autoload only `/models/load` loads, and the API key guards it all.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::Killed;
use engine::testing::TinyChatModel;
use serde_json::{json, Value};

/// Two tiny models of different weights (so different fingerprints) and a file that is no
/// model, in `dir`.
fn models_dir(dir: &Path) {
    for (name, seed) in [("alpha", 11), ("beta", 12)] {
        TinyChatModel {
            n_ff: 64,
            context_length: 4096,
            seed,
            ..TinyChatModel::default()
        }
        .write(&dir.join(format!("{name}.gguf")))
        .unwrap();
    }
    std::fs::write(dir.join("broken.gguf"), b"GGUF but not really a model").unwrap();
}

/// Starts the binary as a router on port 0; its URL.
fn spawn(args: &[&str]) -> (Killed, String) {
    common::spawn_listening(
        Command::new(env!("CARGO_BIN_EXE_llama-hdd-server"))
            .args(["--port", "0", "-t", "1", "-c", "1024"])
            .args(args)
            .env_remove("LLAMA_CACHE")
            .env("HF_HUB_CACHE", "/nonexistent"),
    )
}

/// A router over [`models_dir`]'s models in a temporary folder, with a cache of its own and
/// `extra` options: the folder (keep it alive), the process and its URL.
fn router(extra: &[&str]) -> (tempfile::TempDir, Killed, String) {
    let dir = tempfile::tempdir().unwrap();
    let models = dir.path().join("models");
    std::fs::create_dir(&models).unwrap();
    models_dir(&models);
    let cache = dir.path().join("cache");
    let mut args = vec![
        "--models-dir",
        models.to_str().unwrap(),
        "--cache-dir",
        cache.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let (process, url) = spawn(&args);
    (dir, process, url)
}

struct Client {
    url: String,
    http: reqwest::Client,
    key: Option<&'static str>,
}

impl Client {
    async fn send(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        let mut req = self
            .http
            .request(method.parse().unwrap(), format!("{}{path}", self.url));
        if let Some(k) = self.key {
            req = req.bearer_auth(k);
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.unwrap();
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    /// Each model's status in `/models`.
    async fn statuses(&self) -> Vec<(String, String)> {
        let (status, body) = self.send("GET", "/models", None).await;
        assert_eq!(status, 200, "{body}");
        body["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                (
                    m["id"].as_str().unwrap().to_owned(),
                    m["status"]["value"].as_str().unwrap().to_owned(),
                )
            })
            .collect()
    }

    async fn status_of(&self, model: &str) -> String {
        self.statuses()
            .await
            .into_iter()
            .find(|(id, _)| id == model)
            .map(|(_, s)| s)
            .unwrap_or_default()
    }

    /// Waits (a minute at most) for `model` to reach `want`.
    async fn wait_for(&self, model: &str, want: &str) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let now = self.status_of(model).await;
            if now == want {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{model} stayed {now}, not {want}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn complete(&self, model: &str, prompt: &str) -> (u16, Value) {
        self.send(
            "POST",
            "/completion",
            Some(json!({
                "model": model, "prompt": prompt, "n_predict": 6, "temperature": 0,
                "cache_prompt": true,
            })),
        )
        .await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_load_on_demand_make_room_and_come_back_with_their_cache() {
    let (_dir, _router, url) = router(&["--models-max", "1"]);
    let c = Client {
        url,
        http: reqwest::Client::new(),
        key: None,
    };
    let listed = c.statuses().await;
    assert_eq!(
        listed,
        [
            ("alpha".to_owned(), "unloaded".to_owned()),
            ("beta".to_owned(), "unloaded".to_owned()),
            ("broken".to_owned(), "unloaded".to_owned()),
        ]
    );
    // A prompt of several pages (the tiny vocabulary is a token per byte).
    let prompt: String = (0..22)
        .map(|i| format!("line {i} of the shared prompt. "))
        .collect();
    let (status, first) = c.complete("alpha", &prompt).await;
    assert_eq!(status, 200, "{first}");
    let n_prompt = first["timings"]["prompt_n"].as_u64().unwrap();
    assert!(n_prompt > 500, "{first}");
    assert_eq!(c.status_of("alpha").await, "loaded");

    // Ollama's listings name the same models.
    let (_, tags) = c.send("GET", "/api/tags", None).await;
    let names: Vec<&str> = tags["models"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["alpha", "beta", "broken"]);
    let (_, ps) = c.send("GET", "/api/ps", None).await;
    assert_eq!(ps["models"][0]["name"], "alpha", "{ps}");
    // Ollama's requests reach the model they name, `:latest` or not, `model` or `name`.
    let (status, chat) = c
        .send(
            "POST",
            "/api/chat",
            Some(json!({
                "model": "alpha:latest", "stream": false, "options": {"num_predict": 4},
                "messages": [{"role": "user", "content": "hi"}],
            })),
        )
        .await;
    assert_eq!((status, &chat["done"]), (200, &json!(true)), "{chat}");
    let (status, show) = c
        .send("POST", "/api/show", Some(json!({"name": "alpha"})))
        .await;
    assert_eq!(status, 200, "{show}");

    // One place: beta's request unloads alpha (its process ends before beta's starts).
    let (status, other) = c.complete("beta", "something else").await;
    assert_eq!(status, 200, "{other}");
    assert_eq!(c.status_of("alpha").await, "unloaded");
    assert_eq!(c.status_of("beta").await, "loaded");

    // alpha again: a new process, whose prompt comes from its cache on disk.
    let (status, again) = c.complete("alpha", &prompt).await;
    assert_eq!(status, 200, "{again}");
    let cache_n = again["timings"]["cache_n"].as_u64().unwrap();
    assert!(
        cache_n + 64 >= n_prompt && cache_n > 0,
        "{cache_n} of {n_prompt} from the cache: {again}"
    );
    assert_eq!(again["content"], first["content"]);

    // A file that is no model: its process fails, and says so.
    let (status, failed) = c.complete("broken", "hello").await;
    assert_eq!(status, 503, "{failed}");
    assert!(
        failed["error"]["message"]
            .as_str()
            .unwrap()
            .contains("failed to load"),
        "{failed}"
    );
    let (_, listed) = c.send("GET", "/models", None).await;
    let broken = listed["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["id"] == "broken")
        .unwrap();
    assert_eq!(broken["status"]["failed"], true, "{broken}");
    assert_ne!(broken["status"]["exit_code"], 0, "{broken}");

    // Requests without a model, or naming none of these, are refused.
    let (status, _) = c.complete("", "x").await;
    assert_eq!(status, 400);
    let (status, body) = c.complete("gamma", "x").await;
    assert_eq!(status, 400);
    assert!(body["error"]["message"].as_str().unwrap().contains("gamma"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_autoload_only_load_starts_a_model_and_the_key_guards_it_under_a_prefix() {
    let (_dir, _router, url) = router(&[
        "--no-models-autoload",
        "--api-key",
        "secret",
        "--api-prefix",
        "/llm",
    ]);
    // Everything under the prefix, the models' own endpoints too.
    let url = format!("{url}/llm");
    let anon = Client {
        url: url.clone(),
        http: reqwest::Client::new(),
        key: None,
    };
    let c = Client {
        url,
        http: reqwest::Client::new(),
        key: Some("secret"),
    };
    let (status, body) = anon.complete("alpha", "hi").await;
    assert_eq!(status, 401, "{body}");
    assert_eq!(body["error"]["type"], "authentication_error");
    let (status, _) = anon
        .send("POST", "/models/load", Some(json!({"model": "alpha"})))
        .await;
    assert_eq!(status, 401);
    assert_eq!(c.status_of("alpha").await, "unloaded");

    let (status, body) = c.send("GET", "/props", None).await;
    assert_eq!(status, 200);
    assert_eq!(body["role"], "router");
    assert_eq!(body["models_autoload"], false);

    let (status, body) = c.complete("alpha", "hi").await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(c.status_of("alpha").await, "unloaded");

    let (status, body) = c
        .send("POST", "/models/load", Some(json!({"model": "alpha"})))
        .await;
    assert_eq!((status, &body["success"]), (200, &json!(true)), "{body}");
    c.wait_for("alpha", "loaded").await;
    let (status, body) = c.complete("alpha", "hi").await;
    assert_eq!(status, 200, "{body}");
    // A model's own endpoints, through `?model=`.
    let (status, body) = c.send("GET", "/props?model=alpha", None).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["model_alias"], "alpha", "{body}");

    let (status, body) = c
        .send("POST", "/models/load", Some(json!({"model": "alpha"})))
        .await;
    assert_eq!(status, 400, "{body}");
    let (status, body) = c
        .send("POST", "/models/unload", Some(json!({"model": "alpha"})))
        .await;
    assert_eq!((status, &body["success"]), (200, &json!(true)), "{body}");
    c.wait_for("alpha", "unloaded").await;
    let (status, _) = c
        .send("POST", "/models/unload", Some(json!({"model": "alpha"})))
        .await;
    assert_eq!(status, 400);
    let (status, _) = c
        .send("POST", "/models/load", Some(json!({"model": "nope"})))
        .await;
    assert_eq!(status, 404);
}

/// A model process that falls asleep (`--sleep-idle-seconds`) is listed as `sleeping`, still
/// takes requests (which wake it) and is listed as `loaded` again once awake.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sleeping_model_is_listed_as_sleeping_and_wakes_for_a_request() {
    // Five idle seconds: long enough that a poll sees it awake between a request and the next
    // sleep.
    let (_dir, _router, url) = router(&["--sleep-idle-seconds", "5"]);
    let c = Client {
        url,
        http: reqwest::Client::new(),
        key: None,
    };
    let (status, first) = c.complete("alpha", "one two three").await;
    assert_eq!(status, 200, "{first}");
    c.wait_for("alpha", "sleeping").await;
    // Ollama's running list still holds it: its process runs.
    let (_, ps) = c.send("GET", "/api/ps", None).await;
    assert_eq!(ps["models"][0]["name"], "alpha", "{ps}");
    let (status, again) = c.complete("alpha", "one two three").await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["content"], first["content"]);
    c.wait_for("alpha", "loaded").await;
}

/// `/rerank` names its model like any request and reaches that model's process, which the
/// router started with `--rerank` (an option the router passes on).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rerank_reaches_the_model_it_names() {
    let (_dir, _router, url) = router(&["--rerank"]);
    let c = Client {
        url,
        http: reqwest::Client::new(),
        key: None,
    };
    let documents = ["a cat sat", "the dog ran far away", "cats"];
    let (status, body) = c
        .send(
            "POST",
            "/v1/rerank",
            Some(json!({"model": "beta", "query": "cat", "documents": documents, "top_n": 2})),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let results = body["results"].as_array().unwrap();
    assert_eq!(results.len(), 2, "{body}");
    let scores: Vec<f64> = results
        .iter()
        .map(|r| r["relevance_score"].as_f64().unwrap())
        .collect();
    assert!(scores[0] >= scores[1], "{body}");
    assert!(
        body["usage"]["prompt_tokens"].as_u64().unwrap() > 0,
        "{body}"
    );
    assert_eq!(c.status_of("beta").await, "loaded");
    assert_eq!(c.status_of("alpha").await, "unloaded");
}
