//! Tails: the partly filled page after a prompt's full blocks, kept as a small prefix
//! checkpoint named after its last full block ([`TAIL_PREFIX`] and that block's hex id), and
//! found again as the continuation of those blocks when a prompt repeats them
//! ([`PromptCache::find_prefix`], [`PromptCache::load_prefix`]).

use engine::store::{BlockCopy, LoadedPrefix, PrefixCheckpoint, StoredPrefix, CACHED_PREFIX};
use engine::{BlockId, Context, KvLayout, Namespace, SeqId, PAGE_TOKENS};

use crate::PromptCache;

/// Name prefix of the prompt cache's tail checkpoints: `_tail-` and the hex id of the last full
/// block the tail follows (see [`PromptCache::tail_of`]); the store's budget takes them for a
/// cache's ([`CACHED_PREFIX`]). Nobody else names a checkpoint so.
pub const TAIL_PREFIX: &str = CACHED_PREFIX;

/// The name of the tail checkpoint that follows full block `last`: [`TAIL_PREFIX`] and its
/// hex id.
fn tail_name(last: &BlockId) -> String {
    format!("{TAIL_PREFIX}{}", last.to_hex())
}

/// The partly filled page that follows a sequence's full pages, copied out of a context: stored
/// as a small checkpoint named after its last full block ([`TAIL_PREFIX`]), it lets a prompt
/// that continues those blocks take up to a page's worth more tokens from disk.
#[derive(Clone, Debug)]
pub struct TailBlock {
    /// Tokens of the prefix, full blocks and tail.
    pub tokens: Vec<u32>,
    /// KV bytes of the tail as a checkpoint span, in the store's types.
    pub kv: Vec<u8>,
    /// Id of the last full block.
    pub last_block: BlockId,
    /// The namespace of the sequence it came from ([`Context::set_namespace`]).
    pub namespace: Option<Namespace>,
    /// When it expires (seconds since the epoch).
    pub expires_unix: Option<u64>,
    /// For a hybrid model, the recurrent state after `tokens`, stored beside the tail's KV.
    pub state: Option<Vec<u8>>,
}

impl TailBlock {
    /// Its name and the prefix checkpoint that stores it.
    fn into_checkpoint(self) -> (String, PrefixCheckpoint) {
        let name = tail_name(&self.last_block);
        let prefix = PrefixCheckpoint {
            tokens: self.tokens,
            kv: self.kv,
            namespace: self.namespace,
            expires_unix: self.expires_unix,
            state: self.state,
        };
        (name, prefix)
    }
}

impl PromptCache<'_> {
    /// Copies the partial page of the first `len` tokens of `seq` (`None` when `len` is a whole
    /// number of pages or less than one, or when the store could not resume from it:
    /// [`SessionStore::copy_prefix`](engine::store::SessionStore::copy_prefix)), to hand to
    /// [`PromptCache::put_tail`].
    pub fn tail_of(
        &self,
        ctx: &Context,
        seq: SeqId,
        len: usize,
    ) -> engine::Result<Option<TailBlock>> {
        let tokens = ctx.tokens(seq)?;
        let len = len.min(tokens.len());
        let full = len / PAGE_TOKENS;
        if full == 0 || len.is_multiple_of(PAGE_TOKENS) {
            return Ok(None);
        }
        let last_block = ctx.block_ids(seq)?[full - 1];
        let Some(prefix) = self.store.copy_prefix(ctx, seq, len)? else {
            return Ok(None);
        };
        Ok(Some(TailBlock {
            tokens: prefix.tokens,
            kv: prefix.kv,
            last_block,
            namespace: prefix.namespace,
            expires_unix: None,
            state: prefix.state,
        }))
    }

    /// The tails a finished request leaves for the store, expiring at `expires`: the
    /// prompt's own (a repeated prompt ends there), unless the prompt came from a cache
    /// (`cache_n` tokens of its `prompt_len`) and the store still holds it; the one where it
    /// branched from that cached prefix ([`PromptCache::branch_tail`]); and the whole
    /// sequence's (the next turn of a chat continues it).
    pub fn finished_tails(
        &self,
        ctx: &Context,
        seq: SeqId,
        (cache_n, prompt_len): (usize, usize),
        expires: Option<u64>,
    ) -> engine::Result<Vec<TailBlock>> {
        let mut tails = Vec::new();
        if prompt_len > cache_n + 1 || !self.holds_tail(ctx, seq, prompt_len) {
            tails.extend(self.tail_of(ctx, seq, prompt_len)?);
        }
        tails.extend(self.branch_tail(ctx, seq, cache_n, prompt_len)?);
        tails.extend(self.tail_of(ctx, seq, ctx.tokens(seq)?.len())?);
        Ok(with_expiry(tails, expires))
    }

    /// The tails of a prompt just evaluated, handed over before its request finishes (for
    /// the remote tier's other replicas), expiring at `expires`: the prompt's own and the one
    /// where it branched from the cached prefix of `cache_n` tokens it started from.
    pub fn prompt_tails(
        &self,
        ctx: &Context,
        seq: SeqId,
        (cache_n, prompt_len): (usize, usize),
        expires: Option<u64>,
    ) -> engine::Result<Vec<TailBlock>> {
        let mut tails: Vec<_> = self.tail_of(ctx, seq, prompt_len)?.into_iter().collect();
        tails.extend(self.branch_tail(ctx, seq, cache_n, prompt_len)?);
        Ok(with_expiry(tails, expires))
    }

    /// The partly filled page where a prompt of `prompt_len` tokens left the cached prefix of
    /// `cache_n` tokens it started from, when the store has no tail there yet: the tokens the
    /// prompt shares with the prompt that stored that prefix beyond its last full block (the
    /// end of a shared system prompt, say) are then found by the next prompt that branches
    /// there, in another process or on another replica (which share whole blocks only), not
    /// computed again.
    pub fn branch_tail(
        &self,
        ctx: &Context,
        seq: SeqId,
        cache_n: usize,
        prompt_len: usize,
    ) -> engine::Result<Option<TailBlock>> {
        let blocks = cache_n / PAGE_TOKENS;
        let len = blocks * PAGE_TOKENS + PAGE_TOKENS - 1;
        if blocks == 0 || prompt_len <= len || self.holds_tail(ctx, seq, len) {
            return Ok(None);
        }
        self.tail_of(ctx, seq, len)
    }

    /// Whether the store holds a tail checkpoint for the partial page of the first `len` tokens
    /// of `seq` (one file looked for); true when there is no partial page to hold.
    pub fn holds_tail(&self, ctx: &Context, seq: SeqId, len: usize) -> bool {
        let full = len / PAGE_TOKENS;
        if full == 0 || len.is_multiple_of(PAGE_TOKENS) {
            return true;
        }
        let Some(last) = ctx.block_ids(seq).ok().and_then(|ids| ids.get(full - 1)) else {
            return false;
        };
        self.store.exists(&tail_name(last)).unwrap_or(false)
    }

    /// Stores `tail` durably as the tail checkpoint of its last full block (replacing an
    /// earlier one), after its full blocks (which must be in the store). Under the disk budget
    /// it goes like any checkpoint, least recently used first ([`PromptCache::make_room`]).
    pub fn put_tail(&self, tail: TailBlock) -> engine::Result<()> {
        let (name, prefix) = tail.into_checkpoint();
        self.store.save_prefix(&name, prefix)
    }

    /// Writes prompt-cache `blocks` and `tails` to the remote tier (the blocks it lacks, then
    /// the tails' checkpoints): the write-behind half, for the thread that stores them
    /// locally. Returns the blocks written; an error is the tier's (counted), nothing local
    /// changes.
    pub fn push_remote(&self, blocks: &[BlockCopy], tails: &[TailBlock]) -> engine::Result<usize> {
        if !self.store.has_remote() {
            return Ok(0);
        }
        let written = self.store.push_remote_blocks(blocks)?;
        for tail in tails {
            let (name, prefix) = tail.clone().into_checkpoint();
            self.store.push_remote_prefix(&name, prefix)?;
        }
        Ok(written)
    }

    /// The longest prefix of `tokens` the store holds in namespace `ns`: leading full blocks
    /// (from any conversation or process of that namespace; then from the remote tier, if
    /// any), then the tokens of the tail checkpoint that continues them (local, else remote).
    /// A tail that cannot be read or belongs to another model is ignored: it is only a cache.
    pub fn find_prefix(&self, tokens: &[u32], ns: Option<Namespace>) -> StoredPrefix {
        self.store.stored_prefix(tokens, ns, Some(&tail_name))
    }

    /// [`PromptCache::find_prefix`], read and verified into memory for `layout`'s types: the
    /// I/O half of a restore, for a thread that does not own the context
    /// ([`SessionStore::load_prefix`](engine::store::SessionStore::load_prefix); the context's
    /// owner imports it with
    /// [`SessionStore::import_loaded`](engine::store::SessionStore::import_loaded)).
    pub fn load_prefix(
        &self,
        layout: &KvLayout,
        tokens: &[u32],
        skip: usize,
        ns: Option<Namespace>,
    ) -> engine::Result<LoadedPrefix> {
        self.store
            .load_prefix(layout, tokens, skip, ns, Some(&tail_name))
    }
}

/// `tails`, each expiring at `expires`.
fn with_expiry(mut tails: Vec<TailBlock>, expires: Option<u64>) -> Vec<TailBlock> {
    for t in &mut tails {
        t.expires_unix = expires;
    }
    tails
}
