//! The write-behind thread that puts new KV blocks and tails into the store without delaying
//! any response, keeping the disk budget as it writes; pins and namespace clears go through it
//! too, in order. What it did is told to the server through [`Events`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;

use engine::store::{BlockCopy, SessionStore};

use crate::{StoreExt as _, TailBlock};

/// What the writer tells its owner (the server's metrics and log).
pub trait Events: Send + Sync {
    /// Whether a request is being evaluated now: the writer lets it go first, for a while.
    fn evaluating(&self) -> bool;
    /// Blocks and tails not stored because the queue was full.
    fn writes_dropped(&self, items: u64);
    /// Blocks put into the store.
    fn blocks_written(&self, n: u64);
    /// Tails stored.
    fn tails_written(&self, n: u64);
    /// A round done (room made, blocks and tails written, flushed), and how long it took.
    fn round(&self, took: std::time::Duration);
    /// A line for the log: a change of state (the queue full, and drained).
    fn log(&self, line: String);
    /// The filesystem was found full (said once until writes succeed again): from now on the
    /// cache keeps within `capacity` bytes, the oldest cached prompts making room.
    fn disk_full(&self, error: &engine::Error, capacity: u64);
    /// Writes succeed again after [`Events::disk_full`].
    fn disk_writable(&self);
    /// A failure that costs only speed (a write, a pin, a clear).
    fn cache_error(&self, what: String);
}

/// What a finished request leaves for the store: its new full blocks and the partly filled
/// pages after them (see [`PromptCache::tail_of`](crate::PromptCache::tail_of)).
#[derive(Debug, Default)]
pub struct Work {
    /// Full pages the store lacked.
    pub blocks: Vec<BlockCopy>,
    /// Tails of the prompt and of the whole sequence.
    pub tails: Vec<TailBlock>,
    /// Prefixes to pin once the blocks above are stored.
    pub pins: Vec<PinWork>,
    /// Namespaces to clear, after everything queued before.
    pub clears: Vec<ClearWork>,
    /// A prompt's blocks handed over as soon as it was evaluated, for the remote tier: written
    /// at once (not after the requests being evaluated), to Redis first, so other replicas
    /// find them while this one still generates.
    pub urgent: bool,
}

/// A namespace to clear
/// ([`PromptCache::clear_namespace`](crate::PromptCache::clear_namespace)),
/// answered once done.
#[derive(Debug)]
pub struct ClearWork {
    /// The namespace.
    pub namespace: engine::Namespace,
    /// The tenant clearing it ([`pin_key`]): another tenant's pins in the namespace stay.
    pub tenant: Option<String>,
    /// Where the outcome goes.
    pub reply: tokio::sync::oneshot::Sender<Result<crate::Cleared, String>>,
}

impl ClearWork {
    /// Whether the pin stored as `stored` goes with the namespace: the tenant's own, and those
    /// that name no tenant (a server's without keys, or an older version's).
    pub fn clears_pin(&self, stored: &str) -> bool {
        !stored.contains(TENANT_MARK) || pin_of(self.tenant.as_deref(), stored).is_some()
    }
}

/// What separates a tenant from a pin's id in the id a pin is stored under (a client's pin id
/// never holds it).
const TENANT_MARK: char = '.';

/// The id that pin `id` of `tenant` is stored under: `TENANT.ID`, or `ID` alone without a
/// tenant; so two tenants' pins of one id are two pins.
pub fn pin_key(tenant: Option<&str>, id: &str) -> String {
    match tenant {
        Some(t) => format!("{t}{TENANT_MARK}{id}"),
        None => id.to_owned(),
    }
}

/// The id `tenant` knows the pin stored as `stored` by; `None` when it is another tenant's.
pub fn pin_of<'a>(tenant: Option<&str>, stored: &'a str) -> Option<&'a str> {
    match tenant {
        Some(t) => stored.strip_prefix(t)?.strip_prefix(TENANT_MARK),
        None => (!stored.contains(TENANT_MARK)).then_some(stored),
    }
}

/// A prefix to pin ([`PromptCache::pin`](crate::PromptCache::pin)),
/// answered once the writer has stored it.
#[derive(Debug)]
pub struct PinWork {
    /// The pin's id.
    pub id: String,
    /// Its tokens (whole blocks).
    pub tokens: Vec<u32>,
    /// Its namespace.
    pub namespace: Option<engine::Namespace>,
    /// When it expires (seconds since the epoch).
    pub expires_unix: Option<u64>,
    /// Where the outcome goes: the tokens pinned.
    pub reply: tokio::sync::oneshot::Sender<Result<usize, String>>,
}

impl Work {
    /// KV bytes it holds (what it costs in memory while queued).
    fn bytes(&self) -> u64 {
        let blocks: usize = self.blocks.iter().map(|b| b.kv.len()).sum();
        let tails: usize = self.tails.iter().map(|t| t.kv.len()).sum();
        (blocks + tails) as u64
    }

    fn items(&self) -> u64 {
        (self.blocks.len() + self.tails.len()) as u64
    }
}

/// Bytes the write-behind queue holds at most: work that would go past it is dropped and
/// counted ([`Events::writes_dropped`]) rather than waited for, so a slow or stuck disk
/// costs memory only up to this and never delays a response.
pub const MAX_QUEUED_BYTES: u64 = 512 << 20;

/// The write-behind thread: blocks copied out of the KV pool by the scheduler (a memory copy)
/// are put into the store here, then flushed to disk, so a restart or a crash loses at most the
/// blocks still in this thread's queue.
pub struct Writer {
    tx: Option<mpsc::Sender<Work>>,
    thread: Option<JoinHandle<()>>,
    /// Bytes sent and not yet written.
    queued: Arc<AtomicU64>,
    metrics: Arc<dyn Events>,
    /// Whether the last work offered was dropped (the log says so once per change).
    dropping: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Writer")
            .field("queued", &self.queued)
            .finish_non_exhaustive()
    }
}

impl Writer {
    /// Starts the thread over `store`, telling `metrics` what it does.
    pub fn start(store: Arc<SessionStore>, metrics: Arc<dyn Events>) -> Writer {
        let (tx, rx) = mpsc::channel::<Work>();
        let queued = Arc::new(AtomicU64::new(0));
        let thread = {
            let (metrics, queued) = (Arc::clone(&metrics), Arc::clone(&queued));
            std::thread::Builder::new()
                .name("cache-writer".into())
                .spawn(move || write_behind(&store, &*metrics, &rx, &queued))
                .ok()
        };
        Writer {
            tx: Some(tx),
            thread,
            queued,
            metrics,
            dropping: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Queues blocks and tails for the store; never blocks. Work that would take the queue
    /// past [`MAX_QUEUED_BYTES`] is dropped and counted.
    pub fn send(&self, work: Work) {
        self.send_within(work, MAX_QUEUED_BYTES);
    }

    /// [`Writer::send`] with a queue of at most `limit` bytes.
    fn send_within(&self, work: Work, limit: u64) {
        if work.blocks.is_empty()
            && work.tails.is_empty()
            && work.pins.is_empty()
            && work.clears.is_empty()
        {
            return;
        }
        let bytes = work.bytes();
        // A pin or a clear is asked for by an operator and waited for: never dropped.
        let must = !work.pins.is_empty() || !work.clears.is_empty();
        let admitted = self
            .queued
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |q| {
                (must || q == 0 || q + bytes <= limit).then_some(q + bytes)
            })
            .is_ok();
        let was_dropping = self.dropping.swap(!admitted, Ordering::Relaxed);
        if !admitted {
            self.metrics.writes_dropped(work.items());
            if !was_dropping {
                self.metrics.log(format!(
                    "prompt cache: the write queue is full ({} MiB waiting for the disk); \
                     new blocks are dropped, not stored, until it drains",
                    self.queued.load(Ordering::Relaxed) >> 20
                ));
            }
            return;
        }
        if was_dropping {
            self.metrics
                .log("prompt cache: the write queue drained; storing again".to_owned());
        }
        if let Some(tx) = &self.tx {
            // The thread only ends after `finish`; a send to a thread that died is lost, as a
            // crash would lose it.
            let _ = tx.send(work);
        }
    }

    /// Writes everything queued, flushes, and ends the thread.
    pub fn finish(mut self) {
        self.tx = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.tx = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The longest the writer waits for the requests being evaluated before it writes anyway.
const MAX_DEFER: std::time::Duration = std::time::Duration::from_millis(500);

/// The writer thread's loop: put what arrives, store the tails (each commits its blocks),
/// flush whenever the queue runs dry, keep the disk budget with unreferenced blocks and old
/// tails.
fn write_behind(
    store: &SessionStore,
    metrics: &dyn Events,
    rx: &mpsc::Receiver<Work>,
    queued: &AtomicU64,
) {
    let mut full = FullDisk::default();
    while let Ok(work) = rx.recv() {
        // Hashing, copying and syncing megabytes takes a core from the kernels' threads: let a
        // request that is being evaluated (a repeated prompt is answered in tens of ms) go
        // first, for up to `MAX_DEFER`.
        // Idle means no request for a few polls in a row: a client's next request often
        // follows its last response within a millisecond.
        let deferred = std::time::Instant::now();
        let mut idle_polls = if work.urgent { 4 } else { 0 };
        while idle_polls < 4 && deferred.elapsed() < MAX_DEFER {
            std::thread::sleep(std::time::Duration::from_millis(3));
            if !metrics.evaluating() {
                idle_polls += 1;
            } else {
                idle_polls = 0;
            }
        }
        let round = std::time::Instant::now();
        let mut batches = vec![work];
        batches.extend(rx.try_iter());
        let taken: u64 = batches.iter().map(Work::bytes).sum();
        // Room first, then the writes: the directory stays within the disk budget while they
        // go on, not only after.
        let incoming: u64 = batches
            .iter()
            .map(|w| store.prompt_cache().incoming_bytes(&w.blocks, &w.tails))
            .sum();
        if let Err(e) = store.prompt_cache().make_room(incoming) {
            metrics.cache_error(format!("keeping the disk budget failed: {e}"));
        }
        let mut blocks = Vec::new();
        let mut tails = Vec::new();
        let mut pins = Vec::new();
        let mut clears = Vec::new();
        for work in batches {
            blocks.extend(work.blocks);
            tails.extend(work.tails);
            pins.extend(work.pins);
            clears.extend(work.clears);
        }
        // A later tail of the same blocks replaces an earlier one: store only the last, in
        // the order they came (the newest tail is the last to go under the disk budget).
        let last: std::collections::HashMap<_, _> = tails
            .iter()
            .enumerate()
            .map(|(i, t)| (t.last_block, i))
            .collect();
        let tails: Vec<TailBlock> = tails
            .into_iter()
            .enumerate()
            .filter(|(i, t)| last.get(&t.last_block) == Some(i))
            .map(|(_, t)| t)
            .collect();
        // The remote tier first, if any (other replicas wait for it; this one has the pages in
        // memory): the blocks it lacks and the tails. A failure there is counted and logged by
        // the tier; the local store gets them either way.
        let _ = store.prompt_cache().push_remote(&blocks, &tails);
        match write_round(store, metrics, &blocks, &tails) {
            Ok(()) => full.recovered(metrics),
            Err(e) => {
                // A full filesystem: what the cache takes now is all it can take. That becomes
                // a budget, the oldest prompts make room for this round, and it is written
                // again; later rounds make room before they write.
                let cap = store.learn_capacity().unwrap_or(0);
                full.report(metrics, &e, cap);
                if let Err(e) = store.prompt_cache().make_room(incoming) {
                    metrics.cache_error(format!("making room on a full disk failed: {e}"));
                }
                if let Err(e) = write_round(store, metrics, &blocks, &tails) {
                    metrics.cache_error(format!("storing on a full disk failed: {e}"));
                }
            }
        }
        for pin in pins {
            let result = store
                .prompt_cache()
                .pin(&pin.id, &pin.tokens, pin.namespace, pin.expires_unix)
                .map_err(|e| e.to_string());
            if let Err(e) = &result {
                metrics.cache_error(format!("pinning {} failed: {e}", pin.id));
            }
            let _ = pin.reply.send(result);
        }
        for clear in clears {
            let result = store
                .prompt_cache()
                .clear_namespace(clear.namespace, &|pin| clear.clears_pin(pin))
                .map_err(|e| e.to_string());
            if let Err(e) = &result {
                metrics.cache_error(format!("clearing a namespace failed: {e}"));
            }
            let _ = clear.reply.send(result);
        }
        // The store's one budget policy: unreferenced blocks, then the least recently used
        // checkpoints, tails and `/slots` saves alike (pins and claimed names stay).
        if let Err(e) = store.prompt_cache().collect_unreferenced() {
            metrics.cache_error(format!("keeping the disk budget failed: {e}"));
        }
        queued.fetch_sub(taken, Ordering::AcqRel);
        metrics.round(round.elapsed());
    }
}

/// Puts `blocks` and flushes them a piece at a time ([`PIECE_BLOCKS`], each waiting its turn:
/// [`wait_turn`]), stores `tails` and flushes, counting what was written; a failure for want
/// of space stops the round and is returned (other failures are counted and the round goes on).
fn write_round(
    store: &SessionStore,
    metrics: &dyn Events,
    blocks: &[BlockCopy],
    tails: &[TailBlock],
) -> Result<(), engine::Error> {
    for piece in blocks.chunks(PIECE_BLOCKS) {
        wait_turn(metrics);
        match store.put_blocks(piece.to_vec()) {
            Ok(n) => metrics.blocks_written(n as u64),
            Err(e) if is_no_space(&e) => return Err(e),
            Err(e) => metrics.cache_error(format!("storing blocks failed: {e}")),
        }
        if blocks.len() > PIECE_BLOCKS {
            flush(store, metrics)?;
        }
    }
    if !tails.is_empty() {
        wait_turn(metrics);
    }
    for tail in tails {
        match store.prompt_cache().put_tail(tail.clone()) {
            Ok(()) => metrics.tails_written(1),
            Err(e) if is_no_space(&e) => return Err(e),
            Err(e) => metrics.cache_error(format!("storing a tail failed: {e}")),
        }
    }
    flush(store, metrics)
}

/// Blocks stored (hashed, copied, written and synced) in one go at most: a few MB, a few
/// milliseconds of one core, after which a request being evaluated goes first again.
const PIECE_BLOCKS: usize = 4;

/// How long one piece waits for the requests being evaluated at most: under steady load the
/// writer still stores a piece this often.
const PIECE_DEFER: std::time::Duration = std::time::Duration::from_millis(50);

/// Waits while a request is being evaluated, up to [`PIECE_DEFER`]: the writer's pieces go
/// between requests (or between a request's steps, at worst one piece per [`PIECE_DEFER`]).
fn wait_turn(metrics: &dyn Events) {
    let asked = std::time::Instant::now();
    while metrics.evaluating() && asked.elapsed() < PIECE_DEFER {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// Flushes the store's written blocks to disk; a failure for want of space is returned, any
/// other counted.
fn flush(store: &SessionStore, metrics: &dyn Events) -> Result<(), engine::Error> {
    match store.flush() {
        Ok(()) => Ok(()),
        Err(e) if is_no_space(&e) => Err(e),
        Err(e) => {
            metrics.cache_error(format!("flush failed: {e}"));
            Ok(())
        }
    }
}

fn is_no_space(e: &engine::Error) -> bool {
    e.store_kind() == Some(engine::StoreErrorKind::NoSpace)
}

/// Whether the cache's filesystem was last seen full: said in the log once when it fills and
/// once when writes succeed again, not at every failed write.
#[derive(Default)]
struct FullDisk(bool);

impl FullDisk {
    fn report(&mut self, metrics: &dyn Events, e: &engine::Error, cap: u64) {
        metrics.cache_error(format!("the disk is full: {e}"));
        if !std::mem::replace(&mut self.0, true) {
            metrics.disk_full(e, cap);
        }
    }

    fn recovered(&mut self, metrics: &dyn Events) {
        if std::mem::replace(&mut self.0, false) {
            metrics.disk_writable();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use engine::testing::TinyChatModel;
    use std::sync::atomic::AtomicBool;

    /// What a writer reported, as far as these tests look; it is evaluating while `busy`.
    #[derive(Default)]
    struct Counts {
        busy: AtomicBool,
        dropped: AtomicU64,
    }

    impl Events for Counts {
        fn evaluating(&self) -> bool {
            self.busy.load(Ordering::Relaxed)
        }
        fn writes_dropped(&self, items: u64) {
            self.dropped.fetch_add(items, Ordering::Relaxed);
        }
        fn blocks_written(&self, _: u64) {}
        fn tails_written(&self, _: u64) {}
        fn round(&self, _: std::time::Duration) {}
        fn log(&self, _: String) {}
        fn disk_full(&self, _: &engine::Error, _: u64) {}
        fn disk_writable(&self) {}
        fn cache_error(&self, _: String) {}
    }

    /// A tail of `bytes` KV bytes (not a valid one: the writer's failure to store it is
    /// counted as a cache error, which does not matter here).
    fn work(bytes: usize, n: u8) -> Work {
        Work {
            blocks: Vec::new(),
            tails: vec![TailBlock {
                tokens: vec![1, 2, 3],
                kv: vec![0; bytes],
                last_block: engine::BlockId([n; 32]),
                namespace: None,
                expires_unix: None,
                state: None,
            }],
            pins: Vec::new(),
            clears: Vec::new(),
            urgent: false,
        }
    }

    #[test]
    fn a_full_write_queue_drops_and_counts_rather_than_waits() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tiny.gguf");
        TinyChatModel::default().write(&path).unwrap();
        let model = engine::Model::load(&path).unwrap();
        let store = Arc::new(
            SessionStore::open(&dir.path().join("cache"), &model, Default::default()).unwrap(),
        );
        let metrics = Arc::new(Counts::default());
        // A request is being evaluated: the writer waits before it takes the queue.
        metrics.busy.store(true, Ordering::Relaxed);
        let writer = Writer::start(store, Arc::clone(&metrics) as Arc<dyn Events>);
        writer.send_within(work(1 << 20, 1), 3 << 19);
        writer.send_within(work(1 << 20, 2), 3 << 19);
        writer.send_within(work(1 << 19, 3), 3 << 19);
        // Counted while the writer still holds off (`busy`): a sender that waited for room
        // instead would have dropped nothing.
        assert_eq!(
            metrics.dropped.load(Ordering::Relaxed),
            1,
            "the second tail goes past 1.5 MiB; the third fits"
        );
        metrics.busy.store(false, Ordering::Relaxed);
        writer.finish();
    }

    #[test]
    fn a_tenants_pins_are_its_own() {
        let (a, b) = (Some("aaaa"), Some("bbbb"));
        assert_eq!(pin_key(a, "x"), "aaaa.x");
        assert_eq!(pin_key(None, "x"), "x");
        assert_eq!(pin_of(a, "aaaa.x"), Some("x"));
        assert_eq!(pin_of(b, "aaaa.x"), None);
        assert_eq!(pin_of(a, "x"), None, "a pin of no tenant is no tenant's");
        assert_eq!(pin_of(None, "x"), Some("x"));
        assert_eq!(pin_of(None, "aaaa.x"), None);
        let (reply, _) = tokio::sync::oneshot::channel();
        let clear = ClearWork {
            namespace: engine::Namespace::new(&[b"n"]),
            tenant: Some("aaaa".into()),
            reply,
        };
        assert!(clear.clears_pin("aaaa.x") && clear.clears_pin("x"));
        assert!(!clear.clears_pin("bbbb.x"));
    }
}
