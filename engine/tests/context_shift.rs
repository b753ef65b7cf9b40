//! Context shift on tiny models the test writes (llama and qwen2 rope styles): the K rows
//! after a shift match K computed directly at the new positions (one layer, where K depends on
//! the token and its position only), the next-token logits match those of the kept tokens
//! evaluated afresh, shared pages are left alone, block ids never collide with unshifted ones,
//! and a shifted sequence is refused by the store.

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

    let store =
        SessionStore::open(&dir.path().join("store"), &model, StoreConfig::default()).unwrap();
    let err = store
        .save(&a, "shifted", &CheckpointMeta::default())
        .unwrap_err();
    assert!(matches!(err, Error::ShiftedCheckpoint { .. }), "{err}");
    assert!(!store.exists("shifted").unwrap());
    // Truncated back into the kept prefix, it is an unshifted sequence again.
    a.truncate(64);
    store.save(&a, "kept", &CheckpointMeta::default()).unwrap();
    // A restore replaces a shifted sequence with an unshifted one, which saves again.
    a.feed(&doc[..100]).unwrap();
    a.shift(0, 50).unwrap();
    store.restore(&mut a, "kept").unwrap();
    assert_eq!(a.tokens(), &doc[..64]);
    store
        .save(&a, "kept-again", &CheckpointMeta::default())
        .unwrap();
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
