//! `cargo xtask fetch-templates`: llama.cpp's chat templates that the engine's tests render
//! (`engine/tests/chat_templates.rs`) but whose licences forbid committing them here, taken
//! from the Python package that vendors llama.cpp, as `fetch-model` takes models.
//!
//! The source distribution is downloaded by pip, its sha256 checked against the pinned one, and
//! only the named `.jinja` files are extracted (each checked too) into `models/templates/`,
//! which git ignores.

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::model::{hex, pip_download, sha256_of};

/// The package (exact version) whose source distribution vendors llama.cpp.
const PACKAGE: &str = "llama-cpp-python==0.3.16";
/// The source distribution's file name, as pip saves it.
const SDIST: &str = "llama_cpp_python-0.3.16.tar.gz";
/// SHA-256 of [`SDIST`].
const SDIST_SHA256: &str = "34ed0f9bd9431af045bb63d9324ae620ad0536653740e9bb163a2e1fcb973be6";
/// Where llama.cpp's templates are inside the archive.
const MEMBER_DIR: &str = "llama_cpp_python-0.3.16/vendor/llama.cpp/models/templates";

/// The templates the tests read: file name and SHA-256.
pub const TEMPLATES: &[(&str, &str)] = &[
    (
        "CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja",
        "0c3f266d86f93a1f50f1573648ba005cb9691ff176c2cfd7ca1a0a33fd7023ec",
    ),
    (
        "meta-llama-Llama-3.3-70B-Instruct.jinja",
        "e10ca381b1ccc5cf9db52e371f3b6651576caee0a630b452e2816b2d404d4b65",
    ),
    (
        "fireworks-ai-llama-3-firefunction-v2.jinja",
        "25b097cb602823e9216258cf4b20a23ebd4004848e6c8d8da1f360fe2373410c",
    ),
];

/// Makes sure every template of [`TEMPLATES`] is in `<root>/models/templates` with the right
/// checksum; returns the directory.
///
/// Does nothing when they all verify. Otherwise downloads the source distribution (about
/// 50 MB) into a temporary directory, checks it, and writes each template under a temporary
/// name that is renamed into place once it verifies.
pub fn fetch(root: &Path) -> Result<PathBuf, String> {
    let dir = root.join("models").join("templates");
    if missing(&dir)?.is_empty() {
        eprintln!("{} holds the verified templates", dir.display());
        return Ok(dir);
    }
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let download = root.join("models").join(".download-templates");
    let _ = std::fs::remove_dir_all(&download);
    std::fs::create_dir_all(&download).map_err(|e| format!("{}: {e}", download.display()))?;
    let result = fetch_into(&download, &dir);
    let _ = std::fs::remove_dir_all(&download);
    result.map(|()| dir)
}

/// The templates absent from `dir` or with another checksum.
fn missing(dir: &Path) -> Result<Vec<&'static str>, String> {
    let mut out = Vec::new();
    for &(name, sha256) in TEMPLATES {
        let path = dir.join(name);
        if !path.is_file() || sha256_of(&path, "checking")? != sha256 {
            out.push(name);
        }
    }
    Ok(out)
}

fn fetch_into(download: &Path, dir: &Path) -> Result<(), String> {
    eprintln!("downloading the source distribution of {PACKAGE} (about 50 MB) with pip");
    pip_download(&[PACKAGE], &["--no-binary", "llama-cpp-python"], download)?;
    let sdist = download.join(SDIST);
    let digest = sha256_of(&sdist, "checking")?;
    if digest != SDIST_SHA256 {
        return Err(format!(
            "{SDIST} has sha256 {digest}, expected {SDIST_SHA256}"
        ));
    }
    let file = File::open(&sdist).map_err(|e| format!("{}: {e}", sdist.display()))?;
    let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(file));
    let entries = archive
        .entries()
        .map_err(|e| format!("{}: {e}", sdist.display()))?;
    let mut written = Vec::new();
    for entry in entries {
        let mut entry = entry.map_err(|e| format!("{}: {e}", sdist.display()))?;
        let path = entry
            .path()
            .map_err(|e| format!("{}: {e}", sdist.display()))?
            .into_owned();
        let Some(&(name, sha256)) = TEMPLATES
            .iter()
            .find(|(name, _)| path == Path::new(MEMBER_DIR).join(name))
        else {
            continue;
        };
        let mut bytes = Vec::new();
        entry
            .read_to_end(&mut bytes)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        let digest = hex(&Sha256::digest(&bytes));
        if digest != sha256 {
            return Err(format!("{name} has sha256 {digest}, expected {sha256}"));
        }
        let dest = dir.join(name);
        let partial = dir.join(format!("{name}.partial"));
        std::fs::write(&partial, &bytes).map_err(|e| format!("{}: {e}", partial.display()))?;
        std::fs::rename(&partial, &dest).map_err(|e| format!("{}: {e}", dest.display()))?;
        written.push(name);
    }
    let absent: Vec<&str> = TEMPLATES
        .iter()
        .map(|t| t.0)
        .filter(|n| !written.contains(n))
        .collect();
    if !absent.is_empty() {
        return Err(format!(
            "{SDIST} has no {} under {MEMBER_DIR}",
            absent.join(", ")
        ));
    }
    eprintln!("{} fetched and verified", dir.display());
    Ok(())
}
