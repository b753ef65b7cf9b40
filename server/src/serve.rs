//! The accept loop: HTTP/1.1 connections served by hyper with header names in title case (as
//! llama-server writes them), until shutdown, then the open connections are let finish.

use axum::Router;
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::watch;

/// Serves `app` on `listener` until `stop` turns true; then waits for the requests in flight.
pub async fn serve(listener: TcpListener, app: Router, mut stop: watch::Receiver<bool>) {
    let graceful = GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.title_case_headers(true).keep_alive(true);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let stream = match accepted {
                    Ok((stream, _)) => stream,
                    // Out of file descriptors and the like: wait, then accept again.
                    Err(_) => {
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let service = TowerToHyperService::new(app.clone());
                let conn = http.serve_connection(TokioIo::new(stream), service);
                let conn = graceful.watch(conn);
                tokio::spawn(async move {
                    let _ = conn.await;
                });
            }
            // The guard `wait_for` gives back is dropped at once (it is not `Send`).
            () = async { let _ = stop.wait_for(|&s| s).await; } => break,
        }
    }
    drop(listener);
    graceful.shutdown().await;
}
