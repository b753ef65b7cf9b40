//! `/cors-proxy` (`--ui-mcp-proxy`): the target gets only the headers the page named with
//! `x-llama-server-proxy-header-`, never the page's key, cookies or proxy credentials; without
//! the option the route is 403, and it needs the API key like any other.

mod common;

use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A one-request-at-a-time HTTP target that keeps each request's head and answers `ok`.
async fn target() -> (String, Arc<Mutex<Vec<String>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let heads = Arc::new(Mutex::new(Vec::new()));
    let kept = Arc::clone(&heads);
    tokio::spawn(async move {
        loop {
            let Ok((mut sock, _)) = listener.accept().await else {
                return;
            };
            let mut buf = Vec::new();
            let mut chunk = [0u8; 4096];
            while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                match sock.read(&mut chunk).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            }
            kept.lock()
                .unwrap()
                .push(String::from_utf8_lossy(&buf).to_lowercase());
            let _ = sock
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok")
                .await;
        }
    });
    (url, heads)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_named_headers_reach_the_target() {
    let env = common::Env::new();
    let (target_url, heads) = target().await;
    let server = env.start(&["--ui-mcp-proxy", "--api-key", "k1"]).await;
    let url = format!("{}/cors-proxy?url={target_url}/capture", server.url);
    let resp = server
        .client
        .get(&url)
        .header("authorization", "Bearer k1")
        .header("proxy-authorization", "Basic secret")
        .header("x-api-key", "k1")
        .header("cookie", "session=secret")
        .header("x-llama-server-proxy-header-accept", "application/json")
        .header(
            "x-llama-server-proxy-header-authorization",
            "Bearer explicit",
        )
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.text().await.unwrap(), "ok");
    let head = heads.lock().unwrap().pop().unwrap();
    assert!(head.starts_with("get /capture "), "{head}");
    assert!(head.contains("\r\naccept: application/json\r\n"), "{head}");
    assert!(
        head.contains("\r\nauthorization: bearer explicit\r\n"),
        "{head}"
    );
    for secret in ["proxy-authorization", "x-api-key", "cookie", "k1"] {
        assert!(
            !head.contains(secret),
            "{secret} reached the target: {head}"
        );
    }

    // The key is needed, as everywhere.
    let resp = server.client.get(&url).send().await.unwrap();
    assert_eq!(resp.status(), 401);
    // A scheme other than http and https is refused by name.
    let resp = server
        .client
        .get(format!(
            "{}/cors-proxy?url=ftp://example.invalid/",
            server.url
        ))
        .header("authorization", "Bearer k1")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    let text = resp.text().await.unwrap();
    assert!(text.contains("unsupported URL scheme"), "{text}");
    assert_eq!(heads.lock().unwrap().len(), 0);
    server.stop().await;

    // Off by default: 403, and nothing is fetched.
    let server = env.start(&[]).await;
    let url = format!("{}/cors-proxy?url={target_url}/capture", server.url);
    let resp = server.client.get(&url).send().await.unwrap();
    assert_eq!(resp.status(), 403);
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["type"], "feature_disabled");
    assert_eq!(heads.lock().unwrap().len(), 0);
    server.stop().await;
}
