//! A stored prefix read into memory on one thread and imported into a context on another: the
//! server's loader thread does the lookup, the file reads, the verification and any type
//! conversion, so the thread that owns the context only copies bytes into free pages.

use ckptfmt::BlockId;
use kvstore::KvBytes;

use super::lookup::{Continuation, StoredPrefix};
use super::SessionStore;
use crate::context::{Context, SeqId};
use crate::error::{Error, Result};
use crate::kv::{KvLayout, PAGE_TOKENS};

/// One block's KV span in the session's types: the store's own bytes when no conversion was
/// needed, else the converted copy.
enum Span {
    Shared(KvBytes),
    Owned(Vec<u8>),
}

impl std::ops::Deref for Span {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            Span::Shared(b) => b,
            Span::Owned(v) => v,
        }
    }
}

/// The longest stored prefix of a prompt, read and verified into memory by
/// [`SessionStore::load_prefix`], ready for [`SessionStore::import_loaded`].
pub struct LoadedPrefix {
    /// The prefix found (its blocks and the checkpoint that continues them).
    found: StoredPrefix,
    /// Leading blocks not read because the context held them when the load was asked for.
    skipped: usize,
    /// The spans of blocks `skipped..found.blocks`, in the session's types.
    spans: Vec<Span>,
    /// The tail's span in the session's types, when `found` has a tail.
    tail: Option<Vec<u8>>,
    /// The session layout the spans were converted for.
    layout: KvLayout,
}

impl std::fmt::Debug for LoadedPrefix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedPrefix")
            .field("tokens", &self.found.tokens)
            .field("blocks", &self.found.blocks)
            .field("skipped", &self.skipped)
            .finish_non_exhaustive()
    }
}

impl LoadedPrefix {
    /// Tokens of the prompt the loaded prefix covers.
    pub fn tokens(&self) -> usize {
        self.found.tokens
    }

    /// Blocks read from the store (not counting the skipped ones).
    pub fn blocks_read(&self) -> usize {
        self.spans.len()
    }
}

impl SessionStore {
    /// Finds the longest stored prefix of `tokens` in namespace `ns` with `continuation`
    /// ([`SessionStore::stored_prefix`]) and reads its blocks and continuation, verified and
    /// converted to `layout`'s types, into memory: the I/O half of a restore, for a thread
    /// that does not own the context. The first `skip` blocks are
    /// not read (the context holds them; [`Context::resident_prefix`]). A block that cannot be
    /// read ends the prefix there (the blocks before it are kept); a store that holds nothing
    /// of the prompt gives an empty prefix.
    pub fn load_prefix(
        &self,
        layout: &KvLayout,
        tokens: &[u32],
        skip: usize,
        ns: Option<crate::Namespace>,
        continuation: Continuation<'_>,
    ) -> Result<LoadedPrefix> {
        let conversion = self.conversion(layout)?;
        let mut found = self.stored_prefix(tokens, ns, continuation);
        let skipped = skip.min(found.blocks);
        let ids = found.block_ids.clone();
        let mut spans = Vec::with_capacity(found.blocks - skipped);
        let read = |id: &BlockId| {
            self.read_delayed(id).and_then(|bytes| match &conversion {
                Some(to) => Ok(Span::Owned(self.stored.convert_span(&bytes, to)?)),
                None => Ok(Span::Shared(bytes)),
            })
        };
        let read = read_all(&ids[skipped..], read);
        for (i, span) in (skipped..).zip(read) {
            match span {
                Ok(s) => spans.push(s),
                // A missing or damaged block ends the usable prefix where it is (for a hybrid
                // model, at the last snapshot before it).
                Err(_) => {
                    found = match found.state {
                        Some(_) => self.hybrid_within(tokens, i, ns),
                        None => StoredPrefix {
                            blocks: i,
                            block_ids: ids[..i].to_vec(),
                            tail: None,
                            tokens: i * PAGE_TOKENS,
                            namespace: ns,
                            state: None,
                        },
                    };
                    spans.truncate(found.blocks.saturating_sub(skipped));
                    break;
                }
            }
        }
        let tail = match found.tail.as_ref().map(|m| &m.tail_kv) {
            Some(kv) => match self.stored_to_session(&conversion, kv) {
                Ok(span) => Some(span.into_owned()),
                Err(_) if found.state.is_some() => {
                    found = self.hybrid_within(tokens, found.blocks, ns);
                    spans.truncate(found.blocks.saturating_sub(skipped));
                    None
                }
                Err(_) => {
                    found.tail = None;
                    found.tokens = found.blocks * PAGE_TOKENS;
                    None
                }
            },
            None => None,
        };
        Ok(LoadedPrefix {
            found,
            skipped,
            spans,
            tail,
            layout: layout.clone(),
        })
    }

    /// Replaces sequence `seq` of `ctx` with `loaded`, the prefix of `tokens` that
    /// [`SessionStore::load_prefix`] read; returns its length. Only memory is copied. Fails,
    /// leaving the sequence as it was, when the context's layout is not the one loaded for, or
    /// when a skipped block is no longer resident.
    pub fn import_loaded(
        &self,
        ctx: &mut Context,
        seq: SeqId,
        tokens: &[u32],
        loaded: &LoadedPrefix,
    ) -> Result<usize> {
        if ctx.kv_layout() != &loaded.layout {
            return Err(Error::KvTypeMismatch {
                stored_k: loaded.layout.type_k.to_string(),
                stored_v: loaded.layout.type_v.to_string(),
                session_k: ctx.kv_layout().type_k,
                session_v: ctx.kv_layout().type_v,
            });
        }
        let read = |i: usize, id: &BlockId, sink: &mut dyn FnMut(&[u8]) -> Result<()>| match i
            .checked_sub(loaded.skipped)
            .and_then(|j| loaded.spans.get(j))
        {
            Some(span) => sink(span),
            None => Err(Error::store(kvstore::StoreError::BlockNotFound {
                id: id.to_hex(),
            })),
        };
        self.import_found(
            ctx,
            seq,
            tokens,
            &loaded.found,
            loaded.tail.as_deref(),
            read,
        )
    }
}

/// Threads that read and verify a long prefix's blocks at most.
const READ_THREADS: usize = 4;

/// `read` of every id, in order: for a prefix of 8 blocks or more, on up to [`READ_THREADS`]
/// threads (each a run of the blocks), since reading and verifying a block is work of its own
/// and the request waits for all of them.
fn read_all<T: Send>(
    ids: &[BlockId],
    read: impl Fn(&BlockId) -> Result<T> + Sync,
) -> Vec<Result<T>> {
    let threads = std::thread::available_parallelism()
        .map_or(1, std::num::NonZero::get)
        .min(READ_THREADS);
    if threads < 2 || ids.len() < 8 {
        return ids.iter().map(read).collect();
    }
    let read = &read;
    std::thread::scope(|s| {
        let runs: Vec<_> = ids
            .chunks(ids.len().div_ceil(threads))
            .map(|run| s.spawn(move || run.iter().map(read).collect::<Vec<_>>()))
            .collect();
        runs.into_iter()
            .flat_map(|run| run.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    })
}
