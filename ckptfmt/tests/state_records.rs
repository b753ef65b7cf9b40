//! Recurrent state (format version 2): the geometry's state sizes, state
//! records at block boundaries, a manifest's tail state, and the store's
//! state files: round trips, every bit flip and truncation detected, owners
//! checked, garbage collection, and crashes during a state write.

mod common;

use std::path::Path;

use ckptfmt::layout::{MANIFEST_VERSION, MANIFEST_VERSION_PLAIN};
use ckptfmt::{
    encode_state, BlockId, CrashMode, ElemType, FaultFs, FaultMode, Fingerprint, FormatError,
    Geometry, LayerGeometry, Manifest, ManifestView, Metadata, StateView, Store,
};
use common::{fp, small_geometry, Rng, Sequence};

/// Three layers: attention (K and V per token), then two recurrent layers
/// with state and no KV, as a hybrid model's; 4 tokens per block.
fn hybrid() -> Geometry {
    let kv = |k, v| LayerGeometry {
        k_bytes_per_token: k,
        v_bytes_per_token: v,
    };
    Geometry::new_hybrid(
        vec![kv(4, 6), kv(0, 0), kv(0, 0)],
        ElemType::F16,
        4,
        vec![0, 300, 212],
    )
    .unwrap()
}

fn manifest_of(g: &Geometry, seq: &Sequence, name: &str, state: Vec<u8>) -> Manifest {
    Manifest::new(
        fp(),
        g.clone(),
        seq.tokens.clone(),
        (0..seq.tokens.len() as i32).collect(),
        seq.tail_kv.clone(),
        Metadata {
            name: name.into(),
            ..Metadata::default()
        },
    )
    .unwrap()
    .with_tail_state(state)
    .unwrap()
}

#[test]
fn geometry_state_round_trips_and_plain_geometries_are_unchanged() {
    let plain = small_geometry();
    let bytes = plain.encode();
    // The version 1 record: 16 bytes, then 8 per layer, byte 9 zero.
    assert_eq!(bytes.len(), 16 + 8 * 2);
    assert_eq!(bytes[9], 0);
    assert!(!plain.has_state());

    let g = hybrid();
    let bytes = g.encode();
    assert_eq!(bytes.len(), 16 + 8 * 3 + 4 * 3);
    assert_eq!(bytes[9], 1);
    assert_eq!(Geometry::decode(&bytes).unwrap(), g);
    assert_eq!(g.state_bytes(), 512);
    assert_eq!(g.state_layers(), &[0, 300, 212]);
    assert_ne!(g.digest(), plain.digest());

    // An unknown flag, or state sizes cut short, are refused.
    let mut bad = bytes.clone();
    bad[9] = 2;
    assert!(Geometry::decode(&bad).is_err());
    assert!(Geometry::decode(&bytes[..bytes.len() - 4]).is_err());
    // No state at all, a size per layer missing, or an absurd size.
    assert!(small_geometry().with_state(vec![0, 0]).is_err());
    assert!(small_geometry().with_state(vec![8]).is_err());
    assert!(small_geometry().with_state(vec![0, u32::MAX]).is_err());

    let parts = g.split_state(&[7u8; 512]).unwrap();
    assert_eq!(
        parts.iter().map(|p| p.len()).collect::<Vec<_>>(),
        vec![0, 300, 212]
    );
    assert!(g.split_state(&[0u8; 511]).is_err());
    assert!(g.diff(&plain).is_some());
}

#[test]
fn state_record_round_trip_and_owner() {
    let g = hybrid();
    let id = BlockId::chain(&fp(), None, &[1, 2, 3, 4]);
    let state = Rng(7).bytes(512);
    let rec = encode_state(&fp(), &g, &id, 4, &state).unwrap();
    assert_eq!(
        rec.len(),
        8192,
        "4096 of header, the payload padded to 4096"
    );
    let v = StateView::parse(&rec).unwrap();
    assert_eq!(v.state(), &state[..]);
    assert_eq!(v.block_id(), id);
    assert_eq!(v.n_tokens(), 4);
    v.check_owner(&fp(), &g, &id).unwrap();

    let other = Fingerprint::of(b"another model");
    assert!(matches!(
        v.check_owner(&other, &g, &id),
        Err(FormatError::FingerprintMismatch { .. })
    ));
    let other_id = BlockId::chain(&fp(), None, &[1, 2, 3, 5]);
    assert!(matches!(
        v.check_owner(&fp(), &g, &other_id),
        Err(FormatError::BlockIdMismatch { .. })
    ));
    let other_g =
        Geometry::new_hybrid(g.layers().to_vec(), ElemType::F16, 4, vec![0, 212, 300]).unwrap();
    assert!(matches!(
        v.check_owner(&fp(), &other_g, &id),
        Err(FormatError::GeometryMismatch { .. })
    ));

    // The writer refuses what could not be read back as this geometry's.
    assert!(encode_state(&fp(), &g, &id, 4, &state[..511]).is_err());
    assert!(encode_state(&fp(), &g, &id, 6, &state).is_err());
    assert!(encode_state(&fp(), &g, &id, 0, &state).is_err());
    assert!(encode_state(&fp(), &small_geometry(), &id, 4, &state).is_err());
}

#[test]
fn every_bit_flip_and_truncation_of_a_state_record_is_detected() {
    let g = hybrid();
    let id = BlockId::chain(&fp(), None, &[9, 8, 7, 6]);
    let rec = encode_state(&fp(), &g, &id, 4, &Rng(3).bytes(512)).unwrap();
    let mut flipped = rec.clone();
    for bit in 0..rec.len() * 8 {
        flipped[bit / 8] ^= 1 << (bit % 8);
        let accepted = StateView::parse(&flipped)
            .and_then(|v| v.check_owner(&fp(), &g, &id))
            .is_ok();
        assert!(!accepted, "flip of bit {bit} went unnoticed");
        flipped[bit / 8] ^= 1 << (bit % 8);
    }
    for len in 0..rec.len() {
        assert!(StateView::parse(&rec[..len]).is_err(), "truncated to {len}");
    }
    let mut longer = rec.clone();
    longer.extend_from_slice(&[0; 4096]);
    assert!(StateView::parse(&longer).is_err());
}

#[test]
fn manifest_carries_its_tail_state_in_version_2() {
    let g = hybrid();
    let seq = Sequence::new(&g, 10, 11);
    let state = Rng(5).bytes(512);
    let m = manifest_of(&g, &seq, "chat", state.clone());
    let bytes = m.encode().unwrap();
    let view = ManifestView::parse(&bytes).unwrap();
    assert_eq!(view.tail_state(), &state[..]);
    assert_eq!(Manifest::decode(&bytes).unwrap(), m);
    assert_eq!(u16::from_le_bytes([bytes[8], bytes[9]]), MANIFEST_VERSION);

    // Without state, a manifest is written as version 1, as before.
    let plain_g = small_geometry();
    let plain = Sequence::new(&plain_g, 10, 11).manifest("plain", None);
    let plain_bytes = plain.encode().unwrap();
    assert_eq!(
        u16::from_le_bytes([plain_bytes[8], plain_bytes[9]]),
        MANIFEST_VERSION_PLAIN
    );
    assert!(plain.tail_state.is_empty());

    // A hybrid manifest needs its state, of the right length.
    let no_state = Manifest::new(
        fp(),
        g.clone(),
        seq.tokens.clone(),
        (0..10).collect(),
        seq.tail_kv.clone(),
        Metadata::default(),
    )
    .unwrap();
    assert!(no_state.encode().is_err());
    assert!(no_state.clone().with_tail_state(vec![0; 100]).is_err());
    // A manifest without tokens has the initial state, which takes no bytes.
    let empty = Manifest::new(
        fp(),
        g.clone(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Metadata::default(),
    )
    .unwrap();
    assert_eq!(Manifest::decode(&empty.encode().unwrap()).unwrap(), empty);

    // Every bit of the manifest, the tail state's included, is checked.
    let mut flipped = bytes.clone();
    for bit in 0..bytes.len() * 8 {
        flipped[bit / 8] ^= 1 << (bit % 8);
        let back = Manifest::decode(&flipped);
        assert!(
            back.as_ref().map_or(true, |b| *b != m) && back.is_err(),
            "flip of bit {bit} went unnoticed"
        );
        flipped[bit / 8] ^= 1 << (bit % 8);
    }
}

#[test]
fn store_keeps_states_by_block_and_collects_orphans() {
    let dir = tempfile::tempdir().unwrap();
    let g = hybrid();
    let store = Store::open(dir.path(), fp(), g.clone()).unwrap();
    let seq = Sequence::new(&g, 10, 21);
    let m = manifest_of(&g, &seq, "chat", Rng(1).bytes(512));
    seq.save(&store, &m).unwrap();
    assert_eq!(
        Store::open(dir.path(), fp(), g.clone()).unwrap().geometry(),
        &g
    );

    // States at the two boundaries of the checkpoint, and one of a block no
    // checkpoint references.
    let states: Vec<Vec<u8>> = (0..2).map(|i| Rng(100 + i).bytes(512)).collect();
    for (i, id) in m.block_ids.iter().enumerate() {
        assert!(store.put_state(id, 4 * (i as u64 + 1), &states[i]).unwrap());
        assert!(!store.put_state(id, 4 * (i as u64 + 1), &states[i]).unwrap());
    }
    let orphan = BlockId::chain(&fp(), None, &[40, 41, 42, 43]);
    store.put_state(&orphan, 4, &states[0]).unwrap();
    for (i, id) in m.block_ids.iter().enumerate() {
        assert!(store.has_state(id).unwrap());
        let back = store.read_state(id).unwrap();
        assert_eq!(back.view().unwrap().state(), &states[i][..]);
    }
    let mut listed = store.list_states().unwrap();
    listed.sort();
    let mut want = vec![m.block_ids[0], m.block_ids[1], orphan];
    want.sort();
    assert_eq!(listed, want);
    // Blocks are still blocks: states are not listed among them.
    assert_eq!(store.list_blocks().unwrap().len(), 2);

    assert_eq!(store.gc().unwrap(), 0, "no block is garbage");
    assert!(!store.has_state(&orphan).unwrap(), "the orphan state is");
    assert!(store.has_state(&m.block_ids[1]).unwrap());

    // A record copied under another block's name is refused.
    std::fs::copy(store.state_path(&m.block_ids[0]), store.state_path(&orphan)).unwrap();
    assert!(matches!(
        store.read_state(&orphan),
        Err(FormatError::BlockIdMismatch { .. })
    ));
    // A damaged record is refused, and deleting it is durable.
    let p = store.state_path(&m.block_ids[1]);
    let mut bytes = std::fs::read(&p).unwrap();
    bytes[4096 + 17] ^= 0x10;
    std::fs::write(&p, &bytes).unwrap();
    assert!(matches!(
        store.read_state(&m.block_ids[1]),
        Err(FormatError::ChecksumMismatch { .. })
    ));
    store.delete_state(&m.block_ids[1]).unwrap();
    assert!(matches!(
        store.read_state(&m.block_ids[1]),
        Err(FormatError::NotFound { .. })
    ));
    // Another model's store never reads these.
    drop(store);
    assert!(Store::open(dir.path(), fp(), small_geometry()).is_err());
}

#[test]
fn a_crash_while_writing_a_state_leaves_it_whole_or_absent() {
    let g = hybrid();
    let id = BlockId::chain(&fp(), None, &[5, 6, 7, 8]);
    let state = Rng(9).bytes(512);
    let open = |fs: &FaultFs| Store::open_with(fs.clone(), Path::new("/s"), fp(), g.clone());
    let fs = FaultFs::new();
    let store = open(&fs).unwrap();
    let before = fs.ops();
    store.put_state(&id, 4, &state).unwrap();
    let total = fs.ops() - before;
    assert!(total >= 3, "write, sync, rename, directory sync: {total}");
    let mut kept = [0usize; 2];
    for k in 0..=total {
        for mode in [
            CrashMode::DropUnsynced,
            CrashMode::Random(1),
            CrashMode::Random(2),
            CrashMode::Reorder(3),
        ] {
            let fs = FaultFs::new();
            let store = open(&fs).unwrap();
            fs.fail_at(Some((fs.ops() + k, FaultMode::Crash)));
            let res = store.put_state(&id, 4, &state);
            assert_eq!(res.is_ok(), k == total, "op {k}: {res:?}");
            fs.crash(mode);
            drop(store);
            let store = open(&fs).unwrap();
            match store.read_state(&id) {
                Ok(s) => {
                    assert_eq!(s.view().unwrap().state(), &state[..]);
                    kept[1] += 1;
                }
                Err(FormatError::NotFound { .. }) => {
                    assert!(k < total, "a state whose write returned must survive");
                    kept[0] += 1;
                }
                Err(e) => panic!("op {k} {mode:?}: damaged state under its final name: {e}"),
            }
            assert_eq!(store.recover().unwrap(), 0, "no temporary file survives");
        }
    }
    assert!(kept[0] > 0 && kept[1] > 0, "{kept:?}");
}
