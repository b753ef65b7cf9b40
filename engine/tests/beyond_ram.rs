//! Beyond RAM: a context whose pages leave RAM past `ContextParams::kv_ram` for block files,
//! and attends to them where they lie. Spilled evaluation gives the resident one's logits bit
//! for bit, in prefill and in decode, at three lengths (on each side of the length where
//! decoding changes attention kernel, 1,024), reading ahead both ways; pages spill during the
//! prefill and again while decoding; the pool's memory stays within the budget; a damaged
//! block file fails the batch with a typed error and changes nothing, while one unlinked from
//! under the context is still read as written.

mod common;

use std::path::Path;
use std::sync::Arc;

use common::*;
use engine::store::{SessionStore, StoreConfig};
use engine::{Batch, Context, ContextParams, Error, Logits, Model, SeqId, PAGE_TOKENS};

/// A llama-shaped model with heads of 32 (which ggml-sys's attention kernel takes) and a
/// training length of 4,096.
fn model() -> (tempfile::TempDir, Arc<Model>) {
    let mut c = cfg(Shape::Llama, false);
    // Rows of 256 bytes: a page of one layer fills whole memory pages, which leave RAM.
    c.n_embd = 128;
    c.n_head = 4;
    c.n_head_kv = 4;
    c.n_ctx_train = 4096;
    let (dir, model, _) = build(&c, 45);
    (dir, model)
}

const N_BATCH: usize = 64;

fn ctx_params(kv_ram: usize) -> ContextParams {
    let mut p = params(N_BATCH);
    p.n_ctx = 4096;
    p.kv_ram = kv_ram;
    p
}

/// A context spilling past `pages` pages of RAM to a store in `dir`.
fn spilling(model: &Arc<Model>, pages: usize, dir: &Path) -> (Context, SessionStore) {
    let probe = Context::new(model.clone(), ctx_params(0)).unwrap();
    let page = probe.kv_layout().bytes_per_page();
    let mut ctx = Context::new(model.clone(), ctx_params(pages * page)).unwrap();
    let store = SessionStore::open(dir, model, StoreConfig::for_context(ctx.params())).unwrap();
    ctx.spill_to(&store).unwrap();
    (ctx, store)
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn argmax(v: &[f32]) -> u32 {
    (0..v.len()).max_by(|&a, &b| v[a].total_cmp(&v[b])).unwrap() as u32
}

/// Feeds `prompt` to both contexts in batches of `N_BATCH` (every row's logits compared), then
/// decodes `gen` tokens greedily (each step's logits compared). Returns the pages spilled after
/// the prefill and at the end.
fn same_bits(
    resident: &mut Context,
    spilled: &mut Context,
    prompt: &[u32],
    gen: usize,
) -> (usize, usize) {
    let (a, b) = (resident.new_sequence(), spilled.new_sequence());
    for (i, chunk) in prompt.chunks(N_BATCH).enumerate() {
        let want = resident.feed(a, chunk, Logits::All).unwrap();
        let got = spilled.feed(b, chunk, Logits::All).unwrap();
        assert!(
            bits(&got) == bits(&want),
            "prefill chunk {i} of {}: logits differ",
            prompt.len()
        );
    }
    let after_prefill = spilled.stats().pages_spilled;
    let mut last = resident.logits(a).unwrap().to_vec();
    for step in 0..gen {
        let t = argmax(&last);
        let want = resident.feed(a, &[t], Logits::Last).unwrap();
        let got = spilled.feed(b, &[t], Logits::Last).unwrap();
        assert!(
            bits(&got) == bits(&want),
            "decode step {step} after {}: logits differ",
            prompt.len()
        );
        last = want;
    }
    (after_prefill, spilled.stats().pages_spilled)
}

#[test]
fn spilled_pages_give_the_resident_logits_bit_for_bit() {
    let (_m, model) = model();
    // The read-ahead's two ways (which change no bit): with the room this machine's page cache
    // has (far more than these few pages), and with none, in groups of one layer.
    for (len, room) in [(300, None), (700, Some(1)), (1300, None)] {
        let dir = tempfile::tempdir().unwrap();
        let mut resident = Context::new(model.clone(), ctx_params(0)).unwrap();
        let (mut spilled, _store) = spilling(&model, 4, dir.path());
        engine::testing::fix_spill_room(&mut spilled, room);
        let prompt = tokens(len);
        // 70 decoded tokens cross at least one page boundary.
        let (after_prefill, at_end) = same_bits(&mut resident, &mut spilled, &prompt, 70);
        let (tight, group) = engine::testing::spill_read_ahead(&mut spilled).unwrap();
        let n_layers = spilled.kv_layout().n_layers;
        match room {
            Some(_) => assert!(tight && group == 1, "{len}: {tight} {group}"),
            None => assert!(!tight && group == n_layers, "{len}: {tight} {group}"),
        }
        let pages = (len + 70) / PAGE_TOKENS;
        assert!(
            after_prefill >= len / PAGE_TOKENS - 4,
            "{len}: {after_prefill} pages spilled during the prefill"
        );
        assert!(
            at_end > after_prefill,
            "{len}: no page spilled while decoding ({at_end})"
        );
        assert!(at_end < pages, "the first page stays ({at_end} of {pages})");
        let stats = spilled.stats();
        assert!(stats.spill_bytes_read > 0);
        assert_eq!(stats.spill_pages_written as usize, at_end);
        // The spilled pool holds about its budget; the resident one all its pages.
        let (r, s) = (
            resident.kv_resident_bytes().unwrap(),
            spilled.kv_resident_bytes().unwrap(),
        );
        let page = spilled.kv_layout().bytes_per_page();
        assert!(
            s <= 5 * page,
            "{len}: {s} bytes of KV in RAM, budget 4 pages of {page}: {stats:?}"
        );
        assert!(r >= pages * page, "{len}: resident {r}");
    }
}

#[test]
fn the_real_model_spilled_gives_the_resident_logits() {
    let Some(path) = real_model_path() else {
        return;
    };
    let model = Model::load(path).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut resident = Context::new(model.clone(), ctx_params(0)).unwrap();
    let (mut spilled, _store) = spilling(&model, 6, dir.path());
    let prompt: Vec<u32> = (0..1100).map(|i| 100 + (i * 7919) % 40000).collect();
    let (after_prefill, at_end) = same_bits(&mut resident, &mut spilled, &prompt, 60);
    assert!(
        after_prefill > 0 && at_end > after_prefill,
        "{after_prefill} {at_end} {:?}",
        spilled.stats()
    );
}

/// Bytes of every block file under `dir`.
fn block_files(dir: &Path) -> Vec<std::path::PathBuf> {
    engine::testing::files_under(dir)
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "blk"))
        .collect()
}

/// A context whose third batch left one page spilled and not yet read back.
fn one_spilled(model: &Arc<Model>, dir: &Path) -> (Context, SessionStore, SeqId) {
    let (mut ctx, store) = spilling(model, 3, dir);
    let seq = ctx.new_sequence();
    let doc = tokens(3 * N_BATCH);
    for chunk in doc.chunks(N_BATCH) {
        let mut b = Batch::new();
        b.add(seq, chunk, Logits::Last);
        ctx.decode(&b).unwrap();
    }
    assert_eq!(ctx.stats().pages_spilled, 1);
    assert_eq!(block_files(dir).len(), 1);
    (ctx, store, seq)
}

#[test]
fn a_damaged_block_fails_the_batch_and_changes_nothing() {
    let (_m, model) = model();
    let next = tokens(4 * N_BATCH)[3 * N_BATCH..].to_vec();
    type Damage = fn(&Path);
    // Written in place (the same file, as another program might): the map sees it.
    let damages: [(&str, Damage); 2] = [
        ("one byte flipped", |p| {
            let mut b = std::fs::read(p).unwrap();
            let i = b.len() - 100;
            b[i] ^= 0x40;
            std::fs::write(p, b).unwrap();
        }),
        ("cut short", |p| {
            let b = std::fs::read(p).unwrap();
            std::fs::write(p, &b[..b.len() / 2]).unwrap();
        }),
    ];
    for (what, damage) in damages {
        let dir = tempfile::tempdir().unwrap();
        let (mut ctx, _store, seq) = one_spilled(&model, dir.path());
        let before = ctx.logits(seq).unwrap().to_vec();
        for f in block_files(dir.path()) {
            damage(&f);
        }
        let mut b = Batch::new();
        b.add(seq, &next, Logits::Last);
        match ctx.decode(&b) {
            Err(Error::SpilledBlock { .. }) => {}
            other => panic!("{what}: {:?}", other.map(|_| ())),
        }
        assert_eq!(ctx.tokens(seq).unwrap().len(), 3 * N_BATCH, "{what}");
        assert_eq!(bits(ctx.logits(seq).unwrap()), bits(&before), "{what}");
    }
}

#[test]
fn a_spilled_block_collected_from_under_the_context_is_still_read() {
    // A store's collection may unlink a spilled block no checkpoint references: the page was
    // mapped as it spilled, so the context still reads what was written.
    let (_m, model) = model();
    let dir = tempfile::tempdir().unwrap();
    let (mut ctx, _store, seq) = one_spilled(&model, dir.path());
    let mut resident = Context::new(model.clone(), ctx_params(0)).unwrap();
    let r = resident.new_sequence();
    resident
        .feed(r, &tokens(3 * N_BATCH), Logits::Last)
        .unwrap();
    for f in block_files(dir.path()) {
        std::fs::remove_file(f).unwrap();
    }
    let next = tokens(4 * N_BATCH)[3 * N_BATCH..].to_vec();
    let want = resident.feed(r, &next, Logits::Last).unwrap();
    let got = ctx.feed(seq, &next, Logits::Last).unwrap();
    assert_eq!(bits(&got), bits(&want));
}

#[test]
fn a_budget_without_a_store_is_a_typed_error() {
    let (_m, model) = model();
    let probe = Context::new(model.clone(), ctx_params(0)).unwrap();
    let page = probe.kv_layout().bytes_per_page();
    let mut ctx = Context::new(model.clone(), ctx_params(3 * page)).unwrap();
    let seq = ctx.new_sequence();
    let r = ctx.feed(seq, &tokens(6 * N_BATCH), Logits::Last);
    assert!(matches!(r, Err(Error::NoSpillStore { .. })), "{r:?}");
}

#[test]
fn a_spilled_sequence_saves_and_restores_with_the_same_bits() {
    let (_m, model) = model();
    let dir = tempfile::tempdir().unwrap();
    let (mut ctx, store) = spilling(&model, 4, dir.path());
    let seq = ctx.new_sequence();
    let doc = tokens(600);
    ctx.feed(seq, &doc, Logits::Last).unwrap();
    assert!(ctx.stats().pages_spilled > 0);
    store
        .save_seq(&ctx, seq, "long", &Default::default())
        .unwrap();
    let mut fresh = Context::new(model.clone(), ctx_params(0)).unwrap();
    let back = fresh.new_sequence();
    store.restore_seq(&mut fresh, back, "long").unwrap();
    let t = [7u32];
    let want = ctx.feed(seq, &t, Logits::Last).unwrap();
    let got = fresh.feed(back, &t, Logits::Last).unwrap();
    assert_eq!(bits(&got), bits(&want));
}

#[test]
fn a_saved_conversation_resumes_where_its_blocks_lie() {
    let (_m, model) = model();
    let dir = tempfile::tempdir().unwrap();
    let doc = tokens(1000);
    // Computed with everything in RAM, and saved.
    let mut resident = Context::new(model.clone(), ctx_params(0)).unwrap();
    let a = resident.new_sequence();
    resident.feed(a, &doc, Logits::Last).unwrap();
    let store = SessionStore::open(
        dir.path(),
        &model,
        StoreConfig::for_context(resident.params()),
    )
    .unwrap();
    store
        .save_seq(&resident, a, "book", &Default::default())
        .unwrap();

    // Resumed under a budget of 4 pages: the blocks past it are attached in their files.
    let (mut ctx, _) = spilling(&model, 4, dir.path());
    let b = ctx.new_sequence();
    store.restore_seq(&mut ctx, b, "book").unwrap();
    let held = 1000 / PAGE_TOKENS + 1;
    let spilled = ctx.stats().pages_spilled;
    assert!(
        spilled >= held - 4,
        "{spilled} of {held} pages left in their files"
    );
    let page = ctx.kv_layout().bytes_per_page();
    let in_ram = ctx.kv_resident_bytes().unwrap();
    assert!(in_ram <= 4 * page, "{in_ram} bytes in RAM after the resume");
    assert_eq!(
        ctx.stats().spill_pages_written,
        0,
        "nothing was written again"
    );

    // It goes on with the resident context's bits.
    for t in [5u32, 9, 13] {
        let want = resident.feed(a, &[t], Logits::Last).unwrap();
        let got = ctx.feed(b, &[t], Logits::Last).unwrap();
        assert_eq!(bits(&got), bits(&want));
    }

    // A damaged block fails the resume with a typed error, before anything changes.
    let victim = block_files(dir.path())
        .into_iter()
        .nth(3)
        .expect("blocks were saved");
    let mut bytes = std::fs::read(&victim).unwrap();
    let i = bytes.len() - 10;
    bytes[i] ^= 1;
    std::fs::write(&victim, bytes).unwrap();
    let (mut other, _) = spilling(&model, 4, dir.path());
    let c = other.new_sequence();
    let r = store.restore_seq(&mut other, c, "book");
    assert!(r.is_err(), "a damaged block was attached");
    assert!(other.tokens(c).unwrap().is_empty());
}

#[test]
fn a_context_shift_brings_spilled_pages_back_and_keeps_the_bits() {
    let (_m, model) = model();
    let dir = tempfile::tempdir().unwrap();
    let mut resident = Context::new(model.clone(), ctx_params(0)).unwrap();
    let (mut spilled, _store) = spilling(&model, 4, dir.path());
    let (a, b) = (resident.new_sequence(), spilled.new_sequence());
    let doc = tokens(700);
    resident.feed(a, &doc, Logits::Last).unwrap();
    spilled.feed(b, &doc, Logits::Last).unwrap();
    assert!(spilled.stats().pages_spilled > 0);
    resident.shift(a, 4, 300).unwrap();
    spilled.shift(b, 4, 300).unwrap();
    assert_eq!(spilled.stats().pages_spilled, 0, "all back for the shift");
    for t in [3u32, 1, 4, 1, 5] {
        let want = resident.feed(a, &[t], Logits::Last).unwrap();
        let got = spilled.feed(b, &[t], Logits::Last).unwrap();
        assert_eq!(bits(&got), bits(&want));
    }
    assert!(
        spilled.stats().pages_spilled > 0,
        "and out again within the budget"
    );
}

#[test]
fn pages_at_rest_as_q8_0_are_widened_as_a_restore_widens_them() {
    let (_m, model) = model();
    for len in [1000, 1100] {
        let dir = tempfile::tempdir().unwrap();
        let doc = tokens(len);
        let mut a = Context::new(model.clone(), ctx_params(0)).unwrap();
        let sa = a.new_sequence();
        a.feed(sa, &doc, Logits::Last).unwrap();
        let config = StoreConfig {
            stored_type_k: Some(engine::KvType::Q8_0),
            stored_type_v: Some(engine::KvType::Q8_0),
            ..StoreConfig::for_context(a.params())
        };
        let store = SessionStore::open(dir.path(), &model, config).unwrap();
        store.save_seq(&a, sa, "q8", &Default::default()).unwrap();

        // The reference: every page widened into RAM by a restore.
        let mut wide = Context::new(model.clone(), ctx_params(0)).unwrap();
        let sw = wide.new_sequence();
        store.restore_seq(&mut wide, sw, "q8").unwrap();
        // Under a budget: the pages past it attended to as q8_0 in their files.
        let page = wide.kv_layout().bytes_per_page();
        let mut ctx = Context::new(model.clone(), ctx_params(4 * page)).unwrap();
        ctx.spill_to(&store).unwrap();
        let sc = ctx.new_sequence();
        store.restore_seq(&mut ctx, sc, "q8").unwrap();
        let spilled = ctx.stats().pages_spilled;
        assert!(spilled >= len / PAGE_TOKENS - 4, "{len}: {spilled} spilled");
        let read0 = ctx.stats().spill_bytes_read;
        for t in [2u32, 7, 1, 8] {
            let want = wide.feed(sw, &[t], Logits::Last).unwrap();
            let got = ctx.feed(sc, &[t], Logits::Last).unwrap();
            assert_eq!(bits(&got), bits(&want), "{len}");
        }
        // A token reads the spilled pages' K and V at rest: 34 bytes per 32 values.
        let per_token = (ctx.stats().spill_bytes_read - read0) / 4;
        let f16_bytes = (spilled * page) as u64;
        assert_eq!(per_token, f16_bytes / 64 * 34, "{len}");
    }
}

#[test]
fn a_sequence_cut_inside_a_spilled_page_goes_on_with_the_resident_bits() {
    let (_m, model) = model();
    let dir = tempfile::tempdir().unwrap();
    let mut resident = Context::new(model.clone(), ctx_params(0)).unwrap();
    let (mut spilled, _store) = spilling(&model, 4, dir.path());
    let (a, b) = (resident.new_sequence(), spilled.new_sequence());
    let doc = tokens(700);
    resident.feed(a, &doc, Logits::Last).unwrap();
    spilled.feed(b, &doc, Logits::Last).unwrap();
    // Position 237 lies inside page 3, which spilled.
    let before = spilled.stats().pages_spilled;
    assert!(before >= 6);
    let (fa, fb) = (
        resident.fork(a, 301).unwrap(),
        spilled.fork(b, 301).unwrap(),
    );
    resident.truncate(a, 237).unwrap();
    spilled.truncate(b, 237).unwrap();
    let other: Vec<u32> = (0..40).map(|i| (i * 13 + 3) % 97).collect();
    for (ra, rb) in [(a, b), (fa, fb)] {
        let want = resident.feed(ra, &other, Logits::All).unwrap();
        let got = spilled.feed(rb, &other, Logits::All).unwrap();
        assert!(
            bits(&got) == bits(&want),
            "cut at {}",
            resident.tokens(ra).unwrap().len()
        );
    }
}

/// Total memory and swap of this machine, in bytes.
fn memory_and_swap() -> u64 {
    let info = std::fs::read_to_string("/proc/meminfo").unwrap();
    let kib = |key: &str| -> u64 {
        let line = info.lines().find_map(|l| l.strip_prefix(key)).unwrap();
        line.trim().trim_end_matches("kB").trim().parse().unwrap()
    };
    (kib("MemTotal:") + kib("SwapTotal:")) * 1024
}

#[test]
fn a_pool_larger_than_the_machine_is_taken_under_a_budget() {
    let (_m, model) = model();
    let probe = Context::new(model.clone(), ctx_params(0)).unwrap();
    let page = probe.kv_layout().bytes_per_page();
    // A pool of twice the machine's memory and swap.
    let n_ctx = (2 * memory_and_swap() as usize).div_ceil(page) * PAGE_TOKENS;
    let mut p = ctx_params(4 * page);
    p.n_ctx = n_ctx;
    p.past_train = true;
    let overcommit = std::fs::read_to_string("/proc/sys/vm/overcommit_memory").unwrap();
    let mut unbudgeted = p.clone();
    unbudgeted.kv_ram = 0;
    let r = Context::new(model.clone(), unbudgeted);
    match overcommit.trim() {
        // Heuristic overcommit refuses a reservation past memory and swap; strict refuses it
        // whatever the flags; "always" grants it.
        "0" | "2" => assert!(matches!(r, Err(Error::OutOfMemory { .. })), "{r:?}"),
        _ => assert!(r.is_ok(), "{r:?}"),
    }
    drop(r);
    if overcommit.trim() == "2" {
        return;
    }
    // Under a budget only address space is taken, and the context runs and spills.
    let dir = tempfile::tempdir().unwrap();
    let mut ctx = Context::new(model.clone(), p).unwrap();
    let store =
        SessionStore::open(dir.path(), &model, StoreConfig::for_context(ctx.params())).unwrap();
    ctx.spill_to(&store).unwrap();
    let seq = ctx.new_sequence();
    ctx.feed(seq, &tokens(8 * PAGE_TOKENS), Logits::Last)
        .unwrap();
    assert!(ctx.stats().pages_spilled >= 3, "{:?}", ctx.stats());
    assert!(ctx.kv_resident_bytes().unwrap() <= 5 * page);
}
