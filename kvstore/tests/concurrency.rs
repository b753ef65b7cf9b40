//! Several threads putting, saving, loading and pinning sessions that share
//! a system prompt, with background spills (of prompts put and never saved)
//! and prefetches; then a reopen.

mod common;

use std::sync::Arc;

use common::*;
use kvstore::{Config, KvStore, StoreError};

fn session_tokens(thread: usize, session: usize) -> Vec<u32> {
    // 3 shared blocks of system prompt, then 2 to 4 blocks of its own, plus a tail.
    let mut t: Vec<u32> = (0..12).collect();
    let own = 8 + 4 * ((thread + session) % 3);
    t.extend((0..own as u32).map(|i| 10_000 * (thread as u32 + 1) + 100 * session as u32 + i));
    t.extend([7, 7]);
    t
}

#[test]
fn threads_share_prefixes_and_sessions() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = Config {
        ram_budget: 40 * block_bytes() as u64,
        max_spill_backlog: 4 * block_bytes() as u64,
        spill_batch_bytes: 3 * block_bytes() as u64,
        ..Config::default()
    };
    let store = Arc::new(KvStore::open(dir.path(), cfg.clone()).unwrap());
    store.model(fp(), geometry()).unwrap();
    let n_threads = 4;
    let n_sessions = 12;
    std::thread::scope(|scope| {
        for t in 0..n_threads {
            let store = Arc::clone(&store);
            scope.spawn(move || {
                let model = store.model(fp(), geometry()).unwrap();
                for s in 0..n_sessions {
                    let tokens = session_tokens(t, s);
                    let hit = model.longest_prefix(&tokens, &[]);
                    assert_eq!(hit.n_tokens % TPB as usize, 0);
                    // A live session pins its blocks while it runs and saves.
                    let ids = kvstore::BlockId::chain_all(&fp(), &tokens, TPB);
                    let live = model
                        .put_sequence_pinned(&tokens, |i| kv_of(&ids[i]))
                        .unwrap();
                    // A prompt cached but never saved: dirty in RAM until spilled.
                    let mut scratch: Vec<u32> = (0..12).collect();
                    scratch
                        .extend((0..8).map(|i| 500_000 + 1_000 * (t * n_sessions + s) as u32 + i));
                    let scratch_ids = kvstore::BlockId::chain_all(&fp(), &scratch, TPB);
                    model
                        .put_sequence(&scratch, |i| kv_of(&scratch_ids[i]))
                        .unwrap();
                    let name = format!("t{t}-s{s}");
                    model.save(&manifest(&name, &tokens)).unwrap();
                    drop(live);
                    // Read back an earlier session of this thread (one not deleted).
                    let mut b = s / 2;
                    if b % 5 == 3 {
                        b -= 1;
                    }
                    let back = format!("t{t}-s{b}");
                    let cp = model.load(&back).unwrap();
                    for (id, kv) in cp.manifest.block_ids.iter().zip(&cp.blocks) {
                        assert_eq!(&kv[..], &kv_of(id)[..]);
                    }
                    match model.pin_all(&ids) {
                        Ok(guard) => {
                            for id in guard.ids() {
                                assert_eq!(&model.get(id).unwrap().unwrap()[..], &kv_of(id)[..]);
                            }
                        }
                        // Other threads' pins may fill the budget.
                        Err(StoreError::RamFull { .. }) => {}
                        Err(e) => panic!("pin: {e}"),
                    }
                    if s % 4 == 3 {
                        model.prefetch(&back).unwrap().wait().unwrap();
                    }
                    if s % 5 == 4 {
                        model.delete(&format!("t{t}-s{}", s - 1)).unwrap();
                        store.gc().unwrap();
                    }
                }
            });
        }
    });
    let m = store.metrics();
    assert!(
        m.dedup_blocks >= (n_threads * n_sessions * 3 - 3) as u64,
        "{m:?}"
    );
    assert!(m.spills > 0, "{m:?}");
    assert!(
        m.ram_bytes <= 40 * block_bytes() as u64 + cfg.max_spill_backlog,
        "{m:?}"
    );
    assert_eq!(m.pinned_bytes, 0);
    let expected: Vec<String> = {
        let mut v: Vec<String> = (0..n_threads)
            .flat_map(|t| (0..n_sessions).map(move |s| (t, s)))
            .filter(|(_, s)| !(s % 5 == 3 && *s + 1 < n_sessions))
            .map(|(t, s)| format!("t{t}-s{s}"))
            .collect();
        v.sort();
        v
    };
    let model = store.model(fp(), geometry()).unwrap();
    assert_eq!(model.list().unwrap(), expected);
    drop(model);
    drop(Arc::try_unwrap(store).unwrap());

    let store = KvStore::open(
        dir.path(),
        Config {
            verify: kvstore::VerifyLevel::Full,
            ..cfg
        },
    )
    .unwrap();
    assert!(store.recovery_report().damaged_checkpoints.is_empty());
    let model = store.model(fp(), geometry()).unwrap();
    assert_eq!(model.list().unwrap(), expected);
    for name in &expected {
        let cp = model.load(name).unwrap();
        for (id, kv) in cp.manifest.block_ids.iter().zip(&cp.blocks) {
            assert_eq!(&kv[..], &kv_of(id)[..]);
        }
    }
}

#[test]
fn concurrent_readers_of_one_cold_session() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = Config {
        ram_budget: 6 * block_bytes() as u64,
        ..Config::default()
    };
    let store = KvStore::open(dir.path(), cfg).unwrap();
    let model = store.model(fp(), geometry()).unwrap();
    let tokens: Vec<u32> = (0..40).collect();
    put_tokens(&model, &tokens).unwrap();
    model.save(&manifest("cold", &tokens)).unwrap();
    put_tokens(&model, &(1000..1040).collect::<Vec<_>>()).unwrap();
    std::thread::scope(|scope| {
        for _ in 0..4 {
            scope.spawn(|| {
                let model = store.model(fp(), geometry()).unwrap();
                for _ in 0..5 {
                    let cp = model.load("cold").unwrap();
                    for (id, kv) in cp.manifest.block_ids.iter().zip(&cp.blocks) {
                        assert_eq!(&kv[..], &kv_of(id)[..]);
                    }
                }
            });
        }
    });
    let m = store.metrics();
    assert!(m.disk_hits > 0 && m.ram_hits > 0, "{m:?}");
}

#[test]
fn store_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<KvStore>();
    check::<KvStore<kvstore::FaultIo>>();
    check::<kvstore::ModelStore>();
    check::<kvstore::PinGuard>();
}
