//! The loader thread: a waiting request's prefix lookup and block reads (file stats, reads,
//! verification, type conversion) run here, never on the scheduler thread, so a slow disk
//! delays only the request whose blocks are read while every other stream goes on. The
//! scheduler asks for at most one load per slot at a time; a request joins the batch once its
//! blocks are in memory, and importing them is a memory copy.

use std::sync::mpsc as std_mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;

use engine::store::LoadedPrefix;
use engine::store::SessionStore;
use engine::KvLayout;
use promptcache::StoreExt as _;
use tokio::sync::mpsc;

use engine::PAGE_TOKENS;

use super::{Command, Job, Scheduler};
use crate::metrics::Metrics;

/// What the loader is asked to read.
struct Request {
    id: u64,
    tokens: Vec<u32>,
    skip: usize,
    layout: KvLayout,
    namespace: Option<engine::Namespace>,
}

/// A finished load: the prefix read for request `id` (`None` when the store held nothing of
/// it, or nothing could be read).
pub(super) struct Loaded {
    pub id: u64,
    pub prefix: Option<Box<LoadedPrefix>>,
}

/// The loader thread and its two channels.
pub(super) struct Loader {
    requests: Option<std_mpsc::Sender<Request>>,
    done: std_mpsc::Receiver<Loaded>,
    thread: Option<JoinHandle<()>>,
}

impl Loader {
    /// Starts the thread; after each load it sends [`Command::Wake`] through `wake` (while the
    /// scheduler's channel is open) so that an idle scheduler picks the result up.
    pub fn start(
        store: Arc<SessionStore>,
        metrics: Arc<Metrics>,
        wake: mpsc::WeakUnboundedSender<Command>,
    ) -> Loader {
        let (requests, rx) = std_mpsc::channel::<Request>();
        let (done_tx, done) = std_mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("loader".into())
            .spawn(move || {
                for r in rx {
                    let prefix = match store.prompt_cache().load_prefix(
                        &r.layout,
                        &r.tokens,
                        r.skip,
                        r.namespace,
                    ) {
                        Ok(p) if p.tokens() > 0 => Some(Box::new(p)),
                        Ok(_) => None,
                        Err(e) => {
                            metrics.cache_error(format!("prefix lookup failed: {e}"));
                            None
                        }
                    };
                    if done_tx.send(Loaded { id: r.id, prefix }).is_err() {
                        return;
                    }
                    if let Some(tx) = wake.upgrade() {
                        let _ = tx.send(Command::Wake);
                    }
                }
            })
            .expect("spawning the loader thread");
        Loader {
            requests: Some(requests),
            done,
            thread: Some(thread),
        }
    }

    /// Asks for the stored prefix of `tokens` beyond its first `skip` blocks, in `layout`'s
    /// types, for request `id`.
    pub fn ask(
        &self,
        id: u64,
        tokens: Vec<u32>,
        skip: usize,
        layout: KvLayout,
        namespace: Option<engine::Namespace>,
    ) {
        if let Some(tx) = &self.requests {
            let _ = tx.send(Request {
                id,
                tokens,
                skip,
                layout,
                namespace,
            });
        }
    }

    /// A finished load, if one is waiting.
    pub fn try_done(&self) -> Option<Loaded> {
        self.done.try_recv().ok()
    }

    /// Waits for the next finished load (`None` if the thread is gone).
    pub fn wait_done(&self) -> Option<Loaded> {
        self.done.recv().ok()
    }
}

impl Drop for Loader {
    fn drop(&mut self) {
        self.requests = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Where a waiting request's stored prefix stands.
pub(super) enum Load {
    /// Not looked up yet.
    NotAsked,
    /// The loader is reading it (the number of the load).
    Asked(u64),
    /// Read (`None`: nothing to take from the store).
    Done(Option<Box<LoadedPrefix>>),
}

/// A request waiting for a slot.
pub(super) struct Queued {
    pub(super) job: Job,
    pub(super) load: Load,
}

impl Scheduler {
    /// Whether a load is being read for a waiting request.
    pub(super) fn loading(&self) -> bool {
        self.queue.iter().any(|q| matches!(q.load, Load::Asked(_)))
    }

    /// Hands finished loads to their requests.
    pub(super) fn collect_loads(&mut self) {
        while let Some(done) = self.loader.as_ref().and_then(Loader::try_done) {
            self.take_load(done);
        }
    }

    pub(super) fn take_load(&mut self, done: Loaded) {
        // A request cancelled meanwhile is gone from the queue: its load is dropped.
        if let Some(q) = self
            .queue
            .iter_mut()
            .find(|q| matches!(q.load, Load::Asked(id) if id == done.id))
        {
            q.load = Load::Done(done.prefix);
        }
    }

    /// Asks the loader for the stored prefixes of the first waiting requests (as many as there
    /// are slots), unless memory holds all they could take from the store.
    pub(super) fn ask_loads(&mut self) {
        let Some(loader) = &self.loader else { return };
        let n = self.queue.len().min(self.slots.len());
        for i in 0..n {
            let q = &self.queue[i];
            if !matches!(q.load, Load::NotAsked) {
                continue;
            }
            let prompt = &q.job.prompt;
            let usable = &prompt[..prompt.len().saturating_sub(1)];
            let ns = q.job.params.namespace;
            let in_pool = self.ctx.resident_prefix(usable, ns);
            let resident = self.longest_resident(usable, ns).map_or(0, |(n, _)| n);
            if !q.job.params.cache_prompt || in_pool.max(resident) >= usable.len() {
                self.queue[i].load = Load::Done(None);
                continue;
            }
            self.loads += 1;
            loader.ask(
                self.loads,
                usable.to_vec(),
                in_pool / PAGE_TOKENS,
                self.ctx.kv_layout().clone(),
                ns,
            );
            self.queue[i].load = Load::Asked(self.loads);
        }
    }
}
