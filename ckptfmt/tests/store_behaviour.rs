//! Store behaviour on real files: incremental saves, refusal of foreign
//! data, mapped reads, exports, garbage collection and q8_0 error.

mod common;

use std::borrow::Cow;

use ckptfmt::{
    quant, ElemType, Encoding, Export, Fingerprint, FormatError, Geometry, Manifest, Metadata,
    Store,
};
use common::{assert_checkpoint, fp, small_geometry, Rng, Sequence};

#[test]
fn extending_4096_to_4160_tokens_writes_only_the_new_kv() {
    // SmolLM2-135M in f16: 30 layers, 384 bytes of K and of V per token.
    let g = Geometry::uniform(30, 384, 384, ElemType::F16, 64).unwrap();
    assert_eq!(g.bytes_per_token(), 23_040);
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), fp(), g.clone()).unwrap();
    let kv = vec![0x3cu8; g.block_bytes() as usize];
    let tokens: Vec<u32> = (0..4160).map(|t| t * 3 % 49_152).collect();
    let mk = |n: usize, name: &str| {
        let meta = Metadata {
            name: name.into(),
            parent: None,
            created_unix: 0,
            kv: vec![],
        };
        let tail = vec![1u8; g.span_bytes((n % 64) as u64) as usize];
        Manifest::new(
            fp(),
            g.clone(),
            tokens[..n].to_vec(),
            (0..n as i32).collect(),
            tail,
            meta,
        )
        .unwrap()
    };
    let r1 = store
        .save(
            &mk(4096, "a"),
            |_| Ok(Cow::Borrowed(&kv[..])),
            Encoding::Raw,
        )
        .unwrap();
    assert_eq!(r1.blocks_written, 64);
    let r2 = store
        .save(
            &mk(4160, "b"),
            |_| Ok(Cow::Borrowed(&kv[..])),
            Encoding::Raw,
        )
        .unwrap();
    assert_eq!((r2.blocks_written, r2.blocks_reused), (1, 64));
    let new_kv = 64 * g.bytes_per_token();
    assert!(
        r2.bytes_written <= new_kv + 64 * 1024,
        "wrote {} bytes for {} bytes of new KV",
        r2.bytes_written,
        new_kv
    );
    // Check the report against the files on disk.
    let on_disk = std::fs::metadata(store.block_path(&mk(4160, "b").block_ids[64]))
        .unwrap()
        .len()
        + std::fs::metadata(store.manifest_path("b").unwrap())
            .unwrap()
            .len();
    assert_eq!(on_disk, r2.bytes_written);
}

#[test]
fn foreign_fingerprint_and_geometry_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let g = small_geometry();
    Store::open(dir.path(), fp(), g.clone()).unwrap();
    let e = Store::open(dir.path(), Fingerprint([9; 32]), g.clone()).unwrap_err();
    assert!(matches!(e, FormatError::FingerprintMismatch { .. }), "{e}");
    let g2 = Geometry::uniform(2, 4, 6, ElemType::F16, 8).unwrap();
    let e = Store::open(dir.path(), fp(), g2.clone()).unwrap_err();
    assert!(matches!(e, FormatError::GeometryMismatch { .. }), "{e}");

    // A block file of another store dropped into this one is refused on read.
    let other_dir = tempfile::tempdir().unwrap();
    let other = Store::open(other_dir.path(), Fingerprint([9; 32]), g.clone()).unwrap();
    let seq = Sequence::new(&g, 4, 1);
    let mut m = seq.manifest("x", None);
    m.fingerprint = Fingerprint([9; 32]);
    m.block_ids = ckptfmt::BlockId::chain_all(&m.fingerprint, &m.tokens, 4);
    seq.save(&other, &m).unwrap();
    let store = Store::open_existing(dir.path()).unwrap();
    let id = m.block_ids[0];
    std::fs::copy(other.block_path(&id), store.block_path(&id)).unwrap();
    let e = store.read_block(&id).unwrap_err();
    assert!(
        matches!(e, FormatError::FingerprintMismatch { what: "block", .. }),
        "{e}"
    );
    let e = store.write_manifest(&m).unwrap_err();
    assert!(
        matches!(
            e,
            FormatError::FingerprintMismatch {
                what: "manifest",
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn mapped_blocks_borrow_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let g = small_geometry();
    let store = Store::open(dir.path(), fp(), g.clone()).unwrap();
    let seq = Sequence::new(&g, 13, 7);
    let m = seq.manifest("m", None);
    seq.save(&store, &m).unwrap();
    for (i, id) in m.block_ids.iter().enumerate() {
        // SAFETY: the test owns the directory; nothing modifies the files.
        let mb = unsafe { store.map_block(id) }.unwrap();
        let v = mb.verify().unwrap();
        let kv = v.kv().unwrap();
        assert!(
            matches!(kv, Cow::Borrowed(_)),
            "raw blocks are borrowed from the map"
        );
        assert_eq!(kv.as_ref(), &seq.blocks_kv[i][..]);
        // The payload sits at an aligned offset of the map.
        let off = v.payload().as_ptr() as usize - mb.as_bytes().as_ptr() as usize;
        assert_eq!(off % 4096, 0);
    }
    // SAFETY: as above.
    let missing = unsafe { store.map_block(&ckptfmt::BlockId([1; 32])) }.unwrap_err();
    assert!(matches!(missing, FormatError::NotFound { .. }), "{missing}");
}

#[test]
fn export_file_opens_read_and_mapped() {
    let dir = tempfile::tempdir().unwrap();
    let g = small_geometry();
    let store = Store::open(dir.path().join("s"), fp(), g.clone()).unwrap();
    let seq = Sequence::new(&g, 11, 2);
    let m = seq.manifest("e", None);
    seq.save(&store, &m).unwrap();
    let path = dir.path().join("e.ckpt-export");
    let len = store.export("e", &path).unwrap();
    assert_eq!(len, std::fs::metadata(&path).unwrap().len());
    let read = Export::read(&path).unwrap();
    // SAFETY: the test owns the file; nothing modifies it.
    let mapped = unsafe { Export::map(&path) }.unwrap();
    for ex in [&read, &mapped] {
        let v = ex.view().unwrap();
        assert_eq!(v.manifest(), &m);
        for i in 0..v.n_blocks() {
            assert_eq!(
                v.block(i).unwrap().kv().unwrap().as_ref(),
                &seq.blocks_kv[i][..]
            );
        }
        assert!(v.block(v.n_blocks()).is_err());
    }
}

#[test]
fn gc_removes_only_unreferenced_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let g = small_geometry();
    let store = Store::open(dir.path(), fp(), g.clone()).unwrap();
    let a = Sequence::new(&g, 16, 1);
    let ma = a.manifest("a", None);
    let b = Sequence::new(&g, 8, 99);
    let mb = b.manifest("b", None);
    a.save(&store, &ma).unwrap();
    b.save(&store, &mb).unwrap();
    store.delete_manifest("b").unwrap();
    assert_eq!(store.gc().unwrap(), 2);
    assert_checkpoint(&store, &ma, &a);
    assert_eq!(store.list_blocks().unwrap().len(), 4);
    assert_eq!(store.list_manifests().unwrap(), vec!["a".to_string()]);
}

#[test]
fn bad_names_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), fp(), small_geometry()).unwrap();
    for bad in ["", "../x", "a/b", ".hidden", "x.tmp", "sp ace"] {
        assert!(store.manifest_path(bad).is_err(), "{bad:?}");
    }
    assert!(matches!(
        store.read_manifest("nope"),
        Err(FormatError::NotFound { .. })
    ));
}

/// q8_0 error on KV-like data: values drawn from a normal distribution with
/// per-channel scales and a few outlier channels (as K often has).
#[test]
fn q8_0_error_is_small_on_kv_like_data() {
    let mut rng = Rng(3);
    let n = 64 * 384; // one layer's K of a 64-token block, 384 bytes per token
    let mut raw = Vec::with_capacity(n);
    for i in 0..n / 2 {
        let channel = i % 192;
        let scale = if channel % 37 == 0 { 8.0 } else { 1.0 };
        // Sum of uniforms approximates a normal distribution.
        let g: f32 = (0..4)
            .map(|_| rng.below(1 << 16) as f32 / 65536.0)
            .sum::<f32>()
            - 2.0;
        raw.extend_from_slice(&half::f16::from_f32(g * scale).to_le_bytes());
    }
    let q = quant::quantize_f16(&raw);
    assert_eq!(q.len() as u64, quant::q8_0_len(raw.len() as u64));
    assert!((q.len() as f64 / raw.len() as f64 - 0.53125).abs() < 1e-9);
    let back = quant::dequantize_f16(&q, raw.len() as u64).unwrap();
    let err = quant::measure_error(&raw, &back);
    println!("q8_0 on KV-like data: {err:?}");
    assert!(err.rel_rms < 0.02, "{err:?}");
    assert!(err.max_abs < 8.0 * 2.0 / 127.0, "{err:?}");
}
