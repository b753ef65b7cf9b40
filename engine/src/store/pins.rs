//! Pinned prefixes: a prompt's full blocks kept as a named checkpoint (`_pin-ID`) in its
//! namespace, made through the prompt cache's seam ([`PromptCache::pin`]). The disk budget
//! never drops a pin ([`SessionStore::keep_budget`](super::SessionStore::keep_budget)), so it
//! stays, counted in the budget, until it is unpinned or its expiry passes (a collection
//! deletes it then).

use ckptfmt::{Manifest, Metadata};

use super::prompt_cache::PromptCache;
use super::TAIL_PREFIX;
use crate::error::{Error, Foreign, Result};
use crate::kv::PAGE_TOKENS;
use crate::Namespace;
use kvstore::unix_now;

/// Name prefix of a pin's checkpoint.
pub const PIN_PREFIX: &str = "_pin-";

/// Metadata key of a pin's expiry: kvstore's, so that `ckpt gc` honours it too.
const EXPIRES_KEY: &str = kvstore::EXPIRES_KEY;

/// What [`PromptCache::clear_namespace`] deleted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Cleared {
    /// Checkpoints deleted.
    pub checkpoints: Vec<String>,
    /// Blocks deleted.
    pub blocks: u64,
    /// Blocks left because a live sequence holds them.
    pub busy: u64,
}

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
    /// store already ([`kvstore::StoreError::MissingBlock`] otherwise). Returns the tokens
    /// pinned.
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
        let kv = expires_unix
            .map(|e| vec![(EXPIRES_KEY.to_owned(), e.to_string())])
            .unwrap_or_default();
        let manifest = Manifest::new(
            self.store.fingerprint,
            self.store.handle.geometry().clone(),
            tokens[..full].to_vec(),
            (0..full as i32).collect(),
            Vec::new(),
            Metadata {
                name: format!("{PIN_PREFIX}{id}"),
                parent: None,
                created_unix: unix_now(),
                kv,
            },
        )
        .ours()?
        .with_chain_roots(Namespace::roots(ns))
        .ours()?;
        self.store.handle.save(&manifest).ours()?;
        Ok(full)
    }

    /// Removes pin `id`; false when there was none. Its blocks stay until a collection needs
    /// the room.
    pub fn unpin(&self, id: &str) -> Result<bool> {
        let name = format!("{PIN_PREFIX}{id}");
        if !self.store.handle.has_checkpoint(&name).ours()? {
            return Ok(false);
        }
        self.store.handle.delete(&name).ours()?;
        Ok(true)
    }

    /// Every pin of this model (from disk: those of every process), by id.
    pub fn pins(&self) -> Result<Vec<Pin>> {
        let mut out = Vec::new();
        for name in self.store.handle.list().ours()? {
            let Some(id) = name.strip_prefix(PIN_PREFIX) else {
                continue;
            };
            // One removed or damaged meanwhile is left out.
            let Ok(m) = self.store.handle.read_manifest(&name) else {
                continue;
            };
            out.push(Pin {
                id: id.to_owned(),
                tokens: m.tokens.len(),
                expires_unix: m
                    .meta
                    .kv
                    .iter()
                    .find(|(k, _)| k == EXPIRES_KEY)
                    .and_then(|(_, v)| v.parse().ok()),
                created_unix: m.meta.created_unix,
                namespaced: !m.chain_roots.is_empty(),
            });
        }
        Ok(out)
    }

    /// Deletes the prompt cache of namespace `ns` in the store: its tails, its pins whose id
    /// `pins` accepts, and its blocks on disk and in RAM, except those a live sequence holds
    /// pinned and those a checkpoint of the namespace that stays (a pin `pins` refused, a
    /// `/slots` save) still references: names are deleted only by name.
    pub fn clear_namespace(&self, ns: Namespace, pins: &dyn Fn(&str) -> bool) -> Result<Cleared> {
        let cache = |name: &str| {
            name.starts_with(TAIL_PREFIX) || name.strip_prefix(PIN_PREFIX).is_some_and(pins)
        };
        let r = self.store.handle.delete_chain(&ns.root(), &cache).ours()?;
        Ok(Cleared {
            checkpoints: r.manifests,
            blocks: r.blocks,
            busy: r.busy,
        })
    }
}
