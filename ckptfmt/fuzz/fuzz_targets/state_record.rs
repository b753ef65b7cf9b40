//! Fuzzes the state record parser: any input gives a view or a typed error.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(v) = ckptfmt::StateView::parse(data) {
        // A verified record's payload lies within it, after the 4096-byte header.
        assert!(v.state().len() + 4096 <= data.len());
        assert!(v.n_tokens() > 0);
        let _ = v.block_id();
        let _ = v.fingerprint();
    }
});
