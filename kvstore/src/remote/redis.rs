//! [`RedisTier`]: the remote tier on Redis (or Valkey), with timeouts on every call, a
//! connection per concurrent caller, and reconnection with backoff.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::{Client, Connection, RedisError};

use super::{RemoteMetrics, RemoteTier};
use crate::error::{Result, StoreError};

/// The first wait before connecting again after a failure; it doubles up to [`MAX_BACKOFF`].
const MIN_BACKOFF: Duration = Duration::from_millis(100);
/// The longest wait between two connection attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// A Redis server as the remote tier. Values are plain strings (`GET`/`SET`); the server's own
/// eviction (`maxmemory` with an LRU policy) bounds what it holds.
pub struct RedisTier {
    client: Client,
    timeout: Duration,
    shown: String,
    metrics: Arc<RemoteMetrics>,
    link: Mutex<Link>,
}

/// The connections and what the last calls found.
struct Link {
    /// Connections not in use.
    idle: Vec<Connection>,
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
    /// The Redis at `url`; nothing is connected until the first call. `timeout` bounds the
    /// connection and each read and write of every call.
    pub fn open(url: &str, timeout: Duration, metrics: Arc<RemoteMetrics>) -> Result<RedisTier> {
        let client = Client::open(url).map_err(|e| StoreError::Invalid {
            what: "remote cache URL",
            detail: format!("{}: {e}", hide_password(url)),
        })?;
        Ok(RedisTier {
            client,
            timeout,
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
    fn connection(&self, op: &'static str) -> Result<Connection> {
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
        let conn = self
            .client
            .get_connection_with_timeout(self.timeout)
            .and_then(|c| {
                c.set_read_timeout(Some(self.timeout))?;
                c.set_write_timeout(Some(self.timeout))?;
                Ok(c)
            });
        self.metrics.call(started.elapsed());
        conn.map_err(|e| self.failed(op, &e, true))
    }

    /// Counts and reports a failed call; `lost` drops the connection state to down.
    fn failed(&self, op: &'static str, e: &RedisError, lost: bool) -> StoreError {
        self.metrics.error();
        let mut link = self.lock();
        let state = if lost { State::Down } else { State::Refusing };
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
        StoreError::Remote {
            op,
            detail: format!("{}: {e}", self.shown),
        }
    }

    /// Records a call that succeeded (a read, or a write when `wrote`).
    fn succeeded(&self, conn: Connection, wrote: bool) {
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
    /// timeout) drops it and marks the server down.
    fn call<T>(
        &self,
        op: &'static str,
        wrote: bool,
        f: impl FnOnce(&mut Connection) -> redis::RedisResult<T>,
    ) -> Result<T> {
        let mut conn = self.connection(op)?;
        let started = Instant::now();
        let out = f(&mut conn);
        self.metrics.call(started.elapsed());
        match out {
            Ok(v) => {
                self.succeeded(conn, wrote);
                Ok(v)
            }
            Err(e) => {
                let lost = e.is_io_error()
                    || e.is_timeout()
                    || e.is_connection_dropped()
                    || e.is_unrecoverable_error();
                if !lost {
                    self.lock().idle.push(conn);
                }
                Err(self.failed(op, &e, lost))
            }
        }
    }
}

impl RemoteTier for RedisTier {
    fn get_many(&self, keys: &[String]) -> Result<Vec<Option<Vec<u8>>>> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        self.call("get", false, |c| redis::cmd("MGET").arg(keys).query(c))
    }

    fn exists_many(&self, keys: &[String]) -> Result<Vec<bool>> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        self.call("exists", false, |c| {
            let mut pipe = redis::pipe();
            for k in keys {
                pipe.cmd("EXISTS").arg(k);
            }
            pipe.query(c)
        })
    }

    fn put_many(&self, items: &[(String, &[u8])]) -> Result<()> {
        if items.is_empty() {
            return Ok(());
        }
        self.call("put", true, |c| {
            let mut pipe = redis::pipe();
            for (k, v) in items {
                pipe.cmd("SET").arg(k).arg(*v).ignore();
            }
            pipe.exec(c)
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
        Some((auth, host)) if auth.contains(':') || !auth.is_empty() => {
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
