//! The hub against fake MCP servers (`fake_server.py`, written to a temporary directory by
//! each test): a well-behaved one, and the same program told to crash, hang, flood, lie or
//! leave a grandchild holding its pipes. Also the framing and the configuration alone.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::config::{self, ServerConfig};
use super::wire::{parse_message, Frame, LineReader, Message, RpcError};
use super::McpHub;

const FAKE: &str = include_str!("fake_server.py");

/// The fake server's script in a directory of its own.
struct Script {
    dir: tempfile::TempDir,
}

impl Script {
    fn new() -> Script {
        let dir = tempfile::tempdir().expect("a temporary directory");
        std::fs::write(dir.path().join("fake.py"), FAKE).expect("the script is written");
        Script { dir }
    }

    fn path(&self) -> PathBuf {
        self.dir.path().join("fake.py")
    }

    /// A server named `name` running the script with `opts`.
    fn server(&self, name: &str, opts: &[&str], timeout_ms: u64) -> ServerConfig {
        let mut args = vec![self.path().display().to_string()];
        args.extend(opts.iter().map(|s| s.to_string()));
        ServerConfig {
            name: name.into(),
            command: "python3".into(),
            args,
            env: Vec::new(),
            cwd: None,
            timeout: Duration::from_millis(timeout_ms),
        }
    }
}

/// A warmed-up hub over `servers`, and its log.
async fn hub(servers: Vec<ServerConfig>) -> (Arc<McpHub>, Arc<Mutex<Vec<String>>>) {
    let hub = Arc::new(McpHub::new(servers));
    let log = Arc::new(Mutex::new(Vec::new()));
    let kept = Arc::clone(&log);
    hub.set_log(move |line| kept.lock().expect("the log lock").push(line));
    hub.warmup().await;
    (hub, log)
}

async fn call(hub: &McpHub, tool: &str, params: Value) -> Value {
    hub.call(tool, params).await.expect("the tool exists")
}

fn text(answer: &Value) -> &str {
    answer["plain_text_response"]
        .as_str()
        .unwrap_or_else(|| panic!("not a success: {answer}"))
}

fn names(list: &[Value]) -> Vec<String> {
    list.iter()
        .map(|t| t["tool"].as_str().expect("a tool name").to_owned())
        .collect()
}

/// Waits (polling, up to 10 s) until `cond` holds.
async fn until(what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < Duration::from_secs(10), "never: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Whether process `pid` is gone (or a zombie nobody needs).
fn gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z')),
    }
}

fn pid_of(hub: &McpHub, slot: usize) -> u32 {
    hub.slots[slot]
        .current()
        .expect("a child")
        .pid()
        .expect("its pid")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_well_behaved_server_lists_and_answers() {
    let s = Script::new();
    let (hub, _) = hub(vec![s.server("fk", &[], 10_000)]).await;
    let list = hub.list().await;
    assert!(names(&list).contains(&"fk_echo".to_owned()), "{list:?}");
    let echo = list
        .iter()
        .find(|t| t["tool"] == "fk_echo")
        .expect("fk_echo is listed");
    assert_eq!(echo["type"], "mcp");
    assert_eq!(echo["definition"]["type"], "function");
    assert_eq!(echo["definition"]["function"]["name"], "fk_echo");
    assert_eq!(
        echo["definition"]["function"]["description"],
        "the echo tool"
    );
    assert_eq!(
        echo["definition"]["function"]["parameters"]["type"],
        "object"
    );

    let a = call(&hub, "fk_echo", json!({"message": "hello"})).await;
    assert_eq!(text(&a), "echo: hello");
    let a = call(&hub, "fk_add", json!({"a": 3, "b": 5})).await;
    assert_eq!(text(&a), "8");
    let a = call(&hub, "fk_is_error", json!({})).await;
    assert_eq!(a, json!({"error": "the tool failed"}));
    let a = call(&hub, "fk_fail_once", Value::Null).await;
    assert_eq!(a, json!({"error": "transient error"}));
    let a = call(&hub, "fk_fail_once", json!({})).await;
    assert_eq!(text(&a), "ok");
    let a = call(&hub, "fk_echo", json!("not an object")).await;
    assert!(
        a["error"].as_str().expect("an error").contains("object"),
        "{a}"
    );
    assert!(hub.has_tool("fk_echo") && !hub.has_tool("fk_nothing"));
    assert!(hub.call("fk_nothing", json!({})).await.is_none());
    assert!(hub.call("echo", json!({})).await.is_none());
    hub.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_servers_paged_lists_and_empty_ones() {
    let s = Script::new();
    let servers = vec![
        s.server("one", &[], 10_000),
        s.server("two", &["--pages"], 10_000),
        s.server("none", &["--no-tools"], 10_000),
        s.server("missing", &[], 10_000),
    ];
    let mut servers = servers;
    servers[3].command = "/nonexistent/mcp-server-12345".into();
    let (hub, log) = hub(servers).await;
    let list = names(&hub.list().await);
    let count = |p: &str| list.iter().filter(|n| n.starts_with(p)).count();
    assert_eq!(count("one_"), 13, "{list:?}");
    assert_eq!(count("two_"), 13, "{list:?}");
    assert_eq!(count("none_") + count("missing_"), 0, "{list:?}");
    assert_eq!(
        text(&call(&hub, "two_echo", json!({"message": "2"})).await),
        "echo: 2"
    );
    assert_eq!(
        text(&call(&hub, "one_echo", json!({"message": "1"})).await),
        "echo: 1"
    );
    let log = log.lock().expect("the log lock").join("\n");
    assert!(log.contains("\"missing\" is left out"), "{log}");
    hub.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlapping_calls_are_matched_by_id() {
    let s = Script::new();
    let (hub, _) = hub(vec![s.server("fk", &[], 20_000)]).await;
    let slow = {
        let hub = Arc::clone(&hub);
        tokio::spawn(async move { call(&hub, "fk_sleep", json!({"seconds": 3})).await })
    };
    until("the slow call is in flight", || hub.in_flight() == 1).await;
    // Answered while the slow one waits: nothing is serialized behind it.
    let a = call(&hub, "fk_echo", json!({"message": "fast"})).await;
    assert_eq!(text(&a), "echo: fast");
    assert!(!slow.is_finished());

    let mut calls = Vec::new();
    for i in 0..40 {
        let hub = Arc::clone(&hub);
        calls.push(tokio::spawn(async move {
            let (tool, args) = if i % 4 == 0 {
                ("fk_sleep", json!({"seconds": 0.01 * f64::from(40 - i)}))
            } else {
                ("fk_echo", json!({"message": format!("m{i}")}))
            };
            (i, call(&hub, tool, args).await)
        }));
    }
    for c in calls {
        let (i, a) = c.await.expect("the call task");
        if i % 4 == 0 {
            assert!(text(&a).starts_with("slept 0."), "{a}");
        } else {
            assert_eq!(text(&a), format!("echo: m{i}"));
        }
    }
    assert_eq!(text(&slow.await.expect("the slow call task")), "slept 3");
    hub.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_past_its_time_limit_fails_and_the_server_stays() {
    let s = Script::new();
    let (hub, _) = hub(vec![s.server("slow", &[], 2000)]).await;
    let pid = pid_of(&hub, 0);
    let start = Instant::now();
    let a = call(&hub, "slow_hang", json!({})).await;
    assert!(
        a["error"]
            .as_str()
            .expect("an error")
            .contains("no answer within 2000 ms"),
        "{a}"
    );
    assert!(start.elapsed() < Duration::from_secs(6));
    assert_eq!(hub.in_flight(), 0);
    assert_eq!(
        text(&call(&hub, "slow_echo", json!({"message": "x"})).await),
        "echo: x"
    );
    assert_eq!(pid_of(&hub, 0), pid);
    hub.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_dies_is_started_again() {
    let s = Script::new();
    let (hub, _) = hub(vec![s.server("cr", &[], 10_000)]).await;
    let first = text(&call(&hub, "cr_pid", json!({})).await).to_owned();
    // It answers, then exits: the answer is not lost.
    assert_eq!(text(&call(&hub, "cr_crash", json!({})).await), "crashing");
    until("the crash is seen", || {
        !hub.slots[0].current().expect("a child").is_alive()
    })
    .await;
    let second = text(&call(&hub, "cr_pid", json!({})).await).to_owned();
    assert_ne!(first, second);
    // Half an answer, then exit: the call fails, the next one is served by a new child.
    let a = call(&hub, "cr_exit_mid", json!({})).await;
    let e = a["error"].as_str().expect("an error");
    assert!(e.contains("exited") || e.contains("closed"), "{a}");
    assert_eq!(
        text(&call(&hub, "cr_echo", json!({"message": "back"})).await),
        "echo: back"
    );
    hub.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notifications_garbage_and_huge_lines_are_passed_over() {
    let s = Script::new();
    let (hub, log) = hub(vec![s.server("bad", &["--stderr-spam"], 20_000)]).await;
    let a = call(&hub, "bad_flood", json!({"count": 50000})).await;
    assert_eq!(text(&a), "after the flood");
    let a = call(&hub, "bad_garbage", json!({})).await;
    assert_eq!(text(&a), "after the garbage");
    let a = call(&hub, "bad_huge", json!({})).await;
    assert_eq!(text(&a), "after the huge line");
    // The server's own requests are answered (ping with a result, others with an error).
    let a = call(&hub, "bad_ping_us", json!({})).await;
    assert_eq!(text(&a), "pong");
    let log = log.lock().expect("the log lock").join("\n");
    for what in ["not JSON", "an id we never sent", "longer than 8 MiB"] {
        assert_eq!(log.matches(what).count(), 1, "{what}: {log}");
    }
    hub.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn servers_that_fail_to_start_are_left_out_quickly() {
    let s = Script::new();
    let servers = vec![
        s.server("good", &[], 10_000),
        s.server("hangs", &["--hang-init"], 500),
        s.server("exits", &["--exit-init"], 10_000),
    ];
    let start = Instant::now();
    let (hub, log) = hub(servers).await;
    // The one that hangs costs the start limit, no more.
    assert!(
        start.elapsed() < Duration::from_secs(15),
        "{:?}",
        start.elapsed()
    );
    let list = names(&hub.list().await);
    assert!(list.iter().all(|n| n.starts_with("good_")), "{list:?}");
    assert_eq!(list.len(), 13);
    let log = log.lock().expect("the log lock").join("\n");
    assert!(log.contains("a fake failure"), "{log}");
    assert!(log.contains("\"hangs\" is left out"), "{log}");
    assert!(hub.call("hangs_echo", json!({})).await.is_none());
    hub.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_fails_calls_in_flight_at_once_and_kills_the_group() {
    let s = Script::new();
    let pids = s.dir.path().join("pids");
    let pid_file = pids.display().to_string();
    let (hub, _) = hub(vec![s.server(
        "gc",
        &["--grandchild", "--pid-file", &pid_file],
        30_000,
    )])
    .await;
    let (child, grandchild) = read_pids(&pids);
    let slow = {
        let hub = Arc::clone(&hub);
        tokio::spawn(async move { call(&hub, "gc_sleep", json!({"seconds": 10})).await })
    };
    until("the slow call is in flight", || hub.in_flight() == 1).await;
    let start = Instant::now();
    hub.shutdown().await;
    let a = slow.await.expect("the slow call task");
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(a["error"], "the server is shutting down", "{a}");
    until("the child is killed", || gone(child)).await;
    until("the grandchild is killed", || gone(grandchild)).await;
    let a = call(&hub, "gc_echo", json!({})).await;
    assert_eq!(a["error"], "the server is shutting down", "{a}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grandchild_holding_the_pipes_does_not_stall_a_respawn() {
    let s = Script::new();
    let (hub, _) = hub(vec![s.server("gc", &["--grandchild"], 10_000)]).await;
    assert_eq!(text(&call(&hub, "gc_crash", json!({})).await), "crashing");
    // Seen by its exit, not by an end of file (the grandchild keeps the pipes open).
    until("the crash is seen", || {
        !hub.slots[0].current().expect("a child").is_alive()
    })
    .await;
    let start = Instant::now();
    let a = call(&hub, "gc_echo", json!({"message": "again"})).await;
    assert_eq!(text(&a), "echo: again");
    assert!(start.elapsed() < Duration::from_secs(5));
    hub.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_hub_kills_its_children() {
    let s = Script::new();
    let (hub, _) = hub(vec![s.server("d", &[], 10_000)]).await;
    let pid = pid_of(&hub, 0);
    drop(hub);
    until("the child is killed", || gone(pid)).await;
}

fn read_pids(path: &Path) -> (u32, u32) {
    let text = std::fs::read_to_string(path).expect("the pid file");
    let mut it = text.split_whitespace().map(|p| p.parse().expect("a pid"));
    (it.next().expect("a pid"), it.next().expect("two pids"))
}

#[test]
fn lines_do_not_depend_on_chunking_and_are_capped() {
    let input = b"{\"a\":1}\r\n\n  \r\nxxxxxxxxxxxxxxxx\nok\nabcdefghij\r\nlast-unterminated";
    let frames = |chunks: &[&[u8]]| {
        let mut r = LineReader::new(10);
        let mut out = Vec::new();
        for c in chunks {
            r.push(c, |f| {
                out.push(match f {
                    Frame::Line(l) => Some(l.to_vec()),
                    Frame::Oversized => None,
                })
            });
        }
        assert!(r.pending() <= 10);
        out
    };
    let whole = frames(&[input]);
    assert_eq!(
        whole,
        vec![
            Some(b"{\"a\":1}".to_vec()),
            None,
            Some(b"ok".to_vec()),
            None,
            None
        ]
    );
    let bytes: Vec<&[u8]> = input.chunks(1).collect();
    assert_eq!(frames(&bytes), whole);
    let bytes: Vec<&[u8]> = input.chunks(7).collect();
    assert_eq!(frames(&bytes), whole);
}

#[test]
fn messages_are_told_apart() {
    let m = |s: &str| parse_message(s.as_bytes());
    assert_eq!(
        m(r#"{"jsonrpc":"2.0","id":7,"result":{"x":1}}"#),
        Message::Response {
            id: 7,
            outcome: Ok(json!({"x": 1}))
        }
    );
    assert_eq!(
        m(r#"{"id":8,"error":{"code":-1,"message":"no"}}"#),
        Message::Response {
            id: 8,
            outcome: Err(RpcError {
                code: -1,
                message: "no".into()
            })
        }
    );
    assert_eq!(m(r#"{"id":"8","result":{}}"#), Message::ForeignResponse);
    assert_eq!(m(r#"{"id":8.5,"result":{}}"#), Message::ForeignResponse);
    assert_eq!(
        m(r#"{"method":"notifications/progress","params":{}}"#),
        Message::Notification {
            method: "notifications/progress".into()
        }
    );
    assert_eq!(
        m(r#"{"id":"s","method":"ping"}"#),
        Message::Request {
            id: json!("s"),
            method: "ping".into()
        }
    );
    for bad in [
        "nope",
        "[1]",
        r#"{"id":1}"#,
        r#"{"result":{}}"#,
        r#"{"id":1,"result":1,"error":{}}"#,
        r#"{"method":5}"#,
    ] {
        assert!(matches!(m(bad), Message::Invalid(_)), "{bad}");
    }
    assert!(matches!(
        parse_message(b"{\"id\":1,\"result\":\"\xff\"}"),
        Message::Invalid(_)
    ));
    let deep = "[".repeat(100_000);
    assert!(matches!(m(&deep), Message::Invalid(_)));
}

#[test]
fn the_configuration_is_read_as_llama_server_reads_it() {
    let mut warnings = Vec::new();
    let servers = config::parse(
        r#"{"mcpServers": {
            "a": {"command": "prog", "args": ["x", "y"], "env": {"K": "V"}, "timeout_ms": 500},
            "web": {"url": "http://example.invalid/mcp"},
            "b": {"command": "other", "cwd": "/tmp", "disabled": false}
        }}"#,
        &mut warnings,
    )
    .unwrap();
    assert_eq!(servers.len(), 2);
    assert_eq!(servers[0].name, "a");
    assert_eq!(servers[0].args, ["x", "y"]);
    assert_eq!(servers[0].env, [("K".to_owned(), "V".to_owned())]);
    assert_eq!(servers[0].timeout, Duration::from_millis(500));
    assert_eq!(servers[1].timeout, config::DEFAULT_TIMEOUT);
    assert_eq!(servers[1].cwd.as_deref(), Some(Path::new("/tmp")));
    let w = warnings.join("\n");
    assert!(w.contains("\"web\" has no command"), "{w}");
    assert!(w.contains("\"disabled\" is not read"), "{w}");

    for bad in [
        "not valid json",
        r#"{"mcpServers": []}"#,
        r#"{"mcpServers": {"a": "prog"}}"#,
        r#"{"mcpServers": {"a": {"command": 5}}}"#,
        r#"{"mcpServers": {"a": {"command": "p", "args": "x"}}}"#,
        r#"{"mcpServers": {"a": {"command": "p", "args": [1]}}}"#,
        r#"{"mcpServers": {"a": {"command": "p", "env": {"K": 1}}}}"#,
        r#"{"mcpServers": {"a": {"command": "p", "timeout_ms": 0}}}"#,
        r#"{"mcpServers": {"a": {"command": "p", "timeout_ms": "5"}}}"#,
    ] {
        assert!(config::parse(bad, &mut Vec::new()).is_err(), "{bad}");
    }
    let mut warnings = Vec::new();
    assert!(config::parse("{}", &mut warnings).unwrap().is_empty());
    assert_eq!(warnings.len(), 1);
}

#[test]
fn options_that_cannot_be_read_fail_at_start() {
    let args = crate::args::ToolsArgs {
        mcp_servers_json: Some("not valid json".into()),
        ..Default::default()
    };
    let e = McpHub::from_args(&args).unwrap_err().to_string();
    assert!(e.contains("--mcp-servers-json"), "{e}");
    let args = crate::args::ToolsArgs {
        mcp_servers_config: Some("/nonexistent/mcp.json".into()),
        ..Default::default()
    };
    let e = McpHub::from_args(&args).unwrap_err().to_string();
    assert!(e.contains("/nonexistent/mcp.json"), "{e}");
    assert!(McpHub::from_args(&Default::default()).unwrap().is_none());

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("mcp.json");
    std::fs::write(
        &file,
        r#"{"mcpServers": {"a": {"command": "p"}, "b": {"command": "q"}}}"#,
    )
    .unwrap();
    let args = crate::args::ToolsArgs {
        mcp_servers_config: Some(file),
        mcp_servers_json: Some(r#"{"mcpServers": {"a": {"command": "r"}}}"#.into()),
        ..Default::default()
    };
    let hub = McpHub::from_args(&args).unwrap().unwrap();
    let names: Vec<_> = hub.slots.iter().map(|s| s.config.command.clone()).collect();
    assert_eq!(names, ["p", "q"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_sent_as_its_server_exits_goes_to_the_next_one() {
    let s = Script::new();
    let (hub, _) = hub(vec![s.server("cr", &[], 10_000)]).await;
    // The server answers, then exits: the next call, sent before its exit is seen, was
    // never read, so it is sent again to a new child.
    for i in 0..5 {
        assert_eq!(text(&call(&hub, "cr_crash", json!({})).await), "crashing");
        let a = call(&hub, "cr_echo", json!({ "message": i })).await;
        assert_eq!(text(&a), format!("echo: {i}"));
    }
}
