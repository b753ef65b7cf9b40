//! Arbitrary bytes as a model file: loading never panics or aborts inside ggml, and a model that
//! loads evaluates a few tokens (so every hyperparameter that reaches the graph was validated).

#![no_main]

use engine::gguf::Gguf;
use engine::{Model, Session, ContextParams};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(g) = Gguf::from_bytes(data.to_vec()) else {
        return;
    };
    let Ok(model) = Model::from_gguf(g) else {
        return;
    };
    let hp = model.hparams();
    // Keep each run small: the seeds are tiny models.
    if hp.n_embd * hp.n_layer > 1 << 16 || hp.n_vocab > 1 << 16 {
        return;
    }
    let n_vocab = hp.n_vocab as u32;
    let params = ContextParams {
        n_ctx: 8,
        n_threads: 1,
        n_batch: 4,
        flash_attn: data.len() % 2 == 0,
        ..ContextParams::default()
    };
    let Ok(mut s) = Session::new(std::sync::Arc::new(model), params) else {
        return;
    };
    let tokens: Vec<u32> = data
        .iter()
        .take(3)
        .map(|&b| u32::from(b) % n_vocab)
        .collect();
    let _ = s.feed(&tokens);
});
