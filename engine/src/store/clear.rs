//! Forgetting a namespace ([`SessionStore::clear_namespace`]): its blocks on disk and in RAM,
//! and the checkpoints of it that the caller names, in one pass of kvstore's `delete_chain`
//! from the namespace's root.

use super::SessionStore;
use crate::error::{Foreign, Result};
use crate::Namespace;

/// What [`SessionStore::clear_namespace`] deleted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Cleared {
    /// Checkpoints deleted.
    pub checkpoints: Vec<String>,
    /// Blocks deleted.
    pub blocks: u64,
    /// Blocks left because a live sequence holds them.
    pub busy: u64,
}

impl SessionStore {
    /// Deletes namespace `ns`'s part of the store: its checkpoints whose name `which` accepts,
    /// and its blocks on disk and in RAM, except those a live sequence holds pinned and those
    /// a checkpoint of the namespace that stays still references (checkpoints are deleted only
    /// by name).
    pub fn clear_namespace(&self, ns: Namespace, which: &dyn Fn(&str) -> bool) -> Result<Cleared> {
        let r = self.handle.delete_chain(&ns.root(), which).ours()?;
        Ok(Cleared {
            checkpoints: r.manifests,
            blocks: r.blocks,
            busy: r.busy,
        })
    }
}
