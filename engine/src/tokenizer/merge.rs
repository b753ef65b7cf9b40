//! The one merge loop both tokenizer models share.
//!
//! A word starts as one symbol per character, kept in a doubly linked list over a vector. Every
//! adjacent pair that the model can merge goes into a max-heap by priority (BPE: lowest merge
//! rank; SentencePiece: highest token score), ties broken leftmost first. The best pair is merged
//! (the right symbol folds into the left), its new neighbours become candidates, and stale heap
//! entries (a side already merged away or grown) are skipped when popped. This is llama.cpp's
//! `llm_tokenizer_bpe_session` / `llm_tokenizer_spm_session` loop; both are O(n log n) in the
//! number of characters.

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;

/// What a tokenizer model decides about pairs of adjacent symbols.
pub(super) trait MergeRule {
    /// How good a merge is: the heap pops the greatest first.
    type Priority: Ord;
    /// What the rule remembers about a symbol (e.g. an interned id), computed once per symbol.
    type Tag: Copy;

    /// The tag of the symbol whose text is `text`.
    fn tag(&self, text: &str) -> Self::Tag;

    /// The priority of merging `left` and `right` (tags of adjacent symbols whose concatenation
    /// is `joined`), or `None` if they do not merge.
    fn priority(&self, left: Self::Tag, right: Self::Tag, joined: &str) -> Option<Self::Priority>;
}

/// A run of bytes of the word, linked to its neighbours.
#[derive(Clone, Copy, Debug)]
struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

/// A candidate merge of symbol `left` with its right neighbour `right`, `size` bytes in all.
struct Candidate<P> {
    priority: P,
    left: usize,
    right: usize,
    size: usize,
}

impl<P: Ord> Candidate<P> {
    fn key(&self) -> (&P, Reverse<usize>) {
        (&self.priority, Reverse(self.left))
    }
}

impl<P: Ord> PartialEq for Candidate<P> {
    fn eq(&self, other: &Self) -> bool {
        self.key() == other.key()
    }
}
impl<P: Ord> Eq for Candidate<P> {}
impl<P: Ord> PartialOrd for Candidate<P> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl<P: Ord> Ord for Candidate<P> {
    fn cmp(&self, other: &Self) -> Ordering {
        self.key().cmp(&other.key())
    }
}

/// Reusable buffers for [`merge_word`], so a long text does not allocate per word.
pub(super) struct Merger<R: MergeRule> {
    syms: Vec<Symbol>,
    tags: Vec<R::Tag>,
    heap: BinaryHeap<Candidate<R::Priority>>,
}

impl<R: MergeRule> Default for Merger<R> {
    fn default() -> Self {
        Merger {
            syms: Vec::new(),
            tags: Vec::new(),
            heap: BinaryHeap::new(),
        }
    }
}

impl<R: MergeRule> Merger<R> {
    /// Merges `word` by `rule`; calls `emit` with each final symbol's text, left to right.
    pub(super) fn merge_word<E>(
        &mut self,
        rule: &R,
        word: &str,
        mut emit: impl FnMut(&str) -> Result<(), E>,
    ) -> Result<(), E> {
        let syms = &mut self.syms;
        let tags = &mut self.tags;
        let heap = &mut self.heap;
        syms.clear();
        tags.clear();
        heap.clear();
        let n = word.chars().count();
        syms.extend(
            word.char_indices()
                .enumerate()
                .map(|(i, (start, c))| Symbol {
                    start,
                    len: c.len_utf8(),
                    prev: i.checked_sub(1),
                    next: (i + 1 < n).then_some(i + 1),
                }),
        );
        tags.extend(
            syms.iter()
                .map(|s| rule.tag(&word[s.start..s.start + s.len])),
        );

        let push = |heap: &mut BinaryHeap<_>, syms: &[Symbol], tags: &[R::Tag], l, r| {
            let (Some(l), Some(r)) = (l, r) else { return };
            let (ls, rs): (&Symbol, &Symbol) = (&syms[l], &syms[r]);
            let size = ls.len + rs.len;
            let joined = &word[ls.start..ls.start + size];
            if let Some(priority) = rule.priority(tags[l], tags[r], joined) {
                heap.push(Candidate {
                    priority,
                    left: l,
                    right: r,
                    size,
                });
            }
        };
        for i in 1..syms.len() {
            push(heap, syms, tags, Some(i - 1), Some(i));
        }
        while let Some(c) = heap.pop() {
            let (l, r) = (c.left, c.right);
            if syms[l].len == 0 || syms[r].len == 0 || syms[l].len + syms[r].len != c.size {
                continue;
            }
            // Fold `r` into `l`.
            syms[l].len += syms[r].len;
            syms[r].len = 0;
            let next = syms[r].next;
            syms[l].next = next;
            if let Some(next) = next {
                syms[next].prev = Some(l);
            }
            let s = syms[l];
            tags[l] = rule.tag(&word[s.start..s.start + s.len]);
            push(heap, syms, tags, s.prev, Some(l));
            push(heap, syms, tags, Some(l), s.next);
        }
        let mut at = if syms.is_empty() { None } else { Some(0) };
        while let Some(i) = at {
            let s = syms[i];
            emit(&word[s.start..s.start + s.len])?;
            at = s.next;
        }
        Ok(())
    }
}

/// An `f32` score ordered by `total_cmp`, for SentencePiece priorities.
#[derive(Clone, Copy, Debug)]
pub(super) struct Score(pub f32);

impl PartialEq for Score {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Score {}
impl PartialOrd for Score {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Score {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.total_cmp(&other.0)
    }
}
