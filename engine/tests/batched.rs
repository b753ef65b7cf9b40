//! Many sequences in one context: interleaved batches against the naive reference, shared and
//! copied-on-write pages, typed errors that change nothing, and imports that fail cleanly.

mod common;

use std::sync::Arc;

use common::*;
use engine::{Batch, Context, ContextParams, Error, Logits, Model, SeqId, Session, PAGE_TOKENS};

fn context(model: &Arc<Model>, kv_tokens: usize, n_batch: usize) -> Context {
    Context::new(
        model.clone(),
        ContextParams {
            n_ctx: 128,
            kv_tokens,
            n_threads: 2,
            n_batch,
            flash_attn: true,
            ..ContextParams::default()
        },
    )
    .unwrap()
}

/// A token stream of its own for each `seed`.
fn stream(seed: usize, n: usize) -> Vec<u32> {
    (0..n)
        .map(|i| ((i * 31 + seed * 17 + 5) % 97) as u32)
        .collect()
}

#[test]
fn interleaved_sequences_match_the_reference() {
    for shape in [Shape::Llama, Shape::Qwen2] {
        let c = cfg(shape, false);
        let (_dir, model, w) = build(&c, 21);
        let mut ctx = context(&model, 512, 64);
        // Three sequences of different lengths, fed in chunks of different sizes: one
        // prefills in chunks of 20, one decodes a token at a time, one goes 7 by 7.
        let plans = [(stream(1, 90), 20), (stream(2, 40), 1), (stream(3, 70), 7)];
        let want: Vec<_> = plans.iter().map(|(t, _)| reference(&c, &w, t)).collect();
        let seqs: Vec<SeqId> = plans.iter().map(|_| ctx.new_sequence()).collect();
        let mut done = [0usize; 3];
        let mut steps = 0;
        while done.iter().zip(&plans).any(|(d, (t, _))| d < &t.len()) {
            let mut batch = Batch::new();
            let mut items = Vec::new();
            for (i, (toks, chunk)) in plans.iter().enumerate() {
                if done[i] < toks.len() {
                    let end = (done[i] + chunk).min(toks.len());
                    let item = batch.add_at(seqs[i], done[i], &toks[done[i]..end], Logits::All);
                    items.push((i, item, done[i]..end));
                    done[i] = end;
                }
            }
            let out = ctx.decode(&batch).unwrap();
            for (i, item, range) in items {
                let rows = out.logits(item);
                assert_eq!(rows.len(), range.len() * c.n_vocab);
                for (row, pos) in rows.chunks(c.n_vocab).zip(range) {
                    assert_close(
                        row,
                        &want[i][pos],
                        5e-3,
                        &format!("shape {} seq {i} pos {pos}", matches!(shape, Shape::Llama)),
                    );
                }
            }
            steps += 1;
        }
        assert_eq!(
            steps, 40,
            "the decode-one-at-a-time sequence sets the number of steps"
        );
        for (i, seq) in seqs.iter().enumerate() {
            assert_eq!(ctx.tokens(*seq).unwrap(), &plans[i].0[..]);
            assert_close(
                ctx.logits(*seq).unwrap(),
                want[i].last().unwrap(),
                5e-3,
                "kept logits",
            );
        }
        assert_eq!(ctx.stats().pages_used, 2 + 1 + 2);
    }
}

#[test]
fn shared_pages_give_the_same_logits_as_computing_the_prefix() {
    let c = cfg(Shape::Llama, false);
    let (_dir, model, w) = build(&c, 22);
    let mut ctx = context(&model, 1024, 128);
    let base = stream(4, 100); // a full page and 36 positions of a second
    let a = ctx.new_sequence();
    ctx.feed(a, &base, Logits::Last).unwrap();
    let before = ctx.stats();

    // A fork shares both pages: no KV is copied until one of them writes.
    let b = ctx.fork(a, 100).unwrap();
    let shared = ctx.stats();
    assert_eq!(shared.pages_used, before.pages_used);
    assert_eq!(shared.pages_shared, 2);
    assert_eq!(ctx.logits(b).unwrap(), ctx.logits(a).unwrap());

    // Both continue differently; the partial page is copied for whichever writes first, and
    // each matches the reference of its own tokens.
    let (tail_a, tail_b) = (stream(5, 10), stream(6, 10));
    let mut batch = Batch::new();
    batch.add(a, &tail_a, Logits::All);
    batch.add(b, &tail_b, Logits::All);
    let out = ctx.decode(&batch).unwrap();
    assert_eq!(
        ctx.stats().pages_used,
        before.pages_used + 1,
        "one copy on write"
    );
    for (item, tail) in [(0, &tail_a), (1, &tail_b)] {
        let full: Vec<u32> = base.iter().chain(tail.iter()).copied().collect();
        let want = reference(&c, &w, &full);
        for (j, row) in out.logits(item).chunks(c.n_vocab).enumerate() {
            assert_close(
                row,
                &want[100 + j],
                5e-3,
                &format!("item {item} pos {}", 100 + j),
            );
        }
    }

    // Against a sequence that computed everything itself, in the same chunks: the same logits.
    let own = ctx.new_sequence();
    let full: Vec<u32> = base.iter().chain(tail_b.iter()).copied().collect();
    ctx.feed(own, &base, Logits::Last).unwrap();
    let mine = ctx.feed(own, &tail_b, Logits::All).unwrap();
    assert_close(out.logits(1), &mine, 1e-5, "forked vs computed");
    let mine = mine[mine.len() - c.n_vocab..].to_vec();

    // A new sequence finds the resident full page by its block id.
    let d = ctx.new_sequence();
    assert_eq!(ctx.attach_prefix(d, &full).unwrap(), PAGE_TOKENS);
    let rest = ctx.feed(d, &full[PAGE_TOKENS..], Logits::Last).unwrap();
    assert_close(&rest, &mine, 5e-3, "attached prefix vs computed");

    // Dropping sequences returns the pages only they held.
    for s in [a, b, own, d] {
        ctx.remove_sequence(s).unwrap();
    }
    assert_eq!(ctx.stats().pages_used, 0);
    assert!(matches!(ctx.tokens(a), Err(Error::UnknownSequence { .. })));
}

#[test]
fn bad_batches_are_typed_errors_and_change_nothing() {
    let c = cfg(Shape::Llama, false);
    let (_dir, model, _) = build(&c, 23);
    // Two pages in all.
    let mut ctx = context(&model, 2 * PAGE_TOKENS, 16);
    let a = ctx.new_sequence();
    ctx.feed(a, &stream(7, 100), Logits::Last).unwrap();
    let logits = ctx.logits(a).unwrap().to_vec();
    let gone = ctx.new_sequence();
    ctx.remove_sequence(gone).unwrap();
    let b = ctx.new_sequence();
    let stats = ctx.stats();

    let one = |seq, pos: Option<usize>, n: usize| {
        let mut batch = Batch::new();
        match pos {
            Some(p) => batch.add_at(seq, p, &stream(8, n), Logits::Last),
            None => batch.add(seq, &stream(8, n), Logits::Last),
        };
        batch
    };
    type Case = (Batch, fn(&Error) -> bool);
    let cases: Vec<Case> = vec![
        (one(gone, None, 1), |e| {
            matches!(e, Error::UnknownSequence { .. })
        }),
        (one(a, Some(99), 1), |e| {
            matches!(
                e,
                Error::PositionGap {
                    expected: 100,
                    found: 99,
                    ..
                }
            )
        }),
        (one(a, None, 17), |e| {
            matches!(
                e,
                Error::BatchTooLarge {
                    n_tokens: 17,
                    n_batch: 16
                }
            )
        }),
        (one(b, None, 0), |e| matches!(e, Error::EmptyBatch)),
        (Batch::new(), |e| matches!(e, Error::EmptyBatch)),
        (
            {
                let mut batch = one(a, None, 1);
                batch.add(a, &[1], Logits::Last);
                batch
            },
            |e| matches!(e, Error::DuplicateSequence { .. }),
        ),
        (
            {
                // a's second page has room; b needs a page of its own, and none is free.
                let mut batch = one(a, None, 3);
                batch.add(b, &[1], Logits::Last);
                batch
            },
            |e| {
                matches!(
                    e,
                    Error::OutOfPages {
                        needed: 1,
                        free: 0,
                        total: 2
                    }
                )
            },
        ),
        (
            {
                let mut batch = Batch::new();
                batch.add(a, &[500], Logits::Last);
                batch
            },
            |e| matches!(e, Error::BadToken { id: 500, .. }),
        ),
    ];
    for (i, (batch, expected)) in cases.into_iter().enumerate() {
        let err = ctx.decode(&batch).unwrap_err();
        assert!(expected(&err), "case {i}: unexpected {err:?}");
        assert_eq!(ctx.stats(), stats, "case {i} changed the pool");
        assert_eq!(ctx.tokens(a).unwrap().len(), 100, "case {i}");
        assert_eq!(ctx.tokens(b).unwrap().len(), 0, "case {i}");
        assert_eq!(ctx.logits(a).unwrap(), &logits[..], "case {i}");
    }
    // Past the context window.
    let err = ctx.feed(a, &stream(9, 29), Logits::Last).unwrap_err();
    assert!(matches!(
        err,
        Error::ContextFull {
            needed: 129,
            n_ctx: 128
        }
    ));
}

#[test]
fn a_failed_import_leaves_the_sequence_as_it_was() {
    let c = cfg(Shape::Qwen2, false);
    let (_dir, model, _) = build(&c, 24);
    let toks = stream(10, 110);
    let mut a = Session::new(model.clone(), params(64)).unwrap();
    a.feed(&toks[..100]).unwrap();
    let mut twin = Session::new(model.clone(), params(64)).unwrap();
    twin.feed(&toks[..100]).unwrap();
    let logits = a.logits().unwrap().to_vec();

    // Another conversation's pages, whose block fails to arrive, or arrives short.
    let mut other = Session::new(model, params(64)).unwrap();
    other.feed(&stream(11, 90)).unwrap();
    let exported = export_pages(&other);
    let seq = a.seq();
    type Sink<'a> = &'a mut dyn FnMut(&[u8]) -> engine::Result<()>;
    type Failure = dyn Fn(&[u8], Sink<'_>) -> engine::Result<()>;
    let failures: [&Failure; 2] = [&|_, _| Err(Error::NoLogits), &|block, sink| {
        sink(&block[..block.len() - 1])
    }];
    for fail in failures {
        let err = a
            .context_mut()
            .import(seq, &exported.tokens, &exported.tail, |i, _, sink| {
                fail(&exported.blocks[i], sink)
            })
            .unwrap_err();
        assert!(
            matches!(err, Error::NoLogits | Error::KvBytes { .. }),
            "{err:?}"
        );
        assert_eq!(a.tokens(), &toks[..100]);
        assert_eq!(a.logits().unwrap(), &logits[..]);
    }
    assert_eq!(
        a.context().stats().pages_used,
        2,
        "the pages taken for the failed import were returned"
    );
    let next_a = a.feed(&toks[100..]).unwrap().to_vec();
    let next_twin = twin.feed(&toks[100..]).unwrap().to_vec();
    assert_eq!(next_a, next_twin, "the KV is untouched");

    // The import itself works, and replaces the conversation.
    import_pages(&mut a, &exported).unwrap();
    assert_eq!(a.tokens(), &exported.tokens[..]);
}

#[test]
fn a_session_keeps_its_own_sequence() {
    let c = cfg(Shape::Llama, false);
    let (_dir, model, _) = build(&c, 25);
    let mut s = Session::new(model, params(64)).unwrap();
    let toks = stream(12, 70);
    s.feed(&toks).unwrap();
    let logits = s.logits().unwrap().to_vec();
    let seq = s.seq();
    let err = s.context_mut().remove_sequence(seq).unwrap_err();
    assert!(
        matches!(err, Error::SessionSequence { seq: q } if q == seq),
        "{err:?}"
    );
    assert_eq!(s.tokens(), &toks[..]);
    assert_eq!(s.logits().unwrap(), &logits[..]);
    // Other sequences of the session's context can still be removed.
    let fork = s.context_mut().fork(seq, 64).unwrap();
    s.context_mut().remove_sequence(fork).unwrap();
    assert_eq!(s.feed(&[5]).unwrap().len(), logits.len());
}
