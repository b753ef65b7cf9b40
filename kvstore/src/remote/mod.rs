//! The remote tier: block records and manifests in a key-value store that several machines
//! share (Redis), below RAM and the local directory.
//!
//! Values are immutable and content-addressed: a block's key names the namespace, the model
//! fingerprint, the KV geometry (with its element types) and the block id, and its value is the
//! block record exactly as `ckptfmt` writes it to a file. A value read back is verified like a
//! file (magic, CRCs, owner, geometry, chained id); one that does not verify is a miss, counted
//! in [`RemoteFigures::rejected`], never used. Tails and named checkpoints go the same way, as
//! encoded manifests.
//!
//! The tier is a cache of a cache: every failure of it (absent, slow, refusing writes) makes a
//! call return an error that the store's operations turn into a miss, so a request is served
//! from the local tiers or by computing. [`RemoteTier`] is the seam a backend implements;
//! [`RedisTier`] (feature `redis`) is the one shipped.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ckptfmt::{BlockId, Fingerprint, Geometry};

use crate::error::Result;

#[cfg(feature = "cli")]
mod args;
mod ops;
#[cfg(feature = "redis")]
mod redis;
#[cfg(feature = "redis")]
mod resp;
#[cfg(all(feature = "redis", feature = "test-util"))]
pub mod testing;
#[cfg(feature = "tls")]
mod tls;

#[cfg(feature = "redis")]
pub use self::redis::RedisTier;
#[cfg(feature = "cli")]
pub use args::RemoteArgs;
pub use ops::RemoteFetch;

/// A store of immutable values by key, shared by several processes or machines: the seam
/// between the store and a backend. Each call is one round trip and fails within the
/// backend's timeout.
pub trait RemoteTier: Send + Sync + 'static {
    /// The values of `keys`, in order: `None` for a key the tier does not hold.
    fn get_many(&self, keys: &[String]) -> Result<Vec<Option<Vec<u8>>>>;
    /// The values of `keys` handed to `each` in order, as they arrive, until it returns false
    /// (the rest are then not fetched, or not all). The default fetches them all with
    /// [`RemoteTier::get_many`] first; a backend that streams overlaps the caller's work on
    /// one value with the transfer of the next.
    fn get_each(
        &self,
        keys: &[String],
        each: &mut dyn FnMut(Option<Vec<u8>>) -> bool,
    ) -> Result<()> {
        for v in self.get_many(keys)? {
            if !each(v) {
                break;
            }
        }
        Ok(())
    }
    /// Which of `keys` the tier holds, in order.
    fn exists_many(&self, keys: &[String]) -> Result<Vec<bool>>;
    /// Stores each value under its key. A key always names the same bytes, so storing one
    /// again changes nothing.
    fn put_many(&self, items: &[(String, &[u8])]) -> Result<()>;
    /// The tier in a log line (a URL without its password).
    fn describe(&self) -> String;
}

/// What opening a remote tier needs.
#[derive(Debug, Clone)]
pub struct RemoteConfig {
    /// Where the tier is: `redis://[:PASSWORD@]HOST:PORT[/DB]` (a Unix socket as
    /// `redis+unix:///PATH`); `rediss://` for TLS (feature `tls`), the server's certificate
    /// verified against [`RemoteConfig::ca`] or the system's CA certificates, and its name
    /// against HOST (`rediss://…#insecure` verifies neither).
    pub url: String,
    /// Prefix of every key, so several deployments can share one Redis.
    pub namespace: String,
    /// The longest any call to the tier may wait (connecting, each read, each write).
    pub timeout: Duration,
    /// For `rediss://`: a PEM file of the CA certificates to trust instead of the system's
    /// (a private CA).
    pub ca: Option<PathBuf>,
}

impl RemoteConfig {
    /// A tier at `url` under the default namespace (`llama-hdd`) and timeout (100 ms).
    pub fn new(url: impl Into<String>) -> Self {
        RemoteConfig {
            url: url.into(),
            namespace: "llama-hdd".to_owned(),
            timeout: Duration::from_millis(100),
            ca: None,
        }
    }
}

/// A remote tier as the store uses it: the backend, the key namespace and the counters.
/// Cheap to clone (shared).
#[derive(Clone)]
pub struct Remote {
    tier: Arc<dyn RemoteTier>,
    namespace: Arc<str>,
    metrics: Arc<RemoteMetrics>,
}

impl std::fmt::Debug for Remote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Remote")
            .field("tier", &self.tier.describe())
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

impl Remote {
    /// The tier `config` names. Nothing is connected yet: a Redis that is absent now is only
    /// a miss at each call until it appears. Fails only on a URL that cannot name a tier (or
    /// a CA file that cannot be read).
    #[cfg(feature = "redis")]
    pub fn open(config: &RemoteConfig) -> Result<Remote> {
        let metrics = Arc::new(RemoteMetrics::default());
        let tier = RedisTier::open(config, Arc::clone(&metrics))?;
        Ok(Remote::with_tier(
            Arc::new(tier),
            &config.namespace,
            metrics,
        ))
    }

    /// A remote over any backend (a test's, another product's); `metrics` are the counters the
    /// backend itself updates (errors, latency), if any.
    pub fn with_tier(
        tier: Arc<dyn RemoteTier>,
        namespace: &str,
        metrics: Arc<RemoteMetrics>,
    ) -> Remote {
        Remote {
            tier,
            namespace: namespace.into(),
            metrics,
        }
    }

    /// The counters.
    pub fn metrics(&self) -> &Arc<RemoteMetrics> {
        &self.metrics
    }

    /// The backend.
    pub fn tier(&self) -> &dyn RemoteTier {
        &*self.tier
    }

    /// The key of block `id` of a model.
    pub fn block_key(&self, fp: &Fingerprint, geometry: &Geometry, id: &BlockId) -> String {
        format!("{}:b:{}", self.model_prefix(fp, geometry), id.to_hex())
    }

    /// The key of the recurrent-state snapshot at the end of block `id` of a model.
    pub fn state_key(&self, fp: &Fingerprint, geometry: &Geometry, id: &BlockId) -> String {
        format!("{}:s:{}", self.model_prefix(fp, geometry), id.to_hex())
    }

    /// The key of checkpoint `name` of a model.
    pub fn manifest_key(&self, fp: &Fingerprint, geometry: &Geometry, name: &str) -> String {
        format!("{}:m:{name}", self.model_prefix(fp, geometry))
    }

    /// The key of the caller's value `name` of kind `kind` of a model
    /// ([`crate::ModelStore::push_remote_values`]).
    pub fn value_key(
        &self,
        fp: &Fingerprint,
        geometry: &Geometry,
        kind: &str,
        name: &str,
    ) -> String {
        format!("{}:v:{kind}:{name}", self.model_prefix(fp, geometry))
    }

    fn model_prefix(&self, fp: &Fingerprint, geometry: &Geometry) -> String {
        let digest = geometry.digest();
        let geometry: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
        format!("{}:{}:{geometry}", self.namespace, fp.to_hex())
    }
}

/// Upper bounds (microseconds) of the latency histogram's buckets; the last bucket is
/// everything slower.
pub const LATENCY_BOUNDS_US: [u64; 10] = [
    250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000,
];

/// The remote tier's counters since the store opened, updated by the store's operations and
/// the backend; [`RemoteMetrics::figures`] reads them.
#[derive(Default)]
pub struct RemoteMetrics {
    hits: AtomicU64,
    misses: AtomicU64,
    rejected: AtomicU64,
    bytes_read: AtomicU64,
    blocks_written: AtomicU64,
    manifests_written: AtomicU64,
    bytes_written: AtomicU64,
    errors: AtomicU64,
    skipped: AtomicU64,
    calls: AtomicU64,
    latency_sum_us: AtomicU64,
    latency: [AtomicU64; LATENCY_BOUNDS_US.len() + 1],
    up: AtomicU64,
    log: Mutex<Option<LogFn>>,
}

/// Where state changes are said.
type LogFn = Box<dyn Fn(String) + Send + Sync>;

impl RemoteMetrics {
    /// Where the tier's changes of state are said (once per change): a Redis that goes away,
    /// comes back or starts refusing writes. Without one they are not said.
    pub fn set_log(&self, log: impl Fn(String) + Send + Sync + 'static) {
        if let Ok(mut slot) = self.log.lock() {
            *slot = Some(Box::new(log));
        }
    }

    /// Says `line` where [`RemoteMetrics::set_log`] asked.
    pub fn log(&self, line: String) {
        if let Ok(slot) = self.log.lock() {
            if let Some(log) = slot.as_ref() {
                log(line);
            }
        }
    }

    /// Counts a value that failed verification (`what`: "a block", "a checkpoint") and says so
    /// the first time and then each time the count doubles, so that junk in Redis is seen in
    /// the log without flooding it.
    pub fn reject(&self, what: &str) {
        let n = self.rejected.fetch_add(1, Ordering::Relaxed) + 1;
        if n.is_power_of_two() {
            self.log(format!(
                "remote tier: rejected {what} that failed verification (damaged, foreign or \
                 another model's; not used); {n} rejected so far"
            ));
        }
    }

    /// Counts one call to the backend that took `elapsed`.
    pub fn call(&self, elapsed: Duration) {
        let us = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.latency_sum_us.fetch_add(us, Ordering::Relaxed);
        let bucket = LATENCY_BOUNDS_US
            .iter()
            .position(|&b| us <= b)
            .unwrap_or(LATENCY_BOUNDS_US.len());
        self.latency[bucket].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a failed call (the backend's error, a timeout, a refused write).
    pub fn error(&self) {
        self.errors.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a call not made because the backend is known to be down (it is retried later).
    pub fn skip(&self) {
        self.skipped.fetch_add(1, Ordering::Relaxed);
    }

    /// Records whether the backend answered its last call.
    pub fn set_up(&self, up: bool) {
        self.up.store(u64::from(up), Ordering::Relaxed);
    }

    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    /// A snapshot of the counters.
    pub fn figures(&self) -> RemoteFigures {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let mut latency = [0; LATENCY_BOUNDS_US.len() + 1];
        for (out, c) in latency.iter_mut().zip(&self.latency) {
            *out = get(c);
        }
        RemoteFigures {
            hits: get(&self.hits),
            misses: get(&self.misses),
            rejected: get(&self.rejected),
            bytes_read: get(&self.bytes_read),
            blocks_written: get(&self.blocks_written),
            manifests_written: get(&self.manifests_written),
            bytes_written: get(&self.bytes_written),
            errors: get(&self.errors),
            skipped: get(&self.skipped),
            calls: get(&self.calls),
            latency_sum_us: get(&self.latency_sum_us),
            latency,
            up: get(&self.up) == 1,
        }
    }
}

/// The remote tier's counters at one moment ([`RemoteMetrics::figures`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RemoteFigures {
    /// Blocks and manifests read from the tier and used.
    pub hits: u64,
    /// Blocks and manifests looked for and not held by the tier.
    pub misses: u64,
    /// Values read that did not verify (damaged, truncated, another model's): treated as
    /// misses.
    pub rejected: u64,
    /// Bytes of values read.
    pub bytes_read: u64,
    /// Block records written.
    pub blocks_written: u64,
    /// Manifests written.
    pub manifests_written: u64,
    /// Bytes of values written.
    pub bytes_written: u64,
    /// Calls that failed (unreachable, timed out, refused).
    pub errors: u64,
    /// Calls not made while the tier was known to be down.
    pub skipped: u64,
    /// Calls made.
    pub calls: u64,
    /// Sum of the calls' latencies, in microseconds.
    pub latency_sum_us: u64,
    /// Calls per latency bucket ([`LATENCY_BOUNDS_US`], then the slower ones).
    pub latency: [u64; LATENCY_BOUNDS_US.len() + 1],
    /// Whether the tier answered its last call.
    pub up: bool,
}
