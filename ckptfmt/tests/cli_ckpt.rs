//! The `ckpt` tool: verify's exit status and one-line report, inspect's JSON,
//! and bench's JSON keys, on real files.

mod common;

use std::process::Command;

use ckptfmt::Store;
use common::{fp, small_geometry, Sequence};

fn ckpt(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_ckpt"))
        .args(args)
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code().unwrap_or(-1), text)
}

#[test]
fn verify_and_inspect_a_store_and_its_files() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("store");
    let store = Store::open(&root, fp(), small_geometry()).unwrap();
    let seq = Sequence::new(&small_geometry(), 10, 1);
    let m = seq.manifest("cp", None);
    seq.save(&store, &m).unwrap();
    let export = dir.path().join("cp.export");
    store.export("cp", &export).unwrap();
    let manifest = store.manifest_path("cp").unwrap();
    let block = store.block_path(&m.block_ids[1]);

    for p in [&root, &export, &manifest, &block] {
        let (code, text) = ckpt(&["verify", p.to_str().unwrap()]);
        assert_eq!(code, 0, "{p:?}: {text}");
        assert!(text.starts_with("ok: "), "{text}");
    }
    let (code, text) = ckpt(&["inspect", export.to_str().unwrap(), "--json"]);
    assert_eq!(code, 0, "{text}");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["kind"], "export");
    assert_eq!(v["manifest"]["n_tokens"], 10);
    let (code, text) = ckpt(&["inspect", root.to_str().unwrap()]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("kind: \"store\""), "{text}");

    // Damage a block: verifying the store, and the manifest in the store, fails with one line.
    let mut b = std::fs::read(&block).unwrap();
    b[4096] ^= 1;
    std::fs::write(&block, &b).unwrap();
    for p in [&root, &manifest, &block] {
        let (code, text) = ckpt(&["verify", p.to_str().unwrap()]);
        assert_ne!(code, 0, "{p:?}");
        assert_eq!(text.lines().count(), 1, "{text}");
        assert!(
            text.contains("checksum mismatch in block payload"),
            "{text}"
        );
    }
    // A truncated export fails too.
    let e = std::fs::read(&export).unwrap();
    std::fs::write(&export, &e[..e.len() - 4096]).unwrap();
    let (code, text) = ckpt(&["verify", export.to_str().unwrap()]);
    assert_ne!(code, 0);
    assert!(text.contains("truncated export"), "{text}");
}

#[test]
fn bench_prints_the_promised_figures() {
    let dir = tempfile::tempdir().unwrap();
    let (code, text) = ckpt(&[
        "bench",
        "--dir",
        dir.path().to_str().unwrap(),
        "--tokens",
        "40",
        "--layers",
        "2",
        "--bytes-per-token",
        "8",
        "--tokens-per-block",
        "8",
        "--iters",
        "1",
    ]);
    assert_eq!(code, 0, "{text}");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    for key in [
        "durable_write_mb_s",
        "raw_write_fsync_mb_s",
        "read_verify_mb_s",
        "raw_read_mb_s",
    ] {
        assert!(v[key].as_f64().is_some_and(|x| x > 0.0), "{key}: {text}");
    }
    assert_eq!(v["extend_by_64_tokens"]["blocks_written"], 8);
    // The bench cleans up after itself.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}
