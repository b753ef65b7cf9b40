//! Each check of `tidy` fed small synthetic inputs: one that must fail, one that must pass.

use super::deps::dependency_line;
use super::*;

fn source(path: &str, text: &str) -> Source {
    Source::parse(path, text).unwrap_or_else(|v| panic!("{v}"))
}

fn unsafe_violations(path: &str, text: &str) -> Vec<Violation> {
    check_sources(&[source(path, &format!("//! doc\n{text}"))], &[])
}

fn library_violations(path: &str, text: &str) -> Vec<Violation> {
    check_library_code(&source(path, text))
}

#[test]
fn unsafe_outside_the_fence_is_reported_with_its_line() {
    let text = "fn f() {\n    let x = 1;\n    unsafe { g(x) }\n}\n";
    let found = unsafe_violations("kvstore/src/store.rs", text);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].path, "kvstore/src/store.rs");
    assert_eq!(found[0].line, 4);
    assert!(found[0].what.contains("outside the fenced modules"));
    // Also unsafe fn, impl and blocks inside macro arguments.
    let text = "unsafe fn a() {}\nunsafe impl Send for X {}\nfn b() { vec![unsafe { c() }]; }\n";
    let lines: Vec<usize> = unsafe_violations("engine/src/model.rs", text)
        .iter()
        .map(|v| v.line)
        .collect();
    assert_eq!(lines, [2, 3, 4]);
}

#[test]
fn unsafe_in_comments_strings_and_lint_names_is_not_unsafe() {
    let text = r####"#![forbid(unsafe_code)]
/// This is not unsafe.
// unsafe { nothing }
/* unsafe */
fn f() -> (&'static str, &'static str, char) {
    ("unsafe { x }", r#"unsafe"#, 'u')
}
"####;
    assert_eq!(unsafe_violations("kvstore/src/lib.rs", text), []);
}

#[test]
fn fenced_modules_may_hold_unsafe() {
    let text = "fn f() { unsafe { g() } }\n";
    for path in [
        "ggml-sys/src/lib.rs",
        "ggml-sys/tests/graph.rs",
        "engine/src/ggml.rs",
        "engine/src/ggml/context.rs",
        "ckptfmt/src/mmap.rs",
    ] {
        assert_eq!(unsafe_violations(path, text), [], "{path}");
    }
    // Not a prefix match on file names: `ggml_util.rs` is not `ggml.rs`.
    assert_eq!(unsafe_violations("engine/src/ggml_util.rs", text).len(), 1);
}

#[test]
fn the_gguf_reader_holds_no_unsafe_not_even_a_map() {
    // The reader maps the model with memmap2's safe raw map; an `unsafe` map there (a
    // reference into a file another process may change) is a violation like any other.
    let map = "fn open(file: &File) { let m = unsafe { Mmap::map(file) }; }\n";
    for path in ["engine/src/gguf.rs", "engine/src/gguf/mod.rs"] {
        let found = unsafe_violations(path, map);
        assert_eq!(found.len(), 1, "{path}: {found:?}");
        assert!(found[0].what.contains("outside the fenced modules"));
    }
}

#[test]
fn callers_of_fenced_unsafe_fns_may_only_call_them() {
    let calls =
        "fn f() {\n    let a = unsafe { store.map_block(&BlockId([1; 32])) }.unwrap();\n    \
                 let b = unsafe { Export::map(&path) };\n}\n";
    for path in [
        "ckptfmt/tests/store_behaviour.rs",
        "ckptfmt/benches/ckptfmt.rs",
    ] {
        assert_eq!(unsafe_violations(path, calls), [], "{path}");
    }
    // Anything else unsafe in those files is reported: another function, a second statement,
    // unsafe hidden in the arguments, an unsafe fn or impl of their own.
    let text = "fn f() {\n    unsafe { std::ptr::read(p) };\n    \
                unsafe { store.map_block(id); other() };\n    \
                unsafe { store.map_block(unsafe { g() }) };\n}\n\
                unsafe fn map() {}\nunsafe impl Send for X {}\n";
    let mut found = unsafe_violations("ckptfmt/tests/store_behaviour.rs", text);
    found.sort();
    let lines: Vec<usize> = found.iter().map(|v| v.line).collect();
    assert_eq!(lines, [3, 4, 5, 5, 7, 8], "{found:?}");
    assert!(found[0].what.contains("map_block"));
    // Other tests of the crate get no such waiver.
    assert_eq!(unsafe_violations("ckptfmt/tests/other.rs", calls).len(), 2);
}

#[test]
fn printing_and_unwrap_in_library_code_are_reported() {
    let text = "//! doc\nfn f(x: Option<u8>) -> u8 {\n    println!(\"hi\");\n    dbg!(x);\n    \
                    eprint!(\"{}\", x.unwrap());\n    x.unwrap()\n}\n";
    let found = library_violations("engine/src/session.rs", text);
    let mut got: Vec<(usize, bool)> = found
        .iter()
        .map(|v| (v.line, v.what.contains("unwrap")))
        .collect();
    got.sort();
    assert_eq!(
        got,
        [(3, false), (4, false), (5, false), (5, true), (6, true)]
    );
}

#[test]
fn test_code_and_lookalikes_are_not_library_code() {
    let text = r#"//! doc
fn f(x: Option<u8>) -> u8 {
    let s = "println!(); x.unwrap()"; // println!("{}", x.unwrap())
    x.unwrap_or(0).max(x.expect("checked above"))
}
#[cfg(test)]
mod tests {
    fn g() { println!("{}", Some(1).unwrap()); }
}
impl X {
    #[test]
    fn t() { Some(1).unwrap(); }
}
#[cfg(all(unix, test))]
fn h() { dbg!(1); }
"#;
    assert_eq!(library_violations("engine/src/session.rs", text), []);
    // Only src/ of library crates, outside src/bin/, is library code.
    let libs = ["engine", "kvstore", "ggml-sys"];
    assert!(is_library_code("engine/src/session.rs", &libs));
    assert!(is_library_code("kvstore/src/store/gc.rs", &libs));
    assert!(!is_library_code("engine/tests/model_tiny.rs", &libs));
    assert!(!is_library_code("engine/src/bin/tool.rs", &libs));
    assert!(!is_library_code("ckptfmt/src/store.rs", &libs));
    assert!(!is_library_code("src/lib.rs", &libs));
}

#[test]
fn not_test_only_cfgs_stay_library_code() {
    let text = "#[cfg(not(test))]\nfn f() { Some(1).unwrap(); }\n\
                    #[cfg(any(test, feature = \"x\"))]\nfn g() { Some(1).unwrap(); }\n";
    assert_eq!(library_violations("engine/src/a.rs", text).len(), 2);
}

#[test]
fn long_files_are_reported_unless_generated() {
    let ok = format!("//! doc\n{}", "const A: u8 = 0;\n".repeat(MAX_LINES - 1));
    let long = format!("{ok}const B: u8 = 0;\n");
    assert_eq!(check_length(&source("engine/src/a.rs", &ok)), None);
    let found = check_length(&source("engine/src/a.rs", &long)).map(|v| v.to_string());
    assert_eq!(
        found.as_deref(),
        Some("engine/src/a.rs:801: 801 lines, over the limit of 800: split it along its seams")
    );
    assert_eq!(
        check_length(&source("ggml-sys/src/bindings_cuda.rs", &long)),
        None
    );
    assert!(check_length(&source("ggml-sys/src/lib.rs", &long)).is_some());
}

/// A function `name` of `body_lines` lines between its `fn` line and its closing brace.
fn function(name: &str, body_lines: usize) -> String {
    format!(
        "fn {name}() {{\n{}}}\n",
        "    let _ = 0;\n".repeat(body_lines)
    )
}

#[test]
fn long_functions_are_reported_from_fn_line_to_closing_brace() {
    use super::fn_length::{long_fns, MAX_FN_LINES};
    // 148 body lines + `fn` line + `}` = 150: at the limit. One more is over it.
    let at_limit = function("fits", MAX_FN_LINES - 2);
    let over = function("long", MAX_FN_LINES - 1);
    let text = format!("//! doc\n{at_limit}\n/// Doc.\n#[inline]\n{over}");
    let found: Vec<String> = long_fns(&source("engine/src/a.rs", &text), &[])
        .iter()
        .map(ToString::to_string)
        .collect();
    let line = 2 + MAX_FN_LINES + 3; // `fn long` follows the doc comment and attribute.
    assert_eq!(
        found,
        [format!(
            "engine/src/a.rs:{line}: fn `long` is 151 lines, over the limit of 150: split it into steps"
        )]
    );
    // Methods, trait defaults and functions nested in a function count too; a bodiless trait
    // fn does not, nor a long closure or table that is not a function.
    let body = "    let _ = 0;\n".repeat(MAX_FN_LINES);
    let text = format!(
        "impl X {{\n    fn method(&self) {{\n{body}    }}\n}}\n\
         trait T {{\n    fn required(&self);\n    fn provided(&self) {{\n{body}    }}\n}}\n\
         fn outer() {{\n    fn inner() {{\n{body}    }}\n}}\n\
         const TABLE: &[u8] = &[\n{}];\n",
        "    0,\n".repeat(MAX_FN_LINES * 2)
    );
    let names: Vec<String> = long_fns(&source("kvstore/src/b.rs", &text), &[])
        .iter()
        .map(|v| v.what.split('`').nth(1).unwrap_or_default().to_string())
        .collect();
    assert_eq!(names, ["method", "provided", "outer", "inner"]);
    // Generated bindings are exempt, as from the file length limit.
    assert_eq!(
        long_fns(&source("ggml-sys/src/bindings.rs", &over), &[]),
        []
    );
}

#[test]
fn the_allow_list_exempts_by_file_and_name_and_must_not_go_stale() {
    use super::fn_length::{long_fns, stale_allowances, MAX_FN_LINES};
    let over = source("engine/src/table.rs", &function("table", MAX_FN_LINES));
    let allowed = [("engine/src/table.rs", "table", "a data table")];
    assert_eq!(long_fns(&over, &allowed), []);
    // The same name in another file, or another name in the file, is not exempt.
    let elsewhere = source("engine/src/other.rs", &function("table", MAX_FN_LINES));
    assert_eq!(long_fns(&elsewhere, &allowed).len(), 1);
    assert_eq!(
        long_fns(&over, &[("engine/src/table.rs", "rows", "to split")]).len(),
        1
    );
    // An entry whose function is gone or now short is itself a violation.
    assert_eq!(stale_allowances(&[over], &allowed), []);
    let split = source("engine/src/table.rs", &function("table", 10));
    let stale = stale_allowances(&[split], &allowed);
    assert_eq!(stale.len(), 1, "{stale:?}");
    assert!(stale[0].what.contains("remove the entry"), "{stale:?}");
}

#[test]
fn glob_matches_whole_paths() {
    assert!(glob_match(
        "ggml-sys/src/bindings*.rs",
        "ggml-sys/src/bindings.rs"
    ));
    assert!(glob_match(
        "ggml-sys/src/bindings*.rs",
        "ggml-sys/src/bindings_metal.rs"
    ));
    assert!(!glob_match(
        "ggml-sys/src/bindings*.rs",
        "ggml-sys/src/bindings.rs.bak"
    ));
    assert!(!glob_match(
        "ggml-sys/src/bindings*.rs",
        "x/ggml-sys/src/bindings.rs"
    ));
    assert!(glob_match("a.rs", "a.rs"));
    assert!(!glob_match("a.rs", "a.rsx"));
}

#[test]
fn every_file_needs_a_module_doc_unless_included() {
    let missing = source("engine/src/a.rs", "\n// A plain comment.\nfn f() {}\n");
    let found = check_module_doc(&missing);
    assert_eq!(found.map(|v| v.line), Some(2));
    assert_eq!(
        check_module_doc(&source("engine/src/a.rs", "//! Doc.\nfn f() {}\n")),
        None
    );
    // `include!`d files cannot carry an inner doc; the including file's path resolves them.
    let files = [
        source(
            "ggml-sys/src/lib.rs",
            "//! Doc.\nmod s { include!(\"source.rs\"); }\n",
        ),
        source(
            "ggml-sys/src/source.rs",
            "// Constants.\nconst A: u8 = 1;\n",
        ),
        source(
            "xtask/src/main.rs",
            "//! Doc.\nmod f { include!(\"../../ggml-sys/fetch.rs\"); }\n",
        ),
        source("ggml-sys/fetch.rs", "// Fetching.\nfn f() {}\n"),
        source("ggml-sys/build.rs", "// Build script.\nfn main() {}\n"),
    ];
    let found = check_sources(&files, &[]);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].path, "ggml-sys/build.rs");
}

#[test]
fn allowing_missing_docs_in_a_library_is_reported() {
    let text = "//! Doc.\n#![allow(dead_code, missing_docs)]\n\
                    #[cfg_attr(feature = \"x\", expect(missing_docs))]\npub fn f() {}\n";
    let found = check_missing_docs_allowed(&source("engine/src/lib.rs", text));
    let lines: Vec<usize> = found.iter().map(|v| v.line).collect();
    assert_eq!(lines, [2, 3]);
    // The raw bindings crate is the declared exception; other lints are fine everywhere.
    assert_eq!(
        check_missing_docs_allowed(&source("ggml-sys/src/lib.rs", text)),
        []
    );
    let fine = "//! Doc.\n#![allow(dead_code)]\n#![warn(missing_docs)]\n";
    assert_eq!(
        check_missing_docs_allowed(&source("engine/src/lib.rs", fine)),
        []
    );
}

#[test]
fn library_manifests_must_inherit_the_workspace_lints() {
    let with = "[package]\nname = \"x\"\n\n[lints]\nworkspace = true\n";
    assert_eq!(check_lints_inherited("x/Cargo.toml", with), None);
    assert_eq!(
        check_lints_inherited("x/Cargo.toml", "[package]\nlints.workspace = true\n"),
        None
    );
    let without = "[package]\nname = \"x\"\n\n[dependencies]\nworkspace = true\n";
    assert!(check_lints_inherited("x/Cargo.toml", without).is_some());
    let own = "[lints.rust]\nmissing_docs = \"allow\"\n";
    assert!(check_lints_inherited("x/Cargo.toml", own).is_some());
}

/// A dependency in a fake manifest: (name, kind, taken by path from the workspace).
type Dep<'a> = (&'a str, Option<&'a str>, bool);

/// `cargo metadata --no-deps` output for crates named `(name, dependencies)`.
fn metadata(crates: &[(&str, &[Dep])]) -> Value {
    let packages: Vec<Value> = crates
        .iter()
        .map(|(name, deps)| {
            let dir = if *name == "llama-hdd" {
                "/ws".to_string()
            } else {
                format!("/ws/{name}")
            };
            let deps: Vec<Value> = deps
                .iter()
                .map(|(dep, kind, ours)| {
                    serde_json::json!({
                        "name": dep,
                        "kind": kind,
                        "source": if *ours { Value::Null } else {
                            Value::from("registry+https://example.invalid/index")
                        },
                    })
                })
                .collect();
            serde_json::json!({
                "name": name,
                "id": format!("path+file://{dir}#0.1.0"),
                "manifest_path": format!("{dir}/Cargo.toml"),
                "dependencies": deps,
            })
        })
        .collect();
    let ids: Vec<Value> = packages.iter().map(|p| p["id"].clone()).collect();
    serde_json::json!({ "packages": packages, "workspace_members": ids, "workspace_root": "/ws" })
}

fn no_manifest(_: &str) -> Option<String> {
    None
}

#[test]
fn the_real_dependency_graph_passes() {
    let m = metadata(&[
        ("ckptfmt", &[("thiserror", None, false)]),
        ("kvstore", &[("ckptfmt", None, true)]),
        (
            "engine",
            &[
                ("ggml-sys", None, true),
                ("ckptfmt", None, true),
                ("kvstore", Some("dev"), true),
            ],
        ),
        ("ggml-sys", &[]),
        ("server", &[("engine", None, true), ("kvstore", None, true)]),
        (
            "llama-hdd",
            &[("engine", None, true), ("server", Some("dev"), true)],
        ),
        ("xtask", &[("engine", None, true)]),
    ]);
    assert_eq!(check_dependencies(&m, &no_manifest), []);
    let dirs: Vec<String> = workspace_crates(&m).into_iter().map(|(d, _)| d).collect();
    assert_eq!(
        dirs,
        ["ckptfmt", "kvstore", "engine", "ggml-sys", "server", "", "xtask"]
    );
}

#[test]
fn upward_dependencies_are_reported_at_their_manifest_line() {
    let m = metadata(&[
        ("ckptfmt", &[("kvstore", Some("dev"), true)]),
        (
            "kvstore",
            &[("ckptfmt", None, true), ("engine", None, true)],
        ),
        ("engine", &[("ckptfmt", Some("build"), true)]),
    ]);
    let read = |path: &str| {
        (path == "kvstore/Cargo.toml").then(|| {
            "[package]\nname = \"kvstore\"\n\n[dependencies]\nckptfmt.workspace = true\n\
                 engine = { path = \"../engine\" }\n"
                .to_string()
        })
    };
    let found: Vec<String> = check_dependencies(&m, &read)
        .iter()
        .map(Violation::to_string)
        .collect();
    assert_eq!(
        found,
        [
            "ckptfmt/Cargo.toml:1: `ckptfmt` has `kvstore` as a dev-dependency, which points \
                 upward; it may use only: none of the workspace crates",
            "kvstore/Cargo.toml:6: `kvstore` has `engine` as a dependency, which points \
                 upward; it may use only: ckptfmt",
        ]
    );
}

#[test]
fn a_registry_crate_with_a_workspace_name_is_not_ours() {
    let m = metadata(&[("ckptfmt", &[("engine", None, false)]), ("engine", &[])]);
    assert_eq!(check_dependencies(&m, &no_manifest), []);
}

#[test]
fn an_undeclared_workspace_crate_fails() {
    let m = metadata(&[("ckptfmt", &[]), ("gui", &[("ckptfmt", None, true)])]);
    let found = check_dependencies(&m, &no_manifest);
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].path, "gui/Cargo.toml");
    assert!(found[0].what.contains("`gui` is not declared"));
}

#[test]
fn dependency_lines_are_found_in_any_manifest_spelling() {
    let text = "[dependencies]\nengine-extra = \"1\"\nengine.workspace = true\n\
                    [dev-dependencies.kvstore]\npath = \"../kvstore\"\n\
                    store = { package = \"ckptfmt\", path = \"../ckptfmt\" }\n";
    assert_eq!(dependency_line(text, "engine"), 3);
    assert_eq!(dependency_line(text, "kvstore"), 4);
    assert_eq!(dependency_line(text, "ckptfmt"), 6);
    assert_eq!(dependency_line(text, "server"), 1);
}
