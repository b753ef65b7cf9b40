//! The longest stored prefix of a prompt in a namespace ([`SessionStore::stored_prefix`]):
//! leading full blocks from any conversation or process of that namespace, then the tokens of
//! a checkpoint that continues them past the last full block, which the caller names from
//! that block's id (a [`Continuation`]); and restoring what was found
//! ([`SessionStore::restore_stored`]), at once or, read on one thread and imported on another,
//! through [`LoadedPrefix`](super::LoadedPrefix).

use ckptfmt::{BlockId, Manifest};

use super::SessionStore;
use crate::context::{Context, SeqId};
use crate::error::Result;
use crate::kv::PAGE_TOKENS;
use crate::Namespace;

/// The name of the checkpoint that may continue a stored prefix past its last full block,
/// given that block's id: a prefix checkpoint ([`SessionStore::save_prefix`]) saved under a
/// name of the block it follows. `None`: blocks alone.
pub type Continuation<'a> = Option<&'a dyn Fn(&BlockId) -> String>;

/// The longest prefix of a prompt that a store holds (see [`SessionStore::stored_prefix`]).
#[derive(Debug, Default)]
pub struct StoredPrefix {
    /// Leading full blocks held.
    pub blocks: usize,
    /// Their ids.
    pub(super) block_ids: Vec<BlockId>,
    /// The checkpoint that continues them, when one matches at least one more token.
    pub(super) tail: Option<Manifest>,
    /// Tokens the store holds: `blocks` pages plus the matching tokens of the continuation.
    pub tokens: usize,
    /// The namespace it was looked up in.
    pub namespace: Option<Namespace>,
    /// For a hybrid model, the recurrent state after `tokens` (a snapshot's, or the
    /// continuation's).
    pub(super) state: Option<Vec<u8>>,
}

impl SessionStore {
    /// The longest prefix of `tokens` the store holds in namespace `ns`: leading full blocks
    /// (from any conversation or process of that namespace; then from the remote tier, if
    /// any, which keeps what it brings), then the tokens of the checkpoint `continuation`
    /// names after the last of them (local, else remote), when it holds exactly those blocks.
    /// A continuation that cannot be read or belongs to another model is ignored; one taken
    /// counts as used ([`SessionStore::keep_budget`] drops the least recently used first).
    ///
    /// For a hybrid model (recurrent layers), blocks alone cannot resume a sequence: the
    /// prefix found ends where a recurrent state was kept (`store/hybrid.rs`).
    pub fn stored_prefix(
        &self,
        tokens: &[u32],
        ns: Option<Namespace>,
        continuation: Continuation<'_>,
    ) -> StoredPrefix {
        if self.handle.geometry().has_state() {
            return self.find_hybrid(tokens, ns, continuation);
        }
        let held = self.handle.longest_prefix(tokens, &Namespace::roots(ns));
        let blocks = held.block_ids.len();
        let start = blocks * PAGE_TOKENS;
        let mut found = StoredPrefix {
            blocks,
            block_ids: held.block_ids,
            tail: None,
            tokens: start,
            namespace: ns,
            state: None,
        };
        let Some(continuation) = continuation else {
            return found;
        };
        if blocks == 0 || tokens.len() == start {
            return found;
        }
        let ids = &found.block_ids;
        let name = continuation(&ids[blocks - 1]);
        let Some(manifest) = self.read_continuation(&name) else {
            return found;
        };
        let fits = manifest
            .check_owner(&self.fingerprint, self.handle.geometry())
            .is_ok()
            && manifest.block_ids.len() == blocks
            && manifest.block_ids.last() == Some(&ids[blocks - 1])
            && manifest.tokens.get(..start) == Some(&tokens[..start]);
        if !fits {
            return found;
        }
        let matching = crate::common_prefix_len(&manifest.tokens[start..], &tokens[start..]);
        if matching > 0 {
            found.tokens = start + matching;
            found.tail = Some(manifest);
            self.note_used(&name);
        }
        found
    }

    /// Checkpoint `name`'s manifest, from the local store, else from the remote tier.
    pub(super) fn read_continuation(&self, name: &str) -> Option<Manifest> {
        self.handle
            .read_manifest(name)
            .ok()
            .or_else(|| self.handle.fetch_remote_manifest(name))
    }

    /// Replaces sequence `seq` of `ctx` with the prefix of `tokens` that
    /// [`SessionStore::stored_prefix`] found (blocks resident in the pool are shared, not
    /// read); returns its length. A block that cannot be read ends the prefix before it when
    /// the blocks before it make one. On failure the sequence is left as it was.
    pub fn restore_stored(
        &self,
        ctx: &mut Context,
        seq: SeqId,
        tokens: &[u32],
        found: &StoredPrefix,
    ) -> Result<usize> {
        let conversion = self.conversion(ctx.kv_layout())?;
        // The first block that could not be read (missing, damaged): the blocks before it
        // still make a usable prefix.
        let failed = std::cell::Cell::new(None::<usize>);
        let read = |i: usize, id: &BlockId, sink: &mut dyn FnMut(&[u8]) -> Result<()>| {
            let r = self.read_block(&conversion, id, sink);
            if r.is_err() && failed.get().is_none_or(|f| i < f) {
                failed.set(Some(i));
            }
            r
        };
        let tail = match &found.tail {
            Some(t) => Some(self.stored_to_session(&conversion, &t.tail_kv)?),
            None => None,
        };
        match self.import_found(ctx, seq, tokens, found, tail.as_deref(), read) {
            Err(e) => match failed.get() {
                Some(good) if good > 0 => {
                    let shorter = StoredPrefix {
                        blocks: good,
                        block_ids: found.block_ids[..good].to_vec(),
                        tail: None,
                        tokens: good * PAGE_TOKENS,
                        namespace: found.namespace,
                        state: None,
                    };
                    let read =
                        |_: usize, id: &BlockId, sink: &mut dyn FnMut(&[u8]) -> Result<()>| {
                            self.read_block(&conversion, id, sink)
                        };
                    self.import_found(ctx, seq, tokens, &shorter, None, read)
                        .map_err(|_| e)
                }
                _ => Err(e),
            },
            ok => ok,
        }
    }
}
