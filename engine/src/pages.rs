//! KV pages in and out of a [`Context`] as checkpoint blocks, without running the model.
//!
//! A page's bytes as a block follow ckptfmt's span layout: layer after layer, the K bytes of the
//! page's tokens, then their V bytes (see [`crate::kv`]). Export copies one layer's rows at a
//! time; import fills free pages and switches the sequence over only when every block arrived,
//! so a failed import leaves the sequence as it was.

use std::ops::Range;

use ckptfmt::{BlockId, ChainRoot};

use crate::context::{Context, SeqId};
use crate::error::{Error, Result};
use crate::kv::{KvLayout, PAGE_TOKENS};

/// What [`Context::import`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ImportSummary {
    /// Full blocks found resident in the pool and shared, not read.
    pub blocks_shared: usize,
    /// Full blocks read through the caller's reader.
    pub blocks_read: usize,
    /// Tokens of the partial last block written from the tail bytes.
    pub tail_tokens: usize,
    /// Full blocks attached where they lie, as pages spilled to their files (verified, not
    /// read into RAM): under a RAM budget ([`ContextParams::kv_ram`]), the blocks past what it
    /// holds, when the spill store has them.
    ///
    /// [`ContextParams::kv_ram`]: crate::ContextParams::kv_ram
    pub blocks_attached: usize,
}

impl Context {
    /// Bytes of one span of `n` tokens (ckptfmt's layout).
    pub fn span_bytes(&self, n: usize) -> usize {
        n * self.kv_layout().bytes_per_token()
    }

    /// Copies the KV of `seq`'s page `index` (positions `index * PAGE_TOKENS ..`, up to the
    /// sequence's length) into `out` as a checkpoint span; returns the number of tokens.
    pub fn read_page(&self, seq: SeqId, index: usize, out: &mut Vec<u8>) -> Result<usize> {
        self.read_page_upto(seq, index, usize::MAX, out)
    }

    /// Like [`Context::read_page`], but only positions before `upto` (the KV of a prefix of
    /// the sequence: an earlier position's rows never change once written).
    pub fn read_page_upto(
        &self,
        seq: SeqId,
        index: usize,
        upto: usize,
        out: &mut Vec<u8>,
    ) -> Result<usize> {
        let s = self.seq(seq)?;
        let len = s.tokens.len().min(upto);
        if len <= index * PAGE_TOKENS {
            return Err(Error::KvRange {
                layer: 0,
                start: index * PAGE_TOKENS,
                end: (index + 1) * PAGE_TOKENS,
                len,
            });
        }
        let Some(&page) = s.pages.get(index) else {
            return Err(Error::KvRange {
                layer: 0,
                start: index * PAGE_TOKENS,
                end: (index + 1) * PAGE_TOKENS,
                len,
            });
        };
        if self.pool.is_released(page) {
            return Err(Error::WindowReleased {
                seq,
                position: index * PAGE_TOKENS,
            });
        }
        let n = (len - index * PAGE_TOKENS).min(PAGE_TOKENS);
        out.clear();
        if self.pool.is_spilled(page) {
            // From its block file: each layer's K and V rows of the first `n` tokens.
            let block = self.spilled_block(page)?;
            let layout = self.kv_layout();
            let mut at = 0;
            for l in 0..layout.n_layers {
                for bytes in [layout.k_bytes_per_token[l], layout.v_bytes_per_token[l]] {
                    out.extend_from_slice(&block[at..at + n * bytes]);
                    at += PAGE_TOKENS * bytes;
                }
            }
            return Ok(n);
        }
        out.resize(self.span_bytes(n), 0);
        let mut reqs = Vec::with_capacity(2 * self.kv_layout().n_layers);
        push_parts(&mut reqs, span_parts(self.kv_layout(), page, n), out);
        self.kv.read_many(&mut reqs);
        Ok(n)
    }

    /// Copies the full pages `indices` of `seq` into `outs` (one span each), in one batch of
    /// transfers: from device memory, every download is queued first and waited for once.
    pub fn read_full_pages(
        &self,
        seq: SeqId,
        indices: &[usize],
        outs: &mut [Vec<u8>],
    ) -> Result<()> {
        let s = self.seq(seq)?;
        assert_eq!(indices.len(), outs.len(), "one output per page");
        let mut pages = Vec::with_capacity(indices.len());
        for &index in indices {
            match s.pages.get(index) {
                Some(&page) if self.pool.is_released(page) => {
                    return Err(Error::WindowReleased {
                        seq,
                        position: index * PAGE_TOKENS,
                    })
                }
                Some(&page) if s.tokens.len() >= (index + 1) * PAGE_TOKENS => pages.push(page),
                _ => {
                    return Err(Error::KvRange {
                        layer: 0,
                        start: index * PAGE_TOKENS,
                        end: (index + 1) * PAGE_TOKENS,
                        len: s.tokens.len(),
                    })
                }
            }
        }
        let span = self.span_bytes(PAGE_TOKENS);
        let mut reqs = Vec::with_capacity(2 * self.kv_layout().n_layers * pages.len());
        for (&page, out) in pages.iter().zip(outs.iter_mut()) {
            if self.pool.is_spilled(page) {
                *out = self.spilled_block(page)?;
                continue;
            }
            out.clear();
            out.resize(span, 0);
            push_parts(
                &mut reqs,
                span_parts(self.kv_layout(), page, PAGE_TOKENS),
                out,
            );
        }
        self.kv.read_many(&mut reqs);
        Ok(())
    }

    /// The bytes of full pool page `page` as a checkpoint block (its rows in the pool).
    pub(crate) fn page_block(&self, page: u32) -> Vec<u8> {
        let mut out = vec![0; self.span_bytes(PAGE_TOKENS)];
        let mut reqs = Vec::with_capacity(2 * self.kv_layout().n_layers);
        push_parts(
            &mut reqs,
            span_parts(self.kv_layout(), page, PAGE_TOKENS),
            &mut out,
        );
        self.kv.read_many(&mut reqs);
        out
    }

    /// The block of spilled page `page`, read from its file.
    fn spilled_block(&self, page: u32) -> Result<Vec<u8>> {
        match &self.spill {
            Some(spill) => spill.read_block(page),
            None => Err(Error::NoSpillStore {
                kv_ram: self.params().kv_ram,
            }),
        }
    }

    /// Copies the K and V bytes of `positions` (within the tokens held) of `layer` of `seq`
    /// into `k` and `v`, which must be exactly `positions.len() * {k,v}_bytes_per_token[layer]`
    /// long.
    pub fn read_kv(
        &self,
        seq: SeqId,
        layer: usize,
        positions: Range<usize>,
        k: &mut [u8],
        v: &mut [u8],
    ) -> Result<()> {
        let s = self.seq(seq)?;
        let layout = self.kv_layout();
        if layer >= layout.n_layers
            || positions.start > positions.end
            || positions.end > s.tokens.len()
        {
            return Err(Error::KvRange {
                layer,
                start: positions.start,
                end: positions.end,
                len: s.tokens.len(),
            });
        }
        let spans = positions.start / PAGE_TOKENS..positions.end.div_ceil(PAGE_TOKENS);
        if spans.clone().any(|i| self.pool.is_spilled(s.pages[i])) {
            return Err(Error::SpilledPages {
                seq,
                what: "reading rows of one layer",
            });
        }
        if self.model().hparams().is_swa(layer) {
            let pages = positions.start / PAGE_TOKENS..positions.end.div_ceil(PAGE_TOKENS);
            if let Some(i) = pages.clone().find(|&i| self.pool.is_released(s.pages[i])) {
                return Err(Error::WindowReleased {
                    seq,
                    position: (i * PAGE_TOKENS).max(positions.start),
                });
            }
        }
        let n = positions.len();
        for (value, out) in [(false, k), (true, v)] {
            let bytes = if value {
                layout.v_bytes_per_token[layer]
            } else {
                layout.k_bytes_per_token[layer]
            };
            if out.len() != n * bytes {
                return Err(Error::KvBytes {
                    layer,
                    expected: n * bytes,
                    found: out.len(),
                });
            }
            let mut p = positions.start;
            while p < positions.end {
                let run = (PAGE_TOKENS - p % PAGE_TOKENS).min(positions.end - p);
                let cell = s.pages[p / PAGE_TOKENS] as usize * PAGE_TOKENS + p % PAGE_TOKENS;
                let dst = (p - positions.start) * bytes;
                self.kv
                    .read(layer, value, cell * bytes, &mut out[dst..dst + run * bytes]);
                p += run;
            }
        }
        Ok(())
    }

    /// Writes a span of `n` tokens into rows `0..n` of `page`.
    pub(crate) fn write_page(&mut self, page: u32, n: usize, span: &[u8]) -> Result<()> {
        if span.len() != self.span_bytes(n) {
            return Err(Error::KvBytes {
                layer: 0,
                expected: self.span_bytes(n),
                found: span.len(),
            });
        }
        let reqs: Vec<_> = span_parts(self.kv_layout(), page, n)
            .into_iter()
            .map(|p| (p.layer, p.value, p.offset, &span[p.span]))
            .collect();
        self.kv.write_many(&reqs);
        Ok(())
    }

    /// Replaces the contents of `seq` with `tokens`, whose KV comes from checkpoint blocks: for
    /// each full block `i` (id chained from the model's fingerprint, as [`Context::block_ids`]
    /// gives) a page already resident in the pool is shared; otherwise `read(i, &id, sink)`
    /// must call `sink` with the block's verified span bytes. The partial last block comes from
    /// `tail` (its span bytes; empty when `tokens` fill whole blocks).
    ///
    /// Blocks go into free pages and the sequence switches over only at the end: on any error
    /// (a failed read, wrong sizes, too few free pages: [`Error::OutOfPages`]) the sequence is
    /// left exactly as it was. There are no logits until a token is evaluated.
    pub fn import<F>(
        &mut self,
        seq: SeqId,
        tokens: &[u32],
        tail: &[u8],
        read: F,
    ) -> Result<ImportSummary>
    where
        F: FnMut(usize, &BlockId, &mut dyn FnMut(&[u8]) -> Result<()>) -> Result<()>,
    {
        self.import_chained(seq, tokens, &[], tail, read)
    }

    /// As [`Context::import`], for a sequence that was shifted: the block ids chain from
    /// `roots` (as [`Context::chain_roots`] gave them; by increasing page, none past
    /// `tokens.len() / PAGE_TOKENS`, else [`Error::BadChainRoots`]), and the sequence keeps them,
    /// so the pages it fills later get the ids they would have had without the round trip.
    pub fn import_chained<F>(
        &mut self,
        seq: SeqId,
        tokens: &[u32],
        roots: &[ChainRoot],
        tail: &[u8],
        read: F,
    ) -> Result<ImportSummary>
    where
        F: FnMut(usize, &BlockId, &mut dyn FnMut(&[u8]) -> Result<()>) -> Result<()>,
    {
        self.import_with_state(seq, tokens, roots, tail, None, read)
    }

    /// The checks of an import before anything changes: the sequence, the tokens, a hybrid
    /// model's state (present, of its size), the roots, the context and the tail's size.
    fn check_import(
        &self,
        seq: SeqId,
        tokens: &[u32],
        roots: &[ChainRoot],
        tail: &[u8],
        state: Option<&[u8]>,
    ) -> Result<()> {
        self.seq(seq)?;
        self.check_tokens(tokens)?;
        match (&self.recurrent, state) {
            // Checkpoints of KV alone: a hybrid model's sequence would lack its state.
            (Some(_), None) if !tokens.is_empty() => {
                return Err(Error::Recurrent {
                    what: format!("importing {} tokens of KV into {seq}", tokens.len()),
                });
            }
            (Some(r), Some(s)) if s.len() != r.state_bytes() || tokens.is_empty() => {
                return Err(Error::Recurrent {
                    what: format!(
                        "a state of {} bytes after {} tokens for {seq}, which takes {}",
                        s.len(),
                        tokens.len(),
                        r.state_bytes()
                    ),
                });
            }
            (None, Some(_)) => {
                return Err(Error::Recurrent {
                    what: "a recurrent state for a model without recurrent layers".into(),
                });
            }
            _ => {}
        }
        let n_blocks = (tokens.len() / PAGE_TOKENS) as u64;
        if roots.windows(2).any(|w| w[0].block >= w[1].block)
            || roots.last().is_some_and(|r| r.block > n_blocks)
        {
            return Err(Error::BadChainRoots {
                roots: roots.iter().map(|r| r.block).collect(),
                n_blocks,
            });
        }
        if tokens.len() > self.params().n_ctx {
            return Err(Error::ContextFull {
                needed: tokens.len(),
                n_ctx: self.params().n_ctx,
            });
        }
        let n_tail = tokens.len() % PAGE_TOKENS;
        if tail.len() != self.span_bytes(n_tail) {
            return Err(Error::KvBytes {
                layer: 0,
                expected: self.span_bytes(n_tail),
                found: tail.len(),
            });
        }
        Ok(())
    }

    /// As [`Context::import_chained`], with the recurrent state after `tokens` for a hybrid
    /// model (a checkpoint's tail state): KV without it cannot continue such a sequence and is
    /// refused ([`Error::Recurrent`]), as is a state of the wrong size, before anything changes.
    pub(crate) fn import_with_state<F>(
        &mut self,
        seq: SeqId,
        tokens: &[u32],
        roots: &[ChainRoot],
        tail: &[u8],
        state: Option<&[u8]>,
        mut read: F,
    ) -> Result<ImportSummary>
    where
        F: FnMut(usize, &BlockId, &mut dyn FnMut(&[u8]) -> Result<()>) -> Result<()>,
    {
        self.check_import(seq, tokens, roots, tail, state)?;
        let n_full = tokens.len() / PAGE_TOKENS;
        let n_tail = tokens.len() % PAGE_TOKENS;
        let ids = BlockId::chain_all_rooted(&self.fingerprint(), tokens, PAGE_TOKENS as u32, roots);
        // A resident page is shared unless the window of the sequence's end reaches it and its
        // rows in sliding-window layers were released: then the block is read again.
        let window_from = self.window_first_page(tokens.len());
        let resident: Vec<Option<u32>> = ids
            .iter()
            .enumerate()
            .map(|(i, id)| {
                self.pool
                    .find(id)
                    .filter(|&p| i < window_from || !self.pool.is_released(p))
            })
            .collect();
        let needed = resident.iter().filter(|p| p.is_none()).count() + usize::from(n_tail > 0);
        if needed > self.pool.n_free() {
            return Err(Error::OutOfPages {
                needed,
                free: self.pool.n_free(),
                total: self.pool.n_pages(),
            });
        }
        // Under a RAM budget, blocks past what it holds stay in their files (see `spill.rs`).
        let in_files = self.blocks_to_attach(&ids, &resident, n_tail > 0);
        let mut pages = Vec::with_capacity(n_full + 1);
        let mut summary = ImportSummary::default();
        let result = (|| -> Result<()> {
            for (i, (id, page)) in ids.iter().zip(&resident).enumerate() {
                if let Some(page) = *page {
                    self.pool.retain(page);
                    pages.push(page);
                    summary.blocks_shared += 1;
                    continue;
                }
                let page = self.pool.alloc().ok_or(Error::OutOfPages {
                    needed,
                    free: 0,
                    total: self.pool.n_pages(),
                })?;
                pages.push(page);
                if in_files[i] {
                    self.attach_spilled(page, id)?;
                    summary.blocks_attached += 1;
                    continue;
                }
                let mut sink_result = Ok(());
                let mut called = false;
                let read_result = read(i, id, &mut |span| {
                    called = true;
                    sink_result = self.write_page(page, PAGE_TOKENS, span);
                    sink_result.clone_result()
                });
                // The sink's own refusal explains the failure better than its echo.
                sink_result?;
                read_result?;
                if !called {
                    return Err(Error::KvBytes {
                        layer: 0,
                        expected: self.span_bytes(PAGE_TOKENS),
                        found: 0,
                    });
                }
                summary.blocks_read += 1;
            }
            if n_tail > 0 {
                let page = self.pool.alloc().ok_or(Error::OutOfPages {
                    needed,
                    free: 0,
                    total: self.pool.n_pages(),
                })?;
                pages.push(page);
                self.write_page(page, n_tail, tail)?;
                summary.tail_tokens = n_tail;
            }
            Ok(())
        })();
        if let Err(e) = result {
            for p in pages {
                self.pool.release(p);
            }
            return Err(e);
        }
        for (&page, id) in pages.iter().zip(&ids) {
            self.pool.index(page, *id);
        }
        let s = self
            .seqs
            .get_mut(&seq)
            .ok_or(Error::UnknownSequence { seq })?;
        let old = std::mem::replace(&mut s.pages, pages);
        s.tokens = tokens.to_vec();
        s.ids = ids;
        s.logits = None;
        // A root of block 0 is the sequence's namespace: kept apart, so that it outlives a
        // truncation to nothing.
        match roots.split_first() {
            Some((first, rest)) if first.block == 0 => {
                s.namespace = Some(first.id);
                s.roots = rest.to_vec();
            }
            _ => {
                s.namespace = None;
                s.roots = roots.to_vec();
            }
        }
        for p in old {
            self.pool.release(p);
        }
        // The sequence's recurrent state follows its new tokens: the checkpoint's, or none (an
        // empty sequence starts from zero). Its size was checked above.
        if let Some(r) = self.recurrent.as_mut() {
            r.remove(seq);
            if let Some(state) = state {
                r.write(seq, state)?;
                if tokens.len().is_multiple_of(PAGE_TOKENS) {
                    r.snapshot(seq, tokens.len(), tokens.len());
                }
            }
        }
        Ok(summary)
    }
}

/// Where one layer's K (or V) rows of a page lie: in the layer's tensor, and in the page's span.
struct SpanPart {
    layer: usize,
    value: bool,
    /// Byte offset of the page's first row in the layer's tensor.
    offset: usize,
    /// Bytes of the span (ckptfmt's layout: per layer, K then V).
    span: Range<usize>,
}

/// The parts of a span of `n` tokens of `page`, in span order.
/// Adds one read request per part, each with its own disjoint piece of `out` (the parts of a
/// span cover it in order).
fn push_parts<'a>(
    reqs: &mut Vec<(usize, bool, usize, &'a mut [u8])>,
    parts: Vec<SpanPart>,
    out: &'a mut [u8],
) {
    let mut rest = out;
    for part in parts {
        let (head, tail) = std::mem::take(&mut rest).split_at_mut(part.span.len());
        reqs.push((part.layer, part.value, part.offset, head));
        rest = tail;
    }
}

fn span_parts(layout: &KvLayout, page: u32, n: usize) -> Vec<SpanPart> {
    let mut parts = Vec::with_capacity(2 * layout.n_layers);
    let mut off = 0;
    for layer in 0..layout.n_layers {
        for (value, bytes) in [
            (false, layout.k_bytes_per_token[layer]),
            (true, layout.v_bytes_per_token[layer]),
        ] {
            parts.push(SpanPart {
                layer,
                value,
                offset: page as usize * PAGE_TOKENS * bytes,
                span: off..off + n * bytes,
            });
            off += n * bytes;
        }
    }
    parts
}

/// `Result<()>` is not `Clone` (the error holds I/O errors); the sink hands the caller a copy
/// of its outcome as a plain signal and keeps the real error for itself.
trait CloneResult {
    fn clone_result(&self) -> Result<()>;
}

impl CloneResult for Result<()> {
    fn clone_result(&self) -> Result<()> {
        match self {
            Ok(()) => Ok(()),
            Err(_) => Err(Error::ImportAborted),
        }
    }
}
