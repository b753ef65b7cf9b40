//! A real `redis-server` for tests (feature `test-util`): started on a free loopback port
//! with no persistence, stopped when dropped.

pub use redis;

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A `redis-server` child process on a loopback port.
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    dir: PathBuf,
}

impl RedisServer {
    /// Starts `redis-server` (from `PATH`) on a free port and waits until it answers. Panics
    /// with what to install when the program is missing: a test that needs Redis fails
    /// rather than passing without it.
    pub fn start() -> RedisServer {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free loopback port");
        Self::start_on(port)
    }

    /// Starts `redis-server` on `port` (again, after [`RedisServer::stop`]).
    pub fn start_on(port: u16) -> RedisServer {
        let dir =
            std::env::temp_dir().join(format!("llama-hdd-redis-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a directory for redis-server");
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            // `DEBUG SLEEP` plays a stuck server.
            .args(["--enable-debug-command", "local"])
            .arg("--dir")
            .arg(&dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "this test needs `redis-server` on PATH ({e}): install Debian's \
                     `redis-server` package (`.ci/run` does)"
                )
            });
        let server = RedisServer {
            child: Some(child),
            port,
            dir,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while server.cli(&["PING"]).as_deref() != Some("PONG") {
            assert!(Instant::now() < deadline, "redis-server did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        server
    }

    /// Its port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Its URL.
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
