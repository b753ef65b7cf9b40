//! [`RedisTier`]: the remote tier on Redis (or Valkey), with timeouts on every call, a
//! connection per concurrent caller, and reconnection with backoff, over [`super::resp`]'s
//! connections.

use std::cell::Cell;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::resp::{Conn, Failure, Reply, Target};
use super::{RemoteConfig, RemoteMetrics, RemoteTier};
use crate::error::{Result, StoreError};

/// The first wait before connecting again after a failure; it doubles up to [`MAX_BACKOFF`].
const MIN_BACKOFF: Duration = Duration::from_millis(100);
/// The longest wait between two connection attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// Bytes of values a `get_each` (and so a `get_many`) keeps outstanding. Redis holds a pipeline's replies (or one
/// `MGET`'s) all at once before writing them, in fresh memory each time: one `MGET` of 31
/// block records of 1.5 MB faulted in every page on the server's side and read at 0.6x of one
/// `GET` at a time. Two or three blocks in flight keep both sides busy in reused buffers
/// (`ckpt bench-remote`, docs/BENCHMARKS.md: 4 MiB read fastest of 2, 4, 8, 16 and 64).
const GET_BUDGET: usize = 4 << 20;

/// A Redis server as the remote tier. Values are plain strings (`GET`/`SET`); the server's own
/// eviction (`maxmemory` with an LRU policy) bounds what it holds.
pub struct RedisTier {
    target: Target,
    timeout: Duration,
    shown: String,
    metrics: Arc<RemoteMetrics>,
    link: Mutex<Link>,
}

/// The connections and what the last calls found.
struct Link {
    /// Connections not in use.
    idle: Vec<Conn>,
    state: State,
    /// While down: no call is made before this.
    retry_at: Option<Instant>,
    backoff: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// No call made yet.
    Unknown,
    Up,
    Down,
    /// Reachable, refusing writes (out of memory, read-only replica).
    Refusing,
}

impl RedisTier {
    /// The Redis at `config.url` (its namespace is the caller's); nothing is connected until
    /// the first call. `config.timeout` bounds the connection (the TLS handshake included) and
    /// each read and write of every call.
    pub fn open(config: &RemoteConfig, metrics: Arc<RemoteMetrics>) -> Result<RedisTier> {
        let url = config.url.as_str();
        let target = Target::parse(url, config.ca.as_deref()).map_err(|e| StoreError::Invalid {
            what: "remote cache URL",
            detail: format!("{}: {e}", hide_password(url)),
        })?;
        Ok(RedisTier {
            target,
            timeout: config.timeout,
            shown: hide_password(url),
            metrics,
            link: Mutex::new(Link {
                idle: Vec::new(),
                state: State::Unknown,
                retry_at: None,
                backoff: MIN_BACKOFF,
            }),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Link> {
        self.link
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A connection: an idle one, else a new one unless the server is known to be down and its
    /// next attempt has not come.
    fn connection(&self, op: &'static str) -> Result<Conn> {
        {
            let mut link = self.lock();
            if let Some(c) = link.idle.pop() {
                return Ok(c);
            }
            if let Some(at) = link.retry_at {
                if Instant::now() < at {
                    self.metrics.skip();
                    return Err(StoreError::Remote {
                        op,
                        detail: format!("{} is unavailable (retrying later)", self.shown),
                    });
                }
            }
        }
        let started = Instant::now();
        let conn = Conn::open(&self.target, self.timeout);
        self.metrics.call(started.elapsed());
        // A refused login (a wrong password, an unknown database) leaves nothing to use: the
        // server is as good as down.
        conn.map_err(|e| {
            let e = match e {
                Failure::Refused(m) => Failure::Lost(std::io::Error::other(m)),
                lost => lost,
            };
            self.failed(op, &e)
        })
    }

    /// Counts and reports a failed call; a lost connection or a failed TLS handshake marks the
    /// server down.
    fn failed(&self, op: &'static str, e: &Failure) -> StoreError {
        let lost = matches!(e, Failure::Lost(_) | Failure::Tls(_));
        self.metrics.error();
        let mut link = self.lock();
        let state = match (lost, op) {
            (true, _) => State::Down,
            (false, "put") => State::Refusing,
            // A read refused says nothing about the server's state; it is counted.
            (false, _) => link.state,
        };
        if lost {
            link.idle.clear();
            link.retry_at = Some(Instant::now() + link.backoff);
            link.backoff = (link.backoff * 2).min(MAX_BACKOFF);
            self.metrics.set_up(false);
        }
        if link.state != state {
            link.state = state;
            drop(link);
            self.metrics.log(match state {
                State::Down => format!(
                    "remote cache: {} is unavailable ({e}); serving from the local tiers, \
                     reconnecting with backoff",
                    self.shown
                ),
                _ => format!("remote cache: {} refuses writes ({e})", self.shown),
            });
        }
        let detail = format!("{}: {e}", self.shown);
        match e {
            Failure::Tls(_) => StoreError::RemoteTls { op, detail },
            _ => StoreError::Remote { op, detail },
        }
    }

    /// Records a call that succeeded (a read, or a write when `wrote`).
    fn succeeded(&self, conn: Conn, wrote: bool) {
        let mut link = self.lock();
        link.idle.push(conn);
        link.retry_at = None;
        link.backoff = MIN_BACKOFF;
        self.metrics.set_up(true);
        let was = link.state;
        // A read says nothing about whether writes are refused.
        if was == State::Refusing && !wrote {
            return;
        }
        link.state = State::Up;
        drop(link);
        match was {
            State::Down => self
                .metrics
                .log(format!("remote cache: {} is reachable again", self.shown)),
            State::Refusing => self
                .metrics
                .log(format!("remote cache: {} accepts writes again", self.shown)),
            State::Unknown | State::Up => {}
        }
    }

    /// Runs `f` on a connection; a failure that may leave the connection mid-reply (I/O, a
    /// timeout, a reply that does not parse) drops it and marks the server down.
    fn call<T>(
        &self,
        op: &'static str,
        wrote: bool,
        f: impl FnOnce(&mut Conn) -> std::result::Result<T, Failure>,
    ) -> Result<T> {
        self.call_timed(op, wrote, &Cell::new(Duration::ZERO), f)
    }

    /// [`RedisTier::call`], its latency counted without the time `f` reports in `elsewhere`
    /// (a caller's work on the values as they arrive).
    fn call_timed<T>(
        &self,
        op: &'static str,
        wrote: bool,
        elsewhere: &Cell<Duration>,
        f: impl FnOnce(&mut Conn) -> std::result::Result<T, Failure>,
    ) -> Result<T> {
        let mut conn = self.connection(op)?;
        let started = Instant::now();
        let out = f(&mut conn);
        self.metrics
            .call(started.elapsed().saturating_sub(elsewhere.get()));
        match out {
            Ok(v) => {
                self.succeeded(conn, wrote);
                Ok(v)
            }
            Err(e) => {
                if matches!(e, Failure::Refused(_)) {
                    self.lock().idle.push(conn);
                }
                Err(self.failed(op, &e))
            }
        }
    }
}

fn unexpected(what: &str) -> Failure {
    Failure::Lost(std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        format!("an unexpected reply to {what}"),
    ))
}

impl RemoteTier for RedisTier {
    fn get_many(&self, keys: &[String]) -> Result<Vec<Option<Vec<u8>>>> {
        let mut values = Vec::with_capacity(keys.len());
        self.get_each(keys, &mut |v| {
            values.push(v);
            true
        })?;
        Ok(values)
    }

    fn get_each(
        &self,
        keys: &[String],
        each: &mut dyn FnMut(Option<Vec<u8>>) -> bool,
    ) -> Result<()> {
        if keys.is_empty() {
            return Ok(());
        }
        // The latency histogram counts the tier's time, not the caller's work on each value.
        let elsewhere = Cell::new(Duration::ZERO);
        self.call_timed("get", false, &elsewhere, |c| {
            let commands: Vec<Vec<&[u8]>> = keys
                .iter()
                .map(|k| vec![&b"GET"[..], k.as_bytes()])
                .collect();
            let mut odd = false;
            c.pipeline_within(&commands, GET_BUDGET, &mut |r| match r {
                Reply::Bulk(v) => {
                    let t = Instant::now();
                    let more = each(v);
                    elsewhere.set(elsewhere.get() + t.elapsed());
                    more
                }
                _ => {
                    odd = true;
                    false
                }
            })?;
            if odd {
                return Err(unexpected("GET"));
            }
            Ok(())
        })
    }

    fn exists_many(&self, keys: &[String]) -> Result<Vec<bool>> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        self.call("exists", false, |c| {
            let commands: Vec<Vec<&[u8]>> = keys
                .iter()
                .map(|k| vec![&b"EXISTS"[..], k.as_bytes()])
                .collect();
            c.pipeline(&commands)?
                .into_iter()
                .map(|r| match r {
                    Reply::Int(n) => Ok(n > 0),
                    _ => Err(unexpected("EXISTS")),
                })
                .collect()
        })
    }

    fn put_many(&self, items: &[(String, &[u8])]) -> Result<()> {
        if items.is_empty() {
            return Ok(());
        }
        self.call("put", true, |c| {
            let commands: Vec<Vec<&[u8]>> = items
                .iter()
                .map(|(k, v)| vec![&b"SET"[..], k.as_bytes(), *v])
                .collect();
            c.pipeline(&commands).map(drop)
        })
    }

    fn describe(&self) -> String {
        self.shown.clone()
    }
}

/// `url` with its password (if any) replaced by `***`, for logs and errors.
fn hide_password(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    match rest.split_once('@') {
        Some((auth, host)) if !auth.is_empty() => {
            let user = auth.split_once(':').map_or("", |(u, _)| u);
            format!("{scheme}://{user}:***@{host}")
        }
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::hide_password;

    #[test]
    fn passwords_never_reach_a_log_line() {
        assert_eq!(
            hide_password("redis://:s3cret@db:6379/2"),
            "redis://:***@db:6379/2"
        );
        assert_eq!(
            hide_password("redis://app:s3cret@db:6379"),
            "redis://app:***@db:6379"
        );
        assert_eq!(hide_password("redis://db:6379"), "redis://db:6379");
    }
}
