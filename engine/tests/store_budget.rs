//! One disk budget for the prompt cache and named saves: pins are never dropped, checkpoints go
//! least recently used first (by last use, not creation), and the cache's collection and a
//! named save's drop tails and named conversations in the same order.

mod common;

use std::path::Path;
use std::time::{Duration, SystemTime};

use common::*;
use engine::store::{
    CheckpointMeta, PrefixCheckpoint, SessionStore, StoreConfig, CACHED_PREFIX, PINNED_PREFIX,
};
use engine::testing::files_under;
use engine::Session;

/// Bytes of every file under `dir`.
fn dir_bytes(dir: &Path) -> u64 {
    files_under(dir)
        .iter()
        .map(|p| p.metadata().unwrap().len())
        .sum()
}

/// Opens the store at `dir` with `disk_bytes` as its budget.
fn open(dir: &Path, model: &engine::Model, disk_bytes: Option<u64>) -> SessionStore {
    let config = StoreConfig {
        ram_bytes: 1 << 20,
        disk_bytes,
        ..StoreConfig::default()
    };
    SessionStore::open(dir, model, config).unwrap()
}

/// Conversation `k`: 150 tokens, two full blocks and a partial page, its own.
fn conv(k: u32) -> Vec<u32> {
    (0..150).map(|i| (i * 7 + k * 13 + 1) % 97).collect()
}

/// A session of the tiny model with room for a conversation.
fn session(model: &std::sync::Arc<engine::Model>) -> Session {
    let mut p = params(512);
    p.n_ctx = 256;
    Session::new(model.clone(), p).unwrap()
}

/// Saves conversation `k` as `name`; returns the checkpoints the budget dropped.
fn save(store: &SessionStore, s: &mut Session, k: u32, name: &str) -> Vec<String> {
    s.clear();
    s.feed(&conv(k)).unwrap();
    store
        .save(s, name, &CheckpointMeta::default())
        .unwrap()
        .evicted
}

/// Stores conversation `k` as the prompt cache does (blocks, then its tail); returns the tail's
/// name.
fn cache(store: &SessionStore, s: &mut Session, k: u32) -> String {
    let before = names(store);
    s.clear();
    s.feed(&conv(k)).unwrap();
    let blocks = store.copy_blocks(s.context(), s.seq(), 0).unwrap();
    store.put_blocks(blocks).unwrap();
    store.flush().unwrap();
    let tail = store
        .copy_prefix(s.context(), s.seq(), 150)
        .unwrap()
        .unwrap();
    let last = s.context().block_ids(s.seq()).unwrap()[150 / engine::PAGE_TOKENS - 1];
    store
        .save_prefix(&format!("{CACHED_PREFIX}{}", last.to_hex()), tail)
        .unwrap();
    let mut new: Vec<String> = names(store)
        .into_iter()
        .filter(|n| !before.contains(n))
        .collect();
    assert_eq!(new.len(), 1, "{new:?}");
    let name = new.remove(0);
    assert!(name.starts_with(CACHED_PREFIX), "{name}");
    name
}

/// The store's checkpoints, by name.
fn names(store: &SessionStore) -> Vec<String> {
    store
        .checkpoints()
        .unwrap()
        .into_iter()
        .map(|c| c.name)
        .collect()
}

/// Marks checkpoint `name` as used at `at` seconds after a fixed moment, as the prompt cache
/// marks a tail it uses: its manifest's modification time is its last use.
fn used_at(dir: &Path, name: &str, at: u64) {
    let file = files_under(dir)
        .into_iter()
        .find(|p| {
            p.parent().and_then(Path::file_name) == Some("manifests".as_ref())
                && p.file_stem() == Some(name.as_ref())
        })
        .unwrap_or_else(|| panic!("no manifest for {name}"));
    let when = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000 + at);
    std::fs::File::options()
        .write(true)
        .open(file)
        .unwrap()
        .set_modified(when)
        .unwrap();
}

#[test]
fn a_named_save_over_budget_never_drops_a_pin_nor_a_claimed_conversation() {
    let (dir, model, _) = build(&cfg(Shape::Llama, false), 41);
    let root = dir.path().join("store");
    let mut s = session(&model);
    {
        let store = open(&root, &model, None);
        save(&store, &mut s, 0, "old");
        // The pin keeps the blocks of the oldest conversation.
        let full = conv(0).len() / engine::PAGE_TOKENS * engine::PAGE_TOKENS;
        let pin = PrefixCheckpoint {
            tokens: conv(0)[..full].to_vec(),
            ..PrefixCheckpoint::default()
        };
        store
            .save_prefix(&format!("{PINNED_PREFIX}system"), pin)
            .unwrap();
        save(&store, &mut s, 1, "held");
    }
    // Room for what is there: the next save must drop what it can.
    let store = open(&root, &model, Some(dir_bytes(&root)));
    let _chat = kvstore::claim(&root, "held").unwrap();
    let evicted = save(&store, &mut s, 2, "new");
    assert_eq!(evicted, ["old"]);
    let pins: Vec<String> = names(&store)
        .into_iter()
        .filter(|n| n.starts_with(PINNED_PREFIX))
        .collect();
    assert_eq!(pins, ["_pin-system"], "the budget dropped the pin");
    assert!(store.exists("held").unwrap() && store.exists("new").unwrap());
}

#[test]
fn checkpoints_go_by_last_use_not_by_creation() {
    let (dir, model, _) = build(&cfg(Shape::Llama, false), 42);
    let root = dir.path().join("store");
    let mut s = session(&model);
    {
        let store = open(&root, &model, None);
        save(&store, &mut s, 0, "used");
        save(&store, &mut s, 1, "idle");
        // Created first, used last: restoring a conversation is a use.
        store.restore(&mut s, "used").unwrap();
        assert_eq!(s.tokens(), &conv(0)[..]);
    }
    let store = open(&root, &model, Some(dir_bytes(&root)));
    let evicted = save(&store, &mut s, 2, "third");
    assert_eq!(evicted, ["idle"]);
    assert!(store.exists("used").unwrap());
    store.restore(&mut s, "used").unwrap();
}

/// Stores two named conversations and two tails in `root`, created in one order and used in
/// another; returns the checkpoints from least to most recently used.
fn mixed(model: &std::sync::Arc<engine::Model>, root: &Path) -> Vec<String> {
    let mut s = session(model);
    let store = open(root, model, None);
    save(&store, &mut s, 0, "b");
    let t2 = cache(&store, &mut s, 1);
    save(&store, &mut s, 2, "a");
    let t1 = cache(&store, &mut s, 3);
    let order = vec!["a".to_owned(), t1, "b".to_owned(), t2];
    for (at, name) in order.iter().enumerate() {
        used_at(root, name, at as u64);
    }
    order
}

/// Asserts that the checkpoints of `order` missing from `store` are its first ones (and at
/// least one); returns how many.
fn dropped_oldest_first(store: &SessionStore, order: &[String], who: &str) -> usize {
    let left = names(store);
    let gone: Vec<bool> = order.iter().map(|n| !left.contains(n)).collect();
    let n = gone.iter().take_while(|g| **g).count();
    assert!(n > 0, "{who} dropped nothing: {left:?}");
    assert!(
        gone[n..].iter().all(|g| !g),
        "{who} dropped out of order: {gone:?} of {order:?}"
    );
    n
}

#[test]
fn the_cache_and_a_named_save_drop_tails_and_conversations_in_one_order() {
    let (dir, model, _) = build(&cfg(Shape::Llama, false), 43);
    let (by_cache, by_save) = (dir.path().join("cache"), dir.path().join("save"));
    let order = mixed(&model, &by_cache);
    let same = mixed(&model, &by_save);
    assert_eq!(order.len(), same.len());

    // The prompt cache makes room for two conversations' worth of bytes ...
    let store = open(&by_cache, &model, Some(dir_bytes(&by_cache)));
    let incoming = dir_bytes(&by_cache) / 2;
    store.keep_budget(None, incoming).unwrap();
    let n_cache = dropped_oldest_first(&store, &order, "the prompt cache");
    assert!(n_cache >= 2, "a conversation and a tail: {order:?}");

    // ... and a named save of one conversation needs as much.
    let store = open(&by_save, &model, Some(dir_bytes(&by_save)));
    let evicted = save(&store, &mut session(&model), 4, "c");
    let n_save = dropped_oldest_first(&store, &same, "a named save");
    assert_eq!(evicted, same[..n_save]);
    assert!(store.exists("c").unwrap());
}
