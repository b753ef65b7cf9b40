//! TLS for the remote tier (`rediss://`, feature `tls`): rustls (the `ring` provider) over the
//! connection's TCP socket, the server's certificate verified against the system's CA
//! certificates or the one file given, and its name against the URL's host.
//!
//! A connection is used by one caller at a time, request then reply, and reads and writes
//! through two buffers ([`super::resp`]). A socket is cloned for them; a TLS session, one state
//! machine, cannot be, so both hold it behind one mutex ([`Session`]), never contended.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{ring, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, ClientConnection, DigitallySignedStruct, RootCertStore,
    SignatureScheme, StreamOwned,
};

use super::resp::Failure;

/// How to open TLS sessions to one server: the client configuration (trusted roots, protocol
/// versions, resumption cache) and the name its certificate must carry.
#[derive(Clone, Debug)]
pub(super) struct Tls {
    config: Arc<ClientConfig>,
    name: ServerName<'static>,
}

impl Tls {
    /// Sessions to `host`, whose certificate must chain to `ca` (a PEM file of CA certificates)
    /// when given, else to one of the system's CA certificates; `insecure` (the URL's
    /// `#insecure`) verifies neither the certificate nor its name.
    pub(super) fn new(host: &str, insecure: bool, ca: Option<&Path>) -> Result<Tls, String> {
        let name = ServerName::try_from(host.to_owned())
            .map_err(|_| format!("{host:?} cannot be a TLS server name"))?;
        let provider = Arc::new(ring::default_provider());
        let builder = ClientConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?;
        let config = if insecure {
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
                .with_no_client_auth()
        } else {
            let roots = match ca {
                Some(path) => roots_from_file(path)?,
                None => system_roots()?,
            };
            builder.with_root_certificates(roots).with_no_client_auth()
        };
        Ok(Tls {
            config: Arc::new(config),
            name,
        })
    }

    /// A session over `tcp` (connected, its timeouts set), its handshake done: a certificate
    /// that does not verify, or a handshake that fails, is [`Failure::Tls`].
    pub(super) fn connect(&self, mut tcp: TcpStream) -> Result<Session, Failure> {
        let mut conn = ClientConnection::new(Arc::clone(&self.config), self.name.clone())
            .map_err(|e| Failure::Tls(e.to_string()))?;
        while conn.is_handshaking() {
            let (read, written) = conn.complete_io(&mut tcp).map_err(handshake_failure)?;
            if read == 0 && written == 0 && conn.is_handshaking() {
                return Err(Failure::Tls(
                    "the server closed the connection during the TLS handshake".into(),
                ));
            }
        }
        Ok(Session(Arc::new(Mutex::new(StreamOwned::new(conn, tcp)))))
    }
}

/// What a failed handshake says: rustls' own error (a certificate refused, an alert from the
/// server, bytes that are not TLS) as [`Failure::Tls`]; a socket's (a timeout, a reset) stays
/// a lost connection.
fn handshake_failure(e: io::Error) -> Failure {
    match e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
    {
        Some(tls @ rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer)) => {
            Failure::Tls(format!(
                "{tls}: the server's certificate is not signed by a CA trusted here (name its \
                 CA with --cache-remote-ca)"
            ))
        }
        Some(tls) => Failure::Tls(tls.to_string()),
        None => Failure::Lost(e),
    }
}

/// The CA certificates of the PEM file `path`.
fn roots_from_file(path: &Path) -> Result<RootCertStore, String> {
    let shown = path.display();
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("CA file {shown}: {e}"))?;
    if certs.is_empty() {
        return Err(format!("CA file {shown}: no PEM certificate in it"));
    }
    let mut roots = RootCertStore::empty();
    for cert in certs {
        roots
            .add(cert)
            .map_err(|e| format!("CA file {shown}: {e}"))?;
    }
    Ok(roots)
}

/// The system's CA certificates (`SSL_CERT_FILE` and `SSL_CERT_DIR` when set); an error when
/// none can be read, since no server could then be verified.
fn system_roots() -> Result<RootCertStore, String> {
    let found = rustls_native_certs::load_native_certs();
    let mut roots = RootCertStore::empty();
    roots.add_parsable_certificates(found.certs);
    if roots.is_empty() {
        let why = found
            .errors
            .first()
            .map_or_else(|| "none found".to_owned(), ToString::to_string);
        return Err(format!(
            "no system CA certificates to verify the server with ({why}): install them \
             (Debian: ca-certificates), set SSL_CERT_FILE, or name the server's CA with \
             --cache-remote-ca"
        ));
    }
    Ok(roots)
}

/// One TLS session shared by a connection's reader and writer.
pub(super) struct Session(Arc<Mutex<StreamOwned<ClientConnection, TcpStream>>>);

impl Session {
    /// The second handle, for the other direction.
    pub(super) fn share(&self) -> Session {
        Session(Arc::clone(&self.0))
    }

    /// The session, for a read or write of any length. A lock poisoned by a panic elsewhere
    /// is a lost connection.
    pub(super) fn lock(
        &self,
    ) -> io::Result<MutexGuard<'_, StreamOwned<ClientConnection, TcpStream>>> {
        self.0
            .lock()
            .map_err(|_| io::Error::other("the TLS session was poisoned"))
    }
}

impl Read for Session {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.lock()?.read(buf)
    }
}

impl Write for Session {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.lock()?.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.lock()?.flush()
    }
}

/// `#insecure`: any certificate for any name is accepted (the handshake's signatures are still
/// checked, so the session is encrypted, but to whoever answered).
#[derive(Debug)]
struct AnyCertificate(Arc<CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
