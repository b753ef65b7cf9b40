//! Chain roots (FORMAT.md §4.3, section CHAIN_ROOTS): a manifest whose block ids start again
//! from opaque roots round-trips, its ids differ from the plain chain from the first rooted
//! block on, a store saves and verifies its blocks under those ids, and malformed roots are
//! refused. A manifest without roots is written as before (no CHAIN_ROOTS section).

mod common;

use ckptfmt::layout::section;
use ckptfmt::{BlockId, ChainRoot, FormatError, Manifest, Store};
use common::*;

fn root(block: u64, byte: u8) -> ChainRoot {
    ChainRoot {
        block,
        id: BlockId([byte; 32]),
    }
}

/// Kinds of the sections of an encoded manifest, from its table.
fn section_kinds(bytes: &[u8]) -> Vec<u32> {
    let n = u32::from_le_bytes(bytes[12..16].try_into().unwrap()) as usize;
    (0..n)
        .map(|i| {
            let at = 256 + 32 * i;
            u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap())
        })
        .collect()
}

#[test]
fn rooted_ids_round_trip_and_differ_from_the_plain_chain() {
    let g = small_geometry();
    let seq = Sequence::new(&g, 22, 3); // 5 full blocks of 4, a tail of 2
    let plain = seq.manifest("plain", None);
    let plain_bytes = plain.encode().unwrap();
    assert!(!section_kinds(&plain_bytes).contains(&section::CHAIN_ROOTS));
    assert!(Manifest::decode(&plain_bytes)
        .unwrap()
        .chain_roots
        .is_empty());

    let roots = vec![root(1, 7), root(3, 9), root(5, 11)];
    let rooted = seq
        .manifest("rooted", None)
        .with_chain_roots(roots.clone())
        .unwrap();
    assert_eq!(rooted.block_ids[0], plain.block_ids[0]);
    for i in 1..5 {
        assert_ne!(rooted.block_ids[i], plain.block_ids[i], "block {i}");
    }
    assert_eq!(
        rooted.block_ids[1],
        BlockId::chain(&fp(), Some(&roots[0].id), &seq.tokens[4..8])
    );
    assert_eq!(
        rooted.block_ids[2],
        BlockId::chain(&fp(), Some(&rooted.block_ids[1]), &seq.tokens[8..12])
    );
    assert_eq!(rooted.prev_id(3), Some(&roots[1].id));
    assert_eq!(rooted.prev_id(4), Some(&rooted.block_ids[3]));
    assert_eq!(rooted.prev_id(0), None);

    let bytes = rooted.encode().unwrap();
    assert!(section_kinds(&bytes).contains(&section::CHAIN_ROOTS));
    let back = Manifest::decode(&bytes).unwrap();
    assert_eq!(back, rooted);
    assert_eq!(back.chain_roots, roots);

    // A root at block 0 breaks the chain from the very first block.
    let from_zero = seq
        .manifest("zero", None)
        .with_chain_roots(vec![root(0, 1)])
        .unwrap();
    assert_ne!(from_zero.block_ids[0], plain.block_ids[0]);
    assert_eq!(
        Manifest::decode(&from_zero.encode().unwrap()).unwrap(),
        from_zero
    );
}

#[test]
fn malformed_roots_are_refused() {
    let g = small_geometry();
    let seq = Sequence::new(&g, 22, 3);
    for roots in [
        vec![root(2, 1), root(1, 2)],
        vec![root(2, 1), root(2, 2)],
        vec![root(6, 1)],
    ] {
        let err = seq
            .manifest("bad", None)
            .with_chain_roots(roots.clone())
            .unwrap_err();
        assert!(
            matches!(err, FormatError::Invalid { .. }),
            "{roots:?}: {err}"
        );
    }
    // Ids that do not follow from the roots: the roots changed after the ids were computed.
    let mut m = seq
        .manifest("m", None)
        .with_chain_roots(vec![root(2, 1)])
        .unwrap();
    m.chain_roots[0].id = BlockId([2; 32]);
    assert!(matches!(
        m.encode().unwrap_err(),
        FormatError::BlockIdMismatch { .. }
    ));
    // Plain ids with a root claimed: refused too.
    let mut m = seq.manifest("m", None);
    m.chain_roots = vec![root(2, 1)];
    assert!(matches!(
        m.validate().unwrap_err(),
        FormatError::BlockIdMismatch { .. }
    ));
}

#[test]
fn a_store_saves_and_verifies_rooted_blocks() {
    let g = small_geometry();
    let seq = Sequence::new(&g, 22, 5);
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), fp(), g.clone()).unwrap();
    let rooted = seq
        .manifest("rooted", None)
        .with_chain_roots(vec![root(2, 4)])
        .unwrap();
    let report = seq.save(&store, &rooted).unwrap();
    assert_eq!(report.blocks_written, 5);
    assert_checkpoint(&store, &rooted, &seq);
    // Each block file records what it chains from: the root for block 2.
    let b2 = store.read_block(&rooted.block_ids[2]).unwrap();
    assert_eq!(b2.view().unwrap().prev(), Some(BlockId([4; 32])));

    // The plain checkpoint of the same tokens shares only the blocks before the root.
    let plain = seq.manifest("plain", None);
    let report = seq.save(&store, &plain).unwrap();
    assert_eq!((report.blocks_reused, report.blocks_written), (2, 3));
    assert_checkpoint(&store, &plain, &seq);
    assert_checkpoint(&store, &rooted, &seq);
}
