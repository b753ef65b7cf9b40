//! `cargo xtask tidy`: the promises of `ARCHITECTURE.md` that a reviewer would otherwise check by
//! hand, checked on every `.rs` file of the workspace.
//!
//! - `unsafe` appears only in the fenced places of [`UNSAFE_FENCE`];
//! - workspace crates depend only downward, as [`CRATES`] says (read from `cargo metadata`, so a
//!   new crate must be declared there);
//! - no file is longer than [`MAX_LINES`], generated bindings aside;
//! - no function is longer than [`fn_length::MAX_FN_LINES`], generated bindings and the
//!   allow-list [`fn_length::LONG_FNS_ALLOWED`] (data tables, functions still to split) aside;
//! - library crates inherit the workspace lints (`missing_docs`) and never `allow(missing_docs)`
//!   (save the waivers of [`MISSING_DOCS_ALLOWED`]);
//! - every file starts with a `//!` module doc, files pulled in by `include!` aside;
//! - library code (`src/` of a library crate, outside `src/bin/` and test-only items) neither
//!   prints (`println!`, `print!`, `eprintln!`, `eprint!`, `dbg!`) nor calls `.unwrap()`;
//! - `engine`'s public API names no type of our internal crates it does not re-export, and
//!   equals the committed listing (`crate::api`, also `cargo xtask api`).
//!
//! Files are lexed and parsed with `syn`, so comments, strings and character literals never count;
//! token patterns are matched inside macro arguments too. Each problem is printed as
//! `file:line: what`, and the command fails when there is any.

use std::collections::BTreeSet;
use std::fmt;
use std::path::Path;
use std::process::Command;

use proc_macro2::{Delimiter, TokenStream, TokenTree};
use serde_json::Value;

mod deps;
mod fn_length;
mod source;

use deps::{check_dependencies, check_lints_inherited, workspace_crates};
use fn_length::{check_fn_length, check_stale_allowances};
use source::{each_level, is_ident, is_punct, line_of, Source};

// ---------------------------------------------------------------------------------------------
// The rules, in one place.
// ---------------------------------------------------------------------------------------------

/// Every workspace crate: what kind of code it holds and which workspace crates it may use.
const CRATES: &[CrateRule] = &[
    CrateRule::library("ggml-sys", &[]),
    CrateRule::library("ckptfmt", &[]),
    CrateRule::library("kvstore", &["ckptfmt"]),
    CrateRule::library("engine", &["ggml-sys", "ckptfmt", "kvstore"]),
    // The server's prompt cache: policy on the engine's store, nothing below it.
    CrateRule::library("promptcache", &["engine"]),
    CrateRule::library("server", &["engine", "promptcache", "kvstore", "ckptfmt"]),
    // The root package (examples, benches) and the automation sit on top of everything.
    CrateRule::top("llama-hdd"),
    CrateRule::top("xtask"),
];

/// Where `unsafe` may appear (paths relative to the workspace root; a trailing `/` is a
/// directory). `UNSAFE.md` explains each place.
const UNSAFE_FENCE: &[(&str, Fence)] = &[
    ("ggml-sys/", Fence::Anywhere),
    ("engine/src/ggml.rs", Fence::Anywhere),
    ("engine/src/ggml/", Fence::Anywhere),
    ("ckptfmt/src/mmap.rs", Fence::Anywhere),
    // The `ckpt` tool's bench calls ckptfmt's `unsafe fn` maps (listed in `UNSAFE.md`).
    ("kvstore/src/bin/ckpt/bench.rs", Fence::Anywhere),
    // ckptfmt's own test and bench of the mapped read path: test-only callers of the fenced maps.
    (
        "ckptfmt/tests/store_behaviour.rs",
        Fence::CallsOnly(CKPTFMT_MAP_FNS),
    ),
    (
        "ckptfmt/benches/ckptfmt.rs",
        Fence::CallsOnly(CKPTFMT_MAP_FNS),
    ),
    // A test's counting global allocator (`unsafe impl GlobalAlloc` forwarding to `System`).
    ("engine/tests/gguf_memory.rs", Fence::Anywhere),
];

/// ckptfmt's `unsafe fn` memory maps (`ckptfmt/src/mmap.rs`), the only calls a
/// [`Fence::CallsOnly`] caller of them may wrap in `unsafe`.
const CKPTFMT_MAP_FNS: &[&str] = &["map_file", "map_block", "map"];

/// Files that may say `allow(missing_docs)`, with the reason.
const MISSING_DOCS_ALLOWED: &[(&str, &str)] = &[(
    "ggml-sys/src/lib.rs",
    "the generated bindings are included into the crate root",
)];

/// Generated files, exempt from the length limit (`*` matches any run of characters).
const GENERATED: &[&str] = &["ggml-sys/src/bindings*.rs"];

/// The longest a hand-written `.rs` file may be.
const MAX_LINES: usize = 800;

/// Macros library code must not call: a library reports through values and errors.
const PRINT_MACROS: &[&str] = &["println", "print", "eprintln", "eprint", "dbg"];

/// What a workspace crate is allowed.
struct CrateRule {
    name: &'static str,
    /// Library crates' `src/` is library code (no printing, no `.unwrap()`, documented).
    library: bool,
    /// Workspace crates it may depend on; `None`: any.
    may_use: Option<&'static [&'static str]>,
}

impl CrateRule {
    const fn library(name: &'static str, may_use: &'static [&'static str]) -> Self {
        CrateRule {
            name,
            library: true,
            may_use: Some(may_use),
        }
    }

    const fn top(name: &'static str) -> Self {
        CrateRule {
            name,
            library: false,
            may_use: None,
        }
    }
}

/// How much `unsafe` a fenced path may hold.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Fence {
    /// Any `unsafe` (the module exists to hold it).
    Anywhere,
    /// Only blocks that are one call of a listed `unsafe fn` (`unsafe { x.f(..) }`,
    /// `unsafe { T::f(..) }`): callers of a fenced API, never `unsafe` of their own.
    CallsOnly(&'static [&'static str]),
}

// ---------------------------------------------------------------------------------------------
// Running it.
// ---------------------------------------------------------------------------------------------

/// One broken promise, printed as `file:line: what`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Violation {
    path: String,
    line: usize,
    what: String,
}

impl Violation {
    pub(crate) fn new(path: &str, line: usize, what: impl Into<String>) -> Self {
        Violation {
            path: path.to_string(),
            line,
            what: what.into(),
        }
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}: {}", self.path, self.line, self.what)
    }
}

/// `cargo xtask tidy`: prints every violation and fails when there is any.
pub fn tidy(root: &Path) -> Result<(), String> {
    let mut violations = check_workspace(root)?;
    violations.extend(crate::api::check(root)?);
    for v in &violations {
        println!("{v}");
    }
    match violations.len() {
        0 => {
            eprintln!("tidy: no problems");
            Ok(())
        }
        n => Err(format!("tidy found {n} problem(s)")),
    }
}

/// Every check over the workspace at `root`, sorted by file and line.
fn check_workspace(root: &Path) -> Result<Vec<Violation>, String> {
    let output = Command::new(crate::cargo())
        .args(["metadata", "--format-version", "1", "--no-deps"])
        .current_dir(root)
        .output()
        .map_err(|e| format!("could not run cargo metadata: {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    let metadata: Value = serde_json::from_slice(&output.stdout)
        .map_err(|e| format!("cargo metadata printed invalid JSON: {e}"))?;
    let read = |rel: &str| std::fs::read_to_string(root.join(rel)).ok();

    let mut violations = check_dependencies(&metadata, &read);
    let members = workspace_crates(&metadata);
    for (dir, rule) in &members {
        let docs_waived = MISSING_DOCS_ALLOWED
            .iter()
            .any(|(path, _)| *path == join(dir, "src/lib.rs"));
        if rule.is_some_and(|r| r.library) && !docs_waived {
            let manifest = join(dir, "Cargo.toml");
            if let Some(text) = read(&manifest) {
                violations.extend(check_lints_inherited(&manifest, &text));
            }
        }
    }

    let mut paths = Vec::new();
    collect_rs_files(root, "", &mut paths)
        .map_err(|e| format!("could not list {}: {e}", root.display()))?;
    let mut sources = Vec::new();
    for path in paths {
        let text = std::fs::read_to_string(root.join(&path))
            .map_err(|e| format!("could not read {path}: {e}"))?;
        match Source::parse(&path, &text) {
            Ok(source) => sources.push(source),
            Err(v) => violations.push(v),
        }
    }
    let library_crate_dirs: Vec<&str> = members
        .iter()
        .filter(|(_, rule)| rule.is_some_and(|r| r.library))
        .map(|(dir, _)| dir.as_str())
        .collect();
    violations.extend(check_sources(&sources, &library_crate_dirs));
    violations.extend(check_stale_allowances(&sources));
    violations.sort();
    Ok(violations)
}

/// The file checks over parsed sources; `library_crate_dirs` are the library crates' directories.
fn check_sources(sources: &[Source], library_crate_dirs: &[&str]) -> Vec<Violation> {
    let included: BTreeSet<String> = sources.iter().flat_map(Source::included_files).collect();
    let mut violations = Vec::new();
    for source in sources {
        violations.extend(check_length(source));
        violations.extend(check_fn_length(source));
        if !included.contains(&source.path) {
            violations.extend(check_module_doc(source));
        }
        violations.extend(check_unsafe(source));
        if is_library_code(&source.path, library_crate_dirs) {
            violations.extend(check_library_code(source));
            violations.extend(check_missing_docs_allowed(source));
        }
    }
    violations
}

// ---------------------------------------------------------------------------------------------
// Paths.
// ---------------------------------------------------------------------------------------------

/// Appends every `.rs` file under `root/rel` (skipping `target` and hidden directories, never
/// following links) to `out`, as paths relative to `root`.
fn collect_rs_files(root: &Path, rel: &str, out: &mut Vec<String>) -> std::io::Result<()> {
    let mut entries = std::fs::read_dir(root.join(rel))?.collect::<Result<Vec<_>, _>>()?;
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let name = entry.file_name().to_string_lossy().into_owned();
        let kind = entry.file_type()?;
        let path = join(rel, &name);
        if kind.is_dir() && !name.starts_with('.') && name != "target" {
            collect_rs_files(root, &path, out)?;
        } else if kind.is_file() && name.ends_with(".rs") {
            out.push(path);
        }
    }
    Ok(())
}

/// `dir/name`, or `name` when `dir` is the root.
fn join(dir: &str, name: &str) -> String {
    if dir.is_empty() {
        name.to_string()
    } else {
        format!("{dir}/{name}")
    }
}

/// Resolves `.` and `..` in a `/`-separated relative path.
fn normalize(path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            _ => parts.push(part),
        }
    }
    parts.join("/")
}

/// A pattern with `*` wildcards matches the whole of `text`.
fn glob_match(pattern: &str, text: &str) -> bool {
    let mut pieces = pattern.split('*');
    let first = pieces.next().unwrap_or("");
    let Some(mut rest) = text.strip_prefix(first) else {
        return false;
    };
    let pieces: Vec<&str> = pieces.collect();
    let Some((last, middle)) = pieces.split_last() else {
        return rest.is_empty();
    };
    for piece in middle {
        match rest.find(piece) {
            Some(at) => rest = &rest[at + piece.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

/// `src/` of a library crate, outside `src/bin/` and `src/main.rs`.
fn is_library_code(path: &str, library_crate_dirs: &[&str]) -> bool {
    library_crate_dirs.iter().any(|dir| {
        let src = join(dir, "src/");
        path.starts_with(&src)
            && !path.starts_with(&format!("{src}bin/"))
            && path != format!("{src}main.rs")
    })
}

// ---------------------------------------------------------------------------------------------
// The checks.
// ---------------------------------------------------------------------------------------------

/// No `.rs` file over [`MAX_LINES`] lines, generated files aside.
fn check_length(source: &Source) -> Option<Violation> {
    let lines = source.text.lines().count();
    if lines <= MAX_LINES || GENERATED.iter().any(|g| glob_match(g, &source.path)) {
        return None;
    }
    Some(Violation::new(
        &source.path,
        MAX_LINES + 1,
        format!("{lines} lines, over the limit of {MAX_LINES}: split it along its seams"),
    ))
}

/// Every file opens with a `//!` module doc (files pulled in by `include!` cannot, and are
/// exempted by the caller).
fn check_module_doc(source: &Source) -> Option<Violation> {
    let first = source
        .text
        .lines()
        .enumerate()
        .find(|(_, line)| !line.trim().is_empty());
    match first {
        Some((_, line)) if line.trim_start().starts_with("//!") => None,
        other => Some(Violation::new(
            &source.path,
            other.map_or(1, |(i, _)| i + 1),
            "the file does not start with a `//!` module doc",
        )),
    }
}

/// `unsafe` only inside [`UNSAFE_FENCE`].
fn check_unsafe(source: &Source) -> Vec<Violation> {
    let fence = UNSAFE_FENCE
        .iter()
        .find(|(prefix, _)| {
            if prefix.ends_with('/') {
                source.path.starts_with(prefix)
            } else {
                source.path == *prefix
            }
        })
        .map(|(_, fence)| *fence);
    let mut violations = Vec::new();
    each_level(&source.tokens, &mut |trees| {
        for (i, tree) in trees.iter().enumerate() {
            if !is_ident(tree, "unsafe") {
                continue;
            }
            let line = line_of(tree);
            match fence {
                Some(Fence::Anywhere) => {}
                Some(Fence::CallsOnly(fns)) if is_one_call_block(trees.get(i + 1), fns) => {}
                Some(Fence::CallsOnly(fns)) => violations.push(Violation::new(
                    &source.path,
                    line,
                    format!(
                        "`unsafe` other than a block calling one of the fenced `unsafe fn`s {fns:?}"
                    ),
                )),
                None => violations.push(Violation::new(
                    &source.path,
                    line,
                    "`unsafe` outside the fenced modules (UNSAFE_FENCE in xtask/src/tidy.rs, UNSAFE.md)",
                )),
            }
        }
    });
    violations
}

/// `{ path::to::f(..) }` or `{ receiver.f(..) }` with `f` in `fns`: a block that is exactly one
/// call of a listed function (its receiver and arguments may be any expression without `unsafe`).
fn is_one_call_block(tree: Option<&TokenTree>, fns: &[&str]) -> bool {
    let Some(TokenTree::Group(block)) = tree else {
        return false;
    };
    if block.delimiter() != Delimiter::Brace {
        return false;
    }
    let trees: Vec<TokenTree> = block.stream().into_iter().collect();
    let [receiver @ .., sep, TokenTree::Ident(name), TokenTree::Group(args)] = trees.as_slice()
    else {
        return false;
    };
    let called_on = is_punct(Some(sep), '.') || is_punct(Some(sep), ':');
    // One expression: no statement before the call, and no `unsafe` hidden in its operands.
    let mut plain = !receiver.is_empty() && !receiver.iter().any(|t| is_punct(Some(t), ';'));
    let operands: TokenStream = receiver
        .iter()
        .cloned()
        .chain([TokenTree::Group(args.clone())])
        .collect();
    each_level(&operands, &mut |level| {
        plain &= !level.iter().any(|t| is_ident(t, "unsafe"));
    });
    called_on
        && plain
        && args.delimiter() == Delimiter::Parenthesis
        && fns.contains(&name.to_string().as_str())
}

/// Library code neither prints nor calls `.unwrap()`, test-only items aside.
fn check_library_code(source: &Source) -> Vec<Violation> {
    let mut violations = Vec::new();
    each_level(&source.tokens, &mut |trees| {
        for (i, tree) in trees.iter().enumerate() {
            let line = line_of(tree);
            if source.in_test_code(line) {
                continue;
            }
            if let TokenTree::Ident(name) = tree {
                let name = name.to_string();
                if PRINT_MACROS.contains(&name.as_str()) && is_punct(trees.get(i + 1), '!') {
                    violations.push(Violation::new(
                        &source.path,
                        line,
                        format!(
                            "`{name}!` in library code: return the facts, or log from the caller"
                        ),
                    ));
                }
            }
            if is_punct(Some(tree), '.')
                && trees.get(i + 1).is_some_and(|t| is_ident(t, "unwrap"))
                && matches!(trees.get(i + 2), Some(TokenTree::Group(g))
                    if g.delimiter() == Delimiter::Parenthesis && g.stream().is_empty())
            {
                violations.push(Violation::new(
                    &source.path,
                    line_of(&trees[i + 1]),
                    "`.unwrap()` in library code: return a typed error, or `.expect(\"the invariant\")`",
                ));
            }
        }
    });
    violations
}

/// Library code never switches off `missing_docs` (`allow` or `expect`, also under `cfg_attr`).
fn check_missing_docs_allowed(source: &Source) -> Vec<Violation> {
    if MISSING_DOCS_ALLOWED
        .iter()
        .any(|(path, _)| *path == source.path)
    {
        return Vec::new();
    }
    let mut violations = Vec::new();
    each_level(&source.tokens, &mut |trees| {
        for (i, tree) in trees.iter().enumerate() {
            if !(is_ident(tree, "allow") || is_ident(tree, "expect")) {
                continue;
            }
            let Some(TokenTree::Group(lints)) = trees.get(i + 1) else {
                continue;
            };
            let line = line_of(tree);
            if lints.delimiter() == Delimiter::Parenthesis
                && lints
                    .stream()
                    .into_iter()
                    .any(|t| is_ident(&t, "missing_docs"))
                && !source.in_test_code(line)
            {
                violations.push(Violation::new(
                    &source.path,
                    line,
                    format!(
                        "`{tree}(missing_docs)` in a library crate: document the items instead"
                    ),
                ));
            }
        }
    });
    violations
}

#[cfg(test)]
mod tests;
