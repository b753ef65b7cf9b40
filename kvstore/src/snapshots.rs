//! Recurrent-state snapshots of hybrid models: the state of every recurrent
//! layer after the last token of a block, kept on disk beside the block as a
//! `ckptfmt` state record (FORMAT.md §5.2) and found by the block's id.
//!
//! A recurrent state cannot be cut back to a shorter prefix, so a sequence
//! that shares a prefix with a stored one resumes at the last block boundary
//! within the shared prefix that has a snapshot: [`ModelStore::resume_point`].
//! Snapshots are large (often many blocks' worth of KV each), so a model keeps
//! at most [`crate::Config::state_budget`] bytes of them: when a write passes
//! it, the snapshots used longest ago go first. Which boundaries get one is
//! the writer's choice (the engine writes one per save, at the last boundary
//! at or before the saved length, so every turn of a conversation leaves one).

use ckptfmt::{BlockId, ChainRoot, FormatError};

use crate::error::{Result, StoreError};
use crate::handle::ModelStore;
use crate::io::BlockIo;

/// Where a sequence of a model with recurrent state can resume: the stored
/// blocks of its longest prefix up to the last boundary with a snapshot, and
/// that snapshot.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StateMatch {
    /// Ids of the blocks up to the boundary, in order.
    pub block_ids: Vec<BlockId>,
    /// Tokens covered (`block_ids.len() × tokens_per_block`); 0 when no
    /// boundary of the prefix has a snapshot.
    pub n_tokens: usize,
    /// The recurrent state after those tokens (every stateful layer's bytes in
    /// layer order); empty when `n_tokens` is 0 (the initial state is zero).
    pub state: Vec<u8>,
}

impl<V: BlockIo> ModelStore<V> {
    /// Writes the recurrent state after the last token of block `id` (the
    /// sequence's first `n_tokens` tokens) durably, unless the store has it,
    /// then keeps the model's snapshots within [`crate::Config::state_budget`]
    /// (the ones used longest ago go first, never this one). Returns whether it
    /// was written.
    pub fn put_state(&self, id: &BlockId, n_tokens: u64, state: &[u8]) -> Result<bool> {
        let store = &self.info.store;
        let written = store
            .put_state(id, n_tokens, state)
            .map_err(|e| StoreError::format(store.root(), e))?;
        if written {
            self.keep_state_budget(id)?;
        } else {
            self.touch_state(id);
        }
        Ok(written)
    }

    /// Whether the store holds a snapshot at the end of block `id` (not verified).
    pub fn has_state(&self, id: &BlockId) -> bool {
        self.info.store.has_state(id).unwrap_or(false)
    }

    /// The verified snapshot at the end of block `id`, marked as used now.
    /// `Ok(None)` when there is none, and when the record fails verification:
    /// a damaged snapshot is quarantined, as a damaged block is (it ends the
    /// usable prefix there), and an earlier one serves instead.
    pub fn get_state(&self, id: &BlockId) -> Result<Option<Vec<u8>>> {
        let store = &self.info.store;
        match store.read_state(id) {
            Ok(rec) => {
                self.touch_state(id);
                let view = rec
                    .view()
                    .map_err(|e| StoreError::format(store.root(), e))?;
                Ok(Some(view.state().to_vec()))
            }
            Err(FormatError::NotFound { .. }) => Ok(None),
            Err(e) if e.is_corruption() => {
                let _ = store.quarantine_state(id);
                Ok(None)
            }
            Err(e) => Err(StoreError::format(store.root(), e)),
        }
    }

    /// Where `tokens` (chained from `roots`, as in [`ModelStore::longest_prefix`]) can
    /// resume: the longest prefix of stored blocks, cut back to its last boundary whose
    /// snapshot reads back verified. Damaged snapshots on the way are quarantined and passed.
    ///
    /// With a remote tier, a later boundary's snapshot that only the tier holds is
    /// fetched (verified, and kept locally): see [`ModelStore::fetch_remote_state`].
    pub fn resume_point(&self, tokens: &[u32], roots: &[ChainRoot]) -> Result<StateMatch> {
        let prefix = self.longest_prefix(tokens, roots);
        let tpb = self.info.geometry.tokens_per_block() as usize;
        let mut local = None;
        for n in (1..=prefix.block_ids.len()).rev() {
            let id = prefix.block_ids[n - 1];
            if !self.has_state(&id) {
                continue;
            }
            if let Some(state) = self.get_state(&id)? {
                local = Some((n, state));
                break;
            }
        }
        let from = local.as_ref().map_or(0, |(n, _)| *n);
        let remote = self
            .fetch_remote_state(&prefix.block_ids, from)
            .map(|(i, state)| (i + 1, state));
        let Some((n, state)) = remote.or(local) else {
            return Ok(StateMatch::default());
        };
        let mut block_ids = prefix.block_ids;
        block_ids.truncate(n);
        Ok(StateMatch {
            block_ids,
            n_tokens: n * tpb,
            state,
        })
    }

    /// The model's snapshots: each block id with its record's bytes on disk.
    pub fn states(&self) -> Result<Vec<(BlockId, u64)>> {
        let store = &self.info.store;
        let ids = store
            .list_states()
            .map_err(|e| StoreError::format(store.root(), e))?;
        let len = self.state_record_len();
        Ok(ids.into_iter().map(|id| (id, len)).collect())
    }

    /// Bytes of one state record of this model.
    fn state_record_len(&self) -> u64 {
        let payload = self.info.geometry.state_bytes();
        ckptfmt::layout::STATE_HEADER_LEN + ckptfmt::layout::align_up(payload)
    }

    /// Deletes the snapshots used longest ago until the model's are within the
    /// budget; `keep` (the one just written) is never deleted. The directory is
    /// listed only when the snapshots this process counted, and wrote since,
    /// could pass the budget (other processes' writes are seen at the next
    /// listing).
    fn keep_state_budget(&self, keep: &BlockId) -> Result<()> {
        use std::sync::atomic::Ordering;
        let budget = self.shared.cfg.state_budget;
        let store = &self.info.store;
        let len = self.state_record_len();
        let seen = &self.info.states_seen;
        let counted = seen
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n != u64::MAX).then(|| n + 1)
            })
            .map_or(u64::MAX, |n| n + 1);
        if counted != u64::MAX && len.saturating_mul(counted) <= budget {
            return Ok(());
        }
        let ids = store
            .list_states()
            .map_err(|e| StoreError::format(store.root(), e))?;
        let mut total = len.saturating_mul(ids.len() as u64);
        seen.store(ids.len() as u64, Ordering::Relaxed);
        if total <= budget {
            return Ok(());
        }
        let mut aged: Vec<(std::time::SystemTime, BlockId)> = ids
            .into_iter()
            .filter(|id| id != keep)
            .map(|id| {
                let at = store
                    .vfs()
                    .stamp(&store.state_path(&id))
                    .ok()
                    .flatten()
                    .map_or(std::time::UNIX_EPOCH, |s| s.modified);
                (at, id)
            })
            .collect();
        aged.sort();
        for (_, id) in aged {
            if total <= budget {
                break;
            }
            match store.delete_state(&id) {
                Ok(()) => total -= len,
                Err(e) if e.is_io_not_found() => total -= len,
                Err(e) => return Err(StoreError::format(store.root(), e)),
            }
        }
        seen.store(total / len.max(1), Ordering::Relaxed);
        Ok(())
    }

    /// Marks the snapshot of block `id` as used now (best effort, as
    /// [`ModelStore::touch_manifest`]; never on a read-only store).
    fn touch_state(&self, id: &BlockId) {
        self.touch(&self.info.store.state_path(id));
    }
}
