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
//! bit for bit.
//!
//! Reading overlaps computing: a read-ahead thread hints the spans a batch will read to the
//! kernel (`madvise(WILLNEED)`), so a hint that waits for the device stalls no compute thread.
//! Where the page cache has room for twice the batch's spilled bytes
//! ([`crate::memory::room_for_files`]), layer 0 asks for every layer of every spilled page,
//! piece by piece across the pages so that the first layers arrive first: the device reads at
//! its sequential speed while the first layers are attended. Where it has not, the layers go
//! in groups that a quarter of the room holds, each group asked for as the one before starts,
//! and the maps stop the kernel's read-around (`MADV_RANDOM`), which would read a whole file
//! at every fault, only for the cache to drop it before its next layer is attended.
//!
//! A block file is mapped and verified (header, id, checksum, owner) when a sequence of a
//! batch first attends to it after the spill; a damaged file fails that batch with
//! [`Error::SpilledBlock`] before anything is computed. The map is kept until the page is
//! freed.
//!
//! [`ContextParams::kv_ram`]: crate::ContextParams::kv_ram

use std::collections::HashMap;
use std::ops::Range;
use std::time::{Duration, Instant};

use ckptfmt::{BlockId, Encoding, MappedBlock};

mod policy;

use crate::batch::Plan;
use crate::error::{Error, Foreign, Result};
use crate::ggml::stage::{advise_random, drop_cached, map_block_file, Hinter, Run, Src, StageOp};
use crate::kv::{KvLayout, KvType, PagePool, PAGE_TOKENS};

/// The most bytes one read-ahead hint asks for: the kernel reads at most its read-ahead
/// window's worth (the device's `read_ahead_kb`, often 128 KiB) of each, so a file's span is
/// asked for in pieces.
const HINT_BYTES: usize = 512 << 10;

/// How often the room the page cache has for the block files is read again.
const ROOM_EVERY: Duration = Duration::from_secs(1);

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
    /// The page cache's room for files ([`crate::memory::room_for_files`]), and when it was
    /// read.
    room: Option<u64>,
    room_at: Option<Instant>,
    /// A room fixed by a test, in place of the system's.
    room_fixed: Option<u64>,
    /// Layers per read-ahead group, of the last batch.
    group: usize,
    /// Whether a batch's spilled bytes are more than half the room (see [`Spill::hint_group`]).
    tight: bool,
    /// The read-ahead thread, started with the first spill.
    hinter: Option<Hinter>,
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
            room: None,
            room_at: None,
            room_fixed: None,
            group: 0,
            tight: false,
            hinter: None,
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
        let ids = self.store.put_on_disk(&blocks).ours()?;
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
            self.advise(&payload);
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

    /// Gives a new map the read-around advice of the others (see [`Spill::hint_group`]).
    fn advise(&self, payload: &Payload) {
        if let (true, Payload::Mapped { block, .. }) = (self.tight, payload) {
            advise_random(block.as_bytes(), true);
        }
    }

    /// Takes `page` as spilled to block `id`'s file, which is mapped and verified now.
    pub(crate) fn adopt(&mut self, page: u32, id: BlockId) -> Result<()> {
        let payload = map_block(&self.store, &id, self.rest.bytes_per_page(), true)?;
        self.advise(&payload);
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
                    let payload = map_block(&self.store, &s.id, self.rest.bytes_per_page(), true)?;
                    if let Payload::Mapped { block, .. } = &payload {
                        advise_random(block.as_bytes(), self.tight);
                    }
                    s.payload = Some(payload);
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
        match self.store.get_uncached(&s.id).ours()? {
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
        let mut windows = Vec::new();
        for (i, a) in plan.attention.iter().enumerate() {
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
            windows.push((i, cells.len(), segments));
        }
        let at_rest: usize = windows.iter().map(|(_, _, s)| mapped_pages(s)).sum();
        if self.hinter.is_none() && at_rest > 0 {
            self.hinter = Hinter::spawn();
        }
        // With nothing to read ahead, the maps keep the advice the last reading gave them (a
        // batch of other sequences between two would otherwise flip every map twice).
        let group = match at_rest {
            0 => self.rest.n_layers.max(1),
            _ => self.hint_group(at_rest * self.rest.bytes_per_page()),
        };
        for (i, n_rows, segments) in windows {
            let a = &mut plan.attention[i];
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
                        n_rows,
                        prefetch: Vec::new(),
                        hinter: self.hinter.clone(),
                        pages,
                    }
                });
                // Layer 0 asks for the first group of layers' spans, and the first layer of
                // each group for the next group's, so reading runs a group ahead.
                if l % group == 0 {
                    let mut hint = Vec::new();
                    if l == 0 {
                        hint = self.spans(&segments, 0..group.min(layout.n_layers));
                    }
                    if l + group < layout.n_layers {
                        let next = l + group..(l + 2 * group).min(layout.n_layers);
                        hint.extend(self.spans(&segments, next));
                    }
                    pair[0].prefetch = hint;
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

    /// The K-and-V spans of `layers` of the mapped pages among `segments` (contiguous in a
    /// block), in pieces of at most [`HINT_BYTES`], for the prefetch (for a payload decoded
    /// into memory the hint is harmless).
    fn spans(&self, segments: &[Segment], layers: Range<usize>) -> Vec<(usize, usize)> {
        let (first, last) = (layers.start, layers.end - 1);
        let start = self.offsets[first][0];
        let end = self.offsets[last][1] + PAGE_TOKENS * self.rest.v_bytes_per_token[last];
        let mut bases: Vec<*const u8> = Vec::new();
        for seg in segments {
            if let Home::File(base) = seg.home {
                if bases.last() != Some(&base) {
                    bases.push(base);
                }
            }
        }
        // Piece by piece across the pages (every page's first piece, then every page's
        // second...): the layers of the first pieces are read first and attended while the
        // rest is read.
        let mut spans = Vec::with_capacity(bases.len() * (end - start).div_ceil(HINT_BYTES));
        for at in (start..end).step_by(HINT_BYTES) {
            let len = HINT_BYTES.min(end - at);
            spans.extend(bases.iter().map(|b| (b.wrapping_add(at) as usize, len)));
        }
        spans
    }

    /// Layers per read-ahead group for a batch whose windows hold `at_rest` bytes of spilled
    /// pages (see the module's doc): all of them where the page cache has room for twice
    /// that, else as many as a quarter of the room holds (at least one). Under a tight room
    /// the maps also stop reading around a fault (`MADV_RANDOM`): a fault reads what it
    /// needs, not the rest of the file, which the cache could not keep until its layer.
    fn hint_group(&mut self, at_rest: usize) -> usize {
        let n_layers = self.rest.n_layers.max(1);
        if self.room_fixed.is_some() {
            self.room = self.room_fixed;
        } else if self.room_at.is_none_or(|t| t.elapsed() > ROOM_EVERY) {
            self.room = crate::memory::room_for_files();
            self.room_at = Some(Instant::now());
        }
        let room = self.room.map_or(usize::MAX, |r| r as usize);
        let tight = room / 2 < at_rest;
        if tight != self.tight {
            self.tight = tight;
            for s in self.pages.values() {
                if let Some(Payload::Mapped { block, .. }) = &s.payload {
                    advise_random(block.as_bytes(), tight);
                }
            }
        }
        self.group = match tight {
            false => n_layers,
            true => (room / 4 / (at_rest / n_layers).max(1)).clamp(1, n_layers),
        };
        self.group
    }

    /// Fixes the room [`Spill::hint_group`] sees (`None`: read it from the system).
    #[cfg(feature = "test-util")]
    pub(crate) fn fix_room(&mut self, room: Option<u64>) {
        self.room_fixed = room;
        self.room_at = None;
    }

    /// Whether the last batch's read-ahead was tight, and its layers per group.
    #[cfg(feature = "test-util")]
    pub(crate) fn read_ahead(&self) -> (bool, usize) {
        (self.tight, self.group)
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

/// The spilled pages among `segments` whose bytes are mapped.
fn mapped_pages(segments: &[Segment]) -> usize {
    let mut last = None;
    let mut n = 0;
    for seg in segments {
        if let Home::File(base) = seg.home {
            n += usize::from(last != Some(base));
            last = Some(base);
        }
    }
    n
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
