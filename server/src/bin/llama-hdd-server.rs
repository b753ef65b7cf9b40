//! `llama-hdd-server`: the command-line front of the `server` crate.

use std::process::ExitCode;

use server::{Args, Server};

fn main() -> ExitCode {
    // Model files are untrusted: their chat templates render in a child process with limits.
    engine::chat::sandbox::init();
    let args = match Args::parse_from_argv(std::env::args()) {
        Ok(a) => a,
        Err(e) => {
            // Help and version go to stdout with success, mistakes to stderr with failure.
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::from(2)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    let config = match args.check() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    // What the command line names must be there before anything is said of it: a missing
    // model or an unusable cache directory is an option error, like any other.
    if let Err(e) = preflight(&config) {
        eprintln!("error: {e}");
        return ExitCode::from(2);
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: starting the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let log = match Log::open(config.args.log_disable, config.args.log_file.as_deref()) {
        Ok(l) => std::sync::Arc::new(l),
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let say = |line: String| log.say(&line);
    for n in &config.args.no_effect {
        say(format!(
            "note: {} tunes {} in llama-server; it has no effect here",
            n.option, n.tunes
        ));
    }
    let cpu = engine::cpu_path();
    say(format!(
        "CPU path: {}{}",
        cpu.name,
        match cpu.request {
            engine::CpuRequest::NotSet => "",
            engine::CpuRequest::Taken => " (LLAMA_HDD_CPU)",
            engine::CpuRequest::Unknown => " (LLAMA_HDD_CPU names no path; ignored)",
            engine::CpuRequest::NotRunnable =>
                " (this CPU cannot run the path LLAMA_HDD_CPU names; ignored)",
        }
    ));
    say(format!(
        "evaluation: {}{}",
        config.args.evaluation,
        match (
            config.args.evaluation,
            config.args.repack && !config.args.no_repack
        ) {
            (engine::Evaluation::Fast, _) =>
                " (a reply may depend on what the cache held and on batching)",
            (_, true) => " (weights repacked: products over them depend on batching)",
            _ => " (a reply is the same bits cached or computed, alone or batched)",
        }
    ));
    if config.args.no_cache {
        say("prompt cache: in memory only (--no-cache)".to_owned());
    } else {
        say(format!(
            "prompt cache: {} (--cache-dir to move it), {} of RAM, disk budget {}",
            config.cache_dir.display(),
            human(config.cache_ram),
            config.cache_disk.map_or_else(|| "none".to_owned(), human),
        ));
    }
    if config.args.model.as_os_str().is_empty() {
        return route(&runtime, config, log);
    }
    let result = runtime.block_on(async {
        let mut server = Server::bind(config).await?;
        if let Some(lines) = server.log_lines() {
            let log = std::sync::Arc::clone(&log);
            std::thread::spawn(move || {
                for line in lines {
                    log.say(&line);
                }
            });
        }
        for addr in server.local_addrs() {
            say(format!("llama-hdd-server listening on http://{addr}"));
        }
        // A router's model process says where it listens, on its own line of output.
        if std::env::var_os(server::router::CHILD_ENV).is_some() {
            use std::io::Write;
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{}", server::router::ready_line(server.local_addr()));
            let _ = out.flush();
            // ... and when it falls asleep or wakes up, for the router's `/models`.
            let metrics = server.metrics();
            tokio::spawn(async move {
                let mut asleep = false;
                loop {
                    metrics.sleep_changed.notified().await;
                    let now = metrics.sleeping.load(std::sync::atomic::Ordering::Relaxed) == 1;
                    if now != asleep {
                        asleep = now;
                        let line = if now {
                            server::router::SLEEPING_LINE
                        } else {
                            server::router::AWAKE_LINE
                        };
                        let mut out = std::io::stdout().lock();
                        let _ = writeln!(out, "{line}");
                        let _ = out.flush();
                    }
                }
            });
        }
        if std::env::var_os(server::router::CHILD_ENV).is_some() {
            server.run_until(router_gone_or_signal()).await
        } else {
            server.run_until(shutdown_signal()).await
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            log.say(&format!("error: {e}"));
            if log.quiet {
                eprintln!("error: {e}");
            }
            ExitCode::FAILURE
        }
    }
}

/// Router mode (no `-m`): serves the models of `--models-dir`, `--models-preset` and the hub
/// cache, each in a process of this binary.
fn route(
    runtime: &tokio::runtime::Runtime,
    config: server::Config,
    log: std::sync::Arc<Log>,
) -> ExitCode {
    let exe = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            log.say(&format!("error: finding this program's file: {e}"));
            return ExitCode::FAILURE;
        }
    };
    let shared = server::router::child_args(std::env::args().skip(1));
    let say = {
        let log = std::sync::Arc::clone(&log);
        std::sync::Arc::new(move |line: String| log.say(&line))
    };
    let result = runtime.block_on(async {
        let router = server::router::RouterServer::bind(config, exe, shared, say).await?;
        for addr in router.local_addrs() {
            log.say(&format!("llama-hdd-server listening on http://{addr}"));
        }
        log.say("router mode: each model runs in a process of its own, loaded on demand");
        router.run_until(shutdown_signal()).await
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            log.say(&format!("error: {e}"));
            if log.quiet {
                eprintln!("error: {e}");
            }
            ExitCode::FAILURE
        }
    }
}

/// Checks the model file and the cache directory (created when missing, and written to once)
/// that the options name.
fn preflight(config: &server::Config) -> Result<(), String> {
    let model = &config.args.model;
    if !model.as_os_str().is_empty() {
        match std::fs::metadata(model) {
            Ok(m) if m.is_file() => {}
            Ok(_) => return Err(format!("--model {}: not a file", model.display())),
            Err(e) => return Err(format!("--model {}: {e}", model.display())),
        }
    }
    if !config.args.no_cache {
        let dir = &config.cache_dir;
        let unusable = |e: std::io::Error| format!("--cache-dir {}: {e}", dir.display());
        std::fs::create_dir_all(dir).map_err(unusable)?;
        let probe = dir.join(format!(".probe-{}", std::process::id()));
        std::fs::write(&probe, b"").map_err(unusable)?;
        let _ = std::fs::remove_file(&probe);
    }
    Ok(())
}

/// Where the server's lines go: standard error unless `--log-disable`, and the `--log-file`
/// too when one is given (appended to, as llama-server does).
struct Log {
    quiet: bool,
    file: Option<std::sync::Mutex<std::fs::File>>,
}

impl Log {
    fn open(quiet: bool, path: Option<&std::path::Path>) -> Result<Log, String> {
        let file = match path {
            None => None,
            Some(p) => Some(std::sync::Mutex::new(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(p)
                    .map_err(|e| format!("--log-file {}: {e}", p.display()))?,
            )),
        };
        Ok(Log { quiet, file })
    }

    fn say(&self, line: &str) {
        if !self.quiet {
            eprintln!("{line}");
        }
        if let Some(f) = &self.file {
            if let Ok(mut f) = f.lock() {
                use std::io::Write;
                let _ = writeln!(f, "{line}");
            }
        }
    }
}

/// SIGINT or SIGTERM.
/// A router's model process ends when the router does: its standard input, a pipe from the
/// router, reaches its end (also when the router was killed), or a signal comes.
async fn router_gone_or_signal() {
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    std::thread::spawn(move || {
        let mut sink = [0u8; 64];
        let mut stdin = std::io::stdin().lock();
        while matches!(std::io::Read::read(&mut stdin, &mut sink), Ok(n) if n > 0) {}
        let _ = tx.send(());
    });
    tokio::select! {
        _ = rx => eprintln!("the router is gone: shutting down"),
        () = shutdown_signal() => {},
    }
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
    eprintln!("shutting down: finishing requests and flushing the prompt cache");
}

/// A byte count for people.
fn human(bytes: u64) -> String {
    match bytes {
        u64::MAX => "no limit".to_owned(),
        b if b >= 1 << 30 => format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64),
        b => format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64),
    }
}
