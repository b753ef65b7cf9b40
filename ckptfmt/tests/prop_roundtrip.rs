//! Property tests: write then read gives back the input, over random
//! geometries, element types, lengths, encodings and metadata.

mod common;

use std::borrow::Cow;
use std::path::Path;

use ckptfmt::{
    BlockId, ElemType, Encoding, ExportView, FaultFs, Fingerprint, Geometry, LayerGeometry,
    Manifest, ManifestView, Metadata, Store,
};
use common::Rng;
use proptest::prelude::*;

fn arb_geometry() -> impl Strategy<Value = Geometry> {
    (
        prop::collection::vec((1u32..24, 1u32..24), 1..5),
        prop_oneof![
            Just(ElemType::F16),
            Just(ElemType::F32),
            Just(ElemType::BF16),
            Just(ElemType::Q8_0),
            Just(ElemType::Other(200)),
        ],
        1u32..9,
    )
        .prop_map(|(layers, elem, tpb)| {
            let layers = layers
                .into_iter()
                .map(|(k, v)| LayerGeometry {
                    k_bytes_per_token: 2 * k,
                    v_bytes_per_token: 2 * v,
                })
                .collect();
            Geometry::new(layers, elem, tpb).unwrap()
        })
}

fn arb_meta() -> impl Strategy<Value = Metadata> {
    (
        "[a-z0-9_.-]{1,12}",
        prop::option::of("\\PC{0,16}"),
        any::<u64>(),
        prop::collection::vec(("\\PC{0,8}", "\\PC{0,8}"), 0..4),
    )
        .prop_map(|(name, parent, created_unix, kv)| Metadata {
            name: format!("c{name}"),
            parent,
            created_unix,
            kv,
        })
}

struct Case {
    manifest: Manifest,
    blocks: Vec<Vec<u8>>,
}

fn build(geometry: Geometry, n_tokens: usize, seed: u64, sampler: bool, meta: Metadata) -> Case {
    let mut rng = Rng(seed);
    let fp = Fingerprint(rng.bytes(32).try_into().unwrap());
    let tpb = geometry.tokens_per_block() as usize;
    let tokens: Vec<u32> = (0..n_tokens).map(|_| rng.next() as u32).collect();
    let positions: Vec<i32> = (0..n_tokens).map(|_| rng.next() as i32).collect();
    let blocks: Vec<Vec<u8>> = (0..n_tokens / tpb)
        .map(|_| {
            // Finite f16 values so that q8_0 round trips can be compared.
            (0..geometry.block_bytes() / 2)
                .flat_map(|_| {
                    half::f16::from_f32((rng.below(2000) as f32 - 1000.0) / 250.0).to_le_bytes()
                })
                .collect()
        })
        .collect();
    let tail = rng.bytes(geometry.span_bytes((n_tokens % tpb) as u64) as usize);
    let mut manifest = Manifest::new(fp, geometry, tokens, positions, tail, meta).unwrap();
    if sampler {
        let n = rng.below(64) as usize;
        manifest.sampler_state = Some(rng.bytes(n));
    }
    Case { manifest, blocks }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn manifest_encode_decode(g in arb_geometry(), n in 0usize..40, seed in any::<u64>(), sampler in any::<bool>(), meta in arb_meta()) {
        let case = build(g, n, seed, sampler, meta);
        let bytes = case.manifest.encode().unwrap();
        prop_assert_eq!(bytes.len() % 4096, 0);
        let back = Manifest::decode(&bytes).unwrap();
        prop_assert_eq!(&back, &case.manifest);
        let view = ManifestView::parse(&bytes).unwrap();
        prop_assert_eq!(view.tail_kv(), &case.manifest.tail_kv[..]);
        // The tail section is aligned for direct reads.
        let off = view.tail_kv().as_ptr() as usize - bytes.as_ptr() as usize;
        prop_assert_eq!(off % 4096, 0);
    }

    #[test]
    fn store_save_load_and_export(g in arb_geometry(), n in 0usize..40, seed in any::<u64>(), sampler in any::<bool>(), meta in arb_meta(), q8 in any::<bool>()) {
        let case = build(g.clone(), n, seed, sampler, meta);
        let m = &case.manifest;
        let fs = FaultFs::new();
        let store = Store::open_with(fs.clone(), Path::new("/s"), m.fingerprint, g.clone()).unwrap();
        let encoding = if q8 && g.elem() == ElemType::F16 { Encoding::Q8_0 } else { Encoding::Raw };
        let r = store.save(m, |i| Ok(Cow::Borrowed(&case.blocks[i][..])), encoding).unwrap();
        prop_assert_eq!(r.blocks_written, m.block_ids.len());
        let back = store.verify_checkpoint(&m.meta.name).unwrap();
        prop_assert_eq!(&back, m);
        for (i, id) in back.block_ids.iter().enumerate() {
            let b = store.read_block(id).unwrap();
            let v = b.view().unwrap();
            prop_assert_eq!(v.id(), *id);
            prop_assert_eq!(v.tokens(), m.block_tokens(i).unwrap().to_vec());
            prop_assert_eq!(v.encoding(), encoding);
            let kv = v.kv().unwrap();
            if encoding == Encoding::Raw {
                prop_assert_eq!(kv.as_ref(), &case.blocks[i][..]);
            } else {
                prop_assert_eq!(kv.len(), case.blocks[i].len());
                let err = ckptfmt::quant::measure_error(&case.blocks[i], &kv);
                prop_assert!(err.max_abs <= 4.0 / 127.0 * 0.6, "max error {}", err.max_abs);
            }
        }
        // Saving again writes no block.
        let r2 = store.save(m, |_| panic!("no block should be asked for"), encoding).unwrap();
        prop_assert_eq!(r2.blocks_written, 0);
        // Export to one file and read it with nothing but the file.
        store.export(&m.meta.name, Path::new("/s/x.export")).unwrap();
        let bytes = fs.file(Path::new("/s/x.export")).unwrap();
        let ev = ExportView::parse(&bytes).unwrap();
        prop_assert_eq!(ev.manifest(), m);
        ev.verify_all().unwrap();
        // Import into a fresh store gives the same checkpoint.
        let fs2 = FaultFs::new();
        let store2 = Store::open_with(fs2, Path::new("/t"), m.fingerprint, g).unwrap();
        store2.import(&ev).unwrap();
        prop_assert_eq!(&store2.verify_checkpoint(&m.meta.name).unwrap(), m);
    }

    #[test]
    fn split_and_gather_spans_are_inverse(g in arb_geometry(), n in 0u64..12, seed in any::<u64>()) {
        let span = Rng(seed).bytes(g.span_bytes(n) as usize);
        let parts = g.split_span(&span, n).unwrap();
        prop_assert_eq!(parts.len(), g.n_layers());
        for ((k, v), l) in parts.iter().zip(g.layers()) {
            prop_assert_eq!(k.len() as u64, u64::from(l.k_bytes_per_token) * n);
            prop_assert_eq!(v.len() as u64, u64::from(l.v_bytes_per_token) * n);
        }
        let back = g.gather_span(n, |i, is_v| if is_v { parts[i].1 } else { parts[i].0 }).unwrap();
        prop_assert_eq!(back, span.clone());
        prop_assert!(g.split_span(&span[..span.len().saturating_sub(1)], n + u64::from(span.is_empty())).is_err());
    }

    #[test]
    fn geometry_encode_decode(g in arb_geometry()) {
        prop_assert_eq!(Geometry::decode(&g.encode()).unwrap(), g.clone());
        let spans = g.layer_spans(u64::from(g.tokens_per_block()));
        let end = spans.last().map(|s| s.v_offset + s.v_len).unwrap();
        prop_assert_eq!(end, g.block_bytes());
    }

    #[test]
    fn block_ids_depend_on_the_whole_prefix(a in prop::collection::vec(any::<u32>(), 8), b in prop::collection::vec(any::<u32>(), 8)) {
        let fp = Fingerprint([7; 32]);
        let ida = BlockId::chain_all(&fp, &[a.clone(), b.clone()].concat(), 4);
        let idb = BlockId::chain_all(&fp, &[b.clone(), b.clone()].concat(), 4);
        prop_assert_eq!(ida.len(), 4);
        if a != b {
            prop_assert_ne!(ida[3], idb[3]);
        }
        prop_assert_ne!(BlockId::chain_all(&Fingerprint([8; 32]), &a, 4)[0], BlockId::chain_all(&fp, &a, 4)[0]);
    }
}
