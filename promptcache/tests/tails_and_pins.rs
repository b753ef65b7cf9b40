//! The prompt cache's policy on a real store over a tiny model: which prefixes get a tail and
//! under which name, what a tail adds to a lookup, pins and clearing a namespace.

use engine::store::{SessionStore, StoreConfig};
use engine::testing::TinyChatModel;
use engine::{Context, ContextParams, Logits, Model, Namespace, SeqId, PAGE_TOKENS};
use promptcache::{Error, StoreExt as _, PIN_PREFIX, TAIL_PREFIX};

/// A model, a context and a store in a temporary directory.
fn setup() -> (tempfile::TempDir, Context, SessionStore) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    TinyChatModel::default().write(&path).unwrap();
    let model = Model::load(&path).unwrap();
    let params = ContextParams {
        n_ctx: 512,
        kv_tokens: 2048,
        n_threads: 1,
        ..ContextParams::default()
    };
    let store = SessionStore::open(
        &dir.path().join("cache"),
        &model,
        StoreConfig::for_context(&params),
    )
    .unwrap();
    let ctx = Context::new(model, params).unwrap();
    (dir, ctx, store)
}

/// `n` tokens of byte text, different for each `seed`.
fn prompt(seed: u32, n: usize) -> Vec<u32> {
    (0..n as u32)
        .map(|i| 32 + (i * 7 + seed * 13) % 90)
        .collect()
}

/// A new sequence of `ctx` in namespace `ns` that has evaluated `tokens`.
fn evaluated(ctx: &mut Context, ns: Option<Namespace>, tokens: &[u32]) -> SeqId {
    let seq = ctx.new_sequence();
    ctx.set_namespace(seq, ns).unwrap();
    ctx.feed(seq, tokens, Logits::None).unwrap();
    seq
}

/// Stores `seq`'s full blocks and the tail of its first `len` tokens, as the server's writer
/// does.
fn store_with_tail(store: &SessionStore, ctx: &Context, seq: SeqId, len: usize) {
    store
        .put_blocks(store.copy_blocks(ctx, seq, 0).unwrap())
        .unwrap();
    let tail = store
        .prompt_cache()
        .tail_of(ctx, seq, len)
        .unwrap()
        .unwrap();
    store.prompt_cache().put_tail(tail).unwrap();
}

#[test]
fn a_tail_is_named_after_its_last_block_and_extends_a_lookup() {
    let (_dir, mut ctx, store) = setup();
    let tokens = prompt(1, 2 * PAGE_TOKENS + 20);
    let seq = evaluated(&mut ctx, None, &tokens);
    let cache = store.prompt_cache();

    // Whole pages, or less than one, leave no partial page to keep.
    assert!(cache.tail_of(&ctx, seq, 2 * PAGE_TOKENS).unwrap().is_none());
    assert!(cache.tail_of(&ctx, seq, PAGE_TOKENS - 1).unwrap().is_none());
    assert!(cache.holds_tail(&ctx, seq, 2 * PAGE_TOKENS));

    let len = 2 * PAGE_TOKENS + 10;
    assert!(!cache.holds_tail(&ctx, seq, len));
    // Blocks alone: the lookup stops at the last full block.
    store
        .put_blocks(store.copy_blocks(&ctx, seq, 0).unwrap())
        .unwrap();
    assert_eq!(cache.find_prefix(&tokens, None).tokens, 2 * PAGE_TOKENS);

    store_with_tail(&store, &ctx, seq, len);
    assert!(cache.holds_tail(&ctx, seq, len));
    let last = ctx.block_ids(seq).unwrap()[1];
    let names = store.checkpoint_names().unwrap();
    assert_eq!(names, [format!("{TAIL_PREFIX}{}", last.to_hex())]);
    assert_eq!(TAIL_PREFIX, "_tail-", "the name stores were written with");
    // The tail adds its tokens to the lookup, up to where the prompt parts from it.
    assert_eq!(cache.find_prefix(&tokens, None).tokens, len);
    let mut other = tokens.clone();
    other[2 * PAGE_TOKENS + 4] ^= 1;
    assert_eq!(cache.find_prefix(&other, None).tokens, 2 * PAGE_TOKENS + 4);
    // And the prompts the cache holds are those of its tails.
    let recent = cache.recent_prompts(10_000, 10).unwrap();
    assert_eq!(recent, [(None, tokens[..len].to_vec())]);
}

#[test]
fn pins_keep_whole_blocks_and_a_cleared_namespace_keeps_only_what_it_names() {
    let (_dir, mut ctx, store) = setup();
    let cache = store.prompt_cache();
    let ns = Namespace::new(&[b"tenant"]);
    let tokens = prompt(2, 2 * PAGE_TOKENS + 5);
    let seq = evaluated(&mut ctx, Some(ns), &tokens);
    store_with_tail(&store, &ctx, seq, tokens.len());

    // Under one block there is nothing to pin.
    let short = cache.pin("x", &tokens[..PAGE_TOKENS - 1], Some(ns), None);
    assert!(matches!(short, Err(Error::InvalidPin(_))), "{short:?}");
    assert_eq!(
        cache
            .pin("a.keep", &tokens, Some(ns), Some(4_000_000_000))
            .unwrap(),
        2 * PAGE_TOKENS
    );
    assert_eq!(
        cache.pin("b.drop", &tokens, Some(ns), None).unwrap(),
        2 * PAGE_TOKENS
    );
    let pins = cache.pins().unwrap();
    let ids: Vec<&str> = pins.iter().map(|p| p.id.as_str()).collect();
    assert_eq!(ids, ["a.keep", "b.drop"]);
    assert_eq!(pins[0].expires_unix, Some(4_000_000_000));
    assert!(pins
        .iter()
        .all(|p| p.namespaced && p.tokens == 2 * PAGE_TOKENS));
    assert!(store.exists(&format!("{PIN_PREFIX}a.keep")).unwrap());

    // Clearing takes the tail and the pins the caller names; the others stay.
    let cleared = cache
        .clear_namespace(ns, &|id| id.starts_with("b."))
        .unwrap();
    let mut gone = cleared.checkpoints.clone();
    gone.sort();
    let last = ctx.block_ids(seq).unwrap()[1];
    assert_eq!(
        gone,
        [
            format!("{PIN_PREFIX}b.drop"),
            format!("{TAIL_PREFIX}{}", last.to_hex())
        ]
    );
    let ids: Vec<String> = cache.pins().unwrap().into_iter().map(|p| p.id).collect();
    assert_eq!(ids, ["a.keep"]);
    assert!(cache.unpin("a.keep").unwrap());
    assert!(!cache.unpin("a.keep").unwrap());
    assert!(cache.pins().unwrap().is_empty());
}
