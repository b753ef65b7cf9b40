//! The scheduler: one thread owns the engine's [`Context`] and runs continuous batching over
//! every active request. Each step builds one [`Batch`]: one decode token of each generating
//! request, then prefill chunks of new ones up to `n_batch` tokens; the sampled tokens go back
//! to each request's channel. HTTP handlers talk to it only through channels, so nothing they
//! do blocks a step, and a request whose receiver is gone (the client left) is cancelled at
//! the next step.
//!
//! The prompt cache lives here too: finished sequences stay resident as an LRU list while the
//! pool has room, and a new request starts from the longest prefix found in the pool (pages
//! shared by block id) or in the store (blocks read into free pages), computing only the rest.
//! Its new full blocks are copied out after it finishes and handed to the write-behind thread.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use engine::chat::{THINK_END, THINK_START};
use engine::sampling::Sampler;
use engine::store::prompt_cache::LoadedPrefix;
use engine::store::SessionStore;
use engine::tokenizer::StreamDecoder;
use engine::{Batch, Context, Logits, Model, SeqId, PAGE_TOKENS};
use tokio::sync::mpsc;

use crate::cache::Writer;

mod loader;
mod reuse;
mod sample;
mod shift;
mod sleep;
mod slots;
mod types;

pub use types::{
    Chunk, Command, Event, Finish, FinishReason, GenParams, Job, Parts, Progress, ReasoningBudget,
    SlotAction, TokenProbs,
};

use crate::error::{Result, ServerError};
use crate::metrics::Metrics;
use loader::{Load, Loader, Queued};
use reuse::{common_prefix, recv_timeout, recv_within, EXPORT_IDLE};
use sample::{flush_text, pick};

/// Finished sequences kept resident at most (each holds at least its partial last page).
const MAX_CACHED: usize = 256;

/// A request being evaluated.
struct Active {
    events: mpsc::UnboundedSender<Event>,
    params: GenParams,
    seq: SeqId,
    prompt: Vec<u32>,
    /// Prompt tokens the sequence holds.
    fed: usize,
    cache_n: usize,
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
    /// Finished sequences whose new pages are not copied out for the store yet (sequence,
    /// prompt tokens that came from a cache, prompt length, when it finished, when its stored
    /// tails expire): the copy waits until the scheduler is idle, so a client's next request
    /// starts at once.
    exports: Vec<(SeqId, usize, usize, Instant, Option<u64>)>,
    tickets: u64,
    /// Shutdown was asked for.
    closing: bool,
    /// `--sleep-idle-seconds`: the idle time before sleeping, and while asleep the parameters
    /// of the context to build again.
    sleep: Option<(std::time::Duration, Option<engine::ContextParams>)>,
}

/// Starts the scheduler thread; it ends (after finishing or cancelling its work and flushing
/// the cache) when every sender of `rx` is gone.
pub fn spawn(parts: Parts, rx: mpsc::UnboundedReceiver<Command>) -> std::thread::JoinHandle<()> {
    let writer = parts
        .store
        .as_ref()
        .map(|s| Writer::start(Arc::clone(s), Arc::clone(&parts.metrics)));
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
        closing: false,
        sleep: parts.sleep_after.map(|d| (d, None)),
    };
    std::thread::Builder::new()
        .name("scheduler".into())
        .spawn(move || sched.run(rx))
        .expect("spawning the scheduler thread")
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
    }

    fn command(&mut self, cmd: Command) {
        if matches!(
            cmd,
            Command::Generate(_) | Command::Embed { .. } | Command::Slot { .. }
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
            Command::Slots(reply) => {
                let _ = reply.send(self.slots_json());
            }
            Command::Slot { id, action, reply } => {
                let _ = reply.send(self.slot_action(id, action));
            }
            Command::Embed { inputs, reply } => {
                let _ = reply.send(self.embed(&inputs));
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

    /// Every token's embedding of each input; the prompt cache gives way when the pool is
    /// short of pages.
    fn embed(&mut self, inputs: &[Vec<u32>]) -> Result<Vec<Vec<f32>>> {
        let mut out = Vec::with_capacity(inputs.len());
        for tokens in inputs {
            let seq = self.ctx.new_sequence();
            let mut got = self.ctx.embed(seq, tokens);
            if let Err(engine::Error::OutOfPages { needed, .. }) = got {
                if self.make_room(needed) {
                    got = self.ctx.embed(seq, tokens);
                }
            }
            let _ = self.ctx.remove_sequence(seq);
            Metrics::add(&self.metrics.prompt_tokens, tokens.len() as u64);
            out.push(got.map_err(|e| ServerError::Busy(e.to_string()))?);
        }
        Ok(out)
    }

    fn publish_gauges(&self) {
        let stats = self.ctx.stats();
        let processing = self.slots.iter().filter(|s| s.active.is_some()).count();
        Metrics::set(&self.metrics.requests_processing, processing as u64);
        Metrics::set(&self.metrics.requests_waiting, self.queue.len() as u64);
        Metrics::set(&self.metrics.kv_pages_used, stats.pages_used as u64);
        Metrics::set(&self.metrics.kv_pages_total, stats.pages_total as u64);
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

    /// Moves waiting requests into free slots, first come first served (a request for a
    /// particular slot waits for that one without holding up the others).
    fn admit(&mut self) {
        self.ask_loads();
        let mut i = 0;
        while i < self.queue.len() {
            // A request whose blocks are being read lets the others go first.
            if matches!(self.queue[i].load, Load::Asked(_)) {
                i += 1;
                continue;
            }
            let want = self.queue[i].job.params.id_slot;
            let free = match want {
                Some(id) => {
                    (id < self.slots.len() && self.slots[id].active.is_none()).then_some(id)
                }
                None => self.slots.iter().position(|s| s.active.is_none()),
            };
            let Some(slot) = free else {
                if want.is_none() {
                    break;
                }
                i += 1;
                continue;
            };
            let Some(Queued { job, load }) = self.queue.remove(i) else {
                break;
            };
            let loaded = match load {
                Load::Done(prefix) => prefix,
                _ => None,
            };
            match self.start(job, loaded) {
                Ok(active) => {
                    // The first progress report, before any prompt token is evaluated.
                    if active.params.return_progress {
                        let _ = active.events.send(Event::Progress(Progress {
                            total: active.prompt.len(),
                            cache: active.cache_n,
                            processed: active.fed,
                            time_ms: 0.0,
                        }));
                    }
                    // The slot's previous conversation stays in the cache list.
                    self.slots[slot].active = Some(active);
                }
                Err((events, e)) => {
                    let _ = events.send(Event::Failed(e));
                }
            }
        }
    }

    /// A new sequence for `job`, starting from the longest cached prefix of its prompt: in
    /// memory, or `loaded` from the store by the loader.
    fn start(
        &mut self,
        job: Job,
        loaded: Option<Box<LoadedPrefix>>,
    ) -> std::result::Result<Active, (mpsc::UnboundedSender<Event>, ServerError)> {
        let mut seq = self.ctx.new_sequence();
        let namespace = job.params.namespace;
        // A new sequence is empty: this cannot fail.
        let _ = self.ctx.set_namespace(seq, namespace);
        let prompt = job.prompt;
        // One token is always evaluated, for its logits.
        let usable = &prompt[..prompt.len().saturating_sub(1)];
        let mut from_ram = 0;
        let mut from_store = 0;
        // KV moved into place by `--cache-reuse`: the sequence is not the plain evaluation of
        // its tokens, so it is not cached afterwards.
        let mut shifted = false;
        if job.params.cache_prompt {
            // A resident sequence that shares more than the stored blocks is forked, partly
            // filled last page included (a repeated or extended prompt costs nothing).
            let resident = self.longest_resident(usable, namespace);
            let stored = loaded.as_ref().map_or(0, |l| l.tokens());
            if let Some((n, src)) = resident.filter(|&(n, _)| n > 0 && n >= stored) {
                // The finished sequence is taken over, cut to the shared prefix, rather than
                // forked: no page is copied, the pool does not grow with every repeat, and its
                // pages stay where they were (attention adds cells up in pool order, so the
                // same prompt gets the same reply). Its new blocks go to the store first.
                self.export(src);
                self.cached.retain(|&s| s != src);
                for s in &mut self.slots {
                    if s.last == Some(src) {
                        s.last = None;
                    }
                }
                let kept = match job.params.cache_reuse {
                    0 => self.ctx.truncate(src, n).map(|()| (n, false)),
                    chunk => self.reuse_chunks(src, usable, n, chunk),
                };
                if let Ok((n, moved)) = kept {
                    let _ = self.ctx.remove_sequence(seq);
                    seq = src;
                    from_ram = n;
                    shifted = moved;
                } else {
                    let _ = self.ctx.remove_sequence(src);
                }
            }
            if from_ram == 0 {
                from_ram = self.ctx.attach_prefix(seq, usable).unwrap_or(0);
            }
            if let (Some(store), Some(loaded)) =
                (self.store.clone(), loaded.filter(|_| stored > from_ram))
            {
                let mut result =
                    store
                        .prompt_cache()
                        .import_loaded(&mut self.ctx, seq, usable, &loaded);
                if let Err(engine::Error::OutOfPages { needed, .. }) = result {
                    self.make_room(needed);
                    result =
                        store
                            .prompt_cache()
                            .import_loaded(&mut self.ctx, seq, usable, &loaded);
                }
                match result {
                    Ok(n) => from_store = n.saturating_sub(from_ram),
                    Err(e) => self
                        .metrics
                        .cache_error(format!("restore failed, computed instead: {e}")),
                }
            }
        }
        let cache_n = from_ram + from_store;
        // Concurrent requests with one long system prompt: the first computes it, the others
        // wait for those pages rather than computing the same tokens beside it.
        let follow = if job.params.cache_prompt {
            let usable = &prompt[..prompt.len().saturating_sub(1)];
            self.slots
                .iter()
                .filter_map(|s| s.active.as_ref())
                .filter(|a| a.follow.is_none() && a.fed < a.prompt.len())
                .filter(|a| a.params.namespace == namespace)
                .map(|a| (common_prefix(&a.prompt, usable), a.seq))
                .filter(|&(n, _)| n >= cache_n + PAGE_TOKENS)
                .max()
                .map(|(n, seq)| (seq, n))
        } else {
            None
        };
        let m = &self.metrics;
        Metrics::add(&m.prompt_tokens, prompt.len() as u64);
        Metrics::add(&m.prompt_tokens_from_ram, from_ram as u64);
        Metrics::add(&m.prompt_tokens_from_store, from_store as u64);
        Metrics::add(&m.prompt_tokens_computed, (prompt.len() - cache_n) as u64);
        self.tickets += 1;
        let stops = engine::StopStrings::new(&job.params.stop);
        Ok(Active {
            events: job.events,
            sampler: Sampler::new(job.params.sampler.clone()),
            params: job.params,
            seq,
            fed: cache_n,
            cache_n,
            prompt,
            decoder: StreamDecoder::new(),
            generated: Vec::new(),
            stops,
            stopping_word: String::new(),
            text: String::new(),
            sent: 0,
            unsent: Vec::new(),
            unsent_probs: Vec::new(),
            probs: Vec::new(),
            pending: None,
            constraint: job.constraint,
            admitted: Instant::now(),
            first_token: None,
            ticket: self.tickets,
            follow,
            shifted: 0,
            truncated: false,
            moved: shifted,
            thinking: 0,
            forced: VecDeque::new(),
        })
    }

    /// One batch: a decode token of each generating request, prefill chunks of the others.
    fn step(&mut self) {
        self.resolve_followers();
        let n_batch = self.ctx.params().n_batch;
        loop {
            let mut batch = Batch::new();
            // (slot, prompt tokens fed by the item, whether logits were asked for)
            let mut items: Vec<(usize, usize, bool)> = Vec::new();
            let mut budget = n_batch;
            for (i, slot) in self.slots.iter().enumerate() {
                if let Some(a) = &slot.active {
                    if let Some(t) = a.pending {
                        batch.add(a.seq, &[t], Logits::Last);
                        items.push((i, 0, true));
                        budget -= 1;
                    }
                }
            }
            // Prefill chunks, the request with the fewest prompt tokens left first: a request
            // that found most of its prompt cached is answered at the next step instead of
            // waiting behind a cold document (which takes what budget is left).
            let mut prefilling: Vec<(usize, u64, usize)> = self
                .slots
                .iter()
                .enumerate()
                .filter_map(|(i, s)| {
                    s.active
                        .as_ref()
                        .map(|a| (a.prompt.len() - a.fed, a.ticket, i))
                })
                .filter(|&(left, _, _)| left > 0)
                .collect();
            prefilling.sort_unstable();
            for (_, _, i) in prefilling {
                let Some(a) = &self.slots[i].active else {
                    continue;
                };
                if budget == 0 || a.follow.is_some() {
                    continue;
                }
                let n = (a.prompt.len() - a.fed).min(budget);
                let last = a.fed + n == a.prompt.len();
                let logits = if last { Logits::Last } else { Logits::None };
                batch.add(a.seq, &a.prompt[a.fed..a.fed + n], logits);
                items.push((i, n, last));
                budget -= n;
            }
            if batch.is_empty() {
                return;
            }
            match self.ctx.decode(&batch) {
                Ok(out) => {
                    Metrics::add(&self.metrics.n_decode, 1);
                    Metrics::add(&self.metrics.n_busy_slots, items.len() as u64);
                    for (item, &(slot, n_prompt, wants_logits)) in items.iter().enumerate() {
                        let Some(a) = self.slots[slot].active.as_mut() else {
                            continue;
                        };
                        if n_prompt == 0 {
                            a.pending = None;
                        }
                        a.fed += n_prompt;
                        if n_prompt > 0 && a.params.return_progress {
                            let _ = a.events.send(Event::Progress(Progress {
                                total: a.prompt.len(),
                                cache: a.cache_n,
                                processed: a.fed,
                                time_ms: a.admitted.elapsed().as_secs_f64() * 1e3,
                            }));
                        }
                        if wants_logits {
                            let history = self.ctx.tokens(a.seq).unwrap_or(&[]);
                            // `ignore_eos` reaches the sampler as a ban of those tokens.
                            let logits = out.logits(item);
                            // A reasoning budget's end tag goes in as it is, not sampled.
                            if let Some(token) = a.forced.pop_front() {
                                self.on_token(slot, token, None);
                                continue;
                            }
                            match pick(a, logits, history) {
                                Ok((token, probs)) => self.on_token(slot, token, probs),
                                Err(e) => self.fail(slot, e),
                            }
                        }
                    }
                    return;
                }
                Err(engine::Error::OutOfPages { needed, .. }) => {
                    if !self.make_room(needed) {
                        // Even an empty cache is not enough: the newest request gives way.
                        let newest = self
                            .slots
                            .iter()
                            .enumerate()
                            .filter_map(|(i, s)| s.active.as_ref().map(|a| (a.ticket, i)))
                            .max();
                        if let Some((_, slot)) = newest {
                            self.fail(
                                slot,
                                ServerError::Busy(format!(
                                    "{needed} more pages were needed than the pool of {} has",
                                    self.ctx.stats().pages_total
                                )),
                            );
                        }
                    }
                }
                Err(e) => {
                    let msg = e.to_string();
                    for &(slot, _, _) in &items {
                        self.fail(slot, ServerError::Busy(msg.clone()));
                    }
                    return;
                }
            }
        }
    }

    /// Handles a token sampled for the request in `slot`.
    fn on_token(&mut self, slot: usize, token: u32, probs: Option<TokenProbs>) {
        if self.slots[slot]
            .active
            .as_ref()
            .is_some_and(|a| a.first_token.is_none())
        {
            self.export_prompt(slot);
        }
        let model = Arc::clone(&self.model);
        let tok = model.tokenizer();
        let n_ctx = self.ctx.params().n_ctx;
        let Some(a) = self.slots[slot].active.as_mut() else {
            return;
        };
        if a.first_token.is_none() {
            a.first_token = Some(Instant::now());
        }
        // `n_predict: 0` evaluates the prompt and generates nothing.
        if a.params.max_tokens == 0 {
            self.finish(slot, FinishReason::Length);
            return;
        }
        if tok.is_eog(token) {
            self.finish(slot, FinishReason::EndOfGeneration);
            return;
        }
        a.generated.push(token);
        a.unsent.push(token);
        if let Some(p) = probs {
            a.unsent_probs.push(p.clone());
            a.probs.push(p);
        }
        Metrics::add(&self.metrics.tokens_predicted, 1);
        a.text.push_str(&a.decoder.push(tok, token));
        if let Some((cut, word)) = a.stops.find(&a.text) {
            a.stopping_word = word.to_owned();
            a.text.truncate(cut);
            flush_text(a, cut);
            self.finish(slot, FinishReason::StopString);
            return;
        }
        if let Some(b) = &a.params.reasoning_budget {
            // Inside the thinking block (opened by the prompt or by the reply, not closed):
            // count, and close it once the budget is spent.
            let inside = (b.opened || a.text.contains(THINK_START)) && !a.text.contains(THINK_END);
            if inside && a.forced.is_empty() {
                a.thinking += 1;
                if a.thinking >= b.tokens {
                    a.forced.extend(b.close.iter().copied());
                }
            }
        }
        let safe = a.stops.safe_prefix_len(&a.text).max(a.sent);
        flush_text(a, safe);
        // A grammar that is complete admits nothing more.
        if a.constraint.as_ref().is_some_and(|c| c.is_done()) {
            let rest = a.decoder.flush();
            a.text.push_str(&rest);
            let end = a.text.len();
            flush_text(a, end);
            self.finish(slot, FinishReason::EndOfGeneration);
            return;
        }
        let held = a.prompt.len() + a.generated.len() - a.shifted;
        // llama-server's `t_max_predict_ms`: out of time once a line has ended.
        let out_of_time = a.params.t_max_predict_ms.is_some_and(|ms| {
            a.first_token
                .is_some_and(|t| t.elapsed().as_millis() >= u128::from(ms))
                && a.text.contains('\n')
        });
        let full = held >= n_ctx;
        if full && a.params.context_shift && a.generated.len() < a.params.max_tokens && !out_of_time
        {
            if self.shift_context(slot) {
                if let Some(a) = self.slots[slot].active.as_mut() {
                    a.pending = Some(token);
                }
                return;
            }
            self.finish_at_length(slot);
            return;
        }
        if a.generated.len() >= a.params.max_tokens || full || out_of_time {
            self.finish_at_length(slot);
            return;
        }
        a.pending = Some(token);
    }

    /// Ends the request in `slot`: sends its figures, keeps its sequence cached and queues its
    /// new blocks for the store.
    fn finish(&mut self, slot: usize, reason: FinishReason) {
        let Some(mut a) = self.slots[slot].active.take() else {
            return;
        };
        if reason == FinishReason::EndOfGeneration {
            let rest = a.decoder.flush();
            a.text.push_str(&rest);
            let end = a.text.len();
            flush_text(&mut a, end);
        }
        let now = Instant::now();
        let first = a.first_token.unwrap_or(now);
        let finish = Finish {
            reason,
            slot,
            n_prompt: a.prompt.len(),
            cache_n: a.cache_n,
            prompt_n: a.prompt.len() - a.cache_n,
            prompt_ms: (first - a.admitted).as_secs_f64() * 1e3,
            predicted_n: a.generated.len(),
            predicted_ms: (now - first).as_secs_f64() * 1e3,
            tokens: std::mem::take(&mut a.generated),
            stopping_word: std::mem::take(&mut a.stopping_word),
            probs: std::mem::take(&mut a.probs),
            truncated: a.truncated,
        };
        // The gauges first: a client that reads them once it has its answer sees this request
        // done.
        self.publish_gauges();
        let m = &self.metrics;
        Metrics::add(&m.prompt_us, (finish.prompt_ms * 1e3) as u64);
        Metrics::add(&m.predicted_us, (finish.predicted_ms * 1e3) as u64);
        Metrics::raise(
            &m.n_tokens_max,
            (finish.n_prompt + finish.predicted_n) as u64,
        );
        let _ = a.events.send(Event::Done(Box::new(finish)));
        Metrics::add(&self.metrics.requests_finished, 1);
        if a.truncated || a.moved {
            let _ = self.ctx.remove_sequence(a.seq);
        } else {
            let expires = a.params.cache_ttl.map(|t| crate::routes::unix_now() + t);
            self.keep(slot, a.seq, a.cache_n, a.prompt.len(), expires);
        }
    }

    /// Fails the request in `slot` and drops its sequence.
    fn fail(&mut self, slot: usize, e: ServerError) {
        if let Some(a) = self.slots[slot].active.take() {
            self.publish_gauges();
            let _ = a.events.send(Event::Failed(e));
            let _ = self.ctx.remove_sequence(a.seq);
            Metrics::add(&self.metrics.requests_finished, 1);
        }
    }
}
