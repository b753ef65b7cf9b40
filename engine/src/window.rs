//! Sliding-window layers' rows released from memory: a layer with window `W` attends only to a
//! token's last `W` positions, so of a long sequence the rows of its windowed layers outside
//! every holder's window are never read again by evaluation. [`Context::release_windows`]
//! hands their memory back to the system once the caller has saved the pages; the pool marks
//! those pages, and every path that would read their windowed rows (export, a fork, a
//! truncation, a shift, an evaluation whose window reaches them, sharing them in an import or a
//! prefix attach) refuses or reads the block again instead.

use crate::context::{Context, SeqId};
use crate::error::{Error, Result};
use crate::kv::PAGE_TOKENS;

impl Context {
    /// The sliding window of the model's windowed layers, if it has any.
    pub(crate) fn window(&self) -> Option<usize> {
        let hp = self.model().hparams();
        let w = hp.sliding_window.as_ref()?;
        (0..hp.n_layer).any(|il| hp.is_swa(il)).then_some(w.size)
    }

    /// The first page whose windowed rows a token at position `len` attends to (positions
    /// after `len - window`); `len.div_ceil(PAGE_TOKENS)` (none) without windowed layers.
    pub(crate) fn window_first_page(&self, len: usize) -> usize {
        match self.window() {
            Some(w) => (len + 1).saturating_sub(w) / PAGE_TOKENS,
            None => len.div_ceil(PAGE_TOKENS),
        }
    }

    /// The first position at or after which a sequence with page table `pages` could not go
    /// on from position `len` (as [`Context::resumable_len`] counts), if any.
    pub(crate) fn window_gap(&self, pages: &[u32], len: usize) -> Option<usize> {
        let end = len.div_ceil(PAGE_TOKENS).min(pages.len());
        let first = self.window_first_page(len);
        (first..end)
            .find(|&i| self.pool.is_released(pages[i]))
            .map(|i| i * PAGE_TOKENS)
    }

    /// Refuses to go on from `len` with `pages` when the window there reaches released rows.
    pub(crate) fn check_window(&self, seq: SeqId, pages: &[u32], len: usize) -> Result<()> {
        match self.window_gap(pages, len) {
            Some(position) => Err(Error::WindowReleased { seq, position }),
            None => Ok(()),
        }
    }

    /// The longest length, at most `len`, from which `seq` can go on (be forked, truncated to,
    /// evaluated after): `len` itself unless the window of a token at `len` reaches rows of
    /// sliding-window layers that were released ([`Context::release_windows`]), or, for a
    /// hybrid model, the last boundary before `len` where `seq` kept its recurrent state (its
    /// whole length aside); 0 at worst.
    pub fn resumable_len(&self, seq: SeqId, len: usize) -> Result<usize> {
        let s = self.seq(seq)?;
        let mut len = len.min(s.tokens.len());
        // A hybrid sequence goes on from its end or from a boundary where it kept its state.
        if self.is_hybrid() && len < s.tokens.len() {
            len = self
                .snapshot_lens(seq)
                .into_iter()
                .filter(|&k| k <= len)
                .max()
                .unwrap_or(0);
        }
        while let Some(position) = self.window_gap(&s.pages, len) {
            // Only lengths that end at or before the released page can avoid it.
            len = position;
            if len == 0 {
                break;
            }
        }
        Ok(len)
    }

    /// Whether the rows of sliding-window layers of `seq`'s page `index` were released.
    pub fn page_released(&self, seq: SeqId, index: usize) -> Result<bool> {
        let s = self.seq(seq)?;
        Ok(s.pages
            .get(index)
            .is_some_and(|&p| self.pool.is_released(p)))
    }

    /// Gives the memory of `seq`'s rows in sliding-window layers that no live sequence will
    /// attend again back to the system: of each full page outside the window of every sequence
    /// holding it (a layer with window `W` reads only a token's last `W` positions), the rows
    /// of the windowed layers in host memory. Returns the pages released (0 for a model
    /// without windowed layers, or whose windowed layers all live in device memory).
    ///
    /// Those rows read as zeros afterwards, so call this only once the pages are saved (they
    /// are not exported again: [`Context::read_page`] and the like refuse them with
    /// [`Error::WindowReleased`]), or when they will never be. A sequence cannot then go on
    /// from a shorter length whose window reaches them ([`Context::resumable_len`]); an
    /// import of the same blocks reads them again rather than sharing them.
    pub fn release_windows(&mut self, seq: SeqId) -> Result<usize> {
        let s = self.seq(seq)?;
        let hp = self.model().hparams();
        // Windowed layers in device memory keep their rows: nothing to gain there.
        if self.window().is_none() || !(0..hp.n_layer).any(|l| hp.is_swa(l) && self.kv.is_host(l)) {
            return Ok(0);
        }
        // Pages some sequence may attend to in windowed layers.
        let needed: std::collections::HashSet<u32> = self
            .seqs
            .values()
            .flat_map(|h| {
                h.pages[self.window_first_page(h.tokens.len()).min(h.pages.len())..]
                    .iter()
                    .copied()
            })
            .collect();
        let candidates: Vec<u32> = s.pages[..s.ids.len()]
            .iter()
            .copied()
            .filter(|p| !needed.contains(p) && !self.pool.is_released(*p))
            .collect();
        let layout = self.kv_layout();
        // Per windowed layer: its K and V bytes per token.
        let windowed: Vec<(usize, [usize; 2])> = (0..hp.n_layer)
            .filter(|&il| hp.is_swa(il))
            .map(|l| {
                (
                    l,
                    [layout.k_bytes_per_token[l], layout.v_bytes_per_token[l]],
                )
            })
            .collect();
        for &page in &candidates {
            for &(l, [k_bytes, v_bytes]) in &windowed {
                for (value, bytes) in [(false, k_bytes), (true, v_bytes)] {
                    let page_bytes = PAGE_TOKENS * bytes;
                    self.kv
                        .release(l, value, page as usize * page_bytes, page_bytes);
                }
            }
            self.pool.mark_released(page);
        }
        Ok(candidates.len())
    }
}
