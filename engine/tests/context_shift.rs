//! Context shift on tiny models the test writes (llama and qwen2 rope styles): the K rows
//! after a shift match K computed directly at the new positions (one layer, where K depends on
//! the token and its position only), the next-token logits match those of the kept tokens
//! evaluated afresh, shared pages are left alone, block ids never collide with unshifted ones,
//! a shifted sequence's checkpoint restores to the same bits (and continues the same), and
//! prefix lookups never hand shifted KV to a plain prompt or plain KV to a shifted checkpoint.

mod common;

use common::*;
use engine::store::{CheckpointMeta, SessionStore, StoreConfig};
use engine::{Error, Session};
use half::f16;

fn session(model: &std::sync::Arc<engine::Model>) -> Session {
    let mut p = params(64);
    p.n_ctx = 256;
    Session::new(model.clone(), p).unwrap()
}

/// Layer `l`'s K and V of every position held, as f32.
fn kv(s: &Session, l: usize) -> (Vec<f32>, Vec<f32>) {
    let n = s.tokens().len();
    let layout = s.kv_layout();
    let mut k = vec![0u8; n * layout.k_bytes_per_token[l]];
    let mut v = vec![0u8; n * layout.v_bytes_per_token[l]];
    s.read_kv(l, 0..n, &mut k, &mut v).unwrap();
    let f = |b: &[u8]| {
        b.chunks_exact(2)
            .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect::<Vec<_>>()
    };
    (f(&k), f(&v))
}

/// Every row (one token's values) of `got` within `tol` of `want`, relative to the row's
/// largest value.
fn assert_rows_close(got: &[f32], want: &[f32], row: usize, tol: f32, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (g, w)) in got.chunks(row).zip(want.chunks(row)).enumerate() {
        let scale = w.iter().fold(1e-6f32, |m, x| m.max(x.abs()));
        let worst = g
            .iter()
            .zip(w)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(
            worst <= tol * scale,
            "{what}: row {i}: {worst} > {tol} x {scale}"
        );
    }
}

fn top10(logits: &[f32]) -> Vec<usize> {
    let mut ids: Vec<usize> = (0..logits.len()).collect();
    ids.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
    ids.truncate(10);
    ids
}

fn shifted_matches_direct(shape: Shape) {
    let mut c = cfg(shape, false);
    c.n_layer = 1;
    let (_dir, model, _) = build(&c, 21);
    let doc = tokens(150);
    let (n_keep, n_discard) = (10, 70);
    let mut a = session(&model);
    a.feed(&doc).unwrap();
    let (k_before, _) = kv(&a, 0);
    a.shift(n_keep, n_discard).unwrap();
    let kept: Vec<u32> = doc[..n_keep]
        .iter()
        .chain(&doc[n_keep + n_discard..])
        .copied()
        .collect();
    assert_eq!(a.tokens(), &kept[..]);
    let mut b = session(&model);
    b.feed(&kept).unwrap();

    let row = c.kv_dim();
    let (ka, va) = kv(&a, 0);
    let (kb, vb) = kv(&b, 0);
    // The moved rows really were rotated: before the shift they differ from the direct ones.
    let moved_before = &k_before[(n_keep + n_discard) * row..];
    let moved_direct = &kb[n_keep * row..];
    let unrotated = moved_before
        .iter()
        .zip(moved_direct)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max);
    assert!(unrotated > 0.05, "{unrotated}");
    assert_rows_close(&ka, &kb, row, 1e-3, "K after the shift");
    assert_rows_close(&va, &vb, row, 1e-3, "V after the shift");

    let next = [5u32];
    let la = a.feed(&next).unwrap().to_vec();
    let lb = b.feed(&next).unwrap().to_vec();
    assert_eq!(top10(&la), top10(&lb));
    let worst = la
        .iter()
        .zip(&lb)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max);
    assert!(worst <= 2e-2, "next-token logits differ by {worst}");
}

#[test]
fn llama_shift_matches_direct_computation() {
    shifted_matches_direct(Shape::Llama);
}

#[test]
fn qwen2_shift_matches_direct_computation() {
    shifted_matches_direct(Shape::Qwen2);
}

/// The one layer is windowed (4 positions) and rotates with its own RoPE base, which the shift
/// must use too.
#[test]
fn gemma3_windowed_layer_shift_matches_direct_computation() {
    shifted_matches_direct(Shape::Gemma3);
}

#[test]
fn phi3_shift_matches_direct_computation() {
    shifted_matches_direct(Shape::Phi3);
}

#[test]
fn shared_pages_stay_and_ids_do_not_collide() {
    let c = cfg(Shape::Llama, false);
    let (dir, model, _) = build(&c, 22);
    let doc = tokens(200);
    let mut a = session(&model);
    a.feed(&doc).unwrap();
    // A second sequence sharing a's first two pages.
    let seq = a.seq();
    let fork = a.context_mut().fork(seq, 128).unwrap();
    let read = |s: &Session, seq| {
        let n = 128;
        let layout = s.kv_layout();
        let mut k = vec![0u8; n * layout.k_bytes_per_token[1]];
        let mut v = vec![0u8; n * layout.v_bytes_per_token[1]];
        s.context().read_kv(seq, 1, 0..n, &mut k, &mut v).unwrap();
        (k, v)
    };
    let fork_before = read(&a, fork);
    a.shift(64, 40).unwrap();
    assert_eq!(read(&a, fork), fork_before, "the fork's pages changed");
    assert_eq!(a.tokens().len(), 160);
    // The kept page keeps its id; the moved one gets an id no unshifted sequence has.
    let ids = a.context().block_ids(seq).unwrap().to_vec();
    let fork_ids = a.context().block_ids(fork).unwrap().to_vec();
    assert_eq!(ids[0], fork_ids[0]);
    let mut plain = session(&model);
    plain.feed(a.tokens()).unwrap();
    let plain_ids = plain.context().block_ids(plain.seq()).unwrap().to_vec();
    assert_eq!(ids.len(), 2);
    assert_eq!(ids[0], plain_ids[0]);
    assert_ne!(ids[1], plain_ids[1]);
    // Tokens appended after the shift chain on from the shifted ids.
    a.feed(&doc[..40]).unwrap();
    plain.feed(&doc[..40]).unwrap();
    let ids = a.context().block_ids(seq).unwrap().to_vec();
    let plain_ids = plain.context().block_ids(plain.seq()).unwrap().to_vec();
    assert_eq!(ids.len(), 3);
    assert_ne!(ids[2], plain_ids[2]);

    // Truncated back into the kept prefix, it is an unshifted sequence again.
    assert_eq!(a.context().chain_roots(seq).unwrap().len(), 1);
    a.truncate(64).unwrap();
    assert!(a.context().chain_roots(seq).unwrap().is_empty());
    let store =
        SessionStore::open(&dir.path().join("store"), &model, StoreConfig::default()).unwrap();
    store.save(&a, "kept", &CheckpointMeta::default()).unwrap();
    // A restore replaces a shifted sequence with an unshifted one.
    a.feed(&doc[..100]).unwrap();
    a.shift(0, 50).unwrap();
    store.restore(&mut a, "kept").unwrap();
    assert_eq!(a.tokens(), &doc[..64]);
    assert!(a.context().chain_roots(seq).unwrap().is_empty());
    a.feed(&doc[64..200]).unwrap();
    assert_eq!(
        a.context().block_ids(seq).unwrap(),
        &plain_ids_of(&model, &doc)[..]
    );
}

/// Block ids of `tokens` computed plainly in a fresh session.
fn plain_ids_of(model: &std::sync::Arc<engine::Model>, tokens: &[u32]) -> Vec<ckptfmt::BlockId> {
    let mut s = session(model);
    s.feed(tokens).unwrap();
    s.context().block_ids(s.seq()).unwrap().to_vec()
}

/// Every layer's K and V bytes of all positions held.
fn kv_bytes(s: &Session) -> Vec<u8> {
    s.kv_bytes().unwrap()
}

fn bits(logits: &[f32]) -> Vec<u32> {
    logits.iter().map(|x| x.to_bits()).collect()
}

/// Shifted twice (a root at page 0, then one at page 1), saved, restored into a fresh session
/// through a fresh store handle: same tokens, KV bytes, block ids and roots; then the same
/// tokens fed to both give the same logits and KV, bit for bit, and the same ids for the pages
/// filled after the restore.
fn shifted_checkpoint_restores_exactly(shape: Shape) {
    let c = cfg(shape, false);
    let (dir, model, _) = build(&c, 24);
    let doc = tokens(400);
    let mut a = session(&model);
    a.feed(&doc[..200]).unwrap();
    a.shift(10, 70).unwrap();
    a.feed(&doc[200..230]).unwrap();
    a.shift(70, 40).unwrap();
    a.feed(&doc[230..250]).unwrap();
    let seq = a.seq();
    let roots: Vec<u64> = a
        .context()
        .chain_roots(seq)
        .unwrap()
        .iter()
        .map(|r| r.block)
        .collect();
    assert_eq!(roots, [0, 1]);
    assert_eq!(a.tokens().len(), 140);

    let store_dir = dir.path().join("store");
    let summary = {
        let store = SessionStore::open(&store_dir, &model, StoreConfig::default()).unwrap();
        store
            .save(&a, "shifted", &CheckpointMeta::default())
            .unwrap()
    };
    assert_eq!((summary.blocks_written, summary.blocks_reused), (2, 0));
    let store = SessionStore::open(&store_dir, &model, StoreConfig::default()).unwrap();
    // An empty session, as an ingestion resumes: its pages lie in the pool in the order of the
    // original's (which a shift keeps), and attention sums over cells in pool order.
    let mut b = session(&model);
    store.restore(&mut b, "shifted").unwrap();
    assert_eq!(b.tokens(), a.tokens());
    assert!(
        kv_bytes(&b) == kv_bytes(&a),
        "KV bytes differ after the restore"
    );
    assert_eq!(
        b.context().block_ids(b.seq()).unwrap(),
        a.context().block_ids(seq).unwrap()
    );
    assert_eq!(
        b.context().chain_roots(b.seq()).unwrap(),
        a.context().chain_roots(seq).unwrap()
    );
    // Positions continue: the next tokens go to positions 140.., in both.
    let la = a.feed(&doc[250..330]).unwrap().to_vec();
    let lb = b.feed(&doc[250..330]).unwrap().to_vec();
    assert_eq!(bits(&la), bits(&lb), "next-token logits differ");
    assert!(kv_bytes(&b) == kv_bytes(&a));
    let ids = a.context().block_ids(seq).unwrap().to_vec();
    assert_eq!(ids.len(), 3);
    assert_eq!(b.context().block_ids(b.seq()).unwrap(), &ids[..]);
    // The restored session saves again, sharing every block.
    let again = store.save(&b, "again", &CheckpointMeta::default()).unwrap();
    assert_eq!((again.blocks_written, again.blocks_reused), (1, 2));
    // And a fresh session restores that one to the same bits.
    let mut d = session(&model);
    store.restore(&mut d, "again").unwrap();
    assert!(kv_bytes(&d) == kv_bytes(&a));
}

#[test]
fn llama_shifted_checkpoint_restores_exactly() {
    shifted_checkpoint_restores_exactly(Shape::Llama);
}

#[test]
fn qwen2_shifted_checkpoint_restores_exactly() {
    shifted_checkpoint_restores_exactly(Shape::Qwen2);
}

#[test]
fn prefix_lookups_never_cross_shifted_and_unshifted_blocks() {
    let c = cfg(Shape::Llama, false);
    let (dir, model, _) = build(&c, 25);
    let doc = tokens(250);
    // Shifted: page 0 kept as it was, pages 1.. moved (chained from a root).
    let mut a = session(&model);
    a.feed(&doc).unwrap();
    a.shift(64, 60).unwrap();
    let shifted_tokens = a.tokens().to_vec();
    assert_eq!(shifted_tokens.len(), 190);
    let store =
        SessionStore::open(&dir.path().join("store"), &model, StoreConfig::default()).unwrap();
    store
        .save(&a, "shifted", &CheckpointMeta::default())
        .unwrap();
    let shifted_kv = kv_bytes(&a);

    // The same tokens computed plainly: only the kept page matches the shifted checkpoint.
    let mut plain = session(&model);
    plain.feed(&shifted_tokens).unwrap();
    let plain_kv = kv_bytes(&plain);
    assert!(
        plain_kv != shifted_kv,
        "the shift changed nothing to compare"
    );
    assert_eq!(store.prefix_blocks(&shifted_tokens), 1);
    let mut p = session(&model);
    let n = store.restore_prefix(&mut p, &shifted_tokens).unwrap();
    assert_eq!(n, 64);
    p.feed(&shifted_tokens[64..]).unwrap();
    assert!(kv_bytes(&p) == plain_kv, "a plain prompt got shifted KV");

    // Now the plain computation is stored too: a prefix lookup finds all of its full pages, and
    // the shifted checkpoint still restores its own KV.
    store
        .save(&plain, "plain", &CheckpointMeta::default())
        .unwrap();
    assert_eq!(store.prefix_blocks(&shifted_tokens), 2);
    let mut s = session(&model);
    store.restore(&mut s, "shifted").unwrap();
    assert!(
        kv_bytes(&s) == shifted_kv,
        "a shifted checkpoint got plain KV"
    );

    // In one context: the plain sequence resident, the shifted checkpoint restored beside it
    // shares only the kept page; a plain prefix attached beside the shifted one shares only it.
    let plain_first = plain.seq();
    let ctx = plain.context_mut();
    let shifted_seq = ctx.new_sequence();
    store.restore_seq(ctx, shifted_seq, "shifted").unwrap();
    let plain_seq = ctx.new_sequence();
    assert_eq!(ctx.attach_prefix(plain_seq, &shifted_tokens).unwrap(), 128);
    let shared = ctx.stats().pages_shared;
    // Page 0 is held by all three sequences, the plain page 1 by two: nothing else is shared.
    assert_eq!(shared, 2);
    assert_eq!(
        ctx.block_ids(plain_seq).unwrap(),
        &ctx.block_ids(plain_first).unwrap()[..2]
    );
}

#[test]
fn a_lone_sequence_shifts_in_place_and_a_shared_one_into_fresh_pages() {
    let c = cfg(Shape::Llama, false);
    let (_dir, model, _) = build(&c, 26);
    let params = engine::ContextParams {
        n_ctx: 256,
        kv_tokens: 256,
        n_threads: 2,
        ..engine::ContextParams::default()
    };
    let mut ctx = engine::Context::new(model.clone(), params).unwrap();
    let doc = tokens(256);
    let seq = ctx.new_sequence();
    ctx.feed(seq, &doc, engine::Logits::None).unwrap();
    assert_eq!(
        ctx.stats().pages_used,
        ctx.stats().pages_total,
        "the pool is full"
    );
    // Alone, it needs no free page: the pages are rewritten in place, and the last ones freed.
    ctx.shift(seq, 70, 100).unwrap();
    assert_eq!(ctx.tokens(seq).unwrap().len(), 156);
    assert_eq!(ctx.stats().pages_used, 3);
    // Sharing its pages with a fork, it needs fresh ones: refused before anything changes.
    ctx.feed(seq, &doc[..100], engine::Logits::None).unwrap();
    let fork = ctx.fork(seq, 256).unwrap();
    let ids = ctx.block_ids(seq).unwrap().to_vec();
    let err = ctx.shift(seq, 70, 100).unwrap_err();
    assert!(matches!(err, Error::OutOfPages { free: 0, .. }), "{err}");
    assert_eq!(ctx.block_ids(seq).unwrap(), &ids[..]);
    assert_eq!(ctx.tokens(seq).unwrap().len(), 256);
    ctx.remove_sequence(fork).unwrap();
    ctx.shift(seq, 70, 100).unwrap();
    assert_eq!(ctx.tokens(seq).unwrap().len(), 156);
}

#[test]
fn chain_roots_that_do_not_fit_are_refused_by_an_import() {
    let c = cfg(Shape::Llama, false);
    let (_dir, model, _) = build(&c, 27);
    let mut a = session(&model);
    a.feed(&tokens(70)).unwrap();
    let seq = a.seq();
    let root = |block| ckptfmt::ChainRoot {
        block,
        id: ckptfmt::BlockId([7; 32]),
    };
    let doc = tokens(130);
    for (roots, want) in [
        (vec![root(3)], vec![3]),
        (vec![root(1), root(1)], vec![1, 1]),
        (vec![root(2), root(0)], vec![2, 0]),
    ] {
        let err = a
            .context_mut()
            .import_chained(seq, &doc, &roots, &[], |_, _, _| Ok(()))
            .unwrap_err();
        match err {
            Error::BadChainRoots { roots, n_blocks } => {
                assert_eq!((roots, n_blocks), (want, 2));
            }
            other => panic!("{other}"),
        }
    }
    assert_eq!(a.tokens(), &tokens(70)[..]);
}

#[test]
fn a_bad_shift_changes_nothing() {
    let c = cfg(Shape::Qwen2, false);
    let (_dir, model, _) = build(&c, 23);
    let mut a = session(&model);
    a.feed(&tokens(100)).unwrap();
    let before = kv(&a, 0);
    let err = a.shift(60, 41).unwrap_err();
    assert!(
        matches!(
            err,
            Error::BadShift {
                n_keep: 60,
                n_discard: 41,
                len: 100
            }
        ),
        "{err}"
    );
    a.shift(60, 0).unwrap();
    assert_eq!(a.tokens(), &tokens(100)[..]);
    assert_eq!(kv(&a, 0), before);
}
