//! `cargo xtask clients [--server BIN] [--model PATH]`: the server driven by the official
//! `openai`, `anthropic` and `ollama` Python packages, with the scripts of
//! `server/tests/clients/` (tools, streaming, the Responses API across a restart, embeddings,
//! Anthropic's Messages API, Ollama's API). Each script starts and stops its own servers in a
//! scratch directory.
//!
//! The packages come from `server/tests/clients/requirements.txt`; the server is
//! `target/debug/llama-hdd-server` unless `--server` names another (built when missing, as
//! `cargo test --workspace` leaves it in CI). Python is `$PYTHON`, else `python3`. Without the
//! model the command warns and skips, except in CI (`CI` set), where that is an error.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Instant, SystemTime};

use clap::Args;

use crate::{cargo, model, run, target_dir, workspace_root};

/// The scripts' directory, relative to the workspace root.
const DIR: &str = "server/tests/clients";

/// The scripts, run in this order.
const SCRIPTS: &[&str] = &[
    "openai_client.py",
    "anthropic_client.py",
    "ollama_client.py",
    "webui_browser.py",
];

/// The browser the web page's script drives, and its driver (Debian's `chromium` and
/// `chromium-driver` packages).
const BROWSER: [&str; 2] = ["/usr/bin/chromium", "/usr/bin/chromedriver"];

/// Where the default server binary is built, under the target directory.
const DEFAULT_SERVER: &str = "debug/llama-hdd-server";

/// The crates whose sources the server binary is built from (for the staleness warning).
const SERVER_SOURCES: &[&str] = &[
    "server/src",
    "engine/src",
    "kvstore/src",
    "ckptfmt/src",
    "ggml-sys/src",
];

/// The command line of `cargo xtask clients`.
#[derive(Args, Clone, Debug)]
pub(crate) struct ClientsArgs {
    /// The server binary the scripts start [default: target/debug/llama-hdd-server, built when
    /// missing].
    #[arg(long, value_name = "BIN")]
    pub(crate) server: Option<PathBuf>,
    /// The model the servers load.
    #[arg(long, value_name = "PATH", default_value_os_t = model::default_path())]
    pub(crate) model: PathBuf,
}

impl Default for ClientsArgs {
    /// What `cargo xtask clients` without options runs (as `ci` does).
    fn default() -> Self {
        ClientsArgs {
            server: None,
            model: model::default_path(),
        }
    }
}

/// Runs the client scripts; an error names the scripts that failed.
pub(crate) fn clients(o: &ClientsArgs) -> Result<(), String> {
    let root = workspace_root();
    if !o.model.is_file() {
        let e = format!(
            "clients: no model at {} (run `cargo xtask fetch-model`)",
            o.model.display()
        );
        // As `ci` does for the model: a failure in CI, a skip elsewhere.
        if std::env::var_os("CI").is_some() {
            return Err(e);
        }
        eprintln!("warning: {e}; the client checks are skipped");
        return Ok(());
    }
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let python = match check_packages(&python) {
        Ok(()) => python,
        // A fresh machine: the pinned packages go into a virtual environment of the
        // project's own (under `target/`), made once.
        Err(e) => venv(&root, "python3").map_err(|v| format!("{e}\n({v})"))?,
    };
    let server = server_binary(&root, o.server.clone())?;
    let scratch = std::env::temp_dir().join(format!("llama-hdd-clients-{}", std::process::id()));
    // A leftover of an earlier run with this pid holds nothing we need.
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(&scratch)
        .map_err(|e| format!("clients: cannot create {}: {e}", scratch.display()))?;

    let mut failed = Vec::new();
    for script in SCRIPTS {
        if *script == "webui_browser.py" && !browser_present()? {
            continue;
        }
        let dir = scratch.join(script.trim_end_matches(".py"));
        let path = root.join(DIR).join(script);
        let args = [&path, &server, &o.model, &dir].map(|p| p.to_string_lossy().into_owned());
        eprintln!("$ {python} {}", args.join(" "));
        let t0 = Instant::now();
        let status = Command::new(&python)
            .args(&args)
            .current_dir(&root)
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .env("WEBUI_SCREENSHOTS", target_dir().join("webui-screenshots"))
            .status()
            .map_err(|e| format!("clients: could not run {python}: {e}"))?;
        let secs = t0.elapsed().as_secs_f64();
        if status.success() {
            eprintln!("clients: {script} passed in {secs:.0}s");
        } else {
            eprintln!("clients: {script} FAILED ({status}) after {secs:.0}s");
            failed.push(*script);
        }
    }
    if failed.is_empty() {
        let _ = std::fs::remove_dir_all(&scratch);
        Ok(())
    } else {
        Err(format!(
            "clients: {} failed; the servers' logs are kept in {}",
            failed.join(", "),
            scratch.display()
        ))
    }
}

/// Whether Chromium and its driver are installed; without them the browser check is skipped
/// with a warning, except in CI (`CI` set), where that is an error.
fn browser_present() -> Result<bool, String> {
    let missing: Vec<&str> = BROWSER
        .into_iter()
        .filter(|p| !Path::new(p).is_file())
        .collect();
    if missing.is_empty() {
        return Ok(true);
    }
    let e = format!(
        "clients: no {} (install Debian's chromium and chromium-driver)",
        missing.join(" nor ")
    );
    if std::env::var_os("CI").is_some() {
        return Err(e);
    }
    eprintln!("warning: {e}; the web page's browser check is skipped");
    Ok(false)
}

/// Imports the packages and prints their versions (`ollama` has no `__version__`: pip's
/// record of it is read).
const IMPORT_CHECK: &str = "import openai, anthropic, ollama, selenium, importlib.metadata as m; \
    print('openai', openai.__version__, '/ anthropic', anthropic.__version__, \
    '/ ollama', m.version('ollama'), '/ selenium', selenium.__version__)";

/// The packages import, or an error that says how to install them; prints their versions.
fn check_packages(python: &str) -> Result<(), String> {
    let install = format!("python3 -m pip install -r {DIR}/requirements.txt");
    let out = Command::new(python)
        .args(["-c", IMPORT_CHECK])
        .output()
        .map_err(|e| {
            format!("clients: could not run {python} ({e}); install Python 3, then `{install}`")
        })?;
    if !out.status.success() {
        return Err(format!(
            "clients: the client packages do not import with {python}:\n{}\n\
             install them: `{install}`",
            String::from_utf8_lossy(&out.stderr).trim_end()
        ));
    }
    eprintln!(
        "clients: {} (pinned in {DIR}/requirements.txt)",
        String::from_utf8_lossy(&out.stdout).trim()
    );
    Ok(())
}

/// A virtual environment under `target/clients-venv` with the pinned packages (made when
/// missing): its Python.
fn venv(root: &Path, python: &str) -> Result<String, String> {
    let dir = target_dir().join("clients-venv");
    let bin = dir.join("bin/python");
    let bin_s = bin.to_string_lossy().into_owned();
    if check_packages(&bin_s).is_ok() {
        return Ok(bin_s);
    }
    eprintln!(
        "clients: installing the pinned packages into {}",
        dir.display()
    );
    let ok = |c: &mut Command| c.status().map(|s| s.success()).unwrap_or(false);
    if !ok(Command::new(python).arg("-m").arg("venv").arg(&dir)) {
        return Err(format!(
            "could not make a virtual environment at {}",
            dir.display()
        ));
    }
    let req = root.join(DIR).join("requirements.txt");
    if !ok(Command::new(&bin)
        .args(["-m", "pip", "install", "-q", "-r"])
        .arg(&req))
    {
        return Err(format!("pip could not install {}", req.display()));
    }
    check_packages(&bin_s)?;
    Ok(bin_s)
}

/// `--server`'s binary, or the debug build: built when missing, and a warning when it is
/// older than the sources it is built from.
fn server_binary(root: &Path, given: Option<PathBuf>) -> Result<PathBuf, String> {
    if let Some(path) = given {
        return if path.is_file() {
            Ok(path)
        } else {
            Err(format!("clients: no server binary at {}", path.display()))
        };
    }
    let path = target_dir().join(DEFAULT_SERVER);
    if !path.is_file() {
        run(
            &cargo(),
            &["build", "-p", "server", "--bin", "llama-hdd-server"],
        )?;
    } else if let (Ok(built), Some(newest)) = (modified(&path), newest_source(root)) {
        if newest > built {
            eprintln!(
                "warning: {} is older than the sources; rebuild it \
                 (`cargo build -p server --bin llama-hdd-server`) to test the current code",
                path.display()
            );
        }
    }
    Ok(path)
}

fn modified(path: &Path) -> std::io::Result<SystemTime> {
    std::fs::metadata(path)?.modified()
}

/// The newest modification time of a `.rs` file under [`SERVER_SOURCES`].
fn newest_source(root: &Path) -> Option<SystemTime> {
    fn walk(dir: &Path, newest: &mut Option<SystemTime>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, newest);
            } else if path.extension().is_some_and(|e| e == "rs") {
                if let Ok(t) = modified(&path) {
                    *newest = (*newest).max(Some(t));
                }
            }
        }
    }
    let mut newest = None;
    for dir in SERVER_SOURCES {
        walk(&root.join(dir), &mut newest);
    }
    newest
}
