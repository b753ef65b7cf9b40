//! The context's side of the spill: its RAM budget, which pages leave RAM and when, resuming
//! with blocks where they lie, and bringing pages back.

use ckptfmt::BlockId;

use super::{Spill, Victim};
use crate::error::{Error, Result};
use crate::kv::PAGE_TOKENS;

impl crate::Context {
    /// Gives this context `store` to spill pages to once the pool is over
    /// [`ContextParams::kv_ram`](crate::ContextParams::kv_ram). The store must be this model's
    /// with the pool's KV types ([`Error::SpillLayout`] otherwise).
    pub fn spill_to(&mut self, store: &crate::store::SessionStore) -> Result<()> {
        let handle = store.model_store();
        if handle.fingerprint() != self.fingerprint() {
            return Err(Error::SpillLayout { store: 0, pool: 0 });
        }
        self.spill = Some(Spill::new(
            handle.clone(),
            self.kv_layout(),
            store.stored_layout(),
        )?);
        Ok(())
    }

    /// Fixes the page cache's room for block files that the spill's read-ahead sees (`None`:
    /// the system's), and says how the last batch read ahead: whether tightly, and its layers
    /// per group (see the module's doc). `None` without a spill store.
    #[cfg(feature = "test-util")]
    pub(crate) fn spill_room(&mut self, room: Option<Option<u64>>) -> Option<(bool, usize)> {
        let spill = self.spill.as_mut()?;
        if let Some(room) = room {
            spill.fix_room(room);
        }
        Some(spill.read_ahead())
    }

    /// Pages the RAM budget holds, when there is one (at least a batch's pages and one more).
    fn budget_pages(&self) -> Option<usize> {
        let ram = self.params().kv_ram;
        (ram > 0).then(|| {
            let page = self.kv_layout().bytes_per_page().max(1);
            (ram / page).max(self.params().n_batch.div_ceil(PAGE_TOKENS) + 1)
        })
    }

    /// Held pages whose rows are in RAM.
    fn pages_in_ram(&self) -> usize {
        self.pool.counts().0 - self.pool.n_spilled()
    }

    /// Spills full pages until `extra` more pages fit within the RAM budget (as many as can
    /// go: see [`ContextParams::kv_ram`](crate::ContextParams::kv_ram)), lowest positions
    /// first. Nothing without a budget; [`Error::NoSpillStore`] with one but no store.
    pub(crate) fn make_room(&mut self, extra: usize) -> Result<()> {
        let Some(budget) = self.budget_pages() else {
            return Ok(());
        };
        let over = (self.pages_in_ram() + extra).saturating_sub(budget);
        if over == 0 {
            return Ok(());
        }
        let victims = self.victims(over);
        if victims.is_empty() {
            return Ok(());
        }
        let Some(mut spill) = self.spill.take() else {
            return Err(Error::NoSpillStore {
                kv_ram: self.params().kv_ram,
            });
        };
        let written = spill.write(&victims, |page| Ok(self.page_block(page)));
        self.spill = Some(spill);
        written?;
        let layout = self.kv_layout().clone();
        for v in &victims {
            for l in 0..layout.n_layers {
                for (value, bytes) in [
                    (false, layout.k_bytes_per_token[l]),
                    (true, layout.v_bytes_per_token[l]),
                ] {
                    let len = PAGE_TOKENS * bytes;
                    self.kv.release(l, value, v.page as usize * len, len);
                }
            }
            self.pool.mark_spilled(v.page);
        }
        Ok(())
    }

    /// Up to `n` pages to spill: full, held by one sequence only, neither spilled nor with
    /// released rows, not a sequence's first page; lowest positions first, across sequences.
    fn victims(&self, n: usize) -> Vec<Victim> {
        let mut found: Vec<(usize, crate::SeqId)> = Vec::new();
        for (&seq, s) in &self.seqs {
            for i in 1..s.ids.len() {
                let page = s.pages[i];
                if self.pool.refs(page) == 1
                    && !self.pool.is_spilled(page)
                    && !self.pool.is_released(page)
                {
                    found.push((i, seq));
                }
            }
        }
        found.sort();
        found.truncate(n);
        found
            .into_iter()
            .map(|(i, seq)| {
                let s = &self.seqs[&seq];
                Victim {
                    page: s.pages[i],
                    id: s.ids[i],
                    prev: s.prev_id(i).copied(),
                    tokens: s.tokens[i * PAGE_TOKENS..(i + 1) * PAGE_TOKENS].to_vec(),
                }
            })
            .collect()
    }

    /// Before a batch: room for its `needed` new pages, and the block files of the spilled
    /// pages its sequences attend to mapped and verified.
    pub(crate) fn prepare_spill(&mut self, batch: &crate::Batch, needed: usize) -> Result<()> {
        if self.budget_pages().is_none() && self.pool.n_spilled() == 0 {
            return Ok(());
        }
        self.make_room(needed)?;
        let Some(spill) = self.spill.as_mut() else {
            return Ok(());
        };
        spill.forget_freed(&self.pool);
        let pages: Vec<u32> = batch
            .items
            .iter()
            .filter_map(|item| self.seqs.get(&item.seq))
            .flat_map(|s| s.pages.iter().copied())
            .collect();
        spill.map(&self.pool, pages)
    }

    /// Drops the spilled pages' block files from memory (this process's maps and the page
    /// cache), so that the next batch reads them from the disk: for measuring that. Returns
    /// the bytes of the files.
    pub fn evict_spilled(&self) -> u64 {
        self.spill.as_ref().map_or(0, Spill::evict)
    }

    /// Which of the full blocks `ids` an import attaches where they lie rather than reads
    /// (`resident[i]`: shared from the pool instead): none without a RAM budget and a spill
    /// store; else, past the first block (the attention sinks) and the last ones the budget
    /// holds (after the tail's page and room for a batch), those the store has in files.
    pub(crate) fn blocks_to_attach(
        &self,
        ids: &[BlockId],
        resident: &[Option<u32>],
        tail: bool,
    ) -> Vec<bool> {
        let mut attach = vec![false; ids.len()];
        let (Some(budget), Some(spill)) = (self.budget_pages(), &self.spill) else {
            return attach;
        };
        let room = budget.saturating_sub(
            self.pages_in_ram()
                + usize::from(tail)
                + 1
                + self.params().n_batch.div_ceil(PAGE_TOKENS),
        );
        let read_from = ids.len().saturating_sub(room).max(1);
        for i in 1..read_from {
            attach[i] = resident[i].is_none() && spill.has_file(&ids[i]);
        }
        attach
    }

    /// Makes free-list `page` a spilled page of block `id` (its file mapped and verified):
    /// a damaged or missing file is [`Error::SpilledBlock`].
    pub(crate) fn attach_spilled(&mut self, page: u32, id: &BlockId) -> Result<()> {
        let Some(spill) = self.spill.as_mut() else {
            return Err(Error::NoSpillStore {
                kv_ram: self.params().kv_ram,
            });
        };
        spill.adopt(page, *id)?;
        self.pool.mark_spilled(page);
        Ok(())
    }

    /// Reads `seq`'s spilled pages back into their pool rows (for an operation that rewrites
    /// them there, a context shift): they are resident again until the budget sends them out.
    /// A damaged block file is [`Error::SpilledBlock`]; pages read before it stay resident.
    pub(crate) fn unspill(&mut self, seq: crate::SeqId) -> Result<()> {
        let pages: Vec<u32> = (self.seq(seq)?.pages.iter().copied())
            .filter(|&p| self.pool.is_spilled(p))
            .collect();
        for page in pages {
            self.unspill_page(page)?;
        }
        Ok(())
    }

    /// Reads spilled `page` back into its pool rows, for every holder (its bytes are the same
    /// for all): nothing to do when it is resident. Pages are written to only while partly
    /// filled, so a sequence cut inside a spilled page brings that page back first.
    pub(crate) fn unspill_page(&mut self, page: u32) -> Result<()> {
        if !self.pool.is_spilled(page) {
            return Ok(());
        }
        let Some(mut spill) = self.spill.take() else {
            return Err(Error::NoSpillStore {
                kv_ram: self.params().kv_ram,
            });
        };
        let result = (|| {
            spill.map(&self.pool, [page])?;
            let block = spill.read_block(page)?;
            self.write_page(page, PAGE_TOKENS, &block)?;
            self.pool.clear_spilled(page);
            Ok(())
        })();
        spill.forget_freed(&self.pool);
        self.spill = Some(spill);
        result
    }
}
