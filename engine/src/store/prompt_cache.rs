//! The prompt cache's side of a store, the one seam between a server's prompt cache and the
//! store: a [`PromptCache`] (from [`SessionStore::prompt_cache`]) copies a sequence's new full
//! pages out as [`NewBlock`]s and its partly filled last page as a [`TailBlock`] (a small tail
//! checkpoint), finds the longest stored prefix of a prompt ([`StoredPrefix`]), reads it in
//! the background ([`LoadedPrefix`]) or restores it at once, and keeps the store's one disk
//! budget ([`SessionStore::keep_budget`]).
//!
//! It also holds what only a server's prompt cache asks of a store: pins ([`PromptCache::pin`],
//! [`Pin`]), clearing a namespace ([`PromptCache::clear_namespace`]) and small values of its
//! own beside the blocks in the remote tier ([`PromptCache::push_remote_values`]).
//!
//! Saving and restoring named conversations is [`SessionStore`]'s own API; nothing here is
//! needed for that. This seam stays in the engine, as narrow as the server allows, because
//! each operation needs what the engine does not hand out: a context's pages read as
//! checkpoint spans and its chained block ids, the conversion between session and stored KV
//! types, and the store's block and manifest handle, its budget order and its fingerprint.

use ckptfmt::{BlockId, ChainRoot, Manifest, Metadata};

use super::{SessionStore, TOKENS_PER_BLOCK};
use crate::context::{Context, SeqId};
use crate::error::{Foreign, Result};
use crate::kv::PAGE_TOKENS;
use crate::Namespace;
use kvstore::unix_now;

/// A full page's block, copied out of a context and not yet in the store (see
/// [`PromptCache::new_blocks`]).
#[derive(Clone, Debug)]
pub struct NewBlock {
    /// The id it chains from: the block before it, its chain root after a context shift,
    /// `None` for a plain first block.
    pub prev: Option<BlockId>,
    /// Its own chained id.
    pub id: BlockId,
    /// Its tokens (one page).
    pub tokens: Vec<u32>,
    /// Its KV bytes as a checkpoint span.
    pub kv: Vec<u8>,
    /// For a hybrid model, the recurrent state after its last token (the tokens it follows,
    /// the state bytes), when the sequence kept one there and the store lacks it: stored as
    /// the block's snapshot, where a prompt that parts from this one after the block resumes.
    pub state: Option<(usize, Vec<u8>)>,
}

/// Name prefix of the prompt cache's tail checkpoints: `_tail-` and the hex id of the last full
/// block the tail follows (see [`PromptCache::tail_of`]). Nobody else names a checkpoint so.
pub const TAIL_PREFIX: &str = "_tail-";

/// The name of the tail checkpoint that follows full block `last`: [`TAIL_PREFIX`] and its
/// hex id.
pub(super) fn tail_name(last: &BlockId) -> String {
    format!("{TAIL_PREFIX}{}", last.to_hex())
}

/// The longest prefix of a prompt that a store holds (see [`PromptCache::find_prefix`]).
#[derive(Debug, Default)]
pub struct StoredPrefix {
    /// Leading full blocks held.
    pub blocks: usize,
    /// Their ids.
    pub(super) block_ids: Vec<BlockId>,
    /// The tail checkpoint that continues them, when one matches at least one more token.
    pub(super) tail: Option<Manifest>,
    /// Tokens the store holds: `blocks` pages plus the matching tokens of the tail.
    pub tokens: usize,
    /// The namespace it was looked up in.
    pub namespace: Option<crate::Namespace>,
    /// For a hybrid model, the recurrent state after `tokens` (a snapshot's, or the tail's).
    pub(super) state: Option<Vec<u8>>,
}

/// The partly filled page that follows a sequence's full pages, copied out of a context: stored
/// as a small checkpoint named after its last full block ([`TAIL_PREFIX`]), it lets a prompt
/// that continues those blocks take up to a page's worth more tokens from disk.
#[derive(Clone, Debug)]
pub struct TailBlock {
    /// Tokens of the prefix, full blocks and tail.
    pub tokens: Vec<u32>,
    /// KV bytes of the tail as a checkpoint span.
    pub kv: Vec<u8>,
    /// Id of the last full block.
    pub last_block: BlockId,
    /// The namespace of the sequence it came from ([`Context::set_namespace`]).
    pub namespace: Option<crate::Namespace>,
    /// When it expires (seconds since the epoch; [`kvstore::EXPIRES_KEY`]).
    pub expires_unix: Option<u64>,
    /// For a hybrid model, the recurrent state after `tokens`, stored beside the tail's KV.
    pub state: Option<Vec<u8>>,
}

pub use super::load::LoadedPrefix;
pub use super::pins::{Cleared, Pin, PIN_PREFIX};

/// The prompt cache's operations on a [`SessionStore`] (see the [module](self)).
#[derive(Clone, Copy, Debug)]
pub struct PromptCache<'s> {
    pub(super) store: &'s SessionStore,
}

impl SessionStore {
    /// This store as a prompt cache.
    pub fn prompt_cache(&self) -> PromptCache<'_> {
        PromptCache { store: self }
    }

    /// The checkpoint that stores `tail` ([`TAIL_PREFIX`] and its last block's id).
    pub(super) fn tail_manifest(&self, tail: TailBlock) -> Result<Manifest> {
        let name = tail_name(&tail.last_block);
        let positions = (0..tail.tokens.len() as i32).collect();
        let mut manifest = Manifest::new(
            self.fingerprint,
            self.handle.geometry().clone(),
            tail.tokens,
            positions,
            tail.kv,
            Metadata {
                name,
                parent: None,
                created_unix: unix_now(),
                kv: tail
                    .expires_unix
                    .map(|e| vec![(kvstore::EXPIRES_KEY.to_owned(), e.to_string())])
                    .unwrap_or_default(),
            },
        )
        .ours()?
        .with_chain_roots(Namespace::roots(tail.namespace))
        .ours()?;
        if let Some(state) = tail.state {
            manifest = manifest.with_tail_state(state).ours()?;
        }
        Ok(manifest)
    }

    /// This model's manifests (tails and named checkpoints) with their files' metadata; one
    /// removed meanwhile is left out.
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
}

impl PromptCache<'_> {
    /// Copies the partial page of the first `len` tokens of `seq` (`None` when `len` is a whole
    /// number of pages or less than one), to hand to [`PromptCache::put_tail`].
    pub fn tail_of(&self, ctx: &Context, seq: SeqId, len: usize) -> Result<Option<TailBlock>> {
        let tokens = ctx.tokens(seq)?;
        let len = len.min(tokens.len());
        let full = len / PAGE_TOKENS;
        // A shifted sequence's blocks are not found by prompt tokens alone: no tail for it.
        // Nor is a page whose sliding-window rows were released.
        // A hybrid model's tail needs the recurrent state at `len`, which the context keeps
        // for the sequence's end only.
        if full == 0
            || len % PAGE_TOKENS == 0
            || (ctx.is_hybrid() && len != tokens.len())
            || ctx.is_shifted(seq)?
            || ctx.page_released(seq, full)?
        {
            return Ok(None);
        }
        let conversion = self.store.conversion(ctx.kv_layout())?;
        let last_block = ctx.block_ids(seq)?[full - 1];
        let mut kv = Vec::new();
        ctx.read_page_upto(seq, full, len, &mut kv)?;
        let kv = self.store.session_to_stored(&conversion, kv)?;
        Ok(Some(TailBlock {
            tokens: tokens[..len].to_vec(),
            kv,
            last_block,
            namespace: ctx.namespace(seq)?,
            expires_unix: None,
            state: ctx.recurrent_state(seq)?,
        }))
    }

    /// Bytes that storing `blocks` and `tails` can add to the directory at most: a block file
    /// each, and a tail checkpoint at most a block's file plus its token list each.
    pub fn incoming_bytes(&self, blocks: &[NewBlock], tails: &[TailBlock]) -> u64 {
        let per_block = self.store.handle.block_file_bytes();
        let tail_bytes: u64 = tails
            .iter()
            .map(|t| per_block + 8 * t.tokens.len() as u64 + 4096)
            .sum();
        blocks.len() as u64 * per_block + tail_bytes
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
    pub fn put_tail(&self, tail: TailBlock) -> Result<()> {
        let manifest = self.store.tail_manifest(tail)?;
        self.store.handle.save(&manifest).ours()?;
        self.store.note_stored(&manifest.meta.name);
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
    ) -> Result<Vec<(Option<Namespace>, Vec<u32>)>> {
        let mut tails: Vec<_> = self
            .store
            .handle
            .checkpoints()
            .ours()?
            .into_iter()
            .filter(|c| c.name.starts_with(TAIL_PREFIX))
            .collect();
        tails.sort_by_key(|c| std::cmp::Reverse(c.last_used_unix));
        let mut out = Vec::new();
        let mut total = 0;
        for c in tails.into_iter().take(max_prompts) {
            if total + c.n_tokens > max_tokens {
                break;
            }
            let Ok(m) = self.store.handle.read_manifest(&c.name) else {
                continue;
            };
            let ns = m
                .chain_roots
                .iter()
                .find(|r| r.block == 0)
                .map(|r| Namespace::from_root(r.id));
            total += m.tokens.len();
            out.push((ns, m.tokens));
        }
        out.reverse();
        Ok(out)
    }

    /// The longest prefix of `tokens` the store holds in namespace `ns`: leading full blocks
    /// (from any conversation or process of that namespace; then from the remote tier, if
    /// any, which keeps what it brings), then the tokens of the tail checkpoint that continues
    /// them (local, else remote). A tail that cannot be read or belongs to another model
    /// is ignored: it is only a cache.
    ///
    /// For a hybrid model (recurrent layers), blocks alone cannot resume a sequence: the
    /// prefix found ends where a recurrent state was kept ([`PromptCache::find_hybrid`]).
    pub fn find_prefix(&self, tokens: &[u32], ns: Option<Namespace>) -> StoredPrefix {
        if self.store.handle.geometry().has_state() {
            return self.find_hybrid(tokens, ns);
        }
        let held = self
            .store
            .handle
            .longest_prefix(tokens, &Namespace::roots(ns));
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
        if blocks == 0 || tokens.len() == start {
            return found;
        }
        let ids = &found.block_ids;
        let name = tail_name(&ids[blocks - 1]);
        let Some(manifest) = self
            .store
            .handle
            .read_manifest(&name)
            .ok()
            .or_else(|| self.store.handle.fetch_remote_manifest(&name))
        else {
            return found;
        };
        let fits = manifest
            .check_owner(&self.store.fingerprint, self.store.handle.geometry())
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
            self.store.note_used(&name);
        }
        found
    }

    /// Keeps the disk budget, if there is one, for a prompt cache: the store's one policy
    /// ([`SessionStore::keep_budget`]): blocks that no checkpoint references go first, then,
    /// while the files still exceed the budget, checkpoints least recently used first, tails
    /// and named conversations (`/slots` saves) alike, which frees their blocks in turn. Pins
    /// and conversations a live process has claimed stay.
    pub fn collect_unreferenced(&self) -> Result<()> {
        self.make_room(0)
    }

    /// Like [`PromptCache::collect_unreferenced`], leaving room for `incoming` more bytes
    /// under the budget: run before writing, so the directory stays within its budget while
    /// the blocks are written rather than only after. Without a budget a collection still
    /// runs, for the checkpoints that expired (it returns at once when none did).
    pub fn make_room(&self, incoming: u64) -> Result<()> {
        self.store.keep_budget(None, incoming)?;
        Ok(())
    }

    /// After a write failed for want of space (a full filesystem, whatever the budget): what
    /// the cache's files take now becomes a budget as well, so that later rounds make room
    /// before they write ([`PromptCache::make_room`]) instead of failing. Returns it.
    pub fn learn_capacity(&self) -> Result<u64> {
        let manifests: u64 = self
            .store
            .manifest_files()?
            .iter()
            .map(|(_, m)| m.len())
            .sum();
        let used = self.store.metrics().disk_bytes + manifests;
        self.store
            .learned_cap
            .fetch_min(used, std::sync::atomic::Ordering::Relaxed);
        Ok(used)
    }

    /// Copies the full pages of `seq`, from page `from` on, that the store does not hold yet,
    /// and for a hybrid model every page ending where the sequence kept a snapshot the store
    /// lacks (with it): the bytes to hand to [`PromptCache::put_blocks`], possibly on another
    /// thread (a page read is a memory copy; storing it is not).
    pub fn new_blocks(&self, ctx: &Context, seq: SeqId, from: usize) -> Result<Vec<NewBlock>> {
        let tpb = TOKENS_PER_BLOCK as usize;
        let conversion = self.store.conversion(ctx.kv_layout())?;
        let tokens = ctx.tokens(seq)?;
        let ids = ctx.block_ids(seq)?;
        let roots = ctx.chain_roots(seq)?;
        // Every missing page in one batch of transfers (one wait, when the KV is on a GPU).
        // A page whose sliding-window rows were released was handed over before its release
        // ([`Context::release_windows`]); it cannot be read again.
        // A hybrid sequence's states at boundaries go with their blocks, before `from` too
        // (the sequence keeps few, and forgets them as it goes on); a block the store holds
        // is copied again when its snapshot is new.
        let states: Vec<(usize, Vec<u8>)> = ctx
            .boundary_states(seq)
            .into_iter()
            .filter(|(n, _)| !self.store.handle.has_state(&ids[n / tpb - 1]))
            .collect();
        let state_of = |i: usize| states.iter().find(|(n, _)| n / tpb == i + 1);
        let missing: Vec<usize> = (0..ids.len())
            .filter(|&i| {
                (i >= from && !self.store.handle.contains(&ids[i])) || state_of(i).is_some()
            })
            .filter(|&i| !ctx.page_released(seq, i).unwrap_or(true))
            .collect();
        let mut spans = vec![Vec::new(); missing.len()];
        ctx.read_full_pages(seq, &missing, &mut spans)?;
        let mut out = Vec::new();
        for (i, kv) in missing.into_iter().zip(spans) {
            let id = &ids[i];
            let kv = self.store.session_to_stored(&conversion, kv)?;
            out.push(NewBlock {
                prev: ChainRoot::find(&roots, i)
                    .or_else(|| i.checked_sub(1).map(|p| &ids[p]))
                    .copied(),
                id: *id,
                tokens: tokens[i * tpb..(i + 1) * tpb].to_vec(),
                kv,
                state: state_of(i).cloned(),
            });
        }
        Ok(out)
    }

    /// Puts blocks (as [`PromptCache::new_blocks`] returns them) into the store's RAM tier;
    /// they become durable at the next spill or [`SessionStore::flush`]. Returns how many the
    /// store did not hold yet.
    pub fn put_blocks(&self, blocks: Vec<NewBlock>) -> Result<usize> {
        let mut put = 0;
        for b in blocks {
            if !self.store.handle.contains(&b.id) {
                self.store
                    .handle
                    .put(b.prev.as_ref(), &b.tokens, b.kv)
                    .ours()?;
                put += 1;
            }
            if let Some((n, state)) = &b.state {
                self.store.put_snapshot(&b.id, *n, state)?;
            }
        }
        Ok(put)
    }

    /// Replaces sequence `seq` of `ctx` with the prefix of `tokens` that
    /// [`PromptCache::find_prefix`] found (blocks resident in the pool are shared, not read);
    /// returns its length. On failure the sequence is left as it was.
    pub fn restore_found(
        &self,
        ctx: &mut Context,
        seq: SeqId,
        tokens: &[u32],
        found: &StoredPrefix,
    ) -> Result<usize> {
        let conversion = self.store.conversion(ctx.kv_layout())?;
        // The first block that could not be read (missing, damaged): the blocks before it
        // still make a usable prefix.
        let failed = std::cell::Cell::new(None::<usize>);
        let read = |i: usize, id: &BlockId, sink: &mut dyn FnMut(&[u8]) -> Result<()>| {
            let r = self.store.read_block(&conversion, id, sink);
            if r.is_err() && failed.get().is_none_or(|f| i < f) {
                failed.set(Some(i));
            }
            r
        };
        let tail = match &found.tail {
            Some(t) => Some(self.store.stored_to_session(&conversion, &t.tail_kv)?),
            None => None,
        };
        match self
            .store
            .import_found(ctx, seq, tokens, found, tail.as_deref(), read)
        {
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
                            self.store.read_block(&conversion, id, sink)
                        };
                    self.store
                        .import_found(ctx, seq, tokens, &shorter, None, read)
                        .map_err(|_| e)
                }
                _ => Err(e),
            },
            ok => ok,
        }
    }
}
