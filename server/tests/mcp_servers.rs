//! MCP servers as tool sources, through the binary: their tools at `GET /tools` as
//! `SERVER_TOOL`, calls at `POST /tools`, a configuration that cannot be read refused at
//! start, a server that cannot start left out, and a stop that is prompt while a slow call is
//! in flight and a grandchild of a server holds its pipes. The servers are the hub's fake one
//! (`src/mcp/fake_server.py`), written to the test's directory.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::Killed;
use serde_json::{json, Value};

const FAKE: &str = include_str!("../src/mcp/fake_server.py");

/// A tiny model and the fake server's script.
struct Setup {
    env: common::Env,
}

impl Setup {
    fn new() -> Setup {
        let env = common::Env::new();
        std::fs::write(env.dir.path().join("fake.py"), FAKE).unwrap();
        Setup { env }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.env.dir.path().join(name)
    }

    /// A `mcpServers` entry running the fake server with `opts`.
    fn server(&self, opts: &[&str], timeout_ms: u64) -> Value {
        let mut args = vec![self.path("fake.py").display().to_string()];
        args.extend(opts.iter().map(|s| s.to_string()));
        json!({"command": "python3", "args": args, "timeout_ms": timeout_ms})
    }

    fn command(&self, extra: &[&str]) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_llama-hdd-server"));
        cmd.arg("-m")
            .arg(&self.env.model)
            .arg("--cache-dir")
            .arg(self.env.cache())
            .args(["--port", "0", "-t", "1", "-c", "512"])
            .args(extra);
        cmd
    }

    /// Starts the binary with `servers` as `--mcp-servers-json`; it and its URL.
    fn start(&self, servers: Value) -> (Killed, String) {
        let json = json!({ "mcpServers": servers }).to_string();
        common::spawn_listening(&mut self.command(&["--mcp-servers-json", &json]))
    }
}

async fn get(url: &str, path: &str) -> (u16, Value) {
    let resp = reqwest::get(format!("{url}{path}")).await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

async fn call(url: &str, tool: &str, params: Value) -> (u16, Value) {
    let resp = reqwest::Client::new()
        .post(format!("{url}/tools"))
        .json(&json!({ "tool": tool, "params": params }))
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

fn text(answer: &(u16, Value)) -> &str {
    assert_eq!(answer.0, 200, "{answer:?}");
    answer.1["plain_text_response"]
        .as_str()
        .unwrap_or_else(|| panic!("not a success: {answer:?}"))
}

fn tool_names(list: &Value) -> Vec<String> {
    list.as_array()
        .unwrap()
        .iter()
        .map(|t| t["tool"].as_str().unwrap_or_default().to_owned())
        .collect()
}

/// Waits (polling, up to 10 s) until `cond` holds.
fn until(what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < Duration::from_secs(10), "never: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tools_are_listed_and_called_and_bad_servers_are_left_out() {
    let s = Setup::new();
    let mut missing = s.server(&[], 10_000);
    missing["command"] = json!("/nonexistent/mcp-server-12345");
    let (_server, url) = s.start(json!({
        "echo": s.server(&[], 10_000),
        "paged": s.server(&["--pages"], 10_000),
        "hangs": s.server(&["--hang-init"], 500),
        "missing": missing,
    }));
    assert_eq!(get(&url, "/health").await.0, 200);
    let (status, list) = get(&url, "/tools").await;
    assert_eq!(status, 200, "{list}");
    let names = tool_names(&list);
    let count = |p: &str| names.iter().filter(|n| n.starts_with(p)).count();
    assert_eq!((count("echo_"), count("paged_")), (13, 13), "{names:?}");
    assert_eq!(count("hangs_") + count("missing_"), 0, "{names:?}");
    let echo = list
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["tool"] == "echo_echo")
        .unwrap();
    let function = &echo["definition"]["function"];
    assert_eq!(echo["definition"]["type"], "function");
    assert_eq!(function["name"], "echo_echo");
    assert_eq!(function["parameters"]["type"], "object");
    assert!(function["parameters"]["properties"].is_object());

    assert_eq!(
        text(&call(&url, "echo_echo", json!({"message": "hello"})).await),
        "echo: hello"
    );
    assert_eq!(
        text(&call(&url, "paged_add", json!({"a": 3, "b": 5})).await),
        "8"
    );
    let failed = call(&url, "echo_is_error", json!({})).await;
    assert_eq!(failed, (200, json!({"error": "the tool failed"})));
    let unknown = call(&url, "echo_nothing", json!({})).await;
    assert_ne!(unknown.0, 200, "{unknown:?}");

    let calls: Vec<_> = (0..10)
        .map(|i| {
            let url = url.clone();
            tokio::spawn(async move {
                let a = call(&url, "echo_echo", json!({"message": format!("m{i}")})).await;
                (i, a)
            })
        })
        .collect();
    for c in calls {
        let (i, a) = c.await.unwrap();
        assert_eq!(text(&a), format!("echo: m{i}"));
    }
    // Hostile answers cost nothing but their own lines.
    for (tool, said) in [
        ("echo_flood", "after the flood"),
        ("echo_garbage", "after the garbage"),
        ("echo_huge", "after the huge line"),
    ] {
        assert_eq!(text(&call(&url, tool, json!({})).await), said);
    }
    assert_eq!(text(&call(&url, "echo_crash", json!({})).await), "crashing");
    assert_eq!(
        text(&call(&url, "echo_echo", json!({"message": "again"})).await),
        "echo: again"
    );
    let slow = call(&url, "hangs_echo", json!({})).await;
    assert_ne!(slow.0, 200, "{slow:?}");
    assert_eq!(get(&url, "/health").await.0, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_past_its_time_limit_is_an_error_in_a_200() {
    let s = Setup::new();
    let (_server, url) = s.start(json!({ "slow": s.server(&[], 500) }));
    let start = Instant::now();
    let (status, body) = call(&url, "slow_sleep", json!({"seconds": 5})).await;
    assert_eq!(status, 200, "{body}");
    assert!(body["error"].as_str().unwrap().contains("500 ms"), "{body}");
    assert!(start.elapsed() < Duration::from_secs(4));
    assert_eq!(
        text(&call(&url, "slow_echo", json!({"message": "x"})).await),
        "echo: x"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopping_is_prompt_with_a_slow_call_and_a_grandchild_on_the_pipes() {
    let s = Setup::new();
    let mark = s.path("sleeping");
    let pids = s.path("pids");
    let opts = [
        "--grandchild",
        "--pid-file",
        &pids.display().to_string(),
        "--mark",
        &mark.display().to_string(),
    ];
    let (mut server, url) = s.start(json!({ "gc": s.server(&opts, 30_000) }));
    let (child, grandchild) = read_pids(&pids);
    let slow = {
        let url = url.clone();
        tokio::spawn(async move {
            reqwest::Client::new()
                .post(format!("{url}/tools"))
                .json(&json!({"tool": "gc_sleep", "params": {"seconds": 10}}))
                .send()
                .await
        })
    };
    until("the slow call reaches the server", || mark.exists());
    let start = Instant::now();
    let pid = rustix::process::Pid::from_raw(server.0.id() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    let status = server.0.wait().unwrap();
    let took = start.elapsed();
    assert!(took < Duration::from_secs(3), "the stop took {took:?}");
    assert!(status.success(), "{status}");
    // The call in flight got an answer or lost its connection, without waiting its 10 s.
    if let Ok(resp) = slow.await.unwrap() {
        assert!(resp.status().as_u16() >= 200);
    }
    until("the MCP server is killed", || common::ended(child));
    until("its grandchild is killed", || common::ended(grandchild));
}

#[test]
fn a_configuration_that_cannot_be_read_stops_the_start() {
    let s = Setup::new();
    let missing = s.path("missing.json").display().to_string();
    for (args, said) in [
        (
            ["--mcp-servers-json", "not valid json"],
            "--mcp-servers-json",
        ),
        (["--mcp-servers-config", missing.as_str()], "missing.json"),
    ] {
        let out = s.command(&args).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}: {stderr}");
        assert!(stderr.contains(said), "{args:?}: {stderr}");
    }
}

fn read_pids(path: &Path) -> (u32, u32) {
    until("the MCP server writes its pids", || {
        std::fs::read_to_string(path).is_ok_and(|t| t.ends_with('\n'))
    });
    let text = std::fs::read_to_string(path).unwrap();
    let mut it = text.split_whitespace().map(|p| p.parse().unwrap());
    (it.next().unwrap(), it.next().unwrap())
}
