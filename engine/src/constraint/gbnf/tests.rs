//! The GBNF translator's unit tests.

use super::*;

fn no_tokens(_: &str) -> Option<u32> {
    None
}

fn lark(src: &str) -> Result<String, GbnfError> {
    gbnf_to_lark(src, &no_tokens, 1000)
}

#[test]
fn literal_is_split_into_characters() {
    assert_eq!(
        lark("root ::= \"ab\"").unwrap(),
        "start: g0_root\ng0_root: (/a/ /b/)\n"
    );
}

#[test]
fn classes_escapes_and_repetitions() {
    let out = lark(
        r#"root ::= [a-z_\x41] [^"\\] . "\n"* x{2,5} x{3} x{1,}
x ::= "é"?"#,
    )
    .unwrap();
    assert_eq!(
        out,
        "start: g0_root\ng0_root: /[a-z\\x{5f}A]/ /[^\\x{22}\\x{5c}]/ /(?s:.)/ (/\\x{a}/)* \
         (g1_x){2,5} (g1_x){3} (g1_x)+\ng1_x: (/\\x{e9}/)?\n"
    );
}

#[test]
fn multi_line_rules_groups_and_comments() {
    let src =
        "# a comment\nroot ::= (\n  \"a\" # inner\n  | \"b\"\n) tail |\n  \"c\"\ntail ::= \"\"\n";
    let out = lark(src).unwrap();
    assert_eq!(
        out,
        "start: g0_root\ng0_root: (/a/ | /b/) g1_tail | /c/\ng1_tail: ()\n"
    );
}

#[test]
fn names_are_mangled_and_root_need_not_be_first() {
    let out = lark("Item-1 ::= \"x\"\nroot ::= Item-1").unwrap();
    assert_eq!(out, "start: g1_root\ng0__tem_1: /x/\ng1_root: g0__tem_1\n");
}

#[test]
fn token_references() {
    let lookup = |t: &str| (t == "<|im_end|>").then_some(7);
    let out = gbnf_to_lark("root ::= <[3]> !<|im_end|> <|im_end|>", &lookup, 10).unwrap();
    assert_eq!(out, "start: g0_root\ng0_root: <[3]> <[^7]> <[7]>\n");
    let e = gbnf_to_lark("root ::= <[12]>", &lookup, 10).unwrap_err();
    assert!(e.message.contains("outside the vocabulary"), "{e}");
    let e = gbnf_to_lark("root ::= <|nope|>", &lookup, 10).unwrap_err();
    assert!(e.message.contains("not a token"), "{e}");
}

#[test]
fn errors_say_where() {
    let cases: &[(&str, usize, usize, &str)] = &[
        ("root ::= \"abc", 1, 10, "unterminated string"),
        ("root ::= [abc", 1, 10, "unterminated character class"),
        ("root := \"a\"", 1, 6, "expected `::=`"),
        ("root ::= \"a\"\nfoo ::= (\"b\"", 2, 13, "expected `)`"),
        ("root ::= * \"a\"", 1, 10, "nothing before it"),
        ("root ::= x\n", 1, 10, "undefined rule `x`"),
        ("x ::= \"a\"", 0, 0, "no `root` rule"),
        ("root ::= \"\\q\"", 1, 11, "unknown escape"),
        ("root ::= \"\\x4\"", 1, 11, "hexadecimal digits"),
        ("root ::= [z-a]", 1, 13, "reversed"),
        ("root ::= \"a\"{5,2}", 1, 13, "below its minimum"),
        ("root ::= \"a\"{2001}", 1, 14, "repetitions"),
        ("root ::= \"a\"{2", 1, 15, "expected `}`"),
        ("root ::= \"a\" )", 1, 14, "end of the line"),
        ("root ::= \"a\"\n| \"b\"", 2, 1, "expected a rule name"),
        ("root ::= \"\\uD800\"", 1, 11, "not a Unicode scalar"),
        ("", 0, 0, "empty"),
    ];
    for &(src, line, column, what) in cases {
        let e = lark(src).expect_err(src);
        assert!(e.message.contains(what), "{src:?}: {e}");
        assert_eq!((e.line, e.column), (line, column), "{src:?}: {e}");
    }
    let e = lark("root ::= \"a\"\nfoo ::= (\"b\"").unwrap_err();
    assert_eq!(e.rule.as_deref(), Some("foo"));
    assert_eq!(
        e.to_string(),
        "GBNF line 2, column 13 (rule `foo`): expected `)`, found the end of the grammar"
    );
}

#[test]
fn later_definition_replaces_earlier() {
    let out = lark("root ::= \"a\"\nroot ::= \"b\"").unwrap();
    assert_eq!(out, "start: g0_root\ng0_root: /b/\n");
}

/// Found by the `gbnf` fuzz target: an error quoting the grammar's text kept a newline in it.
#[test]
fn errors_quoting_the_grammar_stay_on_one_line() {
    let e = lark("root ::= \"\\\n\"").unwrap_err().to_string();
    assert!(!e.contains('\n'), "{e}");
    assert!(e.contains("unknown escape `\\\\n`"), "{e}");
}
