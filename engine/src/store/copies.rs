//! A save in two halves: the KV of a sequence copied out of its context on the thread that owns
//! the context (a memory copy), and stored later, possibly on another thread (hashing, files,
//! fsync). Its full pages are copied as blocks ([`BlockCopy`]: [`SessionStore::copy_blocks`],
//! [`SessionStore::put_blocks`]); a prefix of it as a checkpoint whose full blocks are stored
//! on their own, which holds the KV of its partly filled last page only ([`PrefixCheckpoint`]:
//! [`SessionStore::copy_prefix`], [`SessionStore::save_prefix`]). [`SessionStore::save_seq`]
//! is both halves at once.

use ckptfmt::{BlockId, ChainRoot, Manifest, Metadata};

use super::{SessionStore, TOKENS_PER_BLOCK};
use crate::context::{Context, SeqId};
use crate::error::{Foreign, Result};
use crate::kv::PAGE_TOKENS;
use crate::Namespace;
use kvstore::unix_now;

/// A full page's block, copied out of a context and not yet in the store (see
/// [`SessionStore::copy_blocks`]).
#[derive(Clone, Debug)]
pub struct BlockCopy {
    /// The id it chains from: the block before it, its chain root after a context shift,
    /// `None` for a plain first block.
    pub prev: Option<BlockId>,
    /// Its own chained id.
    pub id: BlockId,
    /// Its tokens (one page).
    pub tokens: Vec<u32>,
    /// Its KV bytes as a checkpoint span, in the store's types.
    pub kv: Vec<u8>,
    /// For a hybrid model, the recurrent state after its last token (the tokens it follows,
    /// the state bytes), when the sequence kept one there and the store lacks it: stored as
    /// the block's snapshot, where a prompt that parts from this one after the block resumes.
    pub state: Option<(usize, Vec<u8>)>,
}

/// A checkpoint of a sequence's first tokens whose full blocks are stored on their own
/// ([`SessionStore::put_blocks`]): it holds their tokens and the KV of the partly filled page
/// after them. Copied by [`SessionStore::copy_prefix`], stored by
/// [`SessionStore::save_prefix`], read back by [`SessionStore::read_prefix`].
#[derive(Clone, Debug, Default)]
pub struct PrefixCheckpoint {
    /// Tokens of the prefix, full blocks and partial page.
    pub tokens: Vec<u32>,
    /// KV bytes of the partial page as a checkpoint span, in the store's types (empty when
    /// the prefix is a whole number of pages).
    pub kv: Vec<u8>,
    /// The namespace of the sequence it came from ([`Context::set_namespace`]).
    pub namespace: Option<Namespace>,
    /// When it expires (seconds since the epoch): a collection deletes it then, whatever the
    /// budget.
    pub expires_unix: Option<u64>,
    /// For a hybrid model, the recurrent state after `tokens`, stored beside the KV.
    pub state: Option<Vec<u8>>,
}

impl SessionStore {
    /// Copies the full pages of `seq`, from page `from` on, that the store does not hold yet,
    /// and for a hybrid model every page ending where the sequence kept a snapshot the store
    /// lacks (with it): the bytes to hand to [`SessionStore::put_blocks`], possibly on another
    /// thread (a page read is a memory copy; storing it is not).
    pub fn copy_blocks(&self, ctx: &Context, seq: SeqId, from: usize) -> Result<Vec<BlockCopy>> {
        self.copy_block_range(ctx, seq, from..usize::MAX)
    }

    /// [`SessionStore::copy_blocks`] of the full pages in `pages` only (a range past the
    /// sequence's full pages stops at them): a long sequence copied a piece at a time,
    /// between a scheduler's steps. Snapshots of pages before the range go with the piece
    /// that reaches the sequence's end.
    pub fn copy_block_range(
        &self,
        ctx: &Context,
        seq: SeqId,
        pages: std::ops::Range<usize>,
    ) -> Result<Vec<BlockCopy>> {
        let from = pages.start;
        let tpb = TOKENS_PER_BLOCK as usize;
        let conversion = self.conversion(ctx.kv_layout())?;
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
            .filter(|(n, _)| !self.handle.has_state(&ids[n / tpb - 1]))
            .collect();
        let state_of = |i: usize| states.iter().find(|(n, _)| n / tpb == i + 1);
        // Snapshots of pages before the range go with the piece that reaches the end.
        let last_piece = pages.end >= ids.len();
        let missing: Vec<usize> = (0..ids.len().min(pages.end))
            .filter(|&i| {
                (i >= from && !self.handle.contains(&ids[i]))
                    || (state_of(i).is_some() && (i >= from || last_piece))
            })
            .filter(|&i| !ctx.page_released(seq, i).unwrap_or(true))
            .collect();
        let mut spans = vec![Vec::new(); missing.len()];
        ctx.read_full_pages(seq, &missing, &mut spans)?;
        let mut out = Vec::new();
        for (i, kv) in missing.into_iter().zip(spans) {
            let id = &ids[i];
            let kv = self.session_to_stored(&conversion, kv)?;
            out.push(BlockCopy {
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

    /// Puts blocks (as [`SessionStore::copy_blocks`] returns them) into the store's RAM tier;
    /// they become durable at the next spill or [`SessionStore::flush`]. Returns how many the
    /// store did not hold yet.
    pub fn put_blocks(&self, blocks: Vec<BlockCopy>) -> Result<usize> {
        let mut put = 0;
        for b in blocks {
            if !self.handle.contains(&b.id) {
                self.handle.put(b.prev.as_ref(), &b.tokens, b.kv).ours()?;
                put += 1;
            }
            if let Some((n, state)) = &b.state {
                self.put_snapshot(&b.id, *n, state)?;
            }
        }
        Ok(put)
    }

    /// Copies the first `len` tokens of `seq` as a prefix checkpoint: their tokens and the KV
    /// of the partly filled page after their full pages (none when `len` is a whole number of
    /// pages). `None` when such a prefix could not be resumed from by its tokens: a shifted
    /// sequence (its blocks chain from roots), a page whose sliding-window rows were released,
    /// or, for a hybrid model, a prefix shorter than the sequence (the context keeps the
    /// recurrent state of the sequence's end only).
    pub fn copy_prefix(
        &self,
        ctx: &Context,
        seq: SeqId,
        len: usize,
    ) -> Result<Option<PrefixCheckpoint>> {
        let tokens = ctx.tokens(seq)?;
        let len = len.min(tokens.len());
        let full = len / PAGE_TOKENS;
        let partial = !len.is_multiple_of(PAGE_TOKENS);
        if (ctx.is_hybrid() && len != tokens.len())
            || ctx.is_shifted(seq)?
            || (partial && ctx.page_released(seq, full)?)
        {
            return Ok(None);
        }
        let mut kv = Vec::new();
        if partial {
            let conversion = self.conversion(ctx.kv_layout())?;
            ctx.read_page_upto(seq, full, len, &mut kv)?;
            kv = self.session_to_stored(&conversion, kv)?;
        }
        Ok(Some(PrefixCheckpoint {
            tokens: tokens[..len].to_vec(),
            kv,
            namespace: ctx.namespace(seq)?,
            expires_unix: None,
            state: ctx.recurrent_state(seq)?,
        }))
    }

    /// Stores `prefix` durably as checkpoint `name` (replacing an earlier one of that name);
    /// its full blocks must be in the store already
    /// ([`StoreErrorKind::MissingBlock`](crate::StoreErrorKind::MissingBlock) otherwise).
    /// Under the disk budget it goes like any checkpoint ([`SessionStore::keep_budget`]).
    pub fn save_prefix(&self, name: &str, prefix: PrefixCheckpoint) -> Result<()> {
        let manifest = self.prefix_manifest(name, prefix)?;
        self.handle.save(&manifest).ours()?;
        self.note_stored(name);
        Ok(())
    }

    /// Checkpoint `name` as a prefix checkpoint (its manifest read and checked against this
    /// model, not its blocks; the KV of its partial page in the store's types), with when it
    /// was saved (seconds since the epoch).
    pub fn read_prefix(&self, name: &str) -> Result<(PrefixCheckpoint, u64)> {
        let m = self.handle.read_manifest(name).ours()?;
        m.check_owner(&self.fingerprint, self.handle.geometry())
            .ours()?;
        let prefix = PrefixCheckpoint {
            namespace: m
                .chain_roots
                .iter()
                .find(|r| r.block == 0)
                .map(|r| Namespace::from_root(r.id)),
            expires_unix: m
                .meta
                .kv
                .iter()
                .find(|(k, _)| k == kvstore::EXPIRES_KEY)
                .and_then(|(_, v)| v.parse().ok()),
            state: (!m.tail_state.is_empty()).then_some(m.tail_state),
            tokens: m.tokens,
            kv: m.tail_kv,
        };
        Ok((prefix, m.meta.created_unix))
    }

    /// Bytes one block's file takes in the store's directory.
    pub fn block_file_bytes(&self) -> u64 {
        self.handle.block_file_bytes()
    }

    /// The manifest that stores `prefix` as checkpoint `name`.
    pub(super) fn prefix_manifest(&self, name: &str, prefix: PrefixCheckpoint) -> Result<Manifest> {
        let positions = (0..prefix.tokens.len() as i32).collect();
        let mut manifest = Manifest::new(
            self.fingerprint,
            self.handle.geometry().clone(),
            prefix.tokens,
            positions,
            prefix.kv,
            Metadata {
                name: name.to_owned(),
                parent: None,
                created_unix: unix_now(),
                kv: prefix
                    .expires_unix
                    .map(|e| vec![(kvstore::EXPIRES_KEY.to_owned(), e.to_string())])
                    .unwrap_or_default(),
            },
        )
        .ours()?
        .with_chain_roots(Namespace::roots(prefix.namespace))
        .ours()?;
        if let Some(state) = prefix.state {
            manifest = manifest.with_tail_state(state).ours()?;
        }
        Ok(manifest)
    }
}
