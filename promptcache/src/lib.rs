//! `promptcache`: the server's persistent prompt cache, on the engine's store.
//!
//! The engine's [`SessionStore`] offers what a prompt cache is built from, in general terms:
//! blocks copied out of a context and stored later ([`engine::store::BlockCopy`]), prefix
//! checkpoints ([`engine::store::PrefixCheckpoint`]), the longest stored prefix of a prompt in
//! a namespace ([`SessionStore::stored_prefix`]) and its restore, one disk budget for every
//! process ([`SessionStore::keep_budget`]), forgetting a namespace and the remote tier. This
//! crate is the policy on top, the server's alone:
//!
//! - **tails** (`tail.rs`): the partly filled page after a prompt's full blocks, kept as a
//!   prefix checkpoint named after the last full block ([`TAIL_PREFIX`] and its hex id), so a
//!   prompt that continues those blocks takes up to a page's worth more tokens from disk;
//!   which prefixes get one is decided here too: a finished request's
//!   ([`PromptCache::finished_tails`]) and a prompt's handed over early
//!   ([`PromptCache::prompt_tails`]);
//! - **the write-behind thread** (`writer.rs`: [`Writer`]): blocks and tails the scheduler
//!   copied out, stored without delaying any response, with room made before each round
//!   ([`PromptCache::incoming_bytes`], [`PromptCache::make_room`]) and a capacity learnt from
//!   a full filesystem; pins and clears in order behind them; what it does told through
//!   [`Events`];
//! - **pins** (`pins.rs`): a prompt's full blocks kept through the budget as `_pin-ID`, and a
//!   namespace's cache cleared with the pins it names;
//! - **recent prompts** for the n-gram drafts of a restarted server
//!   ([`PromptCache::recent_prompts`]).
//!
//! The on-disk names (`_tail-HEX`, `_pin-ID`) and formats are those the store's budget knows
//! ([`engine::store::CACHED_PREFIX`], [`engine::store::PINNED_PREFIX`]): stores written before
//! this crate existed keep working.

use engine::store::{BlockCopy, SessionStore};
use engine::Namespace;

mod pins;
mod tail;
mod writer;

pub use engine::store::Cleared;
pub use pins::{Pin, PIN_PREFIX};
pub use tail::{TailBlock, TAIL_PREFIX};
pub use writer::{pin_key, pin_of, ClearWork, Events, PinWork, Work, Writer, MAX_QUEUED_BYTES};

/// What goes wrong in the prompt cache: the store's errors, and requests it refuses.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The store failed.
    #[error(transparent)]
    Engine(#[from] engine::Error),
    /// A pin that cannot be made (see [`PromptCache::pin`]).
    #[error("pin: {0}")]
    InvalidPin(String),
}

/// The prompt cache's results where it refuses requests of its own ([`Error`]); everything
/// else fails only as the store does, with [`engine::Result`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The prompt cache's operations on a [`SessionStore`] (see the [crate] docs).
#[derive(Clone, Copy, Debug)]
pub struct PromptCache<'s> {
    store: &'s SessionStore,
}

/// [`SessionStore::prompt_cache`](StoreExt::prompt_cache): a store seen as a prompt cache.
pub trait StoreExt {
    /// This store as a prompt cache.
    fn prompt_cache(&self) -> PromptCache<'_>;
}

impl StoreExt for SessionStore {
    fn prompt_cache(&self) -> PromptCache<'_> {
        PromptCache { store: self }
    }
}

impl PromptCache<'_> {
    /// Bytes that storing `blocks` and `tails` can add to the directory at most: a block file
    /// each, and a tail checkpoint at most a block's file plus its token list each.
    pub fn incoming_bytes(&self, blocks: &[BlockCopy], tails: &[TailBlock]) -> u64 {
        let per_block = self.store.block_file_bytes();
        let tail_bytes: u64 = tails
            .iter()
            .map(|t| per_block + 8 * t.tokens.len() as u64 + 4096)
            .sum();
        blocks.len() as u64 * per_block + tail_bytes
    }

    /// Keeps the disk budget, if there is one: the store's one policy
    /// ([`SessionStore::keep_budget`]): blocks that no checkpoint references go first, then,
    /// while the files still exceed the budget, checkpoints least recently used first, tails
    /// and named conversations (`/slots` saves) alike, which frees their blocks in turn. Pins
    /// and conversations a live process has claimed stay.
    pub fn collect_unreferenced(&self) -> engine::Result<()> {
        self.make_room(0)
    }

    /// Like [`PromptCache::collect_unreferenced`], leaving room for `incoming` more bytes
    /// under the budget: run before writing, so the directory stays within its budget while
    /// the blocks are written rather than only after. Without a budget a collection still
    /// runs, for the checkpoints that expired (it returns at once when none did).
    pub fn make_room(&self, incoming: u64) -> engine::Result<()> {
        self.store.keep_budget(None, incoming)?;
        Ok(())
    }

    /// The tokens of the prompts cached most recently, newest last, with their namespaces:
    /// those of the tail checkpoints, read while they come to at most `max_tokens` tokens and
    /// `max_prompts` prompts (for n-gram drafts from what each namespace wrote before). A tail
    /// that cannot be read is passed over.
    pub fn recent_prompts(
        &self,
        max_tokens: usize,
        max_prompts: usize,
    ) -> engine::Result<Vec<(Option<Namespace>, Vec<u32>)>> {
        let mut tails: Vec<_> = self
            .store
            .checkpoints()?
            .into_iter()
            .filter(|c| c.name.starts_with(TAIL_PREFIX))
            .collect();
        tails.sort_by_key(|c| std::cmp::Reverse(c.last_used_unix));
        let mut out = Vec::new();
        let mut total = 0;
        for c in tails.into_iter().take(max_prompts) {
            if total + c.tokens > max_tokens {
                break;
            }
            let Ok((prefix, _)) = self.store.read_prefix(&c.name) else {
                continue;
            };
            total += prefix.tokens.len();
            out.push((prefix.namespace, prefix.tokens));
        }
        out.reverse();
        Ok(out)
    }
}
