//! The scheduler's gauges for `/metrics`: requests processing and waiting, KV pages used, in
//! all, with their sliding-window rows released, resident and spilled to disk; and the spill
//! counters of the context.
//!
//! Invariant: they are published after every step and before a request's answer goes out, so
//! a client that reads them once it has its answer sees its request done.

use super::Scheduler;
use crate::metrics::Metrics;

impl Scheduler {
    pub(super) fn publish_gauges(&self) {
        let stats = self.ctx.stats();
        let processing = self.slots.iter().filter(|s| s.active.is_some()).count();
        Metrics::set(&self.metrics.requests_processing, processing as u64);
        Metrics::set(&self.metrics.requests_waiting, self.queue.len() as u64);
        Metrics::set(&self.metrics.kv_pages_used, stats.pages_used as u64);
        Metrics::set(&self.metrics.kv_pages_total, stats.pages_total as u64);
        Metrics::set(
            &self.metrics.kv_pages_window_released,
            stats.pages_window_released as u64,
        );
        Metrics::set(
            &self.metrics.kv_pages_resident,
            stats.pages_used.saturating_sub(stats.pages_spilled) as u64,
        );
        Metrics::set(&self.metrics.kv_pages_spilled, stats.pages_spilled as u64);
        self.metrics.spill_seen(&stats);
    }
}
