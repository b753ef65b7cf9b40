//! Chat templates: the real model's template reproduces the golden prompt exactly (skipped when
//! the model file is absent), ChatML is the fallback, and template features behave like
//! Hugging Face's Jinja environment.

mod common;

use common::real_model_path;

use std::path::PathBuf;

use engine::chat::{sandbox, ChatTemplate, Message, CHATML_TEMPLATE};
use engine::gguf::{Gguf, GgufWriter};

fn golden_chat_prompt() -> String {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/golden_visible.jsonl");
    let text = std::fs::read_to_string(path).unwrap();
    let line = text.lines().nth(2).expect("line 3");
    let v: serde_json::Value = serde_json::from_str(line).unwrap();
    v["prompt"].as_str().unwrap().to_string()
}

#[test]
fn real_template_renders_the_golden_prompt() {
    let Some(path) = real_model_path() else {
        return;
    };
    let g = Gguf::open(&path).unwrap();
    let t = ChatTemplate::from_gguf(&g).unwrap();
    assert_ne!(t.source(), CHATML_TEMPLATE);
    let messages = [
        Message::new(
            "system",
            "You are a helpful AI assistant named SmolLM, trained by Hugging Face",
        ),
        Message::new("user", "What is the tallest mountain in the world?"),
    ];
    assert_eq!(t.render(&messages, true).unwrap(), golden_chat_prompt());
    // Without a system message this template inserts its default one.
    let user_only = [Message::new(
        "user",
        "What is the tallest mountain in the world?",
    )];
    assert_eq!(t.render(&user_only, true).unwrap(), golden_chat_prompt());
    // No generation prompt: the text ends after the last message.
    let done = t.render(&messages, false).unwrap();
    assert!(done.ends_with("world?<|im_end|>\n"), "{done:?}");
}

#[test]
fn chatml_fallback() {
    let mut w = GgufWriter::new();
    w.add_str("general.architecture", "llama");
    let g = Gguf::from_bytes(w.to_bytes().unwrap()).unwrap();
    let t = ChatTemplate::from_gguf(&g).unwrap();
    assert_eq!(t.source(), CHATML_TEMPLATE);
    let messages = [
        Message::new("system", "Be brief."),
        Message::new("user", "Hi"),
        Message::new("assistant", "Hello!"),
        Message::new("user", "Bye"),
    ];
    let want = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n\
                <|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n\
                <|im_start|>assistant\n";
    assert_eq!(t.render(&messages, true).unwrap(), want);
    assert_eq!(
        ChatTemplate::chatml().render(&messages, true).unwrap(),
        want
    );
    assert_eq!(
        ChatTemplate::chatml()
            .render(&messages[..1], false)
            .unwrap(),
        "<|im_start|>system\nBe brief.<|im_end|>\n"
    );
}

#[test]
fn template_features() {
    // These test templates are trusted: rendered here, not in the sandbox.
    sandbox::render_in_process();
    // raise_exception aborts rendering with the message.
    let t = ChatTemplate::new(
        "{% if messages[0]['role'] != 'user' %}{{ raise_exception('first must be user') }}{% endif %}ok",
        "<s>",
        "</s>",
    )
    .unwrap();
    let e = t.render(&[Message::new("system", "x")], false).unwrap_err();
    assert!(e.to_string().contains("first must be user"), "{e}");
    assert_eq!(t.render(&[Message::new("user", "x")], false).unwrap(), "ok");

    // Python string methods, bos/eos tokens and trim_blocks/lstrip_blocks.
    let t = ChatTemplate::new(
        "{{ bos_token }}\n{% for m in messages %}\n  {% if m.content.startswith('!') %}\n[{{ m.content.strip('!').upper() }}]{{ eos_token }}\n  {% endif %}\n{% endfor %}",
        "<s>",
        "</s>",
    )
    .unwrap();
    let out = t
        .render(
            &[Message::new("user", "!hi!"), Message::new("user", "no")],
            false,
        )
        .unwrap();
    assert_eq!(out, "<s>\n[HI]</s>\n");

    // A syntax error is reported when the template is compiled.
    assert!(ChatTemplate::new("{% for %}", "", "").is_err());
}

/// minijinja 2.24 multiplies a repeated list's length unchecked: repeating a list 2^32 times
/// twice overflows, which with overflow checks on (the test profile, the fuzz builds) panics
/// inside minijinja, in constant folding at compile time or at render. Either way the caller
/// gets a typed error, in the process, without the sandbox. Without overflow checks (release
/// builds) the length wraps instead and minijinja iterates the list for ever, in process; the
/// sandbox's time limit is what bounds that, so the test only runs where the panic happens.
#[test]
#[cfg_attr(
    not(debug_assertions),
    ignore = "needs overflow checks: without them the product wraps and never panics"
)]
fn a_panic_inside_the_template_engine_is_a_template_error() {
    sandbox::render_in_process();
    let folded = "{{ ['a'] * 4294967296 * 4294967296 + ['b'] }}";
    let at_render = "{% set n = messages|length * 4294967296 %}{{ ['a'] * n * n + ['b'] }}";
    let messages = [Message::new("user", "hi")];
    for source in [folded, at_render] {
        let result = ChatTemplate::new(source, "", "").and_then(|t| t.render_here(&messages, true));
        match result {
            Err(engine::Error::ChatTemplate(e)) => {
                assert!(e.to_string().contains("panicked"), "{source}: {e}")
            }
            other => panic!("{source}: {other:?}"),
        }
    }
    // The template engine still works afterwards.
    let t = ChatTemplate::chatml();
    assert!(t.render_here(&messages, true).unwrap().contains("hi"));
}
