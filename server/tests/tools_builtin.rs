//! The built-in agent tools at `/tools` (`--tools`): each tool's answers, the stream of
//! `exec_shell_command` and the limits that kill its process group (time, a client gone, the
//! server stopping), the runtime header's refusals, a container runtime through a stand-in
//! engine, CORS limited to localhost, and router mode. `tools_root.rs` tries the ways out of
//! `--tools-root`.

mod common;
mod tools_common;

use std::time::{Duration, Instant};

use common::{ended, Env};
use serde_json::{json, Value};
use tools_common::{call, fails, ok, read_pid, spawn, text, wait_until};

#[tokio::test]
async fn tools_off_answer_403() {
    let env = Env::new();
    let srv = env.start(&[]).await;
    let (status, _) = srv.get("/tools").await;
    assert_eq!(status, 403);
    let (status, _) = call(&srv.url, "get_info", json!({}), &[]).await;
    assert_eq!(status, 403);
    srv.stop().await;
}

#[tokio::test]
async fn the_list_names_the_enabled_tools_and_unknown_ones_are_refused() {
    let env = Env::new();
    let srv = env.start(&["--tools", "get_info,read_file"]).await;
    let (status, list) = srv.get("/tools").await;
    assert_eq!(status, 200);
    let names: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["tool"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["read_file", "get_info"]);
    let read = &list[0];
    assert_eq!(read["type"], "server");
    assert_eq!(read["permissions"]["write"], false);
    assert_eq!(read["definition"]["function"]["name"], "read_file");
    assert_eq!(
        read["definition"]["function"]["parameters"]["required"],
        json!(["path"])
    );
    let (status, body) = call(
        &srv.url,
        "write_file",
        json!({"path": "x", "content": ""}),
        &[],
    )
    .await;
    assert_eq!(status, 404, "{body}");
    assert!(body.to_string().contains("unknown tool"), "{body}");
    let (status, body) = call(&srv.url, "read_file", json!({}), &[]).await;
    assert_eq!(status, 400, "{body}");
    let info = ok(&srv, "get_info", json!({}), &[]).await;
    assert!(info["os"].as_str().unwrap().contains("Linux"), "{info}");
    srv.stop().await;

    let argv = [
        "llama-hdd-server",
        "-m",
        "x.gguf",
        "--tools",
        "read_file,rm_rf",
    ];
    let config = server::Args::parse_from_argv(argv)
        .unwrap()
        .check()
        .unwrap();
    let err = server::tools::Tools::start(&config.args.tools)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("unknown tool \"rm_rf\""), "{err}");
}

#[tokio::test]
async fn files_are_written_read_and_edited_from_the_header_cwd() {
    let env = Env::new();
    let srv = env.start(&["--tools", "all"]).await;
    let work = env.dir.path().join("work");
    std::fs::create_dir(&work).unwrap();
    let cwd = work.to_str().unwrap();
    let h = [("x-tool-cwd", cwd)];
    let w = ok(
        &srv,
        "write_file",
        json!({"path": "sub/t.log", "content": "line1\nline2\nline3\n", "cwd": "/nonexistent"}),
        &h,
    )
    .await;
    assert_eq!(w["result"], "file written successfully");
    assert_eq!(
        std::fs::read_to_string(work.join("sub/t.log")).unwrap(),
        "line1\nline2\nline3\n"
    );
    let r = ok(
        &srv,
        "read_file",
        json!({"path": "sub/t.log", "start_line": 2, "end_line": 3, "append_loc": true}),
        &h,
    )
    .await;
    assert_eq!(text(&r), "2\u{2192}line2\n3\u{2192}line3\n");
    let e = ok(
        &srv,
        "edit_file",
        json!({"path": "sub/t.log", "edits": [
            {"old_text": "line2", "new_text": "line2-edited"},
            {"old_text": "line3\n", "new_text": "line3\nline4\n"},
        ]}),
        &h,
    )
    .await;
    assert_eq!(e["edits_applied"], 2);
    let abs = work.join("sub/t.log");
    let r = ok(
        &srv,
        "read_file",
        json!({"path": abs.to_str().unwrap()}),
        &[],
    )
    .await;
    assert_eq!(text(&r), "line1\nline2-edited\nline3\nline4\n");
    let b = ok(
        &srv,
        "read_file",
        json!({"path": "sub/t.log"}),
        &[("x-tool-cwd", cwd), ("x-resp-type", "base64")],
    )
    .await;
    assert_eq!(b["size_bytes"], 31);
    let dup = fails(
        &srv,
        "edit_file",
        json!({"path": "sub/t.log", "edits": [{"old_text": "line", "new_text": "x"}]}),
        &h,
    )
    .await;
    assert!(dup.contains("unique"), "{dup}");
    let overlap = fails(&srv, "edit_file", json!({"path": "sub/t.log", "edits": [
        {"old_text": "line1\nline2", "new_text": "a"}, {"old_text": "line2-edited", "new_text": "b"}]}), &h).await;
    assert!(overlap.contains("overlap"), "{overlap}");
    std::fs::write(work.join("big.txt"), "x\n".repeat(20_000)).unwrap();
    let big = fails(&srv, "read_file", json!({"path": "big.txt"}), &h).await;
    assert!(big.contains("file too large"), "{big}");
    let part = ok(
        &srv,
        "read_file",
        json!({"path": "big.txt", "start_line": 19_999, "end_line": 30_000}),
        &h,
    )
    .await;
    assert_eq!(text(&part), "x\nx\n");
    srv.stop().await;
}

#[tokio::test]
async fn searches_honour_type_depth_limit_junk_and_patterns() {
    let env = Env::new();
    let srv = env.start(&["--tools", "all"]).await;
    let d = env.dir.path().join("tree");
    std::fs::create_dir_all(d.join("a/b/c")).unwrap();
    std::fs::create_dir_all(d.join("build/nested")).unwrap();
    std::fs::write(d.join("top.txt"), "needle here\n").unwrap();
    std::fs::write(d.join("a/mid.txt"), "no\nNEEDLE\n").unwrap();
    std::fs::write(d.join("a/b/deep.rs"), "needle\n").unwrap();
    std::fs::write(d.join("build/artifact.txt"), "needle\n").unwrap();
    let base = d.to_str().unwrap();
    let one = ok(
        &srv,
        "file_glob_search",
        json!({"path": base, "max_depth": 1}),
        &[],
    )
    .await;
    assert!(text(&one).contains("top.txt") && !text(&one).contains("mid.txt"));
    let all = ok(
        &srv,
        "file_glob_search",
        json!({"path": base, "type": "all"}),
        &[],
    )
    .await;
    let paths: Vec<&str> = all["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["path"].as_str().unwrap())
        .collect();
    assert!(
        paths.contains(&"a/b/deep.rs") && paths.contains(&"build"),
        "{paths:?}"
    );
    assert!(!paths.iter().any(|p| p.starts_with("build/")), "{paths:?}");
    let dirs = ok(
        &srv,
        "file_glob_search",
        json!({"path": base, "type": "dir"}),
        &[],
    )
    .await;
    assert!(text(&dirs).contains("a/b/\n"), "{}", text(&dirs));
    let limited = ok(
        &srv,
        "file_glob_search",
        json!({"path": base, "limit": 1}),
        &[],
    )
    .await;
    assert_eq!(limited["entries"].as_array().unwrap().len(), 1);
    assert!(
        text(&limited).contains("Total matches: 3"),
        "{}",
        text(&limited)
    );
    let rs = ok(
        &srv,
        "file_glob_search",
        json!({"path": base, "include": "b/*.rs"}),
        &[],
    )
    .await;
    assert!(text(&rs).contains("Total matches: 1"), "{}", text(&rs));
    let bad = fails(
        &srv,
        "file_glob_search",
        json!({"path": base, "type": "bogus"}),
        &[],
    )
    .await;
    assert!(bad.contains("invalid type"), "{bad}");
    let g = ok(&srv, "grep_search", json!({"path": base, "pattern": "needle", "ignore_case": true, "return_line_numbers": true}), &[]).await;
    assert!(text(&g).contains("a/mid.txt:2:NEEDLE"), "{}", text(&g));
    assert!(text(&g).contains("Total matches: 3"), "{}", text(&g));
    let only = ok(
        &srv,
        "grep_search",
        json!({"path": base, "pattern": "needle", "include": "*.rs"}),
        &[],
    )
    .await;
    assert!(text(&only).contains("Total matches: 1"), "{}", text(&only));
    let lit = ok(
        &srv,
        "grep_search",
        json!({"path": base, "pattern": "e.e", "literal": true}),
        &[],
    )
    .await;
    assert!(text(&lit).contains("Total matches: 0"), "{}", text(&lit));
    let re = fails(
        &srv,
        "grep_search",
        json!({"path": base, "pattern": "("}),
        &[],
    )
    .await;
    assert!(re.contains("invalid regex"), "{re}");
    srv.stop().await;
}

#[tokio::test]
async fn exec_streams_its_output_then_the_exit_code() {
    let env = Env::new();
    let srv = env
        .start(&["--tools", "exec_shell_command,read_file"])
        .await;
    let body = json!({"tool": "exec_shell_command", "params": {"command": "echo hello; echo oops >&2; exit 4"}, "stream": true});
    let (status, ctype, events) = srv.post_stream("/tools", &body).await;
    assert_eq!(status, 200);
    assert!(ctype.starts_with("text/event-stream"), "{ctype}");
    let events: Vec<Value> = events
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    let (last, chunks) = events.split_last().unwrap();
    assert_eq!(*last, json!({"done": true}));
    let out: String = chunks
        .iter()
        .map(|c| c["chunk"].as_str().unwrap())
        .collect();
    assert_eq!(out, "hello\noops\n\n[exit code: 4]");
    let (status, _) = srv
        .post(
            "/tools",
            &json!({"tool": "read_file", "params": {"path": "x"}, "stream": true}),
        )
        .await;
    assert_eq!(status, 404);
    let plain = ok(
        &srv,
        "exec_shell_command",
        json!({"command": "head -c 100000 /dev/zero | tr '\\0' a", "max_output_size": 50}),
        &[],
    )
    .await;
    assert_eq!(
        text(&plain),
        format!("{}\n[output truncated]\n[exit code: 0]", "a".repeat(50))
    );
    srv.stop().await;
}

#[tokio::test]
async fn the_time_limit_kills_the_whole_group() {
    let env = Env::new();
    let srv = env.start(&["--tools", "exec_shell_command"]).await;
    let pidfile = env.dir.path().join("bg.pid");
    let cmd = format!("sleep 60 & echo $! > {}; wait", pidfile.display());
    let t = Instant::now();
    let r = ok(
        &srv,
        "exec_shell_command",
        json!({"command": cmd, "timeout": 1}),
        &[],
    )
    .await;
    assert!(
        text(&r).ends_with("[exit due to timed out]"),
        "{}",
        text(&r)
    );
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    let pid = read_pid(&pidfile).unwrap();
    assert!(
        wait_until(Duration::from_secs(10), || ended(pid)).await,
        "the background sleep lives on"
    );
    srv.stop().await;
}

#[tokio::test]
async fn a_client_gone_kills_its_command() {
    let env = Env::new();
    let srv = env.start(&["--tools", "exec_shell_command"]).await;
    let pidfile = env.dir.path().join("sleep.pid");
    let cmd = format!(
        "echo started; echo $$ > {}; exec sleep 60",
        pidfile.display()
    );
    let mut resp = srv
        .client
        .post(format!("{}/tools", srv.url))
        .json(&json!({"tool": "exec_shell_command", "params": {"command": cmd, "timeout": 60}, "stream": true}))
        .send()
        .await
        .unwrap();
    let first = resp.chunk().await.unwrap().unwrap();
    assert!(String::from_utf8_lossy(&first).contains("started"));
    let pidfile2 = pidfile.clone();
    assert!(wait_until(Duration::from_secs(10), || read_pid(&pidfile2).is_some()).await);
    let pid = read_pid(&pidfile).unwrap();
    assert!(!ended(pid));
    drop(resp);
    assert!(
        wait_until(Duration::from_secs(10), || ended(pid)).await,
        "the command outlived its client"
    );
    srv.stop().await;
}

#[tokio::test]
async fn runtime_headers_that_could_be_options_are_refused() {
    let env = Env::new();
    let srv = env.start(&["--tools", "all"]).await;
    for (runtime, said) in [
        ("fake:does-not-exist", "unknown tool runtime"),
        ("ssh:-oProxyCommand=touch /tmp/pwned", "invalid ssh target"),
        ("docker-container:--privileged", "invalid container id"),
        ("podman-container:--privileged", "invalid container id"),
        ("docker:busybox", "must name a running container"),
    ] {
        let (status, body) = call(
            &srv.url,
            "exec_shell_command",
            json!({"command": "echo hi"}),
            &[("x-tool-runtime", runtime)],
        )
        .await;
        assert_eq!(status, 500, "{runtime}: {body}");
        assert!(body.to_string().contains(said), "{runtime}: {body}");
    }
    srv.stop().await;
}

#[tokio::test]
async fn cors_is_limited_to_localhost_when_tools_are_on() {
    let env = Env::new();
    let srv = env.start(&["--tools", "get_info"]).await;
    let preflight = |origin: &'static str| {
        srv.client
            .request(reqwest::Method::OPTIONS, format!("{}/completions", srv.url))
            .header("Origin", origin)
            .header("Access-Control-Request-Method", "POST")
            .send()
    };
    let local = preflight("http://localhost:8080").await.unwrap();
    assert_eq!(
        local.headers()["access-control-allow-origin"],
        "http://localhost:8080"
    );
    let evil = preflight("http://evil.com").await.unwrap();
    assert!(evil.headers().get("access-control-allow-origin").is_none());
    srv.stop().await;
    let srv = env
        .start(&["--tools", "get_info", "--cors-origins", "*"])
        .await;
    let resp = srv
        .client
        .request(reqwest::Method::OPTIONS, format!("{}/completions", srv.url))
        .header("Origin", "http://evil.com")
        .send()
        .await
        .unwrap();
    assert_eq!(
        resp.headers()["access-control-allow-origin"],
        "http://evil.com"
    );
    srv.stop().await;
}

#[tokio::test]
async fn a_container_runtime_runs_every_operation_through_its_engine() {
    let env = Env::new();
    // A stand-in `docker` that runs `docker exec [-i] ID CMD...` here, and logs each call.
    let bin = env.dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    let log = env.dir.path().join("engine.log");
    let script = format!(
        "#!/bin/sh\necho \"$*\" >> {}\n[ \"$1\" = exec ] || exit 99\nshift\n[ \"$1\" = -i ] && shift\n[ \"$1\" = box1 ] || exit 98\nshift\nexec \"$@\"\n",
        log.display()
    );
    std::fs::write(bin.join("docker"), script).unwrap();
    let mode = std::os::unix::fs::PermissionsExt::from_mode(0o755);
    std::fs::set_permissions(bin.join("docker"), mode).unwrap();
    let work = env.dir.path().join("inbox");
    std::fs::create_dir(&work).unwrap();
    let model = env.model.to_str().unwrap().to_owned();
    let cache = env.cache();
    let (_srv, url) = spawn(
        &[
            "-m",
            &model,
            "--cache-dir",
            cache.to_str().unwrap(),
            "--tools",
            "all",
        ],
        Some(&bin),
    );
    let h = [
        ("x-tool-runtime", "docker-container:box1"),
        ("x-tool-cwd", work.to_str().unwrap()),
    ];
    let (s, w) = call(
        &url,
        "write_file",
        json!({"path": "d/test.log", "content": "hello container\n"}),
        &h,
    )
    .await;
    assert_eq!(
        (s, &w["result"]),
        (200, &json!("file written successfully")),
        "{w}"
    );
    let (_, r) = call(&url, "read_file", json!({"path": "d/test.log"}), &h).await;
    assert_eq!(r["plain_text_response"], "hello container\n", "{r}");
    let (_, x) = call(
        &url,
        "exec_shell_command",
        json!({"command": "cat d/test.log"}),
        &h,
    )
    .await;
    assert!(
        x["plain_text_response"]
            .as_str()
            .unwrap()
            .contains("hello container"),
        "{x}"
    );
    let (_, g) = call(
        &url,
        "file_glob_search",
        json!({"path": ".", "type": "all"}),
        &h,
    )
    .await;
    assert_eq!(
        g["entries"],
        json!([{"path": "d", "type": "dir"}, {"path": "d/test.log", "type": "file"}]),
        "{g}"
    );
    let (_, e) = call(
        &url,
        "edit_file",
        json!({"path": "d/test.log", "edits": [{"old_text": "hello", "new_text": "bye"}]}),
        &h,
    )
    .await;
    assert_eq!(e["edits_applied"], 1, "{e}");
    assert_eq!(
        std::fs::read_to_string(work.join("d/test.log")).unwrap(),
        "bye container\n"
    );
    let calls = std::fs::read_to_string(&log).unwrap();
    assert!(calls.lines().all(|l| l.starts_with("exec ")), "{calls}");
    assert!(
        calls.contains("exec -i box1 sh -c cd \"$1\" || exit 127; shift; exec \"$@\" _ "),
        "{calls}"
    );
}

#[tokio::test]
async fn the_router_serves_tools_and_stops_at_once_with_a_command_running() {
    let env = Env::new();
    let models = env.dir.path().join("models");
    std::fs::create_dir(&models).unwrap();
    let (mut srv, url) = spawn(
        &["--models-dir", models.to_str().unwrap(), "--tools", "all"],
        None,
    );
    let resp = reqwest::get(format!("{url}/tools")).await.unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let list: Value = resp.json().await.unwrap();
    assert_eq!(list.as_array().unwrap().len(), 7, "{list}");
    let pidfile = env.dir.path().join("long.pid");
    let cmd = format!("echo $$ > {}; exec sleep 60", pidfile.display());
    let url2 = url.clone();
    let running = tokio::spawn(async move {
        call(
            &url2,
            "exec_shell_command",
            json!({"command": cmd, "timeout": 60}),
            &[],
        )
        .await
    });
    let pf = pidfile.clone();
    assert!(wait_until(Duration::from_secs(20), || read_pid(&pf).is_some()).await);
    let pid = read_pid(&pidfile).unwrap();
    let server_pid = rustix::process::Pid::from_raw(srv.0.id() as i32).unwrap();
    let t = Instant::now();
    rustix::process::kill_process(server_pid, rustix::process::Signal::TERM).unwrap();
    assert!(
        wait_until(Duration::from_secs(10), || srv
            .0
            .try_wait()
            .unwrap()
            .is_some())
        .await
    );
    assert!(
        t.elapsed() < Duration::from_secs(3),
        "stopping took {:?}",
        t.elapsed()
    );
    assert!(wait_until(Duration::from_secs(10), || ended(pid)).await);
    let _ = running.await;
}
