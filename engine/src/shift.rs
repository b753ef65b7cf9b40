//! Context shift, with llama.cpp's `--context-shift` semantics: keep a sequence's first
//! `n_keep` tokens, discard the `n_discard` after them, and move the rest down to follow the
//! kept ones. Moved K rows are rotated by the position delta (RoPE applied to the cached K, as
//! llama.cpp's K-shift does); nothing is evaluated again. Afterwards position `i` holds
//! `tokens[i]` again, but the KV of the moved tokens still reflects the discarded context.
//!
//! In the paged pool: full pages wholly inside the kept prefix stay as they are (shared or
//! not); the rest of the sequence is moved by one graph (K rows gathered, rotated and
//! scattered; V rows gathered and scattered): in place, into the first of its own pages, when
//! no other sequence shares them (the pages keep their order in the pool, which the attention's
//! summation order follows), else into fresh pages, the old ones then released. The
//! block ids of pages written after a shift chain from a root that hashes the sequence's whole
//! history and the shift, so they never collide with the ids of an unshifted computation of the
//! same tokens. A checkpoint records the roots ([`ckptfmt::ChainRoot`]), so a restored sequence
//! names its pages, and the pages it fills later, exactly as the original does.

use ckptfmt::{BlockId, ChainRoot};

use crate::context::{Context, SeqId, Sequence};
use crate::error::{Error, Result};
use crate::ggml::{DType, Graph, KvTensors, Tensor};
use crate::kv::PAGE_TOKENS;
use crate::model::{Model, RopeScaling};

/// Never a token id: marks a shift in the hash of a shifted sequence's chain root.
const SHIFT_MARKER: u32 = u32::MAX;

/// What one shift graph moves.
pub(crate) struct ShiftPlan {
    /// Pool cells to read (i32, little-endian: `get_rows` indices), one per moved token.
    src_cells: Vec<u8>,
    /// Pool cells to write (i64: `set_rows` indices), in the same order.
    dst_cells: Vec<u8>,
    /// The position delta, per moved token (i32).
    deltas: Vec<u8>,
    n_rows: usize,
}

impl Sequence {
    /// The id that block `i` of this sequence chains from (needs the ids of the blocks before
    /// it): its root after a shift, else the block before it.
    pub(crate) fn prev_id(&self, i: usize) -> Option<&BlockId> {
        ChainRoot::find(&self.roots, i).or_else(|| match i.checked_sub(1) {
            Some(p) => self.ids.get(p),
            None => self.namespace.as_ref(),
        })
    }
}

impl Context {
    /// Shifts `seq`: keeps its first `n_keep` tokens, discards the next `n_discard` and moves
    /// the rest down by `n_discard` positions, re-rotating their cached K (see the module
    /// docs). Logits are dropped (the next evaluated token brings new ones).
    ///
    /// Errors, before anything changes: [`Error::BadShift`] when `n_keep + n_discard` exceeds
    /// the tokens held; [`Error::OutOfPages`] when the pool lacks the fresh pages the moved
    /// tokens need (only when another sequence shares a page past the kept ones; otherwise
    /// the pages are rewritten in place); [`Error::WindowReleased`] when it would move rows of
    /// sliding-window layers that were released, or keep such rows inside the window of the
    /// shifted end ([`Context::release_windows`]). A shift discarding nothing changes nothing. Should
    /// ggml's computation itself fail during an in-place shift, the sequence is cut back to its
    /// first `n_keep` tokens (the only ones known intact) before the error is returned.
    pub fn shift(&mut self, seq: SeqId, n_keep: usize, n_discard: usize) -> Result<()> {
        // A shift rewrites rows in the pool: spilled pages come back first (the budget is
        // kept again after the next batch).
        self.unspill(seq)?;
        let s = self.seq(seq)?;
        let len = s.tokens.len();
        if n_keep + n_discard > len {
            return Err(Error::BadShift {
                n_keep,
                n_discard,
                len,
            });
        }
        if n_discard == 0 {
            return Ok(());
        }
        if self.recurrent.is_some() {
            return Err(Error::Recurrent {
                what: format!("shifting {seq} (discarding {n_discard} tokens)"),
            });
        }
        let new_len = len - n_discard;
        let first = n_keep / PAGE_TOKENS;
        let n_new = new_len.div_ceil(PAGE_TOKENS) - first;
        let old_pages = s.pages.clone();
        // In place when this sequence alone holds the pages it rewrites: the moved rows are
        // gathered before they are scattered (per layer, one op after the other), and the table
        // stays a prefix of the old one, so the pages keep their order in the pool (attention
        // sums over a sequence's cells in pool order: a restored sequence, whose pages are in
        // order, then computes the same bits). Otherwise into fresh pages.
        let in_place = old_pages[first..].iter().all(|&p| self.pool.refs(p) == 1);
        // Rows of sliding-window layers that were released (they read as zeros) must neither
        // be moved (a moved row lands at another position, in a page that is then exported
        // as a whole) nor be kept inside the window of the shifted sequence's end.
        let window = self.window_first_page(new_len)..new_len.div_ceil(PAGE_TOKENS);
        let released = (first..old_pages.len())
            .chain(window.filter(|&i| i < first))
            .find(|&i| self.pool.is_released(old_pages[i]));
        if let Some(i) = released {
            return Err(Error::WindowReleased {
                seq,
                position: i * PAGE_TOKENS,
            });
        }
        if !in_place && n_new > self.pool.n_free() {
            return Err(Error::OutOfPages {
                needed: n_new,
                free: self.pool.n_free(),
                total: self.pool.n_pages(),
            });
        }
        let (table, fresh) = if in_place {
            for &p in &old_pages[first..first + n_new] {
                self.pool.unindex(p);
            }
            (old_pages[..first + n_new].to_vec(), Vec::new())
        } else {
            let fresh: Vec<u32> = (0..n_new).filter_map(|_| self.pool.alloc()).collect();
            let mut table = old_pages[..first].to_vec();
            table.extend(&fresh);
            // The kept rows of a partly kept page are copied as they are.
            let kept_rows = n_keep % PAGE_TOKENS;
            if kept_rows > 0 {
                self.copy_page(old_pages[first], fresh[0], kept_rows);
            }
            (table, fresh)
        };
        let cell = |pages: &[u32], p: usize| {
            pages[p / PAGE_TOKENS] as i64 * PAGE_TOKENS as i64 + (p % PAGE_TOKENS) as i64
        };
        let moved = n_keep + n_discard..len;
        let plan = ShiftPlan {
            src_cells: moved
                .clone()
                .flat_map(|p| (cell(&old_pages, p) as i32).to_le_bytes())
                .collect(),
            dst_cells: moved
                .clone()
                .flat_map(|p| cell(&table, p - n_discard).to_le_bytes())
                .collect(),
            deltas: moved
                .clone()
                .flat_map(|_| (-(n_discard as i32)).to_le_bytes())
                .collect(),
            n_rows: moved.len(),
        };
        if plan.n_rows > 0 {
            if let Err(e) = self.run_shift(&plan) {
                for p in fresh {
                    self.pool.release(p);
                }
                if in_place {
                    // The rows past `n_keep` may be half moved; those before it were not
                    // written.
                    self.truncate(seq, n_keep)?;
                }
                return Err(e);
            }
        }

        // Commit: the new table, tokens and ids; the old pages past the kept ones go.
        let fingerprint = self.fingerprint();
        let s = self.seqs.get_mut(&seq).expect("checked above");
        let tail = &s.tokens[s.ids.len() * PAGE_TOKENS..];
        let mut history = tail.to_vec();
        history.extend([SHIFT_MARKER, n_keep as u32, n_discard as u32]);
        let root = BlockId::chain(
            &fingerprint,
            s.ids.last().or(s.namespace.as_ref()),
            &history,
        );
        s.tokens.drain(n_keep..n_keep + n_discard);
        s.ids.truncate(first);
        s.roots.retain(|r| r.block < first as u64);
        s.roots.push(ChainRoot {
            block: first as u64,
            id: root,
        });
        s.pages = table;
        s.logits = None;
        let mut new_ids = Vec::new();
        while s.ids.len() + new_ids.len() < new_len / PAGE_TOKENS {
            let i = s.ids.len() + new_ids.len();
            let prev = new_ids.last().or_else(|| s.prev_id(i));
            let id = BlockId::chain(
                &fingerprint,
                prev,
                &s.tokens[i * PAGE_TOKENS..(i + 1) * PAGE_TOKENS],
            );
            new_ids.push(id);
        }
        let pages = s.pages.clone();
        s.ids.extend(&new_ids);
        for (j, id) in new_ids.into_iter().enumerate() {
            self.pool.index(pages[first + j], id);
        }
        let dropped = if in_place { first + n_new } else { first };
        for p in &old_pages[dropped..] {
            self.pool.release(*p);
        }
        Ok(())
    }
}

/// The shift graph: per layer, the moved K rows gathered, rotated by their delta and
/// scattered into their new cells; V rows gathered and scattered. Returns the last layer's
/// rotated K rows (the graph's output).
pub(crate) fn build<'g, 'w>(
    g: &mut Graph<'g, 'w>,
    model: &'w Model,
    kv: &'w mut KvTensors,
    plan: &ShiftPlan,
) -> Result<Tensor<'g>> {
    let hp = model.hparams();
    let m = plan.n_rows;
    let src = g.input(DType::I32, &[m], plan.src_cells.clone());
    let dst = g.input(DType::I64, &[m], plan.dst_cells.clone());
    let delta = g.input(DType::I32, &[m], plan.deltas.clone());
    let freq_factors = model.rope_freqs().map(|t| g.lift(t));
    let kv = kv.tensors_mut();
    let mut out = None;
    for il in 0..hp.n_layer {
        let k_cache = g.lift_mut(kv.k(il));
        let v_cache = g.lift_mut(kv.v(il));
        let k = g.get_rows(k_cache.as_tensor(), src);
        let k = g.reshape_3d(k, hp.head_dim_at(il), hp.n_head_kv_at(il), m);
        let mut rope = crate::arch::rope_params(model, il);
        // (mistral3's factor already is llama.cpp's own, which its K-shift uses as it is.)
        if let (RopeScaling::Yarn { .. }, None) = (hp.rope_scaling, &hp.mistral3) {
            // YaRN scales magnitudes by its mscale on every rotation; a shift rotates rows that
            // were scaled once already, so it undoes the factor (as llama.cpp's K-shift does).
            // Windowed layers that rotate unscaled (gemma) get 1: no factor to undo.
            rope.attn_factor = 1.0 / (1.0 + 0.1 * (1.0 / rope.freq_scale).ln());
        }
        // gemma4's windowed layers rotate without the factors.
        let factors = freq_factors.filter(|_| hp.gemma4.is_none() || !hp.is_swa(il));
        let k = g.rope(k, delta, factors, &rope);
        let k = g.reshape_2d(k, hp.n_embd_kv_at(il), m);
        let k_store = g.set_rows(k_cache, k, dst);
        g.expand(k_store);
        let v = g.get_rows(v_cache.as_tensor(), src);
        let v_store = g.set_rows(v_cache, v, dst);
        g.expand(v_store);
        out = Some(k);
    }
    out.ok_or(Error::Ggml {
        what: "a model without layers",
    })
}
