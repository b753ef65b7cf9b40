//! Offloaded layers (`ModelParams::n_gpu_layers`): weights copied into the device's memory, the
//! KV of those layers in device buffers, every graph split by ggml's backend scheduler.
//!
//! Without a GPU the offload device is the CPU itself, which runs exactly the kernels of the
//! plain path, so everything must match bit for bit: logits, and the checkpoint bytes of every
//! page, whichever context wrote them. With `LLAMA_HDD_TEST_GPU=1` (a `cuda` or `metal` build on
//! a machine with a GPU: `scripts/gpu-check.sh`) the device is GPU 0 and logits are compared
//! within tolerance, pages moved across by their bytes.

mod common;

use std::path::Path;
use std::sync::Arc;

use common::gpt_oss;
use common::*;
use engine::{
    Batch, Context, ContextParams, Error, Logits, Model, ModelParams, OffloadDevice, Session,
    PAGE_TOKENS,
};

/// The device under test and whether its results must equal the CPU's bit for bit.
fn device() -> (OffloadDevice, bool) {
    match std::env::var("LLAMA_HDD_TEST_GPU").as_deref() {
        Ok("1") => (OffloadDevice::Gpu(0), false),
        _ => (OffloadDevice::Cpu, true),
    }
}

fn load(path: &Path, n_gpu_layers: usize) -> Arc<Model> {
    let params = ModelParams {
        n_gpu_layers,
        device: device().0,
        ..ModelParams::default()
    };
    Model::load_with(path, &params).unwrap()
}

fn same(got: &[f32], want: &[f32], what: &str) {
    if device().1 {
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert!(bits(got) == bits(want), "{what}: logits differ");
    } else {
        assert_close(got, want, 5e-2, what);
    }
}

#[test]
fn offloaded_layers_compute_what_the_cpu_computes() {
    for (shape, tied) in [
        (Shape::Llama, false),
        (Shape::Llama, true),
        (Shape::Qwen2, false),
    ] {
        let c = cfg(shape, tied);
        let (dir, plain, w) = build(&c, 31);
        let path = dir.path().join("tiny.gguf");
        let toks = tokens(100);
        let want = reference(&c, &w, &toks);
        let mut base = Session::new(plain, params(32)).unwrap();
        let base_logits = base.feed_all_logits(&toks).unwrap();
        let base_next = base.feed(&[3]).unwrap().to_vec();
        // Part of the layers, all of them, and all of them with the output head.
        for ngl in [1, c.n_layer, c.n_layer + 1] {
            let model = load(&path, ngl);
            assert_eq!(model.n_offloaded_layers(), ngl.min(c.n_layer));
            assert!(model.offload_device().is_some());
            let mut s = Session::new(model, params(32)).unwrap();
            let got = s.feed_all_logits(&toks).unwrap();
            let what = format!(
                "qwen2 {} tied {tied} ngl {ngl}",
                matches!(shape, Shape::Qwen2)
            );
            same(&got, &base_logits, &what);
            // And both against the naive forward pass, so neither can be wrong alike.
            let last = &got[(toks.len() - 1) * c.n_vocab..];
            assert_close(last, want.last().unwrap(), 5e-2, &what);
            let next = s.feed(&[3]).unwrap().to_vec();
            same(&next, &base_next, &what);
        }
    }
}

#[test]
fn offloaded_gpt_oss_computes_what_the_cpu_computes() {
    // MXFP4 experts with their biases (`mul_mat_id`, `add_id`, `swiglu_oai`) and attention
    // sinks, where the scheduler puts the layers.
    let (dir, plain, w) = gpt_oss::build(31);
    let path = dir.path().join("gpt-oss.gguf");
    let toks = tokens(100);
    let want = gpt_oss::reference(&w, &toks, gpt_oss::Attention::Fused);
    let mut base = Session::new(plain, params(32)).unwrap();
    let base_logits = base.feed_all_logits(&toks).unwrap();
    for ngl in [1, gpt_oss::N_LAYER + 1] {
        let mut s = Session::new(load(&path, ngl), params(32)).unwrap();
        let got = s.feed_all_logits(&toks).unwrap();
        let what = format!("gpt-oss ngl {ngl}");
        same(&got, &base_logits, &what);
        let last = &got[(toks.len() - 1) * gpt_oss::N_VOCAB..];
        assert_close(last, want.last().unwrap(), 5e-2, &what);
    }
}

/// Feeds `toks` into a fresh session and returns it.
fn fed(model: &Arc<Model>, toks: &[u32]) -> Session {
    let mut s = Session::new(model.clone(), params(32)).unwrap();
    s.feed(toks).unwrap();
    s
}

#[test]
fn pages_written_on_the_device_are_the_bytes_the_cpu_writes() {
    let c = cfg(Shape::Llama, false);
    let (dir, plain, _w) = build(&c, 32);
    let path = dir.path().join("tiny.gguf");
    let offloaded = load(&path, c.n_layer + 1);
    let toks = tokens(PAGE_TOKENS + 40);

    let on_cpu = fed(&plain, &toks);
    let on_device = fed(&offloaded, &toks);
    let (cpu_pages, dev_pages) = (export_pages(&on_cpu), export_pages(&on_device));
    assert_eq!(dev_pages.blocks.len(), 1);
    assert!(!dev_pages.tail.is_empty());
    if device().1 {
        assert!(dev_pages.blocks == cpu_pages.blocks, "full pages differ");
        assert!(dev_pages.tail == cpu_pages.tail, "partial page differs");
    }

    // Device → CPU and CPU → device: the restored sequence continues as the one that wrote
    // the pages does.
    for (from, from_model, to_model) in [
        (&on_device, &offloaded, &plain),
        (&on_cpu, &plain, &offloaded),
    ] {
        let pages = export_pages(from);
        let mut restored = Session::new(to_model.clone(), params(32)).unwrap();
        import_pages(&mut restored, &pages).unwrap();
        let mut original = fed(from_model, &toks);
        let want = original.feed(&[5, 6]).unwrap().to_vec();
        let got = restored.feed(&[5, 6]).unwrap().to_vec();
        // The continuation runs on the receiving side's backend.
        if Arc::ptr_eq(to_model, from_model) || device().1 {
            same(&got, &want, "restored continuation");
        } else {
            assert_close(&got, &want, 5e-2, "restored continuation");
        }
        // What the receiving side stores reads back as what it was given.
        let again = export_pages(&restored);
        assert!(again.blocks == pages.blocks, "imported pages changed");
    }
}

#[test]
fn shared_pages_are_copied_in_device_memory() {
    let c = cfg(Shape::Llama, false);
    let (dir, plain, _w) = build(&c, 33);
    let path = dir.path().join("tiny.gguf");
    let offloaded = load(&path, c.n_layer);
    let run = |model: &Arc<Model>| {
        let mut ctx = Context::new(
            model.clone(),
            ContextParams {
                n_ctx: 256,
                kv_tokens: 512,
                n_threads: 2,
                n_batch: 64,
                ..ContextParams::default()
            },
        )
        .unwrap();
        let a = ctx.new_sequence();
        let prompt = tokens(PAGE_TOKENS + 30);
        ctx.feed(a, &prompt, Logits::Last).unwrap();
        // The fork shares the partly filled page; writing into it copies it first.
        let b = ctx.fork(a, prompt.len()).unwrap();
        let mut batch = Batch::new();
        let ia = batch.add(a, &[7, 8, 9], Logits::Last);
        let ib = batch.add(b, &[10, 11], Logits::Last);
        let out = ctx.decode(&batch).unwrap();
        let mut page_a = Vec::new();
        ctx.read_page(a, 1, &mut page_a).unwrap();
        (out.logits(ia).to_vec(), out.logits(ib).to_vec(), page_a)
    };
    let (want_a, want_b, want_page) = run(&plain);
    let (got_a, got_b, got_page) = run(&offloaded);
    same(&got_a, &want_a, "sequence a after the copy");
    same(&got_b, &want_b, "sequence b after the copy");
    if device().1 {
        assert!(got_page == want_page, "the copied page differs");
    }
}

#[test]
fn a_gpu_that_is_not_there_is_a_typed_error() {
    let c = cfg(Shape::Llama, false);
    let (dir, _plain, _w) = build(&c, 34);
    let path = dir.path().join("tiny.gguf");
    let params = ModelParams {
        n_gpu_layers: 1,
        device: OffloadDevice::Gpu(64),
        ..ModelParams::default()
    };
    match Model::load_with(&path, &params) {
        Err(Error::NoGpu { index: 64, found }) => assert!(found < 64),
        other => panic!("expected NoGpu, got {other:?}"),
    }
    if !cfg!(any(feature = "cuda", feature = "metal")) {
        // A build without a GPU backend finds none, and says how to run instead.
        let err = Model::load_with(&path, &ModelParams::gpu_layers(3)).unwrap_err();
        assert!(
            matches!(err, Error::NoGpu { index: 0, found: 0 }),
            "{err:?}"
        );
        assert!(err.to_string().contains("--n-gpu-layers 0"), "{err}");
    }
    // No offload, no device needed.
    let model = Model::load_with(&path, &ModelParams::default()).unwrap();
    assert_eq!(model.n_offloaded_layers(), 0);
    assert!(model.offload_device().is_none());
}

/// The real model: a conversation prefilled with its layers offloaded is saved through the
/// store, restored into a CPU-only session (and back), and continues as the CPU run does.
#[test]
fn real_model_saved_offloaded_resumes_on_the_cpu() {
    use engine::store::{CheckpointMeta, SessionStore, StoreConfig};
    let Some(path) = real_model_path() else {
        return;
    };
    let plain = Model::load(&path).unwrap();
    let offloaded = load(&path, plain.hparams().n_layer + 1);
    let text = "The history of the printing press begins in the fifteenth century, when ".repeat(6);
    let prompt = plain.tokenizer().encode(&text, true, false).unwrap();
    assert!(prompt.len() > PAGE_TOKENS, "{} tokens", prompt.len());
    let sp = || engine::ContextParams {
        n_ctx: 512,
        n_threads: 2,
        ..engine::ContextParams::default()
    };
    let greedy = |s: &mut Session, n: usize| -> Vec<u32> {
        (0..n)
            .map(|_| {
                let l = s.logits().unwrap();
                let next = (0..l.len()).max_by(|&a, &b| l[a].total_cmp(&l[b])).unwrap() as u32;
                s.feed(&[next]).unwrap();
                next
            })
            .collect()
    };
    // The reference: the same conversation saved and restored without any offloading (a
    // restored session recomputes its last position, so it is compared with a restored one).
    let mut cpu = Session::new(plain.clone(), sp()).unwrap();
    cpu.feed(&prompt).unwrap();
    let prefill_logits = cpu.logits().unwrap().to_vec();
    let cpu_dir = tempfile::tempdir().unwrap();
    let store = SessionStore::open(cpu_dir.path(), &plain, StoreConfig::default()).unwrap();
    store
        .save(&cpu, "talk", &CheckpointMeta::default())
        .unwrap();
    let mut cpu = Session::new(plain.clone(), sp()).unwrap();
    store.restore(&mut cpu, "talk").unwrap();
    let cpu_logits = cpu.ensure_logits().unwrap().to_vec();
    let want = greedy(&mut cpu, 16);

    let dir = tempfile::tempdir().unwrap();
    let mut dev = Session::new(offloaded.clone(), sp()).unwrap();
    dev.feed(&prompt).unwrap();
    same(
        dev.logits().unwrap(),
        &prefill_logits,
        "real model, offloaded prefill",
    );
    let store = SessionStore::open(dir.path(), &offloaded, StoreConfig::default()).unwrap();
    store
        .save(&dev, "talk", &CheckpointMeta::default())
        .unwrap();
    drop(store);

    // Restored on the CPU, and restored onto the device again.
    for (model, what) in [
        (&plain, "restored on the CPU"),
        (&offloaded, "restored on the device"),
    ] {
        let store = SessionStore::open(dir.path(), model, StoreConfig::default()).unwrap();
        let mut s = Session::new(model.clone(), sp()).unwrap();
        store.restore(&mut s, "talk").unwrap();
        assert_eq!(s.tokens(), &prompt[..]);
        s.ensure_logits().unwrap();
        same(s.logits().unwrap(), &cpu_logits, what);
        let got = greedy(&mut s, 16);
        if device().1 {
            assert_eq!(got, want, "{what}: greedy continuation");
        } else {
            // A GPU's sums round differently: report where the greedy tokens first part.
            let first = got.iter().zip(&want).position(|(a, b)| a != b);
            println!("{what}: greedy tokens first differ at {first:?}");
            assert!(first.is_none_or(|i| i >= 4), "{what}: {got:?} vs {want:?}");
        }
    }
}
