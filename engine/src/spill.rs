//! Beyond RAM: full pages past [`ContextParams::kv_ram`] leave the pool for their block files,
//! and attention reads them where they lie.
//!
//! A spilled page keeps its place in the pool's page table (its id, its reference count, its
//! block id in the index): only its rows are released, so the memory is the system's again,
//! and the page is flagged. Its bytes are in the store, written once under its content address
//! ([`kvstore::ModelStore::put_on_disk`]). A sequence whose attention window holds a spilled
//! page attends through a *staged* window: before a layer's attention, one op per K and V copies
//! the window's rows in order, from the pool where resident and from the block file's span of
//! that layer (K then V, contiguous in ckptfmt's layout) where spilled, into a scratch tensor of
//! the window's shape. The attention that follows sees the same rows, in the same order and
//! shape, as over a window of the pool: spilled and resident evaluation give the same logits,
//! bit for bit. While layer `l`'s K is staged, layer `l + 1`'s spans are hinted to the kernel
//! (`madvise(WILLNEED)`), so reading overlaps computing.
//!
//! A block file is mapped and verified (header, id, checksum, owner) when a sequence of a
//! batch first attends to it after the spill; a damaged file fails that batch with
//! [`Error::SpilledBlock`] before anything is computed. The map is kept until the page is
//! freed.
//!
//! [`ContextParams::kv_ram`]: crate::ContextParams::kv_ram

use std::collections::HashMap;

use ckptfmt::{BlockId, Encoding, MappedBlock};

use crate::batch::Plan;
use crate::error::{Error, Result};
use crate::ggml::stage::{drop_cached, map_block_file, Run, Src, StageOp};
use crate::kv::{KvLayout, KvType, PagePool, PAGE_TOKENS};

/// The spill side of a context: its store and the pages in it.
pub(crate) struct Spill {
    store: kvstore::ModelStore,
    /// Spilled pages (by pool page) and, once attended, their block's bytes.
    pages: HashMap<u32, Spilled>,
    /// Byte offset of each layer's K span in a block, then its V span.
    offsets: Vec<[usize; 2]>,
    /// The pool's layout, and the store's (its blocks at rest): f16 pages may rest as q8_0
    /// (converted when written, widened when attended).
    layout: KvLayout,
    rest: KvLayout,
    pub(crate) bytes_read: u64,
    pub(crate) pages_written: u64,
    /// Zeros, a page of rows of any layer: what page tables point at for pages nobody
    /// attends to (padding, other sequences' unmapped pages).
    zeros: Vec<u8>,
}

struct Spilled {
    id: BlockId,
    payload: Option<Payload>,
}

/// A spilled block's KV bytes: its file mapped (raw encoding), or decoded into memory.
enum Payload {
    /// `verified`: its checksum was checked (a page's own file, mapped as it spilled, is
    /// checked when first attended to).
    Mapped {
        block: MappedBlock,
        start: usize,
        verified: bool,
    },
    Owned(Vec<u8>),
}

impl Payload {
    fn bytes(&self) -> &[u8] {
        match self {
            Payload::Mapped { block, start, .. } => &block.as_bytes()[*start..],
            Payload::Owned(v) => v,
        }
    }
}

/// A page leaving RAM: its pool page, block id, the id it chains from, its tokens.
pub(crate) struct Victim {
    pub page: u32,
    pub id: BlockId,
    pub prev: Option<BlockId>,
    pub tokens: Vec<u32>,
}

impl Spill {
    /// The spill side over `store`, whose blocks have the layout `rest`: the pool's
    /// (`layout`), or q8_0 where the pool's is f16.
    pub(crate) fn new(
        store: kvstore::ModelStore,
        layout: &KvLayout,
        rest: &KvLayout,
    ) -> Result<Spill> {
        let block = store.geometry().block_bytes();
        let widens = |pool: KvType, at_rest: KvType| {
            pool == at_rest || (pool == KvType::F16 && at_rest == KvType::Q8_0)
        };
        if block != rest.bytes_per_page() as u64
            || rest.n_layers != layout.n_layers
            || !widens(layout.type_k, rest.type_k)
            || !widens(layout.type_v, rest.type_v)
        {
            return Err(Error::SpillLayout {
                store: block,
                pool: layout.bytes_per_page() as u64,
            });
        }
        let mut offsets = Vec::with_capacity(rest.n_layers);
        let mut at = 0;
        for l in 0..rest.n_layers {
            let k = at;
            let v = k + PAGE_TOKENS * rest.k_bytes_per_token[l];
            at = v + PAGE_TOKENS * rest.v_bytes_per_token[l];
            offsets.push([k, v]);
        }
        let widest = (layout.k_bytes_per_token.iter())
            .chain(&layout.v_bytes_per_token)
            .max()
            .copied()
            .unwrap_or(0);
        Ok(Spill {
            store,
            pages: HashMap::new(),
            offsets,
            layout: layout.clone(),
            rest: rest.clone(),
            bytes_read: 0,
            pages_written: 0,
            zeros: vec![0; widest * PAGE_TOKENS],
        })
    }

    /// Writes `victims` (their bytes from `read`) to their block files, durably; returns
    /// nothing until every file is written, so on error no page changes.
    pub(crate) fn write(
        &mut self,
        victims: &[Victim],
        mut read: impl FnMut(u32) -> Result<Vec<u8>>,
    ) -> Result<()> {
        let mut blocks = Vec::with_capacity(victims.len());
        for v in victims {
            let bytes = read(v.page)?;
            let bytes = match self.rest == self.layout {
                true => bytes,
                false => self.layout.convert_span(&bytes, &self.rest)?,
            };
            blocks.push((v.prev, v.tokens.as_slice(), bytes));
        }
        let ids = self.store.put_on_disk(&blocks)?;
        for (v, id) in victims.iter().zip(ids) {
            if id != v.id {
                return Err(Error::SpillLayout { store: 0, pool: 0 });
            }
        }
        // Mapped now (which keeps the bytes whatever happens to the file's name: a
        // collection may unlink it); verified when first attended to.
        let mut maps = Vec::with_capacity(victims.len());
        for v in victims {
            maps.push(map_block(
                &self.store,
                &v.id,
                self.rest.bytes_per_page(),
                false,
            )?);
        }
        for (v, payload) in victims.iter().zip(maps) {
            self.pages.insert(
                v.page,
                Spilled {
                    id: v.id,
                    payload: Some(payload),
                },
            );
        }
        self.pages_written += victims.len() as u64;
        Ok(())
    }

    /// Takes `page` as spilled to block `id`'s file, which is mapped and verified now.
    pub(crate) fn adopt(&mut self, page: u32, id: BlockId) -> Result<()> {
        let payload = map_block(&self.store, &id, self.rest.bytes_per_page(), true)?;
        self.pages.insert(
            page,
            Spilled {
                id,
                payload: Some(payload),
            },
        );
        Ok(())
    }

    /// Whether the store holds block `id` in a file.
    pub(crate) fn has_file(&self, id: &BlockId) -> bool {
        self.store.block_files().has_block(id).unwrap_or(false)
    }

    /// Forgets pages the pool no longer holds spilled (freed, or reused).
    pub(crate) fn forget_freed(&mut self, pool: &PagePool) {
        self.pages.retain(|&p, _| pool.is_spilled(p));
    }

    /// Maps (and verifies) the block files of `pages` that are spilled and not mapped yet.
    pub(crate) fn map(
        &mut self,
        pool: &PagePool,
        pages: impl IntoIterator<Item = u32>,
    ) -> Result<()> {
        for page in pages {
            if !pool.is_spilled(page) {
                continue;
            }
            let Some(s) = self.pages.get_mut(&page) else {
                continue;
            };
            match &mut s.payload {
                None => {
                    s.payload = Some(map_block(
                        &self.store,
                        &s.id,
                        self.rest.bytes_per_page(),
                        true,
                    )?)
                }
                Some(Payload::Mapped {
                    block, verified, ..
                }) if !*verified => {
                    check_mapped(&self.store, &s.id, block)?;
                    *verified = true;
                }
                Some(_) => {}
            }
        }
        Ok(())
    }

    /// The bytes of spilled `page` as a checkpoint block in the pool's layout, read from its
    /// file (for a save, or to bring it back).
    pub(crate) fn read_block(&self, page: u32) -> Result<Vec<u8>> {
        let at_rest = self.read_at_rest(page)?;
        match self.rest == self.layout {
            true => Ok(at_rest),
            false => self.rest.convert_span(&at_rest, &self.layout),
        }
    }

    /// The bytes of spilled `page`'s block as they rest in its file.
    fn read_at_rest(&self, page: u32) -> Result<Vec<u8>> {
        let s = self
            .pages
            .get(&page)
            .ok_or(Error::SpillLayout { store: 0, pool: 0 })?;
        if let Some(p) = &s.payload {
            let n = self.rest.bytes_per_page();
            return match p.bytes().get(..n) {
                Some(b) => Ok(b.to_vec()),
                None => Err(Error::SpilledBlock {
                    id: s.id.to_hex(),
                    reason: format!("{} bytes of KV, a page has {n}", p.bytes().len()),
                }),
            };
        }
        match self.store.get_uncached(&s.id)? {
            Some(b) => Ok(b.to_vec()),
            None => Err(Error::SpilledBlock {
                id: s.id.to_hex(),
                reason: "the block file is gone".into(),
            }),
        }
    }

    /// Drops the spilled blocks' bytes from memory: this process's mappings of them
    /// (`madvise(DONTNEED)`), then the files' pages in the page cache
    /// (`posix_fadvise(DONTNEED)`), so that the next batch reads them from the disk. Returns
    /// the bytes of the files advised.
    pub(crate) fn evict(&self) -> u64 {
        let mut bytes = 0;
        for s in self.pages.values() {
            let Some(Payload::Mapped { block, .. }) = &s.payload else {
                continue;
            };
            let map = block.as_bytes();
            bytes += map.len() as u64;
            drop_cached(map, &self.store.block_path(&s.id));
        }
        bytes
    }

    /// Gives each attention of `plan` whose window holds a spilled page a staged window (see
    /// the module's doc): per layer, one op for K and one for V.
    pub(crate) fn stage(
        &mut self,
        plan: &mut Plan,
        pool: &PagePool,
        layout: &KvLayout,
        pool_address: impl Fn(usize, bool) -> Option<usize>,
    ) {
        for a in &mut plan.attention {
            let cells: Vec<usize> = match &a.gather {
                Some(g) => g
                    .chunks(4)
                    .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as usize)
                    .collect(),
                None => (a.first_cell..a.first_cell + a.n_kv).collect(),
            };
            let spilled = |c: usize| pool.is_spilled((c / PAGE_TOKENS) as u32);
            if !cells.iter().any(|&c| spilled(c)) {
                continue;
            }
            let segments = self.segments(&cells, pool);
            let mut layers = Vec::with_capacity(layout.n_layers);
            for l in 0..layout.n_layers {
                let mut pair = [0, 1].map(|kv| {
                    let (row, rest_row) = if kv == 0 {
                        (layout.k_bytes_per_token[l], self.rest.k_bytes_per_token[l])
                    } else {
                        (layout.v_bytes_per_token[l], self.rest.v_bytes_per_token[l])
                    };
                    let runs = self.runs(&segments, l, kv, [row, rest_row]);
                    let pages = pool_address(l, kv == 1)
                        .map(|base| self.page_table(&runs, base, row))
                        .unwrap_or_default();
                    StageOp {
                        runs,
                        row_bytes: row,
                        rest_row,
                        n_rows: cells.len(),
                        prefetch: Vec::new(),
                        pages,
                    }
                });
                // While layer l's K is staged, layer l + 1's spans are asked for.
                if l + 1 < layout.n_layers {
                    pair[0].prefetch = self.spans(&segments, l + 1);
                }
                for op in &pair {
                    self.bytes_read += op
                        .runs
                        .iter()
                        .filter_map(|r| match r.src {
                            Src::File(_) => Some(r.n * op.row_bytes),
                            Src::Widen(_) => Some(r.n * op.rest_row),
                            _ => None,
                        })
                        .map(|b| b as u64)
                        .sum::<u64>();
                }
                layers.push(pair);
            }
            a.staged = Some(layers);
        }
    }

    /// Where the rows of the window over `cells` live, in segments of consecutive rows of one
    /// page: resolved once per window, then per layer by [`Spill::runs`].
    fn segments(&self, cells: &[usize], pool: &PagePool) -> Vec<Segment> {
        let mut segments: Vec<Segment> = Vec::new();
        for (dst, &cell) in cells.iter().enumerate() {
            let page = (cell / PAGE_TOKENS) as u32;
            if let Some(last) = segments.last_mut() {
                if last.cell / PAGE_TOKENS == cell / PAGE_TOKENS && last.cell + last.n == cell {
                    last.n += 1;
                    continue;
                }
            }
            let home = if pool.is_spilled(page) {
                match self.pages.get(&page).and_then(|s| s.payload.as_ref()) {
                    Some(p) => Home::File(p.bytes().as_ptr()),
                    // Another sequence's page, not attended by this batch: masked, any
                    // finite value will do.
                    None => Home::Zero,
                }
            } else if pool.refs(page) == 0 {
                // A free page (padding past the sequence): masked; zeros spare its memory.
                Home::Zero
            } else {
                Home::Pool
            };
            segments.push(Segment {
                dst,
                n: 1,
                cell,
                home,
            });
        }
        segments
    }

    /// The runs of rows of a staged window of `segments`, for layer `l`'s K (`kv` 0) or V;
    /// `rows` are the bytes of a row in the pool and at rest.
    fn runs(&self, segments: &[Segment], l: usize, kv: usize, rows: [usize; 2]) -> Vec<Run> {
        let widen = rows[0] != rows[1];
        let mut runs: Vec<Run> = Vec::new();
        for seg in segments {
            let src = match seg.home {
                Home::Pool => Src::Pool(seg.cell),
                Home::Zero => Src::Zero,
                Home::File(base) => {
                    let at = self.offsets[l][kv] + (seg.cell % PAGE_TOKENS) * rows[1];
                    // Inside the payload: its length was checked against a page's when mapped.
                    let address = base.wrapping_add(at);
                    match widen {
                        false => Src::File(address),
                        true => Src::Widen(address),
                    }
                }
            };
            match runs.last_mut() {
                Some(r) if r.dst + r.n == seg.dst && r.src.follows(src, r.n, rows) => r.n += seg.n,
                _ => runs.push(Run {
                    dst: seg.dst,
                    n: seg.n,
                    src,
                }),
            }
        }
        runs
    }

    /// The window's page table for the attention kernel (i64 addresses, one per page of
    /// rows), from its runs: `base` is the pool's address for the layer's K or V. Empty when
    /// the window is not whole pages, each a run or a run's page-aligned part.
    fn page_table(&self, runs: &[Run], base: usize, row: usize) -> Vec<u8> {
        let mut table = Vec::new();
        for r in runs {
            if !r.dst.is_multiple_of(PAGE_TOKENS) || !r.n.is_multiple_of(PAGE_TOKENS) {
                return Vec::new();
            }
            for i in 0..r.n / PAGE_TOKENS {
                let address = match r.src {
                    Src::Pool(c) => base + (c + i * PAGE_TOKENS) * row,
                    Src::File(p) => p as usize + i * PAGE_TOKENS * row,
                    Src::Zero => self.zeros.as_ptr() as usize,
                    // Rows at rest in another type: the kernel cannot read them in place.
                    Src::Widen(_) => return Vec::new(),
                };
                table.extend_from_slice(&(address as i64).to_le_bytes());
            }
        }
        table
    }

    /// The K-and-V spans of layer `l` of the mapped pages among `segments` (for the
    /// prefetch; for a payload decoded into memory the hint is harmless).
    fn spans(&self, segments: &[Segment], l: usize) -> Vec<(usize, usize)> {
        let len = PAGE_TOKENS * (self.rest.k_bytes_per_token[l] + self.rest.v_bytes_per_token[l]);
        let mut spans: Vec<(usize, usize)> = Vec::new();
        for seg in segments {
            if let Home::File(base) = seg.home {
                let at = base.wrapping_add(self.offsets[l][0]) as usize;
                if spans.last().is_none_or(|&(a, _)| a != at) {
                    spans.push((at, len));
                }
            }
        }
        spans
    }
}

/// Maps block `id`'s file and verifies it; a block whose payload is not raw is decoded into
/// memory instead.
fn map_block(
    store: &kvstore::ModelStore,
    id: &BlockId,
    need: usize,
    verify: bool,
) -> Result<Payload> {
    let damaged = |reason: String| Error::SpilledBlock {
        id: id.to_hex(),
        reason,
    };
    let block =
        map_block_file(store.block_files(), id, verify).map_err(|e| damaged(e.to_string()))?;
    let view = block.view().map_err(|e| damaged(e.to_string()))?;
    if view.encoding() != Encoding::Raw {
        if !verify {
            // Decoded into memory: from verified bytes only.
            return map_block(store, id, need, true);
        }
        let kv = view.kv().map_err(|e| damaged(e.to_string()))?;
        return Ok(Payload::Owned(kv.into_owned()));
    }
    if view.payload().len() < need {
        return Err(damaged(format!(
            "{} bytes of KV, a page has {need}",
            view.payload().len()
        )));
    }
    let start = view.payload().as_ptr() as usize - block.as_bytes().as_ptr() as usize;
    Ok(Payload::Mapped {
        block,
        start,
        verified: verify,
    })
}

/// Verifies a block mapped unverified, before its bytes are first read: its file must still
/// be as long as the map (a file cut short under a map would fault on reading) and its
/// record whole (checksum). A file replaced or unlinked since is no concern: the map keeps
/// the bytes that were written.
fn check_mapped(store: &kvstore::ModelStore, id: &BlockId, block: &MappedBlock) -> Result<()> {
    let damaged = |reason: String| Error::SpilledBlock {
        id: id.to_hex(),
        reason,
    };
    let path = store.block_path(id);
    if let Ok(meta) = std::fs::metadata(&path) {
        // Only a file of the same identity can be cut under the map; a replaced one is a new
        // file (content-addressed: the same bytes), which this length check passes too.
        if meta.len() < block.as_bytes().len() as u64 {
            return Err(damaged(format!(
                "the file is {} bytes, {} were written",
                meta.len(),
                block.as_bytes().len()
            )));
        }
    }
    block.verify().map_err(|e| damaged(e.to_string()))?;
    Ok(())
}

/// Where a segment of a window's rows lives.
#[derive(Clone, Copy)]
enum Home {
    Pool,
    /// A mapped block file; its payload from here.
    File(*const u8),
    Zero,
}

/// `n` consecutive rows of one page, from the window's row `dst` and the pool's cell `cell`.
struct Segment {
    dst: usize,
    n: usize,
    cell: usize,
    home: Home,
}

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
