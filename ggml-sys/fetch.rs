// Fetching the pinned ggml source package through cargo. Shared by `build.rs` and `xtask`
// (via `include!`), after `src/source.rs`; needs `serde_json`.

/// Has cargo download (checksum-verified) and unpack the pinned source package, and returns the
/// package's root directory.
///
/// A throw-away manifest in `work_dir` depends on the package; `cargo metadata` resolves it,
/// fetches it into cargo's own cache and reports where it was unpacked. The first attempt is
/// offline, so a cached package needs no network.
fn fetch_source_package(
    cargo: &str,
    work_dir: &std::path::Path,
) -> Result<std::path::PathBuf, String> {
    let io = |e: std::io::Error| format!("{}: {e}", work_dir.display());
    std::fs::create_dir_all(work_dir.join("src")).map_err(io)?;
    std::fs::write(
        work_dir.join("Cargo.toml"),
        format!(
            "[package]\nname = \"ggml-source-fetch\"\nversion = \"0.0.0\"\nedition = \"2021\"\npublish = false\n\n\
             [workspace]\n\n[dependencies]\n{SOURCE_PACKAGE} = {{ version = \"={SOURCE_PACKAGE_VERSION}\", default-features = false }}\n"
        ),
    )
    .map_err(io)?;
    std::fs::write(work_dir.join("src/lib.rs"), "").map_err(io)?;

    let run = |offline: bool| {
        let mut cmd = std::process::Command::new(cargo);
        cmd.arg("metadata")
            .arg("--format-version=1")
            .arg("--manifest-path")
            .arg(work_dir.join("Cargo.toml"))
            .env("CARGO_TARGET_DIR", work_dir.join("target"))
            .env_remove("CARGO_BUILD_TARGET")
            .env_remove("RUSTC_WORKSPACE_WRAPPER");
        if offline {
            cmd.arg("--offline");
        }
        cmd.output()
    };
    let output = match run(true) {
        Ok(o) if o.status.success() => o,
        _ => match run(false) {
            Ok(o) if o.status.success() => o,
            Ok(o) => {
                return Err(format!(
                    "cargo could not fetch {SOURCE_PACKAGE} {SOURCE_PACKAGE_VERSION} (ggml's sources); \
                     is the package registry reachable?\n{}",
                    String::from_utf8_lossy(&o.stderr)
                ))
            }
            Err(e) => return Err(format!("could not run {cargo}: {e}")),
        },
    };
    let meta: serde_json::Value = serde_json::from_slice(&output.stdout)
        .map_err(|e| format!("cargo metadata printed bad JSON: {e}"))?;
    let manifest = meta["packages"]
        .as_array()
        .and_then(|packages| {
            packages
                .iter()
                .find(|p| p["name"] == SOURCE_PACKAGE && p["version"] == SOURCE_PACKAGE_VERSION)
        })
        .and_then(|p| p["manifest_path"].as_str())
        .ok_or_else(|| format!("cargo metadata did not list {SOURCE_PACKAGE} {SOURCE_PACKAGE_VERSION}"))?;
    std::path::Path::new(manifest)
        .parent()
        .map(|p| p.to_path_buf())
        .ok_or_else(|| format!("odd manifest path {manifest}"))
}
