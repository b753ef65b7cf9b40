//! Fuzzes the export parser and per-block reads.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(v) = ckptfmt::ExportView::parse(data) {
        for i in 0..v.n_blocks() + 1 {
            if let Ok(b) = v.block(i) {
                let _ = b.kv();
            }
        }
        let _ = v.verify_all();
    }
});
