//! Tests of n-gram drafts and the token history.
use super::*;

fn p(min_match: usize, max_match: usize) -> NgramParams {
    NgramParams {
        min_match,
        max_match,
    }
}

fn ns(name: &str) -> Option<Namespace> {
    Some(Namespace::new(&[name.as_bytes()]))
}

/// A tiny seeded LCG (Knuth's MMIX constants), high bits out.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        self.0 >> 33
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn tokens(&mut self, len: usize, vocab: usize) -> Vec<u32> {
        (0..len).map(|_| self.below(vocab) as u32).collect()
    }
    /// Fewer than `below` tokens (a random count).
    fn some_tokens(&mut self, below: usize, vocab: usize) -> Vec<u32> {
        let len = self.below(below);
        self.tokens(len, vocab)
    }
}

impl TokenHistory {
    /// The index's structure: every listed occurrence is a live sequence's window of
    /// its own namespace under its own key, lists are newest first and capped, and every
    /// arena slot is either listed once or free.
    fn check_invariants(&self) {
        let mut seen = vec![false; self.arena.occs.len()];
        let mut n_seqs = 0;
        for (ns, space) in &self.spaces {
            assert!(!space.by_tokens.is_empty());
            n_seqs += space.by_tokens.len();
            for (&key, &head) in &space.heads {
                let (mut i, mut n, mut prev) = (head, 0, None);
                assert_ne!(head, NIL);
                while i != NIL {
                    assert!(!seen[i as usize], "occurrence listed twice");
                    seen[i as usize] = true;
                    let occ = self.arena.occs[i as usize];
                    let seq = self.seqs[occ.seq as usize].as_ref().expect("live");
                    assert_eq!(seq.ns, *ns);
                    let end = occ.end as usize;
                    assert!(end >= self.min && end < seq.tokens.len());
                    assert_eq!(window_key(&seq.tokens[end - self.min..end]), key);
                    let rank = (seq.order, end);
                    if let Some(prev) = prev {
                        assert!(rank < prev, "list not newest first");
                    }
                    prev = Some(rank);
                    n += 1;
                    i = occ.next;
                }
                assert!(n <= self.per_key);
            }
        }
        assert_eq!(n_seqs, self.order.len());
        for &f in &self.arena.free {
            assert!(!seen[f as usize], "a free slot is listed");
            seen[f as usize] = true;
        }
        assert!(seen.iter().all(|&s| s), "an arena slot leaked");
        let held: usize = self.seqs.iter().flatten().map(|s| s.tokens.len()).sum();
        assert_eq!(held, self.n_tokens);
        assert!(self.arena.occs.len() <= self.max_tokens);
    }

    /// Bytes held on the heap, about (hash tables at their bucket counts).
    fn heap_bytes(&self) -> usize {
        let table = |cap: usize, entry: usize| {
            if cap == 0 {
                0
            } else {
                (cap * 8 / 7).next_power_of_two() * (entry + 1)
            }
        };
        let tokens: usize = self
            .seqs
            .iter()
            .flatten()
            .map(|s| 16 + 4 * s.tokens.len())
            .sum();
        let spaces: usize = self
            .spaces
            .values()
            .map(|s| table(s.heads.capacity(), 8) + s.by_tokens.len() * 40)
            .sum();
        tokens
            + spaces
            + table(self.spaces.capacity(), 33 + std::mem::size_of::<Space>())
            + self.arena.occs.capacity() * std::mem::size_of::<Occ>()
            + self.arena.free.capacity() * 4
            + self.seqs.capacity() * std::mem::size_of::<Option<Seq>>()
            + self.order.len() * 24
    }
}

// ---- draft_from_context ----

#[test]
fn context_repeat_in_the_middle() {
    let ctx = [1, 2, 3, 4, 5, 6, 9, 9, 1, 2, 3];
    let d = draft_from_context(&ctx, &NgramParams::default(), 3);
    assert_eq!(d.tokens, vec![4, 5, 6]);
    assert_eq!(d.matched, 3);
}

#[test]
fn context_longest_match_beats_a_more_recent_shorter_one() {
    // [7,1,2,3] occurs at the start (then 10); [1,2,3] alone more recently (then 11).
    let ctx = [7, 1, 2, 3, 10, 8, 0, 1, 2, 3, 11, 5, 7, 1, 2, 3];
    let d = draft_from_context(&ctx, &NgramParams::default(), 2);
    assert_eq!(d.tokens, vec![10, 8]);
    assert_eq!(d.matched, 4);
}

#[test]
fn context_most_recent_among_equal_matches() {
    let ctx = [1, 2, 3, 10, 1, 2, 3, 11, 1, 2, 3];
    let d = draft_from_context(&ctx, &NgramParams::default(), 3);
    assert_eq!(d.tokens, vec![11, 1, 2]);
    assert_eq!(d.matched, 3);
}

#[test]
fn context_without_a_match_drafts_nothing() {
    let params = NgramParams::default();
    assert_eq!(
        draft_from_context(&[1, 2, 3, 4, 5, 6, 7, 8], &params, 4),
        Draft::default()
    );
    assert_eq!(draft_from_context(&[], &params, 4), Draft::default());
    // The suffix itself is no earlier occurrence.
    assert_eq!(draft_from_context(&[5, 5, 5], &params, 4), Draft::default());
}

#[test]
fn context_draft_is_capped_by_n_max_and_by_the_context_end() {
    let ctx = [1, 2, 3, 4, 5, 6, 7, 1, 2, 3];
    let params = NgramParams::default();
    assert_eq!(draft_from_context(&ctx, &params, 2).tokens, vec![4, 5]);
    assert_eq!(draft_from_context(&ctx, &params, 0), Draft::default());
    let all = draft_from_context(&ctx, &params, 100);
    assert_eq!(all.tokens, vec![4, 5, 6, 7, 1, 2, 3]);
    assert_eq!(all.matched, 3);
}

#[test]
fn context_continuation_runs_into_the_suffix() {
    // The best occurrence ends at 5 and matches 5 tokens; what follows it is the
    // suffix's own tokens, up to the end of the context.
    let ctx = [1, 2, 3, 1, 2, 3, 1, 2];
    let d = draft_from_context(&ctx, &NgramParams::default(), 10);
    assert_eq!(d.tokens, vec![3, 1, 2]);
    assert_eq!(d.matched, 5);
    // A run of one token: the longest earlier occurrence ends one before the end.
    let d = draft_from_context(&[4; 10], &p(3, 12), 5);
    assert_eq!(d.tokens, vec![4]);
    assert_eq!(d.matched, 9);
}

#[test]
fn context_respects_min_and_max_match() {
    let ctx = [1, 2, 9, 1, 2];
    assert_eq!(draft_from_context(&ctx, &p(3, 12), 2), Draft::default());
    let d = draft_from_context(&ctx, &p(2, 12), 2);
    assert_eq!(d.tokens, vec![9, 1]);
    assert_eq!(d.matched, 2);
    // With max 4 the most recent 4-token match wins over the older, longer one.
    let ctx = [5, 1, 2, 3, 4, 6, 0, 1, 2, 3, 4, 7, 5, 1, 2, 3, 4];
    let d = draft_from_context(&ctx, &p(3, 4), 1);
    assert_eq!((d.tokens, d.matched), (vec![7], 4));
    let d = draft_from_context(&ctx, &p(3, 5), 1);
    assert_eq!((d.tokens, d.matched), (vec![6], 5));
}

/// The spec read literally: for each suffix length from the longest down, the latest
/// earlier occurrence of that suffix.
fn context_reference(ctx: &[u32], min: usize, max: usize, n_max: usize) -> Draft {
    let len = ctx.len();
    if n_max == 0 {
        return Draft::default();
    }
    for l in (min..=max.min(len)).rev() {
        let suffix = &ctx[len - l..];
        for end in (l..len).rev() {
            if &ctx[end - l..end] == suffix {
                return Draft {
                    tokens: ctx[end..len.min(end + n_max)].to_vec(),
                    matched: l,
                };
            }
        }
    }
    Draft::default()
}

#[test]
fn context_matches_brute_force_reference() {
    let mut rng = Lcg(7);
    let mut drafted = 0;
    for _ in 0..20_000 {
        let vocab = 4 + rng.below(3);
        let ctx = rng.some_tokens(40, vocab);
        let min = 1 + rng.below(4);
        let max = min + rng.below(6);
        let n_max = rng.below(6);
        let got = draft_from_context(&ctx, &p(min, max), n_max);
        let want = context_reference(&ctx, min, max, n_max);
        assert_eq!(got, want, "ctx {ctx:?} min {min} max {max} n_max {n_max}");
        drafted += usize::from(!want.tokens.is_empty());
    }
    assert!(drafted > 5_000, "the cases must mostly draft: {drafted}");
}

// ---- TokenHistory ----

#[test]
fn history_drafts_from_a_recorded_sequence() {
    let mut h = TokenHistory::new(1000, NgramParams::default());
    h.record(None, &[10, 11, 12, 13, 14, 15, 16]);
    let d = h.draft(None, &[99, 98, 12, 13, 14], 2);
    assert_eq!(d.tokens, vec![15, 16]);
    assert_eq!(d.matched, 3);
    let d = h.draft(None, &[11, 12, 13, 14], 10);
    assert_eq!((d.tokens, d.matched), (vec![15, 16], 4));
    // No following token, no match; too short a context, none either.
    assert_eq!(h.draft(None, &[14, 15, 16], 3), Draft::default());
    assert_eq!(h.draft(None, &[13, 14], 3), Draft::default());
    assert_eq!(h.draft(None, &[12, 13, 14], 0), Draft::default());
    assert_eq!((h.len_sequences(), h.len_tokens()), (1, 7));
}

#[test]
fn history_prefers_longer_then_more_recent() {
    let mut h = TokenHistory::new(1000, NgramParams::default());
    h.record(None, &[8, 1, 2, 3, 40, 41]);
    h.record(None, &[9, 1, 2, 3, 50, 51]);
    h.record(None, &[7, 1, 2, 3, 60, 61]);
    // Ties: the most recently recorded.
    assert_eq!(h.draft(None, &[0, 1, 2, 3], 1).tokens, vec![60]);
    // A longer match in an older sequence wins.
    let d = h.draft(None, &[9, 1, 2, 3], 1);
    assert_eq!((d.tokens, d.matched), (vec![50], 4));
    // Within one sequence, the later occurrence.
    h.record(ns("x"), &[1, 2, 3, 70, 1, 2, 3, 71]);
    assert_eq!(h.draft(ns("x"), &[1, 2, 3], 1).tokens, vec![71]);
}

#[test]
fn history_keeps_namespaces_apart() {
    let (a, b) = (ns("a"), ns("b"));
    let mut h = TokenHistory::new(1000, NgramParams::default());
    h.record(a, &[1, 2, 3, 100, 101]);
    h.record(None, &[1, 2, 3, 200, 201]);
    h.record(b, &[5, 6, 7, 300]);
    assert_eq!(h.draft(a, &[1, 2, 3], 2).tokens, vec![100, 101]);
    assert_eq!(h.draft(None, &[1, 2, 3], 2).tokens, vec![200, 201]);
    // b holds nothing for [1,2,3], and neither a nor None holds b's tokens.
    assert_eq!(h.draft(b, &[1, 2, 3], 2), Draft::default());
    assert_eq!(h.draft(b, &[5, 6, 7], 2).tokens, vec![300]);
    assert_eq!(h.draft(a, &[5, 6, 7], 2), Draft::default());
    assert_eq!(h.draft(None, &[5, 6, 7], 2), Draft::default());
    assert_eq!(h.draft(ns("c"), &[1, 2, 3], 2), Draft::default());
    // The same tokens in two namespaces are two sequences; neither replaces the other.
    h.record(b, &[1, 2, 3, 100, 101]);
    assert_eq!(h.len_sequences(), 4);
    assert_eq!(h.draft(None, &[1, 2, 3], 2).tokens, vec![200, 201]);
    h.check_invariants();
}

#[test]
fn history_next_turn_replaces_its_prefix() {
    let turn1 = [1, 2, 3, 4, 5, 6];
    let both = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10];
    let mut h = TokenHistory::new(1000, NgramParams::default());
    h.record(None, &turn1);
    h.record(None, &both);
    assert_eq!((h.len_sequences(), h.len_tokens()), (1, both.len()));
    // A prefix, or the same again, adds nothing.
    h.record(None, &turn1);
    h.record(None, &both);
    assert_eq!((h.len_sequences(), h.len_tokens()), (1, both.len()));
    // Under another namespace it is a sequence of its own.
    h.record(ns("a"), &turn1);
    assert_eq!(
        (h.len_sequences(), h.len_tokens()),
        (2, both.len() + turn1.len())
    );
    // A sequence that diverges is no extension: both stay.
    h.record(None, &[1, 2, 3, 4, 5, 99]);
    assert_eq!(h.len_sequences(), 3);
    assert_eq!(h.draft(None, &[7, 8, 9], 1).tokens, vec![10]);
    h.check_invariants();
}

#[test]
fn history_ignores_short_sequences() {
    let mut h = TokenHistory::new(1000, NgramParams::default());
    h.record(None, &[1, 2, 3]);
    assert_eq!((h.len_sequences(), h.len_tokens()), (0, 0));
    h.record(None, &[1, 2, 3, 4]);
    assert_eq!((h.len_sequences(), h.len_tokens()), (1, 4));
}

#[test]
fn history_evicts_the_oldest_first_within_budget() {
    let mut h = TokenHistory::new(25, NgramParams::default());
    let seqs: Vec<Vec<u32>> = (0..3u32)
        .map(|s| (0..10).map(|i| s * 100 + i).collect())
        .collect();
    h.record(None, &seqs[0]);
    h.record(ns("other"), &seqs[1]);
    assert_eq!(h.len_tokens(), 20);
    h.record(None, &seqs[2]);
    assert_eq!((h.len_sequences(), h.len_tokens()), (2, 20));
    assert_eq!(h.draft(None, &[3, 4, 5], 1), Draft::default());
    assert_eq!(h.draft(ns("other"), &[103, 104, 105], 1).tokens, vec![106]);
    assert_eq!(h.draft(None, &[203, 204, 205], 1).tokens, vec![206]);
    // Too long for the budget: its last 25 tokens, alone.
    let long: Vec<u32> = (1000..1040).collect();
    h.record(None, &long);
    assert_eq!((h.len_sequences(), h.len_tokens()), (1, 25));
    assert_eq!(h.draft(None, &[1015, 1016, 1017], 1).tokens, vec![1018]);
    assert_eq!(h.draft(None, &[1005, 1006, 1007], 1), Draft::default());
    assert_eq!(h.draft(ns("other"), &[103, 104, 105], 1), Draft::default());
    h.check_invariants();
}

#[test]
fn history_keeps_the_newest_occurrences_of_a_frequent_key() {
    let mut h = TokenHistory::new(10_000, NgramParams::default());
    // [1,2,3] occurs 20 times, each followed by its own token.
    let mut seq = Vec::new();
    for i in 0..20 {
        seq.extend_from_slice(&[1, 2, 3, 100 + i]);
    }
    h.record(None, &seq);
    let d = h.draft(None, &[1, 2, 3], 1);
    assert_eq!(d.tokens, vec![119]);
    // [103, 1, 2, 3] (the 4th occurrence) is among the dropped: no longer match.
    assert_eq!(h.draft(None, &[103, 1, 2, 3], 1).matched, 3);
    assert_eq!(h.draft(None, &[117, 1, 2, 3], 1).matched, 4);
    h.check_invariants();
}

/// The spec read literally, over plain vectors.
struct Reference {
    min: usize,
    max: usize,
    max_tokens: usize,
    /// Oldest first.
    seqs: Vec<(Option<Namespace>, Vec<u32>)>,
    /// Sequences replaced by their next turn, and evicted for the budget.
    replaced: usize,
    evicted: usize,
}

impl Reference {
    fn record(&mut self, ns: Option<Namespace>, tokens: &[u32]) {
        if tokens.len() < self.min + 1 {
            return;
        }
        if self
            .seqs
            .iter()
            .any(|(n, s)| *n == ns && s.starts_with(tokens))
        {
            return;
        }
        let before = self.seqs.len();
        self.seqs
            .retain(|(n, s)| !(*n == ns && tokens.starts_with(s)));
        self.replaced += before - self.seqs.len();
        let tokens = &tokens[tokens.len().saturating_sub(self.max_tokens)..];
        while self.seqs.iter().map(|(_, s)| s.len()).sum::<usize>() + tokens.len() > self.max_tokens
        {
            self.seqs.remove(0);
            self.evicted += 1;
        }
        self.seqs.push((ns, tokens.to_vec()));
    }

    fn draft(&self, ns: Option<Namespace>, ctx: &[u32], n_max: usize) -> Draft {
        if n_max == 0 {
            return Draft::default();
        }
        for l in (self.min..=self.max.min(ctx.len())).rev() {
            let suffix = &ctx[ctx.len() - l..];
            for (_, s) in self.seqs.iter().rev().filter(|(n, _)| *n == ns) {
                for end in (l..s.len()).rev() {
                    if &s[end - l..end] == suffix {
                        return Draft {
                            tokens: s[end..s.len().min(end + n_max)].to_vec(),
                            matched: l,
                        };
                    }
                }
            }
        }
        Draft::default()
    }
}

/// Random records (new sequences, next turns, prefixes) over a tiny vocabulary in three
/// namespaces; `per_key` 0 means no cap. Returns how many sequences the reference saw
/// replaced and evicted.
fn random_history_run(
    seed: u64,
    per_key: usize,
    mut check: impl FnMut(&TokenHistory, &Reference, Option<Namespace>, &[u32], usize),
) -> (usize, usize) {
    let spaces = [None, ns("a"), ns("b")];
    let mut rng = Lcg(seed);
    let min = 1 + rng.below(3);
    let max = min + rng.below(5);
    let max_tokens = 20 + rng.below(120);
    let mut h = TokenHistory::new(max_tokens, p(min, max));
    if per_key == 0 {
        h.per_key = usize::MAX;
    } else {
        h.per_key = per_key;
    }
    let mut r = Reference {
        min,
        max,
        max_tokens,
        seqs: Vec::new(),
        replaced: 0,
        evicted: 0,
    };
    let vocab = 4 + rng.below(3);
    for _ in 0..60 {
        let space = spaces[rng.below(3)];
        let tokens = match (rng.below(4), r.seqs.len()) {
            (0, n) if n > 0 => {
                let mut t = r.seqs[rng.below(n)].1.clone();
                let more = 1 + rng.below(10);
                t.extend(rng.tokens(more, vocab));
                t
            }
            (1, n) if n > 0 => {
                let t = &r.seqs[rng.below(n)].1;
                t[..rng.below(t.len() + 1)].to_vec()
            }
            _ => rng.some_tokens(30, vocab),
        };
        h.record(space, &tokens);
        r.record(space, &tokens);
        assert_eq!(
            h.len_tokens(),
            r.seqs.iter().map(|(_, s)| s.len()).sum::<usize>()
        );
        assert_eq!(h.len_sequences(), r.seqs.len());
        assert!(h.len_tokens() <= max_tokens);
        h.check_invariants();
        for _ in 0..10 {
            let ctx = rng.some_tokens(12, vocab);
            check(&h, &r, spaces[rng.below(3)], &ctx, rng.below(6));
        }
    }
    (r.replaced, r.evicted)
}

#[test]
fn history_matches_brute_force_reference() {
    let (mut drafted, mut replaced, mut evicted) = (0, 0, 0);
    for seed in 0..300 {
        let (r, e) = random_history_run(seed, 0, |h, r, space, ctx, n_max| {
            let want = r.draft(space, ctx, n_max);
            assert_eq!(h.draft(space, ctx, n_max), want, "seed {seed} ctx {ctx:?}");
            drafted += usize::from(!want.tokens.is_empty());
        });
        (replaced, evicted) = (replaced + r, evicted + e);
    }
    // The runs exercise what they should: drafts, next turns and eviction.
    assert!(drafted > 20_000, "the cases must mostly draft: {drafted}");
    assert!(replaced > 1_000 && evicted > 1_000, "{replaced} {evicted}");
}

#[test]
fn history_capped_drafts_are_real_and_never_longer() {
    let (mut wanted, mut drafted) = (0, 0);
    for seed in 0..300 {
        random_history_run(seed, PER_KEY, |h, r, space, ctx, n_max| {
            let got = h.draft(space, ctx, n_max);
            let best = r.draft(space, ctx, n_max);
            wanted += usize::from(!best.tokens.is_empty());
            if got.tokens.is_empty() {
                assert_eq!(got.matched, 0);
                return;
            }
            drafted += 1;
            assert!(got.matched >= r.min && got.matched <= best.matched);
            // Some sequence of this namespace matches exactly `m` tokens (up to max) at an
            // occurrence followed by the draft.
            let m = got.matched;
            let real = r.seqs.iter().filter(|(n, _)| *n == space).any(|(_, s)| {
                (1..s.len()).any(|end| {
                    let mut k = 0;
                    while k < r.max
                        && k < end
                        && k < ctx.len()
                        && s[end - 1 - k] == ctx[ctx.len() - 1 - k]
                    {
                        k += 1;
                    }
                    k == m && s[end..s.len().min(end + n_max)] == got.tokens[..]
                })
            });
            assert!(real, "seed {seed} ctx {ctx:?} got {got:?}");
        });
    }
    println!("capped: {drafted} drafts where the uncapped search finds {wanted}");
    // The cap rarely leaves a key without a candidate.
    assert!(drafted <= wanted && drafted * 100 >= wanted * 99);
}

#[test]
fn history_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<TokenHistory>();
}

/// Timings, in release: `cargo test --release -p engine --lib speculative::ngram --
/// --ignored --nocapture`.
#[test]
#[ignore]
fn timings() {
    use std::time::Instant;
    let mut rng = Lcg(1);
    let params = NgramParams::default();
    // Random tokens (no draft: a full scan), and one token repeated with the 12th from
    // the end changed (every position matches 11 tokens: a full scan, 11 compares each).
    let mut adversarial = vec![7; 32_768];
    adversarial[32_768 - 12] = 8;
    let contexts = [
        ("vocab 32000", rng.tokens(32_768, 32_000)),
        ("vocab 50", rng.tokens(32_768, 50)),
        ("adversarial", adversarial),
    ];
    for (what, ctx) in contexts {
        let reps = 1000;
        let t = Instant::now();
        let mut sink = 0;
        for _ in 0..reps {
            let c = std::hint::black_box(&ctx[..]);
            sink += draft_from_context(c, &params, 8).tokens.len();
        }
        let per = t.elapsed() / reps;
        println!("draft_from_context, 32k tokens, {what}: {per:?} per call [{sink}]");
    }
    let spaces: Vec<_> = (0..4).map(|i| ns(&format!("{i}"))).collect();
    for vocab in [32_000, 1000, 50] {
        let mut h = TokenHistory::new(2_000_000, params);
        let seqs: Vec<Vec<u32>> = (0..500).map(|_| rng.tokens(4000, vocab)).collect();
        let t = Instant::now();
        for (i, s) in seqs.iter().enumerate() {
            h.record(spaces[i % 4], s);
        }
        let rec = t.elapsed() / seqs.len() as u32;
        assert_eq!(h.len_tokens(), 2_000_000);
        let bytes = h.heap_bytes();
        // Contexts: half end in a recorded window (drafts), half random.
        let ctxs: Vec<(usize, Vec<u32>)> = (0..10_000)
            .map(|i| {
                let which = rng.below(seqs.len());
                let s = &seqs[which];
                let end = 20 + rng.below(s.len() - 40);
                let mut c = rng.tokens(100, vocab);
                if i % 2 == 0 {
                    c.extend_from_slice(&s[end - 12..end]);
                }
                (which % 4, c)
            })
            .collect();
        let t = Instant::now();
        let mut sink = 0;
        for (space, c) in &ctxs {
            sink += h
                .draft(spaces[*space], std::hint::black_box(c), 8)
                .tokens
                .len();
        }
        let per = t.elapsed() / ctxs.len() as u32;
        println!(
            "TokenHistory vocab {vocab}: 2M tokens, {:.1} bytes/token, record 4k: {rec:?}, draft: {per:?} [{sink}]",
            bytes as f64 / h.len_tokens() as f64
        );
        // Turn over the whole budget once more (eviction and reuse).
        let t = Instant::now();
        for s in &seqs {
            h.record(None, s);
        }
        println!(
            "  second 2M with eviction: {:?} per 4k record, {:.1} bytes/token",
            t.elapsed() / seqs.len() as u32,
            h.heap_bytes() as f64 / h.len_tokens() as f64
        );
    }
}
