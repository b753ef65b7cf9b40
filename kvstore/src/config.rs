//! Settings of a store and what opening it found.

use ckptfmt::Encoding;

use crate::policy::PolicyKind;

/// How much checking [`crate::KvStore::open`] does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum VerifyLevel {
    /// Every checkpoint's blocks must exist (one directory listing); block
    /// contents are verified when read.
    #[default]
    Exists,
    /// Every block file is read and verified (CRC, id, owner); damaged files
    /// are quarantined before checkpoints are checked.
    Full,
}

/// Settings of a store.
#[derive(Debug, Clone)]
pub struct Config {
    /// Bytes of KV the RAM tier may hold (pinned blocks included).
    pub ram_budget: u64,
    /// Bytes of block files the disk tier may hold: a write that would pass it even after
    /// garbage collection is refused ([`crate::StoreError::QuotaExceeded`]).
    pub disk_quota: u64,
    /// Bytes the store's files (block files and manifests) are kept within, or `None`. Room is
    /// made before every write of block files, whatever the blocks' source (put here, spilled
    /// from RAM, fetched from the remote tier), by deleting unreferenced blocks, least recently
    /// used first; a write is never refused for it: what referenced or pinned blocks keep is
    /// the caller's to free ([`crate::ModelStore::collect_dropping`]).
    pub disk_budget: Option<u64>,
    /// Eviction policy of the RAM tier.
    pub policy: PolicyKind,
    /// Spill and prefetch on background threads. When false, spills run in
    /// the calling thread and prefetches run inline (deterministic; tests).
    pub background: bool,
    /// Most bytes waiting to be spilled before a put waits for the spiller.
    pub max_spill_backlog: u64,
    /// Bytes written per spill batch (one directory sync per batch).
    pub spill_batch_bytes: u64,
    /// Concurrent file reads of one prefetch (a disk serves several reads
    /// at once faster than one after the other).
    pub prefetch_readers: usize,
    /// How block payloads are stored on disk.
    pub encoding: Encoding,
    /// Checks run by [`crate::KvStore::open`].
    pub verify: VerifyLevel,
    /// A tier below the disk shared by several machines ([`crate::remote`]); `None`: none.
    pub remote: Option<crate::remote::Remote>,
    /// Bytes of recurrent-state snapshots (hybrid models' state records) each model keeps on
    /// disk: a write that passes it deletes the snapshots used longest ago.
    pub state_budget: u64,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            ram_budget: 1 << 30,
            disk_quota: 16 << 30,
            disk_budget: None,
            policy: PolicyKind::default(),
            background: true,
            max_spill_backlog: 256 << 20,
            spill_batch_bytes: 32 << 20,
            prefetch_readers: 4,
            encoding: Encoding::Raw,
            verify: VerifyLevel::default(),
            remote: None,
            state_budget: 2 << 30,
        }
    }
}

/// A checkpoint that cannot be restored whole, found when the store opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DamagedCheckpoint {
    /// Fingerprint of its model (hex).
    pub fingerprint: String,
    /// Its name.
    pub name: String,
    /// Leading blocks present (restorable up to there); 0 when the manifest
    /// itself is damaged.
    pub good_blocks: usize,
    /// What is wrong.
    pub reason: String,
}

/// What [`crate::KvStore::open`] found. Nothing is deleted: damaged
/// checkpoints stay on disk (reported here) until deleted on purpose.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Models found.
    pub models: usize,
    /// Block files found (after quarantining damaged ones).
    pub blocks: usize,
    /// Checkpoints whose blocks are all present.
    pub checkpoints: usize,
    /// Block files moved to quarantine because they did not verify (only
    /// with [`VerifyLevel::Full`]).
    pub quarantined_blocks: usize,
    /// Checkpoints with a missing or damaged block, or a damaged manifest.
    pub damaged_checkpoints: Vec<DamagedCheckpoint>,
}

/// What [`crate::ModelStore::delete_chain`] removed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChainReport {
    /// Checkpoints deleted (their first block chained from the root).
    pub manifests: Vec<String>,
    /// Blocks deleted, from disk or from RAM.
    pub blocks: u64,
    /// Blocks of the chain left because a live sequence holds them (pinned in RAM) or they
    /// were being written.
    pub busy: u64,
}

/// What a garbage collection reclaimed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GcReport {
    /// Block files deleted.
    pub blocks: u64,
    /// Bytes of those files.
    pub bytes: u64,
    /// Damaged manifests moved into their store's quarantine directory (they
    /// name no usable blocks; left in place they would keep any collection
    /// from proving a block unneeded).
    pub set_aside: Vec<std::path::PathBuf>,
    /// Manifests read to find the live blocks (those new or changed since this
    /// process last looked; unchanged files are known by their stamps).
    pub manifests_read: usize,
    /// Manifests deleted to make room ([`crate::ModelStore::collect_dropping`]).
    pub manifests_dropped: Vec<String>,
    /// Manifests deleted because their expiry ([`crate::EXPIRES_KEY`]) had passed.
    pub manifests_expired: Vec<String>,
}
