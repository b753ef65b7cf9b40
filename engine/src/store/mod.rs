//! Conversations on disk: sessions saved to and restored from a `kvstore` directory, the one
//! persistence path of the chat, the examples, the library and the server.
//!
//! A [`SessionStore`] is one model's part of a store directory. Saving puts the session's full
//! pages as blocks (only those the store does not hold: a page is a block, named by its chained
//! id) and commits a manifest under the checkpoint's name; restoring fills free pages from the
//! verified blocks and switches the session over only when all arrived. Several processes may
//! use one directory at once; kvstore keeps their blocks and manifests consistent, and only its
//! gc, under the disk budget, removes blocks no checkpoint needs.
//!
//! Beyond named conversations, a store offers what a prompt cache is built from, each in
//! general terms: a save in two halves (`copies.rs`: blocks and prefix checkpoints copied out
//! of a context, stored later on another thread), the longest stored prefix of a prompt in a
//! namespace and its restore (`lookup.rs`, `load.rs`, `hybrid.rs`), one disk budget for every
//! process (`budget.rs`), forgetting a namespace (`clear.rs`) and the remote tier
//! (`remote.rs`). Which prefixes a cache keeps, under which names and when, is its owner's.

use std::path::Path;

use ckptfmt::{BlockId, Fingerprint, Manifest, Metadata};
use kvstore::{KvStore, ModelStore};

use crate::context::{Context, SeqId};
use crate::error::{Error, Foreign, Result};
use crate::kv::{KvLayout, KvType, PAGE_TOKENS};
use crate::model::Model;
use crate::session::Session;

mod budget;
mod clear;
mod convert;
mod copies;
mod hybrid;
mod legacy;
mod load;
mod lookup;
mod meta;
mod remote;

// The remote tier's settings and figures are kvstore's, re-exported on purpose: they are
// plain data a user of the store fills in and reads.
pub use budget::{CACHED_PREFIX, PINNED_PREFIX};
pub use clear::Cleared;
pub use convert::geometry;
use convert::{check_kv_types, model_geometry};
pub use copies::{BlockCopy, PrefixCheckpoint};
pub use kvstore::remote::LATENCY_BOUNDS_US as REMOTE_LATENCY_BOUNDS_US;
pub use kvstore::{RemoteConfig, RemoteFigures};
pub use legacy::LegacyStore;
pub use load::LoadedPrefix;
pub use lookup::{Continuation, StoredPrefix};
pub use meta::{CheckpointInfo, CheckpointMeta, OWNER_CHAT, OWNER_SLOT};

/// Tokens per checkpoint block: one KV page.
const TOKENS_PER_BLOCK: u32 = PAGE_TOKENS as u32;

/// What a save did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SaveSummary {
    /// Full blocks put now.
    pub blocks_written: usize,
    /// Full blocks the store already held (a shared prefix or an earlier save).
    pub blocks_reused: usize,
    /// KV bytes handed to the store (new blocks and the partial last block).
    pub bytes_written: u64,
    /// Checkpoints dropped, least recently used first, to keep the disk budget
    /// ([`SessionStore::keep_budget`]).
    pub evicted: Vec<String>,
}

/// An exclusive claim on a checkpoint name ([`SessionStore::claim`]), held until dropped.
#[derive(Debug)]
pub struct Claim(kvstore::Claim);

impl Claim {
    /// The claimed name.
    pub fn name(&self) -> &str {
        self.0.name()
    }
}

/// Budgets of a [`SessionStore`].
#[derive(Clone, Debug)]
pub struct StoreConfig {
    /// Bytes of KV blocks kept in RAM (recently used blocks restore without reading files).
    pub ram_bytes: u64,
    /// Bytes of block files and manifests on disk; `None` for no limit. After each save, and
    /// before a prompt cache writes, blocks that no checkpoint references go, then the least
    /// recently used checkpoints other than pins and claimed ones, until the files fit (see
    /// [`SessionStore::keep_budget`]).
    pub disk_bytes: Option<u64>,
    /// Element type of the K of the sessions saved and restored (all of one store's
    /// conversations of a model share it).
    pub type_k: KvType,
    /// Element type of their V.
    pub type_v: KvType,
    /// Element type of K in the store's blocks, when it differs from `type_k`: pages are
    /// converted on the way in and out (f16 sessions kept as q8_0 at rest take 53% of the
    /// bytes, and a restored session computes with what was stored). `None`: `type_k`.
    pub stored_type_k: Option<KvType>,
    /// Element type of V in the store's blocks (`None`: `type_v`).
    pub stored_type_v: Option<KvType>,
    /// Fault injection for tests: every block read for a restore waits this long first, as
    /// a slow disk would. Zero in use.
    pub read_delay: std::time::Duration,
    /// A remote tier shared with other machines (Redis): prefixes not held locally are looked
    /// for there, and what is stored here is written there too. `None`: none.
    pub remote: Option<RemoteConfig>,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            ram_bytes: 256 << 20,
            disk_bytes: None,
            type_k: KvType::F16,
            type_v: KvType::F16,
            stored_type_k: None,
            stored_type_v: None,
            read_delay: std::time::Duration::ZERO,
            remote: None,
        }
    }
}

impl StoreConfig {
    /// The default configuration for sessions and contexts made with `params`: their KV
    /// types, said once (a session of other types is converted only where `stored_type_*`
    /// asks for it, and otherwise refused).
    pub fn for_context(params: &crate::ContextParams) -> StoreConfig {
        StoreConfig {
            type_k: params.type_k,
            type_v: params.type_v,
            ..StoreConfig::default()
        }
    }
}

/// One model's conversations in a store directory.
pub struct SessionStore {
    store: KvStore,
    handle: ModelStore,
    fingerprint: Fingerprint,
    /// The layout of the stored blocks.
    stored: KvLayout,
    /// The KV types of the sessions this store converts for (the configured ones).
    session_types: (KvType, KvType),
    disk_bytes: Option<u64>,
    /// [`StoreConfig::read_delay`].
    read_delay: std::time::Duration,
    /// The order in which this process stored checkpoints, kept under a budget: files written
    /// within one clock tick share a modification time, and the newest must not be taken for
    /// the oldest.
    stored_order: std::sync::Mutex<(u64, std::collections::HashMap<String, u64>)>,
    /// The bytes the cache's files took when the filesystem was found full
    /// ([`SessionStore::learn_capacity`]): from then on a budget too (`u64::MAX`: none).
    learned_cap: std::sync::atomic::AtomicU64,
    origin: crate::FingerprintOrigin,
    legacy: Option<LegacyStore>,
}

// The server hands a store to its writer thread and shares it with its scheduler.
const _: fn() = || {
    fn shareable<T: Send + Sync>() {}
    shareable::<SessionStore>();
};

impl std::fmt::Debug for SessionStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionStore")
            .field("root", &self.store.root())
            .finish_non_exhaustive()
    }
}

/// The bytes of state snapshots a store keeps per model when no disk budget is set.
const STATE_BUDGET: u64 = 2 << 30;

impl SessionStore {
    /// Opens (or creates) the store at `dir` for `model`'s conversations with the KV types of
    /// `config` (its stored types, where given). Other processes may have it open too. A store
    /// holding this model's conversations with other KV types is refused
    /// ([`Error::KvTypeMismatch`]), nothing written.
    pub fn open(dir: &Path, model: &Model, config: StoreConfig) -> Result<SessionStore> {
        // The disk budget is kept by the store before every write of block files (room made
        // from unreferenced blocks, whatever the blocks' source: computed, spilled from RAM or
        // fetched from the remote tier), and by dropping old checkpoints after a save (see
        // `collect`); a save is never refused for it.
        let cfg = kvstore::Config {
            ram_budget: config.ram_bytes,
            disk_quota: u64::MAX,
            disk_budget: config.disk_bytes,
            // A hybrid model's state snapshots, beside the blocks: at most a quarter of a
            // disk budget (kvstore's own cap otherwise).
            state_budget: config
                .disk_bytes
                .map_or(STATE_BUDGET, |d| (d / 4).min(STATE_BUDGET)),
            remote: config
                .remote
                .as_ref()
                .map(kvstore::Remote::open)
                .transpose()
                .ours()?,
            ..kvstore::Config::default()
        };
        let store = KvStore::open(dir, cfg).ours()?;
        let (fingerprint, origin) = model.remember_fingerprint(dir);
        let fingerprint = Fingerprint(fingerprint);
        let legacy = Fingerprint(model.legacy_fingerprint());
        let legacy = match store.existing_model(&legacy) {
            Some(old) => Some(LegacyStore {
                dir: dir.join(kvstore::store::MODELS_DIR).join(legacy.to_hex()),
                checkpoints: old.list().ours()?.len(),
            }),
            None => None,
        };
        let stored = KvLayout::with_types(
            model.hparams(),
            config.stored_type_k.unwrap_or(config.type_k),
            config.stored_type_v.unwrap_or(config.type_v),
        )?;
        if let Some(existing) = store.existing_model(&fingerprint) {
            check_kv_types(existing.geometry(), &stored)?;
        }
        let handle = store
            .model(fingerprint, model_geometry(&stored, model.hparams())?)
            .ours()?;
        // When a write must make room and unreferenced blocks are not enough, the least
        // recently used cached prefixes go at once. Named conversations go only through
        // `keep_budget`, which holds their claims for its whole pass (a writer's reservation
        // could not), and pins never.
        handle.set_budget_drop_order(std::sync::Arc::new(|name: &str| {
            name.starts_with(CACHED_PREFIX).then_some(0)
        }));
        Ok(SessionStore {
            store,
            handle,
            fingerprint,
            stored,
            session_types: (config.type_k, config.type_v),
            // The store's descriptor and the fingerprint records count in the budget too.
            disk_bytes: config.disk_bytes.map(|b| {
                let descriptor = dir
                    .join(kvstore::store::MODELS_DIR)
                    .join(fingerprint.to_hex())
                    .join(ckptfmt::store::DESCRIPTOR_FILE);
                let descriptor = std::fs::metadata(descriptor).map_or(0, |m| m.len());
                b.saturating_sub(descriptor + crate::model::records_bytes(dir))
            }),
            read_delay: config.read_delay,
            stored_order: std::sync::Mutex::default(),
            learned_cap: std::sync::atomic::AtomicU64::new(u64::MAX),
            origin,
            legacy,
        })
    }

    /// Whether the store's model is a hybrid (recurrent layers): its checkpoints carry the
    /// recurrent state, and its prompts are resumed only where a state was kept (a block
    /// boundary's snapshot, or the end of a continuation: [`SessionStore::restore_prefix`],
    /// [`SessionStore::stored_prefix`]), never from blocks alone.
    pub fn is_hybrid(&self) -> bool {
        self.handle.geometry().has_state()
    }

    /// Whether opening the store hashed the model file or found its fingerprint recorded.
    pub fn fingerprint_origin(&self) -> crate::FingerprintOrigin {
        self.origin
    }

    /// This model's store under fingerprint version 2, when the directory holds one: its
    /// checkpoints are not used (that fingerprint did not cover every byte of the weights).
    pub fn legacy_store(&self) -> Option<&LegacyStore> {
        self.legacy.as_ref()
    }

    /// The store's directory.
    pub fn root(&self) -> &Path {
        self.store.root()
    }

    /// Claims checkpoint name `name` for this process: at most one live process (a chat, a
    /// server's slot save, an ingestion) saves under a name at a time. The claim lasts until it
    /// is dropped or the process exits, however it exits. A name another live claim holds is
    /// refused with [`StoreErrorKind::Busy`](crate::StoreErrorKind::Busy)
    /// ([`Error::busy_pids`] names the holders).
    pub fn claim(&self, name: &str) -> Result<Claim> {
        kvstore::claim(self.root(), name).map(Claim).ours()
    }

    /// Whether a checkpoint `name` exists.
    pub fn exists(&self, name: &str) -> Result<bool> {
        self.handle.has_checkpoint(name).ours()
    }

    /// The names of this model's checkpoints, sorted (no manifest is read:
    /// [`SessionStore::checkpoints`] reads them all).
    pub fn checkpoint_names(&self) -> Result<Vec<String>> {
        self.handle.list().ours()
    }

    /// Every checkpoint of this model, with the bytes each alone holds.
    pub fn checkpoints(&self) -> Result<Vec<CheckpointInfo>> {
        Ok(self
            .handle
            .checkpoints()
            .ours()?
            .into_iter()
            .map(|c| CheckpointInfo {
                name: c.name,
                tokens: c.n_tokens,
                own_bytes: c.own_bytes,
                last_used_unix: c.last_used_unix,
            })
            .collect())
    }

    /// Saves `session` as checkpoint `name` (replacing an older one of that name): puts the
    /// full pages the store lacks, then commits the manifest durably. Under a disk budget,
    /// [`SessionStore::keep_budget`] keeps it afterwards (`name` stays). A shifted session is
    /// saved with its chain roots ([`Context::chain_roots`]): restoring it gives the same KV,
    /// ids and positions.
    pub fn save(
        &self,
        session: &Session,
        name: &str,
        meta: &CheckpointMeta,
    ) -> Result<SaveSummary> {
        self.save_seq(session.context(), session.seq(), name, meta)
    }

    /// Saves sequence `seq` of `ctx` as checkpoint `name`, as [`SessionStore::save`] does for
    /// a session.
    pub fn save_seq(
        &self,
        ctx: &Context,
        seq: SeqId,
        name: &str,
        meta: &CheckpointMeta,
    ) -> Result<SaveSummary> {
        let conversion = self.conversion(ctx.kv_layout())?;
        let tokens = ctx.tokens(seq)?.to_vec();
        let ids = ctx.block_ids(seq)?.to_vec();
        let mut summary = SaveSummary {
            blocks_reused: ids.len(),
            ..SaveSummary::default()
        };
        let new = self.copy_blocks(ctx, seq, 0)?;
        summary.blocks_reused -= new.len();
        summary.blocks_written = self.put_blocks(new)?;
        summary.bytes_written =
            summary.blocks_written as u64 * self.handle.geometry().block_bytes();
        let mut tail = Vec::new();
        if ids.len() * (TOKENS_PER_BLOCK as usize) < tokens.len() {
            ctx.read_page(seq, ids.len(), &mut tail)?;
        }
        let tail = self.session_to_stored(&conversion, tail)?;
        let saved_unix = kvstore::unix_now();
        // Position `i` holds `tokens[i]`, shifted or not (a shift moves the kept tokens down).
        let positions = (0..tokens.len() as i32).collect();
        let manifest = Manifest::new(
            self.fingerprint,
            self.handle.geometry().clone(),
            tokens,
            positions,
            tail,
            Metadata {
                name: name.to_owned(),
                parent: meta.parent.clone(),
                created_unix: saved_unix,
                kv: meta.to_pairs(),
            },
        )
        .ours()?;
        // A shifted sequence's ids chain from its roots: the manifest checks them against those.
        let mut manifest = manifest.with_chain_roots(ctx.chain_roots(seq)?).ours()?;
        if manifest.block_ids != ids {
            return Err(Error::checkpoint(ckptfmt::FormatError::invalid(
                "checkpoint manifest",
                "the sequence's block ids do not chain from its tokens and roots",
            )));
        }
        manifest.sampler_state = meta.sampler_state.clone();
        // A hybrid model's recurrent state after the last token goes beside the KV.
        if let Some(state) = ctx.recurrent_state(seq)? {
            manifest = manifest.with_tail_state(state).ours()?;
        }
        summary.bytes_written += manifest.tail_kv.len() as u64;
        self.handle.save(&manifest).ours()?;
        // And its states at the page boundaries it kept them, under those blocks' ids: where a
        // prompt that parts from this one after a boundary resumes.
        for (n, state) in ctx.boundary_states(seq) {
            if let Some(id) = manifest.block_ids.get(n / PAGE_TOKENS - 1) {
                self.put_snapshot(id, n, &state)?;
            }
        }
        self.note_stored(name);
        self.push_saved(&manifest);
        // Without a budget a save collects nothing (expired checkpoints wait for the next
        // collection): it takes no store-wide lock.
        if self.budget().is_some() {
            summary.evicted = self.keep_budget(Some(name), 0)?;
        }
        Ok(summary)
    }

    /// How many of `tokens`' leading full blocks the store holds (in either tier, from any
    /// process).
    pub fn prefix_blocks(&self, tokens: &[u32]) -> usize {
        self.handle.longest_prefix(tokens, &[]).block_ids.len()
    }

    /// The tokens and metadata of checkpoint `name`, without its KV (its manifest is read and
    /// verified; its blocks are not).
    pub fn read_checkpoint(&self, name: &str) -> Result<(Vec<u32>, CheckpointMeta)> {
        let manifest = self.handle.read_manifest(name).ours()?;
        manifest
            .check_owner(&self.fingerprint, self.handle.geometry())
            .ours()?;
        let meta = CheckpointMeta::from_manifest(&manifest);
        Ok((manifest.tokens, meta))
    }

    /// Replaces `session`'s conversation with checkpoint `name`. The manifest's model and
    /// layout are checked first ([`Error::Checkpoint`] for another model's), then every block
    /// the session does not already hold is read and verified into free pages; on any failure
    /// the session is left exactly as it was. A restore is a use: the disk budget drops the
    /// checkpoints used longest ago first. There are no logits until a token is evaluated
    /// ([`Session::generate`] evaluates the last token again when it needs them).
    pub fn restore(&self, session: &mut Session, name: &str) -> Result<CheckpointMeta> {
        let seq = session.seq();
        self.restore_seq(session.context_mut(), seq, name)
    }

    /// Replaces sequence `seq` of `ctx` with checkpoint `name`, as [`SessionStore::restore`]
    /// does for a session (blocks resident in the pool are shared, not read).
    pub fn restore_seq(&self, ctx: &mut Context, seq: SeqId, name: &str) -> Result<CheckpointMeta> {
        let conversion = self.conversion(ctx.kv_layout())?;
        self.fetch_remote_checkpoint(name);
        let manifest = self.handle.read_manifest(name).ours()?;
        check_kv_types(&manifest.geometry, &self.stored)?;
        manifest
            .check_owner(&self.fingerprint, self.handle.geometry())
            .ours()?;
        if manifest.tokens.len() > ctx.params().n_ctx {
            return Err(Error::ContextFull {
                needed: manifest.tokens.len(),
                n_ctx: ctx.params().n_ctx,
            });
        }
        if let Some((i, p)) = (0..).zip(&manifest.positions).find(|(i, p)| i != *p) {
            return Err(Error::checkpoint(ckptfmt::FormatError::invalid(
                "checkpoint positions",
                format!("token {i} is at position {p}: sequences hold positions 0.. in order"),
            )));
        }
        let (tokens, roots) = (&manifest.tokens, &manifest.chain_roots);
        let tail = self.stored_to_session(&conversion, &manifest.tail_kv)?;
        let state = (!manifest.tail_state.is_empty()).then_some(&manifest.tail_state[..]);
        ctx.import_with_state(seq, tokens, roots, &tail, state, |i, id, sink| {
            if manifest.block_ids.get(i) != Some(id) {
                return Err(Error::checkpoint(ckptfmt::FormatError::invalid(
                    "checkpoint manifest",
                    format!("block {i} id does not chain from its tokens and roots"),
                )));
            }
            self.read_block(&conversion, id, sink)
        })?;
        self.note_used(name);
        Ok(CheckpointMeta::from_manifest(&manifest))
    }

    /// Starts `session` from the longest run of `tokens`' leading full blocks that the store
    /// holds, from any conversation (block ids chain the model and every earlier token, so a
    /// stored id means that whole prefix was computed before). Returns the tokens restored (a
    /// multiple of the block size, possibly 0, always fewer than `tokens.len()` so that one
    /// token is left to evaluate); feed `tokens[n..]` next. On failure the session is left as
    /// it was. Blocks written after a context shift chain from a root, so plain tokens never
    /// match them.
    pub fn restore_prefix(&self, session: &mut Session, tokens: &[u32]) -> Result<usize> {
        let seq = session.seq();
        self.restore_prefix_seq(session.context_mut(), seq, tokens)
    }

    /// Replaces sequence `seq` of `ctx` with the longest stored prefix of `tokens`, as
    /// [`SessionStore::restore_prefix`] does for a session (blocks resident in the pool are
    /// shared, not read).
    pub fn restore_prefix_seq(
        &self,
        ctx: &mut Context,
        seq: SeqId,
        tokens: &[u32],
    ) -> Result<usize> {
        let usable = tokens.len().saturating_sub(1).min(ctx.params().n_ctx);
        // A hybrid model resumes only where a recurrent state was kept: the last block boundary
        // of the stored prefix with a snapshot (blocks alone cannot continue it).
        if ctx.is_hybrid() {
            let conversion = self.conversion(ctx.kv_layout())?;
            let at = self.handle.resume_point(&tokens[..usable], &[]).ours()?;
            if at.n_tokens == 0 {
                return Ok(0);
            }
            let ids = &at.block_ids;
            ctx.import_with_state(
                seq,
                &tokens[..at.n_tokens],
                &[],
                &[],
                Some(&at.state),
                |i, id, sink| {
                    if ids.get(i) != Some(id) {
                        return Err(Error::checkpoint(ckptfmt::FormatError::invalid(
                            "snapshot prefix",
                            format!("block {i} id does not chain from its tokens"),
                        )));
                    }
                    self.read_block(&conversion, id, sink)
                },
            )?;
            return Ok(at.n_tokens);
        }
        let held = self.handle.longest_prefix(&tokens[..usable], &[]);
        let blocks = held.block_ids.len();
        let found = StoredPrefix {
            blocks,
            block_ids: held.block_ids,
            tail: None,
            tokens: blocks * PAGE_TOKENS,
            namespace: None,
            state: None,
        };
        self.restore_stored(ctx, seq, tokens, &found)
    }

    /// Imports `found` into `seq` with `read` for the blocks and `tail_kv` (in the session's
    /// types) for its tail.
    fn import_found<F>(
        &self,
        ctx: &mut Context,
        seq: SeqId,
        tokens: &[u32],
        found: &StoredPrefix,
        tail_kv: Option<&[u8]>,
        read: F,
    ) -> Result<usize>
    where
        F: FnMut(usize, &BlockId, &mut dyn FnMut(&[u8]) -> Result<()>) -> Result<()>,
    {
        if let Some(state) = &found.state {
            // A hybrid's prefix: the state after it comes with it (store/hybrid.rs).
            let roots = crate::Namespace::roots(found.namespace);
            match (&found.tail, tail_kv) {
                (Some(tail), Some(kv)) => ctx.import_with_state(
                    seq,
                    &tail.tokens,
                    &tail.chain_roots,
                    kv,
                    Some(state),
                    read,
                )?,
                _ => ctx.import_with_state(
                    seq,
                    &tokens[..found.tokens],
                    &roots,
                    &[],
                    Some(state),
                    read,
                )?,
            };
            return Ok(found.tokens);
        }
        match (&found.tail, tail_kv) {
            (Some(tail), Some(kv)) => {
                ctx.import_chained(seq, &tail.tokens, &tail.chain_roots, kv, read)?;
                ctx.truncate(seq, found.tokens)?;
            }
            _ => {
                let n = (found.blocks * PAGE_TOKENS).min(tokens.len());
                let roots = crate::Namespace::roots(found.namespace);
                ctx.import_chained(seq, &tokens[..n], &roots, &[], read)?;
            }
        }
        Ok(found.tokens)
    }

    /// Deletes checkpoint `name` (its blocks go at the next gc unless another checkpoint
    /// holds them).
    pub fn delete(&self, name: &str) -> Result<()> {
        self.handle.delete(name).ours()?;
        Ok(())
    }

    /// Saves checkpoint `from` again under the name `to` (with `from` as its parent), writing
    /// no KV: the blocks are shared.
    pub fn branch(&self, from: &str, to: &str) -> Result<()> {
        let mut manifest = self.handle.read_manifest(from).ours()?;
        manifest.meta.name = to.to_owned();
        manifest.meta.parent = Some(from.to_owned());
        self.handle.save(&manifest).ours()?;
        self.note_stored(to);
        Ok(())
    }

    /// The layout of the blocks at rest (for a context spilling pages to it).
    pub(crate) fn stored_layout(&self) -> &KvLayout {
        &self.stored
    }

    /// The model's part of the underlying store (for a context spilling pages to it).
    pub(crate) fn model_store(&self) -> &ModelStore {
        &self.handle
    }

    /// The store's counters (both tiers, this process).
    pub fn metrics(&self) -> kvstore::Metrics {
        self.store.metrics()
    }

    /// Makes every block put so far durable.
    pub fn flush(&self) -> Result<()> {
        self.store.flush().ours()
    }
}

impl SessionStore {
    /// Writes the recurrent state after the first `n` tokens, which end block `id`, as that
    /// block's snapshot (unless the store has it), and pushes it to the remote tier, if any
    /// (best effort, as a checkpoint's own push).
    pub(crate) fn put_snapshot(&self, id: &BlockId, n: usize, state: &[u8]) -> Result<()> {
        if self.handle.put_state(id, n as u64, state).ours()? && self.has_remote() {
            let _ = self.handle.push_remote_state(id);
        }
        Ok(())
    }

    /// Reads and verifies block `id` and hands its KV span, in the context's types, to `sink`.
    fn read_block(
        &self,
        conversion: &Option<KvLayout>,
        id: &BlockId,
        sink: &mut dyn FnMut(&[u8]) -> Result<()>,
    ) -> Result<()> {
        let bytes = self.read_delayed(id)?;
        sink(&self.stored_to_session(conversion, &bytes)?)
    }

    /// Block `id`'s verified bytes in the store's types, not promoted into the RAM tier (the
    /// caller copies them into pages at once), after [`StoreConfig::read_delay`].
    fn read_delayed(&self, id: &BlockId) -> Result<kvstore::KvBytes> {
        if !self.read_delay.is_zero() {
            std::thread::sleep(self.read_delay);
        }
        self.handle
            .get_uncached(id)
            .ours()?
            .ok_or_else(|| Error::store(kvstore::StoreError::BlockNotFound { id: id.to_hex() }))
    }
}
