//! `--kv-ram`: the KV pool under a RAM budget, its pages past it spilled to a store and
//! attended to from their files; with `--evict`, every decoded token reads them from the disk,
//! and the run also measures the disk's sequential read speed on the same files, so that the
//! decode time can be set against the time its bytes take to read.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use engine::store::{SessionStore, StoreConfig};
use engine::{KvStats, Model, Session};

/// The spill side of a bench run (nothing without `--kv-ram`).
pub struct SpillRun {
    /// The directory holding each repetition's store, and whether it is ours to remove.
    root: Option<(PathBuf, bool)>,
    model: Arc<Model>,
    config: StoreConfig,
    evict: bool,
    store: Option<SessionStore>,
    rep_dir: Option<PathBuf>,
    /// Bytes attention had read from block files when decoding began.
    read_at_decode: Option<u64>,
    generated: Vec<u32>,
    stats: Option<KvStats>,
    resident: Option<usize>,
    /// Per repetition with `--evict`: (decode seconds per token, bytes read per token, disk
    /// bytes per second).
    evicted: Vec<(f64, f64, f64)>,
}

impl SpillRun {
    pub fn new(args: &super::Args, model: &Arc<Model>, config: &StoreConfig) -> Result<SpillRun> {
        let root = match (&args.kv_ram, &args.spill_dir) {
            (None, _) => None,
            (Some(_), Some(dir)) => Some((dir.clone(), false)),
            (Some(_), None) => {
                let dir = std::env::temp_dir()
                    .join(format!("llama-hdd-bench-spill-{}", std::process::id()));
                Some((dir, true))
            }
        };
        Ok(SpillRun {
            root,
            model: model.clone(),
            config: StoreConfig {
                // Spilled pages go straight to their files; the RAM tier holds none.
                ram_bytes: 1 << 20,
                ..config.clone()
            },
            evict: args.evict,
            store: None,
            rep_dir: None,
            read_at_decode: None,
            generated: Vec::new(),
            stats: None,
            resident: None,
            evicted: Vec::new(),
        })
    }

    /// Gives repetition `rep`'s session a fresh store to spill to.
    pub fn attach(&mut self, session: &mut Session, rep: usize) -> Result<()> {
        let Some((root, _)) = &self.root else {
            return Ok(());
        };
        let dir = root.join(format!("rep{rep}"));
        let _ = std::fs::remove_dir_all(&dir);
        let store = SessionStore::open(&dir, &self.model, self.config.clone())?;
        session.context_mut().spill_to(&store)?;
        self.store = Some(store);
        self.rep_dir = Some(dir);
        self.read_at_decode = None;
        Ok(())
    }

    /// Before each decoded token (untimed): with `--evict`, the spilled blocks leave memory.
    pub fn before_token(&mut self, session: &Session) {
        let stats = session.context().stats();
        self.read_at_decode.get_or_insert(stats.spill_bytes_read);
        if self.evict {
            session.context().evict_spilled();
        }
    }

    /// After a repetition's decoding (`elapsed` over `n` tokens): its figures; with `--evict`,
    /// the disk's sequential speed over the same files. Removes the repetition's store.
    pub fn after_rep(
        &mut self,
        session: &Session,
        generated: Vec<u32>,
        elapsed: Duration,
        n: usize,
    ) -> Result<()> {
        self.generated = generated;
        let stats = session.context().stats();
        self.stats = Some(stats);
        self.resident = session.context().kv_resident_bytes();
        let Some(dir) = self.rep_dir.take() else {
            return Ok(());
        };
        if self.evict && n > 0 {
            let read = stats.spill_bytes_read - self.read_at_decode.unwrap_or(0);
            session.context().evict_spilled();
            let speed = read_speed(&dir)?;
            self.evicted.push((
                elapsed.as_secs_f64() / n as f64,
                read as f64 / n as f64,
                speed,
            ));
        }
        self.store = None;
        if self.root.as_ref().is_some_and(|(_, ours)| *ours) {
            let _ = std::fs::remove_dir_all(&dir);
        }
        Ok(())
    }

    /// Adds the spill figures to the bench's JSON line.
    pub fn report(&self, out: &mut serde_json::Value) -> Result<()> {
        if let Some((root, true)) = &self.root {
            let _ = std::fs::remove_dir_all(root);
        }
        out["vm_hwm_kib"] = serde_json::json!(vm_hwm_kib());
        out["generated"] = serde_json::json!(self.generated);
        let Some(stats) = self.stats else {
            return Ok(());
        };
        out["kv_resident_bytes"] = serde_json::json!(self.resident);
        out["kv_pages_used"] = serde_json::json!(stats.pages_used);
        out["kv_pages_spilled"] = serde_json::json!(stats.pages_spilled);
        out["spill_bytes_read"] = serde_json::json!(stats.spill_bytes_read);
        if !self.evicted.is_empty() {
            let mut per_token: Vec<f64> = self.evicted.iter().map(|e| e.0).collect();
            let mut ratio: Vec<f64> = self
                .evicted
                .iter()
                .map(|&(t, bytes, speed)| t / (bytes / speed))
                .collect();
            let mut speed: Vec<f64> = self.evicted.iter().map(|e| e.2).collect();
            let bytes = self.evicted[0].1;
            out["evicted"] = serde_json::json!({
                "decode_ms_per_token": super::median(&mut per_token) * 1e3,
                "bytes_read_per_token": bytes,
                "disk_read_mb_s": super::median(&mut speed) / 1e6,
                "ratio_to_disk_read": super::median(&mut ratio),
            });
        }
        Ok(())
    }
}

/// Reads every file under `dir` whole in 1 MiB reads (as `dd` would), after dropping them
/// from the page cache; returns bytes per second.
fn read_speed(dir: &Path) -> Result<f64> {
    let files = engine::testing::files_under(dir);
    for f in &files {
        let file = std::fs::File::open(f)?;
        rustix::fs::fadvise(&file, 0, None, rustix::fs::Advice::DontNeed)?;
    }
    let mut buf = vec![0u8; 1 << 20];
    let mut n = 0u64;
    let t = Instant::now();
    for f in &files {
        let mut file = std::fs::File::open(f)?;
        loop {
            let k = file.read(&mut buf)?;
            if k == 0 {
                break;
            }
            n += k as u64;
        }
    }
    Ok(n as f64 / t.elapsed().as_secs_f64())
}

/// The process's peak resident memory (`VmHWM`), in KiB; `None` where unknown.
fn vm_hwm_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}
