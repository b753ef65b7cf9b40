//! The per-sequence state of a hybrid model's recurrent layers: gated delta-nets (qwen35),
//! gated short convolutions (lfm2) or Mamba-2 layers (nemotron_h, granitehybrid), described
//! alike by [`StateShape`].
//!
//! The attention layers keep their K and V in the page pool; the recurrent layers keep, per
//! live sequence, one slot in [`StateTensors`]: per recurrent layer a convolution state (its
//! last `kernel - 1` inputs) and, for delta-nets and Mamba-2, a matrix state (a square matrix
//! per value head; `d_state` values per inner channel), all f32. A slot summarises every position of its sequence, so:
//!
//! - a sequence's first batch (position 0) starts from a zeroed slot;
//! - a batch reads each sequence's slot and writes the state after its tokens into a fresh
//!   slot, which the sequence takes only when the graph succeeded (its old slot is then freed):
//!   a failed batch leaves every state as it was;
//! - removing a sequence, or clearing it to no tokens, frees its slot; cutting it back to a
//!   shorter, non-empty prefix is refused ([`Error::Recurrent`]) except at a snapshot (below),
//!   as is anything that would need the state of a prefix (a fork shorter than its source
//!   elsewhere, a context shift, KV imported without a state); a fork of the whole sequence
//!   copies the slot.
//!
//! [`Recurrent::read`] and [`Recurrent::write`] give a sequence's state as bytes (each
//! recurrent layer's convolution state, then its delta-net state if it has one, in layer
//! order), for a checkpoint to keep beside the KV.
//!
//! Snapshots: a sequence that ends a batch on a page boundary keeps its state there, and can
//! later be cut back or forked at that boundary (the one exception to "never a shorter
//! prefix"). It keeps two at most: the newest taken after a batch item of several tokens (the
//! end of a prompt, or of a chunk of one) and the newest of all (during generation, the last
//! boundary its reply crossed). A conversation's next turn then resumes at the end of its
//! reply, and a regenerated or re-tokenized reply at the end of its prompt, computing at most
//! one page more than its new tokens.

use std::collections::BTreeMap;

use crate::context::SeqId;
use crate::error::{Error, Result};
use crate::ggml::{StateTensors, StateTensorsMut};
use crate::model::{HParams, StateShape};

/// Slots allocated first; the tensors double when they run out.
const FIRST_SLOTS: usize = 4;

/// The recurrent layers' state of every live sequence of a context.
pub(crate) struct Recurrent {
    /// Per layer: its index among the recurrent layers, if it is one.
    index: Vec<Option<usize>>,
    n_recurrent: usize,
    conv_len: usize,
    ssm_len: usize,
    tensors: StateTensors,
    /// Free slots.
    free: Vec<usize>,
    /// The slot of each sequence that has one (every sequence holding tokens).
    slots: BTreeMap<SeqId, usize>,
    /// Per sequence, its states at page boundaries (see the module's docs), oldest first.
    snapshots: BTreeMap<SeqId, Vec<Snapshot>>,
}

/// A sequence's state after its first `len` tokens, `len` a page boundary.
#[derive(Clone, Debug)]
pub(crate) struct Snapshot {
    /// Tokens it follows.
    pub len: usize,
    /// The state bytes ([`Recurrent::read`]).
    pub state: Vec<u8>,
    /// Taken after a batch item of several tokens (a prompt's).
    prompt: bool,
}

/// Where one batch item's state comes from and goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SlotPair {
    /// The slot read (the item's own, or a zeroed one at position 0).
    pub src: usize,
    /// The slot written.
    pub dst: usize,
}

/// What a graph needs of the state: the tensors, borrowed mutably, and per batch item its
/// slots.
#[derive(Clone, Copy)]
pub(crate) struct StateBatch<'a> {
    pub tensors: StateTensorsMut<'a>,
    pub slots: &'a [SlotPair],
    /// Per layer: its index among the recurrent layers.
    pub index: &'a [Option<usize>],
}

impl Recurrent {
    /// The state of a model with recurrent layers; `None` for one without.
    pub(crate) fn new(hp: &HParams) -> Result<Option<Recurrent>> {
        let Some(StateShape {
            layers,
            conv_len,
            ssm_len,
        }) = hp.state_shape()
        else {
            return Ok(None);
        };
        let mut n_recurrent = 0;
        let index = layers
            .iter()
            .map(|&r| {
                r.then(|| {
                    n_recurrent += 1;
                    n_recurrent - 1
                })
            })
            .collect();
        Ok(Some(Recurrent {
            index,
            n_recurrent,
            conv_len,
            ssm_len,
            tensors: StateTensors::new(n_recurrent, conv_len, ssm_len, FIRST_SLOTS)?,
            free: (0..FIRST_SLOTS).rev().collect(),
            slots: BTreeMap::new(),
            snapshots: BTreeMap::new(),
        }))
    }

    /// Bytes of one sequence's state ([`Recurrent::read`]).
    pub(crate) fn state_bytes(&self) -> usize {
        self.n_recurrent * 4 * (self.conv_len + self.ssm_len)
    }

    /// The parts of each layer's state: the convolution's, then the matrix state's when
    /// there is one (`true`).
    fn parts(&self) -> &'static [bool] {
        match self.ssm_len {
            0 => &[false],
            _ => &[false, true],
        }
    }

    /// A free slot (the lowest), the tensors doubled when none is left; zeroed.
    fn alloc(&mut self) -> Result<usize> {
        if self.free.is_empty() {
            let old = self.tensors.n_slots();
            let mut grown =
                StateTensors::new(self.n_recurrent, self.conv_len, self.ssm_len, 2 * old)?;
            for r in 0..self.n_recurrent {
                for &ssm in self.parts() {
                    let mut row = vec![0u8; self.tensors.row_bytes(r, ssm)];
                    for slot in 0..old {
                        self.tensors.read(r, ssm, slot, &mut row);
                        grown.write(r, ssm, slot, &row);
                    }
                }
            }
            self.tensors = grown;
            self.free.extend((old..2 * old).rev());
        }
        let slot = self.free.pop().expect("a free slot after growing");
        for r in 0..self.n_recurrent {
            for &ssm in self.parts() {
                let zeros = vec![0u8; self.tensors.row_bytes(r, ssm)];
                self.tensors.write(r, ssm, slot, &zeros);
            }
        }
        Ok(slot)
    }

    fn release(&mut self, slot: usize) {
        self.free.push(slot);
        // Lowest first.
        self.free.sort_unstable_by(|a, b| b.cmp(a));
    }

    /// The slots of a batch whose items are `(sequence, tokens it holds before the batch)`:
    /// at position 0 a zeroed slot read and written, else the sequence's slot read and a fresh
    /// one written. A sequence with tokens but no state (KV imported alone) is refused.
    pub(crate) fn prepare(&mut self, items: &[(SeqId, usize)]) -> Result<Vec<SlotPair>> {
        let mut pairs: Vec<SlotPair> = Vec::with_capacity(items.len());
        for &(seq, start) in items {
            let src = match (start, self.slots.get(&seq)) {
                (0, _) => None,
                (_, Some(&slot)) => Some(slot),
                (_, None) => {
                    self.abort(&pairs);
                    return Err(Error::Recurrent {
                        what: format!("{seq} holds {start} tokens without their state"),
                    });
                }
            };
            let dst = match self.alloc() {
                Ok(slot) => slot,
                Err(e) => {
                    self.abort(&pairs);
                    return Err(e);
                }
            };
            pairs.push(SlotPair {
                src: src.unwrap_or(dst),
                dst,
            });
        }
        Ok(pairs)
    }

    /// Undoes [`Recurrent::prepare`] after a failed batch.
    pub(crate) fn abort(&mut self, pairs: &[SlotPair]) {
        for p in pairs {
            self.release(p.dst);
        }
    }

    /// After a batch that succeeded: each sequence takes the slot written for it.
    pub(crate) fn commit(&mut self, seqs: impl IntoIterator<Item = SeqId>, pairs: &[SlotPair]) {
        for (seq, p) in seqs.into_iter().zip(pairs) {
            if let Some(old) = self.slots.insert(seq, p.dst) {
                self.release(old);
            }
        }
    }

    /// Forgets `seq`'s state (removed, or cleared to no tokens).
    pub(crate) fn remove(&mut self, seq: SeqId) {
        self.snapshots.remove(&seq);
        if let Some(slot) = self.slots.remove(&seq) {
            self.release(slot);
        }
    }

    /// Keeps `seq`'s present state as its snapshot after `len` tokens (a page boundary), which
    /// a batch item of `n_new` tokens reached: the newest of all, and when `n_new > 1` the
    /// newest of a prompt's too (see the module's docs).
    pub(crate) fn snapshot(&mut self, seq: SeqId, len: usize, n_new: usize) {
        let Some(state) = self.read(seq) else {
            return;
        };
        let prompt = n_new > 1;
        let kept = self.snapshots.entry(seq).or_default();
        kept.retain(|s| s.len < len && s.prompt && !prompt);
        kept.push(Snapshot { len, state, prompt });
    }

    /// `seq`'s snapshots, oldest first.
    pub(crate) fn snapshots(&self, seq: SeqId) -> &[Snapshot] {
        self.snapshots.get(&seq).map_or(&[], Vec::as_slice)
    }

    /// Cuts `seq` back to its snapshot after `len` tokens: its state becomes that one, and the
    /// later snapshots go. [`Error::Recurrent`], changing nothing, when it has none there.
    pub(crate) fn rewind(&mut self, seq: SeqId, len: usize) -> Result<()> {
        let state = self
            .snapshots(seq)
            .iter()
            .find(|s| s.len == len)
            .map(|s| s.state.clone())
            .ok_or_else(|| Error::Recurrent {
                what: format!("cutting {seq} back to {len} tokens, where it kept no state"),
            })?;
        self.write(seq, &state)?;
        if let Some(kept) = self.snapshots.get_mut(&seq) {
            kept.retain(|s| s.len <= len);
        }
        Ok(())
    }

    /// `seq`'s state as bytes (see the module's docs); `None` when it has none (no tokens).
    pub(crate) fn read(&self, seq: SeqId) -> Option<Vec<u8>> {
        let slot = *self.slots.get(&seq)?;
        let mut out = Vec::with_capacity(self.state_bytes());
        for r in 0..self.n_recurrent {
            for &ssm in self.parts() {
                let mut row = vec![0u8; self.tensors.row_bytes(r, ssm)];
                self.tensors.read(r, ssm, slot, &mut row);
                out.extend_from_slice(&row);
            }
        }
        Some(out)
    }

    /// Sets `seq`'s state from `bytes` (as [`Recurrent::read`] gives them), taking a slot if
    /// it has none. Wrong sizes are [`Error::Recurrent`], changing nothing.
    pub(crate) fn write(&mut self, seq: SeqId, bytes: &[u8]) -> Result<()> {
        if bytes.len() != self.state_bytes() {
            return Err(Error::Recurrent {
                what: format!(
                    "a state of {} bytes for {seq}, which takes {}",
                    bytes.len(),
                    self.state_bytes()
                ),
            });
        }
        let slot = match self.slots.get(&seq) {
            Some(&slot) => slot,
            None => {
                let slot = self.alloc()?;
                self.slots.insert(seq, slot);
                slot
            }
        };
        let mut at = 0;
        for r in 0..self.n_recurrent {
            for &ssm in self.parts() {
                let n = self.tensors.row_bytes(r, ssm);
                self.tensors.write(r, ssm, slot, &bytes[at..at + n]);
                at += n;
            }
        }
        Ok(())
    }

    /// The tensors and a batch's slots, for its graph.
    pub(crate) fn batch<'a>(&'a mut self, slots: &'a [SlotPair]) -> StateBatch<'a> {
        StateBatch {
            tensors: self.tensors.tensors_mut(),
            slots,
            index: &self.index,
        }
    }
}

impl crate::context::Context {
    /// After a batch: each hybrid sequence that ends it on a page boundary keeps its state
    /// there (a save stores it as that block's snapshot, where an edited prompt can resume).
    pub(crate) fn keep_snapshots(&mut self, batch: &crate::Batch) {
        if let Some(r) = self.recurrent.as_mut() {
            for item in &batch.items {
                let len = self.seqs[&item.seq].tokens.len();
                if len.is_multiple_of(crate::kv::PAGE_TOKENS) {
                    r.snapshot(item.seq, len, item.tokens.len());
                }
            }
        }
    }

    /// A hybrid sequence's states kept at page boundaries (tokens, state bytes), oldest
    /// first, those it still holds the tokens of (see `recurrent.rs`).
    pub(crate) fn boundary_states(&self, seq: SeqId) -> Vec<(usize, Vec<u8>)> {
        let (Some(s), Some(r)) = (self.seqs.get(&seq), self.recurrent.as_ref()) else {
            return Vec::new();
        };
        r.snapshots(seq)
            .iter()
            .filter(|k| k.len > 0 && k.len <= s.tokens.len())
            .map(|k| (k.len, k.state.clone()))
            .collect()
    }

    /// The lengths, at most `len`, at which hybrid `seq` kept its state: where it can be cut
    /// back or forked (its whole length aside). Empty for a model without recurrent layers.
    pub(crate) fn snapshot_lens(&self, seq: SeqId) -> Vec<usize> {
        self.recurrent
            .as_ref()
            .map(|r| r.snapshots(seq).iter().map(|k| k.len).collect())
            .unwrap_or_default()
    }

    /// Whether the model has recurrent layers (a hybrid, such as Qwen3.5): its sequences carry
    /// a state beside their KV, saved in checkpoints with it, and cannot be cut back or resumed
    /// from KV blocks alone.
    pub fn is_hybrid(&self) -> bool {
        self.recurrent.is_some()
    }

    /// `seq`'s recurrent state as bytes (see `recurrent.rs`): `None` for a model without
    /// recurrent layers, or a sequence holding no tokens.
    pub(crate) fn recurrent_state(&self, seq: SeqId) -> Result<Option<Vec<u8>>> {
        self.seq(seq)?;
        Ok(self.recurrent.as_ref().and_then(|r| r.read(seq)))
    }

    /// Sets the recurrent state of `seq`, which holds tokens, from bytes that
    /// [`Context::recurrent_state`] gave for the same tokens. [`Error::Recurrent`] for a model
    /// without recurrent layers, an empty sequence or bytes of the wrong size.
    pub(crate) fn set_recurrent_state(&mut self, seq: SeqId, bytes: &[u8]) -> Result<()> {
        if self.seq(seq)?.tokens.is_empty() {
            return Err(Error::Recurrent {
                what: format!("a state for {seq}, which holds no tokens"),
            });
        }
        match self.recurrent.as_mut() {
            Some(r) => r.write(seq, bytes),
            None => Err(Error::Recurrent {
                what: "a recurrent state for a model without recurrent layers".into(),
            }),
        }
    }
}
