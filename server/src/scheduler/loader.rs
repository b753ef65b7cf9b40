//! The loader thread: a waiting request's prefix lookup and block reads (file stats, reads,
//! verification, type conversion) run here, never on the scheduler thread, so a slow disk
//! delays only the request whose blocks are read while every other stream goes on. The
//! scheduler asks for at most one load per slot at a time; a request joins the batch once its
//! blocks are in memory, and importing them is a memory copy.

use std::sync::mpsc as std_mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;

use engine::store::{LoadedPrefix, SessionStore};
use engine::KvLayout;
use tokio::sync::mpsc;

use super::Command;
use crate::metrics::Metrics;

/// What the loader is asked to read.
struct Request {
    id: u64,
    tokens: Vec<u32>,
    skip: usize,
    layout: KvLayout,
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
                    let prefix = match store.load_prefix(&r.layout, &r.tokens, r.skip) {
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
    pub fn ask(&self, id: u64, tokens: Vec<u32>, skip: usize, layout: KvLayout) {
        if let Some(tx) = &self.requests {
            let _ = tx.send(Request {
                id,
                tokens,
                skip,
                layout,
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
