//! What the tools' tests share: calls to `/tools`, waiting on a condition, processes ended,
//! and the binary started with a `PATH` of the test's choosing.

#![allow(dead_code)]

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::{Killed, TestServer};

/// POSTs a tool call with `headers`; the status and the body.
pub async fn call(
    srv_url: &str,
    tool: &str,
    params: Value,
    headers: &[(&str, &str)],
) -> (u16, Value) {
    let mut req = reqwest::Client::new()
        .post(format!("{srv_url}/tools"))
        .json(&json!({ "tool": tool, "params": params }));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

/// A call that must succeed: its body.
pub async fn ok(srv: &TestServer, tool: &str, params: Value, headers: &[(&str, &str)]) -> Value {
    let (status, body) = call(&srv.url, tool, params, headers).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.get("error").is_none(), "{body}");
    body
}

/// A call whose tool must fail: its `error`.
pub async fn fails(
    srv: &TestServer,
    tool: &str,
    params: Value,
    headers: &[(&str, &str)],
) -> String {
    let (status, body) = call(&srv.url, tool, params, headers).await;
    assert_eq!(status, 200, "{body}");
    body["error"]
        .as_str()
        .unwrap_or_else(|| panic!("no error in {body}"))
        .to_owned()
}

pub fn text(v: &Value) -> &str {
    v["plain_text_response"]
        .as_str()
        .unwrap_or_else(|| panic!("no text in {v}"))
}

/// Waits until `cond` holds, for at most `limit`, checking it every few milliseconds while
/// the runtime goes on (the server may run on it).
pub async fn wait_until(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if cond() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    cond()
}

pub fn read_pid(path: &Path) -> Option<u32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Starts the binary with `args` and `path` first in its `PATH`; its URL.
pub fn spawn(args: &[&str], path_first: Option<&Path>) -> (Killed, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_llama-hdd-server"));
    cmd.args(["--port", "0", "-t", "1", "-c", "512"]).args(args);
    if let Some(dir) = path_first {
        let path = std::env::var("PATH").unwrap_or_default();
        cmd.env("PATH", format!("{}:{path}", dir.display()));
    }
    crate::common::spawn_listening(
        cmd.env_remove("LLAMA_CACHE")
            .env("HF_HUB_CACHE", "/nonexistent"),
    )
}
