//! FORMAT.md and `src/layout.rs` change together: FORMAT.md records the
//! BLAKE3 hash of layout.rs, and this test fails when they drift apart.

#[test]
fn format_md_records_the_hash_of_layout_rs() {
    let dir = env!("CARGO_MANIFEST_DIR");
    let layout = std::fs::read_to_string(format!("{dir}/src/layout.rs")).unwrap();
    let doc = std::fs::read_to_string(format!("{dir}/FORMAT.md")).unwrap();
    // Line endings do not matter.
    let hash = blake3::hash(layout.replace("\r\n", "\n").as_bytes()).to_hex();
    let line = format!("layout.rs BLAKE3: {hash}");
    assert!(
        doc.contains(&line),
        "src/layout.rs changed: update FORMAT.md's byte tables, then set its last line to `{line}`"
    );
}
