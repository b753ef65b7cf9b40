//! `ckpt inspect` (a store directory, a bare `ckptfmt` store or one file) and
//! `ckpt verify` of one block, manifest or export file. Everything here only
//! reads.

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

use ckptfmt::layout::{BLOCK_MAGIC, EXPORT_MAGIC, MANIFEST_MAGIC};
use ckptfmt::store::{DESCRIPTOR_FILE, MANIFESTS_DIR, MANIFEST_SUFFIX};
use ckptfmt::{BlockView, ExportView, FormatError, Geometry, Manifest, ManifestView, StdFs, Store};
use kvstore::legacy::{detect, Layout};
use kvstore::store::MODELS_DIR;
use serde_json::{json, Value};

use crate::CliError;

fn read_file(path: &Path) -> Result<Vec<u8>, FormatError> {
    std::fs::read(path).map_err(|e| FormatError::io("read", path, e))
}

fn magic_of(bytes: &[u8]) -> [u8; 8] {
    let mut m = [0u8; 8];
    let n = bytes.len().min(8);
    m[..n].copy_from_slice(&bytes[..n]);
    m
}

fn bad_magic(magic: [u8; 8]) -> FormatError {
    FormatError::BadMagic {
        what: "ckptfmt file (block, manifest or export)",
        offset: 0,
        found: magic,
    }
}

fn geometry_json(g: &Geometry) -> Value {
    json!({
        "n_layers": g.n_layers(),
        "elem": g.elem().name(),
        "tokens_per_block": g.tokens_per_block(),
        "bytes_per_token": g.bytes_per_token(),
        "block_bytes": g.block_bytes(),
        "layers": g.layers().iter().map(|l| json!([l.k_bytes_per_token, l.v_bytes_per_token])).collect::<Vec<_>>(),
    })
}

fn manifest_json(m: &Manifest) -> Value {
    json!({
        "kind": "manifest",
        "name": m.meta.name,
        "parent": m.meta.parent,
        "created_unix": m.meta.created_unix,
        "fingerprint": m.fingerprint.to_hex(),
        "geometry": geometry_json(&m.geometry),
        "n_tokens": m.tokens.len(),
        "n_blocks": m.block_ids.len(),
        "tail_tokens": m.tail_tokens(),
        "tail_kv_bytes": m.tail_kv.len(),
        "sampler_state_bytes": m.sampler_state.as_ref().map(Vec::len),
        "first_positions": m.positions.iter().take(4).collect::<Vec<_>>(),
        "block_ids": m.block_ids.iter().map(|b| b.to_hex()).collect::<Vec<_>>(),
        "chain_roots": m
            .chain_roots
            .iter()
            .map(|r| json!([r.block, r.id.to_hex()]))
            .collect::<Vec<_>>(),
        "meta": m.meta.kv.iter().map(|(k, v)| json!([k, v])).collect::<Vec<_>>(),
    })
}

fn block_json(v: &BlockView<'_>) -> Value {
    json!({
        "kind": "block",
        "id": v.id().to_hex(),
        "prev": v.prev().map(|p| p.to_hex()),
        "fingerprint": v.fingerprint().to_hex(),
        "encoding": v.encoding().name(),
        "n_tokens": v.n_tokens(),
        "raw_len": v.raw_len(),
        "payload_len": v.payload().len(),
        "record_len": v.record_len(),
    })
}

/// A bare `ckptfmt` store (one model), opened read-only.
fn store_json(path: &Path) -> Result<Value, FormatError> {
    let store = Store::open_read_only(path)?;
    let mut names = store.list_manifests()?;
    names.sort();
    let mut cps = Vec::new();
    for n in &names {
        match store.read_manifest(n) {
            Ok(m) => cps.push(json!({"name": n, "n_tokens": m.tokens.len(), "n_blocks": m.block_ids.len(), "parent": m.meta.parent})),
            Err(e) => cps.push(json!({"name": n, "error": e.to_string()})),
        }
    }
    Ok(json!({
        "kind": "store",
        "fingerprint": store.fingerprint().to_hex(),
        "geometry": geometry_json(store.geometry()),
        "n_block_files": store.list_blocks()?.len(),
        "n_quarantined": store.quarantined()?.len(),
        "checkpoints": cps,
    }))
}

fn describe(path: &Path) -> Result<Value, CliError> {
    if path.is_dir() {
        return match detect(&StdFs, path) {
            Layout::KvStore => {
                let models_dir = path.join(MODELS_DIR);
                let mut names: Vec<String> = std::fs::read_dir(&models_dir)
                    .map_err(|e| FormatError::io("list", &models_dir, e))?
                    .filter_map(|e| e.ok()?.file_name().into_string().ok())
                    .collect();
                names.sort();
                let models = names
                    .iter()
                    .map(|n| {
                        let dir = models_dir.join(n);
                        store_json(&dir).unwrap_or_else(
                            |e| json!({"kind": "store", "directory": n, "error": e.to_string()}),
                        )
                    })
                    .collect::<Vec<_>>();
                Ok(json!({"kind": "kvstore", "models": models}))
            }
            Layout::LegacyCkptfmt => Ok(store_json(path)?),
            Layout::Unknown => Err(CliError::Usage(format!(
                "{} is not a store directory (neither {MODELS_DIR}/ nor {DESCRIPTOR_FILE} inside)",
                path.display()
            ))),
        };
    }
    let bytes = read_file(path)?;
    let magic = magic_of(&bytes);
    if magic == BLOCK_MAGIC {
        Ok(block_json(&BlockView::parse(&bytes)?))
    } else if magic == MANIFEST_MAGIC {
        Ok(manifest_json(&ManifestView::parse(&bytes)?.to_manifest()))
    } else if magic == EXPORT_MAGIC {
        let v = ExportView::parse(&bytes)?;
        Ok(json!({
            "kind": "export",
            "file_len": bytes.len(),
            "n_blocks": v.n_blocks(),
            "manifest": manifest_json(v.manifest()),
        }))
    } else {
        Err(bad_magic(magic).into())
    }
}

/// `ckpt inspect PATH [--json]`.
pub fn inspect(path: &Path, as_json: bool, out: &mut dyn Write) -> Result<(), CliError> {
    let v = describe(path)?;
    if as_json {
        writeln!(
            out,
            "{}",
            serde_json::to_string_pretty(&v).unwrap_or_default()
        )?;
    } else {
        print_plain(out, &v, 0)?;
    }
    Ok(())
}

fn print_plain(out: &mut dyn Write, v: &Value, indent: usize) -> std::io::Result<()> {
    let pad = " ".repeat(indent);
    match v {
        Value::Object(map) => {
            for (k, val) in map {
                match val {
                    Value::Object(_) => {
                        writeln!(out, "{pad}{k}:")?;
                        print_plain(out, val, indent + 2)?;
                    }
                    Value::Array(a) if a.iter().all(Value::is_object) && !a.is_empty() => {
                        writeln!(out, "{pad}{k}:")?;
                        for item in a {
                            writeln!(out, "{pad}  -")?;
                            print_plain(out, item, indent + 4)?;
                        }
                    }
                    Value::Array(a) if a.len() > 8 => {
                        writeln!(out, "{pad}{k}: [{} items]", a.len())?
                    }
                    _ => writeln!(out, "{pad}{k}: {val}")?,
                }
            }
        }
        _ => writeln!(out, "{pad}{v}")?,
    }
    Ok(())
}

/// `ckpt verify FILE`: one block, manifest or export file; one line, `ok: ...`
/// or `error: ...` naming the first problem.
pub fn verify_file(path: &Path, out: &mut dyn Write) -> Result<ExitCode, CliError> {
    match check_file(path) {
        Ok(msg) => {
            writeln!(out, "ok: {msg}")?;
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            writeln!(out, "error: {}: {e}", path.display())?;
            Ok(ExitCode::FAILURE)
        }
    }
}

fn check_file(path: &Path) -> Result<String, FormatError> {
    let bytes = read_file(path)?;
    let magic = magic_of(&bytes);
    if magic == BLOCK_MAGIC {
        let v = BlockView::parse(&bytes)?;
        Ok(format!("block {}", v.id()))
    } else if magic == MANIFEST_MAGIC {
        let m = Manifest::decode(&bytes)?;
        // A manifest inside a store: check its name and its blocks too.
        let store_root = path
            .parent()
            .filter(|d| d.file_name().is_some_and(|n| n == MANIFESTS_DIR))
            .and_then(Path::parent)
            .filter(|r| r.join(DESCRIPTOR_FILE).is_file());
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(MANIFEST_SUFFIX));
        if let (Some(root), Some(name)) = (store_root, name) {
            Store::open_read_only(root)?.verify_checkpoint(name)?;
            return Ok(format!(
                "checkpoint {name:?}: {} tokens, {} blocks, all blocks verified",
                m.tokens.len(),
                m.block_ids.len()
            ));
        }
        Ok(format!(
            "manifest {:?}: {} tokens, {} blocks (blocks not checked: not in a store)",
            m.meta.name,
            m.tokens.len(),
            m.block_ids.len()
        ))
    } else if magic == EXPORT_MAGIC {
        let v = ExportView::parse(&bytes)?;
        v.verify_all()?;
        Ok(format!(
            "export: {} tokens, {} blocks",
            v.manifest().tokens.len(),
            v.n_blocks()
        ))
    } else {
        Err(bad_magic(magic))
    }
}
