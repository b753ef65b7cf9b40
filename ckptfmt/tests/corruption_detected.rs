//! Corruption: every single-bit flip of a small checkpoint's headers, index
//! and sections, and many random flips and truncations of whole files, give
//! a typed error. Nothing panics.

mod common;

use ckptfmt::{encode_block, BlockView, Encoding, ExportView, FormatError, Manifest, Store};
use common::{fp, small_geometry, Rng, Sequence};

fn manifest_bytes() -> Vec<u8> {
    let seq = Sequence::new(&small_geometry(), 10, 1);
    seq.manifest("cp", Some("parent")).encode().unwrap()
}

fn block_bytes(encoding: Encoding) -> Vec<u8> {
    let seq = Sequence::new(&small_geometry(), 8, 2);
    let m = seq.manifest("cp", None);
    encode_block(
        &fp(),
        &small_geometry(),
        Some(&m.block_ids[0]),
        m.block_tokens(1).unwrap(),
        &seq.blocks_kv[1],
        encoding,
    )
    .unwrap()
    .to_vec()
}

fn export_bytes() -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("s"), fp(), small_geometry()).unwrap();
    let seq = Sequence::new(&small_geometry(), 10, 3);
    let m = seq.manifest("cp", None);
    seq.save(&store, &m).unwrap();
    let path = dir.path().join("cp.export");
    store.export("cp", &path).unwrap();
    std::fs::read(path).unwrap()
}

/// Flips every bit of `bytes[range]` and checks `parse` fails with a typed
/// corruption error every time.
fn every_bit(
    bytes: &[u8],
    range: std::ops::Range<usize>,
    parse: impl Fn(&[u8]) -> Result<(), FormatError>,
) {
    assert!(parse(bytes).is_ok(), "the intact file must parse");
    let mut b = bytes.to_vec();
    for i in range {
        for bit in 0..8 {
            b[i] ^= 1 << bit;
            match parse(&b) {
                Err(e) => assert!(e.is_corruption(), "byte {i} bit {bit}: {e}"),
                Ok(()) => panic!("flip of byte {i} bit {bit} went undetected"),
            }
            b[i] ^= 1 << bit;
        }
    }
}

fn parse_manifest(b: &[u8]) -> Result<(), FormatError> {
    Manifest::decode(b).map(|_| ())
}

fn parse_block(b: &[u8]) -> Result<(), FormatError> {
    BlockView::parse(b).map(|_| ())
}

fn parse_export(b: &[u8]) -> Result<(), FormatError> {
    ExportView::parse(b)?.verify_all()
}

#[test]
fn every_bit_of_a_manifest_is_covered() {
    let b = manifest_bytes();
    assert_eq!(b.len() % 4096, 0);
    // The whole file: header, section table, sections, tail and padding.
    every_bit(&b, 0..b.len(), parse_manifest);
}

#[test]
fn every_bit_of_a_block_header_is_covered() {
    for enc in [Encoding::Raw, Encoding::Q8_0] {
        let b = block_bytes(enc);
        every_bit(&b, 0..b.len(), parse_block);
    }
}

#[test]
fn every_bit_of_an_export_header_index_and_manifest_is_covered() {
    let b = export_bytes();
    let v = ExportView::parse(&b).unwrap();
    let first_block = 4096 * 3; // header page, index page, manifest page(s)
    assert!(v.n_blocks() == 2 && b.len() > first_block);
    every_bit(&b, 0..first_block, parse_export);
}

#[test]
fn random_flips_of_whole_exports_are_detected() {
    let b = export_bytes();
    let mut rng = Rng(42);
    for _ in 0..3000 {
        let mut c = b.clone();
        let n_flips = 1 + rng.below(4);
        for _ in 0..n_flips {
            let i = rng.below(c.len() as u64) as usize;
            c[i] ^= 1 << rng.below(8);
        }
        match parse_export(&c) {
            Err(e) => assert!(e.is_corruption(), "{e}"),
            Ok(()) => panic!("{n_flips} random flips went undetected"),
        }
    }
}

#[test]
fn every_truncation_is_detected() {
    for (name, b, parse) in [
        (
            "manifest",
            manifest_bytes(),
            parse_manifest as fn(&[u8]) -> Result<(), FormatError>,
        ),
        ("block", block_bytes(Encoding::Raw), parse_block),
        ("export", export_bytes(), parse_export),
    ] {
        for len in 0..b.len() {
            match parse(&b[..len]) {
                Err(e) => assert!(e.is_corruption(), "{name} cut at {len}: {e}"),
                Ok(()) => panic!("{name} truncated to {len} bytes parsed"),
            }
        }
        // Trailing garbage is refused too.
        let mut longer = b.clone();
        longer.push(0);
        assert!(parse(&longer).is_err(), "{name} with a trailing byte");
    }
}

#[test]
fn truncation_names_what_and_where() {
    let b = manifest_bytes();
    let e = Manifest::decode(&b[..100]).unwrap_err();
    assert!(
        matches!(
            e,
            FormatError::Truncated {
                what: "manifest header",
                offset: 0,
                needed: 256,
                available: 100
            }
        ),
        "{e}"
    );
    let e = Manifest::decode(&b[..b.len() - 1]).unwrap_err();
    assert!(
        matches!(
            e,
            FormatError::Truncated {
                what: "manifest",
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn wrong_magic_and_newer_version_are_typed() {
    let mut b = block_bytes(Encoding::Raw);
    b[0] = b'X';
    assert!(matches!(
        BlockView::parse(&b),
        Err(FormatError::BadMagic {
            what: "block header",
            ..
        })
    ));

    // A newer version with a valid checksum: refused as unsupported.
    let mut m = manifest_bytes();
    m[8] = 3;
    let table_end = 256 + 32 * u32::from_le_bytes([m[12], m[13], m[14], m[15]]) as usize;
    let mut h = crc32fast::Hasher::new();
    h.update(&m[..252]);
    h.update(&m[256..table_end]);
    let crc = h.finalize();
    m[252..256].copy_from_slice(&crc.to_le_bytes());
    assert!(matches!(
        Manifest::decode(&m),
        Err(FormatError::UnsupportedVersion {
            what: "manifest",
            found: 3,
            supported: 2
        })
    ));
}

#[test]
fn absurd_lengths_are_refused_without_allocating() {
    // A manifest header claiming a huge file and many sections.
    let mut m = manifest_bytes();
    m[12..16].copy_from_slice(&u32::MAX.to_le_bytes());
    assert!(matches!(
        Manifest::decode(&m),
        Err(FormatError::OutOfBounds { .. })
    ));
    let mut m = manifest_bytes();
    m[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
    let e = Manifest::decode(&m).unwrap_err();
    assert!(e.is_corruption(), "{e}");
}

#[test]
fn flipped_block_file_in_a_store_is_reported_on_read() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), fp(), small_geometry()).unwrap();
    let seq = Sequence::new(&small_geometry(), 12, 5);
    let m = seq.manifest("cp", None);
    seq.save(&store, &m).unwrap();
    let path = store.block_path(&m.block_ids[1]);
    let mut b = std::fs::read(&path).unwrap();
    let payload_at = 4096 + 3;
    b[payload_at] ^= 0x10;
    std::fs::write(&path, &b).unwrap();
    let e = store.verify_checkpoint("cp").unwrap_err();
    assert!(
        matches!(
            e,
            FormatError::ChecksumMismatch {
                what: "block payload",
                offset: 4096,
                ..
            }
        ),
        "{e}"
    );
}
