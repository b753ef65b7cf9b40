//! Pinned prefixes: a prompt's full blocks kept as a prefix checkpoint `_pin-ID` in its
//! namespace. The store's disk budget never drops a pin ([`engine::store::PINNED_PREFIX`]), so
//! it stays, counted in the budget, until it is unpinned or its expiry passes (a collection
//! deletes it then). And clearing a namespace's cache: its tails and the pins it names.

use engine::store::{Cleared, PrefixCheckpoint, PINNED_PREFIX};
use engine::{Namespace, PAGE_TOKENS};

use crate::{Error, PromptCache, Result, TAIL_PREFIX};

/// Name prefix of a pin's checkpoint: the store's pinned class.
pub const PIN_PREFIX: &str = PINNED_PREFIX;

/// A pinned prefix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pin {
    /// Its id (the checkpoint is `_pin-ID`).
    pub id: String,
    /// Tokens it keeps (whole blocks).
    pub tokens: usize,
    /// When it expires, if it does (seconds since the epoch).
    pub expires_unix: Option<u64>,
    /// When it was pinned (seconds since the epoch).
    pub created_unix: u64,
    /// Whether it is in a namespace other than the shared one.
    pub namespaced: bool,
}

impl PromptCache<'_> {
    /// Pins the full blocks of `tokens` in namespace `ns` as `_pin-ID` until `expires_unix`
    /// (never when `None`); pinning the same id again replaces it. Every block must be in the
    /// store already (the store's `MissingBlock` error otherwise). Returns the tokens pinned.
    pub fn pin(
        &self,
        id: &str,
        tokens: &[u32],
        ns: Option<Namespace>,
        expires_unix: Option<u64>,
    ) -> Result<usize> {
        let full = tokens.len() / PAGE_TOKENS * PAGE_TOKENS;
        if full == 0 {
            return Err(Error::InvalidPin(format!(
                "{} tokens: a pin keeps whole blocks of {PAGE_TOKENS}",
                tokens.len()
            )));
        }
        let prefix = PrefixCheckpoint {
            tokens: tokens[..full].to_vec(),
            kv: Vec::new(),
            namespace: ns,
            expires_unix,
            state: None,
        };
        self.store
            .save_prefix(&format!("{PIN_PREFIX}{id}"), prefix)?;
        Ok(full)
    }

    /// Removes pin `id`; false when there was none. Its blocks stay until a collection needs
    /// the room.
    pub fn unpin(&self, id: &str) -> engine::Result<bool> {
        let name = format!("{PIN_PREFIX}{id}");
        if !self.store.exists(&name)? {
            return Ok(false);
        }
        self.store.delete(&name)?;
        Ok(true)
    }

    /// Every pin of this model (from disk: those of every process), by id.
    pub fn pins(&self) -> engine::Result<Vec<Pin>> {
        let mut out = Vec::new();
        for name in self.store.checkpoint_names()? {
            let Some(id) = name.strip_prefix(PIN_PREFIX) else {
                continue;
            };
            // One removed or damaged meanwhile is left out.
            let Ok((prefix, created_unix)) = self.store.read_prefix(&name) else {
                continue;
            };
            out.push(Pin {
                id: id.to_owned(),
                tokens: prefix.tokens.len(),
                expires_unix: prefix.expires_unix,
                created_unix,
                namespaced: prefix.namespace.is_some(),
            });
        }
        Ok(out)
    }

    /// Deletes the prompt cache of namespace `ns` in the store: its tails, its pins whose id
    /// `pins` accepts, and its blocks on disk and in RAM, except those a live sequence holds
    /// pinned and those a checkpoint of the namespace that stays (a pin `pins` refused, a
    /// `/slots` save) still references: names are deleted only by name.
    pub fn clear_namespace(
        &self,
        ns: Namespace,
        pins: &dyn Fn(&str) -> bool,
    ) -> engine::Result<Cleared> {
        let cache = |name: &str| {
            name.starts_with(TAIL_PREFIX) || name.strip_prefix(PIN_PREFIX).is_some_and(pins)
        };
        self.store.clear_namespace(ns, &cache)
    }
}
