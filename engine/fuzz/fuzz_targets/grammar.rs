//! Whole grammars compiled over a tiny vocabulary (`Constraint::new`): GBNF, Lark or a JSON
//! schema, picked by the first byte. Compiling never panics past the engine nor overflows a
//! stack; a refusal is one line with no caught panic's text in it; a grammar that compiles gives a mask,
//! and follows its first allowed token a few steps.
//!
//! llguidance catches its own panics (a grammar it cannot number, say) and returns them as
//! errors, which the engine words; libFuzzer's hook would abort on them before they unwind, so
//! panics raised in llguidance's crates are let through to that containment.

#![no_main]

use std::sync::{Arc, OnceLock};

use engine::constraint::{Constraint, Grammar, Vocab};
use engine::testing::TinyChatModel;
use engine::Model;
use libfuzzer_sys::fuzz_target;

fn setup() -> &'static (Arc<Model>, Arc<Vocab>) {
    static SETUP: OnceLock<(Arc<Model>, Arc<Vocab>)> = OnceLock::new();
    SETUP.get_or_init(|| {
        let abort_hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let contained = info.location().is_some_and(|l| {
                ["/llguidance-", "/derivre-", "/toktrie-"]
                    .iter()
                    .any(|c| l.file().contains(c))
            });
            if !contained {
                abort_hook(info);
            }
        }));
        let dir = std::env::temp_dir().join(format!("engine-fuzz-grammar-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("tiny.gguf");
        TinyChatModel {
            letter_merges: true,
            ..Default::default()
        }
        .write(&path)
        .unwrap();
        let model = Model::load(&path).unwrap();
        let vocab = Vocab::new(model.tokenizer()).unwrap();
        (model, vocab)
    })
}

fuzz_target!(|data: &[u8]| {
    let (model, vocab) = setup();
    let Some((&kind, rest)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    let grammar = match kind % 3 {
        0 => Grammar::Gbnf(text.to_owned()),
        1 => Grammar::Lark(text.to_owned()),
        _ => match serde_json::from_str(text) {
            Ok(schema) => Grammar::JsonSchema(schema),
            Err(_) => return,
        },
    };
    let mut c = match Constraint::new(vocab, &grammar) {
        Ok(c) => c,
        Err(engine::Error::Grammar(msg)) => {
            // The message may quote the grammar (a rule named `panic`), never a caught panic:
            // words of one that the grammar does not hold itself.
            let leaked = ["panic", "backtrace", ".rs:"]
                .iter()
                .any(|w| msg.contains(w) && !text.contains(w));
            assert!(!msg.contains('\n') && !leaked, "{msg}");
            return;
        }
        Err(e) => panic!("not a grammar error: {e}"),
    };
    let n = model.tokenizer().n_vocab();
    for _ in 0..4 {
        let mut logits = vec![0.0f32; n];
        if c.mask_logits(&mut logits).is_err() {
            return;
        }
        let Some(t) = logits.iter().position(|l| *l == 0.0) else {
            return;
        };
        if c.accept(t as u32).is_err() || c.is_done() {
            return;
        }
    }
});
