//! The stored prefix of a hybrid model's prompt (recurrent layers beside attention, such as
//! Qwen3.5): a sequence resumes only where its recurrent state is known, so the prefix found
//! for a prompt ends at one of two places, whichever covers more of it:
//!
//! - the end of a continuation checkpoint ([`Continuation`]) whose every token the prompt
//!   repeats (its manifest carries the state after them: the previous turn of a conversation,
//!   continued);
//! - the last block boundary of the stored prefix with a snapshot (a prompt that parts from a
//!   stored one inside a block, or whose continuation does not match: an edited or re-tokenized
//!   history), see [`kvstore::ModelStore::resume_point`].
//!
//! Which boundaries keep snapshots is the context's choice (`recurrent.rs`): the end of each
//! prompt's last full page and the last page boundary a reply crossed; the store keeps them
//! within [`kvstore::Config::state_budget`], least recently used going first.

use super::lookup::{Continuation, StoredPrefix};
use super::SessionStore;
use crate::kv::PAGE_TOKENS;
use crate::Namespace;

impl SessionStore {
    /// The prefix of `tokens` a hybrid model's sequence can resume from in namespace `ns` (see
    /// the module's docs); empty when no stored state fits. Damaged snapshots and
    /// continuations are passed over (a damaged snapshot is deleted).
    pub(super) fn find_hybrid(
        &self,
        tokens: &[u32],
        ns: Option<Namespace>,
        continuation: Continuation<'_>,
    ) -> StoredPrefix {
        let roots = Namespace::roots(ns);
        let mut found = StoredPrefix {
            namespace: ns,
            ..StoredPrefix::default()
        };
        if let Ok(at) = self.handle.resume_point(tokens, &roots) {
            if at.n_tokens > 0 {
                found.blocks = at.block_ids.len();
                found.block_ids = at.block_ids;
                found.tokens = at.n_tokens;
                found.state = Some(at.state);
            }
        }
        let held = self.handle.longest_prefix(tokens, &roots);
        let blocks = held.block_ids.len();
        let Some(continuation) = continuation.filter(|_| blocks > 0) else {
            return found;
        };
        let name = continuation(&held.block_ids[blocks - 1]);
        let Some(tail) = self.read_continuation(&name) else {
            return found;
        };
        let fits = tail
            .check_owner(&self.fingerprint, self.handle.geometry())
            .is_ok()
            && !tail.tail_state.is_empty()
            && tail.block_ids == held.block_ids
            && tail.tokens.len() > found.tokens
            && tail.tokens.len() <= tokens.len()
            && tokens.starts_with(&tail.tokens);
        if fits {
            self.note_used(&name);
            found.blocks = blocks;
            found.block_ids = held.block_ids;
            found.tokens = tail.tokens.len();
            found.state = Some(tail.tail_state.clone());
            found.tail = Some(tail);
        }
        found
    }

    /// The prefix of `tokens` a hybrid sequence can resume from within its first `blocks`
    /// stored blocks (after a block beyond them could not be read): the last of them with a
    /// snapshot; empty when none has one.
    pub(super) fn hybrid_within(
        &self,
        tokens: &[u32],
        blocks: usize,
        ns: Option<Namespace>,
    ) -> StoredPrefix {
        let upto = (blocks * PAGE_TOKENS).min(tokens.len());
        let mut found = StoredPrefix {
            namespace: ns,
            ..StoredPrefix::default()
        };
        let at = self
            .handle
            .resume_point(&tokens[..upto], &Namespace::roots(ns));
        if let Ok(at) = at {
            if at.n_tokens > 0 {
                found.blocks = at.block_ids.len();
                found.block_ids = at.block_ids;
                found.tokens = at.n_tokens;
                found.state = Some(at.state);
            }
        }
        found
    }
}
