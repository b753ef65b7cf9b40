//! The GBNF translator alone (`engine::constraint::gbnf_to_lark`), on arbitrary text: it never
//! panics nor overflows its stack (its nesting and rule-chain bounds are checked before anything
//! recurses), and an error is one line.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(src) = std::str::from_utf8(data) else {
        return;
    };
    if let Err(e) = engine::constraint::gbnf_to_lark(src) {
        assert!(!e.contains('\n'), "{e}");
    }
});
