//! The store's remote tier ([`StoreConfig::remote`](super::StoreConfig::remote)), as the
//! engine uses it: copied blocks and prefix checkpoints written there when their owner asks
//! (a server, behind its responses), named checkpoints written after each save and fetched
//! before a restore that finds none locally, and small values of the application's own.
//! Every failure of the tier is counted and logged by kvstore and is a miss here: the local
//! tiers and the model answer instead.

use ckptfmt::store::BlockInput;
use ckptfmt::Manifest;

use super::copies::{BlockCopy, PrefixCheckpoint};
use super::{RemoteFigures, SessionStore};
use crate::error::{Foreign, Result};

impl SessionStore {
    /// Whether the store has a remote tier.
    pub fn has_remote(&self) -> bool {
        self.handle.remote().is_some()
    }

    /// The remote tier's counters, when there is one.
    pub fn remote_figures(&self) -> Option<RemoteFigures> {
        self.handle.remote().map(|r| r.metrics().figures())
    }

    /// Where the remote tier's changes of state (gone, back, refusing writes) are said.
    pub fn set_remote_log(&self, log: impl Fn(String) + Send + Sync + 'static) {
        if let Some(r) = self.handle.remote() {
            r.metrics().set_log(log);
        }
    }

    /// After a named save: the checkpoint to the remote tier too. Best effort (a failure is
    /// counted by the tier and said once in its log).
    pub(super) fn push_saved(&self, manifest: &Manifest) {
        if self.has_remote() {
            let _ = self.handle.push_remote_checkpoint(manifest);
        }
    }

    /// Checkpoint `name` from the remote tier into the local store, when the local store
    /// lacks it and the tier holds it whole (manifest and blocks, verified): whether the local
    /// store holds it now. A restore does this itself; a program that decides by
    /// [`SessionStore::exists`] whether to resume asks first.
    pub fn fetch_remote_checkpoint(&self, name: &str) -> bool {
        self.has_remote() && self.handle.fetch_remote_checkpoint(name).unwrap_or(false)
    }
}

impl SessionStore {
    /// Writes small values of the application's own to the remote tier, beside this model's
    /// blocks (`kind` names them); a failure is the tier's (counted).
    pub fn push_remote_values(&self, kind: &str, items: &[(String, Vec<u8>)]) -> Result<()> {
        self.handle.push_remote_values(kind, items).ours()
    }

    /// Values [`SessionStore::push_remote_values`] wrote (on any machine), in one round trip;
    /// `None` for each the tier lacks, all `None` without a tier or when it failed.
    pub fn fetch_remote_values(&self, kind: &str, names: &[String]) -> Vec<Option<Vec<u8>>> {
        self.handle.fetch_remote_values(kind, names)
    }

    /// Writes `blocks` to the remote tier (those it lacks), as
    /// [`SessionStore::put_blocks`] stores them locally. Returns the blocks written (0 without
    /// a tier); an error is the tier's (counted), nothing local changes.
    pub fn push_remote_blocks(&self, blocks: &[BlockCopy]) -> Result<usize> {
        if !self.has_remote() {
            return Ok(0);
        }
        let inputs: Vec<BlockInput<'_>> = blocks
            .iter()
            .map(|b| BlockInput {
                prev: b.prev.as_ref(),
                tokens: &b.tokens,
                kv: &b.kv,
            })
            .collect();
        self.handle.push_remote(&inputs).ours()
    }

    /// Writes `prefix` to the remote tier as checkpoint `name`, as
    /// [`SessionStore::save_prefix`] stores it locally (after its blocks:
    /// [`SessionStore::push_remote_blocks`]). Nothing without a tier; an error is the tier's
    /// (counted), nothing local changes.
    pub fn push_remote_prefix(&self, name: &str, prefix: PrefixCheckpoint) -> Result<()> {
        if !self.has_remote() {
            return Ok(());
        }
        let manifest = self.prefix_manifest(name, prefix)?;
        self.handle.push_remote_manifest(&manifest).ours()
    }
}
