//! `--tools-root`: every way out of the root we know is tried and refused (`..`, absolute
//! paths, `~`, symbolic links to files and to directories, links to nowhere, directories made
//! through a link, `x-tool-cwd`, `x-tool-runtime`, glob and include patterns, searches of a
//! path outside), and everything inside still works.

mod common;
mod tools_common;

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use common::{Env, TestServer};
use serde_json::json;
use tools_common::{call, fails, ok, text};

/// A root with a file, a secret beside it, and links that lead out.
fn root_tree(dir: &Path) -> PathBuf {
    let root = dir.join("root");
    std::fs::create_dir_all(root.join("sub")).unwrap();
    std::fs::write(root.join("sub/in.txt"), "inside\n").unwrap();
    std::fs::create_dir_all(dir.join("outside")).unwrap();
    std::fs::write(dir.join("outside/secret.txt"), "secret\n").unwrap();
    symlink(dir.join("outside/secret.txt"), root.join("file-link")).unwrap();
    symlink(dir.join("outside"), root.join("dir-link")).unwrap();
    symlink(dir.join("outside/made-by-link.txt"), root.join("dangling")).unwrap();
    symlink(root.join("sub/in.txt"), root.join("inner-link")).unwrap();
    root
}

/// A server confined to a fresh [`root_tree`]: the environment (kept alive), the root, the
/// folder beside it and the server.
async fn confined() -> (Env, PathBuf, PathBuf, TestServer) {
    let env = Env::new();
    let root = root_tree(env.dir.path());
    let outside = env.dir.path().join("outside");
    let srv = env
        .start(&["--tools", "all", "--tools-root", root.to_str().unwrap()])
        .await;
    (env, root, outside, srv)
}

#[tokio::test]
async fn reads_and_writes_outside_the_root_are_refused() {
    let (_env, _root, outside, srv) = confined().await;
    let secret = outside.join("secret.txt");
    let secret = secret.to_str().unwrap();
    for path in [
        "../outside/secret.txt",
        "sub/../../outside/secret.txt",
        secret,
        "file-link",
        "dir-link/secret.txt",
        "~/x",
    ] {
        let e = fails(&srv, "read_file", json!({"path": path}), &[]).await;
        assert!(
            e.contains("outside the tools root") || e.contains("No such file"),
            "{path}: {e}"
        );
        assert!(!e.contains("secret\n"));
    }
    for path in [
        "dangling",
        "dir-link/new.txt",
        "dir-link/deeper/new.txt",
        "../outside/new.txt",
        "file-link",
    ] {
        let e = fails(
            &srv,
            "write_file",
            json!({"path": path, "content": "pwned"}),
            &[],
        )
        .await;
        assert!(!e.is_empty(), "{path}");
    }
    let e = fails(
        &srv,
        "edit_file",
        json!({"path": "file-link", "edits": [{"old_text": "secret", "new_text": "x"}]}),
        &[],
    )
    .await;
    assert!(e.contains("outside the tools root"), "{e}");
    let left: Vec<_> = std::fs::read_dir(&outside)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        left,
        ["secret.txt"],
        "something was written outside the root"
    );
    assert_eq!(
        std::fs::read_to_string(outside.join("secret.txt")).unwrap(),
        "secret\n"
    );
    srv.stop().await;
}

#[tokio::test]
async fn headers_and_searches_stay_inside_the_root() {
    let (_env, _root, outside, srv) = confined().await;
    let secret = outside.join("secret.txt");
    let secret = secret.to_str().unwrap();
    // The header's directory is checked as a path is.
    for cwd in [outside.to_str().unwrap(), "dir-link", "../outside"] {
        let (status, body) = call(
            &srv.url,
            "read_file",
            json!({"path": "secret.txt"}),
            &[("x-tool-cwd", cwd)],
        )
        .await;
        assert_eq!(status, 403, "{cwd}: {body}");
    }
    let (status, _) = call(
        &srv.url,
        "get_info",
        json!({}),
        &[("x-tool-runtime", "ssh:host")],
    )
    .await;
    assert_eq!(status, 403);
    // Searches walk only the root, follow no link, and patterns only filter.
    for include in [
        "../*",
        "../outside/*",
        "**/secret.txt",
        "/../outside/secret.txt",
    ] {
        let g = ok(
            &srv,
            "file_glob_search",
            json!({"path": ".", "include": include, "type": "all"}),
            &[],
        )
        .await;
        assert!(!text(&g).contains("secret"), "{include}: {}", text(&g));
        let s = ok(
            &srv,
            "grep_search",
            json!({"path": ".", "pattern": "secret", "include": include}),
            &[],
        )
        .await;
        assert!(
            text(&s).contains("Total matches: 0"),
            "{include}: {}",
            text(&s)
        );
    }
    let s = ok(
        &srv,
        "grep_search",
        json!({"path": ".", "pattern": "secret|inside"}),
        &[],
    )
    .await;
    assert!(text(&s).contains("Total matches: 2"), "{}", text(&s));
    assert!(text(&s).contains("inner-link:inside"), "{}", text(&s));
    for path in ["dir-link", "..", secret] {
        let e = fails(
            &srv,
            "grep_search",
            json!({"path": path, "pattern": "secret"}),
            &[],
        )
        .await;
        assert!(!e.contains("secret\n"), "{path}: {e}");
        let e = fails(&srv, "file_glob_search", json!({"path": path}), &[]).await;
        assert!(!e.is_empty(), "{path}");
    }
    srv.stop().await;
}

#[tokio::test]
async fn everything_inside_the_root_works() {
    let (_env, root, _outside, srv) = confined().await;
    // Inside, everything works, from the root or the header's directory.
    let r = ok(
        &srv,
        "read_file",
        json!({"path": "in.txt"}),
        &[("x-tool-cwd", "sub")],
    )
    .await;
    assert_eq!(text(&r), "inside\n");
    let r = ok(&srv, "read_file", json!({"path": "inner-link"}), &[]).await;
    assert_eq!(text(&r), "inside\n");
    ok(
        &srv,
        "write_file",
        json!({"path": "new/dir/f.txt", "content": "ok"}),
        &[],
    )
    .await;
    assert_eq!(
        std::fs::read_to_string(root.join("new/dir/f.txt")).unwrap(),
        "ok"
    );
    let info = ok(&srv, "get_info", json!({}), &[]).await;
    assert_eq!(
        info["cwd"],
        std::fs::canonicalize(&root).unwrap().to_str().unwrap()
    );
    srv.stop().await;
}
