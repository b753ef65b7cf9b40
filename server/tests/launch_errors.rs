//! A mistake on the command line is said first, in one line, with exit status 2: nothing is
//! said of a cache or a model that the options name but that cannot be used.

mod common;

use std::process::Command;

/// Runs the server binary with `args`; its exit status and standard error.
fn launch(args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_llama-hdd-server"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_missing_model_or_an_unusable_cache_directory_is_an_option_error() {
    let env = common::Env::new();
    let model = env.model.display().to_string();
    let cache = env.cache().display().to_string();
    let file = env.dir.path().join("a-file");
    std::fs::write(&file, b"").unwrap();
    let under_a_file = file.join("cache").display().to_string();
    let cases: [(&[&str], &str); 4] = [
        (
            &["-m", "/nonexistent/model.gguf", "--cache-dir", &cache],
            "--model",
        ),
        (
            &["-m", &model, "--cache-dir", "/proc/llama-hdd"],
            "--cache-dir",
        ),
        (&["-m", &model, "--cache-dir", &under_a_file], "--cache-dir"),
        (&["-m", &model, "--bogus"], "--bogus"),
    ];
    for (args, said) in cases {
        let (code, stderr) = launch(args);
        assert_eq!(code, Some(2), "{args:?}: {stderr}");
        let first = stderr.lines().next().unwrap_or_default();
        assert!(
            first.starts_with("error:") && first.contains(said),
            "{args:?}: the first line is {first:?}"
        );
        assert!(!stderr.contains("prompt cache:"), "{args:?}: {stderr}");
    }
}
