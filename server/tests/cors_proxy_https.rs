//! `/cors-proxy` reaches `https` targets whose certificate chains to a trusted root (here the
//! test's own authority, trusted through `SSL_CERT_FILE`), and refuses one signed by another.
//! A test binary of its own: the proxy reads the roots once per process.

mod common;

use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A certificate authority: its certificate (PEM) and what signs with it.
fn authority(name: &str) -> (String, Issuer<'static, KeyPair>) {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let key = KeyPair::generate().unwrap();
    let pem = params.self_signed(&key).unwrap().pem();
    (pem, Issuer::new(params, key))
}

/// An HTTPS target on 127.0.0.1 whose certificate `issuer` signed; it answers each request
/// with its head echoed back (lowercased). Its URL.
async fn target(issuer: &Issuer<'static, KeyPair>) -> String {
    let mut params = CertificateParams::new(vec!["127.0.0.1".to_owned()]).unwrap();
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, issuer).unwrap();
    let chain = vec![CertificateDer::from_pem_slice(cert.pem().as_bytes()).unwrap()];
    let key = PrivateKeyDer::from_pem_slice(key.serialize_pem().as_bytes()).unwrap();
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(chain, key)
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("https://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((sock, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(sock).await else {
                    return;
                };
                let mut head = Vec::new();
                let mut chunk = [0u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match tls.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&chunk[..n]),
                    }
                }
                let body = String::from_utf8_lossy(&head).to_lowercase();
                let answer = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = tls.write_all(answer.as_bytes()).await;
                let _ = tls.shutdown().await;
            });
        }
    });
    url
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_targets_are_reached_when_their_certificate_is_trusted() {
    let env = common::Env::new();
    let (trusted_pem, trusted) = authority("trusted test authority");
    let (_, stranger) = authority("unknown test authority");
    let roots = env.cache().with_extension("roots.pem");
    std::fs::write(&roots, trusted_pem).unwrap();
    // Before the proxy's first request, which reads the roots; nothing else in this process
    // reads the variable concurrently.
    std::env::set_var("SSL_CERT_FILE", &roots);
    let good = target(&trusted).await;
    let bad = target(&stranger).await;
    let server = env.start(&["--ui-mcp-proxy"]).await;

    let resp = server
        .client
        .get(format!("{}/cors-proxy?url={good}/mcp", server.url))
        .header("cookie", "session=secret")
        .header("x-llama-server-proxy-header-accept", "application/json")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let head = resp.text().await.unwrap();
    assert!(head.starts_with("get /mcp http/1.1"), "{head}");
    assert!(head.contains("accept: application/json"), "{head}");
    assert!(!head.contains("secret"), "{head}");

    // A certificate no trusted root signed: the target is not reached.
    let resp = server
        .client
        .get(format!("{}/cors-proxy?url={bad}/mcp", server.url))
        .send()
        .await
        .unwrap();
    let status = resp.status();
    let text = resp.text().await.unwrap();
    assert!(status.is_server_error(), "{status}: {text}");
    assert!(!text.contains("get /mcp"), "{text}");
}
