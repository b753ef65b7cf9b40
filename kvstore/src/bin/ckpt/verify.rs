//! `ckpt verify DIR`: every file of a store directory (or of a bare `ckptfmt`
//! store), checked read-only, every bad one reported by its path, then a
//! summary.
//!
//! Nothing is created, removed, locked for writing or recovered, so it runs
//! beside live writers and on a read-only copy. Each block file is read and
//! verified once; a checkpoint whose blocks are not all known good is checked
//! again under the store's reader lock (so a block a collection removed
//! after the listing is not mistaken for damage).

use std::collections::HashSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use ckptfmt::store::{
    BLOCKS_DIR, BLOCK_SUFFIX, DESCRIPTOR_FILE, MANIFESTS_DIR, MANIFEST_SUFFIX, TMP_SUFFIX,
};
use ckptfmt::{BlockId, Fingerprint, FormatError, StdFs, Store, Vfs};
use kvstore::legacy::{detect, Layout};
use kvstore::store::MODELS_DIR;

use crate::{is_broken_pipe, CliError};

/// A checkpoint that is not restorable whole (its manifest is fine).
struct Damaged {
    manifest: PathBuf,
    name: String,
    good_blocks: usize,
    n_blocks: usize,
    good_tokens: usize,
    n_tokens: usize,
    reason: String,
}

/// What the walk found.
#[derive(Default)]
struct Tally {
    models: usize,
    checkpoints: usize,
    blocks: usize,
    tmp_files: usize,
    bad: Vec<(PathBuf, String)>,
    damaged: Vec<Damaged>,
    notes: Vec<String>,
}

impl Tally {
    fn bad(&mut self, path: PathBuf, problem: impl ToString) {
        self.bad.push((path, problem.to_string()));
    }
}

/// `ckpt verify DIR`; exit status 1 when anything is bad.
pub fn verify_dir(dir: &Path, out: &mut dyn Write) -> Result<ExitCode, CliError> {
    let mut t = Tally::default();
    match detect(&StdFs, dir) {
        Layout::KvStore => {
            let models_dir = dir.join(MODELS_DIR);
            let mut names = StdFs
                .list(&models_dir)
                .map_err(|e| FormatError::io("list", &models_dir, e))?;
            names.sort();
            for name in names {
                let path = models_dir.join(&name);
                let Ok(fp) = Fingerprint::from_hex(&name) else {
                    t.notes.push(format!(
                        "{}: not a model directory, skipped",
                        path.display()
                    ));
                    continue;
                };
                if !path.join(DESCRIPTOR_FILE).exists() {
                    t.notes.push(format!(
                        "{}: no {DESCRIPTOR_FILE} (a model registration that never completed), skipped",
                        path.display()
                    ));
                    continue;
                }
                verify_store(&path, Some(fp), &mut t);
            }
        }
        Layout::LegacyCkptfmt => {
            // One model's directory inside a store directory is no legacy store.
            let in_store = dir
                .parent()
                .is_some_and(|p| p.file_name().is_some_and(|n| n == MODELS_DIR));
            if !in_store {
                t.notes.push(format!(
                "{} is a bare ckptfmt store (the layout before kvstore); `ckpt migrate` imports it",
                dir.display()
            ));
            }
            verify_store(dir, None, &mut t);
        }
        Layout::Unknown => {
            return Err(CliError::Usage(format!(
                "{} is not a store directory (neither {MODELS_DIR}/ nor {DESCRIPTOR_FILE} inside)",
                dir.display()
            )))
        }
    }
    let failed = !t.bad.is_empty() || !t.damaged.is_empty();
    match print(&t, out) {
        Err(e) if is_broken_pipe(&e) => {}
        r => r?,
    }
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

fn print(t: &Tally, out: &mut dyn Write) -> Result<(), CliError> {
    for (path, problem) in &t.bad {
        writeln!(out, "bad file: {}: {problem}", path.display())?;
    }
    for d in &t.damaged {
        writeln!(
            out,
            "damaged checkpoint: {}: {:?} is restorable only up to token {} of {} \
             ({} of {} blocks good): {}",
            d.manifest.display(),
            d.name,
            d.good_tokens,
            d.n_tokens,
            d.good_blocks,
            d.n_blocks,
            d.reason
        )?;
    }
    for n in &t.notes {
        writeln!(out, "note: {n}")?;
    }
    if t.tmp_files > 0 {
        writeln!(
            out,
            "note: {} temporary files (saves in flight, or left by writers that died; \
             the next writer that can prove them dead removes them)",
            t.tmp_files
        )?;
    }
    let what = format!(
        "{} models, {} checkpoints, {} block files",
        t.models, t.checkpoints, t.blocks
    );
    if t.bad.is_empty() && t.damaged.is_empty() {
        writeln!(out, "ok: {what}")?;
    } else {
        writeln!(
            out,
            "FAILED: {what}: {} bad files, {} damaged checkpoints",
            t.bad.len(),
            t.damaged.len()
        )?;
    }
    Ok(())
}

/// File names in `dir` (sorted); a failure to list is reported as bad.
fn list(dir: &Path, t: &mut Tally) -> Vec<String> {
    match StdFs.list(dir) {
        Ok(mut v) => {
            v.sort();
            v
        }
        Err(e) => {
            t.bad(dir.to_path_buf(), format!("cannot list: {e}"));
            Vec::new()
        }
    }
}

/// Verifies one `ckptfmt` store (a model directory, or a bare store).
fn verify_store(dir: &Path, expected: Option<Fingerprint>, t: &mut Tally) {
    let store = match Store::open_read_only(dir) {
        Ok(s) => s,
        Err(e) => return t.bad(dir.join(DESCRIPTOR_FILE), e),
    };
    if let Some(fp) = expected {
        if *store.fingerprint() != fp {
            let why = format!("holds model {}, not {fp}", store.fingerprint());
            return t.bad(dir.join(DESCRIPTOR_FILE), why);
        }
    }
    t.models += 1;

    let blocks_dir = dir.join(BLOCKS_DIR);
    let mut good: HashSet<BlockId> = HashSet::new();
    for name in list(&blocks_dir, t) {
        let path = blocks_dir.join(&name);
        if name.ends_with(TMP_SUFFIX) {
            t.tmp_files += 1;
            continue;
        }
        let Some(id) = name
            .strip_suffix(BLOCK_SUFFIX)
            .and_then(|h| BlockId::from_hex(h).ok())
        else {
            t.bad(path, "not a block file (expected <block id>.blk)");
            continue;
        };
        match store.read_block(&id) {
            Ok(_) => {
                good.insert(id);
            }
            // Collected since the listing.
            Err(FormatError::NotFound { .. }) => continue,
            Err(e) => t.bad(path, e),
        }
        t.blocks += 1;
    }

    match store.quarantined() {
        Ok(files) => {
            for p in files {
                t.bad(
                    p,
                    "quarantined: failed verification earlier and was moved aside \
                     (never reused; delete it once inspected)",
                );
            }
        }
        Err(e) => t.bad(dir.join(ckptfmt::store::QUARANTINE_DIR), e),
    }

    let manifests_dir = dir.join(MANIFESTS_DIR);
    for file in list(&manifests_dir, t) {
        let path = manifests_dir.join(&file);
        if file.ends_with(TMP_SUFFIX) {
            t.tmp_files += 1;
            continue;
        }
        let Some(name) = file.strip_suffix(MANIFEST_SUFFIX) else {
            t.bad(path, "not a manifest file (expected <name>.ckpt)");
            continue;
        };
        // Verified, owner checked, inner name checked against the file name.
        let m = match store.read_manifest(name) {
            Ok(m) => m,
            Err(FormatError::NotFound { .. }) => continue,
            Err(e) => {
                t.bad(path, e);
                continue;
            }
        };
        t.checkpoints += 1;
        if m.block_ids.iter().all(|id| good.contains(id)) {
            continue;
        }
        match store.checkpoint_health(name) {
            Ok(h) => {
                let Some(b) = h.first_bad else {
                    continue; // written again since the listing
                };
                let tpb = store.geometry().tokens_per_block() as usize;
                t.damaged.push(Damaged {
                    manifest: path,
                    name: name.to_string(),
                    good_blocks: h.good_blocks,
                    n_blocks: h.manifest.block_ids.len(),
                    good_tokens: h.good_blocks * tpb,
                    n_tokens: h.manifest.tokens.len(),
                    reason: format!("block {} ({}): {}", b.index, b.path.display(), b.error),
                });
            }
            Err(FormatError::NotFound { .. }) => t.checkpoints -= 1,
            Err(e) => t.bad(path, e),
        }
    }
}
