//! `ckpt ls | rm | gc | migrate`: seeing and managing what a store directory
//! keeps, through `kvstore`'s API (so locks, sharing with live processes and
//! the rules of collection are the library's).

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

use ckptfmt::store::DESCRIPTOR_FILE;
use ckptfmt::StdFs;
use kvstore::legacy::{detect, Layout};
use kvstore::store::MODELS_DIR;
use kvstore::{format_size, Config, KvStore, ModelStore};

use crate::CliError;

/// Hex digits of a fingerprint shown by `ls` (enough to tell models apart;
/// `--model` accepts any prefix).
const SHORT_FP: usize = 12;

/// Settings for a short command: no background threads.
fn config() -> Config {
    Config {
        background: false,
        ..Config::default()
    }
}

/// Refuses a directory that is not a store directory, saying what it is.
fn require_store(dir: &Path) -> Result<(), CliError> {
    match detect(&StdFs, dir) {
        Layout::KvStore => Ok(()),
        Layout::LegacyCkptfmt => Err(CliError::Usage(format!(
            "{} is a bare ckptfmt store (the layout of `sessions/` before kvstore); \
             import it first: ckpt migrate {} NEW_DIR",
            dir.display(),
            dir.display()
        ))),
        Layout::Unknown => Err(CliError::Usage(format!(
            "{} is not a store directory (no {MODELS_DIR}/ inside)",
            dir.display()
        ))),
    }
}

/// The store's models, sorted by fingerprint.
fn models(store: &KvStore) -> Vec<ModelStore> {
    let mut fps = store.models();
    fps.sort_by_key(|fp| fp.to_hex());
    fps.iter()
        .filter_map(|fp| store.existing_model(fp))
        .collect()
}

fn short(m: &ModelStore) -> String {
    m.fingerprint().to_hex()[..SHORT_FP].to_string()
}

/// `2023-11-14 22:13:20 UTC` for Unix seconds; `-` for 0 (unknown).
pub fn utc(secs: u64) -> String {
    if secs == 0 {
        return "-".into();
    }
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    // Civil date from days since 1970-01-01, in 400-year eras that start
    // on 1 March (so the leap day ends a year).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// `ckpt ls DIR`: a header, then one line per checkpoint. Opens read-only.
pub fn ls(dir: &Path, out: &mut dyn Write) -> Result<ExitCode, CliError> {
    require_store(dir)?;
    let store = KvStore::open_read_only(dir, config())?;
    let mut rows = Vec::new();
    for m in models(&store) {
        for c in m.checkpoints()? {
            // A manifest that cannot be read is listed (with 0 tokens) and said so; a pin, a
            // namespace (a chain root of block 0) and an expiry are noted after the last use.
            let last_use = match m.read_manifest(&c.name) {
                Ok(manifest) => {
                    let mut notes = Vec::new();
                    if c.name.starts_with("_pin-") {
                        notes.push("pin".to_owned());
                    }
                    if manifest.chain_roots.first().is_some_and(|r| r.block == 0) {
                        notes.push("namespaced".to_owned());
                    }
                    let expires = manifest
                        .meta
                        .kv
                        .iter()
                        .find(|(k, _)| k == kvstore::EXPIRES_KEY);
                    if let Some(e) = expires.and_then(|(_, v)| v.parse::<u64>().ok()) {
                        notes.push(format!("expires {}", utc(e)));
                    }
                    match notes.is_empty() {
                        true => utc(c.last_used_unix),
                        false => format!("{}  [{}]", utc(c.last_used_unix), notes.join(", ")),
                    }
                }
                Err(_) => "- (manifest damaged: see `ckpt verify`)".to_string(),
            };
            rows.push([
                short(&m),
                c.name,
                c.n_tokens.to_string(),
                c.own_bytes.to_string(),
                last_use,
            ]);
        }
    }
    let name_w = rows.iter().map(|r| r[1].len()).max().unwrap_or(0).max(4);
    let line = |out: &mut dyn Write, r: [&str; 5]| {
        writeln!(
            out,
            "{:<SHORT_FP$}  {:<name_w$}  {:>8}  {:>12}  {}",
            r[0], r[1], r[2], r[3], r[4]
        )
    };
    line(out, ["MODEL", "NAME", "TOKENS", "OWN_BYTES", "LAST_USE"])?;
    for r in &rows {
        line(out, [&r[0], &r[1], &r[2], &r[3], &r[4]])?;
    }
    Ok(ExitCode::SUCCESS)
}

/// `ckpt rm DIR NAME [--model FP_PREFIX]`.
pub fn rm(
    dir: &Path,
    name: &str,
    model: Option<&str>,
    out: &mut dyn Write,
) -> Result<ExitCode, CliError> {
    require_store(dir)?;
    let store = KvStore::open(dir, config())?;
    let all = models(&store);
    let prefix = model.map(str::to_ascii_lowercase);
    let chosen: Vec<&ModelStore> = all
        .iter()
        .filter(|m| {
            prefix
                .as_deref()
                .is_none_or(|p| m.fingerprint().to_hex().starts_with(p))
        })
        .collect();
    if chosen.is_empty() {
        let known: Vec<String> = all.iter().map(short).collect();
        return Err(CliError::Usage(format!(
            "no model's fingerprint starts with {:?} (models: {})",
            model.unwrap_or_default(),
            known.join(", ")
        )));
    }
    let mut hits = Vec::new();
    for m in chosen {
        if m.list()?.iter().any(|n| n == name) {
            hits.push(m);
        }
    }
    let m = match hits.as_slice() {
        [] => {
            return Err(CliError::Usage(format!(
                "no checkpoint {name:?} in {}{} (see `ckpt ls`)",
                dir.display(),
                model.map_or(String::new(), |p| format!(" for model {p}"))
            )))
        }
        [m] => *m,
        several => {
            let fps: Vec<String> = several.iter().map(|m| short(m)).collect();
            return Err(CliError::Usage(format!(
                "checkpoint {name:?} exists for {} models ({}); choose one with --model FP_PREFIX",
                several.len(),
                fps.join(", ")
            )));
        }
    };
    let own = m
        .checkpoints()?
        .into_iter()
        .find(|c| c.name == name)
        .map_or(0, |c| c.own_bytes);
    m.delete(name)?;
    writeln!(
        out,
        "deleted checkpoint {name:?} of model {}; it alone held {own} bytes ({}): its \
         manifest, gone now, and blocks that `ckpt gc` frees",
        short(m),
        format_size(own)
    )?;
    store.close()?;
    Ok(ExitCode::SUCCESS)
}

/// Bytes of the block files of every model (from the files themselves).
fn block_file_bytes(store: &KvStore) -> u64 {
    let mut total = 0;
    for m in models(store) {
        let dir = store
            .root()
            .join(MODELS_DIR)
            .join(m.fingerprint().to_hex())
            .join(ckptfmt::store::BLOCKS_DIR);
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        total += entries
            .filter_map(|e| e.ok()?.metadata().ok())
            .filter(|md| md.is_file())
            .map(|md| md.len())
            .sum::<u64>();
    }
    total
}

/// `ckpt gc DIR [--max-bytes SIZE]`.
pub fn gc(dir: &Path, max_bytes: Option<u64>, out: &mut dyn Write) -> Result<ExitCode, CliError> {
    require_store(dir)?;
    let store = KvStore::open(dir, config())?;
    let now = kvstore::unix_now();
    for m in models(&store) {
        for name in m.delete_expired(now)? {
            writeln!(out, "deleted the expired checkpoint {name}")?;
        }
    }
    let report = match max_bytes {
        Some(b) => store.gc_to(b)?,
        None => store.gc()?,
    };
    let left = block_file_bytes(&store);
    writeln!(
        out,
        "freed {} block files, {} bytes ({}); block files now take {} bytes ({})",
        report.blocks,
        report.bytes,
        format_size(report.bytes),
        left,
        format_size(left)
    )?;
    if let Some(b) = max_bytes.filter(|b| left > *b) {
        writeln!(
            out,
            "note: still above {b} bytes ({}): the rest is held by checkpoints \
             (see `ckpt ls`, delete with `ckpt rm`)",
            format_size(b)
        )?;
    }
    for p in &report.set_aside {
        writeln!(
            out,
            "note: a damaged manifest was set aside, its checkpoint is lost: {}",
            p.display()
        )?;
    }
    store.close()?;
    Ok(ExitCode::SUCCESS)
}

/// `ckpt migrate LEGACY_DIR DIR`: exit status 1 when a checkpoint could not
/// be imported (it stays in the legacy directory, which is only read).
pub fn migrate(legacy: &Path, dir: &Path, out: &mut dyn Write) -> Result<ExitCode, CliError> {
    match detect(&StdFs, legacy) {
        Layout::LegacyCkptfmt => {}
        Layout::KvStore => {
            return Err(CliError::Usage(format!(
                "{} is already a store directory ({MODELS_DIR}/ inside): nothing to migrate",
                legacy.display()
            )))
        }
        Layout::Unknown => {
            return Err(CliError::Usage(format!(
                "{} holds no bare ckptfmt store (no {DESCRIPTOR_FILE}): nothing to migrate",
                legacy.display()
            )))
        }
    }
    if detect(&StdFs, dir) == Layout::LegacyCkptfmt {
        return Err(CliError::Usage(format!(
            "{} is a bare ckptfmt store itself; give a new or existing store directory",
            dir.display()
        )));
    }
    let store = KvStore::open(dir, config())?;
    let report = kvstore::legacy::migrate(legacy, &store)?;
    store.close()?;
    for name in &report.migrated {
        writeln!(out, "migrated {name:?}")?;
    }
    for (name, why) in &report.skipped {
        writeln!(out, "not migrated {name:?}: {why}")?;
    }
    let total = report.migrated.len() + report.skipped.len();
    writeln!(
        out,
        "migrated {} of {total} checkpoints from {} into {} ({} blocks written); {} was only read: \
         delete it once satisfied",
        report.migrated.len(),
        legacy.display(),
        dir.display(),
        report.blocks_written,
        legacy.display()
    )?;
    if report.skipped.is_empty() {
        Ok(ExitCode::SUCCESS)
    } else {
        writeln!(
            out,
            "{} checkpoints could not be migrated and stay in {}",
            report.skipped.len(),
            legacy.display()
        )?;
        Ok(ExitCode::FAILURE)
    }
}

#[cfg(test)]
mod tests {
    use super::utc;

    #[test]
    fn unix_seconds_print_as_utc_dates() {
        assert_eq!(utc(0), "-");
        assert_eq!(utc(1), "1970-01-01 00:00:01 UTC");
        assert_eq!(utc(951_782_400), "2000-02-29 00:00:00 UTC");
        assert_eq!(utc(1_700_000_000), "2023-11-14 22:13:20 UTC");
        assert_eq!(utc(4_107_542_399), "2100-02-28 23:59:59 UTC");
    }
}
