//! One engine context per model: the backend, its thread pool, the compute allocator and the KV
//! page pool, shared by any number of sequences.
//!
//! The step API: create sequences, add their work to a [`Batch`], run it with
//! [`Context::decode`] (one graph for every sequence in the batch), read each sequence's logits
//! and sample. [`Session`](crate::Session) is the single-sequence convenience over the same
//! calls.

mod feed;

use std::collections::BTreeMap;
use std::sync::Arc;

use ckptfmt::{BlockId, ChainRoot, Fingerprint};

use crate::arch;
use crate::batch::{Batch, BatchOutput, Logits, Output, Plan, PlanItem, PlanMode};
use crate::error::{Error, Result};
use crate::ggml::IntegerSums;
use crate::ggml::{kernel_takes_model, Compute, KvTensors};
use crate::kv::{KvLayout, KvStats, KvType, PagePool, PAGE_TOKENS};
use crate::model::Model;
use crate::namespace::Namespace;
pub use crate::params::ContextParams;
use crate::params::Evaluation;

/// A sequence of a [`Context`]. Ids are never reused, so a stale id is an error, not another
/// sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SeqId(pub(crate) u64);

impl std::fmt::Display for SeqId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "seq{}", self.0)
    }
}

/// What a sequence holds: positions `0..tokens.len()` in the pages of its table.
#[derive(Debug, Default)]
pub(crate) struct Sequence {
    /// `pages[i]` holds positions `i * PAGE_TOKENS ..`; exactly `ceil(len / PAGE_TOKENS)` pages.
    pub pages: Vec<u32>,
    pub tokens: Vec<u32>,
    /// Chained block ids of the full pages.
    pub ids: Vec<BlockId>,
    /// Logits after the last token, when it was evaluated with logits asked for.
    pub logits: Option<Vec<f32>>,
    /// After context shifts: pages whose block id chains from a root hashing the history
    /// instead of from the id before them (see `shift.rs`), by increasing page; each page is at
    /// most `ids.len()`.
    pub roots: Vec<ChainRoot>,
    /// The root of its prompt-cache namespace, which its first block chains from (unless a
    /// root of block 0 in `roots` replaced it); kept when the sequence is truncated or shifted.
    pub namespace: Option<BlockId>,
}

/// The engine's state for one model: backends (the CPU's thread pool, and the device of the
/// model's offloaded layers), compute buffers and KV page pool.
pub struct Context {
    model: Arc<Model>,
    params: ContextParams,
    layout: KvLayout,
    fingerprint: Fingerprint,
    compute: Compute,
    pub(crate) kv: KvTensors,
    pub(crate) pool: PagePool,
    pub(crate) seqs: BTreeMap<SeqId, Sequence>,
    next_seq: u64,
    /// The sequence of the [`Session`](crate::Session) that owns this context, if one does:
    /// [`Context::remove_sequence`] refuses it, so the session's sequence lives as long as the
    /// session.
    session_seq: Option<SeqId>,
    /// Where pages past `params.kv_ram` go (see `spill.rs`).
    pub(crate) spill: Option<crate::spill::Spill>,
    /// The recurrent layers' per-sequence state, for a hybrid model (see `recurrent.rs`).
    pub(crate) recurrent: Option<crate::recurrent::Recurrent>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("params", &self.params)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl Context {
    /// A context for `model` with an empty page pool of `params.kv_tokens` tokens. A quantized
    /// V without flash attention is [`Error::KvTypeNeedsFlashAttn`]; a quantized type whose
    /// blocks do not divide the head size is [`Error::KvTypeHeadDim`].
    pub fn new(model: Arc<Model>, mut params: ContextParams) -> Result<Context> {
        if params.type_v != KvType::F16 && !params.flash_attn {
            return Err(Error::KvTypeNeedsFlashAttn {
                kv_type: params.type_v,
            });
        }
        let most = if params.past_train {
            usize::MAX
        } else {
            model.hparams().n_ctx_train.max(1)
        };
        params.n_ctx = params.n_ctx.clamp(1, most);
        params.n_batch = params.n_batch.max(1);
        let kv_tokens = if params.kv_tokens == 0 {
            params.n_ctx
        } else {
            params.kv_tokens
        };
        let n_pages = kv_tokens.div_ceil(PAGE_TOKENS).max(1);
        params.kv_tokens = n_pages * PAGE_TOKENS;
        let layout = KvLayout::with_types(model.hparams(), params.type_k, params.type_v)?;
        let hp = model.hparams();
        let dims: Vec<usize> = (0..hp.n_layer).map(|il| hp.n_embd_kv_at(il)).collect();
        // The KV of offloaded layers lives on their device, and graphs run under the scheduler.
        let placement = model.placement();
        if placement.is_some() && model.hparams().state_shape().is_some() {
            return Err(Error::Recurrent {
                what: "offloading the layers of a hybrid model".into(),
            });
        }
        let recurrent = crate::recurrent::Recurrent::new(model.hparams())?;
        let kv = KvTensors::placed(
            &dims,
            &dims,
            params.type_k,
            params.type_v,
            n_pages * PAGE_TOKENS,
            placement.map(|p| (p.device, p.first_layer)),
            // Under a RAM budget the pool may be far larger than memory: address space only.
            params.kv_ram == 0,
        )?;
        let compute = match placement {
            Some(p) => Compute::scheduled(p.device, params.n_threads)?,
            None => Compute::cpu(params.n_threads)?,
        };
        Ok(Context {
            fingerprint: Fingerprint(model.fingerprint()),
            compute,
            kv,
            pool: PagePool::new(n_pages),
            seqs: BTreeMap::new(),
            next_seq: 0,
            session_seq: None,
            spill: None,
            recurrent,
            layout,
            params,
            model,
        })
    }

    /// Touches the first `num / den` of the pool's memory now, so that filling those pages later
    /// (a restore, a prefill) takes no page faults.
    pub(crate) fn prefault(&mut self, num: usize, den: usize) {
        self.kv.prefault(num, den);
    }

    /// The model.
    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    /// The parameters in effect (after clamping and rounding).
    pub fn params(&self) -> &ContextParams {
        &self.params
    }

    /// The byte layout of the KV pages.
    pub fn kv_layout(&self) -> &KvLayout {
        &self.layout
    }

    /// The model's fingerprint, the root of every block id.
    pub fn fingerprint(&self) -> Fingerprint {
        self.fingerprint
    }

    /// Occupancy of the page pool.
    pub fn stats(&self) -> KvStats {
        let (pages_used, pages_shared, pages_window_released) = self.pool.counts();
        KvStats {
            pages_total: self.pool.n_pages(),
            pages_used,
            pages_shared,
            pages_referenced: self.seqs.values().map(|s| s.pages.len()).sum(),
            sequences: self.seqs.len(),
            pages_window_released,
            pages_spilled: self.pool.n_spilled(),
            spill_bytes_read: self.spill.as_ref().map_or(0, |s| s.bytes_read),
            spill_pages_written: self.spill.as_ref().map_or(0, |s| s.pages_written),
        }
    }

    /// Bytes of the KV pool's host memory resident in RAM, as the system counts them (`None`
    /// where it cannot tell): the pool is reserved address space that costs RAM only where
    /// written, and less after [`Context::release_windows`].
    pub fn kv_resident_bytes(&self) -> Option<usize> {
        self.kv.resident_bytes()
    }

    /// A new, empty sequence. It holds no page until tokens are added.
    pub fn new_sequence(&mut self) -> SeqId {
        let id = SeqId(self.next_seq);
        self.next_seq += 1;
        self.seqs.insert(id, Sequence::default());
        id
    }

    /// A new sequence holding the first `len` positions of `src`, sharing its pages (no KV is
    /// copied; a shared, partly filled page is copied when either sequence writes into it).
    /// [`Error::WindowReleased`] when the window of a token at `len` reaches released rows of
    /// sliding-window layers.
    pub fn fork(&mut self, src: SeqId, len: usize) -> Result<SeqId> {
        let s = self.seq(src)?;
        if len > s.tokens.len() {
            return Err(Error::KvRange {
                layer: 0,
                start: 0,
                end: len,
                len: s.tokens.len(),
            });
        }
        // A recurrent state is known only after every token of `src` (or before the first),
        // and at the page boundaries where it kept one.
        let state = match &self.recurrent {
            Some(r) if len > 0 && len < s.tokens.len() => {
                let kept = r.snapshots(src).iter().find(|k| k.len == len);
                match kept {
                    Some(k) => Some(k.state.clone()),
                    None => {
                        return Err(Error::Recurrent {
                            what: format!(
                                "forking {src} at {len} of its {} tokens, where it kept no state",
                                s.tokens.len()
                            ),
                        })
                    }
                }
            }
            Some(_) if len > 0 => self.recurrent_state(src)?,
            _ => None,
        };
        let pages = s.pages[..len.div_ceil(PAGE_TOKENS)].to_vec();
        self.check_window(src, &pages, len)?;
        // The fork's last page, cut inside, is written again: back from its file first.
        if !len.is_multiple_of(PAGE_TOKENS) {
            self.unspill_page(pages[len / PAGE_TOKENS])?;
        }
        let s = self.seq(src)?;
        let fork = Sequence {
            tokens: s.tokens[..len].to_vec(),
            ids: s.ids[..len / PAGE_TOKENS].to_vec(),
            logits: if len == s.tokens.len() {
                s.logits.clone()
            } else {
                None
            },
            pages,
            roots: roots_below(&s.roots, len),
            namespace: s.namespace,
        };
        for &p in &fork.pages {
            self.pool.retain(p);
        }
        let id = self.new_sequence();
        self.seqs.insert(id, fork);
        if let Some(state) = state {
            if let Err(e) = self.set_recurrent_state(id, &state) {
                let _ = self.remove_sequence(id);
                return Err(e);
            }
        }
        Ok(id)
    }

    /// Starts the empty sequence `seq` from the longest run of `tokens`' leading full blocks
    /// already resident in the pool (held by any live sequence), sharing those pages. Returns
    /// the number of tokens attached (a multiple of [`PAGE_TOKENS`], possibly 0).
    pub fn attach_prefix(&mut self, seq: SeqId, tokens: &[u32]) -> Result<usize> {
        self.check_tokens(tokens)?;
        let usable = tokens.len().min(self.params.n_ctx);
        let s = self.seq(seq)?;
        if !s.tokens.is_empty() {
            return Err(Error::SequenceNotEmpty { seq });
        }
        let (ids, pages) =
            self.resident_pages(&tokens[..usable], s.namespace.map(Namespace::from_root));
        for &p in &pages {
            self.pool.retain(p);
        }
        let n = pages.len() * PAGE_TOKENS;
        let s = self.seq_mut(seq)?;
        s.tokens = tokens[..n].to_vec();
        s.ids = ids;
        s.pages = pages;
        s.logits = None;
        Ok(n)
    }

    /// How many of `tokens`' leading tokens, in whole pages, the pool holds by block id in
    /// namespace `ns` (what [`Context::attach_prefix`] would attach now to a sequence of that
    /// namespace), without changing anything.
    pub fn resident_prefix(&self, tokens: &[u32], ns: Option<Namespace>) -> usize {
        let usable = tokens.len().min(self.params.n_ctx);
        self.resident_pages(&tokens[..usable], ns).1.len() * PAGE_TOKENS
    }

    /// The ids and pool pages of the longest run of `tokens`' leading full blocks resident in
    /// the pool, in namespace `ns`.
    fn resident_pages(&self, tokens: &[u32], ns: Option<Namespace>) -> (Vec<BlockId>, Vec<u32>) {
        // Pages hold no recurrent state: a hybrid model's sequence cannot start from them.
        if self.recurrent.is_some() {
            return (Vec::new(), Vec::new());
        }
        let root = ns.map(Namespace::root);
        let mut ids = Vec::new();
        let mut pages = Vec::new();
        for block in tokens.chunks_exact(PAGE_TOKENS) {
            let id = BlockId::chain(&self.fingerprint, ids.last().or(root.as_ref()), block);
            match self.pool.find(&id) {
                Some(page) => {
                    ids.push(id);
                    pages.push(page);
                }
                None => break,
            }
        }
        // A run whose end's window reaches released rows of sliding-window layers is cut
        // back to where a sequence can go on.
        while let Some(position) = self.window_gap(&pages, pages.len() * PAGE_TOKENS) {
            let keep = position / PAGE_TOKENS;
            pages.truncate(keep);
            ids.truncate(keep);
        }
        (ids, pages)
    }

    /// Drops `seq`, returning the pages only it held. The sequence of the
    /// [`Session`](crate::Session) this context belongs to is refused
    /// ([`Error::SessionSequence`]), the context unchanged.
    pub fn remove_sequence(&mut self, seq: SeqId) -> Result<()> {
        if self.session_seq == Some(seq) {
            return Err(Error::SessionSequence { seq });
        }
        let s = self
            .seqs
            .remove(&seq)
            .ok_or(Error::UnknownSequence { seq })?;
        for p in s.pages {
            self.pool.release(p);
        }
        if let Some(r) = self.recurrent.as_mut() {
            r.remove(seq);
        }
        Ok(())
    }

    /// Marks `seq` as the owning session's own sequence, which
    /// [`Context::remove_sequence`] refuses from then on.
    pub(crate) fn keep_session_sequence(&mut self, seq: SeqId) {
        self.session_seq = Some(seq);
    }

    /// Live sequences, oldest first.
    pub fn sequences(&self) -> impl Iterator<Item = SeqId> + '_ {
        self.seqs.keys().copied()
    }

    /// Tokens held by `seq`, position `i` being `tokens[i]`.
    pub fn tokens(&self, seq: SeqId) -> Result<&[u32]> {
        Ok(&self.seq(seq)?.tokens)
    }

    /// Logits after `seq`'s last token, if it was evaluated with logits asked for.
    pub fn logits(&self, seq: SeqId) -> Result<&[f32]> {
        self.seq(seq)?.logits.as_deref().ok_or(Error::NoLogits)
    }

    /// Logits after `seq`'s last token, computing them when the sequence has none (after an
    /// import, say) without touching its KV: the last token is evaluated again in a scratch
    /// sequence that shares the others' pages (one page is copied). A hybrid model's scratch
    /// sequence starts where a state before the last token is known ([`Context::resumable_len`]:
    /// a snapshot, else the start) and evaluates the tokens from there.
    pub fn ensure_logits(&mut self, seq: SeqId) -> Result<&[f32]> {
        let s = self.seq(seq)?;
        if s.logits.is_none() {
            let Some(&last) = s.tokens.last() else {
                return Err(Error::NoLogits);
            };
            // A hybrid's state is known only at its end and where it kept snapshots: the
            // scratch sequence starts from the last of those before the last token.
            let len = s.tokens.len();
            let from = self.resumable_len(seq, len - 1)?;
            let tail = self.seq(seq)?.tokens[from..].to_vec();
            debug_assert_eq!(tail.last(), Some(&last));
            let scratch = self.fork(seq, from)?;
            let logits = self.feed(scratch, &tail, Logits::Last);
            self.remove_sequence(scratch)?;
            self.seq_mut(seq)?.logits = Some(logits?);
        }
        self.logits(seq)
    }

    /// Chained block ids of `seq`'s full pages (page `i` holds block `ids[i]`).
    pub fn block_ids(&self, seq: SeqId) -> Result<&[BlockId]> {
        Ok(&self.seq(seq)?.ids)
    }

    /// Forgets every position of `seq` at or after `len` (no-op when already shorter).
    /// [`Error::WindowReleased`], changing nothing, when the window of a token at `len` reaches
    /// released rows of sliding-window layers ([`Context::resumable_len`] says how far back
    /// `seq` can be cut).
    pub fn truncate(&mut self, seq: SeqId, len: usize) -> Result<()> {
        let s = self
            .seqs
            .get_mut(&seq)
            .ok_or(Error::UnknownSequence { seq })?;
        if len >= s.tokens.len() {
            return Ok(());
        }
        let held = s.tokens.len();
        if self.recurrent.is_some() && len > 0 && !self.snapshot_lens(seq).contains(&len) {
            return Err(Error::Recurrent {
                what: format!(
                    "cutting {seq} back to {len} of its {held} tokens, where it kept no state"
                ),
            });
        }
        if let Some(position) = self.window_gap(&self.seqs[&seq].pages, len) {
            return Err(Error::WindowReleased { seq, position });
        }
        // A page cut inside is written again: back from its file first, when spilled.
        if !len.is_multiple_of(PAGE_TOKENS) {
            self.unspill_page(self.seqs[&seq].pages[len / PAGE_TOKENS])?;
        }
        // Back to the state kept at `len`; cleared to nothing, the next batch starts from a
        // zeroed state.
        if let Some(r) = self.recurrent.as_mut() {
            match len {
                0 => r.remove(seq),
                _ => r.rewind(seq, len)?,
            }
        }
        let s = self.seqs.get_mut(&seq).expect("checked above");
        s.tokens.truncate(len);
        s.ids.truncate(len / PAGE_TOKENS);
        s.logits = None;
        s.roots = roots_below(&s.roots, len);
        for p in s.pages.drain(len.div_ceil(PAGE_TOKENS)..) {
            self.pool.release(p);
        }
        Ok(())
    }

    /// Where the block-id chain of `seq` starts again after context shifts (empty for a
    /// sequence never shifted, or truncated back before its first shift): page `r.block`
    /// chains from `r.id`. A checkpoint records them, so that a restored sequence names its
    /// pages as the original did.
    ///
    /// A sequence in a namespace ([`Context::set_namespace`]) has a root of block 0 too.
    pub fn chain_roots(&self, seq: SeqId) -> Result<Vec<ChainRoot>> {
        let s = self.seq(seq)?;
        let mut roots = s.roots.clone();
        if let Some(id) = s.namespace {
            if roots.first().is_none_or(|r| r.block != 0) {
                roots.insert(0, ChainRoot { block: 0, id });
            }
        }
        Ok(roots)
    }

    /// Whether `seq` was shifted: its later blocks chain from a root that hashes its history,
    /// so they are not found by its tokens alone.
    pub fn is_shifted(&self, seq: SeqId) -> Result<bool> {
        Ok(!self.seq(seq)?.roots.is_empty())
    }

    /// Puts the empty sequence `seq` in namespace `ns` (`None`: the shared one): its blocks
    /// share ids, and so pages and stored blocks, only with sequences of the same namespace.
    pub fn set_namespace(&mut self, seq: SeqId, ns: Option<Namespace>) -> Result<()> {
        let s = self.seq_mut(seq)?;
        if !s.tokens.is_empty() {
            return Err(Error::SequenceNotEmpty { seq });
        }
        s.namespace = ns.map(Namespace::root);
        Ok(())
    }

    /// The namespace of `seq` ([`Context::set_namespace`]).
    pub fn namespace(&self, seq: SeqId) -> Result<Option<Namespace>> {
        Ok(self.seq(seq)?.namespace.map(Namespace::from_root))
    }

    pub(crate) fn seq(&self, seq: SeqId) -> Result<&Sequence> {
        self.seqs.get(&seq).ok_or(Error::UnknownSequence { seq })
    }

    fn seq_mut(&mut self, seq: SeqId) -> Result<&mut Sequence> {
        self.seqs
            .get_mut(&seq)
            .ok_or(Error::UnknownSequence { seq })
    }

    /// Refuses token ids outside the vocabulary.
    pub(crate) fn check_tokens(&self, tokens: &[u32]) -> Result<()> {
        let n_vocab = self.model.hparams().n_vocab;
        match tokens.iter().find(|&&t| t as usize >= n_vocab) {
            Some(&id) => Err(Error::BadToken { id, n_vocab }),
            None => Ok(()),
        }
    }

    /// Pages needed to append `n` tokens to `s`: new pages, plus a copy of a shared, partly
    /// filled last page.
    fn pages_needed(&self, s: &Sequence, n: usize) -> usize {
        let len = s.tokens.len();
        let grow = (len + n).div_ceil(PAGE_TOKENS) - s.pages.len();
        let copy =
            !len.is_multiple_of(PAGE_TOKENS) && self.pool.refs(*s.pages.last().unwrap_or(&0)) > 1;
        grow + usize::from(copy)
    }

    /// How this context's plans choose attention kernels: [`Evaluation::Invariant`] takes
    /// ggml-sys's kernel for every shape where it runs on every layer (an f16 cache the CPU
    /// reads, a head size it takes, no attention sinks), and ggml's per-query path otherwise.
    fn plan_mode(&self) -> PlanMode {
        match self.params.evaluation {
            Evaluation::Fast => PlanMode::Fast,
            Evaluation::LlamaCpp => PlanMode::PerQuery,
            Evaluation::Invariant => {
                let hp = self.model.hparams();
                let kernel = [self.layout.type_k, self.layout.type_v]
                    .iter()
                    .all(|t| matches!(t, KvType::F16 | KvType::Q8_0))
                    && (0..hp.n_layer).all(|l| self.kv.cpu_readable(l))
                    && (0..hp.n_layer)
                        .all(|l| kernel_takes_model(hp.head_dim_at(l), hp.attn_softcap))
                    // ggml-sys's kernel has no attention sinks (gpt-oss).
                    && !hp.has_attn_sinks();
                if kernel {
                    PlanMode::Kernel
                } else {
                    PlanMode::PerQuery
                }
            }
        }
    }

    /// Copies the first `rows` rows of `from` into `to`, in every layer.
    pub(crate) fn copy_page(&mut self, from: u32, to: u32, rows: usize) {
        for l in 0..self.layout.n_layers {
            for (value, bytes) in [
                (false, self.layout.k_bytes_per_token[l]),
                (true, self.layout.v_bytes_per_token[l]),
            ] {
                let page_bytes = PAGE_TOKENS * bytes;
                self.kv.copy_within(
                    l,
                    value,
                    from as usize * page_bytes,
                    to as usize * page_bytes,
                    rows * bytes,
                );
            }
        }
    }

    /// Evaluates `batch` in one graph: every item's tokens are appended to its sequence (their
    /// K and V written into its pages) and the logits asked for are returned, and kept per
    /// sequence (see [`Context::logits`]).
    ///
    /// Checked before anything changes: the sequences exist and appear once, positions continue
    /// their sequences, token ids are in the vocabulary, each sequence stays within `n_ctx`, the
    /// batch within `n_batch` tokens and the pool has the pages needed
    /// ([`Error::OutOfPages`]). On any error no sequence changes.
    pub fn decode(&mut self, batch: &Batch) -> Result<BatchOutput> {
        let n_tokens = batch.n_tokens();
        if batch.is_empty() || n_tokens == 0 {
            return Err(Error::EmptyBatch);
        }
        if n_tokens > self.params.n_batch {
            return Err(Error::BatchTooLarge {
                n_tokens,
                n_batch: self.params.n_batch,
            });
        }
        let needed = self.check_batch(batch)?;

        // Room within the RAM budget, and the spilled pages attended to mapped (see
        // `spill.rs`); a failure here changes no sequence.
        self.prepare_spill(batch, needed)?;

        // New page tables; the old ones stay valid until the graph succeeded.
        let (tables, fresh, replaced) = self.prepare_tables(batch)?;

        let plan_items: Vec<PlanItem<'_>> = batch
            .items
            .iter()
            .zip(&tables)
            .map(|(item, table)| PlanItem {
                pages: table,
                start: self.seqs[&item.seq].tokens.len(),
                tokens: &item.tokens,
                logits: item.logits,
            })
            .collect();
        let mut plan = Plan::new(
            &plan_items,
            self.pool.n_pages() * PAGE_TOKENS,
            self.plan_mode(),
            self.layout.type_k == KvType::F16 && self.layout.type_v == KvType::F16,
            self.model.hparams().sliding_window.as_ref().map(|w| w.size),
        );
        if let Some(spill) = self.spill.as_mut() {
            let kv = &self.kv;
            spill.stage(&mut plan, &self.pool, &self.layout, |l, value| {
                kv.host_address(l, value)
            });
        }
        // The recurrent layers' slots: read each sequence's state, write a fresh slot.
        let slots = match self.recurrent.as_mut() {
            Some(r) => {
                let items: Vec<(SeqId, usize)> = batch
                    .items
                    .iter()
                    .map(|item| (item.seq, self.seqs[&item.seq].tokens.len()))
                    .collect();
                match r.prepare(&items) {
                    Ok(slots) => slots,
                    Err(e) => {
                        for p in fresh {
                            self.pool.release(p);
                        }
                        return Err(e);
                    }
                }
            }
            None => Vec::new(),
        };
        let discard_output = plan.out_rows.is_empty();
        if discard_output {
            // The graph needs an output: compute the last row's logits and drop them.
            plan.out_rows.push(n_tokens as i32 - 1);
        }
        // Always fused when invariant: unfused attention's bits depend on the batch's window.
        let flash_attn = self.params.flash_attn || self.params.evaluation == Evaluation::Invariant;
        let model = &self.model;
        let kv = &mut self.kv;
        let state = self.recurrent.as_mut().map(|r| r.batch(&slots));
        let output = batch.output;
        let integer_sums = match self.params.evaluation {
            Evaluation::Invariant => IntegerSums::Everywhere,
            Evaluation::LlamaCpp => IntegerSums::Leading(n_tokens, 0),
            Evaluation::Fast => IntegerSums::Leading(n_tokens, plan.integer_sum_rows),
        };
        // ggml's bits under `LlamaCpp`; the row kernels are CPU code (offloaded layers keep
        // ggml's ops on their device).
        let row_kernels =
            self.params.evaluation != Evaluation::LlamaCpp && self.model.offload_device().is_none();
        let result = self.compute.run(|g| {
            g.allow_integer_sums(integer_sums);
            g.allow_row_kernels(row_kernels);
            arch::build(g, model, kv, state, &plan, flash_attn, output)
        });
        let logits = match result {
            Ok(logits) => logits,
            Err(e) => {
                for p in fresh {
                    self.pool.release(p);
                }
                if let Some(r) = self.recurrent.as_mut() {
                    r.abort(&slots);
                }
                return Err(e);
            }
        };
        if let Some(r) = self.recurrent.as_mut() {
            r.commit(batch.items.iter().map(|item| item.seq), &slots);
        }

        // Commit.
        for p in replaced {
            self.pool.release(p);
        }
        let n_vocab = crate::rank::row_width(&self.model, output);
        for ((item, table), rows) in batch.items.iter().zip(tables).zip(&plan.item_rows) {
            let fingerprint = self.fingerprint;
            let s = self.seqs.get_mut(&item.seq).expect("checked above");
            s.pages = table;
            s.tokens.extend_from_slice(&item.tokens);
            while s.ids.len() < s.tokens.len() / PAGE_TOKENS {
                let i = s.ids.len();
                let id = BlockId::chain(
                    &fingerprint,
                    s.prev_id(i),
                    &s.tokens[i * PAGE_TOKENS..(i + 1) * PAGE_TOKENS],
                );
                self.pool.index(s.pages[i], id);
                s.ids.push(id);
            }
            s.logits = if rows.is_empty() || discard_output || output != Output::Logits {
                None
            } else {
                Some(logits[(rows.end - 1) * n_vocab..rows.end * n_vocab].to_vec())
            };
        }
        self.keep_snapshots(batch);
        let logits = if discard_output { Vec::new() } else { logits };
        // Back within the RAM budget, with room for the next batch. A failure is not this
        // batch's (it was evaluated): the pages stay, and the next batch's room reports it.
        let _ = self.make_room(self.params.n_batch.div_ceil(PAGE_TOKENS));
        Ok(BatchOutput {
            n_vocab,
            output,
            logits,
            rows: plan.item_rows,
        })
    }

    /// Runs the graph of a context shift (`shift.rs`) over the pool.
    pub(crate) fn run_shift(&mut self, plan: &crate::shift::ShiftPlan) -> Result<()> {
        let model = &self.model;
        let kv = &mut self.kv;
        self.compute
            .run(|g| crate::shift::build(g, model, kv, plan))
            .map(drop)
    }

    /// Page tables for `batch`'s sequences after its tokens, the pages newly taken, and the
    /// shared pages replaced by private copies (released only at commit). A partly filled last
    /// page is copied when shared, and unindexed otherwise, before anything writes into it.
    #[allow(clippy::type_complexity)]
    fn prepare_tables(&mut self, batch: &Batch) -> Result<(Vec<Vec<u32>>, Vec<u32>, Vec<u32>)> {
        let mut tables = Vec::with_capacity(batch.items.len());
        let mut fresh = Vec::new();
        let mut replaced = Vec::new();
        for item in &batch.items {
            let s = &self.seqs[&item.seq];
            let len = s.tokens.len();
            let mut table = s.pages.clone();
            let take = |pool: &mut PagePool, fresh: &mut Vec<u32>| {
                let page = pool.alloc();
                fresh.extend(page);
                page
            };
            if !len.is_multiple_of(PAGE_TOKENS) {
                let last = table.len() - 1;
                let page = table[last];
                if self.pool.refs(page) > 1 {
                    let Some(copy) = take(&mut self.pool, &mut fresh) else {
                        break;
                    };
                    self.copy_page(page, copy, len % PAGE_TOKENS);
                    replaced.push(page);
                    table[last] = copy;
                } else {
                    self.pool.unindex(page);
                }
            }
            while table.len() < (len + item.tokens.len()).div_ceil(PAGE_TOKENS) {
                let Some(page) = take(&mut self.pool, &mut fresh) else {
                    break;
                };
                table.push(page);
            }
            tables.push(table);
        }
        let complete = tables.len() == batch.items.len()
            && batch.items.iter().zip(&tables).all(|(item, t)| {
                t.len()
                    == (self.seqs[&item.seq].tokens.len() + item.tokens.len()).div_ceil(PAGE_TOKENS)
            });
        if !complete {
            let free = self.pool.n_free();
            for p in fresh {
                self.pool.release(p);
            }
            return Err(Error::OutOfPages {
                needed: free + 1,
                free,
                total: self.pool.n_pages(),
            });
        }
        Ok((tables, fresh, replaced))
    }
}

/// The roots of `roots` that still matter for a sequence of `len` tokens: those of pages that
/// start before `len`. A page starting at or after `len` will be computed again after the pages
/// before it, which the shift that made its root kept as they were (their ids carry any earlier
/// root), so it chains from them.
fn roots_below(roots: &[ChainRoot], len: usize) -> Vec<ChainRoot> {
    roots
        .iter()
        .filter(|r| (r.block as usize) * PAGE_TOKENS < len)
        .copied()
        .collect()
}
