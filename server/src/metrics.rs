//! Counters the scheduler keeps and `/metrics` shows in Prometheus' text format.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Counters shared by the scheduler (which writes them) and the HTTP side (which reads them).
#[derive(Debug, Default)]
pub struct Metrics {
    /// Prompt tokens of every request.
    pub prompt_tokens: AtomicU64,
    /// Prompt tokens evaluated (not found in any cache).
    pub prompt_tokens_computed: AtomicU64,
    /// Prompt tokens whose KV was shared from pages resident in memory.
    pub prompt_tokens_from_ram: AtomicU64,
    /// Prompt tokens whose KV was read from the store (its RAM tier or disk).
    pub prompt_tokens_from_store: AtomicU64,
    /// Tokens generated.
    pub tokens_predicted: AtomicU64,
    /// Requests finished (any reason).
    pub requests_finished: AtomicU64,
    /// Requests being evaluated now.
    pub requests_processing: AtomicU64,
    /// Requests waiting for a slot.
    pub requests_waiting: AtomicU64,
    /// KV pages of the pool in use.
    pub kv_pages_used: AtomicU64,
    /// KV pages of the pool.
    pub kv_pages_total: AtomicU64,
    /// KV pages in use whose sliding-window layers' rows left memory.
    pub kv_pages_window_released: AtomicU64,
    /// The KV pool's RAM budget in bytes (`--kv-ram`; 0: none).
    pub kv_ram_budget: AtomicU64,
    /// KV pages in use whose rows are in RAM.
    pub kv_pages_resident: AtomicU64,
    /// KV pages in use spilled to their block files (beyond the RAM budget).
    pub kv_pages_spilled: AtomicU64,
    /// The spill counters, over every context the scheduler has had.
    pub kv_spill: Mutex<SpillFigures>,
    /// Blocks handed to the store by the write-behind thread.
    pub blocks_written: AtomicU64,
    /// Tails (partly filled last pages) stored by the write-behind thread.
    pub tails_written: AtomicU64,
    /// Finished sequences dropped from memory to make room.
    pub cache_evictions: AtomicU64,
    /// Blocks and tails not stored because the write-behind queue was full.
    pub cache_writes_dropped: AtomicU64,
    /// Rounds of the write-behind thread (room made, blocks and tails written, flushed).
    pub writer_rounds: AtomicU64,
    /// Microseconds those rounds took, in all.
    pub writer_round_us: AtomicU64,
    /// Problems of the prompt cache that cost only speed (a failed restore or write).
    pub cache_errors: AtomicU64,
    /// The last of those problems, as text.
    pub last_cache_error: Mutex<Option<String>>,
    /// 1 while the scheduler sleeps (`--sleep-idle-seconds`), else 0.
    pub sleeping: AtomicU64,
    /// Notified when [`Metrics::sleeping`] changes (a router's model process reports it).
    pub sleep_changed: tokio::sync::Notify,
    /// Where [`Metrics::log`] sends lines ([`crate::Server::log_lines`] hands out the other end).
    pub log: Mutex<Option<std::sync::mpsc::Sender<String>>>,
    /// Microseconds spent evaluating prompts (admission to first token), over requests.
    pub prompt_us: AtomicU64,
    /// Microseconds spent generating (first token to end), over requests.
    pub predicted_us: AtomicU64,
    /// Batches evaluated.
    pub n_decode: AtomicU64,
    /// Draft tokens verified (speculative decoding).
    pub draft_tokens: AtomicU64,
    /// Draft tokens accepted.
    pub draft_accepted: AtomicU64,
    /// Drafts verified.
    pub drafts: AtomicU64,
    /// Tokens of the draft model's KV read from the store rather than computed.
    pub draft_tokens_from_store: AtomicU64,
    /// Requests (slots) in those batches, summed.
    pub n_busy_slots: AtomicU64,
    /// Most tokens one request has held (prompt and reply).
    pub n_tokens_max: AtomicU64,
    /// Replies evaluated ahead as their clients send them back without their reasoning.
    pub replies_warmed: AtomicU64,
    /// Prompt tokens those warm-ups evaluated (counted in `prompt_tokens_computed` too).
    pub reply_warm_tokens: AtomicU64,
    /// What requests finished since the last scrape: the throughput gauges' window.
    pub window: Mutex<Window>,
}

/// Requests finished since the last scrape of `/metrics`: llama-server's throughput gauges
/// (`prompt_tokens_seconds`, `predicted_tokens_seconds`) are averaged over the window between
/// two scrapes, and a scrape starts a new one. Nothing runs while the server sleeps, so the
/// first scrape then reports the last requests and the next ones nothing.
#[derive(Clone, Copy, Debug, Default)]
pub struct Window {
    /// Prompt tokens evaluated.
    pub prompt_tokens: u64,
    /// Microseconds spent on them.
    pub prompt_us: u64,
    /// Tokens generated after each request's first (the first comes with the prompt).
    pub predicted_steps: u64,
    /// Microseconds from each request's first token to its end.
    pub predicted_us: u64,
}

impl Window {
    /// Tokens a second of `n` tokens in `us` microseconds (0 for none).
    fn rate(n: u64, us: u64) -> f64 {
        if us > 0 {
            n as f64 * 1e6 / us as f64
        } else {
            0.0
        }
    }
}

/// What the KV pool spilled to disk and read back: a context counts from its creation, so
/// those of contexts dropped (`--sleep-idle-seconds`) are kept aside and the counters shown
/// never go back.
#[derive(Clone, Copy, Debug, Default)]
pub struct SpillFigures {
    /// Bytes attention read from spilled pages' block files, by contexts dropped.
    pub bytes_read_before: u64,
    /// Pages spilled by contexts dropped.
    pub pages_written_before: u64,
    /// Bytes read by the current context.
    pub bytes_read: u64,
    /// Pages spilled by the current context.
    pub pages_written: u64,
}

impl SpillFigures {
    /// Bytes read in all.
    pub fn total_bytes_read(&self) -> u64 {
        self.bytes_read_before + self.bytes_read
    }

    /// Pages spilled in all.
    pub fn total_pages_written(&self) -> u64 {
        self.pages_written_before + self.pages_written
    }
}

/// Byte counters of the store, read when the metrics are rendered.
#[derive(Clone, Copy, Debug, Default)]
pub struct StoreBytes {
    /// Bytes read from block files.
    pub read: u64,
    /// Bytes written to block and manifest files.
    pub written: u64,
    /// Bytes of block files on disk.
    pub on_disk: u64,
}

impl Metrics {
    /// Adds `n` to a counter.
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    /// Sets a gauge.
    pub fn set(gauge: &AtomicU64, n: u64) {
        gauge.store(n, Ordering::Relaxed);
    }

    /// Sends a line to the server's log (the binary prints it; the library writes nothing to
    /// stderr itself).
    pub fn log(&self, line: String) {
        if let Ok(tx) = self.log.lock() {
            if let Some(tx) = tx.as_ref() {
                let _ = tx.send(line);
            }
        }
    }

    /// Counts a prompt-cache error and keeps its message for `/props`.
    pub fn cache_error(&self, what: String) {
        Metrics::add(&self.cache_errors, 1);
        if let Ok(mut last) = self.last_cache_error.lock() {
            *last = Some(what);
        }
    }

    /// The current context's spill counters (from its [`engine::KvStats`]).
    pub fn spill_seen(&self, stats: &engine::KvStats) {
        if let Ok(mut f) = self.kv_spill.lock() {
            f.bytes_read = stats.spill_bytes_read;
            f.pages_written = stats.spill_pages_written;
        }
    }

    /// The current context is dropped, its last figures `stats`: they are kept aside, and the
    /// next context counts from zero.
    pub fn spill_context_dropped(&self, stats: &engine::KvStats) {
        if let Ok(mut f) = self.kv_spill.lock() {
            f.bytes_read_before += stats.spill_bytes_read;
            f.pages_written_before += stats.spill_pages_written;
            f.bytes_read = 0;
            f.pages_written = 0;
        }
    }

    /// Adds a finished request to the throughput window: `prompt_n` tokens evaluated in
    /// `prompt_us`, `predicted_n` generated in `predicted_us` after the first.
    pub fn window_add(&self, prompt_n: u64, prompt_us: u64, predicted_n: u64, predicted_us: u64) {
        if let Ok(mut w) = self.window.lock() {
            w.prompt_tokens += prompt_n;
            w.prompt_us += prompt_us;
            w.predicted_steps += predicted_n.saturating_sub(1);
            w.predicted_us += predicted_us;
        }
    }

    /// Raises a gauge to `n` if it is lower.
    pub fn raise(gauge: &AtomicU64, n: u64) {
        gauge.fetch_max(n, Ordering::Relaxed);
    }

    /// llama-server's metrics under its names (`llamacpp:`), as its dashboards read them.
    fn render_llama_cpp(&self, out: &mut String) {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let secs = |us: u64| us as f64 / 1e6;
        let computed = get(&self.prompt_tokens_computed);
        let cached = get(&self.prompt_tokens_from_ram) + get(&self.prompt_tokens_from_store);
        let predicted = get(&self.tokens_predicted);
        // This scrape ends the window.
        let window = self
            .window
            .lock()
            .map(|mut w| std::mem::take(&mut *w))
            .unwrap_or_default();
        let decodes = get(&self.n_decode);
        let busy = if decodes > 0 {
            get(&self.n_busy_slots) as f64 / decodes as f64
        } else {
            0.0
        };
        let rows: [(&str, &str, &str, f64); 15] = [
            (
                "prompt_tokens_total",
                "counter",
                "Number of prompt tokens processed.",
                computed as f64,
            ),
            (
                "prompt_tokens_cached_total",
                "counter",
                "Number of prompt tokens taken from a cache.",
                cached as f64,
            ),
            (
                "prompt_seconds_total",
                "counter",
                "Prompt process time.",
                secs(get(&self.prompt_us)),
            ),
            (
                "tokens_predicted_total",
                "counter",
                "Number of generation tokens processed.",
                predicted as f64,
            ),
            (
                "tokens_predicted_seconds_total",
                "counter",
                "Predict process time.",
                secs(get(&self.predicted_us)),
            ),
            (
                "n_decode_total",
                "counter",
                "Total number of batches evaluated.",
                decodes as f64,
            ),
            (
                "n_tokens_max",
                "counter",
                "Largest number of tokens observed in one request.",
                get(&self.n_tokens_max) as f64,
            ),
            (
                "spec_decode_num_draft_tokens_total",
                "counter",
                "Draft tokens verified (speculative decoding).",
                get(&self.draft_tokens) as f64,
            ),
            (
                "spec_decode_num_accepted_tokens_total",
                "counter",
                "Draft tokens accepted by the model.",
                get(&self.draft_accepted) as f64,
            ),
            (
                "spec_decode_num_drafts_total",
                "counter",
                "Drafts verified.",
                get(&self.drafts) as f64,
            ),
            (
                "prompt_tokens_seconds",
                "gauge",
                "Average prompt throughput in tokens/s since the last scrape.",
                Window::rate(window.prompt_tokens, window.prompt_us),
            ),
            (
                "predicted_tokens_seconds",
                "gauge",
                "Average generation throughput in tokens/s since the last scrape.",
                Window::rate(window.predicted_steps, window.predicted_us),
            ),
            (
                "requests_processing",
                "gauge",
                "Number of requests processing.",
                get(&self.requests_processing) as f64,
            ),
            (
                "requests_deferred",
                "gauge",
                "Number of requests deferred.",
                get(&self.requests_waiting) as f64,
            ),
            (
                "n_busy_slots_per_decode",
                "gauge",
                "Average number of busy slots per batch.",
                busy,
            ),
        ];
        for (name, kind, help, value) in rows {
            let _ = writeln!(out, "# HELP llamacpp:{name} {help}");
            let _ = writeln!(out, "# TYPE llamacpp:{name} {kind}");
            let _ = writeln!(out, "llamacpp:{name} {value}");
        }
    }

    /// The counters in Prometheus' text exposition format: llama-server's under its names,
    /// then the prompt cache's own (`llamahdd:`).
    pub fn render(&self, store: StoreBytes) -> String {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let rows: [(&str, &str, &str, u64); 21] = [
            (
                "prompt_tokens_total",
                "counter",
                "Prompt tokens of all requests.",
                get(&self.prompt_tokens),
            ),
            (
                "prompt_tokens_computed_total",
                "counter",
                "Prompt tokens evaluated by the model.",
                get(&self.prompt_tokens_computed),
            ),
            (
                "prompt_tokens_from_ram_total",
                "counter",
                "Prompt tokens shared from KV pages in memory.",
                get(&self.prompt_tokens_from_ram),
            ),
            (
                "prompt_tokens_from_store_total",
                "counter",
                "Prompt tokens restored from the prompt cache store.",
                get(&self.prompt_tokens_from_store),
            ),
            (
                "tokens_predicted_total",
                "counter",
                "Tokens generated.",
                get(&self.tokens_predicted),
            ),
            (
                "requests_finished_total",
                "counter",
                "Requests finished.",
                get(&self.requests_finished),
            ),
            (
                "requests_processing",
                "gauge",
                "Requests being evaluated.",
                get(&self.requests_processing),
            ),
            (
                "requests_deferred",
                "gauge",
                "Requests waiting for a slot.",
                get(&self.requests_waiting),
            ),
            (
                "kv_pages_used",
                "gauge",
                "KV pages in use.",
                get(&self.kv_pages_used),
            ),
            (
                "kv_pages_total",
                "gauge",
                "KV pages in the pool.",
                get(&self.kv_pages_total),
            ),
            (
                "kv_pages_window_released",
                "gauge",
                "KV pages in use whose sliding-window layers' rows left memory.",
                get(&self.kv_pages_window_released),
            ),
            (
                "cache_blocks_written_total",
                "counter",
                "KV blocks handed to the store.",
                get(&self.blocks_written),
            ),
            (
                "cache_tails_written_total",
                "counter",
                "Partly filled last pages stored, so a prompt's last block comes from disk too.",
                get(&self.tails_written),
            ),
            (
                "cache_evictions_total",
                "counter",
                "Cached prompts dropped from memory.",
                get(&self.cache_evictions),
            ),
            (
                "cache_writer_rounds_total",
                "counter",
                "Rounds of the write-behind thread.",
                get(&self.writer_rounds),
            ),
            (
                "cache_writer_microseconds_total",
                "counter",
                "Time the write-behind thread's rounds took, in all.",
                get(&self.writer_round_us),
            ),
            (
                "cache_writes_dropped_total",
                "counter",
                "Blocks and tails not stored because the write-behind queue was full.",
                get(&self.cache_writes_dropped),
            ),
            (
                "cache_errors_total",
                "counter",
                "Prompt cache failures that cost only speed.",
                get(&self.cache_errors),
            ),
            (
                "cache_bytes_read_total",
                "counter",
                "Bytes read from the store's files.",
                store.read,
            ),
            (
                "cache_bytes_written_total",
                "counter",
                "Bytes written to the store's files.",
                store.written,
            ),
            (
                "cache_disk_bytes",
                "gauge",
                "Bytes of block files on disk.",
                store.on_disk,
            ),
        ];
        let mut out = String::new();
        self.render_llama_cpp(&mut out);
        let more = self.kv_rows().into_iter().chain(self.warm_rows());
        for (name, kind, help, value) in rows.into_iter().chain(more) {
            // Writing to a String cannot fail.
            let _ = writeln!(out, "# HELP llamahdd:{name} {help}");
            let _ = writeln!(out, "# TYPE llamahdd:{name} {kind}");
            let _ = writeln!(out, "llamahdd:{name} {value}");
        }
        out
    }

    /// The replies evaluated ahead as clients send them back without their reasoning
    /// (`routes/warm.rs`) and the tokens that took; the draft model's tokens taken from the
    /// store.
    fn warm_rows(&self) -> [(&'static str, &'static str, &'static str, u64); 3] {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        [
            (
                "cache_replies_warmed_total",
                "counter",
                "Reasoning replies evaluated ahead as clients send them back without it.",
                get(&self.replies_warmed),
            ),
            (
                "cache_reply_warm_tokens_total",
                "counter",
                "Prompt tokens those warm-ups evaluated (in prompt_tokens_computed_total too).",
                get(&self.reply_warm_tokens),
            ),
            (
                "draft_tokens_from_store_total",
                "counter",
                "Tokens of the draft model's KV restored from the store.",
                get(&self.draft_tokens_from_store),
            ),
        ]
    }

    /// The KV pool's RAM budget, its pages in RAM and on disk, and what it spilled and read
    /// back (`--kv-ram`).
    fn kv_rows(&self) -> [(&'static str, &'static str, &'static str, u64); 5] {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let spill = self.kv_spill.lock().map(|f| *f).unwrap_or_default();
        [
            (
                "kv_ram_budget_bytes",
                "gauge",
                "RAM budget of the KV pool (--kv-ram); 0 for none.",
                get(&self.kv_ram_budget),
            ),
            (
                "kv_pages_resident",
                "gauge",
                "KV pages in use whose rows are in RAM.",
                get(&self.kv_pages_resident),
            ),
            (
                "kv_pages_spilled",
                "gauge",
                "KV pages in use spilled to their block files on disk (beyond --kv-ram).",
                get(&self.kv_pages_spilled),
            ),
            (
                "kv_spill_pages_written_total",
                "counter",
                "KV pages spilled to disk (written to their block files) beyond --kv-ram.",
                spill.total_pages_written(),
            ),
            (
                "kv_spill_bytes_read_total",
                "counter",
                "Bytes attention read from the block files of spilled KV pages (over \
                 tokens_predicted_total: the bytes read per token generated).",
                spill.total_bytes_read(),
            ),
        ]
    }
}

/// The remote tier's counters (`llamahdd:cache_remote_*`, with `--cache-remote`), appended to
/// `out`: reads, writes, failures, and the calls' latency as a histogram.
pub fn render_remote(f: &engine::store::RemoteFigures, out: &mut String) {
    let rows: [(&str, &str, &str, u64); 11] = [
        (
            "hits_total",
            "counter",
            "Blocks and tails read from the remote tier and used.",
            f.hits,
        ),
        (
            "misses_total",
            "counter",
            "Blocks and tails looked for that the remote tier lacked.",
            f.misses,
        ),
        (
            "rejected_total",
            "counter",
            "Values read that did not verify (damaged or another model's); recomputed.",
            f.rejected,
        ),
        (
            "bytes_read_total",
            "counter",
            "Bytes read from the remote tier.",
            f.bytes_read,
        ),
        (
            "blocks_written_total",
            "counter",
            "Blocks written to the remote tier.",
            f.blocks_written,
        ),
        (
            "manifests_written_total",
            "counter",
            "Tails and checkpoints written to the remote tier.",
            f.manifests_written,
        ),
        (
            "bytes_written_total",
            "counter",
            "Bytes written to the remote tier.",
            f.bytes_written,
        ),
        (
            "errors_total",
            "counter",
            "Calls to the remote tier that failed (unreachable, timed out, refused).",
            f.errors,
        ),
        (
            "skipped_total",
            "counter",
            "Calls not made while the remote tier was down (retried with backoff).",
            f.skipped,
        ),
        (
            "calls_total",
            "counter",
            "Calls made to the remote tier.",
            f.calls,
        ),
        (
            "up",
            "gauge",
            "1 when the remote tier answered its last call.",
            u64::from(f.up),
        ),
    ];
    for (name, kind, help, value) in rows {
        let _ = writeln!(out, "# HELP llamahdd:cache_remote_{name} {help}");
        let _ = writeln!(out, "# TYPE llamahdd:cache_remote_{name} {kind}");
        let _ = writeln!(out, "llamahdd:cache_remote_{name} {value}");
    }
    let name = "llamahdd:cache_remote_call_seconds";
    let _ = writeln!(
        out,
        "# HELP {name} Latency of the calls to the remote tier."
    );
    let _ = writeln!(out, "# TYPE {name} histogram");
    let mut cumulative = 0;
    for (i, count) in f.latency.iter().enumerate() {
        cumulative += count;
        let le = engine::store::REMOTE_LATENCY_BOUNDS_US
            .get(i)
            .map_or_else(|| "+Inf".to_owned(), |us| format!("{}", *us as f64 / 1e6));
        let _ = writeln!(out, "{name}_bucket{{le=\"{le}\"}} {cumulative}");
    }
    let _ = writeln!(out, "{name}_sum {}", f.latency_sum_us as f64 / 1e6);
    let _ = writeln!(out, "{name}_count {}", f.calls);
}
