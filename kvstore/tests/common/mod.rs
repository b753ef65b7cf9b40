//! Helpers shared by the integration tests: a tiny geometry, deterministic
//! block contents and manifests.
#![allow(dead_code)]

use ckptfmt::{ElemType, Fingerprint, Geometry, Manifest, Metadata};
use kvstore::{BlockId, Config, KvStore, ModelStore, Remote, RemoteConfig};

/// Tokens per block of the test geometry.
pub const TPB: u32 = 4;

/// One layer, 4 bytes of K and 4 of V per token: 32 bytes per block.
pub fn geometry() -> Geometry {
    Geometry::uniform(1, 4, 4, ElemType::F16, TPB).unwrap()
}

/// The test model's fingerprint.
pub fn fp() -> Fingerprint {
    Fingerprint::of(b"kvstore test model")
}

/// Bytes of one block.
pub fn block_bytes() -> usize {
    geometry().block_bytes() as usize
}

/// The KV bytes of a block, derived from its id so any copy can be checked.
pub fn kv_of(id: &BlockId) -> Vec<u8> {
    let n = block_bytes();
    (0..n).map(|i| id.0[i % 32] ^ (i as u8)).collect()
}

/// A config for deterministic tests: inline spills, room for `ram_blocks` blocks.
pub fn inline_config(ram_blocks: u64) -> Config {
    Config {
        ram_budget: ram_blocks * block_bytes() as u64,
        disk_quota: 1 << 40,
        background: false,
        ..Config::default()
    }
}

/// Puts every full block of `tokens` with contents from [`kv_of`].
pub fn put_tokens<V: kvstore::BlockIo>(
    model: &ModelStore<V>,
    tokens: &[u32],
) -> kvstore::Result<Vec<BlockId>> {
    let ids = BlockId::chain_all(&fp(), tokens, TPB);
    model.put_sequence(tokens, |i| kv_of(&ids[i]))
}

/// A manifest named `name` over `tokens` (tail KV of zeros).
pub fn manifest(name: &str, tokens: &[u32]) -> Manifest {
    let g = geometry();
    let tail = vec![0u8; g.span_bytes((tokens.len() % TPB as usize) as u64) as usize];
    let positions = (0..tokens.len() as i32).collect();
    let meta = Metadata {
        name: name.into(),
        ..Metadata::default()
    };
    Manifest::new(fp(), g, tokens.to_vec(), positions, tail, meta).unwrap()
}

/// A store in `dir` (one host) whose remote tier is `remote` (namespace `test`), holding up to
/// `ram_budget` bytes of blocks in RAM, and its model `fp` of `geometry`.
pub fn remote_host(
    dir: &std::path::Path,
    mut remote: RemoteConfig,
    ram_budget: u64,
    fp: &Fingerprint,
    geometry: Geometry,
) -> (KvStore, ModelStore) {
    remote.namespace = "test".into();
    let cfg = Config {
        remote: Some(Remote::open(&remote).unwrap()),
        ram_budget,
        ..Config::default()
    };
    let store = KvStore::open(dir, cfg).unwrap();
    let model = store.model(*fp, geometry).unwrap();
    (store, model)
}

/// The bytes of block `i` of `geometry`, different for every block and seed.
pub fn seeded_kv(geometry: &Geometry, seed: u8, i: usize) -> Vec<u8> {
    (0..geometry.block_bytes() as usize)
        .map(|j| (j as u8) ^ ((j >> 8) as u8) ^ (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

/// The lines `model`'s remote tier logs from now on.
pub fn log_of(model: &ModelStore) -> std::sync::Arc<std::sync::Mutex<Vec<String>>> {
    let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let sink = std::sync::Arc::clone(&lines);
    model
        .remote()
        .unwrap()
        .metrics()
        .set_log(move |l| sink.lock().unwrap().push(l));
    lines
}
