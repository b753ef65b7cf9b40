//! The store's remote tier ([`StoreConfig::remote`](super::StoreConfig::remote)), as the
//! engine uses it: prompt blocks and tails written there behind the server's responses, named
//! checkpoints written after each save and fetched before a restore that finds none locally.
//! Every failure of the tier is counted and logged by kvstore and is a miss here: the local
//! tiers and the model answer instead.

use ckptfmt::store::BlockInput;
use ckptfmt::Manifest;

use super::prompt_cache::{NewBlock, PromptCache, TailBlock};
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

impl PromptCache<'_> {
    /// Writes small values of the application's own to the remote tier, beside this model's
    /// blocks (`kind` names them); a failure is the tier's (counted).
    pub fn push_remote_values(&self, kind: &str, items: &[(String, Vec<u8>)]) -> Result<()> {
        self.store.handle.push_remote_values(kind, items).ours()
    }

    /// Values [`PromptCache::push_remote_values`] wrote (on any machine), in one round trip;
    /// `None` for each the tier lacks, all `None` without a tier or when it failed.
    pub fn fetch_remote_values(&self, kind: &str, names: &[String]) -> Vec<Option<Vec<u8>>> {
        self.store.handle.fetch_remote_values(kind, names)
    }

    /// Writes prompt-cache `blocks` and `tails` to the remote tier (the blocks it lacks, then
    /// the tails' checkpoints): the write-behind half, for the thread that stores them
    /// locally. Returns the blocks written; an error is the tier's (counted), nothing local
    /// changes.
    pub fn push_remote(&self, blocks: &[NewBlock], tails: &[TailBlock]) -> Result<usize> {
        if !self.store.has_remote() {
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
        let written = self.store.handle.push_remote(&inputs).ours()?;
        for tail in tails {
            let manifest = self.store.tail_manifest(tail.clone())?;
            self.store.handle.push_remote_manifest(&manifest).ours()?;
        }
        Ok(written)
    }
}
