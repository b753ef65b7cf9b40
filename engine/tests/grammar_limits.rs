//! Hostile grammars: each is refused with one line in the project's words, or compiled, and
//! none may exhaust a stack, whatever thread compiles it (a server compiles grammars on threads
//! with small stacks; an overflow aborts the whole process).

use std::sync::Arc;

use engine::constraint::{Constraint, Grammar, Vocab, MAX_LARK_LINES, MAX_SCHEMA_OBJECTS};
use engine::testing::{rule_chain, schema_chain, TinyChatModel};
use engine::{Error, Model};

fn tiny_vocab() -> (Arc<Model>, Arc<Vocab>) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    TinyChatModel {
        letter_merges: true,
        ..Default::default()
    }
    .write(&path)
    .unwrap();
    let model = Model::load(&path).unwrap();
    let vocab = Vocab::new(model.tokenizer()).unwrap();
    (model, vocab)
}

/// Compiles `grammar` on a thread with a 256 KiB stack, far less than any of the grammars
/// below needs: what `Constraint::new` does must not depend on its caller's stack.
fn compile_on_small_stack(vocab: &Arc<Vocab>, grammar: Grammar) -> engine::Result<Constraint> {
    let vocab = Arc::clone(vocab);
    std::thread::Builder::new()
        .stack_size(256 << 10)
        .spawn(move || Constraint::new(&vocab, &grammar))
        .unwrap()
        .join()
        .unwrap()
}

/// The message of a refusal, checked to be one line with nothing of the build in it.
fn refusal(r: engine::Result<Constraint>) -> String {
    let msg = match r {
        Err(Error::Grammar(msg)) => msg,
        Err(e) => panic!("not a grammar error: {e}"),
        Ok(_) => panic!("compiled"),
    };
    assert!(!msg.contains('\n'), "{msg}");
    for leak in [
        "panic",
        "backtrace",
        ".rs",
        "src/",
        "NoExtension",
        "Current row",
    ] {
        assert!(!msg.contains(leak), "{leak:?} in {msg}");
    }
    msg
}

/// [`rule_chain`] in GBNF, its rules after `root` in reverse order when `reversed`.
fn gbnf_chain(n: usize, reversed: bool) -> String {
    let text = rule_chain(n, false);
    if !reversed {
        return text;
    }
    let mut lines: Vec<&str> = text.lines().collect();
    lines[1..].reverse();
    lines.join("\n")
}

#[test]
fn deep_gbnf_is_refused_before_anything_recurses() {
    let (_model, vocab) = tiny_vocab();
    let nested = format!("root ::= {}\"a\"{}", "(".repeat(3000), ")".repeat(3000));
    let msg = refusal(compile_on_small_stack(&vocab, Grammar::Gbnf(nested)));
    assert!(msg.contains("nest more than 128"), "{msg}");
    let stars = format!("root ::= \"a\"{}", "?".repeat(3000));
    let msg = refusal(compile_on_small_stack(&vocab, Grammar::Gbnf(stars)));
    assert!(msg.contains("nest more than 128"), "{msg}");
    // Groups and repetitions count together.
    let mixed = format!("root ::= {}\"a\"{}", "(".repeat(100), ")*".repeat(100));
    let msg = refusal(compile_on_small_stack(&vocab, Grammar::Gbnf(mixed)));
    assert!(msg.contains("nest more than 128"), "{msg}");
    // Just inside the bound compiles.
    let inside = format!("root ::= {}\"a\"{}", "(".repeat(64), ")?".repeat(64));
    compile_on_small_stack(&vocab, Grammar::Gbnf(inside)).unwrap();
}

#[test]
fn long_chains_of_gbnf_rules_are_refused_in_any_order() {
    let (_model, vocab) = tiny_vocab();
    for reversed in [false, true] {
        let msg = refusal(compile_on_small_stack(
            &vocab,
            Grammar::Gbnf(gbnf_chain(1000, reversed)),
        ));
        assert!(msg.contains("chain more than 500"), "{msg}");
    }
    // A chain inside the bound, and recursion of any length, compile.
    compile_on_small_stack(&vocab, Grammar::Gbnf(gbnf_chain(400, true))).unwrap();
    let recursive = "root ::= item\nitem ::= \"a\" item | \"b\" list\nlist ::= item | \"c\"";
    compile_on_small_stack(&vocab, Grammar::Gbnf(recursive.into())).unwrap();
}

/// Lark chains and schema reference chains inside the bounds compile on any caller's stack
/// (each of these overflowed a 2 MiB stack when compiled in place), and past them are refused.
#[test]
fn lark_and_schema_chains_compile_on_the_compilers_stack_or_are_refused() {
    let (_model, vocab) = tiny_vocab();
    compile_on_small_stack(&vocab, Grammar::Lark(rule_chain(2000, true))).unwrap();
    let marked = format!("%llguidance {{}}\n{}", rule_chain(2000, true));
    compile_on_small_stack(&vocab, Grammar::Gbnf(marked)).unwrap();
    let msg = refusal(compile_on_small_stack(
        &vocab,
        Grammar::Lark(rule_chain(MAX_LARK_LINES, true)),
    ));
    assert!(msg.contains("lines"), "{msg}");

    compile_on_small_stack(&vocab, Grammar::JsonSchema(schema_chain(1500))).unwrap();
    let msg = refusal(compile_on_small_stack(
        &vocab,
        Grammar::JsonSchema(schema_chain(MAX_SCHEMA_OBJECTS / 3 + 1)),
    ));
    assert!(msg.contains("objects"), "{msg}");
}

#[test]
fn the_compilers_own_failures_are_said_in_words() {
    let (model, vocab) = tiny_vocab();
    // More symbols than llguidance numbers: a panic inside it, caught there.
    let alts: Vec<String> = (0..20_000).map(|i| format!("\"x{i}\"")).collect();
    let msg = refusal(compile_on_small_stack(
        &vocab,
        Grammar::Gbnf(format!("root ::= {}", alts.join(" | "))),
    ));
    assert!(msg.contains("too large"), "{msg}");
    // A token after the output is complete.
    let mut c = Constraint::new(&vocab, &Grammar::Gbnf("root ::= \"a\"".into())).unwrap();
    let a = model.tokenizer().token_id("a").unwrap();
    c.accept(a).unwrap();
    assert!(c.is_done());
    let msg = refusal(c.accept(a).map(|()| c.clone()));
    assert!(msg.contains("nothing may follow"), "{msg}");
}

/// Groups nested deeper than llguidance's Lark parser takes are emitted as rules of their own,
/// with the same meaning.
#[test]
fn deep_groups_keep_their_meaning() {
    let (model, vocab) = tiny_vocab();
    let tok = model.tokenizer();
    let (a, b) = (tok.token_id("a").unwrap(), tok.token_id("b").unwrap());
    let grammar = format!("root ::= {}\"a\"+{} \"b\"", "(".repeat(60), ")?".repeat(60));
    let mut c = compile_on_small_stack(&vocab, Grammar::Gbnf(grammar.clone())).unwrap();
    for t in [a, a, a, b] {
        assert!(c.is_allowed(t).unwrap());
        c.accept(t).unwrap();
    }
    assert!(c.is_done());
    let mut c = compile_on_small_stack(&vocab, Grammar::Gbnf(grammar)).unwrap();
    assert!(c.is_allowed(b).unwrap(), "every group is optional");
    c.accept(b).unwrap();
    assert!(!c.is_allowed(a).unwrap());
}
