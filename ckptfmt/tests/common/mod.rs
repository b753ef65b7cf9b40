//! Shared fixtures for the integration tests.
#![allow(dead_code)]

use std::borrow::Cow;

use ckptfmt::{ElemType, Encoding, Fingerprint, Geometry, Manifest, Metadata, Store, Vfs};

/// A small deterministic PRNG (splitmix64) so tests need no extra crates.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

pub fn fp() -> Fingerprint {
    Fingerprint::of(b"test model")
}

/// 2 layers, 4 bytes of K and 6 of V per token, f16, 4 tokens per block.
pub fn small_geometry() -> Geometry {
    Geometry::new(
        vec![
            ckptfmt::LayerGeometry {
                k_bytes_per_token: 4,
                v_bytes_per_token: 6,
            },
            ckptfmt::LayerGeometry {
                k_bytes_per_token: 4,
                v_bytes_per_token: 6,
            },
        ],
        ElemType::F16,
        4,
    )
    .unwrap()
}

/// A sequence: tokens, positions and the raw KV of every token, as spans per block plus the tail.
pub struct Sequence {
    pub geometry: Geometry,
    pub tokens: Vec<u32>,
    pub blocks_kv: Vec<Vec<u8>>,
    pub tail_kv: Vec<u8>,
}

impl Sequence {
    /// KV of each token is derived from (token index, seed) so that a prefix
    /// of a longer sequence has the same blocks as the shorter sequence.
    pub fn new(geometry: &Geometry, n_tokens: usize, seed: u64) -> Self {
        let tpb = geometry.tokens_per_block() as usize;
        let tokens: Vec<u32> = (0..n_tokens as u64)
            .map(|i| ((i * 7919 + seed) % 50_000) as u32)
            .collect();
        let span = |start: usize, n: usize| -> Vec<u8> {
            let mut out = Vec::new();
            for l in geometry.layers() {
                for (part, b) in [(0u64, l.k_bytes_per_token), (1, l.v_bytes_per_token)] {
                    for t in start..start + n {
                        let mut r =
                            Rng(seed ^ ((t as u64) << 8) ^ (part << 60) ^ u64::from(b) << 40);
                        out.extend(r.bytes(b as usize));
                    }
                }
            }
            out
        };
        let n_blocks = n_tokens / tpb;
        let blocks_kv = (0..n_blocks).map(|i| span(i * tpb, tpb)).collect();
        let tail_kv = span(n_blocks * tpb, n_tokens % tpb);
        Sequence {
            geometry: geometry.clone(),
            tokens,
            blocks_kv,
            tail_kv,
        }
    }

    pub fn manifest(&self, name: &str, parent: Option<&str>) -> Manifest {
        let meta = Metadata {
            name: name.into(),
            parent: parent.map(String::from),
            created_unix: 1_700_000_000,
            kv: vec![("app".into(), "test".into())],
        };
        let mut m = Manifest::new(
            fp(),
            self.geometry.clone(),
            self.tokens.clone(),
            (0..self.tokens.len() as i32).collect(),
            self.tail_kv.clone(),
            meta,
        )
        .unwrap();
        m.sampler_state = Some(vec![1, 2, 3, 4, 5]);
        m
    }

    pub fn save<V: Vfs>(
        &self,
        store: &Store<V>,
        m: &Manifest,
    ) -> ckptfmt::Result<ckptfmt::SaveReport> {
        store.save(
            m,
            |i| Ok(Cow::Borrowed(&self.blocks_kv[i][..])),
            Encoding::Raw,
        )
    }
}

/// Checks that checkpoint `name` in `store` is exactly `m` with `seq`'s KV.
pub fn assert_checkpoint<V: Vfs>(store: &Store<V>, m: &Manifest, seq: &Sequence) {
    let back = store.verify_checkpoint(&m.meta.name).unwrap();
    assert_eq!(&back, m);
    for (i, id) in back.block_ids.iter().enumerate() {
        let b = store.read_block(id).unwrap();
        assert_eq!(
            b.view().unwrap().kv().unwrap().as_ref(),
            &seq.blocks_kv[i][..]
        );
    }
}
