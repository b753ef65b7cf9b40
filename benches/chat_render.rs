//! What the template renderer process costs: one render of a ten-message conversation in this
//! process (`render_here`) and through the renderer (`render`, the sandbox on, this executable as
//! the renderer).
//!
//! ```text
//! cargo bench --bench chat_render
//! ```

#![allow(missing_docs)] // criterion_group! generates undocumented items

use criterion::{criterion_group, Criterion};
use engine::chat::{sandbox, ChatTemplate, Message};

/// ChatML written out, so that it is not the reviewed constant and goes to the renderer.
const TEMPLATE: &str = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}\
<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

fn bench(c: &mut Criterion) {
    let t = ChatTemplate::new(TEMPLATE, "", "").expect("compiles");
    assert!(!t.is_reviewed());
    let messages: Vec<Message> = (0..10)
        .map(|i| Message::new(["user", "assistant"][i % 2], "word ".repeat(100)))
        .collect();
    assert_eq!(
        t.render(&messages, true).unwrap(),
        t.render_here(&messages, true).unwrap()
    );
    let mut g = c.benchmark_group("chat_render");
    g.bench_function("in_process", |b| {
        b.iter(|| t.render_here(&messages, true).unwrap())
    });
    g.bench_function("renderer", |b| {
        b.iter(|| t.render(&messages, true).unwrap())
    });
    g.finish();
}

criterion_group!(benches, bench);

fn main() {
    // Started as the renderer, this serves and exits; otherwise the sandbox is on.
    sandbox::init();
    benches();
    criterion::Criterion::default()
        .configure_from_args()
        .final_summary();
}
