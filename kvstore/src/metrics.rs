//! Counters of a store, read as one [`Metrics`] snapshot.

/// A snapshot of a store's counters (since open) and gauges (now).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Metrics {
    /// Gets answered from RAM.
    pub ram_hits: u64,
    /// Gets answered from disk (the block was read and promoted).
    pub disk_hits: u64,
    /// Gets of blocks stored in neither tier.
    pub misses: u64,
    /// Bytes read from block files.
    pub bytes_read: u64,
    /// Bytes written to block and manifest files.
    pub bytes_written: u64,
    /// Blocks dropped from RAM by the eviction policy (each has a durable copy).
    pub evictions: u64,
    /// Blocks written to disk because they were evicted (write-behind).
    pub spills: u64,
    /// Blocks written to disk by a flush or a checkpoint save.
    pub writes: u64,
    /// Spill or flush batches that failed (the blocks stayed in RAM).
    pub spill_errors: u64,
    /// Blocks read from disk into RAM.
    pub promotions: u64,
    /// Puts of a block the store already held (shared prefixes).
    pub dedup_blocks: u64,
    /// KV bytes those puts did not need to store again.
    pub dedup_bytes: u64,
    /// Block files reclaimed by garbage collection.
    pub gc_blocks: u64,
    /// Bytes reclaimed by garbage collection.
    pub gc_bytes: u64,
    /// Blocks brought into RAM by prefetch requests.
    pub prefetched_blocks: u64,
    /// Checkpoints saved.
    pub saves: u64,
    /// KV bytes now in RAM.
    pub ram_bytes: u64,
    /// Blocks now in RAM.
    pub ram_blocks: u64,
    /// KV bytes now pinned.
    pub pinned_bytes: u64,
    /// Bytes of block files now on disk (durable).
    pub disk_bytes: u64,
    /// Block files now on disk (durable).
    pub disk_blocks: u64,
}

impl Metrics {
    /// Gets that RAM could not answer (answered from disk, or missed).
    pub fn ram_misses(&self) -> u64 {
        self.disk_hits + self.misses
    }

    /// Fraction of gets answered from RAM (0 when there was none).
    pub fn ram_hit_rate(&self) -> f64 {
        let all = self.ram_hits + self.disk_hits + self.misses;
        if all == 0 {
            0.0
        } else {
            self.ram_hits as f64 / all as f64
        }
    }
}
