//! What the server's tests share: a tiny model written by the test, a server started in this
//! process on 127.0.0.1 with port 0, and small HTTP helpers.

#![allow(dead_code)]

use std::path::{Path, PathBuf};

use engine::testing::TinyChatModel;
use serde_json::Value;
use server::{Args, Server};
use tokio::sync::oneshot;

/// A tiny llama with a byte-level vocabulary (every byte is a token, so any text encodes),
/// ChatML's control tokens (the default template) and `<|im_end|>` as end of generation.
pub fn write_tiny_model(path: &Path) {
    write_tiny_model_with_template(path, None);
}

/// [`write_tiny_model`] with `template` as `tokenizer.chat_template`.
pub fn write_tiny_model_with_template(path: &Path, template: Option<&str>) {
    TinyChatModel {
        n_ff: 64,
        context_length: 4096,
        template: template.map(str::to_owned),
        ..TinyChatModel::default()
    }
    .write(path)
    .unwrap();
}

/// The template renderer's `main` when [`sandbox_on`] starts this test executable as one
/// (`common::renderer_entry` in every test binary that shares this module).
#[test]
fn renderer_entry() {
    engine::chat::sandbox::serve_if_renderer();
}

/// Where the binary renders templates it has not reviewed, the tests do too: in the sandbox,
/// with this test executable (running only [`renderer_entry`]) as the renderer, limited to
/// 512 MiB and 3 s. The first call in a process decides; later ones do nothing.
pub fn sandbox_on() {
    let exe = std::env::current_exe().unwrap();
    let args = [
        "common::renderer_entry",
        "--exact",
        "--nocapture",
        "--test-threads=1",
    ];
    let limits = engine::chat::sandbox::Limits {
        memory_bytes: 512 << 20,
        time: std::time::Duration::from_secs(3),
    };
    engine::chat::sandbox::enable(exe, args.iter().map(Into::into).collect(), limits);
}

/// A directory holding a tiny model and a cache directory.
pub struct Env {
    pub dir: tempfile::TempDir,
    pub model: PathBuf,
}

impl Env {
    pub fn new() -> Env {
        Env::with_template(None)
    }

    /// A tiny model with `template` as its chat template (ChatML when `None`).
    pub fn with_template(template: Option<&str>) -> Env {
        let dir = tempfile::tempdir().unwrap();
        let model = dir.path().join("tiny.gguf");
        write_tiny_model_with_template(&model, template);
        Env { dir, model }
    }

    pub fn cache(&self) -> PathBuf {
        self.dir.path().join("cache")
    }

    /// Starts a server on the tiny model and this directory's cache, with `extra` options.
    pub async fn start(&self, extra: &[&str]) -> TestServer {
        // `-c` is what each request may use, whatever the slots.
        let mut argv = vec!["-t", "1", "-c", "512", "--kv-unified"];
        argv.extend_from_slice(extra);
        start_on(&self.model, &self.cache(), &argv).await
    }
}

/// Starts a server in this process on `model` with `cache` as its cache directory, on a free
/// port, with `extra` options.
pub async fn start_on(model: &Path, cache: &Path, extra: &[&str]) -> TestServer {
    let model = model.display().to_string();
    let cache = cache.display().to_string();
    let mut argv = vec![
        "llama-hdd-server",
        "-m",
        &model,
        "--port",
        "0",
        "--cache-dir",
        &cache,
    ];
    argv.extend_from_slice(extra);
    TestServer::start(&argv).await
}

/// A server running in this process.
pub struct TestServer {
    pub url: String,
    pub client: reqwest::Client,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<server::Result<()>>>,
}

impl TestServer {
    /// Starts a server with the command line `argv` (program name first).
    pub async fn start(argv: &[&str]) -> TestServer {
        sandbox_on();
        let config = Args::parse_from_argv(argv.iter().copied())
            .unwrap()
            .check()
            .unwrap();
        let server = Server::bind(config).await.unwrap();
        let url = format!("http://{}", server.local_addr());
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(server.run_until(async {
            let _ = stopped.await;
        }));
        TestServer {
            url,
            client: reqwest::Client::new(),
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// Stops it as SIGTERM would: requests finish, the cache is flushed.
    pub async fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.task.take() {
            t.await.unwrap().unwrap();
        }
    }

    /// POSTs `body` as JSON; returns the status and the parsed body.
    pub async fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let (status, text) = self.post_text(path, body).await;
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    /// POSTs `body` as JSON; returns the status and the body's text.
    pub async fn post_text(&self, path: &str, body: &Value) -> (u16, String) {
        let resp = self
            .client
            .post(format!("{}{path}", self.url))
            .json(body)
            .send()
            .await
            .unwrap();
        let status = resp.status().as_u16();
        (status, resp.text().await.unwrap())
    }

    /// GETs `path`; returns the status and the parsed body (or the text).
    pub async fn get(&self, path: &str) -> (u16, Value) {
        let resp = self
            .client
            .get(format!("{}{path}", self.url))
            .send()
            .await
            .unwrap();
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    /// POSTs `body` and reads the server-sent events: the `data:` payloads, in order.
    pub async fn post_stream(&self, path: &str, body: &Value) -> (u16, String, Vec<String>) {
        let mut resp = self
            .client
            .post(format!("{}{path}", self.url))
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
        let mut raw = Vec::new();
        while let Some(chunk) = resp.chunk().await.unwrap() {
            raw.extend_from_slice(&chunk);
        }
        let text = String::from_utf8(raw).unwrap();
        let events = text
            .split("\n\n")
            .filter_map(|e| e.strip_prefix("data: "))
            .map(str::to_owned)
            .collect();
        (status, ctype, events)
    }
}

/// The OpenAI error object's fields, checked to be there.
pub fn assert_error(body: &Value, code: u16) {
    let e = &body["error"];
    assert!(
        e["message"].as_str().is_some_and(|m| !m.is_empty()),
        "no message in {body}"
    );
    assert!(e["type"].as_str().is_some(), "no type in {body}");
    assert_eq!(e["code"], code, "{body}");
}

/// Posts `body` to `path` and reads the server-sent events of the answer as (event name,
/// data): the Anthropic and Responses APIs name each event.
pub async fn named_events(
    srv: &TestServer,
    path: &str,
    body: &Value,
) -> (u16, Vec<(String, Value)>) {
    let (status, text) = srv.post_text(path, body).await;
    let events = text
        .split("\n\n")
        .filter(|e| !e.trim().is_empty())
        .map(|e| {
            let mut name = String::new();
            let mut data = Value::Null;
            for line in e.lines() {
                if let Some(n) = line.strip_prefix("event: ") {
                    name = n.to_owned();
                } else if let Some(d) = line.strip_prefix("data: ") {
                    data = serde_json::from_str(d).unwrap();
                }
            }
            (name, data)
        })
        .collect();
    (status, events)
}

/// Bytes of every regular file under `dir`, recursively, each file once: a file renamed while
/// the directory is read (the store writes a temporary file and renames it into place) may be
/// listed under both names, and is counted by its inode.
pub fn dir_bytes(dir: &Path) -> u64 {
    let mut seen = std::collections::HashMap::new();
    file_sizes(dir, &mut seen);
    seen.values().sum()
}

/// The size of every regular file under `dir` by (device, inode).
fn file_sizes(dir: &Path, seen: &mut std::collections::HashMap<(u64, u64), u64>) {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        match e.file_type() {
            Ok(t) if t.is_dir() => file_sizes(&e.path(), seen),
            Ok(t) if t.is_file() => {
                if let Ok(m) = e.metadata() {
                    seen.insert((m.dev(), m.ino()), m.len());
                }
            }
            _ => {}
        }
    }
}

/// A server process, killed when dropped (a failing test leaves none behind).
pub struct Killed(pub std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A counter of `/metrics` at `url` (`llamahdd:NAME`; 0 when absent).
pub async fn metric(url: &str, name: &str) -> u64 {
    let text = reqwest::get(format!("{url}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("llamahdd:{name} ")))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Starts `cmd` (a server binary) with its standard error piped, reads it up to the line saying
/// where it listens and drains the rest in a thread of its own (so the process never blocks on a
/// full pipe); the process, killed when dropped, and its URL.
pub fn spawn_listening(cmd: &mut std::process::Command) -> (Killed, String) {
    use std::io::BufRead;
    let mut child = cmd.stderr(std::process::Stdio::piped()).spawn().unwrap();
    let mut lines = std::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let url = listening_url(&mut lines);
    std::thread::spawn(move || for _ in lines {});
    (Killed(child), url)
}

/// Whether process `pid` has ended (gone, or a zombie waiting for its parent).
pub fn ended(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z')),
    }
}

/// Reads a server binary's standard error up to the line saying where it listens; its URL.
pub fn listening_url(lines: &mut impl Iterator<Item = std::io::Result<String>>) -> String {
    loop {
        let line = lines
            .next()
            .expect("the server said where it listens")
            .unwrap();
        if let Some(rest) = line.split("listening on ").nth(1) {
            return rest.trim().to_owned();
        }
    }
}

impl TestServer {
    /// Sends `method` to `path` with API key `key` (as `Authorization: Bearer`), and `body` as
    /// JSON when given; returns the status and the parsed body (or the text).
    pub async fn send_as(
        &self,
        key: &str,
        method: reqwest::Method,
        path: &str,
        body: Option<&Value>,
    ) -> (u16, Value) {
        let mut req = self
            .client
            .request(method, format!("{}{path}", self.url))
            .bearer_auth(key);
        if let Some(b) = body {
            req = req.json(b);
        }
        let resp = req.send().await.unwrap();
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }
}

impl TestServer {
    /// Starts a `/completion` stream of `n_predict` sampled tokens that an end of generation
    /// does not stop, and waits for its first chunk (so it is running when this returns).
    pub async fn endless_stream(&self, n_predict: u64) -> reqwest::Response {
        let mut resp = self
            .client
            .post(format!("{}/completion", self.url))
            .json(&serde_json::json!({
                "prompt": "go on and on",
                "n_predict": n_predict,
                "stream": true,
                "temperature": 1.0,
                "ignore_eos": true,
            }))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 200);
        assert!(resp.chunk().await.unwrap().is_some());
        resp
    }
}

/// The largest regular file under `dir`, recursively (in a store: one block file).
pub fn largest_file(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => largest_file(&e.path()),
            Ok(t) if t.is_file() => e.metadata().map_or(0, |m| m.len()),
            _ => 0,
        })
        .max()
        .unwrap_or(0)
}
