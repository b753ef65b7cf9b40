//! Recurrent-state snapshots of a hybrid model: resuming at the last boundary
//! of the shared prefix that has one, a damaged snapshot passed over, the
//! budget keeping the snapshots used most recently, and collection removing
//! the snapshots of collected blocks.

mod common;

use std::time::{Duration, SystemTime};

use ckptfmt::{ElemType, Geometry, LayerGeometry, Manifest, Metadata};
use common::{fp, TPB};
use kvstore::{BlockId, Config, KvStore, ModelStore};

/// An attention layer (4 bytes of K and of V per token) and a recurrent one
/// with 96 bytes of state.
fn hybrid() -> Geometry {
    Geometry::new_hybrid(
        vec![
            LayerGeometry {
                k_bytes_per_token: 4,
                v_bytes_per_token: 4,
            },
            LayerGeometry {
                k_bytes_per_token: 0,
                v_bytes_per_token: 0,
            },
        ],
        ElemType::F16,
        TPB,
        vec![0, 96],
    )
    .unwrap()
}

fn state_of(n: u8) -> Vec<u8> {
    (0..96).map(|i| i ^ n).collect()
}

/// Bytes of one state record of [`hybrid`]: a 4096-byte header and the payload padded.
const RECORD: u64 = 8192;

fn open(dir: &std::path::Path, state_budget: u64) -> (KvStore, ModelStore) {
    let cfg = Config {
        background: false,
        state_budget,
        ..Config::default()
    };
    let store = KvStore::open(dir, cfg).unwrap();
    let model = store.model(fp(), hybrid()).unwrap();
    (store, model)
}

fn put_blocks(model: &ModelStore, tokens: &[u32]) -> Vec<BlockId> {
    let bytes = hybrid().block_bytes() as usize;
    model
        .put_sequence(tokens, |i| vec![i as u8; bytes])
        .unwrap()
}

#[test]
fn resume_at_the_last_boundary_with_a_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let (_store, model) = open(dir.path(), 1 << 30);
    let tokens: Vec<u32> = (100..114).collect(); // three blocks and a tail of two
    let ids = put_blocks(&model, &tokens);
    assert_eq!(ids.len(), 3);
    assert!(model.put_state(&ids[0], 4, &state_of(0)).unwrap());
    assert!(model.put_state(&ids[2], 12, &state_of(2)).unwrap());
    assert!(!model.put_state(&ids[2], 12, &state_of(2)).unwrap());

    // The whole prompt again: the snapshot at the end of the third block.
    let hit = model.resume_point(&tokens, &[]).unwrap();
    assert_eq!(hit.n_tokens, 12);
    assert_eq!(hit.block_ids, ids);
    assert_eq!(hit.state, state_of(2));

    // A prompt that parts in the third block shares two blocks, and the second
    // has no snapshot: resume after the first.
    let mut edited = tokens.clone();
    edited[9] = 7;
    let hit = model.resume_point(&edited, &[]).unwrap();
    assert_eq!(hit.n_tokens, 4);
    assert_eq!(hit.block_ids, ids[..1]);
    assert_eq!(hit.state, state_of(0));

    // Nothing shared: start from the beginning with the initial state.
    let hit = model.resume_point(&[1, 2, 3, 4, 5], &[]).unwrap();
    assert_eq!(hit.n_tokens, 0);
    assert!(hit.state.is_empty() && hit.block_ids.is_empty());

    // A damaged snapshot ends the usable prefix there; it is quarantined.
    let p = model.block_files().state_path(&ids[2]);
    let mut bytes = std::fs::read(&p).unwrap();
    bytes[4096 + 5] ^= 1;
    std::fs::write(&p, bytes).unwrap();
    let hit = model.resume_point(&tokens, &[]).unwrap();
    assert_eq!(hit.n_tokens, 4);
    assert_eq!(hit.state, state_of(0));
    assert!(!model.has_state(&ids[2]));
    assert_eq!(model.get_state(&ids[2]).unwrap(), None);
    let set_aside = model.block_files().quarantined().unwrap();
    assert_eq!(set_aside.len(), 1, "{set_aside:?}");
}

#[test]
fn the_budget_keeps_the_snapshots_used_last() {
    let dir = tempfile::tempdir().unwrap();
    let (_store, model) = open(dir.path(), 2 * RECORD);
    let tokens: Vec<u32> = (0..16).collect();
    let ids = put_blocks(&model, &tokens);
    model.put_state(&ids[0], 4, &state_of(0)).unwrap();
    model.put_state(&ids[1], 8, &state_of(1)).unwrap();
    // Ages set by hand (no waiting on the clock): the first used longest ago.
    let age = |id: &BlockId, secs: u64| {
        std::fs::File::options()
            .write(true)
            .open(model.block_files().state_path(id))
            .unwrap()
            .set_modified(SystemTime::now() - Duration::from_secs(secs))
            .unwrap();
    };
    age(&ids[0], 300);
    age(&ids[1], 200);
    model.put_state(&ids[2], 12, &state_of(2)).unwrap();
    let mut kept: Vec<BlockId> = model.states().unwrap().into_iter().map(|s| s.0).collect();
    kept.sort();
    let mut want = vec![ids[1], ids[2]];
    want.sort();
    assert_eq!(kept, want, "the oldest snapshot went");

    // Reading one marks it used: the next write removes the other.
    age(&ids[1], 100);
    age(&ids[2], 50);
    assert_eq!(model.get_state(&ids[1]).unwrap(), Some(state_of(1)));
    model.put_state(&ids[3], 16, &state_of(3)).unwrap();
    let mut kept: Vec<BlockId> = model.states().unwrap().into_iter().map(|s| s.0).collect();
    kept.sort();
    let mut want = vec![ids[1], ids[3]];
    want.sort();
    assert_eq!(kept, want);
    assert!(model.states().unwrap().iter().all(|s| s.1 == RECORD));
}

#[test]
fn collection_removes_the_snapshots_of_collected_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let (store, model) = open(dir.path(), 1 << 30);
    let tokens: Vec<u32> = (50..60).collect(); // two blocks and a tail
    let ids = put_blocks(&model, &tokens);
    let g = hybrid();
    let m = Manifest::new(
        fp(),
        g.clone(),
        tokens.clone(),
        (0..10).collect(),
        vec![0; g.span_bytes(2) as usize],
        Metadata {
            name: "chat".into(),
            ..Metadata::default()
        },
    )
    .unwrap()
    .with_tail_state(state_of(9))
    .unwrap();
    model.save(&m).unwrap();
    model.put_state(&ids[1], 8, &state_of(1)).unwrap();
    // Kept while a checkpoint references the block.
    store.gc().unwrap();
    assert!(model.has_state(&ids[1]));
    assert_eq!(model.load("chat").unwrap().manifest.tail_state, state_of(9));

    model.delete("chat").unwrap();
    store.gc().unwrap();
    assert!(!model.block_files().has_block(&ids[1]).unwrap());
    assert!(
        !model.has_state(&ids[1]),
        "the snapshot went with its block"
    );
}

#[test]
fn a_snapshot_written_on_one_host_resumes_another_through_the_remote_tier() {
    use kvstore::remote::testing::RedisServer;
    let redis = RedisServer::start();
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let host = |dir: &std::path::Path| {
        let ram = Config::default().ram_budget;
        let remote = kvstore::RemoteConfig::new(redis.url());
        common::remote_host(dir, remote, ram, &fp(), hybrid())
    };
    let (_sa, ma) = host(a.path());
    let (_sb, mb) = host(b.path());
    let tokens: Vec<u32> = (200..214).collect();
    let ids = put_blocks(&ma, &tokens);
    let tpb = TPB as usize;
    let blocks: Vec<Vec<u8>> = (0..3)
        .map(|i| vec![i as u8; hybrid().block_bytes() as usize])
        .collect();
    let inputs: Vec<ckptfmt::store::BlockInput<'_>> = (0..3)
        .map(|i: usize| ckptfmt::store::BlockInput {
            prev: i.checked_sub(1).map(|p| &ids[p]),
            tokens: &tokens[i * tpb..(i + 1) * tpb],
            kv: &blocks[i],
        })
        .collect();
    assert_eq!(ma.push_remote(&inputs).unwrap(), 3);
    ma.put_state(&ids[0], 4, &state_of(0)).unwrap();
    ma.put_state(&ids[2], 12, &state_of(2)).unwrap();
    assert!(ma.push_remote_state(&ids[0]).unwrap());
    assert!(ma.push_remote_state(&ids[2]).unwrap());
    assert!(
        !ma.push_remote_state(&ids[2]).unwrap(),
        "held: not sent again"
    );
    assert!(!ma.push_remote_state(&ids[1]).unwrap(), "no snapshot there");

    // The other host holds nothing: blocks and the latest snapshot come from the tier.
    let hit = mb.resume_point(&tokens, &[]).unwrap();
    assert_eq!(hit.n_tokens, 12);
    assert_eq!(hit.block_ids, ids);
    assert_eq!(hit.state, state_of(2));
    assert!(mb.has_state(&ids[2]), "kept locally");

    // A damaged value in the tier is refused (counted), never used.
    let key = ma.remote().unwrap().state_key(&fp(), &hybrid(), &ids[2]);
    let mut conn = redis.connection();
    let mut bad = ma
        .block_files()
        .read_state(&ids[2])
        .unwrap()
        .as_bytes()
        .to_vec();
    bad[4096 + 3] ^= 0x40;
    kvstore::remote::testing::redis::cmd("SET")
        .arg(&key)
        .arg(bad)
        .exec(&mut conn)
        .unwrap();
    let c = tempfile::tempdir().unwrap();
    let (_sc, mc) = host(c.path());
    let hit = mc.resume_point(&tokens, &[]).unwrap();
    assert_eq!(
        hit.n_tokens, 0,
        "the latest snapshot the tier holds is damaged"
    );
    assert!(!mc.has_state(&ids[2]));
    assert_eq!(mc.remote().unwrap().metrics().figures().rejected, 1);
}
