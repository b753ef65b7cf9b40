//! The disk budget: one policy for every process on a store (a prompt cache making room
//! before it writes, named saves ([`SessionStore::save`]) after), in
//! [`SessionStore::keep_budget`].
//!
//! Unreferenced blocks go first (least recently used first, the last blocks of a prompt before
//! its first ones). When they are not enough, checkpoints go, least recently used first: a
//! cache's ([`CACHED_PREFIX`]) and named conversations alike, by their manifest's modification
//! time, which a use renews (a prompt that takes a cached prefix, a restore of a
//! conversation); among those of the same time, the one this process stored first goes first.
//! Pinned checkpoints ([`PINNED_PREFIX`]) never go for the budget (only their expiry removes
//! them), nor the checkpoint being saved, nor one that a live process has claimed
//! ([`kvstore::claim`]: the chat holds its conversation so, a `/slots` save its name while it
//! writes). A pinned prompt is the way to keep something through the budget.

use std::cell::RefCell;
use std::collections::HashSet;
use std::sync::atomic::Ordering;

use super::SessionStore;
use crate::error::{Foreign, Result};

/// Name prefix of the checkpoints a cache keeps for itself (a server's prompt cache: the
/// partly filled pages after stored blocks): when a write needs room and unreferenced blocks
/// are not enough they are the first to go, and dropping one takes no claim. Every process
/// that keeps a store's budget knows them by it.
pub const CACHED_PREFIX: &str = "_tail-";

/// Name prefix of pinned checkpoints: the budget never drops them; only their expiry
/// ([`PrefixCheckpoint::expires_unix`](super::PrefixCheckpoint::expires_unix)) removes them.
pub const PINNED_PREFIX: &str = "_pin-";

impl SessionStore {
    /// The disk budget kept now: the configured one ([`super::StoreConfig::disk_bytes`]),
    /// lowered to what the files took when the filesystem was found full
    /// ([`SessionStore::learn_capacity`]); `None` for none.
    pub(super) fn budget(&self) -> Option<u64> {
        match (self.disk_bytes, self.learned_cap.load(Ordering::Relaxed)) {
            (Some(b), l) => Some(b.min(l)),
            (None, u64::MAX) => None,
            (None, l) => Some(l),
        }
    }

    /// Keeps the disk budget with room for `incoming` more bytes, in one indexed pass over the
    /// store: unreferenced blocks go first, then checkpoints, least recently used first, except
    /// pins, `keep` and those a live process has claimed (see the [module](self)). The budget
    /// covers block files and this model's manifests. Checkpoints whose expiry has passed go
    /// whatever the budget; without a budget only they do. Returns the checkpoints dropped for
    /// the budget, least recently used first.
    pub fn keep_budget(&self, keep: Option<&str>, incoming: u64) -> Result<Vec<String>> {
        let budget = self.budget().unwrap_or(u64::MAX);
        let mut order = self
            .stored_order
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let seen = RefCell::new(HashSet::new());
        // The claims taken to find a conversation no one holds are held until the collection
        // is over, so that no process takes one of them meanwhile.
        let claims = RefCell::new(Vec::new());
        let key = |name: &str| {
            let stored = order.1.get(name).copied();
            if stored.is_some() {
                seen.borrow_mut().insert(name.to_owned());
            }
            if name.starts_with(PINNED_PREFIX) || Some(name) == keep {
                return None;
            }
            if !name.starts_with(CACHED_PREFIX) {
                // No claim, no drop: a name another claim holds, or one that cannot be
                // claimed, stays.
                claims
                    .borrow_mut()
                    .push(kvstore::claim(self.store.root(), name).ok()?);
            }
            // Among checkpoints used at the same time, the one stored first goes first (one
            // another process stored, before this process's own).
            Some(stored.unwrap_or(0))
        };
        let report = self
            .handle
            .collect_dropping(budget.saturating_sub(incoming), &key)
            .ours()?;
        drop(claims);
        let seen = seen.into_inner();
        // Forget the order of checkpoints gone (dropped here, or by anyone when the store's
        // manifests were looked at).
        if !seen.is_empty() {
            order.1.retain(|name, _| seen.contains(name));
        }
        for name in &report.manifests_dropped {
            order.1.remove(name);
        }
        Ok(report.manifests_dropped)
    }

    /// After a write failed for want of space (a full filesystem, whatever the budget): what
    /// this model's files take now becomes a budget as well, so that later writes that make
    /// room first ([`SessionStore::keep_budget`]) do not fail. Returns it.
    pub fn learn_capacity(&self) -> Result<u64> {
        let manifests: u64 = self.manifest_files()?.iter().map(|(_, m)| m.len()).sum();
        let used = self.metrics().disk_bytes + manifests;
        self.learned_cap.fetch_min(used, Ordering::Relaxed);
        Ok(used)
    }

    /// This model's manifests with their files' metadata; one removed meanwhile is left out.
    fn manifest_files(&self) -> Result<Vec<(String, std::fs::Metadata)>> {
        Ok(self
            .handle
            .list()
            .ours()?
            .into_iter()
            .filter_map(|name| {
                let meta = self
                    .handle
                    .manifest_path(&name)
                    .ok()
                    .and_then(|p| std::fs::metadata(p).ok())?;
                Some((name, meta))
            })
            .collect())
    }

    /// Notes that this process stored checkpoint `name` now: among checkpoints of the same
    /// modification time (files written within one clock tick share it), the budget drops the
    /// one stored first first. Only kept under a budget.
    pub(super) fn note_stored(&self, name: &str) {
        if self.budget().is_none() {
            return;
        }
        let mut order = self
            .stored_order
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        order.0 += 1;
        let n = order.0;
        order.1.insert(name.to_owned(), n);
    }

    /// Marks checkpoint `name` as used now: the budget drops the checkpoints used longest ago
    /// first, and a checkpoint's last use is its manifest's modification time (the same in
    /// every process). Best effort.
    pub(super) fn note_used(&self, name: &str) {
        self.handle.touch_manifest(name);
    }
}
