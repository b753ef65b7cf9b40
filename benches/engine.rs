//! Criterion benchmarks of the engine on the real model (skipped with a note when it is absent):
//! tokenization, one decode step, and a 128-token prefill.
//!
//! ```text
//! cargo bench --bench engine
//! ```
//! Speed against llama.cpp is measured side by side with `cargo xtask compare-llama-cpp`.

#![allow(missing_docs)] // criterion_group! generates undocumented items

use std::path::Path;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use engine::{ContextParams, Model, Session};

const MODEL: &str = "models/SmolLM2-135M-Instruct.Q4_1.gguf";

fn bench(c: &mut Criterion) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(MODEL);
    if !path.exists() {
        eprintln!("{MODEL} not present (cargo xtask fetch-model); nothing to measure");
        return;
    }
    let model = Model::load(&path).expect("model loads");
    let text = "The quick brown fox jumps over the lazy dog. ".repeat(40);
    let n_tokens = model.tokenizer().encode(&text, false, false).unwrap().len();
    let mut g = c.benchmark_group("tokenizer");
    g.throughput(Throughput::Elements(n_tokens as u64));
    g.bench_function("encode_400_words", |b| {
        b.iter(|| model.tokenizer().encode(&text, false, false).unwrap())
    });
    g.finish();

    let params = ContextParams {
        n_ctx: 1024,
        n_threads: 2,
        n_batch: 512,
        flash_attn: true,
        ..ContextParams::default()
    };
    let prompt: Vec<u32> = (0..128).map(|i| 100 + (i * 7919) % 48_952).collect();
    let mut g = c.benchmark_group("forward");
    g.sample_size(10);
    g.throughput(Throughput::Elements(128));
    g.bench_function("prefill_128", |b| {
        let mut s = Session::new(model.clone(), params.clone()).unwrap();
        b.iter(|| {
            s.clear();
            s.feed(&prompt).unwrap();
        })
    });
    g.throughput(Throughput::Elements(1));
    g.bench_function("decode_step_at_128", |b| {
        let mut s = Session::new(model.clone(), params.clone()).unwrap();
        s.feed(&prompt).unwrap();
        b.iter(|| {
            s.feed(&[42]).unwrap();
            s.truncate(128).unwrap();
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
