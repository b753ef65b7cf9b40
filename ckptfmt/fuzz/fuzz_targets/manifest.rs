//! Fuzzes the manifest parser; a parsed manifest must re-encode to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = ckptfmt::Manifest::decode(data) {
        let again = m.encode().expect("a parsed manifest is valid");
        let back = ckptfmt::Manifest::decode(&again).expect("re-encoded manifest parses");
        assert_eq!(back, m);
    }
});
