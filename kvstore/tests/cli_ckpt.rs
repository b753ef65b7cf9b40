//! The `ckpt` tool on stores written through the kvstore API, with real
//! files: ls, rm, gc, migrate, verify (every bad file named, nothing
//! written), inspect, bench, and a closed output pipe.

mod common;

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use ckptfmt::{Encoding, Fingerprint, Manifest, Metadata};
use common::{fp, geometry, inline_config, kv_of, manifest, put_tokens};
use kvstore::{BlockId, KvStore, ModelStore};

const CREATED: u64 = 1_700_000_000;
const CREATED_UTC: &str = "2023-11-14 22:13:20 UTC";

fn ckpt(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_ckpt"))
        .args(args)
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code().unwrap_or(-1), text)
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn other_fp() -> Fingerprint {
    Fingerprint::of(b"another model")
}

/// Puts `tokens` (contents from `kv_of`) and saves them as `name`, created at [`CREATED`].
fn save(model: &ModelStore, name: &str, tokens: &[u32]) -> Manifest {
    let tpb = geometry().tokens_per_block();
    let ids = BlockId::chain_all(&model.fingerprint(), tokens, tpb);
    model.put_sequence(tokens, |i| kv_of(&ids[i])).unwrap();
    let g = geometry();
    let tail = vec![0u8; g.span_bytes(tokens.len() as u64 % u64::from(tpb)) as usize];
    let meta = Metadata {
        name: name.into(),
        created_unix: CREATED,
        ..Metadata::default()
    };
    let positions = (0..tokens.len() as i32).collect();
    let m = Manifest::new(
        model.fingerprint(),
        g,
        tokens.to_vec(),
        positions,
        tail,
        meta,
    )
    .unwrap();
    assert_eq!(m.block_ids, ids);
    model.save(&m).unwrap();
    m
}

fn flip(path: &Path, at: usize) {
    let mut b = std::fs::read(path).unwrap();
    b[at] ^= 0x40;
    std::fs::write(path, &b).unwrap();
}

fn file_len(p: &Path) -> u64 {
    std::fs::metadata(p).unwrap().len()
}

fn block_files(model_dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(model_dir.join("blocks"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    v.sort();
    v
}

fn model_dir(root: &Path, fp: &Fingerprint) -> PathBuf {
    root.join("models").join(fp.to_hex())
}

/// Every path under `root` with its kind, length, mtime and mode.
fn snapshot(root: &Path) -> BTreeMap<PathBuf, String> {
    use std::os::unix::fs::PermissionsExt;
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(p) = stack.pop() {
        let md = std::fs::symlink_metadata(&p).unwrap();
        out.insert(
            p.clone(),
            format!(
                "dir={} len={} mtime={:?} mode={:o}",
                md.is_dir(),
                md.len(),
                md.modified().unwrap(),
                md.permissions().mode()
            ),
        );
        if md.is_dir() {
            for e in std::fs::read_dir(&p).unwrap() {
                stack.push(e.unwrap().path());
            }
        }
    }
    out
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dst = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_tree(&e.path(), &dst);
        } else {
            std::fs::copy(e.path(), &dst).unwrap();
        }
    }
}

fn set_read_only(root: &Path, read_only: bool) {
    for p in snapshot(root).keys() {
        let mut perm = std::fs::metadata(p).unwrap().permissions();
        perm.set_readonly(read_only);
        std::fs::set_permissions(p, perm).unwrap();
    }
}

#[test]
fn ls_shows_each_checkpoint_with_the_bytes_it_alone_holds() {
    let dir = tempfile::tempdir().unwrap();
    let store = KvStore::open(dir.path(), inline_config(64)).unwrap();
    let a = store.model(fp(), geometry()).unwrap();
    let b = store.model(other_fp(), geometry()).unwrap();
    let base: Vec<u32> = (0..12).collect(); // 3 blocks
    let longer: Vec<u32> = (0..18).collect(); // the 3 blocks, one more, a tail of 2
    save(&a, "base", &base);
    let ml = save(&a, "longer", &longer);
    save(&b, "other", &(100..105).collect::<Vec<_>>());
    drop(store);

    let (code, text) = ckpt(&["ls", s(dir.path())]);
    assert_eq!(code, 0, "{text}");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 4, "{text}");
    let header: Vec<&str> = lines[0].split_whitespace().collect();
    assert_eq!(header[..2], ["MODEL", "NAME"], "{text}");
    let rows: Vec<Vec<&str>> = lines[1..]
        .iter()
        .map(|l| l.split_whitespace().collect())
        .collect();
    let row = |name: &str| rows.iter().find(|r| r[1] == name).unwrap().clone();

    // "base" shares all its blocks with "longer": it alone holds its manifest.
    let mdir = model_dir(dir.path(), &fp());
    let manifest_len = |n: &str| file_len(&mdir.join(format!("manifests/{n}.ckpt")));
    let r = row("base");
    assert_eq!(r[0], &fp().to_hex()[..12]);
    assert_eq!(r[2], "12");
    assert_eq!(r[3], manifest_len("base").to_string());
    assert_eq!(r[4..].join(" "), CREATED_UTC);
    // "longer" alone holds its fourth block.
    let fourth = a_block_path(&mdir, &ml.block_ids[3]);
    let r = row("longer");
    assert_eq!(r[2], "18");
    assert_eq!(
        r[3],
        (manifest_len("longer") + file_len(&fourth)).to_string()
    );
    let r = row("other");
    assert_eq!(r[0], &other_fp().to_hex()[..12]);
    assert_eq!(r[2], "5");

    // A directory that is not a store is refused with a reason.
    let (code, text) = ckpt(&["ls", s(&dir.path().join("models"))]);
    assert_ne!(code, 0);
    assert!(text.contains("not a store directory"), "{text}");
}

fn a_block_path(model_dir: &Path, id: &BlockId) -> PathBuf {
    model_dir
        .join("blocks")
        .join(format!("{}.blk", id.to_hex()))
}

#[test]
fn rm_deletes_one_checkpoint_and_wants_the_model_when_the_name_is_ambiguous() {
    let dir = tempfile::tempdir().unwrap();
    let store = KvStore::open(dir.path(), inline_config(64)).unwrap();
    let a = store.model(fp(), geometry()).unwrap();
    let b = store.model(other_fp(), geometry()).unwrap();
    save(&a, "same", &(0..8).collect::<Vec<_>>());
    save(&a, "only-a", &(0..9).collect::<Vec<_>>());
    save(&b, "same", &(0..8).collect::<Vec<_>>());
    drop(store);
    let root = s(dir.path());

    let (code, text) = ckpt(&["rm", root, "same"]);
    assert_ne!(code, 0, "{text}");
    assert!(text.contains("--model"), "{text}");
    assert!(text.contains(&fp().to_hex()[..12]) && text.contains(&other_fp().to_hex()[..12]));
    let (code, text) = ckpt(&["rm", root, "missing"]);
    assert_ne!(code, 0);
    assert!(text.contains("no checkpoint \"missing\""), "{text}");
    let (code, text) = ckpt(&["rm", root, "same", "--model", "zz"]);
    assert_ne!(code, 0);
    assert!(text.contains("no model"), "{text}");

    let prefix = &fp().to_hex()[..6];
    let (code, text) = ckpt(&["rm", root, "same", "--model", prefix]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("deleted checkpoint \"same\""), "{text}");

    let store = KvStore::open(dir.path(), inline_config(64)).unwrap();
    let a = store.existing_model(&fp()).unwrap();
    let b = store.existing_model(&other_fp()).unwrap();
    assert_eq!(a.list().unwrap(), ["only-a"]);
    assert_eq!(b.list().unwrap(), ["same"]);
    // Its blocks are kept for the checkpoint that still needs them.
    assert_eq!(a.load("only-a").unwrap().blocks.len(), 2);
}

#[test]
fn gc_frees_unneeded_blocks_down_to_a_budget() {
    let dir = tempfile::tempdir().unwrap();
    let store = KvStore::open(dir.path(), inline_config(64)).unwrap();
    let a = store.model(fp(), geometry()).unwrap();
    let keep = save(&a, "keep", &(0..8).collect::<Vec<_>>());
    // Six blocks no checkpoint references.
    put_tokens(&a, &(1000..1024).collect::<Vec<_>>()).unwrap();
    store.flush().unwrap();
    drop(store);
    let mdir = model_dir(dir.path(), &fp());
    let files = block_files(&mdir);
    assert_eq!(files.len(), 8);
    let rec = file_len(&files[0]);
    let root = s(dir.path());

    let (code, text) = ckpt(&["gc", root, "--max-bytes", "5parsecs"]);
    assert_ne!(code, 0);
    assert!(text.contains("unknown unit"), "{text}");

    let budget = format!("{}B", 4 * rec);
    let (code, text) = ckpt(&["gc", root, "--max-bytes", &budget]);
    assert_eq!(code, 0, "{text}");
    assert!(
        text.starts_with(&format!("freed 4 block files, {} bytes", 4 * rec)),
        "{text}"
    );
    assert_eq!(block_files(&mdir).len(), 4);
    for id in &keep.block_ids {
        assert!(a_block_path(&mdir, id).exists());
    }

    let (code, text) = ckpt(&["gc", root]);
    assert_eq!(code, 0, "{text}");
    assert!(text.starts_with("freed 2 block files"), "{text}");
    let mut left = block_files(&mdir);
    let mut want: Vec<PathBuf> = keep
        .block_ids
        .iter()
        .map(|id| a_block_path(&mdir, id))
        .collect();
    left.sort();
    want.sort();
    assert_eq!(left, want);

    // A budget the checkpoints alone exceed: nothing to free, and said so.
    let (code, text) = ckpt(&["gc", root, "--max-bytes", "1"]);
    assert_eq!(code, 0, "{text}");
    assert!(text.starts_with("freed 0 block files"), "{text}");
    assert!(text.contains("held by checkpoints"), "{text}");
    let store = KvStore::open(dir.path(), inline_config(64)).unwrap();
    let back = store.existing_model(&fp()).unwrap().load("keep").unwrap();
    assert_eq!(&back.blocks[1][..], &kv_of(&keep.block_ids[1])[..]);
}

/// A bare ckptfmt store as the chat wrote to `sessions/` before kvstore.
fn legacy_store(dir: &Path, names: &[(&str, u32)]) -> Vec<Manifest> {
    let store = ckptfmt::Store::open(dir, fp(), geometry()).unwrap();
    let mut out = Vec::new();
    for (name, n) in names {
        let tokens: Vec<u32> = (0..*n).collect();
        let m = manifest(name, &tokens);
        store
            .save(
                &m,
                |i| Ok(Cow::Owned(kv_of(&m.block_ids[i]))),
                Encoding::Raw,
            )
            .unwrap();
        out.push(m);
    }
    out
}

#[test]
fn migrate_imports_a_legacy_store_and_only_reads_it() {
    let dir = tempfile::tempdir().unwrap();
    let legacy = dir.path().join("sessions");
    let dest = dir.path().join("store");
    let saved = legacy_store(&legacy, &[("chat-1", 10), ("chat-2", 13)]);
    let before = snapshot(&legacy);

    let (code, text) = ckpt(&["ls", s(&legacy)]);
    assert_ne!(code, 0);
    assert!(text.contains("ckpt migrate"), "{text}");

    let (code, text) = ckpt(&["migrate", s(&legacy), s(&dest)]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("migrated 2 of 2 checkpoints"), "{text}");
    assert_eq!(
        snapshot(&legacy),
        before,
        "the legacy directory was written"
    );

    let store = KvStore::open(&dest, inline_config(64)).unwrap();
    let model = store.existing_model(&fp()).unwrap();
    assert_eq!(model.list().unwrap(), ["chat-1", "chat-2"]);
    for m in &saved {
        let back = model.load(&m.meta.name).unwrap();
        assert_eq!(back.manifest.tokens, m.tokens);
        for (id, kv) in m.block_ids.iter().zip(&back.blocks) {
            assert_eq!(&kv[..], &kv_of(id)[..]);
        }
    }
    drop(store);

    let (code, text) = ckpt(&["migrate", s(&dest), s(&dir.path().join("x"))]);
    assert_ne!(code, 0);
    assert!(text.contains("already a store directory"), "{text}");
    let empty = tempfile::tempdir().unwrap();
    let (code, text) = ckpt(&["migrate", s(empty.path()), s(&dest)]);
    assert_ne!(code, 0);
    assert!(text.contains("nothing to migrate"), "{text}");
}

#[test]
fn verify_names_every_bad_file_on_a_read_only_copy_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("store");
    let store = KvStore::open(&root, inline_config(64)).unwrap();
    let a = store.model(fp(), geometry()).unwrap();
    let b = store.model(other_fp(), geometry()).unwrap();
    save(&a, "good", &(0..10).collect::<Vec<_>>());
    let damaged = save(&a, "damaged", &(200..212).collect::<Vec<_>>());
    save(&a, "renamed", &(300..305).collect::<Vec<_>>());
    save(&a, "scribbled", &(400..402).collect::<Vec<_>>());
    let lost = save(&b, "lost", &(0..8).collect::<Vec<_>>());
    store.flush().unwrap();

    let adir = model_dir(&root, &fp());
    let bdir = model_dir(&root, &other_fp());
    // A damaged block (the second of "damaged").
    let bad_block = a_block_path(&adir, &damaged.block_ids[1]);
    flip(&bad_block, 4096);
    // A manifest whose inner name differs from its file name.
    let renamed = adir.join("manifests/moved.ckpt");
    std::fs::rename(adir.join("manifests/renamed.ckpt"), &renamed).unwrap();
    // A damaged manifest.
    let scribbled = adir.join("manifests/scribbled.ckpt");
    flip(&scribbled, 40);
    // A block that failed verification when read and was quarantined.
    flip(&a_block_path(&bdir, &lost.block_ids[0]), 4096);
    drop((a, b, store));
    let store = KvStore::open(&root, inline_config(64)).unwrap();
    let b = store.existing_model(&other_fp()).unwrap();
    assert!(!b.checkpoint_health("lost").unwrap().is_intact());
    drop((b, store));
    let quarantined: Vec<PathBuf> = std::fs::read_dir(bdir.join("quarantine"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(quarantined.len(), 1);

    let copy = dir.path().join("copy");
    copy_tree(&root, &copy);
    set_read_only(&copy, true);
    let before = snapshot(&copy);
    let (code, text) = ckpt(&["verify", s(&copy)]);
    let after = snapshot(&copy);
    set_read_only(&copy, false);
    assert_eq!(before, after, "verify wrote to the store");
    assert_eq!(code, 1, "{text}");

    let in_copy = |p: &Path| copy.join(p.strip_prefix(&root).unwrap());
    let bad_lines: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("bad file: "))
        .collect();
    assert_eq!(bad_lines.len(), 4, "{text}");
    for (p, why) in [
        (in_copy(&bad_block), "checksum"),
        (
            in_copy(&renamed),
            "holds checkpoint \"renamed\", not \"moved\"",
        ),
        (in_copy(&scribbled), "checksum mismatch in manifest"),
        (in_copy(&quarantined[0]), "quarantined"),
    ] {
        let want = format!("bad file: {}: ", p.display());
        let line = bad_lines.iter().find(|l| l.starts_with(&want));
        assert!(line.is_some_and(|l| l.contains(why)), "{p:?}: {text}");
    }
    let damaged_lines: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("damaged checkpoint: "))
        .collect();
    assert_eq!(damaged_lines.len(), 2, "{text}");
    assert!(damaged_lines
        .iter()
        .any(|l| l.contains("\"damaged\" is restorable only up to token 4 of 12")));
    assert!(damaged_lines
        .iter()
        .any(|l| l.contains("\"lost\" is restorable only up to token 0 of 8")));

    let last = text.lines().last().unwrap();
    assert!(
        last.starts_with("FAILED: 2 models, 3 checkpoints"),
        "{text}"
    );

    // ls on the read-only copy says which manifests are damaged.
    set_read_only(&copy, true);
    let (code, listing) = ckpt(&["ls", s(&copy)]);
    let after_ls = snapshot(&copy);
    set_read_only(&copy, false);
    assert_eq!(after_ls, after, "ls wrote to the store");
    assert_eq!(code, 0, "{listing}");
    for name in ["moved", "scribbled"] {
        let line = listing
            .lines()
            .find(|l| l.split_whitespace().nth(1) == Some(name));
        assert!(
            line.is_some_and(|l| l.contains("manifest damaged")),
            "{listing}"
        );
    }

    // The single files: the damaged block and the manifest that needs it.
    for p in [&bad_block, &adir.join("manifests/damaged.ckpt")] {
        let (code, text) = ckpt(&["verify", s(p)]);
        assert_ne!(code, 0, "{p:?}");
        assert_eq!(text.lines().count(), 1, "{text}");
        assert!(
            text.contains("checksum mismatch in block payload"),
            "{text}"
        );
    }
}

#[test]
fn verify_and_inspect_a_sound_store_and_its_files() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("store");
    let store = KvStore::open(&root, inline_config(64)).unwrap();
    let a = store.model(fp(), geometry()).unwrap();
    let m = save(&a, "cp", &(0..10).collect::<Vec<_>>());
    drop(store);
    let mdir = model_dir(&root, &fp());
    let export = dir.path().join("cp.export");
    ckptfmt::Store::open_read_only(&mdir)
        .unwrap()
        .export("cp", &export)
        .unwrap();
    let manifest = mdir.join("manifests/cp.ckpt");
    let block = a_block_path(&mdir, &m.block_ids[1]);

    for p in [&root, &mdir, &export, &manifest, &block] {
        let (code, text) = ckpt(&["verify", s(p)]);
        assert_eq!(code, 0, "{p:?}: {text}");
        assert!(text.lines().last().unwrap().starts_with("ok: "), "{text}");
    }
    for p in [&root, &mdir] {
        let (code, text) = ckpt(&["verify", s(p)]);
        assert_eq!(code, 0);
        assert_eq!(text.trim(), "ok: 1 models, 1 checkpoints, 2 block files");
    }

    let (code, text) = ckpt(&["inspect", s(&export), "--json"]);
    assert_eq!(code, 0, "{text}");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["kind"], "export");
    assert_eq!(v["manifest"]["n_tokens"], 10);
    let (code, text) = ckpt(&["inspect", s(&root), "--json"]);
    assert_eq!(code, 0, "{text}");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["kind"], "kvstore");
    assert_eq!(v["models"][0]["fingerprint"], fp().to_hex());
    assert_eq!(v["models"][0]["checkpoints"][0]["n_tokens"], 10);
    let (code, text) = ckpt(&["inspect", s(&root)]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("kind: \"kvstore\""), "{text}");

    // A truncated export fails.
    let e = std::fs::read(&export).unwrap();
    std::fs::write(&export, &e[..e.len() - 4096]).unwrap();
    let (code, text) = ckpt(&["verify", s(&export)]);
    assert_ne!(code, 0);
    assert!(text.contains("truncated export"), "{text}");
}

#[test]
fn a_closed_output_pipe_ends_the_command_quietly() {
    let dir = tempfile::tempdir().unwrap();
    let store = KvStore::open(dir.path(), inline_config(64)).unwrap();
    let a = store.model(fp(), geometry()).unwrap();
    for i in 0..20 {
        save(&a, &format!("chat-{i}"), &(i..i + 9).collect::<Vec<_>>());
    }
    drop(store);
    for args in [["inspect", s(dir.path())], ["ls", s(dir.path())]] {
        // The reader is gone before the tool writes anything.
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let out = Command::new(env!("CARGO_BIN_EXE_ckpt"))
            .args(args)
            .stdout(Stdio::from(writer))
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{args:?}: {:?} {err}", out.status);
        assert!(err.is_empty(), "{args:?}: {err}");
    }
    // verify keeps its verdict when nobody reads it.
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    flip(&block_files(&model_dir(dir.path(), &fp()))[0], 4096);
    let out = Command::new(env!("CARGO_BIN_EXE_ckpt"))
        .args(["verify", s(dir.path())])
        .stdout(Stdio::from(writer))
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stderr.is_empty());
}

#[test]
fn bench_prints_the_promised_figures() {
    let dir = tempfile::tempdir().unwrap();
    let (code, text) = ckpt(&[
        "bench",
        "--dir",
        s(dir.path()),
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

#[test]
fn ls_notes_pins_namespaces_and_expiry_and_gc_deletes_what_expired() {
    let dir = tempfile::tempdir().unwrap();
    let store = KvStore::open(dir.path(), inline_config(64)).unwrap();
    let model = store.model(fp(), geometry()).unwrap();
    let tokens: Vec<u32> = (0..8).collect();
    put_tokens(&model, &tokens).unwrap();
    let with = |name: &str, expires: Option<u64>| {
        let mut m = manifest(name, &tokens);
        m.meta.kv = expires
            .map(|e| vec![(kvstore::EXPIRES_KEY.to_owned(), e.to_string())])
            .unwrap_or_default();
        m
    };
    model.save(&with("_pin-old", Some(1_000))).unwrap();
    model
        .save(&with("_pin-later", Some(4_000_000_000)))
        .unwrap();
    model.save(&with("plain", None)).unwrap();
    drop(model);
    drop(store);

    let (code, text) = ckpt(&["ls", s(dir.path())]);
    assert_eq!(code, 0, "{text}");
    let line = |name: &str| {
        text.lines()
            .find(|l| l.split_whitespace().nth(1) == Some(name))
            .unwrap_or_else(|| panic!("{name} not listed: {text}"))
            .to_owned()
    };
    assert!(
        line("_pin-old").contains("[pin, expires 1970-01-01"),
        "{text}"
    );
    assert!(line("_pin-later").contains("[pin, expires 2096"), "{text}");
    assert!(!line("plain").contains('['), "{text}");

    let (code, text) = ckpt(&["gc", s(dir.path())]);
    assert_eq!(code, 0, "{text}");
    assert!(
        text.contains("deleted the expired checkpoint _pin-old"),
        "{text}"
    );
    let (_, text) = ckpt(&["ls", s(dir.path())]);
    assert!(!text.contains("_pin-old"), "{text}");
    assert!(
        text.contains("_pin-later") && text.contains("plain"),
        "{text}"
    );
}
