//! Arbitrary bytes as a GGUF file: parsing never panics, and whatever parses can be read back
//! whole (every key, every array, every tensor's bytes).

#![no_main]

use engine::gguf::{Gguf, MetaValue};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(g) = Gguf::from_bytes(data.to_vec()) else {
        return;
    };
    for (key, value) in g.metadata() {
        // The same entry (values may hold NaN, which equals nothing).
        assert!(g.get(key).is_some_and(|v| std::ptr::eq(v, value)), "{key}");
        if let MetaValue::Array(a) = value {
            for i in 0..a.len().min(64) {
                assert!(a.get(i).is_some());
            }
            let _ = a.to_i64s();
            let _ = a.to_f64s();
        }
    }
    for t in g.tensors() {
        assert_eq!(g.tensor(&t.name), Some(t));
        assert_eq!(g.read_tensor(t).map(|d| d.len() as u64).ok(), Some(t.n_bytes));
    }
});
