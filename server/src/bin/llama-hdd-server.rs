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
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: starting the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        let server = Server::bind(config).await?;
        eprintln!(
            "llama-hdd-server listening on http://{}",
            server.local_addr()
        );
        server.run_until(shutdown_signal()).await
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// SIGINT or SIGTERM.
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
