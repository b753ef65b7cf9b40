//! Criterion benches for the format's hot paths: encoding and verifying a
//! block record, manifest encode/decode, a durable incremental save and a
//! mapped read of a whole checkpoint. Geometry: SmolLM2-135M in f16
//! (30 layers, 384 bytes of K and of V per token), 64 tokens per block.

// `criterion_group!` generates an undocumented public function.
#![allow(missing_docs)]

use std::borrow::Cow;
use std::hint::black_box;

use ckptfmt::{
    encode_block, BlockView, ElemType, Encoding, Fingerprint, Geometry, Manifest, Metadata, Store,
};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};

fn geometry() -> Geometry {
    Geometry::uniform(30, 384, 384, ElemType::F16, 64).expect("valid geometry")
}

fn kv(n: usize, seed: u16) -> Vec<u8> {
    (0..n / 2)
        .flat_map(|i| {
            half::f16::from_f32(((i as u16 ^ seed) % 2000) as f32 / 500.0 - 2.0).to_le_bytes()
        })
        .collect()
}

fn manifest(g: &Geometry, n_tokens: usize, name: &str) -> Manifest {
    let fp = Fingerprint::of(b"bench");
    let tokens: Vec<u32> = (0..n_tokens as u32).map(|t| t * 7 % 49_152).collect();
    let tail = vec![0u8; g.span_bytes((n_tokens % 64) as u64) as usize];
    let meta = Metadata {
        name: name.into(),
        ..Metadata::default()
    };
    Manifest::new(
        fp,
        g.clone(),
        tokens,
        (0..n_tokens as i32).collect(),
        tail,
        meta,
    )
    .expect("valid manifest")
}

fn blocks(c: &mut Criterion) {
    let g = geometry();
    let fp = Fingerprint::of(b"bench");
    let data = kv(g.block_bytes() as usize, 1);
    let tokens: Vec<u32> = (0..64).collect();
    let mut grp = c.benchmark_group("block");
    grp.throughput(Throughput::Bytes(g.block_bytes()));
    grp.bench_function("encode_raw", |b| {
        b.iter(|| {
            encode_block(&fp, &g, None, &tokens, black_box(&data), Encoding::Raw).expect("encode")
        })
    });
    grp.bench_function("encode_q8_0", |b| {
        b.iter(|| {
            encode_block(&fp, &g, None, &tokens, black_box(&data), Encoding::Q8_0).expect("encode")
        })
    });
    let rec = encode_block(&fp, &g, None, &tokens, &data, Encoding::Raw)
        .expect("encode")
        .to_vec();
    grp.bench_function("parse_verify_raw", |b| {
        b.iter(|| {
            BlockView::parse(black_box(&rec))
                .expect("parse")
                .payload()
                .len()
        })
    });
    let q = encode_block(&fp, &g, None, &tokens, &data, Encoding::Q8_0)
        .expect("encode")
        .to_vec();
    grp.bench_function("parse_verify_decode_q8_0", |b| {
        b.iter(|| {
            BlockView::parse(black_box(&q))
                .expect("parse")
                .kv()
                .expect("decode")
                .len()
        })
    });
    grp.finish();
}

fn manifests(c: &mut Criterion) {
    let g = geometry();
    let m = manifest(&g, 4160, "m");
    let bytes = m.encode().expect("encode");
    let mut grp = c.benchmark_group("manifest_4160_tokens");
    grp.throughput(Throughput::Bytes(bytes.len() as u64));
    grp.bench_function("encode", |b| {
        b.iter(|| black_box(&m).encode().expect("encode"))
    });
    grp.bench_function("decode", |b| {
        b.iter(|| Manifest::decode(black_box(&bytes)).expect("decode"))
    });
    grp.finish();
}

fn store(c: &mut Criterion) {
    let g = geometry();
    let dir = tempfile::tempdir().expect("tempdir");
    let st = Store::open(dir.path(), Fingerprint::of(b"bench"), g.clone()).expect("open");
    let data = kv(g.block_bytes() as usize, 2);
    // A 1,024-token base, then each iteration saves a checkpoint extending it by one block.
    let base = manifest(&g, 1024, "base");
    st.save(&base, |_| Ok(Cow::Borrowed(&data[..])), Encoding::Raw)
        .expect("save");
    let mut grp = c.benchmark_group("store");
    grp.sample_size(10);
    grp.throughput(Throughput::Bytes(g.block_bytes()));
    let mut n = 1024;
    grp.bench_function("incremental_save_one_block_durable", |b| {
        b.iter(|| {
            n += 64;
            let m = manifest(&g, n, "grow");
            st.save(&m, |_| Ok(Cow::Borrowed(&data[..])), Encoding::Raw)
                .expect("save")
        })
    });
    grp.throughput(Throughput::Bytes(g.block_bytes() * 16));
    grp.bench_function("mapped_read_verify_1024_tokens", |b| {
        b.iter(|| {
            let m = st.read_manifest("base").expect("manifest");
            let mut total = 0;
            for id in &m.block_ids {
                // SAFETY: the bench owns the directory; nothing modifies its files.
                let mb = unsafe { st.map_block(id) }.expect("map");
                total += mb.view().expect("view").payload().len();
            }
            total
        })
    });
    grp.finish();
}

criterion_group!(benches, blocks, manifests, store);
criterion_main!(benches);
