//! A real `redis-server` for tests (feature `test-util`): started on a free loopback port
//! with no persistence, stopped when dropped; with [`RedisServer::start_tls`], also on a TLS
//! port.

pub use redis;

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A `redis-server` child process on a loopback port (and a TLS one).
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    tls_port: Option<u16>,
    dir: PathBuf,
}

/// A free loopback port.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

impl RedisServer {
    /// Starts `redis-server` (from `PATH`) on a free port and waits until it answers. Panics
    /// with what to install when the program is missing: a test that needs Redis fails
    /// rather than passing without it.
    pub fn start() -> RedisServer {
        Self::start_on(free_port())
    }

    /// Starts `redis-server` on `port` (again, after [`RedisServer::stop`]).
    pub fn start_on(port: u16) -> RedisServer {
        Self::spawn(port, None)
    }

    /// Starts `redis-server` on a free port, as [`RedisServer::start`], and on a second one
    /// with TLS only ([`RedisServer::tls_port`]), whose certificate chain (the server's first,
    /// then any intermediates) and key are `cert_pem` and `key_pem`; clients show none. The
    /// plain port stays for [`RedisServer::cli`] and [`RedisServer::connection`].
    pub fn start_tls(cert_pem: &str, key_pem: &str) -> RedisServer {
        // Both reserved before either is released, so they differ.
        let (a, b) = (
            TcpListener::bind("127.0.0.1:0").expect("a free loopback port"),
            TcpListener::bind("127.0.0.1:0").expect("a free loopback port"),
        );
        let port = |l: &TcpListener| l.local_addr().expect("a bound port").port();
        let (port, tls_port) = (port(&a), port(&b));
        drop((a, b));
        Self::spawn(port, Some((tls_port, cert_pem, key_pem)))
    }

    fn spawn(port: u16, tls: Option<(u16, &str, &str)>) -> RedisServer {
        let dir =
            std::env::temp_dir().join(format!("llama-hdd-redis-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a directory for redis-server");
        let mut command = Command::new("redis-server");
        command
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            // `DEBUG SLEEP` plays a stuck server.
            .args(["--enable-debug-command", "local"])
            .arg("--dir")
            .arg(&dir)
            .arg("--logfile")
            .arg(dir.join("redis.log"));
        if let Some((tls_port, cert_pem, key_pem)) = tls {
            let (cert, key) = (dir.join("server.pem"), dir.join("server.key"));
            std::fs::write(&cert, cert_pem).expect("the server's certificate written");
            std::fs::write(&key, key_pem).expect("the server's key written");
            command
                .args(["--tls-port", &tls_port.to_string()])
                .arg("--tls-cert-file")
                .arg(&cert)
                .arg("--tls-key-file")
                .arg(&key)
                .args(["--tls-auth-clients", "no"]);
        }
        let child = command
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "this test needs `redis-server` on PATH ({e}): install Debian's \
                     `redis-server` package (`.ci/run` does)"
                )
            });
        let mut server = RedisServer {
            child: Some(child),
            port,
            tls_port: tls.map(|(p, _, _)| p),
            dir,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while server.cli(&["PING"]).as_deref() != Some("PONG") {
            let exited = server
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten());
            if let Some(status) = exited {
                let log = std::fs::read_to_string(server.dir.join("redis.log")).unwrap_or_default();
                panic!(
                    "redis-server exited ({status}){}:\n{log}",
                    if server.tls_port.is_some() {
                        "; TLS needs a redis-server built with it (Debian's is)"
                    } else {
                        ""
                    }
                );
            }
            assert!(Instant::now() < deadline, "redis-server did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        server
    }

    /// Its port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Its TLS port, when started by [`RedisServer::start_tls`].
    pub fn tls_port(&self) -> Option<u16> {
        self.tls_port
    }

    /// Its URL (the plain port).
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Runs a command through `redis-cli`; its trimmed output, `None` when it failed.
    pub fn cli(&self, args: &[&str]) -> Option<String> {
        let out = Command::new("redis-cli")
            .args(["-p", &self.port.to_string()])
            .args(args)
            .stderr(Stdio::null())
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
    }

    /// A connection of its own, for tests that read or damage values.
    pub fn connection(&self) -> redis::Connection {
        redis::Client::open(self.url())
            .and_then(|c| c.get_connection())
            .expect("a connection to the test's redis-server")
    }

    /// Kills the server (SIGKILL: as a crash would).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
