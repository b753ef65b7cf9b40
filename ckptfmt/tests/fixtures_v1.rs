//! Golden files: committed version-1 files must keep decoding to the same
//! content, and the writer must keep producing them byte for byte. Regenerate
//! (after a deliberate format change, with a version bump) by running this
//! test with `CKPTFMT_BLESS=1`.

use std::path::PathBuf;

use ckptfmt::{
    encode_block, BlockId, BlockView, ElemType, Encoding, ExportView, Fingerprint, FormatError,
    Geometry, LayerGeometry, Manifest, Metadata,
};

fn data_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data")
}

fn geometry() -> Geometry {
    let layers = vec![
        LayerGeometry {
            k_bytes_per_token: 4,
            v_bytes_per_token: 4,
        },
        LayerGeometry {
            k_bytes_per_token: 2,
            v_bytes_per_token: 6,
        },
    ];
    Geometry::new(layers, ElemType::F16, 4).unwrap()
}

fn kv(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// The fixture checkpoint: 10 tokens (two blocks and a tail of two).
fn fixture() -> (Manifest, Vec<Vec<u8>>) {
    let g = geometry();
    let fp = Fingerprint([0xab; 32]);
    let tokens: Vec<u32> = vec![1, 15043, 29892, 920, 526, 366, 29973, 13, 2, 0xFFFF_FFFF];
    let meta = Metadata {
        name: "golden".into(),
        parent: Some("root".into()),
        created_unix: 1_700_000_000,
        kv: vec![
            ("model".into(), "SmolLM2-135M".into()),
            ("ü".into(), "".into()),
        ],
    };
    let mut m = Manifest::new(
        fp,
        g.clone(),
        tokens,
        (0..10).collect(),
        kv(g.span_bytes(2) as usize, 7),
        meta,
    )
    .unwrap();
    m.sampler_state = Some(b"seed=42".to_vec());
    let blocks = (0..2).map(|i| kv(g.block_bytes() as usize, i)).collect();
    (m, blocks)
}

fn files() -> Vec<(&'static str, Vec<u8>)> {
    let (m, blocks) = fixture();
    let g = geometry();
    let b0 = encode_block(
        &m.fingerprint,
        &g,
        None,
        m.block_tokens(0).unwrap(),
        &blocks[0],
        Encoding::Raw,
    )
    .unwrap();
    let b1 = encode_block(
        &m.fingerprint,
        &g,
        Some(&m.block_ids[0]),
        m.block_tokens(1).unwrap(),
        &blocks[1],
        Encoding::Q8_0,
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("x");
    let recs = [b0.to_vec(), b1.to_vec()];
    ckptfmt::Export::write(&path, &m, &[&recs[0], &recs[1]]).unwrap();
    vec![
        ("v1_manifest.ckpt", m.encode().unwrap()),
        ("v1_block_raw.blk", recs[0].clone()),
        ("v1_block_q8_0.blk", recs[1].clone()),
        ("v1_export.ckptx", std::fs::read(path).unwrap()),
    ]
}

#[test]
fn writer_reproduces_the_golden_files() {
    let bless = std::env::var_os("CKPTFMT_BLESS").is_some();
    for (name, bytes) in files() {
        let p = data_dir().join(name);
        if bless {
            std::fs::create_dir_all(data_dir()).unwrap();
            std::fs::write(&p, &bytes).unwrap();
        }
        let golden =
            std::fs::read(&p).unwrap_or_else(|e| panic!("{name}: {e}; run with CKPTFMT_BLESS=1"));
        assert!(
            golden == bytes,
            "{name} differs from what the writer produces now"
        );
    }
}

#[test]
fn golden_files_decode_to_the_fixture() {
    let (m, blocks) = fixture();
    let read = |n: &str| std::fs::read(data_dir().join(n)).unwrap();
    assert_eq!(Manifest::decode(&read("v1_manifest.ckpt")).unwrap(), m);
    let raw = read("v1_block_raw.blk");
    let v = BlockView::parse(&raw).unwrap();
    assert_eq!(v.kv().unwrap().as_ref(), &blocks[0][..]);
    assert_eq!(v.id(), m.block_ids[0]);
    let q = read("v1_block_q8_0.blk");
    let v = BlockView::parse(&q).unwrap();
    assert_eq!(
        (v.encoding(), v.prev()),
        (Encoding::Q8_0, Some(m.block_ids[0]))
    );
    let ex = read("v1_export.ckptx");
    let ev = ExportView::parse(&ex).unwrap();
    assert_eq!(ev.manifest(), &m);
    ev.verify_all().unwrap();
}

#[test]
fn damaged_golden_files_fail_with_the_exact_error() {
    let mut m = std::fs::read(data_dir().join("v1_manifest.ckpt")).unwrap();
    let last = m.len() - 1;
    m[last] = 1; // padding after the tail
    assert!(matches!(
        Manifest::decode(&m),
        Err(FormatError::Invalid {
            what: "manifest padding",
            ..
        })
    ));
    let mut b = std::fs::read(data_dir().join("v1_block_raw.blk")).unwrap();
    b[4096] ^= 0x80; // first payload byte
    assert!(matches!(
        BlockView::parse(&b),
        Err(FormatError::ChecksumMismatch {
            what: "block payload",
            offset: 4096,
            ..
        })
    ));
    b.truncate(5000);
    assert!(matches!(
        BlockView::parse(&b),
        Err(FormatError::Truncated {
            what: "block record",
            ..
        })
    ));
}

/// The block id follows the formula in FORMAT.md §4.3, byte for byte.
#[test]
fn block_id_matches_the_documented_formula() {
    let fp = Fingerprint([0xab; 32]);
    let tokens = [1u32, 2, 3, 4];
    let mut bytes = b"ckptfmt/block-id/v1".to_vec();
    bytes.extend_from_slice(&fp.0);
    bytes.push(0);
    bytes.extend_from_slice(&4u64.to_le_bytes());
    for t in tokens {
        bytes.extend_from_slice(&t.to_le_bytes());
    }
    let first = BlockId(*blake3::hash(&bytes).as_bytes());
    assert_eq!(BlockId::chain(&fp, None, &tokens), first);

    let mut bytes = b"ckptfmt/block-id/v1".to_vec();
    bytes.extend_from_slice(&fp.0);
    bytes.push(1);
    bytes.extend_from_slice(&first.0);
    bytes.extend_from_slice(&4u64.to_le_bytes());
    for t in tokens {
        bytes.extend_from_slice(&t.to_le_bytes());
    }
    assert_eq!(
        BlockId::chain(&fp, Some(&first), &tokens),
        BlockId(*blake3::hash(&bytes).as_bytes())
    );
    // Pinned value: changing it breaks every stored block name.
    assert_eq!(first.to_hex(), include_str!("data/v1_block_id.txt").trim());
}
