//! The persistent side of the prompt cache is the `promptcache` crate's (its write-behind
//! thread, tails, pins); here is what the server tells it with: its metrics and log
//! ([`promptcache::Events`]).

use std::sync::atomic::Ordering;

pub use promptcache::{pin_key, pin_of, ClearWork, PinWork, Work, Writer};

use crate::metrics::Metrics;

impl promptcache::Events for Metrics {
    fn evaluating(&self) -> bool {
        self.requests_processing.load(Ordering::Relaxed) > 0
    }

    fn writes_dropped(&self, items: u64) {
        Metrics::add(&self.cache_writes_dropped, items);
    }

    fn blocks_written(&self, n: u64) {
        Metrics::add(&self.blocks_written, n);
    }

    fn tails_written(&self, n: u64) {
        Metrics::add(&self.tails_written, n);
    }

    fn round(&self, took: std::time::Duration) {
        Metrics::add(&self.writer_rounds, 1);
        Metrics::add(
            &self.writer_round_us,
            took.as_micros().try_into().unwrap_or(u64::MAX),
        );
    }

    fn log(&self, line: String) {
        Metrics::log(self, line);
    }

    fn disk_full(&self, error: &engine::Error, capacity: u64) {
        Metrics::log(
            self,
            format!(
                "prompt cache: the disk is full ({error}); the cache keeps within {} from now \
                 on, the oldest cached prompts making room",
                kvstore::format_size(capacity)
            ),
        );
    }

    fn disk_writable(&self) {
        Metrics::log(self, "prompt cache: writing again".to_owned());
    }

    fn cache_error(&self, what: String) {
        Metrics::cache_error(self, what);
    }
}
