//! The API listing on a small hand-written rustdoc JSON document: its rendering, the re-export
//! check, the comparison with the committed listing, and errors on JSON it cannot read.

use serde_json::{json, Value};

use super::render::display_path;
use super::*;

/// `demo`: `pub use inner::Thing` (a struct with a pub field of `ckptfmt::ids::BlockId`, a method
/// returning `Option<kvstore::error::StoreError>`, a derived `Clone`, an auto-trait impl),
/// `pub use ckptfmt::BlockId`, and `pub mod util { pub fn f<F: FnMut(&BlockId)>(f: F) }`.
fn doc() -> Value {
    let path =
        |name: &str, id: u64| json!({"resolved_path": {"path": name, "id": id, "args": null}});
    let no_generics = json!({"params": [], "where_predicates": []});
    let header = json!({"is_const": false, "is_unsafe": false, "is_async": false, "abi": "Rust"});
    let item = |id: u64, name: Value, inner: Value| {
        json!({"id": id, "crate_id": 0, "name": name, "visibility": "public", "inner": inner,
               "span": {"filename": "demo/src/lib.rs", "begin": [id, 1], "end": [id, 2]}})
    };
    let mut index = serde_json::Map::new();
    let mut add = |v: Value| {
        index.insert(v["id"].to_string(), v);
    };
    add(item(
        1,
        json!("demo"),
        json!({"module": {"is_crate": true, "items": [2, 3, 6]}}),
    ));
    add(item(
        2,
        Value::Null,
        json!({"use": {"source": "inner::Thing", "name": "Thing", "id": 4, "is_glob": false}}),
    ));
    add(item(
        3,
        Value::Null,
        json!({"use": {"source": "ckptfmt::BlockId", "name": "BlockId", "id": 100, "is_glob": false}}),
    ));
    add(item(
        4,
        json!("Thing"),
        json!({"struct": {
            "kind": {"plain": {"fields": [5], "has_stripped_fields": true}},
            "generics": no_generics, "impls": [7, 8, 10]}}),
    ));
    add(item(
        5,
        json!("id"),
        json!({"struct_field": path("BlockId", 100)}),
    ));
    add(item(
        6,
        json!("util"),
        json!({"module": {"is_crate": false, "items": [12]}}),
    ));
    add(item(
        7,
        Value::Null,
        json!({"impl": {"generics": no_generics, "trait": null, "for": path("Thing", 4),
                        "items": [11], "is_negative": false, "is_synthetic": false,
                        "blanket_impl": null}}),
    ));
    add(item(
        8,
        Value::Null,
        json!({"impl": {"generics": no_generics, "trait": {"path": "Clone", "id": 102, "args": null},
                        "for": path("Thing", 4), "items": [], "is_negative": false,
                        "is_synthetic": false, "blanket_impl": null}}),
    ));
    add(item(
        10,
        Value::Null,
        json!({"impl": {"generics": no_generics, "trait": {"path": "Send", "id": 105, "args": null},
                        "for": path("Thing", 4), "items": [], "is_negative": false,
                        "is_synthetic": true, "blanket_impl": null}}),
    ));
    let option = json!({"resolved_path": {"path": "Option", "id": 103, "args": {"angle_bracketed": {
        "args": [{"type": path("StoreError", 101)}], "constraints": []}}}});
    add(item(
        11,
        json!("get"),
        json!({"function": {
            "sig": {"inputs": [
                ["self", {"borrowed_ref": {"lifetime": null, "is_mutable": false, "type": {"generic": "Self"}}}],
                ["n", {"primitive": "usize"}]],
                "output": option, "is_c_variadic": false},
            "generics": no_generics, "header": header, "has_body": true}}),
    ));
    let fn_mut = json!({"trait_bound": {"trait": {"path": "FnMut", "id": 104, "args": {"parenthesized": {
        "inputs": [{"borrowed_ref": {"lifetime": null, "is_mutable": false, "type": path("BlockId", 100)}}],
        "output": null}}}, "generic_params": [], "modifier": "none"}});
    add(item(
        12,
        json!("f"),
        json!({"function": {
            "sig": {"inputs": [["f", {"generic": "F"}]], "output": null, "is_c_variadic": false},
            "generics": {"params": [{"name": "F", "kind": {"type": {
                "bounds": [fn_mut], "default": null, "is_synthetic": false}}}],
                "where_predicates": []},
            "header": header, "has_body": true}}),
    ));
    let summary = |krate: u64, path: &[&str], kind: &str| json!({"crate_id": krate, "path": path, "kind": kind});
    json!({
        "root": 1,
        "format_version": 57,
        "index": index,
        "paths": {
            "4": summary(0, &["demo", "inner", "Thing"], "struct"),
            "100": summary(64, &["ckptfmt", "ids", "BlockId"], "struct"),
            "101": summary(74, &["kvstore", "error", "StoreError"], "enum"),
            "102": summary(2, &["core", "clone", "Clone"], "trait"),
            "103": summary(2, &["core", "option", "Option"], "enum"),
            "104": summary(2, &["core", "ops", "function", "FnMut"], "trait"),
            "105": summary(2, &["core", "marker", "Send"], "trait"),
        },
        "external_crates": {
            "2": {"name": "core"}, "64": {"name": "ckptfmt"}, "74": {"name": "kvstore"},
        },
    })
}

fn lines(entries: &[Entry]) -> Vec<String> {
    let mut lines: Vec<String> = entries.iter().map(Entry::line).collect();
    lines.sort();
    lines
}

/// Drops the root module's item `id` (a re-export).
fn without_root_item(mut doc: Value, id: u64) -> Value {
    let items = doc["index"]["1"]["inner"]["module"]["items"]
        .as_array_mut()
        .expect("the root's items");
    items.retain(|i| *i != id);
    doc
}

#[test]
fn the_listing_writes_every_reachable_item_at_its_public_path_with_full_type_paths() {
    let entries = entries(&doc()).expect("readable");
    assert_eq!(
        lines(&entries),
        [
            "demo::BlockId: use ckptfmt::ids::BlockId",
            "demo::Thing: impl std::clone::Clone",
            "demo::Thing: struct { .. }",
            "demo::Thing::get: fn(&self, n: usize) -> std::option::Option<kvstore::error::StoreError>",
            "demo::Thing::id: field ckptfmt::ids::BlockId",
            "demo::util: mod",
            "demo::util::f: fn<F: std::ops::function::FnMut(&ckptfmt::ids::BlockId)>(f: F)",
        ]
    );
    let file = listing(&entries);
    assert!(file.starts_with(HEADER));
    assert!(file.ends_with(
        "demo::util::f: fn<F: std::ops::function::FnMut(&ckptfmt::ids::BlockId)>(f: F)\n"
    ));
}

#[test]
fn a_second_path_to_a_local_item_is_listed_as_a_use_of_the_shortest() {
    let mut doc = doc();
    doc["index"]["6"]["inner"]["module"]["items"] = json!([12, 13]);
    doc["index"]["13"] = json!({"id": 13, "crate_id": 0, "name": null, "visibility": "public",
        "inner": {"use": {"source": "crate::Thing", "name": "Again", "id": 4, "is_glob": false}}});
    let lines = lines(&entries(&doc).expect("readable"));
    assert!(
        lines.contains(&"demo::util::Again: use demo::Thing".to_string()),
        "{lines:#?}"
    );
    assert!(
        lines.contains(&"demo::Thing: struct { .. }".to_string()),
        "{lines:#?}"
    );
}

#[test]
fn internal_types_must_be_reexported() {
    let listed = entries(&doc()).expect("readable");
    // `BlockId` is re-exported; `StoreError` is not, and core's `Option` is allowed.
    let found = leaks(&listed, INTERNAL);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].item, "demo::Thing::get");
    assert_eq!(found[0].names, "kvstore::error::StoreError");
    let v = found[0].violation().to_string();
    assert!(v.starts_with("demo/src/lib.rs:11: "), "{v}");
    assert!(v.contains("does not re-export"), "{v}");

    // Without the re-export of `BlockId`: the field and the closure's argument (in a bound) leak.
    let listed = entries(&without_root_item(doc(), 3)).expect("readable");
    let items: Vec<(String, String)> = leaks(&listed, INTERNAL)
        .into_iter()
        .map(|l| (l.item, l.names))
        .collect();
    let blockid = "ckptfmt::ids::BlockId".to_string();
    assert_eq!(
        items,
        [
            (
                "demo::Thing::get".to_string(),
                "kvstore::error::StoreError".to_string()
            ),
            ("demo::Thing::id".to_string(), blockid.clone()),
            ("demo::util::f".to_string(), blockid),
        ]
    );
    // A crate not listed as internal may be named freely.
    assert_eq!(leaks(&listed, &["ggml_sys"]), []);
}

#[test]
fn a_reexported_module_or_an_inlined_item_covers_its_types() {
    // `pub use kvstore::error;` covers `kvstore::error::StoreError`.
    let mut doc = doc();
    doc["index"]["1"]["inner"]["module"]["items"] = json!([2, 3, 6, 20]);
    doc["index"]["20"] = json!({"id": 20, "crate_id": 0, "name": null, "visibility": "public",
        "inner": {"use": {"source": "kvstore::error", "name": "error", "id": 106, "is_glob": false}}});
    doc["paths"]["106"] = json!({"crate_id": 74, "path": ["kvstore", "error"], "kind": "module"});
    assert_eq!(leaks(&entries(&doc).expect("readable"), INTERNAL), []);
    // Not a prefix of a name: `kvstore::err` does not cover `kvstore::error::StoreError`.
    doc["paths"]["106"]["path"] = json!(["kvstore", "err"]);
    assert_eq!(leaks(&entries(&doc).expect("readable"), INTERNAL).len(), 1);

    // `#[doc(inline)] pub use ckptfmt::BlockId`: the foreign item itself in the root module.
    let mut doc = without_root_item(self::doc(), 3);
    doc["index"]["1"]["inner"]["module"]["items"] = json!([2, 6, 100]);
    doc["index"]["100"] = json!({"id": 100, "crate_id": 64, "name": "BlockId",
        "visibility": "public", "inner": {"struct": {"kind": "unit", "generics": {}, "impls": []}}});
    let listed = entries(&doc).expect("readable");
    assert!(lines(&listed).contains(&"demo::BlockId: use ckptfmt::ids::BlockId".to_string()));
    let names: Vec<String> = leaks(&listed, INTERNAL)
        .into_iter()
        .map(|l| l.names)
        .collect();
    assert_eq!(names, ["kvstore::error::StoreError"]);
}

#[test]
fn the_listing_must_equal_the_committed_one() {
    let text = "# header\na: x\nb: y\nc: z\n";
    assert_eq!(difference(text, text), None);
    let (line, diff) = difference(text, "# header\na: x\nb: Y\nc: z\nd: w\n").expect("differs");
    assert_eq!(line, 3);
    assert_eq!(diff, "  + b: Y\n  - b: y\n  + d: w");
    // A missing file differs from any listing, from its first line.
    let (line, diff) = difference("", text).expect("differs");
    assert_eq!(line, 1);
    assert!(diff.contains("+ c: z"), "{diff}");
    // The same lines in another order still differ.
    let (_, diff) = difference(text, "# header\nb: y\na: x\nc: z\n").expect("differs");
    assert!(diff.contains("another order"), "{diff}");
    // Long differences are cut short.
    let many: String = (0..30).map(|i| format!("n{i:02}: t\n")).collect();
    let (_, diff) = difference("", &many).expect("differs");
    assert_eq!(diff.lines().count(), 21);
    assert!(diff.ends_with("… and 10 more"), "{diff}");
}

#[test]
fn json_it_cannot_read_is_an_error_naming_the_format_version() {
    let err = entries(&json!({"format_version": 99})).expect_err("no index");
    assert!(err.contains("format_version 99"), "{err}");
    assert!(err.contains("index"), "{err}");
    // A type of a kind this reader does not know is an error, never silently left out.
    let mut doc = doc();
    doc["index"]["5"]["inner"]["struct_field"] = json!({"new_kind_of_type": {}});
    let err = entries(&doc).expect_err("unknown type");
    assert!(err.contains("format_version 57"), "{err}");
    assert!(err.contains("new_kind_of_type"), "{err}");
}

#[test]
fn older_field_names_are_read_too() {
    // Format versions before 36 said `name` for a path and `import` for a `use`.
    let mut doc = doc();
    let use_item = doc["index"]["3"]["inner"]["use"].take();
    doc["index"]["3"]["inner"] = json!({ "import": use_item });
    doc["index"]["5"]["inner"]["struct_field"] =
        json!({"resolved_path": {"name": "BlockId", "id": 100, "args": null}});
    assert_eq!(
        lines(&entries(&doc).expect("readable")),
        lines(&entries(&self::doc()).expect("readable"))
    );
}

#[test]
fn std_paths_are_shown_under_std() {
    assert_eq!(
        display_path(&["core", "option", "Option"]),
        "std::option::Option"
    );
    assert_eq!(display_path(&["alloc", "vec", "Vec"]), "std::vec::Vec");
    assert_eq!(display_path(&["ckptfmt", "core", "X"]), "ckptfmt::core::X");
}
