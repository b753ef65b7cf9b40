// Included by build.rs: the CPU backend and our kernels built once per instruction-set level,
// the level chosen when the program starts.
//
// Each variant's objects are linked into one relocatable object whose every defined global symbol
// gets the variant's suffix (`objcopy --redefine-syms`), so the variants cannot clash and each
// calls only itself. The unsuffixed names that the core and Rust call are small trampolines
// (`jmp *table[i]`) through one table of function addresses, filled for the chosen variant by a
// constructor in the generated `dispatch.c` before `main` (`LLAMA_HDD_CPU` names a lower
// level). Compiled objects are cached under the target directory by a hash of their command
// lines and sources, so ggml's pinned sources compile once for every profile and every edit of
// `csrc/`.

use std::fmt::Write as _;
use std::process::Command;

/// One instruction-set level of x86-64 that the CPU backend and our kernels are built for.
struct Variant {
    /// Its name for users and `LLAMA_HDD_CPU`.
    name: &'static str,
    /// The suffix of its symbols (`__hdd_<tag>`).
    tag: &'static str,
    /// Compiler flags enabling its instructions.
    flags: &'static [&'static str],
    /// `__builtin_cpu_supports` features a CPU needs to run it (the compiler's runtime also
    /// checks that the operating system saves the registers).
    requires: &'static [&'static str],
    /// Flags for our kernels only, on top of `flags`. ggml's CPU backend is built with `flags`
    /// alone, and a variant whose `flags` equal an earlier one's links that one's build of it.
    ours_flags: &'static [&'static str],
    /// A C call in `dispatch.c` that must also return nonzero: what the operating system must
    /// grant besides the CPU's features.
    grant: Option<&'static str>,
    /// Taken only when `LLAMA_HDD_CPU` names it, never as the highest level by default.
    opt_in: bool,
}

/// The AVX-512 VNNI level's flags (also the AMX level's, for ggml's backend).
const AVX512_VNNI_FLAGS: &[&str] = &[
    "-mavx",
    "-mavx2",
    "-mfma",
    "-mf16c",
    "-mbmi2",
    "-mavx512f",
    "-mavx512bw",
    "-mavx512dq",
    "-mavx512vl",
    "-mavx512vnni",
];

/// The AVX-512 VNNI level's CPU features.
const AVX512_VNNI_REQUIRES: &[&str] = &[
    "avx2",
    "fma",
    "f16c",
    "bmi2",
    "avx512f",
    "avx512bw",
    "avx512dq",
    "avx512vl",
    "avx512vnni",
];

/// The x86-64 levels, lowest first; the highest one the CPU runs is chosen.
const X86_64_VARIANTS: &[Variant] = &[
    Variant {
        name: "x86-64",
        tag: "x86_64",
        flags: &[],
        requires: &[],
        ours_flags: &[],
        grant: None,
        opt_in: false,
    },
    Variant {
        name: "avx2",
        tag: "avx2",
        flags: &["-mavx", "-mavx2", "-mfma", "-mf16c", "-mbmi2"],
        requires: &["avx2", "fma", "f16c", "bmi2"],
        ours_flags: &[],
        grant: None,
        opt_in: false,
    },
    Variant {
        name: "avx-vnni",
        tag: "avx_vnni",
        flags: &["-mavx", "-mavx2", "-mfma", "-mf16c", "-mbmi2", "-mavxvnni"],
        requires: &["avx2", "fma", "f16c", "bmi2", "avxvnni"],
        ours_flags: &[],
        grant: None,
        opt_in: false,
    },
    Variant {
        name: "avx512",
        tag: "avx512",
        flags: &[
            "-mavx",
            "-mavx2",
            "-mfma",
            "-mf16c",
            "-mbmi2",
            "-mavx512f",
            "-mavx512bw",
            "-mavx512dq",
            "-mavx512vl",
        ],
        requires: &[
            "avx2", "fma", "f16c", "bmi2", "avx512f", "avx512bw", "avx512dq", "avx512vl",
        ],
        ours_flags: &[],
        grant: None,
        opt_in: false,
    },
    Variant {
        name: "avx512-vnni",
        tag: "avx512_vnni",
        flags: AVX512_VNNI_FLAGS,
        requires: AVX512_VNNI_REQUIRES,
        ours_flags: &[],
        grant: None,
        opt_in: false,
    },
    // AMX-INT8 tiles in our integer-sum kernels; ggml's backend as at `avx512-vnni` (its own AMX
    // code stays out). Linux lets a process use the tiles only once it has asked
    // (`arch_prctl(ARCH_REQ_XCOMP_PERM)`): a refusal leaves this level unsupported. Only
    // `LLAMA_HDD_CPU=amx` takes it.
    Variant {
        name: "amx",
        tag: "amx",
        flags: AVX512_VNNI_FLAGS,
        requires: &[
            "avx2",
            "fma",
            "f16c",
            "bmi2",
            "avx512f",
            "avx512bw",
            "avx512dq",
            "avx512vl",
            "avx512vnni",
            "amx-tile",
            "amx-int8",
        ],
        ours_flags: &["-mamx-tile", "-mamx-int8"],
        grant: Some("amx_granted()"),
        // Measured no faster than `avx512-vnni` over a whole model (docs/BENCHMARKS.md, "AMX
        // tiles"), so it is there to be named, not taken by default.
        opt_in: true,
    },
];

/// Whether the CPU backend is built as run-time variants: on x86-64 ELF targets (with GCC or
/// Clang and binutils), unless `GGML_SYS_VARIANTS=0` or `GGML_SYS_PORTABLE` asks for one build.
fn variants_wanted(target: &Target) -> bool {
    println!("cargo:rerun-if-env-changed=GGML_SYS_VARIANTS");
    let off = matches!(
        env::var("GGML_SYS_VARIANTS").as_deref(),
        Ok("0" | "false" | "no" | "off")
    );
    let portable = matches!(
        env::var("GGML_SYS_PORTABLE").as_deref(),
        Ok("1" | "true" | "yes" | "on")
    );
    !off && !portable
        && target.arch == "x86_64"
        && matches!(target.os.as_str(), "linux" | "android" | "freebsd")
}

/// What one cached compilation produced: one relocatable object.
struct Job {
    /// Its name in the cache and in messages.
    name: String,
    /// The C and the C++ builds (either may have no files).
    builds: Vec<cc::Build>,
    /// Files whose contents the result depends on besides the builds' own sources.
    extra_inputs: Vec<PathBuf>,
}

impl CpuBuild<'_> {
    /// The core once, the CPU backend and our kernels once per variant, renamed and joined by
    /// the dispatcher. Returns the objects and whether the C++ compiler is Clang.
    fn compile_variants(
        &self,
        c_files: &[PathBuf],
        cpp_files: &[PathBuf],
        out: &Path,
        variants: &[Variant],
    ) -> (Vec<PathBuf>, bool) {
        let tree = self.tree;
        let is_cpu = |f: &&PathBuf| f.starts_with(&tree.cpu);
        let is_ours = |f: &&PathBuf| !f.starts_with(&tree.src);
        let ours_headers: Vec<PathBuf> = list(&tree.csrc, "h");

        let mut jobs = vec![Job {
            name: "core".into(),
            builds: self.builds(c_files, cpp_files, |f| !self.tree.tuned(f), &[]),
            extra_inputs: Vec::new(),
        }];
        // Per variant, the indices of its two jobs: ggml's CPU backend (shared with an earlier
        // variant of the same flags) and our kernels.
        let mut variant_jobs: Vec<(usize, usize)> = Vec::new();
        for (i, v) in variants.iter().enumerate() {
            let cpu_job = match variants[..i].iter().position(|w| w.flags == v.flags) {
                Some(earlier) => variant_jobs[earlier].0,
                None => {
                    jobs.push(Job {
                        name: format!("cpu-{}", v.tag),
                        builds: self.builds(c_files, cpp_files, |f| is_cpu(&f), v.flags),
                        extra_inputs: Vec::new(),
                    });
                    jobs.len() - 1
                }
            };
            let flags: Vec<&str> = v.flags.iter().chain(v.ours_flags).copied().collect();
            jobs.push(Job {
                name: format!("ours-{}", v.tag),
                builds: self.builds(c_files, cpp_files, |f| is_ours(&f), &flags),
                extra_inputs: ours_headers.clone(),
            });
            variant_jobs.push((cpu_job, jobs.len() - 1));
        }
        let compiler_is_clang = jobs[0]
            .builds
            .get(1)
            .and_then(|b| b.try_get_compiler().ok())
            .is_some_and(|c| c.is_like_clang());
        let linker = jobs[0].builds[0].get_compiler().path().to_path_buf();
        let cache = ObjectCache::new(out, &linker);

        let dir = out.join("variants");
        std::fs::create_dir_all(&dir).expect("create OUT_DIR/variants");
        let results: Vec<PathBuf> = std::thread::scope(|scope| {
            let handles: Vec<_> = jobs
                .iter()
                .map(|job| {
                    let (cache, dir, linker) = (&cache, &dir, &linker);
                    scope.spawn(move || cache.get(job, dir, linker, out))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("compilation thread"))
                .collect()
        });

        let mut objects = vec![results[0].clone()];
        let mut exported: Option<Vec<String>> = None;
        for (v, &(cpu_job, ours_job)) in variants.iter().zip(&variant_jobs) {
            let joined = dir.join(format!("variant-{}.o", v.tag));
            relink(&linker, &[&results[cpu_job], &results[ours_job]], &joined);
            let symbols = defined_globals(&joined);
            let renamed = dir.join(format!("variant-{}.renamed.o", v.tag));
            rename_symbols(&joined, &renamed, &symbols, v.tag, &dir);
            objects.push(renamed);
            // The trampolines: C functions (not C++ mangled names) every variant defines.
            let functions: Vec<String> = symbols
                .iter()
                .filter(|(name, kind)| *kind == 'T' && !name.starts_with("_Z"))
                .map(|(name, _)| name.clone())
                .collect();
            exported = Some(match exported {
                None => functions,
                Some(prev) => prev.into_iter().filter(|s| functions.contains(s)).collect(),
            });
        }
        let mut exported = exported.unwrap_or_default();
        exported.sort();
        objects.extend(self.compile_dispatcher(out, variants, &exported));
        (objects, compiler_is_clang)
    }

    /// The C and C++ builds of the files `take` selects, with `flags` as the SIMD level.
    fn builds(
        &self,
        c_files: &[PathBuf],
        cpp_files: &[PathBuf],
        take: impl Fn(&PathBuf) -> bool,
        flags: &[&str],
    ) -> Vec<cc::Build> {
        [(false, c_files), (true, cpp_files)]
            .into_iter()
            .map(|(cpp, files)| {
                let mut build = cc::Build::new();
                self.configure(&mut build, cpp, false);
                for flag in flags {
                    build.flag(flag);
                }
                build.files(files.iter().filter(|f| take(f)));
                build
            })
            .collect()
    }

    /// `dispatch.c` (the table, the variants' tables and the choice) and `trampolines.S`.
    fn compile_dispatcher(
        &self,
        out: &Path,
        variants: &[Variant],
        exported: &[String],
    ) -> Vec<PathBuf> {
        let dir = out.join("variants");
        let n = exported.len();
        let mut c = String::from("// Generated by ggml-sys's build script: see variants.rs.\n");
        c.push_str("#include <stdlib.h>\n#include <string.h>\n\n");
        for v in variants {
            for s in exported {
                let _ = writeln!(c, "extern void {s}__hdd_{}(void);", v.tag);
            }
        }
        let _ = writeln!(
            c,
            "\n__attribute__((visibility(\"hidden\"))) void * ggml_sys_cpu_table[{}] = {{",
            n.max(1)
        );
        for s in exported {
            let _ = writeln!(c, "    (void *) {s}__hdd_{},", variants[0].tag);
        }
        c.push_str("};\n\n");
        let _ = writeln!(
            c,
            "static void * const variant_tables[{}][{}] = {{",
            variants.len(),
            n.max(1)
        );
        for v in variants {
            c.push_str("    {\n");
            for s in exported {
                let _ = writeln!(c, "        (void *) {s}__hdd_{},", v.tag);
            }
            c.push_str("    },\n");
        }
        c.push_str("};\n\n");
        c.push_str(&dispatch_selection(variants));
        let c_path = dir.join("dispatch.c");
        std::fs::write(&c_path, c).expect("write dispatch.c");

        let mut s = String::from("// Generated by ggml-sys's build script: see variants.rs.\n");
        s.push_str("    .text\n");
        for (i, name) in exported.iter().enumerate() {
            let _ = write!(
                s,
                "    .p2align 4\n    .globl {name}\n    .type {name}, @function\n{name}:\n    \
                 jmp *ggml_sys_cpu_table+{}(%rip)\n    .size {name}, .-{name}\n",
                8 * i
            );
        }
        s.push_str("    .section .note.GNU-stack,\"\",@progbits\n");
        let s_path = dir.join("trampolines.S");
        std::fs::write(&s_path, s).expect("write trampolines.S");

        let mut build = cc::Build::new();
        self.configure(&mut build, false, false);
        build.file(&c_path).file(&s_path);
        build.compile_intermediates()
    }
}

impl CpuBuild<'_> {
    /// The `ggml_sys_cpu_*` functions of a build with one variant, `name`: nothing to choose,
    /// and a `LLAMA_HDD_CPU` naming another path is reported as not run.
    fn compile_single_dispatcher(&self, out: &Path, name: &str) -> Vec<PathBuf> {
        let c = format!(
            "// Generated by ggml-sys's build script: see variants.rs.\n\
             #include <stdlib.h>\n#include <string.h>\n\
             static const char * const name = \"{name}\";\n\
             int ggml_sys_cpu_paths(void) {{ return 1; }}\n\
             const char * ggml_sys_cpu_path_name(int v) {{ return v == 0 ? name : NULL; }}\n\
             int ggml_sys_cpu_path_supported(int v) {{ return v == 0; }}\n\
             int ggml_sys_cpu_path(void) {{ return 0; }}\n\
             int ggml_sys_cpu_request(void) {{\n\
             \x20   const char * want = getenv(\"LLAMA_HDD_CPU\");\n\
             \x20   if (want == NULL || want[0] == '\\0') return 0;\n\
             \x20   return strcmp(want, name) == 0 ? 1 : -3;\n\
             }}\n"
        );
        let dir = out.join("variants");
        std::fs::create_dir_all(&dir).expect("create OUT_DIR/variants");
        let path = dir.join("dispatch.c");
        std::fs::write(&path, c).expect("write dispatch.c");
        let mut build = cc::Build::new();
        self.configure(&mut build, false, false);
        build.file(&path);
        build.compile_intermediates()
    }
}

/// The C of the choice: `ggml_sys_cpu_*` (declared in src/lib.rs, `cpu`) and the constructor
/// that fills `ggml_sys_cpu_table` before `main`.
fn dispatch_selection(variants: &[Variant]) -> String {
    let mut c = String::new();
    let _ = writeln!(c, "#define N_VARIANTS {}", variants.len());
    c.push_str("static const char * const names[N_VARIANTS] = {");
    for v in variants {
        let _ = write!(c, "\"{}\", ", v.name);
    }
    c.push_str("};\n\nstatic const int opt_in[N_VARIANTS] = {");
    for v in variants {
        let _ = write!(c, "{}, ", u8::from(v.opt_in));
    }
    c.push_str("};\n\n");
    c.push_str(GRANTS_C);
    c.push_str("static int supported(int v) {\n    switch (v) {\n");
    for (i, v) in variants.iter().enumerate() {
        let test = v
            .requires
            .iter()
            .map(|f| format!("__builtin_cpu_supports(\"{f}\")"))
            .chain(v.grant.map(str::to_owned))
            .reduce(|a, b| format!("{a} && {b}"))
            .unwrap_or_else(|| "1".to_owned());
        let _ = writeln!(c, "        case {i}: return ({test}) != 0;");
    }
    c.push_str("        default: return 0;\n    }\n}\n\n");
    c.push_str(DISPATCH_C);
    c
}

/// What the operating system grants, for `Variant::grant`.
const GRANTS_C: &str = r#"#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

// 1 when Linux lets this process use AMX tile data (XFEATURE_XTILEDATA, 18), asking for it
// (ARCH_REQ_XCOMP_PERM, 0x1023) as a process must before its first tile instruction; the
// permission then holds for every thread of the process.
__attribute__((unused)) static int amx_granted(void) {
#if defined(__linux__) && defined(SYS_arch_prctl)
    return syscall(SYS_arch_prctl, 0x1023, 18) == 0;
#else
    return 0;
#endif
}

"#;

/// The fixed part of `dispatch.c` (after `names`, `supported`, the tables).
const DISPATCH_C: &str = r#"static int chosen = 0;
static int request = 0;

// Fills the table for the highest variant the CPU runs (leaving out those taken only when named),
// or for the one LLAMA_HDD_CPU names when the CPU runs that one ("scalar" and "baseline" name the
// lowest).
__attribute__((constructor(101))) static void ggml_sys_cpu_choose(void) {
    __builtin_cpu_init();
    int best = 0;
    for (int v = 0; v < N_VARIANTS; ++v) {
        if (!opt_in[v] && supported(v)) {
            best = v;
        }
    }
    chosen = best;
    const char * want = getenv("LLAMA_HDD_CPU");
    if (want != NULL && want[0] != '\0') {
        int named = -1;
        if (strcmp(want, "scalar") == 0 || strcmp(want, "baseline") == 0) {
            named = 0;
        }
        for (int v = 0; v < N_VARIANTS && named < 0; ++v) {
            if (strcmp(want, names[v]) == 0) {
                named = v;
            }
        }
        if (named < 0) {
            request = -2;
        } else if (!supported(named)) {
            request = -3;
        } else {
            request = 1;
            chosen = named;
        }
    }
    memcpy(ggml_sys_cpu_table, variant_tables[chosen], sizeof(ggml_sys_cpu_table));
}

int ggml_sys_cpu_paths(void) { return N_VARIANTS; }
const char * ggml_sys_cpu_path_name(int v) { return v >= 0 && v < N_VARIANTS ? names[v] : NULL; }
int ggml_sys_cpu_path_supported(int v) { return supported(v); }
int ggml_sys_cpu_path(void) { return chosen; }
int ggml_sys_cpu_request(void) { return request; }
"#;

/// `cc -r`: `inputs` joined into one relocatable object.
fn relink(linker: &Path, inputs: &[&Path], output: &Path) {
    let status = Command::new(linker)
        .args(["-r", "-nostdlib", "-o"])
        .arg(output)
        .args(inputs)
        .status()
        .unwrap_or_else(|e| fail(&format!("cannot run {}: {e}", linker.display())));
    if !status.success() {
        fail(&format!(
            "{} -r (joining {} objects into {}) failed; set GGML_SYS_VARIANTS=0 to build one \
             CPU variant",
            linker.display(),
            inputs.len(),
            output.display()
        ));
    }
}

/// A binutils tool: the variable `var` names it, else the first of `names` that runs.
fn binutil(var: &str, names: &[&str]) -> String {
    println!("cargo:rerun-if-env-changed={var}");
    if let Ok(tool) = env::var(var) {
        return tool;
    }
    for name in names {
        if Command::new(name).arg("--version").output().is_ok() {
            return (*name).to_owned();
        }
    }
    fail(&format!(
        "none of {names:?} found (binutils); install it, name it in {var}, or set \
         GGML_SYS_VARIANTS=0 to build one CPU variant"
    ))
}

/// The defined global symbols of `object`, with `nm`'s kind letter.
fn defined_globals(object: &Path) -> Vec<(String, char)> {
    let nm = binutil("NM", &["nm", "llvm-nm"]);
    let output = Command::new(&nm)
        .args(["-g", "--defined-only", "--format=posix"])
        .arg(object)
        .output()
        .unwrap_or_else(|e| fail(&format!("cannot run {nm}: {e}")));
    if !output.status.success() {
        fail(&format!("{nm} {} failed", object.display()));
    }
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| {
            let mut parts = line.split_whitespace();
            let name = parts.next()?;
            let kind = parts.next()?.chars().next()?;
            Some((name.to_owned(), kind))
        })
        .collect()
}

/// `input` with each of `symbols` renamed `<name>__hdd_<tag>`, and its sections out of their
/// COMDAT groups, into `output`.
fn rename_symbols(input: &Path, output: &Path, symbols: &[(String, char)], tag: &str, dir: &Path) {
    let map = dir.join(format!("rename-{tag}.txt"));
    let mut text = String::new();
    for (name, _) in symbols {
        let _ = writeln!(text, "{name} {name}__hdd_{tag}");
    }
    std::fs::write(&map, text).expect("write the symbol map");
    let objcopy = binutil("OBJCOPY", &["objcopy", "llvm-objcopy"]);
    // The COMDAT groups go too: every variant has groups with the same signatures (a C++
    // constructor's, for one), and the linker would keep the first variant's sections for all
    // of them, leaving the others' renamed symbols undefined.
    let status = Command::new(&objcopy)
        .arg(format!("--redefine-syms={}", map.display()))
        .arg("--remove-section=.group")
        .arg(input)
        .arg(output)
        .status()
        .unwrap_or_else(|e| fail(&format!("cannot run {objcopy}: {e}")));
    if !status.success() {
        fail(&format!(
            "{objcopy} --redefine-syms on {} failed",
            input.display()
        ));
    }
}

/// Relocatable objects kept under the target directory (`ggml-sys-objects/`), named by a hash of
/// what made them: the compiler and its version, every argument (with `OUT_DIR` taken out, so
/// that profiles share them), every source's and extra input's contents.
struct ObjectCache {
    dir: PathBuf,
    /// The hash of the compiler's `--version` output.
    compiler: u64,
}

impl ObjectCache {
    fn new(out: &Path, compiler: &Path) -> Self {
        // The target directory is the nearest ancestor that cargo marked with CACHEDIR.TAG.
        let root = out
            .ancestors()
            .find(|d| d.join("CACHEDIR.TAG").is_file())
            .unwrap_or(out);
        let dir = root.join("ggml-sys-objects");
        std::fs::create_dir_all(&dir).expect("create the object cache");
        let version = Command::new(compiler)
            .arg("--version")
            .output()
            .map(|o| o.stdout)
            .unwrap_or_default();
        ObjectCache {
            dir,
            compiler: fnv1a(
                fnv1a(FNV_OFFSET, compiler.as_os_str().as_encoded_bytes()),
                &version,
            ),
        }
    }

    /// `job`'s object: from the cache, else compiled (in `scratch`) and stored.
    fn get(&self, job: &Job, scratch: &Path, linker: &Path, out: &Path) -> PathBuf {
        let out_text = out.to_string_lossy().into_owned();
        // The build script's own text too: a change to how objects are made must not meet
        // objects made the old way.
        let mut hash = fnv1a(self.compiler, include_str!("variants.rs").as_bytes());
        hash = fnv1a(hash, include_str!("build.rs").as_bytes());
        hash = fnv1a(hash, job.name.as_bytes());
        // What the hash covers besides file contents, kept beside the objects for a reader
        // wondering why a build missed the cache.
        let mut key_text = String::new();
        for build in &job.builds {
            let tool = build.get_compiler();
            for arg in tool.args() {
                let arg = arg.to_string_lossy().replace(&out_text, "$OUT_DIR");
                hash = fnv1a(hash, arg.as_bytes());
                hash = fnv1a(hash, &[0]);
                key_text.push_str(&arg);
                key_text.push('\n');
            }
            hash = fnv1a(hash, &[1]);
            key_text.push('\n');
        }
        let _ = std::fs::write(scratch.join(format!("{}.key.txt", job.name)), &key_text);
        let mut inputs: Vec<PathBuf> = job
            .builds
            .iter()
            .flat_map(|b| b.get_files().map(Path::to_path_buf).collect::<Vec<_>>())
            .collect();
        inputs.extend(job.extra_inputs.iter().cloned());
        inputs.push(out.join("include").join("ggml-version.h"));
        for input in &inputs {
            let bytes =
                std::fs::read(input).unwrap_or_else(|e| fail(&format!("{}: {e}", input.display())));
            let name = input.to_string_lossy().replace(&out_text, "$OUT_DIR");
            hash = fnv1a(hash, name.as_bytes());
            hash = fnv1a(hash, &bytes);
        }
        let cached = self.dir.join(format!("{}-{hash:016x}.o", job.name));
        if cached.is_file() {
            return cached;
        }
        let objects: Vec<PathBuf> = job
            .builds
            .iter()
            .filter(|b| b.get_files().next().is_some())
            .enumerate()
            .flat_map(|(i, b)| {
                // Each job's objects in a directory of its own: cc names an object after its
                // source, and the variants compile the same sources at once.
                let dir = scratch.join(format!("{}-{i}", job.name));
                std::fs::create_dir_all(&dir).expect("create a job's object directory");
                b.clone().out_dir(dir).compile_intermediates()
            })
            .collect();
        let joined = scratch.join(format!("{}.o", job.name));
        let inputs: Vec<&Path> = objects.iter().map(PathBuf::as_path).collect();
        relink(linker, &inputs, &joined);
        // Another build (another profile) may store the same object at once: each writes its
        // own temporary file and renames it into place.
        let temporary = self.dir.join(format!(
            ".{}-{hash:016x}.{}.tmp",
            job.name,
            std::process::id()
        ));
        std::fs::copy(&joined, &temporary).expect("copy into the object cache");
        std::fs::rename(&temporary, &cached).expect("rename into the object cache");
        cached
    }
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

/// FNV-1a over `bytes`, continuing from `hash`: stable across Rust versions, unlike std's.
fn fnv1a(mut hash: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash
}
