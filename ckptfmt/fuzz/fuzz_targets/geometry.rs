//! Fuzzes the geometry record parser; a parsed geometry must round-trip.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(g) = ckptfmt::Geometry::decode(data) {
        assert_eq!(
            ckptfmt::Geometry::decode(&g.encode()).expect("round trip"),
            g
        );
        let _ = g.layer_spans(u64::from(g.tokens_per_block()));
    }
});
