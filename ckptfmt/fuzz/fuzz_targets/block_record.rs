//! Fuzzes the block record parser: any input gives a view or a typed error.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(v) = ckptfmt::BlockView::parse(data) {
        // Everything a caller can ask of a verified view must work.
        let _ = v.tokens();
        let _ = v.prev();
        let kv = v.kv().expect("a verified block decodes");
        assert_eq!(kv.len() as u64, v.raw_len());
        assert_eq!(v.record_len() as usize, data.len());
    }
});
