//! A hostile chat template and hostile messages: compiling and rendering never panic, and a
//! render stays within its fuel and output budget (`chat::render_limits`).
//!
//! Input: template source, a 0 byte, then messages as `role \x01 content` separated by `\x02`.
//!
//! It renders in this process (`render_here`): fuel and the output budget bound instructions and
//! output, not what one instruction allocates or how long it runs; those are the renderer
//! process's limits (`engine::chat::sandbox`, tested in `tests/chat_sandbox.rs`), so an
//! out-of-memory report here is an input the sandbox contains, and a panic is a bug, except one
//! raised inside minijinja (its unchecked length arithmetic overflows): the engine turns those
//! into template errors, so they unwind to it here instead of aborting.

#![no_main]

use engine::chat::{render_limits, ChatTemplate, Message};
use libfuzzer_sys::fuzz_target;

/// libFuzzer's hook aborts on every panic before it unwinds; panics raised in minijinja's own
/// source are let through to the engine's containment, every other one still aborts.
fn let_minijinja_panics_unwind() {
    let abort_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let in_minijinja = info
            .location()
            .is_some_and(|l| l.file().contains("/minijinja-"));
        if !in_minijinja {
            abort_hook(info);
        }
    }));
}

fuzz_target!(|data: &[u8]| {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(let_minijinja_panics_unwind);
    let (src, rest) = match data.iter().position(|&b| b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[][..]),
    };
    let src = String::from_utf8_lossy(src);
    let messages: Vec<Message> = rest
        .split(|&b| b == 2)
        .filter(|m| !m.is_empty())
        .map(|m| {
            let (role, content) = match m.iter().position(|&b| b == 1) {
                Some(i) => (&m[..i], &m[i + 1..]),
                None => (&b"user"[..], m),
            };
            Message::new(
                String::from_utf8_lossy(role),
                String::from_utf8_lossy(content),
            )
        })
        .collect();
    let Ok(t) = ChatTemplate::new(&src, "<s>", "</s>") else {
        return;
    };
    if let Ok(out) = t.render_here(&messages, true) {
        assert!(out.len() <= render_limits(&messages).1);
    }
});
