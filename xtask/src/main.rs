//! Project automation, run as `cargo xtask <command>`.
//!
//! - `fetch-model [smollm2|gemma3]`: download the default model (or Gemma 3 270M) into `models/`
//!   and verify its checksum.
//! - `bindgen`: regenerate `ggml-sys/src/bindings*.rs` from the pinned ggml headers.
//! - `ci`: formatting check, clippy with warnings denied, `tidy`, the whole test suite, then
//!   `clients`.
//! - `clients`: the server driven by the official `openai` and `anthropic` Python packages
//!   (`server/tests/clients/`).
//! - `compare-llama-cpp`: engine speed against llama.cpp's reference harness, side by side.
//! - `bench-server`: our HTTP server against llama.cpp's `llama-server`, side by side: time to
//!   first token (first, repeated, after a restart) and an agent-like trace of concurrent chats.
//! - `bench-remote`: the prompt cache's Redis tier against a local disk hit and computing, its
//!   read throughput against `redis-benchmark`, and a fleet of 1–8 replicas on one Redis.
//! - `crash-test`: SIGKILL a process saving conversations N times; every committed checkpoint
//!   must restore to the bytes it was saved with, and `ckpt verify` must pass.
//! - `cuda-build`: the `cuda` feature compiled and linked without a GPU (the toolkit from its
//!   pinned wheels, a stub driver library), and the GPU check's binaries gathered in one folder;
//!   `cuda-toolkit` fetches and unpacks only the toolkit.
//! - `tidy`: the promises of `ARCHITECTURE.md` checked on the sources (the unsafe fence, downward
//!   dependencies, file length, docs, no printing or `.unwrap()` in library code), and `api`.
//! - `api [--bless]`: `engine`'s public API listed from rustdoc's JSON output: no item names a
//!   type of ckptfmt, kvstore or ggml-sys that engine does not re-export, and the listing equals
//!   the committed `engine/api.txt` (`--bless` rewrites it).

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

#[allow(dead_code)]
mod source {
    include!("../../ggml-sys/src/source.rs");
}
mod api;
mod bench_agent;
mod bench_growth;
mod bench_multiround;
mod bench_remote;
mod bench_server;
#[cfg(feature = "bindgen")]
mod bindings;
mod clients;
mod compare;
mod crash;
mod cuda;
mod model;
mod tidy;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("fetch-model") => model::by_name(args.get(1).map(String::as_str))
            .and_then(|source| model::fetch(&workspace_root(), source))
            .map(|path| {
                println!("{}", path.display());
            }),
        Some("bindgen") => bindgen(),
        Some("ci") => ci(),
        Some("clients") => clients::clients(&args[1..]),
        Some("compare-llama-cpp") => compare::compare(&args[1..]),
        Some("crash-test") => crash::crash_test(&args[1..]),
        Some("cuda-build") => cuda::cuda_build(&args[1..]),
        Some("cuda-toolkit") => cuda::cuda_toolkit(&args[1..]),
        Some("bench-server") => bench_server::bench_server(&args[1..]),
        Some("bench-remote") => bench_remote::bench_remote(&args[1..]),
        Some("tidy") => tidy::tidy(&workspace_root()),
        Some("api") => api::api(&workspace_root(), &args[1..]),
        Some("help") | Some("--help") | Some("-h") | None => {
            println!("usage: cargo xtask <fetch-model [smollm2|gemma3] | bindgen | ci | clients [--server BIN] [--model PATH] | tidy | api [--bless] | compare-llama-cpp --refh PATH [--reps N] [--sequences N] [--cache-type f16|q8_0] [--deterministic] | crash-test [--kills N] | cuda-build [--arch 90] [--out DIR] | cuda-toolkit [DIR] | bench-server [--llama-server PATH] (--help lists its options) | bench-remote [--replicas 1,2,4,8] [--users N] [--fleet-turns N] [--reps N]>");
            Ok(())
        }
        Some(other) => Err(format!(
            "unknown command `{other}` (try `cargo xtask help`)"
        )),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}

/// The workspace root (the parent of this crate's directory).
fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}

fn cargo() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".into())
}

/// Builds the `ckpt` tool (release); its path.
fn build_ckpt() -> Result<PathBuf, String> {
    run(
        &cargo(),
        &[
            "build",
            "--release",
            "--quiet",
            "-p",
            "kvstore",
            "--bin",
            "ckpt",
        ],
    )?;
    Ok(workspace_root().join("target/release/ckpt"))
}

/// Runs a command in the workspace root; a non-zero exit is an error naming the command.
fn run(program: &str, args: &[&str]) -> Result<(), String> {
    eprintln!("$ {program} {}", args.join(" "));
    let status = Command::new(program)
        .args(args)
        .current_dir(workspace_root())
        .status()
        .map_err(|e| format!("could not run {program}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("`{program} {}` failed ({status})", args.join(" ")))
    }
}

/// `bindgen` needs libclang; the generator is compiled only on demand (feature `bindgen`).
fn bindgen() -> Result<(), String> {
    #[cfg(feature = "bindgen")]
    {
        bindings::generate(&workspace_root())
    }
    #[cfg(not(feature = "bindgen"))]
    {
        run(
            &cargo(),
            &[
                "run",
                "--quiet",
                "--package",
                "xtask",
                "--features",
                "bindgen",
                "--",
                "bindgen",
            ],
        )
    }
}

/// What CI runs: the model (so the fidelity tests use it), format, lints, tidy, tests, then
/// the official Python clients against the server the tests built.
fn ci() -> Result<(), String> {
    let root = workspace_root();
    if let Err(e) = model::fetch_default(&root).and_then(|_| model::fetch(&root, &model::GEMMA3)) {
        // Elsewhere the suite still runs (tests that need the model say they skipped it); in CI
        // (`CI` set) a missing model is a failure, so the fidelity tests cannot silently skip.
        if std::env::var_os("CI").is_some() {
            return Err(e);
        }
        eprintln!("warning: {e}; tests that need the real model will be skipped");
    }
    let cargo = cargo();
    run(&cargo, &["fmt", "--all", "--", "--check"])?;
    run(
        &cargo,
        &[
            "clippy",
            "--workspace",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ],
    )?;
    eprintln!("$ cargo xtask tidy");
    tidy::tidy(&root)?;
    run(&cargo, &["test", "--workspace"])?;
    eprintln!("$ cargo xtask clients");
    clients::clients(&[])?;
    Ok(())
}
