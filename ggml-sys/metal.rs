// Included by build.rs: ggml's Metal backend (feature `metal`).

/// Compiles ggml's Metal backend with its shader sources embedded (one start/end symbol pair per
/// kernel library, as ggml's own build emits them), so nothing is needed at run time.
fn build_metal(
    ggml: &Path,
    include_dir: &Path,
    out: &Path,
    defines: &[(&str, Option<&str>)],
) -> Vec<PathBuf> {
    let dir = ggml.join("src/ggml-metal");
    let kernels = dir.join("kernels");
    let read = |p: &Path| {
        std::fs::read_to_string(p).unwrap_or_else(|e| fail(&format!("{}: {e}", p.display())))
    };
    let common_h = read(&ggml.join("src/ggml-common.h"));
    let impl_h = read(&dir.join("ggml-metal-impl.h"));
    let shared = [
        "common.h",
        "dequantize.h",
        "quantize.h",
        "fa_common.metal",
        "fa_vec_common.metal",
    ];
    let embed_dir = out.join("metal-embed");
    std::fs::create_dir_all(&embed_dir).expect("create metal-embed");
    let mut asm_files = Vec::new();
    for source in list(&kernels, "metal") {
        let name = source.file_stem().unwrap().to_string_lossy().into_owned();
        if shared.contains(&format!("{name}.metal").as_str()) {
            continue;
        }
        let body = read(&source);
        // The shared headers this kernel includes, in ggml's order, then the kernel itself.
        let mut text = read(&kernels.join("common.h"));
        for (header, marker) in [
            ("dequantize.h", "#include \"dequantize.h\""),
            ("quantize.h", "#include \"quantize.h\""),
            ("fa_common.metal", "#include \"fa_common.metal\""),
            ("fa_vec_common.metal", "#include \"fa_vec_common.metal\""),
        ] {
            if body.contains(marker) {
                text.push_str(&read(&kernels.join(header)));
            }
        }
        text.push_str(&body);
        let mut inlined = String::new();
        for line in text.lines() {
            let t = line.trim();
            if t == "#pragma once" || shared.iter().any(|h| t == format!("#include \"{h}\"")) {
                continue;
            }
            if t == "__embed_ggml-common.h__" {
                inlined.push_str(&common_h);
            } else if t == "#include \"ggml-metal-impl.h\"" {
                inlined.push_str(&impl_h);
            } else {
                inlined.push_str(line);
            }
            inlined.push('\n');
        }
        let embedded = embed_dir.join(format!("{name}.metal"));
        std::fs::write(&embedded, inlined).expect("write embedded kernel");
        let sym = name.replace('-', "_");
        let asm = embed_dir.join(format!("{name}.s"));
        std::fs::write(
            &asm,
            format!(
                ".section __DATA,__ggml_metallib\n.globl _ggml_metallib_{sym}_start\n_ggml_metallib_{sym}_start:\n\
                 .incbin \"{}\"\n.globl _ggml_metallib_{sym}_end\n_ggml_metallib_{sym}_end:\n",
                embedded.display()
            ),
        )
        .expect("write embed assembly");
        asm_files.push(asm);
    }

    let mut objc = backend_build(ggml, include_dir, &dir, defines);
    objc.define("GGML_METAL_EMBED_LIBRARY", None)
        .flag("-fobjc-arc")
        .files(list(&dir, "m"))
        .files(&asm_files);
    let mut objects = objc.compile_intermediates();
    let mut cpp = backend_build(ggml, include_dir, &dir, defines);
    cpp.define("GGML_METAL_EMBED_LIBRARY", None)
        .cpp(true)
        .std("gnu++17")
        .files(list(&dir, "cpp"));
    objects.extend(cpp.compile_intermediates());
    objects
}
