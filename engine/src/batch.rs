//! A batch of work for one forward pass: tokens of several sequences, each tagged with its
//! sequence and position, and the plan that turns it into the graph's inputs.

use std::ops::Range;

use half::f16;

use crate::context::SeqId;
use crate::kv::PAGE_TOKENS;

/// KV cells attended to are padded to a multiple of this (masked), as llama.cpp does, so the
/// attention kernel sees few distinct shapes.
const KV_PAD: usize = 256;

/// Which logits a batch item asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    /// None: a prefill chunk whose logits nobody reads.
    None,
    /// After the item's last token only (the usual case).
    Last,
    /// After every token of the item.
    All,
}

/// What the rows a batch asks for hold.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Output {
    /// Logits, `n_vocab` floats a row.
    #[default]
    Logits,
    /// The final norm's output, `n_embd` floats a row.
    Embeddings,
    /// The rank pooling's output: the final norm's row through the classifier head
    /// ([`crate::Context::rank`]).
    Rank,
}

/// Tokens of one sequence in a [`Batch`].
#[derive(Clone, Debug)]
pub(crate) struct BatchItem {
    pub seq: SeqId,
    /// Position of the first token; `None` means "right after the tokens the sequence holds".
    pub pos: Option<usize>,
    pub tokens: Vec<u32>,
    pub logits: Logits,
}

/// Work for one [`Context::decode`](crate::Context::decode): prefill chunks of some sequences
/// and single decode tokens of others, evaluated in one graph (continuous batching).
///
/// Each sequence appears at most once; its tokens continue it without a gap.
#[derive(Clone, Debug, Default)]
pub struct Batch {
    pub(crate) items: Vec<BatchItem>,
    /// What the rows asked for hold.
    pub(crate) output: Output,
}

impl Batch {
    /// An empty batch.
    pub fn new() -> Batch {
        Batch::default()
    }

    /// Appends `tokens` to `seq` (after the tokens it holds); returns the item's index, which
    /// [`BatchOutput::logits`] takes.
    pub fn add(&mut self, seq: SeqId, tokens: &[u32], logits: Logits) -> usize {
        self.items.push(BatchItem {
            seq,
            pos: None,
            tokens: tokens.to_vec(),
            logits,
        });
        self.items.len() - 1
    }

    /// Like [`Batch::add`], stating the position of the first token; a position other than the
    /// sequence's length is refused with [`Error::PositionGap`](crate::Error::PositionGap).
    pub fn add_at(&mut self, seq: SeqId, pos: usize, tokens: &[u32], logits: Logits) -> usize {
        let i = self.add(seq, tokens, logits);
        self.items[i].pos = Some(pos);
        i
    }

    /// Tokens in the batch.
    pub fn n_tokens(&self) -> usize {
        self.items.iter().map(|i| i.tokens.len()).sum()
    }

    /// Items in the batch.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Whether the batch holds no item.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Removes every item.
    pub fn clear(&mut self) {
        self.items.clear();
    }

    /// Makes the rows the items ask for embeddings, `n_embd` floats each (the output of the
    /// model's final norm, before the output head: llama.cpp's embeddings of a causal model),
    /// instead of logits. The sequences keep no logits from such a batch.
    pub fn set_embeddings(&mut self, embeddings: bool) {
        self.output = match embeddings {
            true => Output::Embeddings,
            false => Output::Logits,
        };
    }
}

/// The logits a [`Context::decode`](crate::Context::decode) produced.
#[derive(Clone, Debug)]
pub struct BatchOutput {
    /// Floats per row: `n_vocab`, `n_embd` for embeddings, the head's outputs for a rank.
    pub(crate) n_vocab: usize,
    /// What the rows hold.
    pub(crate) output: Output,
    pub(crate) logits: Vec<f32>,
    /// Output rows of each item, in batch order.
    pub(crate) rows: Vec<Range<usize>>,
}

impl BatchOutput {
    /// Logits of item `item` (as returned by [`Batch::add`]): `n_vocab` per row asked for (none,
    /// the last token's, or every token's); empty for an unknown item or an embeddings batch.
    pub fn logits(&self, item: usize) -> &[f32] {
        if self.output != Output::Logits {
            return &[];
        }
        self.rows(item)
    }

    /// Embeddings of item `item` of a batch made with [`Batch::set_embeddings`]: `n_embd` per
    /// row asked for; empty for an unknown item or a logits batch.
    pub fn embeddings(&self, item: usize) -> &[f32] {
        if self.output == Output::Logits {
            return &[];
        }
        self.rows(item)
    }

    fn rows(&self, item: usize) -> &[f32] {
        match self.rows.get(item) {
            Some(r) => &self.logits[r.start * self.n_vocab..r.end * self.n_vocab],
            None => &[],
        }
    }

    /// Vocabulary size (floats per row).
    pub fn n_vocab(&self) -> usize {
        self.n_vocab
    }
}

/// One sequence's part of a planned batch.
pub(crate) struct PlanItem<'a> {
    /// Page table covering every position up to the end of this item's tokens.
    pub pages: &'a [u32],
    /// Position of the item's first token.
    pub start: usize,
    pub tokens: &'a [u32],
    pub logits: Logits,
}

/// One sequence's attention in a planned batch: its tokens (batch rows) attend to a window of
/// the pool's cells that covers its pages.
pub(crate) struct SeqAttention {
    /// Batch rows of the sequence's tokens.
    pub rows: Range<usize>,
    /// First cell of the window.
    pub first_cell: usize,
    /// Cells in the window.
    pub n_kv: usize,
    /// f16 `[n_kv, rows.len()]` (one more row, the same, with `dup`): 0 where a token may
    /// attend to a cell, -inf elsewhere.
    pub mask: Vec<u8>,
    /// The same for sliding-window layers (when the model has them): 0 only where the cell's
    /// position is within the window of the token's (`p - window < cell position <= p`).
    pub swa_mask: Option<Vec<u8>>,
    /// The single query is given twice (its first output kept): ggml's CPU flash attention
    /// splits one query's window of [`KV_SPLIT`] cells or more among threads, summing in an
    /// order that depends on the window; two queries take the per-query path.
    pub dup: bool,
    /// With `Some`, the window is not a run of the pool's cells but these cells (i32 each, as
    /// many as `n_kv`), gathered in this order: a sequence whose pages do not ascend in the
    /// pool is attended in the order of its positions, as if they did, since flash attention
    /// sums cells in window order (masked cells are skipped, so they change nothing).
    pub gather: Option<Vec<u8>>,
    /// Attention by ggml-sys's kernel rather than ggml's (where the cache is readable by the
    /// CPU): decided by the sequence's own queries and length alone (see [`ours`]), so a token
    /// takes the same kernel whatever it is batched with and wherever its pages lie.
    pub ours: bool,
    /// With `Some`, a page of the window was spilled to disk: per layer, the ops that stage
    /// the window's K and V rows (see `spill.rs`), which attention reads instead of the pool.
    pub staged: Option<Vec<[crate::ggml::stage::StageOp; 2]>>,
}

/// The graph's inputs for a batch.
pub(crate) struct Plan {
    pub tokens: Vec<u32>,
    /// Position of each token in its sequence (i32 bytes).
    pub positions: Vec<u8>,
    /// Pool cell each token's K and V go to (i64 bytes).
    pub cells: Vec<u8>,
    /// Attention of each sequence, in row order. Each sequence attends on its own, so a
    /// sequence evaluates the same kernels with the same shapes whether it runs alone or beside
    /// others (ggml picks its attention kernel by the number of queries).
    pub attention: Vec<SeqAttention>,
    /// Batch rows whose logits are computed (i32), ascending.
    pub out_rows: Vec<i32>,
    /// Output rows of each item.
    pub item_rows: Vec<Range<usize>>,
    /// Batch rows of each item's tokens (items are not in batch order: see `Plan::new`).
    pub token_rows: Vec<Range<usize>>,
    /// Leading batch rows whose integer-sum products (q4_1, Q4_0, Q5_0, Q8_0 and k-quant
    /// weights) may sum blocks in integers (see
    /// [`Graph::allow_integer_sums`](crate::ggml::graph::Graph::allow_integer_sums)): the
    /// tokens of the items of [`QUERY_TILE`] tokens or more, which come first. 0 when
    /// invariant.
    pub integer_sum_rows: usize,
}

impl Plan {
    /// Plans `items` over a pool of `n_cells` cells. Each token attends to the cells of its own
    /// sequence at positions up to its own; with `invariant`, no attention op has 64 queries or
    /// more (see [`Evaluation`](crate::Evaluation)),
    /// and, with `gather` too (a cache of a float type, which a gather copies exactly), a
    /// sequence whose pages do not ascend in the pool attends through a gathered window
    /// ([`SeqAttention::gather`]). With `window`, each attention also gets the mask of
    /// sliding-window layers ([`SeqAttention::swa_mask`]).
    pub(crate) fn new(
        items: &[PlanItem<'_>],
        n_cells: usize,
        mode: PlanMode,
        gather: bool,
        window: Option<usize>,
    ) -> Plan {
        let invariant = mode != PlanMode::Fast;
        let n: usize = items.iter().map(|i| i.tokens.len()).sum();
        let mut plan = Plan {
            tokens: Vec::with_capacity(n),
            positions: Vec::with_capacity(n * 4),
            cells: Vec::with_capacity(n * 8),
            attention: Vec::with_capacity(items.len()),
            out_rows: Vec::new(),
            item_rows: vec![0..0; items.len()],
            token_rows: vec![0..0; items.len()],
            integer_sum_rows: 0,
        };
        // Items of QUERY_TILE tokens or more first (outside invariant plans), each group in
        // batch order: their rows may then take the faster integer-sum products, which round
        // otherwise, while a token of a shorter item keeps ggml's bits beside them (the
        // choice, like `ours`, depends on the item alone).
        let long = |i: &PlanItem<'_>| !invariant && i.tokens.len() >= QUERY_TILE;
        let order: Vec<usize> = (0..items.len())
            .filter(|&i| long(&items[i]))
            .chain((0..items.len()).filter(|&i| !long(&items[i])))
            .collect();
        plan.integer_sum_rows = items
            .iter()
            .filter(|i| long(i))
            .map(|i| i.tokens.len())
            .sum();
        let neg_inf = f16::NEG_INFINITY.to_le_bytes();
        let mut row = 0;
        for &index in &order {
            let item = &items[index];
            let ascending = item.pages.windows(2).all(|w| w[0] < w[1]);
            let gathered = (invariant && gather && !ascending).then(|| {
                let n_kv = (item.pages.len() * PAGE_TOKENS).div_ceil(KV_PAD) * KV_PAD;
                let mut cells: Vec<u8> = item
                    .pages
                    .iter()
                    .flat_map(|&p| {
                        let first = p as usize * PAGE_TOKENS;
                        (first..first + PAGE_TOKENS).flat_map(|c| (c as i32).to_le_bytes())
                    })
                    .collect();
                // Padding: any cell, masked.
                cells.resize(n_kv * 4, 0);
                cells
            });
            // The window: from the sequence's lowest page to past its highest, padded (or the
            // gathered cells, page after page).
            let (first_cell, n_kv) = match &gathered {
                Some(cells) => (0, cells.len() / 4),
                None => {
                    let lo = item.pages.iter().min().map_or(0, |&p| p as usize) * PAGE_TOKENS;
                    let hi = item.pages.iter().max().map_or(0, |&p| p as usize + 1) * PAGE_TOKENS;
                    let n_kv = (hi - lo)
                        .div_ceil(KV_PAD)
                        .saturating_mul(KV_PAD)
                        .min(n_cells);
                    (lo.min(n_cells - n_kv), n_kv)
                }
            };
            let m = item.tokens.len();
            let mut mask = neg_inf.repeat(n_kv * m);
            let mut swa_mask = window.map(|_| neg_inf.repeat(n_kv * m));
            let first_out = plan.out_rows.len();
            for (i, &token) in item.tokens.iter().enumerate() {
                let pos = item.start + i;
                let cell = item.pages[pos / PAGE_TOKENS] as usize * PAGE_TOKENS + pos % PAGE_TOKENS;
                plan.tokens.push(token);
                plan.positions
                    .extend_from_slice(&(pos as i32).to_le_bytes());
                plan.cells.extend_from_slice(&(cell as i64).to_le_bytes());
                // Positions 0..=pos of this sequence, page by page.
                let mask_row = &mut mask[i * n_kv * 2..(i + 1) * n_kv * 2];
                for (pi, &page) in item.pages.iter().enumerate() {
                    let first = pi * PAGE_TOKENS;
                    if first > pos {
                        break;
                    }
                    let visible = (pos - first + 1).min(PAGE_TOKENS);
                    let c = match gathered {
                        Some(_) => first,
                        None => page as usize * PAGE_TOKENS - first_cell,
                    };
                    mask_row[c * 2..(c + visible) * 2].fill(0);
                    if let (Some(w), Some(swa)) = (window, swa_mask.as_mut()) {
                        // Positions pos + 1 - w ..= pos of this page.
                        let lo = first.max((pos + 1).saturating_sub(w));
                        if lo < first + visible {
                            let row = &mut swa[i * n_kv * 2..(i + 1) * n_kv * 2];
                            row[(c + lo - first) * 2..(c + visible) * 2].fill(0);
                        }
                    }
                }
                let wanted = match item.logits {
                    Logits::None => false,
                    Logits::Last => i + 1 == m,
                    Logits::All => true,
                };
                if wanted {
                    plan.out_rows.push((row + i) as i32);
                }
            }
            plan.attention.push(SeqAttention {
                ours: match mode {
                    PlanMode::Fast => ours(m, item.start + m),
                    PlanMode::PerQuery => false,
                    PlanMode::Kernel => true,
                },
                rows: row..row + m,
                first_cell,
                n_kv,
                mask,
                swa_mask,
                dup: false,
                gather: gathered,
                staged: None,
            });
            plan.token_rows[index] = row..row + m;
            row += m;
            plan.item_rows[index] = first_out..plan.out_rows.len();
        }
        let mut parts = std::mem::take(&mut plan.attention);
        if mode == PlanMode::PerQuery {
            parts = split_large(parts);
        }
        plan.attention = group_small(parts, n_cells);
        if mode == PlanMode::PerQuery {
            for a in &mut plan.attention {
                if a.rows.len() == 1 && a.n_kv >= KV_SPLIT {
                    a.dup = true;
                    a.mask = a.mask.repeat(2);
                    a.swa_mask = a.swa_mask.as_ref().map(|m| m.repeat(2));
                }
            }
        }
        plan
    }
}

/// How a [`Plan`] chooses its attention kernels (from the context's
/// [`Evaluation`](crate::Evaluation) and whether ggml-sys's attention runs on its cache).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PlanMode {
    /// Each sequence by its own queries and length (see [`ours`]); items of [`QUERY_TILE`]
    /// tokens or more first, their rows counted in [`Plan::integer_sum_rows`].
    Fast,
    /// Batch-invariant through ggml's kernel: every query on its own (parts of fewer than
    /// [`QUERY_TILE`] queries, a lone query over a long window given twice), windows out of
    /// position order gathered.
    PerQuery,
    /// Batch-invariant through ggml-sys's kernel for every shape (its tiles are pages, so a
    /// row's bits depend on its own sequence's pages alone); windows out of position order
    /// gathered.
    Kernel,
}

/// Below this many queries, ggml's CPU flash attention computes each query on its own (above,
/// it tiles queries together and sums in another order): sequences whose queries together stay
/// below it can share one attention op without changing a single result.
const QUERY_TILE: usize = 64;

/// From this many positions attended, a sequence's batch of fewer than [`QUERY_TILE`] queries
/// (one, when decoding) goes to ggml-sys's kernel too (see [`ours`]).
const LONG_SPAN: usize = 1024;

/// Whether a sequence's `m` queries, the last at position `len - 1`, go to ggml-sys's
/// attention kernel. With [`QUERY_TILE`] queries or more ggml's own kernel works in f32 on
/// tiles, as ours does (the same results within float rounding). Below, ggml rounds each query
/// to f16 and accumulates V in f16; llama.cpp's outputs for decoding and short prompts carry
/// that rounding (the golden tests compare greedy tokens), so short sequences stay on ggml's
/// kernel. From [`LONG_SPAN`] positions, ggml's per-query path reads the whole window once per
/// query and head (at 5,000 positions and 63 queries it took 2.5x longer per token than its
/// tiled path; decoding at 4,096 is 1.26x faster with ours), so every batch goes to ours. The
/// choice depends on the sequence alone, never on the pool's layout or the rest of the batch.
fn ours(m: usize, len: usize) -> bool {
    m >= QUERY_TILE || len >= LONG_SPAN
}

/// From this many cells, ggml's CPU flash attention splits a single query's window among its
/// threads (a split that depends on the window; see [`SeqAttention::dup`]).
const KV_SPLIT: usize = 512;

/// Splits a sequence's attention over more queries than [`QUERY_TILE`] into parts of fewer,
/// each over the same window with its own rows of the mask: every query is then computed on
/// its own, in the same order of operations whether its token is evaluated alone, in a
/// micro-batch of any size or beside other sequences, so a reply does not depend on how its
/// prompt was split or what it was batched with (the cache is invisible in the logits).
fn split_large(parts: Vec<SeqAttention>) -> Vec<SeqAttention> {
    let mut out = Vec::with_capacity(parts.len());
    for a in parts {
        if a.rows.len() < QUERY_TILE {
            out.push(a);
            continue;
        }
        let row_bytes = a.n_kv * 2;
        let chunk_bytes = (QUERY_TILE - 1) * row_bytes;
        let mut start = a.rows.start;
        for (k, chunk) in a.mask.chunks(chunk_bytes).enumerate() {
            let m = chunk.len() / row_bytes;
            out.push(SeqAttention {
                rows: start..start + m,
                first_cell: a.first_cell,
                n_kv: a.n_kv,
                mask: chunk.to_vec(),
                swa_mask: a
                    .swa_mask
                    .as_ref()
                    .map(|s| s[k * chunk_bytes..][..chunk.len()].to_vec()),
                dup: false,
                gather: a.gather.clone(),
                ours: a.ours,
                staged: None,
            });
            start += m;
        }
    }
    out
}

/// Merges runs of consecutive sequences with few tokens (decode steps, above all) into one
/// attention over the union of their windows, each row masked to its own sequence's cells. One
/// op per group instead of one per sequence saves a thread barrier per sequence and layer. A
/// gathered window stays on its own.
fn group_small(parts: Vec<SeqAttention>, n_cells: usize) -> Vec<SeqAttention> {
    let mut groups: Vec<Vec<SeqAttention>> = Vec::new();
    for part in parts {
        match groups.last_mut() {
            Some(g)
                if part.gather.is_none()
                    && g.iter().all(|a| a.gather.is_none() && a.ours == part.ours)
                    && g.iter().map(|a| a.rows.len()).sum::<usize>() + part.rows.len()
                        < QUERY_TILE =>
            {
                g.push(part)
            }
            _ => groups.push(vec![part]),
        }
    }
    groups
        .into_iter()
        .map(|mut g| {
            if g.len() == 1 {
                return g
                    .pop()
                    .unwrap_or_else(|| unreachable!("a group holds a part"));
            }
            let lo = g.iter().map(|a| a.first_cell).min().unwrap_or(0);
            let hi = g.iter().map(|a| a.first_cell + a.n_kv).max().unwrap_or(0);
            let n_kv = (hi - lo)
                .div_ceil(KV_PAD)
                .saturating_mul(KV_PAD)
                .min(n_cells);
            let first_cell = lo.min(n_cells - n_kv);
            let rows = g[0].rows.start..g[g.len() - 1].rows.end;
            // Each part's rows, moved into the group's window.
            let merge = |mask_of: &dyn Fn(&SeqAttention) -> &[u8]| {
                let mut mask = f16::NEG_INFINITY.to_le_bytes().repeat(n_kv * rows.len());
                for a in &g {
                    let shift = (a.first_cell - first_cell) * 2;
                    for (i, src) in mask_of(a).chunks(a.n_kv * 2).enumerate() {
                        let r = a.rows.start - rows.start + i;
                        let dst = &mut mask[r * n_kv * 2 + shift..][..a.n_kv * 2];
                        dst.copy_from_slice(src);
                    }
                }
                mask
            };
            let mask = merge(&|a| &a.mask);
            let swa_mask = g[0].swa_mask.is_some().then(|| {
                merge(&|a| {
                    a.swa_mask
                        .as_deref()
                        .unwrap_or_else(|| unreachable!("all or none"))
                })
            });
            SeqAttention {
                rows: rows.clone(),
                first_cell,
                n_kv,
                mask,
                swa_mask,
                dup: false,
                gather: None,
                ours: g[0].ours,
                staged: None,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Cells (of the pool) that batch row `row` of sequence `seq` may attend to.
    fn visible(plan: &Plan, seq: usize, row: usize) -> Vec<usize> {
        let a = &plan.attention[seq];
        (0..a.n_kv)
            .filter(|&c| {
                let b = &a.mask[(row * a.n_kv + c) * 2..][..2];
                f16::from_le_bytes([b[0], b[1]]) == f16::ZERO
            })
            .map(|c| c + a.first_cell)
            .collect()
    }

    #[test]
    fn pages_out_of_pool_order_are_gathered_in_position_order_when_invariant() {
        // Pages 2 then 0: position order is not pool order.
        let pages = [2u32, 0];
        let items = [PlanItem {
            pages: &pages,
            start: 70,
            tokens: &[5],
            logits: Logits::Last,
        }];
        let plain = Plan::new(&items, 1024, PlanMode::PerQuery, false, None);
        assert!(plain.attention[0].gather.is_none());
        let plan = Plan::new(&items, 1024, PlanMode::PerQuery, true, None);
        let a = &plan.attention[0];
        let cells: Vec<i32> = a
            .gather
            .as_ref()
            .expect("gathered")
            .chunks(4)
            .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        assert_eq!(cells.len(), a.n_kv);
        assert_eq!(cells[0], 128, "page 2 first");
        assert_eq!(cells[63], 191);
        assert_eq!(cells[64], 0, "then page 0");
        // Position 70 sees the whole first page and positions 64..=70 of the second: in
        // gathered coordinates, 0..71.
        assert_eq!(visible(&plan, 0, 0), (0..71).collect::<Vec<_>>());
        // Ascending pages need no gather.
        let up = [0u32, 2];
        let items = [PlanItem {
            pages: &up,
            start: 70,
            tokens: &[5],
            logits: Logits::Last,
        }];
        assert!(
            Plan::new(&items, 1024, PlanMode::PerQuery, true, None).attention[0]
                .gather
                .is_none()
        );
    }

    #[test]
    fn the_attention_kernel_is_chosen_by_each_sequence_alone() {
        // Sequence A: 20 queries ending at position 1,100; B: 20 ending at 300; C: one query
        // at 2,000; D: 64 queries ending at 128; E: one query at 500.
        let pages: Vec<u32> = (0..40).collect();
        let short: Vec<u32> = (0..20).collect();
        let one = [7u32];
        let tile: Vec<u32> = (0..64).collect();
        let items = [
            PlanItem {
                pages: &pages[..18],
                start: 1080,
                tokens: &short,
                logits: Logits::Last,
            },
            PlanItem {
                pages: &pages[18..23],
                start: 280,
                tokens: &short,
                logits: Logits::Last,
            },
            PlanItem {
                pages: &pages[..32],
                start: 1999,
                tokens: &one,
                logits: Logits::Last,
            },
            PlanItem {
                pages: &pages[32..34],
                start: 64,
                tokens: &tile,
                logits: Logits::Last,
            },
            PlanItem {
                pages: &pages[30..38],
                start: 499,
                tokens: &one,
                logits: Logits::Last,
            },
        ];
        let plan = Plan::new(&items, 40 * PAGE_TOKENS, PlanMode::Fast, false, None);
        let chosen: Vec<(usize, bool)> = plan
            .attention
            .iter()
            .map(|a| (a.rows.len(), a.ours))
            .collect();
        // D, of 64 tokens, comes first (its rows may take the integer-sum products) and takes
        // ours; then A and C take ours, B (ggml's) shares an op with neither; E, a short
        // sequence's single query, takes ggml's.
        assert_eq!(
            chosen,
            [(64, true), (20, true), (20, false), (1, true), (1, false)]
        );
        assert_eq!(plan.integer_sum_rows, 64);
        // Each item's logits row still answers for that item: D's last token is row 63.
        let last_rows: Vec<i32> = plan
            .item_rows
            .iter()
            .map(|r| plan.out_rows[r.start])
            .collect();
        assert_eq!(last_rows, [83, 103, 104, 63, 105]);
        // The same sequences alone: the same choices.
        for (item, want) in items.iter().zip([true, false, true, true, false]) {
            let alone = Plan::new(
                std::slice::from_ref(item),
                40 * PAGE_TOKENS,
                PlanMode::Fast,
                false,
                None,
            );
            assert_eq!(alone.attention[0].ours, want);
        }
        // Batch-invariant plans keep ggml's per-query path.
        let inv = Plan::new(&items, 40 * PAGE_TOKENS, PlanMode::PerQuery, false, None);
        assert!(inv.attention.iter().all(|a| !a.ours));
        assert_eq!(inv.integer_sum_rows, 0);
        // The invariant plan through ggml-sys's kernel takes it for every sequence, whole.
        let kernel = Plan::new(&items, 40 * PAGE_TOKENS, PlanMode::Kernel, false, None);
        assert!(kernel.attention.iter().all(|a| a.ours && !a.dup));
        assert_eq!(kernel.integer_sum_rows, 0);
        assert_eq!(
            kernel.attention.iter().map(|a| a.rows.len()).sum::<usize>(),
            items.iter().map(|i| i.tokens.len()).sum::<usize>()
        );
    }

    #[test]
    fn a_long_prefill_attends_alone() {
        let (a_pages, b_pages) = ([0u32, 1], [2u32]);
        let long: Vec<u32> = (0..70).collect();
        let items = [
            PlanItem {
                pages: &a_pages,
                start: 0,
                tokens: &long,
                logits: Logits::Last,
            },
            PlanItem {
                pages: &b_pages,
                start: 5,
                tokens: &[1],
                logits: Logits::Last,
            },
        ];
        let plan = Plan::new(&items, 1024, PlanMode::Fast, false, None);
        let rows: Vec<_> = plan.attention.iter().map(|a| a.rows.clone()).collect();
        assert_eq!(
            rows,
            [0..70, 70..71],
            "70 queries would change ggml's kernel"
        );
    }

    #[test]
    fn tokens_see_only_their_own_sequence_up_to_their_position() {
        // Sequence a holds pages 2 then 0 and feeds positions 64..66; b holds page 1 and feeds
        // position 3.
        let a_pages = [2, 0];
        let b_pages = [1];
        let items = [
            PlanItem {
                pages: &a_pages,
                start: 64,
                tokens: &[7, 8],
                logits: Logits::Last,
            },
            PlanItem {
                pages: &b_pages,
                start: 3,
                tokens: &[9],
                logits: Logits::None,
            },
        ];
        let plan = Plan::new(&items, 1024, PlanMode::Fast, false, None);
        // Three queries: one attention over the union of both windows.
        assert_eq!(plan.attention.len(), 1);
        let a = &plan.attention[0];
        assert_eq!((a.first_cell, a.n_kv, a.rows.clone()), (0, 512, 0..3));
        let cells: Vec<i64> = plan
            .cells
            .chunks(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(cells, [0, 1, 67]);
        let mut a0: Vec<usize> = vec![0];
        a0.extend(128..192);
        assert_eq!(visible(&plan, 0, 0), a0);
        a0.insert(1, 1);
        assert_eq!(visible(&plan, 0, 1), a0);
        assert_eq!(visible(&plan, 0, 2), vec![64, 65, 66, 67]);
        assert_eq!(plan.out_rows, [1]);
        assert_eq!(plan.item_rows, [0..1, 1..1]);
    }
}
