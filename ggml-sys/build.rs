//! Builds ggml (core + CPU backend, optionally CUDA or Metal) as one static library.
//!
//! ggml's sources are never part of this repository. They come from the registry package
//! pinned in `src/source.rs`, fetched by cargo itself (so its checksum is verified, and no
//! network is used once it is cached), or from a directory named by `GGML_SYS_SOURCE_DIR`.
//!
//! Environment:
//! - `GGML_SYS_SOURCE_DIR`: a ggml tree (with `include/ggml.h` and `src/ggml.c`) to build instead.
//! - `GGML_SYS_PORTABLE=1`: do not tune for the build host; compile for the target features rustc
//!   was given (`-C target-feature` / `-C target-cpu`), i.e. the portable baseline by default.
//! - `GGML_SYS_CUDA_ARCH`: CUDA architectures for nvcc (default `native`), e.g. `89;90`.
//! - `GGML_SYS_DOC_ONLY=1`: skip compiling ggml (for documentation builds, which link nothing).

use std::env;
use std::path::{Path, PathBuf};

include!("src/source.rs");
include!("fetch.rs");
include!("variants.rs");
include!("metal.rs");

fn main() {
    emit_rerun_triggers();

    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let ggml = locate_sources(&out);
    let version = ggml_version(&ggml);
    check_bindings_version(&version);
    // Documentation only (the API listing's rustdoc run, `cargo xtask api`): nothing is linked,
    // so the C build is skipped.
    println!("cargo:rerun-if-env-changed=GGML_SYS_DOC_ONLY");
    if env::var_os("GGML_SYS_DOC_ONLY").is_some() {
        println!("cargo:rustc-env=GGML_SYS_BUILT_VERSION={version}");
        return;
    }

    let target = Target::from_env();
    let include_dir = out.join("include");
    write_version_header(&include_dir, &version);

    let features = Features::from_env();
    let cuda_root = features.cuda.then(check_cuda_toolkit);
    let tree = CpuTree::new(&ggml);
    let (c_files, cpp_files) = tree.sources(&target);
    let defines = cpu_defines(&target, &features);
    let cpu_build = CpuBuild {
        tree: &tree,
        include_dir: &include_dir,
        defines: &defines,
        arch_flags: target.simd_flags(),
        openmp: features.openmp,
    };
    let (mut objects, compiler_is_clang) = if variants_wanted(&target) {
        cpu_build.compile_variants(&c_files, &cpp_files, &out, X86_64_VARIANTS)
    } else {
        let (mut objects, clang) = cpu_build.compile(&c_files, &cpp_files);
        let name = if target.native { "native" } else { "portable" };
        objects.extend(cpu_build.compile_single_dispatcher(&out, name));
        (objects, clang)
    };

    if let Some(root) = &cuda_root {
        objects.extend(build_cuda(&ggml, &include_dir, &defines, root));
    }
    if features.metal {
        objects.extend(build_metal(&ggml, &include_dir, &out, &defines));
    }

    // One archive: ggml's core and its backends call each other in both directions.
    cc::Build::new()
        .objects(&objects)
        .cargo_warnings(false)
        .compile("ggml");

    link_runtime(&target, &features, compiler_is_clang);
    println!("cargo:source_dir={}", ggml.display());
    println!("cargo:include={}", ggml.join("include").display());
    println!("cargo:rustc-env=GGML_SYS_BUILT_VERSION={version}");
}

/// Tells cargo what the build depends on besides the package's Rust sources.
fn emit_rerun_triggers() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=src/source.rs");
    println!("cargo:rerun-if-changed=fetch.rs");
    println!("cargo:rerun-if-changed=variants.rs");
    println!("cargo:rerun-if-changed=metal.rs");
    println!("cargo:rerun-if-changed=src/bindings.rs");
    println!("cargo:rerun-if-changed=csrc");
    for var in [
        SOURCE_DIR_ENV,
        "GGML_SYS_PORTABLE",
        "GGML_SYS_CUDA_ARCH",
        "NVCC",
    ] {
        println!("cargo:rerun-if-env-changed={var}");
    }
}

/// Writes the `ggml-version.h` that ggml's own build generates, into `include_dir`.
fn write_version_header(include_dir: &Path, version: &str) {
    std::fs::create_dir_all(include_dir).expect("create OUT_DIR/include");
    std::fs::write(
        include_dir.join("ggml-version.h"),
        format!(
            "#pragma once\n#define GGML_VERSION \"{version}\"\n#define GGML_COMMIT \"{SOURCE_PACKAGE}-{SOURCE_PACKAGE_VERSION}\"\n"
        ),
    )
    .expect("write ggml-version.h");
}

/// The directories of ggml's core and CPU backend, and of our own C kernels.
struct CpuTree {
    /// ggml's root (with `include/` and `src/`).
    ggml: PathBuf,
    /// `src/`: the core (`ggml-base`).
    src: PathBuf,
    /// `src/ggml-cpu/`: the CPU backend.
    cpu: PathBuf,
    /// This crate's `csrc/`: kernels that run as ggml custom ops.
    csrc: PathBuf,
}

impl CpuTree {
    fn new(ggml: &Path) -> Self {
        let src = ggml.join("src");
        let cpu = src.join("ggml-cpu");
        let csrc =
            PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"))
                .join("csrc");
        CpuTree {
            ggml: ggml.to_path_buf(),
            src,
            cpu,
            csrc,
        }
    }

    /// The C and the C++ sources of the core, the CPU backend (with `target`'s architecture
    /// files) and our kernels.
    fn sources(&self, target: &Target) -> (Vec<PathBuf>, Vec<PathBuf>) {
        let (src, cpu, csrc) = (&self.src, &self.cpu, &self.csrc);
        let mut c_files = vec![
            src.join("ggml.c"),
            src.join("ggml-alloc.c"),
            src.join("ggml-quants.c"),
            cpu.join("ggml-cpu.c"),
            cpu.join("quants.c"),
        ];
        // Ours: every `csrc/*.c`, kernels that run as ggml custom ops (declared in src/lib.rs,
        // `kernels`), in name order so that the compiler command lines are stable.
        let mut ours: Vec<PathBuf> = std::fs::read_dir(csrc)
            .unwrap_or_else(|e| fail(&format!("cannot list {}: {e}", csrc.display())))
            .filter_map(|entry| entry.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "c"))
            .collect();
        ours.sort();
        c_files.extend(ours);
        let mut cpp_files = vec![
            src.join("ggml.cpp"),
            src.join("ggml-backend.cpp"),
            src.join("ggml-backend-reg.cpp"),
            src.join("ggml-opt.cpp"),
            src.join("ggml-threading.cpp"),
            src.join("gguf.cpp"),
            cpu.join("ggml-cpu.cpp"),
            cpu.join("repack.cpp"),
            cpu.join("hbm.cpp"),
            cpu.join("traits.cpp"),
            cpu.join("binary-ops.cpp"),
            cpu.join("unary-ops.cpp"),
            cpu.join("vec.cpp"),
            cpu.join("ops.cpp"),
            cpu.join("llamafile").join("sgemm.cpp"),
        ];
        // Files that exist only in some ggml versions (a user-supplied tree may be older or newer).
        for optional in [
            src.join("ggml-backend-meta.cpp"),
            cpu.join("amx").join("amx.cpp"),
            cpu.join("amx").join("mmq.cpp"),
            cpu.join("tiled").join("tiled.cpp"),
            cpu.join("tiled").join("tiled-kernel.cpp"),
        ] {
            if optional.exists() {
                cpp_files.push(optional);
            }
        }
        match target.arch.as_str() {
            "x86_64" | "x86" => {
                c_files.push(cpu.join("arch/x86/quants.c"));
                cpp_files.push(cpu.join("arch/x86/repack.cpp"));
            }
            "aarch64" | "arm" => {
                c_files.push(cpu.join("arch/arm/quants.c"));
                cpp_files.push(cpu.join("arch/arm/repack.cpp"));
            }
            _ => {}
        }
        (c_files, cpp_files)
    }

    /// Whether `file` takes the SIMD flags: the CPU backend's sources and ours do, the core's do
    /// not.
    fn tuned(&self, file: &Path) -> bool {
        file.starts_with(&self.cpu) || !file.starts_with(&self.src)
    }
}

/// The preprocessor definitions of every ggml source, as ggml's own build sets them for the
/// `target` and the enabled backends.
fn cpu_defines(target: &Target, features: &Features) -> Vec<(&'static str, Option<&'static str>)> {
    let mut defines: Vec<(&str, Option<&str>)> = vec![
        ("GGML_SCHED_MAX_COPIES", Some("4")),
        ("GGML_USE_CPU", None),
        ("GGML_USE_LLAMAFILE", None),
        ("GGML_USE_CPU_REPACK", None),
        ("NDEBUG", None),
    ];
    // As ggml's own build: GNU dialects (no __STRICT_ANSI__), POSIX 2001 interfaces.
    match target.os.as_str() {
        "linux" | "android" => {
            defines.push(("_GNU_SOURCE", None));
            defines.push(("_XOPEN_SOURCE", Some("600")));
        }
        "macos" | "ios" => defines.push(("_DARWIN_C_SOURCE", None)),
        "freebsd" => defines.push(("__BSD_VISIBLE", None)),
        "windows" => defines.push(("_CRT_SECURE_NO_WARNINGS", None)),
        _ => {}
    }
    if features.openmp {
        defines.push(("GGML_USE_OPENMP", None));
    }
    if features.cuda {
        defines.push(("GGML_USE_CUDA", None));
    }
    if features.metal {
        defines.push(("GGML_USE_METAL", None));
    }
    defines
}

/// How the core, the CPU backend and our kernels are compiled.
struct CpuBuild<'a> {
    tree: &'a CpuTree,
    /// The generated headers (`ggml-version.h`).
    include_dir: &'a Path,
    defines: &'a [(&'static str, Option<&'static str>)],
    /// The SIMD level's flags ([`Target::simd_flags`]).
    arch_flags: Vec<String>,
    openmp: bool,
}

impl CpuBuild<'_> {
    /// Compiles the C and C++ sources, in four builds at once (C and C++, with and without the
    /// SIMD flags). Returns the object files, and whether the C++ compiler is Clang.
    fn compile(&self, c_files: &[PathBuf], cpp_files: &[PathBuf]) -> (Vec<PathBuf>, bool) {
        let builds: Vec<cc::Build> = [(false, true), (false, false), (true, true), (true, false)]
            .into_iter()
            .map(|(cpp, simd)| {
                let files = if cpp { cpp_files } else { c_files };
                let mut build = cc::Build::new();
                self.configure(&mut build, cpp, simd);
                build.files(files.iter().filter(|f| self.tree.tuned(f) == simd));
                build
            })
            .collect();

        let mut objects = Vec::new();
        let mut compiler_is_clang = false;
        std::thread::scope(|scope| {
            let jobs: Vec<_> = builds
                .iter()
                .map(|b| scope.spawn(|| b.compile_intermediates()))
                .collect();
            for job in jobs {
                objects.extend(job.join().expect("compilation thread"));
            }
        });
        let cpp_build = &builds[2];
        if let Ok(compiler) = cpp_build.try_get_compiler() {
            compiler_is_clang = compiler.is_like_clang();
        }
        (objects, compiler_is_clang)
    }

    /// Sets up `build` for C++ or C sources, with the SIMD flags or without.
    ///
    /// As ggml's own build: only the CPU backend (and our kernels) is tuned for the SIMD level;
    /// the core (`ggml-base`: ggml.c, ggml-quants.c, ...) is compiled without it. It matters for
    /// results, not only portability: the core's scalar quantizers (`quantize_row_q8_K_ref`, which
    /// every k-quant product runs on its activations) compiled with FMA contract `x * scale +
    /// magic` into one rounding, so a value on a rounding boundary lands in another bucket than
    /// llama.cpp's, and one row of a product comes out different.
    fn configure(&self, build: &mut cc::Build, cpp: bool, simd: bool) {
        let tree = self.tree;
        build
            .include(self.include_dir)
            .include(tree.ggml.join("include"))
            .include(&tree.src)
            .include(&tree.cpu)
            .opt_level(3)
            .debug(false)
            .warnings(false)
            .cargo_warnings(false);
        for (name, value) in self.defines {
            build.define(name, *value);
        }
        if simd {
            for flag in &self.arch_flags {
                build.flag_if_supported(flag);
            }
        }
        // Position-independent code (needed for Rust's PIE executables and for cdylibs) makes GCC
        // assume that global functions may be interposed, which blocks inlining between ggml's
        // own functions; ggml is linked statically, so nothing can interpose them.
        build.flag_if_supported("-fno-semantic-interposition");
        if cpp {
            build.cpp(true).std("gnu++17");
        } else {
            build.std("gnu11");
        }
        if self.openmp {
            build.flag("-fopenmp");
        }
    }
}

/// Cargo features of this crate, as the build script sees them.
struct Features {
    openmp: bool,
    cuda: bool,
    metal: bool,
}

impl Features {
    fn from_env() -> Self {
        let on = |name: &str| env::var_os(format!("CARGO_FEATURE_{name}")).is_some();
        Features {
            openmp: on("OPENMP"),
            cuda: on("CUDA"),
            metal: on("METAL"),
        }
    }
}

/// Facts about the compilation target, taken from cargo (never from `cfg!`, which describes the
/// machine running this script).
struct Target {
    arch: String,
    os: String,
    env: String,
    features: Vec<String>,
    native: bool,
}

impl Target {
    fn from_env() -> Self {
        let var = |name: &str| env::var(name).unwrap_or_default();
        let portable = matches!(
            var("GGML_SYS_PORTABLE").as_str(),
            "1" | "true" | "yes" | "on"
        );
        let same_machine = var("HOST") == var("TARGET");
        Target {
            arch: var("CARGO_CFG_TARGET_ARCH"),
            os: var("CARGO_CFG_TARGET_OS"),
            env: var("CARGO_CFG_TARGET_ENV"),
            features: var("CARGO_CFG_TARGET_FEATURE")
                .split(',')
                .filter(|f| !f.is_empty())
                .map(str::to_owned)
                .collect(),
            native: same_machine && !portable,
        }
    }

    /// Compiler flags selecting the SIMD level: the host's best in native mode, otherwise exactly
    /// the target features rustc compiles for.
    fn simd_flags(&self) -> Vec<String> {
        if self.env == "msvc" {
            return Vec::new();
        }
        match self.arch.as_str() {
            "x86_64" | "x86" => {
                if self.native {
                    return vec!["-march=native".into()];
                }
                // Rust target feature -> GCC/Clang flag; ggml keys its kernels on the macros these set.
                const MAP: &[(&str, &str)] = &[
                    ("sse3", "-msse3"),
                    ("ssse3", "-mssse3"),
                    ("sse4.1", "-msse4.1"),
                    ("sse4.2", "-msse4.2"),
                    ("avx", "-mavx"),
                    ("avx2", "-mavx2"),
                    ("fma", "-mfma"),
                    ("f16c", "-mf16c"),
                    ("bmi2", "-mbmi2"),
                    ("avx512f", "-mavx512f"),
                    ("avx512bw", "-mavx512bw"),
                    ("avx512dq", "-mavx512dq"),
                    ("avx512vl", "-mavx512vl"),
                    ("avx512vnni", "-mavx512vnni"),
                    ("avx512bf16", "-mavx512bf16"),
                    ("avxvnni", "-mavxvnni"),
                ];
                MAP.iter()
                    .filter(|(feature, _)| self.features.iter().any(|f| f == feature))
                    .map(|(_, flag)| (*flag).to_owned())
                    .collect()
            }
            "aarch64" => {
                if self.native && self.os != "macos" {
                    vec!["-mcpu=native".into()]
                } else if self.os == "macos" {
                    // Every Apple silicon chip has dot-product and fp16 arithmetic.
                    vec!["-mcpu=apple-m1".into()]
                } else {
                    let mut arch = String::from("-march=armv8.2-a");
                    for (feature, ext) in [
                        ("dotprod", "+dotprod"),
                        ("fp16", "+fp16"),
                        ("i8mm", "+i8mm"),
                        ("sve", "+sve"),
                    ] {
                        if self.features.iter().any(|f| f == feature) {
                            arch.push_str(ext);
                        }
                    }
                    if !self.features.iter().any(|f| f == "dotprod" || f == "fp16") {
                        arch = "-march=armv8-a".into();
                    }
                    vec![arch]
                }
            }
            _ => Vec::new(),
        }
    }
}

/// Finds the ggml tree: the directory named by `GGML_SYS_SOURCE_DIR`, or the pinned package.
fn locate_sources(out: &Path) -> PathBuf {
    if let Some(dir) = env::var_os(SOURCE_DIR_ENV) {
        let dir = PathBuf::from(dir);
        if !dir.join("include/ggml.h").is_file() || !dir.join("src/ggml.c").is_file() {
            fail(&format!(
                "{SOURCE_DIR_ENV}={} is not a ggml tree (expected include/ggml.h and src/ggml.c)",
                dir.display()
            ));
        }
        println!("cargo:rerun-if-changed={}", dir.join("src").display());
        println!("cargo:rerun-if-changed={}", dir.join("include").display());
        return dir;
    }
    let package_dir = fetch_pinned_package(out);
    let ggml = package_dir.join(GGML_SUBDIR);
    if !ggml.join("include/ggml.h").is_file() {
        fail(&format!(
            "{} does not contain ggml under {GGML_SUBDIR}",
            package_dir.display()
        ));
    }
    ggml
}

/// Has cargo fetch the pinned package (see `fetch.rs`) or stops the build with the reason.
fn fetch_pinned_package(out: &Path) -> PathBuf {
    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    fetch_source_package(&cargo, &out.join("ggml-source")).unwrap_or_else(|e| {
        fail(&format!(
            "{e}\nAlternatively set {SOURCE_DIR_ENV} to a ggml source tree."
        ))
    })
}

/// Reads ggml's version from its CMakeLists.txt.
fn ggml_version(ggml: &Path) -> String {
    let cmake = std::fs::read_to_string(ggml.join("CMakeLists.txt")).unwrap_or_default();
    let part = |name: &str| {
        cmake.lines().find_map(|line| {
            let rest = line.trim().strip_prefix(&format!("set({name} "))?;
            Some(rest.trim_end_matches(')').trim().to_owned())
        })
    };
    match (
        part("GGML_VERSION_MAJOR"),
        part("GGML_VERSION_MINOR"),
        part("GGML_VERSION_PATCH"),
    ) {
        (Some(a), Some(b), Some(c)) => format!("{a}.{b}.{c}"),
        _ => fail(&format!(
            "cannot read ggml's version from {}/CMakeLists.txt",
            ggml.display()
        )),
    }
}

/// Refuses to build when the committed bindings were generated from another ggml version: their
/// struct layouts and signatures would silently disagree with the compiled code.
fn check_bindings_version(built: &str) {
    let bindings = std::fs::read_to_string("src/bindings.rs").unwrap_or_default();
    let generated = bindings
        .lines()
        .find_map(|l| l.strip_prefix("// ggml-version: "))
        .map(str::trim);
    match generated {
        Some(v) if v == built => {}
        Some(v) => fail(&format!(
            "src/bindings.rs was generated from ggml {v} but the sources are ggml {built}; \
             run `cargo xtask bindgen` (needs libclang) or build the pinned version"
        )),
        None => fail("src/bindings.rs has no `// ggml-version:` header; run `cargo xtask bindgen`"),
    }
    if built != GGML_VERSION {
        fail(&format!(
            "src/source.rs pins ggml {GGML_VERSION} but the sources are ggml {built}"
        ));
    }
}

fn link_runtime(target: &Target, features: &Features, clang: bool) {
    match target.os.as_str() {
        "macos" | "ios" => println!("cargo:rustc-link-lib=c++"),
        "windows" => {}
        _ => {
            println!("cargo:rustc-link-lib=stdc++");
            println!("cargo:rustc-link-lib=m");
            println!("cargo:rustc-link-lib=pthread");
            println!("cargo:rustc-link-lib=dl");
        }
    }
    if features.openmp {
        println!(
            "cargo:rustc-link-lib={}",
            if clang { "omp" } else { "gomp" }
        );
    }
    if target.os == "macos" || target.os == "ios" {
        println!("cargo:rustc-link-lib=framework=Foundation");
        if features.metal {
            println!("cargo:rustc-link-lib=framework=Metal");
            println!("cargo:rustc-link-lib=framework=MetalKit");
        }
    }
}

/// Finds the CUDA toolkit (`CUDA_PATH`, `CUDA_HOME`, else /usr/local/cuda) and makes sure nvcc
/// can be run, before any compilation starts; returns the toolkit's root.
fn check_cuda_toolkit() -> String {
    let cuda_root = env::var("CUDA_PATH")
        .or_else(|_| env::var("CUDA_HOME"))
        .unwrap_or_else(|_| "/usr/local/cuda".into());
    let on_path = |exe: &str| {
        env::var_os("PATH")
            .is_some_and(|paths| env::split_paths(&paths).any(|d| d.join(exe).is_file()))
    };
    if env::var_os("NVCC").is_none()
        && !on_path("nvcc")
        && !Path::new(&cuda_root).join("bin/nvcc").is_file()
    {
        fail(&format!(
            "the `cuda` feature needs the CUDA toolkit: nvcc was not found on PATH, in NVCC, or under \
             {cuda_root}/bin (set CUDA_PATH to the toolkit)"
        ));
    }
    if env::var_os("NVCC").is_none() && !on_path("nvcc") {
        // cc looks for nvcc on PATH or in NVCC; point it at the toolkit's.
        env::set_var("NVCC", Path::new(&cuda_root).join("bin/nvcc"));
    }
    cuda_root
}

/// Flash-attention vector kernels compiled for these K-V type pairs: ggml's own default set
/// (`GGML_CUDA_FA_QUANTS`). Other pairs run after a conversion of K and V to f16.
const CUDA_FA_PAIRS: &[&str] = &["q4_0-q4_0", "q8_0-q8_0", "f16-f16", "bf16-bf16"];
/// Every type ggml's vector flash attention is written for.
const CUDA_FA_TYPES: &[&str] = &["q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "bf16", "f16"];

/// Compiles ggml's CUDA backend with nvcc. Returns the object files.
///
/// Each `.cu` file is its own translation unit with whole-program device code, as in ggml's own
/// build: no relocatable device code, so no device-link step is needed (cc compiles several CUDA
/// files of one build with `--device-c` and links their device code only in `compile`, which a
/// single archive with the C and C++ objects cannot use). The files are compiled in parallel,
/// up to cargo's job count.
fn build_cuda(
    ggml: &Path,
    include_dir: &Path,
    defines: &[(&str, Option<&str>)],
    cuda_root: &str,
) -> Vec<PathBuf> {
    let dir = ggml.join("src/ggml-cuda");
    let mut files = list(&dir, "cu");
    let instances = dir.join("template-instances");
    files.extend(list(&instances, "cu").into_iter().filter(|f| {
        // ggml's default set of pre-instantiated kernels: tile and MMA flash attention, MMQ, MMF,
        // and the vector flash attention of the pairs in CUDA_FA_PAIRS.
        let name = f.file_name().unwrap().to_string_lossy();
        ["fattn-tile", "fattn-mma", "mmq", "mmf"]
            .iter()
            .any(|p| name.starts_with(p))
            || CUDA_FA_PAIRS
                .iter()
                .any(|pair| name == format!("fattn-vec-instance-{pair}.cu"))
    }));
    for pair in CUDA_FA_PAIRS {
        let file = instances.join(format!("fattn-vec-instance-{pair}.cu"));
        if !file.is_file() {
            fail(&format!(
                "{} is missing from ggml's sources",
                file.display()
            ));
        }
    }
    let arch = env::var("GGML_SYS_CUDA_ARCH").unwrap_or_else(|_| "native".into());
    let mut build = backend_build(ggml, include_dir, &dir, defines);
    build
        .cuda(true)
        .cudart("shared")
        .flag("-std=c++17")
        .flag("-use_fast_math")
        .flag("-extended-lambda")
        .flag("--expt-relaxed-constexpr");
    for a in arch.split(';').map(str::trim).filter(|a| !a.is_empty()) {
        if a == "native" {
            build.flag("-arch=native");
        } else if a.chars().all(|c| c.is_ascii_alphanumeric()) {
            build.flag(format!("-gencode=arch=compute_{a},code=sm_{a}"));
        } else {
            fail(&format!(
                "GGML_SYS_CUDA_ARCH: {a:?} is not an architecture number such as 90 or 89"
            ));
        }
    }
    build.define("GGML_CUDA_USE_GRAPHS", None);
    let quants = format!("\"{}\"", CUDA_FA_PAIRS.join(","));
    build.define("GGML_CUDA_FA_QUANTS", Some(quants.as_str()));
    for v in CUDA_FA_TYPES {
        for k in CUDA_FA_TYPES {
            let on = CUDA_FA_PAIRS.contains(&format!("{k}-{v}").as_str());
            let name = format!("GGML_CUDA_FA_{}_{}", k.to_uppercase(), v.to_uppercase());
            build.define(&name, Some(if on { "1" } else { "0" }));
        }
    }

    let jobs = env::var("NUM_JOBS")
        .ok()
        .and_then(|n| n.parse::<usize>().ok())
        .unwrap_or(1)
        .clamp(1, 64);
    let queue = std::sync::Mutex::new(files.into_iter());
    let objects = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..jobs {
            scope.spawn(|| loop {
                let Some(file) = queue.lock().expect("queue").next() else {
                    break;
                };
                // One file per build: cc adds `--device-c` only when a build has several.
                let objs = build.clone().file(&file).compile_intermediates();
                objects.lock().expect("objects").extend(objs);
            });
        }
    });
    let mut objects = objects.into_inner().expect("objects");
    objects.sort();

    for sub in [
        "lib64",
        "lib",
        "lib64/stubs",
        "lib/stubs",
        "targets/x86_64-linux/lib",
    ] {
        let p = Path::new(&cuda_root).join(sub);
        if p.is_dir() {
            println!("cargo:rustc-link-search=native={}", p.display());
        }
    }
    for lib in ["cudart", "cublas", "cublasLt", "cuda"] {
        println!("cargo:rustc-link-lib={lib}");
    }
    println!("cargo:rerun-if-env-changed=CUDA_PATH");
    println!("cargo:rerun-if-env-changed=CUDA_HOME");
    objects
}

/// A compiler invocation for a backend's sources: ggml's headers, the backend's directory,
/// optimised, quiet, with the shared definitions.
fn backend_build(
    ggml: &Path,
    include_dir: &Path,
    backend_dir: &Path,
    defines: &[(&str, Option<&str>)],
) -> cc::Build {
    let mut build = cc::Build::new();
    build
        .include(include_dir)
        .include(ggml.join("include"))
        .include(ggml.join("src"))
        .include(backend_dir)
        .opt_level(3)
        .debug(false)
        .warnings(false)
        .cargo_warnings(false);
    for (name, value) in defines {
        build.define(name, *value);
    }
    build
}

fn list(dir: &Path, ext: &str) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|rd| rd.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    files.retain(|p| p.extension().is_some_and(|e| e == ext));
    files.sort();
    files
}

fn fail(message: &str) -> ! {
    eprintln!("error: ggml-sys: {message}");
    std::process::exit(1);
}
