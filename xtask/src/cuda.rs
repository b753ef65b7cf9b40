//! `cargo xtask cuda-build`: the `cuda` feature compiled and linked on a machine without a GPU,
//! and the binaries the GPU check (`scripts/gpu-check.sh`) runs, gathered in one folder.
//!
//! The CUDA toolkit comes from its pinned PyPI wheels (compiler, headers, runtime, cuBLAS),
//! fetched by pip with their sha256 checked, unpacked under `target/cuda-toolkit`, unless
//! `CUDA_PATH` names an installed toolkit. The wheels carry no driver library, so linking uses
//! a stub `libcuda.so` (soname `libcuda.so.1`) that defines each driver symbol ggml's objects
//! use; at run time the machine's real driver library is loaded in its place.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use clap::Args;

use crate::{cargo, target_dir, workspace_root};

/// The toolkit's wheels: `name==version --hash=sha256:…`, as pip's requirements format takes
/// them (with hashes present, pip refuses any file whose digest differs).
const WHEELS: &[(&str, &str, &str)] = &[
    (
        "nvidia-cuda-nvcc",
        "13.0.88",
        "56fe502eb77625a12f25172caa3cdddb4e4c8ba2c8c17dba44b164761b380f03",
    ),
    (
        "nvidia-cuda-runtime",
        "13.0.96",
        "7f82250d7782aa23b6cfe765ecc7db554bd3c2870c43f3d1821f1d18aebf0548",
    ),
    (
        "nvidia-cublas",
        "13.0.2.14",
        "0cf238ffdbe46c00cb9aa98e7bca745c223a5ca5a53e686ac8b3e5a08fe80d6c",
    ),
    (
        "nvidia-cuda-crt",
        "13.0.88",
        "2c8043c7c9e02492716426e9919fc78d2c5b3b2a7a768a88e952676b08aa55a4",
    ),
    (
        "nvidia-cuda-cccl",
        "13.0.85",
        "e0da7ad981f3a8aff08241b5bfc1af868742a63e2762f53a5171c492ef242649",
    ),
    (
        "nvidia-nvvm",
        "13.0.88",
        "c5f41ffeb6466944a026dfa5317d7d85355c119bbec279205d22f1869d1054e0",
    ),
];

/// Shared libraries the linker asks for by their unversioned names, which the wheels ship only
/// versioned.
const LINKS: &[(&str, &str)] = &[
    ("libcudart.so", "libcudart.so.13"),
    ("libcublas.so", "libcublas.so.13"),
    ("libcublasLt.so", "libcublasLt.so.13"),
];

/// The binaries the GPU check runs: (cargo target selection, name in the bundle).
const TESTS: &[(&str, &str, &str)] = &[
    ("ggml-sys", "cuda_backend", "ggml-sys-cuda"),
    ("engine", "offload", "engine-offload"),
];
const EXAMPLES: &[&str] = &["generate", "bench"];

/// The command line of `cargo xtask cuda-build`.
#[derive(Args, Clone, Debug)]
pub(crate) struct CudaBuildArgs {
    /// The GPU architecture the kernels are compiled for (90 = Hopper).
    #[arg(
        long,
        value_name = "SM",
        env = "GGML_SYS_CUDA_ARCH",
        default_value = "90"
    )]
    pub(crate) arch: String,
    /// Where the GPU check's binaries and script are gathered (a new or empty directory, or a
    /// previous bundle).
    #[arg(long, value_name = "DIR", default_value_os_t = target_dir().join("gpu-check"))]
    pub(crate) out: PathBuf,
}

/// The command line of `cargo xtask cuda-toolkit`.
#[derive(Args, Clone, Debug)]
pub(crate) struct CudaToolkitArgs {
    /// Where the toolkit is unpacked.
    #[arg(value_name = "DIR", default_value_os_t = target_dir().join("cuda-toolkit"))]
    pub(crate) dir: PathBuf,
}

/// Builds everything and gathers the bundle.
pub(crate) fn cuda_build(o: &CudaBuildArgs) -> Result<(), String> {
    // Only a previous bundle is replaced: never a directory of something else. Checked before
    // anything is built.
    let used = std::fs::read_dir(&o.out).is_ok_and(|mut d| d.next().is_some());
    if used && !o.out.join("gpu-check.sh").is_file() {
        return Err(format!(
            "{} is not empty and holds no previous bundle; give --out a new or empty directory",
            o.out.display()
        ));
    }
    let root = workspace_root();
    let cuda_target = target_dir().join("cuda");
    let toolkit = match std::env::var_os("CUDA_PATH") {
        Some(p) if Path::new(&p).join("bin/nvcc").is_file() => PathBuf::from(p),
        _ => fetch_toolkit(&target_dir().join("cuda-toolkit"))?,
    };
    eprintln!("CUDA toolkit: {}", toolkit.display());
    // A toolkit unpacked from wheels has only versioned libraries and no driver library.
    link_unversioned(&toolkit.join("lib"))?;
    let has_driver = ["lib64/stubs", "lib/stubs", "lib64", "lib"]
        .iter()
        .any(|d| toolkit.join(d).join("libcuda.so").exists());
    // The stub goes here; the linker finds it through LIBRARY_PATH (which does not touch
    // cargo's fingerprints, so the compiled kernels stay cached).
    let stubs = toolkit.join("lib/stubs");
    let library_path = match std::env::var_os("LIBRARY_PATH") {
        Some(p) => {
            let mut all = vec![stubs.clone()];
            all.extend(std::env::split_paths(&p));
            std::env::join_paths(all).map_err(|e| e.to_string())?
        }
        None => stubs.clone().into_os_string(),
    };
    let env = |cmd: &mut Command| {
        cmd.current_dir(&root)
            .env("LIBRARY_PATH", &library_path)
            .env("CUDA_PATH", &toolkit)
            .env("GGML_SYS_CUDA_ARCH", &o.arch)
            .env("CARGO_TARGET_DIR", &cuda_target);
    };

    // The library first: its objects say which driver symbols the stub must define.
    let mut lib = Command::new(cargo());
    lib.args(["build", "--release", "-p", "ggml-sys", "--features", "cuda"]);
    env(&mut lib);
    status(&mut lib, "cargo build -p ggml-sys --features cuda")?;
    if !has_driver {
        let archive = newest_archive(&cuda_target.join("release/build"))?;
        write_driver_stub(&archive, &stubs)?;
    }

    let mut exes = Vec::new();
    let mut tests = Command::new(cargo());
    tests.args([
        "test",
        "--release",
        "--no-run",
        "--message-format=json-render-diagnostics",
        "--features",
        "ggml-sys/cuda,engine/cuda",
    ]);
    for (package, test, _) in TESTS {
        tests.args(["-p", package, "--test", test]);
    }
    env(&mut tests);
    let json = output(&mut tests, "cargo test --no-run (cuda)")?;
    for (package, test, name) in TESTS {
        let path = executable(&json, "test", test)
            .ok_or_else(|| format!("cargo built no test binary {package}/{test}"))?;
        exes.push((path, (*name).to_owned()));
    }
    let mut examples = Command::new(cargo());
    examples.args([
        "build",
        "--release",
        "--message-format=json-render-diagnostics",
        "--features",
        "cuda",
    ]);
    for e in EXAMPLES {
        examples.args(["--example", e]);
    }
    env(&mut examples);
    let json = output(&mut examples, "cargo build --examples (cuda)")?;
    for e in EXAMPLES {
        let path =
            executable(&json, "example", e).ok_or_else(|| format!("cargo built no example {e}"))?;
        exes.push((path, (*e).to_owned()));
    }

    // The bundle: stripped binaries in one solid archive, the check script and the golden
    // prompts. Every binary carries the same ggml CUDA kernels (about 120 MiB of cubins), so
    // they are packed as one tar stream with a dictionary wider than a binary: xz then stores
    // the kernels once (about 15 MiB for all four instead of about 55 MiB packed one by one),
    // which keeps the bundle and the model within what a GPU machine is sent.
    let bin = o.out.join("bin");
    let _ = std::fs::remove_dir_all(&bin);
    std::fs::create_dir_all(&bin).map_err(|e| format!("{}: {e}", bin.display()))?;
    for (path, name) in &exes {
        let dest = bin.join(name);
        std::fs::copy(path, &dest).map_err(|e| format!("{}: {e}", path.display()))?;
        let _ = Command::new("strip")
            .arg("--strip-debug")
            .arg(&dest)
            .status();
    }
    pack(&o.out)?;
    for (from, to) in [
        ("scripts/gpu-check.sh", "gpu-check.sh"),
        (
            "engine/tests/fixtures/golden_visible.jsonl",
            "golden_visible.jsonl",
        ),
    ] {
        std::fs::copy(root.join(from), o.out.join(to)).map_err(|e| format!("{from}: {e}"))?;
    }
    let mut total = 0;
    for entry in walk(&o.out) {
        let len = entry.metadata().map(|m| m.len()).unwrap_or(0);
        total += len;
        eprintln!("{:>8.1} MiB  {}", len as f64 / 1048576.0, entry.display());
    }
    eprintln!(
        "{:.1} MiB in {} (add the model, models/SmolLM2-135M-Instruct.Q4_1.gguf, beside it)",
        total as f64 / 1048576.0,
        o.out.display()
    );
    Ok(())
}

/// Packs `out/bin` into `out/bin.tar.xz` (one xz stream, single-threaded so the dictionary
/// spans every binary) and removes the folder.
fn pack(out: &Path) -> Result<(), String> {
    let archive = out.join("bin.tar");
    let _ = std::fs::remove_file(out.join("bin.tar.xz"));
    let mut tar = Command::new("tar");
    tar.arg("-C").arg(out).arg("-cf").arg(&archive).arg("bin");
    status(&mut tar, "tar (the bundle's binaries)")?;
    let mut xz = Command::new("xz");
    xz.args(["-T1", "-f", "--lzma2=preset=6,dict=384MiB"])
        .arg(&archive);
    status(&mut xz, "xz (the bundle's binaries)")?;
    std::fs::remove_dir_all(out.join("bin")).map_err(|e| format!("{}: {e}", out.display()))
}

/// Unpacks the pinned wheels into `dir` (once) and returns the toolkit root inside it.
fn fetch_toolkit(dir: &Path) -> Result<PathBuf, String> {
    let root = dir.join("nvidia/cu13");
    if root.join("bin/nvcc").is_file() {
        return Ok(root);
    }
    let wheels = dir.join("wheels");
    std::fs::create_dir_all(&wheels).map_err(|e| format!("{}: {e}", wheels.display()))?;
    let requirements = dir.join("requirements.txt");
    let mut text = String::new();
    for (name, version, sha) in WHEELS {
        text.push_str(&format!("{name}=={version} --hash=sha256:{sha}\n"));
    }
    std::fs::write(&requirements, text).map_err(|e| format!("{}: {e}", requirements.display()))?;
    eprintln!("downloading the CUDA 13.0 toolkit wheels (about 530 MB) with pip");
    let mut pip = Command::new("python3");
    pip.args([
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--require-hashes",
        "--dest",
    ])
    .arg(&wheels)
    .arg("-r")
    .arg(&requirements);
    status(&mut pip, "pip download (CUDA wheels)")?;
    for entry in std::fs::read_dir(&wheels).map_err(|e| format!("{}: {e}", wheels.display()))? {
        let path = entry.map_err(|e| e.to_string())?.path();
        if path.extension().is_some_and(|x| x == "whl") {
            unpack(&path, dir)?;
        }
    }
    if !root.join("bin/nvcc").is_file() {
        return Err(format!("the wheels left no nvcc under {}", root.display()));
    }
    // Whatever modes the archives recorded, the toolkit's programs must run.
    for dir in ["bin", "nvvm/bin"] {
        for exe in walk(&root.join(dir)) {
            use std::os::unix::fs::PermissionsExt;
            let _ = std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755));
        }
    }
    link_unversioned(&root.join("lib"))?;
    Ok(root)
}

/// `cargo xtask cuda-toolkit [DIR]`: only the toolkit (default `target/cuda-toolkit`), for
/// builds of one's own with `CUDA_PATH` pointing at the printed directory.
pub(crate) fn cuda_toolkit(args: &CudaToolkitArgs) -> Result<(), String> {
    let root = fetch_toolkit(&args.dir)?;
    let nvcc = Command::new(root.join("bin/nvcc"))
        .arg("--version")
        .output()
        .map_err(|e| format!("{}: {e}", root.join("bin/nvcc").display()))?;
    if !nvcc.status.success() {
        return Err("the unpacked nvcc does not run".into());
    }
    println!("{}", root.display());
    Ok(())
}

/// Links `libX.so` to `libX.so.13` in `lib` where only the versioned file is there.
fn link_unversioned(lib: &Path) -> Result<(), String> {
    for (link, target) in LINKS {
        let at = lib.join(link);
        if lib.join(target).exists() && std::fs::symlink_metadata(&at).is_err() {
            std::os::unix::fs::symlink(target, &at)
                .map_err(|e| format!("{}: {e}", at.display()))?;
        }
    }
    Ok(())
}

/// Extracts a wheel (a zip) into `dir`, keeping executable bits.
fn unpack(wheel: &Path, dir: &Path) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    let file = File::open(wheel).map_err(|e| format!("{}: {e}", wheel.display()))?;
    let mut zip = zip::ZipArchive::new(file).map_err(|e| format!("{}: {e}", wheel.display()))?;
    for i in 0..zip.len() {
        let mut member = zip.by_index(i).map_err(|e| e.to_string())?;
        let Some(rel) = member.enclosed_name() else {
            continue;
        };
        let dest = dir.join(rel);
        if member.is_dir() {
            std::fs::create_dir_all(&dest).map_err(|e| format!("{}: {e}", dest.display()))?;
            continue;
        }
        if let Some(parent) = dest.parent() {
            std::fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
        }
        let mut out = File::create(&dest).map_err(|e| format!("{}: {e}", dest.display()))?;
        std::io::copy(&mut member, &mut out).map_err(|e| format!("{}: {e}", dest.display()))?;
        if let Some(mode) = member.unix_mode() {
            let _ = std::fs::set_permissions(&dest, std::fs::Permissions::from_mode(mode & 0o777));
        }
    }
    Ok(())
}

/// The most recently built `libggml.a` under cargo's build directories.
fn newest_archive(build: &Path) -> Result<PathBuf, String> {
    std::fs::read_dir(build)
        .map_err(|e| format!("{}: {e}", build.display()))?
        .filter_map(|e| e.ok().map(|e| e.path().join("out/libggml.a")))
        .filter(|p| p.is_file())
        .max_by_key(|p| p.metadata().and_then(|m| m.modified()).ok())
        .ok_or_else(|| format!("no libggml.a under {}", build.display()))
}

/// Writes `dir/libcuda.so`: one function for each driver symbol (`cu` then a capital) that
/// `archive` uses and does not define. Calling any of them would be a bug (the real driver is
/// loaded at run time), so each returns CUDA_ERROR_STUB_LIBRARY (34).
fn write_driver_stub(archive: &Path, dir: &Path) -> Result<(), String> {
    let out = Command::new("nm")
        .args(["--format=posix", "--undefined-only"])
        .arg(archive)
        .output()
        .map_err(|e| format!("could not run nm: {e}"))?;
    if !out.status.success() {
        return Err(format!("nm {} failed", archive.display()));
    }
    let mut symbols: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|s| s.len() > 2 && s.starts_with("cu") && s.as_bytes()[2].is_ascii_uppercase())
        .map(str::to_owned)
        .collect();
    symbols.sort();
    symbols.dedup();
    if symbols.is_empty() {
        return Err(format!("{} uses no driver symbol", archive.display()));
    }
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let source = dir.join("libcuda-stub.c");
    let mut c = File::create(&source).map_err(|e| format!("{}: {e}", source.display()))?;
    for s in &symbols {
        writeln!(c, "int {s}(void) {{ return 34; }}").map_err(|e| e.to_string())?;
    }
    drop(c);
    let lib = dir.join("libcuda.so");
    let mut cc = Command::new("cc");
    cc.args(["-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o"])
        .arg(&lib)
        .arg(&source);
    status(&mut cc, "cc (driver stub)")?;
    eprintln!(
        "driver stub with {} symbols: {}",
        symbols.len(),
        lib.display()
    );
    Ok(())
}

/// The executable cargo reported for the target `name` of kind `kind` (`test`, `example`).
fn executable(json: &str, kind: &str, name: &str) -> Option<PathBuf> {
    json.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == name)
        .filter(|m| {
            m["target"]["kind"]
                .as_array()
                .is_some_and(|k| k.iter().any(|k| k == kind))
        })
        .find_map(|m| m["executable"].as_str().map(PathBuf::from))
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut all = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                all.extend(walk(&p));
            } else {
                all.push(p);
            }
        }
    }
    all.sort();
    all
}

fn status(cmd: &mut Command, what: &str) -> Result<(), String> {
    let s = cmd.status().map_err(|e| format!("{what}: {e}"))?;
    if s.success() {
        Ok(())
    } else {
        Err(format!("{what} failed ({s})"))
    }
}

fn output(cmd: &mut Command, what: &str) -> Result<String, String> {
    let o = cmd
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| format!("{what}: {e}"))?;
    if o.status.success() {
        Ok(String::from_utf8_lossy(&o.stdout).into_owned())
    } else {
        Err(format!("{what} failed ({})", o.status))
    }
}
