//! The scheduler: one thread owns the engine's [`Context`] and runs continuous batching over
//! every active request. Each step builds one [`Batch`](engine::Batch): one decode token of each
//! generating request, then prefill chunks of new ones up to `n_batch` tokens; the sampled tokens
//! go back to each request's channel. HTTP handlers talk to it only through channels, so nothing
//! they do blocks a step, and a request whose receiver is gone (the client left) is cancelled at
//! the next step.
//!
//! The prompt cache lives here too: finished sequences stay resident as an LRU list while the
//! pool has room, and a new request starts from the longest prefix found in the pool (pages
//! shared by block id) or in the store (blocks read into free pages), computing only the rest.
//! Its new full blocks are copied out after it finishes and handed to the write-behind thread.
//!
//! This file holds the state (`Scheduler`, `Slot`, `Active`), [`spawn`] and the command
//! loop; `admit.rs` takes waiting requests into slots, `step.rs` builds and runs each batch,
//! `stream.rs` handles each sampled token and ends requests, `gauges.rs` publishes the gauges,
//! `reuse.rs` keeps the prompt cache, `loader.rs` reads stored prefixes off the thread.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use engine::sampling::Sampler;
use engine::store::SessionStore;
use engine::tokenizer::StreamDecoder;
use engine::{Context, Model, SeqId};
use tokio::sync::mpsc;

use crate::cache::Writer;

mod admit;
mod gauges;
mod loader;
mod reuse;
mod sample;
mod shift;
mod sleep;
mod slots;
mod spec;
pub use slots::{slot_file, SlotScope};
pub use spec::{DraftCounts, SpecRequest, Speculation};
mod step;
mod stream;
mod types;

pub use types::{
    Chunk, Command, Event, Finish, FinishReason, GenParams, Job, Parts, Progress, ReasoningBudget,
    SlotAction, TokenProbs,
};

use crate::error::{Result, ServerError};
use crate::metrics::Metrics;
use loader::{Load, Loader, Queued};
use reuse::{recv_timeout, recv_within, EXPORT_IDLE};

/// Finished sequences kept resident at most (each holds at least its partial last page).
const MAX_CACHED: usize = 256;

/// A finished sequence whose pages wait to be copied out for the store.
struct Export {
    seq: SeqId,
    /// Prompt tokens that came from a cache.
    cache_n: usize,
    prompt_len: usize,
    /// When it finished (or the first of a chain of takeovers it ends).
    since: Instant,
    /// When its stored tails expire.
    expires: Option<u64>,
    /// Leading full pages already handed to the writer.
    sent: usize,
}

/// What a request inherits of the export of the sequence it took over.
#[derive(Clone, Copy, Debug)]
struct Inherited {
    /// When the chain of takeovers began.
    since: Instant,
    /// Leading full pages already handed to the writer.
    sent: usize,
    /// Full pages kept from the sequence taken over: the ones this export covers.
    kept: usize,
}

/// A request being evaluated.
struct Active {
    events: mpsc::UnboundedSender<Event>,
    params: GenParams,
    seq: SeqId,
    prompt: Vec<u32>,
    /// Prompt tokens the sequence holds.
    fed: usize,
    cache_n: usize,
    /// The export of the sequence it took over, if that one's leading pages were left for
    /// this request's ([`Scheduler::export_from`]): due as early, and copied a piece at a
    /// time between this request's steps once due ([`Scheduler::export_due`]).
    inherited: Option<Inherited>,
    sampler: Sampler,
    decoder: StreamDecoder,
    generated: Vec<u32>,
    /// The request's stop strings, and the one found, if any.
    stops: engine::StopStrings,
    stopping_word: String,
    /// Generated text so far, and how much of it was sent.
    text: String,
    sent: usize,
    /// Tokens (and their probabilities) generated since the last chunk.
    unsent: Vec<u32>,
    unsent_probs: Vec<TokenProbs>,
    /// Every token's probabilities, for the final answer.
    probs: Vec<TokenProbs>,
    /// A sampled token to feed at the next step.
    pending: Option<u32>,
    /// The grammar's state, when the output must follow one.
    constraint: Option<engine::constraint::Constraint>,
    admitted: Instant,
    first_token: Option<Instant>,
    /// Order of admission, to pick the newest when the pool runs out.
    ticket: u64,
    /// [`Scheduler::work`] at admission: with the prompt tokens left, the point of that clock by
    /// which the prompt would be read if it ran alone (its prefill chunks' order).
    arrival_work: u64,
    /// An earlier request still computing a longer common prefix (its sequence, the prefix's
    /// length): this one waits for it and forks those tokens instead of computing them too.
    follow: Option<(SeqId, usize)>,
    /// Tokens dropped by context shifts.
    shifted: usize,
    /// A context shift was made (or tried): the sequence is no longer the plain evaluation
    /// of its tokens, so it is not cached.
    truncated: bool,
    /// Cached KV was moved into place by `--cache-reuse`: not cached either.
    moved: bool,
    /// Tokens generated inside the open thinking block, while a reasoning budget applies.
    thinking: usize,
    /// Tokens to feed next instead of sampling (a reasoning budget's end tag).
    forced: VecDeque<u32>,
    /// Inside a verified draft: the length the sequence would hold without speculation
    /// (what it is cut to if the request ends there).
    spec_hold: Option<usize>,
    /// Draft tokens verified and accepted.
    drafts: DraftCounts,
    /// `--spec-synth-rates`' random stream.
    synth_rng: spec::SynthRng,
    /// Most draft tokens worth verifying next (0: the settings' most): one more than twice
    /// what the last draft had accepted, so that drafts that miss stay at one token (a
    /// verified row costs a fraction of a step) and drafts that hit double.
    spec_k: usize,
}

/// A slot: at most one active request, and the sequence it last ran.
#[derive(Default)]
struct Slot {
    active: Option<Active>,
    last: Option<SeqId>,
}

/// The scheduler thread's state.
struct Scheduler {
    ctx: Context,
    model: Arc<Model>,
    store: Option<Arc<SessionStore>>,
    slot_store: Option<Arc<SessionStore>>,
    writer: Option<Writer>,
    metrics: Arc<Metrics>,
    slots: Vec<Slot>,
    queue: VecDeque<Queued>,
    /// Reads stored prefixes for waiting requests (with a store).
    loader: Option<Loader>,
    /// Numbers the loads asked for.
    loads: u64,
    /// Finished sequences kept resident, least recently finished first.
    cached: VecDeque<SeqId>,
    /// Finished sequences whose new pages are not copied out for the store yet: the copy
    /// waits until the scheduler is idle, so a client's next request starts at once, or
    /// goes a piece at a time between steps once due.
    exports: Vec<Export>,
    tickets: u64,
    /// Prompt tokens fed so far: the clock, counted in work, by which prefill is ordered.
    work: u64,
    /// `work` when the last pieces were exported: a step that fed more prompt tokens exports
    /// more pieces after it, so the store keeps up with prefill under steady load.
    exported_work: u64,
    /// Shutdown was asked for.
    closing: bool,
    /// `--sleep-idle-seconds`: the idle time before sleeping, and while asleep the parameters
    /// of the context to build again.
    sleep: Option<(std::time::Duration, Option<engine::ContextParams>)>,
    /// Speculative decoding, when on.
    spec: Option<Speculation>,
}

/// Starts the scheduler thread; it ends (after finishing or cancelling its work and flushing
/// the cache) when every sender of `rx` is gone.
pub fn spawn(parts: Parts, rx: mpsc::UnboundedReceiver<Command>) -> std::thread::JoinHandle<()> {
    let writer = parts
        .store
        .as_ref()
        .map(|s| Writer::start(Arc::clone(s), parts.metrics.clone()));
    let loader = parts
        .store
        .as_ref()
        .map(|s| Loader::start(Arc::clone(s), Arc::clone(&parts.metrics), parts.wake));
    let mut sched = Scheduler {
        model: Arc::clone(parts.ctx.model()),
        ctx: parts.ctx,
        store: parts.store,
        slot_store: parts.slot_store,
        writer,
        metrics: parts.metrics,
        slots: (0..parts.n_slots).map(|_| Slot::default()).collect(),
        queue: VecDeque::new(),
        loader,
        loads: 0,
        cached: VecDeque::new(),
        exports: Vec::new(),
        tickets: 0,
        work: 0,
        exported_work: 0,
        closing: false,
        sleep: parts.sleep_after.map(|d| (d, None)),
        spec: parts.spec,
    };
    let warm = parts.warm_up;
    std::thread::Builder::new()
        .name("scheduler".into())
        .spawn(move || {
            if let Some(ready) = warm {
                warm_up(&mut sched.ctx);
                let _ = ready.send(());
            }
            sched.run(rx)
        })
        .expect("spawning the scheduler thread")
}

/// llama-server's warm-up: one token through every layer in a scratch sequence, dropped after,
/// so that the first request does not pay for the weights' first touch and the compute
/// buffers' first allocation.
pub fn warm_up(ctx: &mut Context) {
    let token = ctx.model().tokenizer().bos().unwrap_or(0);
    let seq = ctx.new_sequence();
    let _ = ctx.feed(seq, &[token], engine::Logits::Last);
    let _ = ctx.remove_sequence(seq);
}

impl Scheduler {
    fn run(&mut self, mut rx: mpsc::UnboundedReceiver<Command>) {
        let mut open = true;
        loop {
            // Take every command waiting; sleep only when there is nothing to do.
            loop {
                self.collect_loads();
                // Nothing to evaluate and nothing to start (requests waiting for the loader
                // are woken by it).
                let idle = self.slots.iter().all(|s| s.active.is_none())
                    && self.queue.iter().all(|q| matches!(q.load, Load::Asked(_)));
                let cmd = if idle && open {
                    // Finished pages are copied out once no request came for a moment: a
                    // client's next request usually follows its last response at once.
                    let waited = if self.exports.is_empty() {
                        None
                    } else {
                        recv_within(&mut rx, EXPORT_IDLE)
                    };
                    match waited {
                        Some(cmd) => cmd,
                        None if self.loading() => {
                            self.export_due(true);
                            rx.blocking_recv()
                        }
                        None => {
                            self.export_due(true);
                            // Idle: sleep once `--sleep-idle-seconds` pass without a command.
                            match self.sleep_due().map(|d| recv_timeout(&mut rx, d)) {
                                Some(Some(cmd)) => cmd,
                                Some(None) => {
                                    self.fall_asleep();
                                    rx.blocking_recv()
                                }
                                None => rx.blocking_recv(),
                            }
                        }
                    }
                } else {
                    match rx.try_recv() {
                        Ok(c) => Some(c),
                        Err(mpsc::error::TryRecvError::Empty) => break,
                        Err(mpsc::error::TryRecvError::Disconnected) => None,
                    }
                };
                match cmd {
                    Some(c) => {
                        self.command(c);
                        if self.closing {
                            open = false;
                            break;
                        }
                    }
                    None => {
                        open = false;
                        break;
                    }
                }
            }
            self.collect_loads();
            self.cancel_abandoned();
            self.admit();
            self.publish_gauges();
            if self.slots.iter().all(|s| s.active.is_none()) {
                if !open && self.queue.is_empty() {
                    break;
                }
                if !open && self.loading() {
                    // The command channel may be closed: wait on the loader itself.
                    if let Some(done) = self.loader.as_ref().and_then(Loader::wait_done) {
                        self.take_load(done);
                    }
                }
                continue;
            }
            self.step();
            // Published after the step too: a request that finished in it is no longer
            // processing, though the loop may now sleep until the next command.
            self.publish_gauges();
            self.export_due(false);
        }
        self.export_due(true);
        // The writer's last round flushes every block, then keeps the disk budget (a flush
        // after that would write the collected blocks' RAM copies again).
        if let Some(w) = self.writer.take() {
            w.finish();
        }
        if let Some(d) = self.spec.as_ref().and_then(|s| s.draft.as_ref()) {
            let _ = d.flush();
        }
    }

    fn command(&mut self, cmd: Command) {
        if matches!(
            cmd,
            Command::Generate(_)
                | Command::Embed { .. }
                | Command::Rank { .. }
                | Command::Slot { .. }
                | Command::Rouse(_)
        ) {
            self.wake();
        }
        match cmd {
            Command::Generate(job) => {
                self.queue.push_back(Queued {
                    job: *job,
                    load: Load::NotAsked,
                });
            }
            Command::Wake => self.collect_loads(),
            Command::Rouse(done) => {
                let _ = done.send(());
            }
            Command::Slots { scope, reply } => {
                let _ = reply.send(self.slots_json(scope));
            }
            Command::Slot {
                id,
                action,
                scope,
                reply,
            } => {
                let _ = reply.send(self.slot_action(id, action, scope));
            }
            Command::Embed { inputs, reply } => {
                let _ = reply.send(self.embed(&inputs, engine::Context::embed));
            }
            Command::Rank { inputs, reply } => {
                let _ = reply.send(self.embed(&inputs, engine::Context::rank));
            }
            Command::Pin {
                id,
                tokens,
                namespace,
                expires_unix,
                reply,
            } => {
                let pin = crate::cache::PinWork {
                    id,
                    tokens,
                    namespace,
                    expires_unix,
                    reply,
                };
                self.pin(pin);
            }
            Command::Clear(clear) => self.clear(clear),
            Command::Shutdown => self.closing = true,
        }
    }

    /// Each input evaluated in a sequence of its own by `eval` (every token's embedding, or the
    /// rank pooling's outputs); the prompt cache gives way when the pool is short of pages.
    fn embed(
        &mut self,
        inputs: &[Vec<u32>],
        eval: fn(&mut engine::Context, engine::SeqId, &[u32]) -> engine::Result<Vec<f32>>,
    ) -> Result<Vec<Vec<f32>>> {
        let mut out = Vec::with_capacity(inputs.len());
        for tokens in inputs {
            let seq = self.ctx.new_sequence();
            let mut got = eval(&mut self.ctx, seq, tokens);
            if let Err(engine::Error::OutOfPages { needed, .. }) = got {
                if self.make_room(needed) {
                    got = eval(&mut self.ctx, seq, tokens);
                }
            }
            let _ = self.ctx.remove_sequence(seq);
            Metrics::add(&self.metrics.prompt_tokens, tokens.len() as u64);
            out.push(got.map_err(|e| ServerError::Busy(e.to_string()))?);
        }
        Ok(out)
    }

    /// Ends the requests whose client is gone, and drops waiting ones likewise.
    fn cancel_abandoned(&mut self) {
        for i in 0..self.slots.len() {
            if self.slots[i]
                .active
                .as_ref()
                .is_some_and(|a| a.events.is_closed())
            {
                self.finish(i, FinishReason::Cancelled);
            }
        }
        self.queue.retain(|q| !q.job.events.is_closed());
    }
}
