//! N-gram drafting: the tokens that followed an earlier occurrence of the context's last
//! tokens, found in the context itself ([`draft_from_context`]) or in earlier sequences of the
//! same prompt-cache namespace ([`TokenHistory`]). No model runs: a draft costs a scan of the
//! context, or one hash lookup and a few short comparisons.

use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};
use std::ops::Bound;
use std::sync::Arc;

use crate::Namespace;

/// How n-gram drafts match. A `min_match` of 0 counts as 1, and a `max_match` below
/// `min_match` as `min_match`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NgramParams {
    /// Shortest match of the context's last tokens that may propose a draft.
    pub min_match: usize,
    /// Longest match looked for (a longer match is preferred; ties go to the most recent
    /// occurrence).
    pub max_match: usize,
}

impl Default for NgramParams {
    /// `min_match` 3, `max_match` 12.
    fn default() -> NgramParams {
        NgramParams {
            min_match: 3,
            max_match: 12,
        }
    }
}

impl NgramParams {
    /// The match lengths as used: `(min, max)` with `1 <= min <= max`.
    fn bounds(&self) -> (usize, usize) {
        let min = self.min_match.max(1);
        (min, self.max_match.max(min))
    }
}

/// A draft and how it was found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Draft {
    /// The proposed next tokens (empty: no draft).
    pub tokens: Vec<u32>,
    /// Tokens of the context matched (0: no draft).
    pub matched: usize,
}

/// How many of `a`'s last tokens equal `b`'s last tokens, at most `limit`.
#[inline]
fn common_suffix(a: &[u32], b: &[u32], limit: usize) -> usize {
    a.iter()
        .rev()
        .zip(b.iter().rev())
        .take(limit)
        .take_while(|(x, y)| x == y)
        .count()
}

/// Draft from `context` itself: find the longest suffix of `context` of length in
/// [min_match, max_match] that also occurs earlier in `context` (an occurrence that ends
/// before the context's end), take the most recent such occurrence among the longest, and
/// return up to `n_max` tokens that followed it (they may run into the suffix itself; never
/// past the end of context). Empty draft when nothing matches or n_max == 0.
///
/// One backward scan of the context, allocating only the result.
pub fn draft_from_context(context: &[u32], params: &NgramParams, n_max: usize) -> Draft {
    let (min, max) = params.bounds();
    let len = context.len();
    // An occurrence ends at `end` (exclusive) with `min <= end < len`.
    if n_max == 0 || len <= min {
        return Draft::default();
    }
    let last = context[len - 1];
    let (mut matched, mut at) = (0, 0);
    let mut end = len - 1;
    // An occurrence ending at `end` matches at most `end` tokens: below `matched + 1` none
    // can win, and ties keep the later one found first. To win, one must also match the
    // token where the best so far stopped: that is checked first.
    while end >= min.max(matched + 1) {
        if context[end - 1] == last && context[end - 1 - matched] == context[len - 1 - matched] {
            let n = common_suffix(&context[..end], context, max);
            if n >= min && n > matched {
                (matched, at) = (n, end);
                if n == max {
                    break;
                }
            }
        }
        end -= 1;
    }
    if matched == 0 {
        return Draft::default();
    }
    Draft {
        tokens: context[at..len.min(at + n_max)].to_vec(),
        matched,
    }
}

/// FxHash-style hasher (add, multiply, rotate at the end): fast and deterministic, for keys
/// that are token ids or already hashes.
#[derive(Clone, Copy, Default)]
struct FxHasher {
    hash: u64,
}

const FX_SEED: u64 = 0xf135_7aea_2e62_a9c5;

impl FxHasher {
    #[inline]
    fn add(&mut self, x: u64) {
        self.hash = self.hash.wrapping_add(x).wrapping_mul(FX_SEED);
    }
}

impl Hasher for FxHasher {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut b = [0u8; 8];
            b[..chunk.len()].copy_from_slice(chunk);
            self.add(u64::from_le_bytes(b));
        }
    }
    fn write_u8(&mut self, x: u8) {
        self.add(u64::from(x));
    }
    fn write_u32(&mut self, x: u32) {
        self.add(u64::from(x));
    }
    fn write_u64(&mut self, x: u64) {
        self.add(x);
    }
    fn write_usize(&mut self, x: usize) {
        self.add(x as u64);
    }
    fn finish(&self) -> u64 {
        // The product's high bits depend on every input bit; the table indexes by low bits.
        self.hash.rotate_left(26)
    }
}

type FxMap<K, V> = HashMap<K, V, BuildHasherDefault<FxHasher>>;

/// The index key of a window of tokens: 32 bits of a hash of them (a collision only shares a
/// bucket; every candidate's tokens are compared).
#[inline]
fn window_key(window: &[u32]) -> u32 {
    let mut h = FxHasher::default();
    for &t in window {
        h.add(u64::from(t));
    }
    (h.hash >> 32) as u32
}

/// End of a bucket's list.
const NIL: u32 = u32::MAX;
/// Occurrences kept per key per namespace (the most recent).
const PER_KEY: usize = 8;

/// One occurrence of a key: the window `tokens[end - min_match..end]` of sequence `seq`
/// (`end` < its length: a token follows), and the next (older) occurrence of its bucket.
#[derive(Clone, Copy, Debug)]
struct Occ {
    seq: u32,
    end: u32,
    next: u32,
}

/// Occurrences of all namespaces in one vector, freed slots chained for reuse: it never
/// holds more than the most live occurrences ever held at once (at most `max_tokens`).
#[derive(Default)]
struct Arena {
    occs: Vec<Occ>,
    free: Vec<u32>,
}

impl Arena {
    fn alloc(&mut self, occ: Occ) -> u32 {
        match self.free.pop() {
            Some(i) => {
                self.occs[i as usize] = occ;
                i
            }
            None => {
                self.occs.push(occ);
                (self.occs.len() - 1) as u32
            }
        }
    }
}

/// A recorded sequence.
struct Seq {
    ns: Option<Namespace>,
    tokens: Arc<[u32]>,
    /// Its place in recording order (the key in `TokenHistory::order`).
    order: u64,
}

/// One namespace's sequences and index.
#[derive(Default)]
struct Space {
    /// Sequences by their tokens (lexicographic), for the prefix checks of `record`; no key
    /// is a prefix of another.
    by_tokens: BTreeMap<Arc<[u32]>, u32>,
    /// Window key to its most recent occurrence (the head of a list in the arena, newest
    /// first: later recorded, then later in the sequence).
    heads: FxMap<u32, u32>,
}

/// Earlier sequences' tokens by namespace, indexed for drafting; bounded in memory.
///
/// Memory, per token held: 4 bytes for the token, 12 for its occurrence in the index (none
/// for a sequence's first `min_match` tokens, nor where a key's cap of 8 dropped it) and, at
/// most one per token, a hash-table entry of 9 bytes at a load between 7/16 and 7/8: 26 to
/// 37 bytes (measured: 35.5 with 2M tokens of distinct text), plus a few dozen bytes per
/// sequence. The occurrence vector keeps its largest size, at most `max_tokens` entries.
/// Namespaces never share an index: a draft under one namespace only ever comes from
/// sequences recorded under it.
pub struct TokenHistory {
    min: usize,
    max: usize,
    max_tokens: usize,
    per_key: usize,
    /// Sequences by slot (an occurrence's `seq`); `None`: a free slot, listed in `free_seqs`.
    seqs: Vec<Option<Seq>>,
    free_seqs: Vec<u32>,
    /// Recording order to slot: the first is the least recently recorded.
    order: BTreeMap<u64, u32>,
    next_order: u64,
    spaces: FxMap<Option<Namespace>, Space>,
    arena: Arena,
    n_tokens: usize,
}

impl std::fmt::Debug for TokenHistory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenHistory")
            .field("max_tokens", &self.max_tokens)
            .field("tokens", &self.n_tokens)
            .field("sequences", &self.order.len())
            .field("namespaces", &self.spaces.len())
            .finish()
    }
}

impl TokenHistory {
    /// An empty history holding at most `max_tokens` tokens in all (older sequences are
    /// forgotten first). min_match (the index's key length) comes from params.
    pub fn new(max_tokens: usize, params: NgramParams) -> TokenHistory {
        let (min, max) = params.bounds();
        TokenHistory {
            min,
            max,
            max_tokens: max_tokens.min(u32::MAX as usize - 1),
            per_key: PER_KEY,
            seqs: Vec::new(),
            free_seqs: Vec::new(),
            order: BTreeMap::new(),
            next_order: 0,
            spaces: FxMap::default(),
            arena: Arena::default(),
            n_tokens: 0,
        }
    }

    /// Records a finished sequence's tokens under `ns`. A sequence that extends an earlier
    /// recorded one of the same namespace (the earlier is a prefix of it: a conversation's
    /// next turn) replaces it; one that is a prefix of (or equal to) one already recorded adds
    /// nothing. Sequences shorter than min_match+1 are ignored. Over the budget, the least
    /// recently recorded sequences go first; one longer than the whole budget is held as its
    /// last `max_tokens` tokens.
    pub fn record(&mut self, ns: Option<Namespace>, tokens: &[u32]) {
        if tokens.len() < self.min + 1 {
            return;
        }
        if let Some(space) = self.spaces.get(&ns) {
            // A sequence starting with `tokens` sorts first among those not below it.
            let above = (Bound::Included(tokens), Bound::Unbounded);
            if let Some((k, _)) = space.by_tokens.range::<[u32], _>(above).next() {
                if k.starts_with(tokens) {
                    return;
                }
            }
        }
        // A recorded prefix of `tokens` sorts last below it (anything between would start
        // with it, and no recorded sequence is a prefix of another).
        while let Some(slot) = self.spaces.get(&ns).and_then(|space| {
            let below = (Bound::Unbounded, Bound::Excluded(tokens));
            let (k, &slot) = space.by_tokens.range::<[u32], _>(below).next_back()?;
            tokens.starts_with(k).then_some(slot)
        }) {
            self.remove(slot);
        }
        let tokens = &tokens[tokens.len().saturating_sub(self.max_tokens)..];
        if tokens.len() < self.min + 1 {
            return;
        }
        while self.n_tokens + tokens.len() > self.max_tokens {
            match self.order.first_key_value() {
                Some((_, &slot)) => self.remove(slot),
                None => break,
            }
        }
        self.insert(ns, tokens);
    }

    /// A draft for `context` from sequences recorded under `ns` only: the longest match (as
    /// in draft_from_context, up to max_match, at least min_match) of the context's last
    /// tokens in any recorded sequence of ns, most recently recorded first on ties, and up to
    /// n_max tokens that followed it there (a match must have at least one following token).
    ///
    /// Only the 8 most recent occurrences of the context's last min_match tokens in `ns` are
    /// candidates.
    pub fn draft(&self, ns: Option<Namespace>, context: &[u32], n_max: usize) -> Draft {
        let len = context.len();
        if n_max == 0 || len < self.min {
            return Draft::default();
        }
        let Some(space) = self.spaces.get(&ns) else {
            return Draft::default();
        };
        let Some(&head) = space.heads.get(&window_key(&context[len - self.min..])) else {
            return Draft::default();
        };
        let (mut matched, mut found) = (0, None);
        let mut i = head;
        while i != NIL {
            let occ = self.arena.occs[i as usize];
            i = occ.next;
            let Some(seq) = &self.seqs[occ.seq as usize] else {
                continue;
            };
            let end = occ.end as usize;
            let n = common_suffix(&seq.tokens[..end], context, self.max);
            if n >= self.min && n > matched {
                (matched, found) = (n, Some((&seq.tokens, end)));
                if n == self.max {
                    break;
                }
            }
        }
        match found {
            Some((tokens, end)) => Draft {
                tokens: tokens[end..tokens.len().min(end + n_max)].to_vec(),
                matched,
            },
            None => Draft::default(),
        }
    }

    /// Tokens held.
    pub fn len_tokens(&self) -> usize {
        self.n_tokens
    }

    /// Sequences held.
    pub fn len_sequences(&self) -> usize {
        self.order.len()
    }

    /// Holds `tokens` (within the budget, a prefix of no recorded one) as the most recently
    /// recorded sequence of `ns`, and indexes its windows.
    fn insert(&mut self, ns: Option<Namespace>, tokens: &[u32]) {
        let tokens: Arc<[u32]> = Arc::from(tokens);
        let order = self.next_order;
        self.next_order += 1;
        let seq = Seq {
            ns,
            tokens: Arc::clone(&tokens),
            order,
        };
        let slot = match self.free_seqs.pop() {
            Some(slot) => {
                self.seqs[slot as usize] = Some(seq);
                slot
            }
            None => {
                self.seqs.push(Some(seq));
                (self.seqs.len() - 1) as u32
            }
        };
        self.order.insert(order, slot);
        self.n_tokens += tokens.len();
        let space = self.spaces.entry(ns).or_default();
        space.by_tokens.insert(Arc::clone(&tokens), slot);
        for end in self.min..tokens.len() {
            let key = window_key(&tokens[end - self.min..end]);
            let head = space.heads.entry(key).or_insert(NIL);
            let new = self.arena.alloc(Occ {
                seq: slot,
                end: end as u32,
                next: *head,
            });
            *head = new;
            // Keep the newest `per_key`: cut the list after the last of them.
            let mut last = new;
            for _ in 1..self.per_key {
                match self.arena.occs[last as usize].next {
                    NIL => break,
                    next => last = next,
                }
            }
            let mut cut = std::mem::replace(&mut self.arena.occs[last as usize].next, NIL);
            while cut != NIL {
                self.arena.free.push(cut);
                cut = self.arena.occs[cut as usize].next;
            }
        }
    }

    /// Forgets the sequence in `slot` and its index entries.
    fn remove(&mut self, slot: u32) {
        let Some(seq) = self.seqs[slot as usize].take() else {
            return;
        };
        self.free_seqs.push(slot);
        self.order.remove(&seq.order);
        self.n_tokens -= seq.tokens.len();
        let Some(space) = self.spaces.get_mut(&seq.ns) else {
            return;
        };
        space.by_tokens.remove(&*seq.tokens);
        let occs = &mut self.arena.occs;
        for end in self.min..seq.tokens.len() {
            let key = window_key(&seq.tokens[end - self.min..end]);
            let Some(head) = space.heads.get_mut(&key) else {
                continue;
            };
            // Unlink this sequence's occurrence at `end` (absent if the cap dropped it).
            let (mut prev, mut i) = (NIL, *head);
            while i != NIL {
                let occ = occs[i as usize];
                if occ.seq == slot && occ.end as usize == end {
                    if prev == NIL {
                        *head = occ.next;
                    } else {
                        occs[prev as usize].next = occ.next;
                    }
                    self.arena.free.push(i);
                    break;
                }
                (prev, i) = (i, occ.next);
            }
            if *head == NIL {
                space.heads.remove(&key);
            }
        }
        if space.by_tokens.is_empty() {
            self.spaces.remove(&seq.ns);
        } else if space.heads.capacity() > 4 * space.heads.len().max(256) {
            // A namespace that shrank gives its table's memory back.
            space.heads.shrink_to(2 * space.heads.len());
        }
    }
}

#[cfg(test)]
mod tests;
