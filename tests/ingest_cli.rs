//! The ingest example run as a user would, on a tiny model the test writes: killed with
//! SIGKILL at random moments, each rerun completes, recomputes at most one checkpoint interval
//! and ends with the same KV bytes as an uninterrupted run; Ctrl-C stops with everything kept;
//! bad files are refused with a message and a non-zero exit; a document longer than the context
//! is read with context shifts, checkpointed across them, and a run killed after a shift
//! resumes to the same bits; a full disk (a file-size limit) stops the ingestion with an error,
//! the store intact, and a rerun resumes from it; the chat answers, and the last line is the
//! JSON summary.
//!
//! The binary is the example that `cargo test` builds beside the tests; a filtered run needs it
//! built first: `cargo build --example ingest && cargo test --test ingest_cli`. `INGEST_KILLS=N`
//! sets the number of kills (5 by default).

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use engine::store::{SessionStore, StoreConfig};
use engine::testing::{SplitMix64, TinyChatModel};
use engine::{ContextParams, Model, Session};

const INTERVAL: usize = 64;
const CTX: usize = 4096;

fn ingest_bin() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe.parent().unwrap().parent().unwrap();
    let bin = profile_dir
        .join("examples")
        .join(format!("ingest{}", std::env::consts::EXE_SUFFIX));
    assert!(
        bin.is_file(),
        "{} is missing: build it with `cargo build --example ingest`",
        bin.display()
    );
    bin
}

/// A tiny llama model with a byte-level vocabulary (one token per byte) and ChatML's control
/// tokens.
fn write_model(path: &Path) {
    TinyChatModel::default().write(path).unwrap();
}

/// A directory with the tiny model and a document of `n_chars` bytes (one token each).
struct Env {
    dir: tempfile::TempDir,
    model: PathBuf,
    doc: PathBuf,
}

impl Env {
    fn new(n_chars: usize) -> Env {
        let dir = tempfile::tempdir().unwrap();
        let model = dir.path().join("tiny.gguf");
        write_model(&model);
        let doc = dir.path().join("doc.txt");
        let words = [
            "alpha ",
            "beta ",
            "gamma ",
            "delta\n",
            "epsilon, ",
            "zeta. ",
        ];
        let mut text = String::new();
        let mut i = 0;
        while text.len() < n_chars {
            text.push_str(words[(i * 7 + i / 5) % words.len()]);
            i += 1;
        }
        text.truncate(n_chars);
        std::fs::write(&doc, text).unwrap();
        Env { dir, model, doc }
    }

    /// The ingest command on `file` with the store `store` (a directory under the test's).
    fn command(&self, file: &Path, store: &str, args: &[&str]) -> Command {
        let mut cmd = Command::new(ingest_bin());
        cmd.args(self.args(file, store, args));
        self.pipes(&mut cmd);
        cmd
    }

    /// The ingest example's arguments.
    fn args(&self, file: &Path, store: &str, args: &[&str]) -> Vec<OsString> {
        let mut all: Vec<OsString> = vec![
            file.into(),
            "--model".into(),
            self.model.clone().into(),
            "--store".into(),
            self.dir.path().join(store).into(),
        ];
        all.extend(
            [
                "--threads",
                "1",
                "--ctx",
                &CTX.to_string(),
                "--interval",
                &INTERVAL.to_string(),
                "--ubatch",
                "64",
                "--name",
                "doc",
                "--temp",
                "0",
            ]
            .iter()
            .chain(args)
            .map(OsString::from),
        );
        all
    }

    fn pipes(&self, cmd: &mut Command) {
        cmd.current_dir(self.dir.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
    }

    /// Runs to the end with `input` on standard input.
    fn run(&self, file: &Path, store: &str, args: &[&str], input: &str) -> Run {
        wait(self.command(file, store, args).spawn().unwrap(), input)
    }

    /// Runs to the end under a shell's file-size limit of `blocks` × 512 bytes (`ulimit -f`),
    /// with SIGXFSZ ignored, so that a write past the limit fails with EFBIG as a write to a
    /// full disk fails with ENOSPC.
    fn run_limited(&self, blocks: u64, file: &Path, store: &str, args: &[&str]) -> Run {
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg(r#"trap '' XFSZ && ulimit -f "$1" && shift && exec "$@""#)
            .arg("sh")
            .arg(blocks.to_string())
            .arg(ingest_bin())
            .args(self.args(file, store, args));
        self.pipes(&mut cmd);
        wait(cmd.spawn().unwrap(), "")
    }

    /// Tokens and KV bytes (every layer, K then V) of checkpoint `doc` in `store`, restored
    /// through the library; `None` when there is none.
    fn stored(&self, store: &str) -> Option<(usize, Vec<u8>)> {
        let model = Model::load(&self.model).unwrap();
        let store =
            SessionStore::open(&self.dir.path().join(store), &model, StoreConfig::default())
                .unwrap();
        if !store.exists("doc").unwrap() {
            return None;
        }
        let params = ContextParams {
            n_ctx: CTX,
            n_threads: 1,
            ..ContextParams::default()
        };
        let mut s = Session::new(model, params).unwrap();
        store.restore(&mut s, "doc").unwrap();
        let n = s.tokens().len();
        let all = s.kv_bytes().unwrap();
        Some((n, all))
    }
}

/// Waits for `child` after writing `input` to its standard input.
fn wait(mut child: std::process::Child, input: &str) -> Run {
    let _ = child.stdin.take().unwrap().write_all(input.as_bytes());
    let out = child.wait_with_output().unwrap();
    Run {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Verifies every file of the store at `dir` read-only, as `ckpt verify` does: each block
/// file, each checkpoint with all its blocks. Returns the checkpoints and block files and
/// temporary files seen.
fn verify_store(dir: &Path) -> (usize, usize, usize) {
    let mut counts = (0, 0, 0);
    for model in std::fs::read_dir(dir.join("models")).unwrap() {
        let model = model.unwrap().path();
        let store = ckptfmt::Store::open_read_only(&model).unwrap();
        for id in store.list_blocks().unwrap() {
            store
                .read_block(&id)
                .unwrap_or_else(|e| panic!("block {id}: {e}"));
            counts.1 += 1;
        }
        for name in store.list_manifests().unwrap() {
            store
                .verify_checkpoint(&name)
                .unwrap_or_else(|e| panic!("checkpoint {name}: {e}"));
            counts.0 += 1;
        }
        for sub in ["blocks", "manifests"] {
            for f in std::fs::read_dir(model.join(sub)).unwrap() {
                let name = f.unwrap().file_name();
                counts.2 += usize::from(name.to_string_lossy().ends_with(".tmp"));
            }
        }
    }
    counts
}

struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Run {
    /// The JSON summary: the last line of standard output.
    fn summary(&self) -> serde_json::Value {
        let last = self.stdout.lines().last().unwrap_or("");
        serde_json::from_str(last)
            .unwrap_or_else(|e| panic!("last line {last:?} is not JSON ({e}); {}", self.stderr))
    }

    fn field(&self, key: &str) -> usize {
        self.summary()[key].as_u64().unwrap() as usize
    }
}

#[test]
fn killed_at_random_moments_each_rerun_ends_as_an_uninterrupted_run() {
    let env = Env::new(3000);
    let started = Instant::now();
    let whole = env.run(&env.doc, "whole", &["--no-chat"], "");
    let duration = started.elapsed();
    assert_eq!(whole.code, Some(0), "{}", whole.stderr);
    let total = whole.field("tokens");
    assert_eq!(total, 3000);
    assert_eq!(
        (whole.field("restored"), whole.field("computed")),
        (0, total)
    );
    assert_eq!(whole.field("shifts"), 0);
    let (n, want) = env.stored("whole").unwrap();
    assert_eq!(n, total);
    // The benchmark's reference mode evaluates the same tokens and stores nothing.
    let plain = env.run(&env.doc, "plain", &["--plain"], "");
    assert_eq!(plain.code, Some(0), "{}", plain.stderr);
    assert_eq!(
        (plain.field("tokens"), plain.field("computed")),
        (total, total)
    );
    assert!(plain.summary()["seconds"].as_f64().unwrap() > 0.0);
    assert!(!env.dir.path().join("plain").exists());

    let seed = ckptfmt::since_epoch().as_nanos() as u64;
    eprintln!("kill moments seeded with {seed}");
    let mut rng = SplitMix64(seed);
    // Five kills by default (CI has two cores); `INGEST_KILLS=20` for the issue's count.
    let rounds = std::env::var("INGEST_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    for round in 0..rounds {
        let store = format!("killed{round}");
        let wait = Duration::from_micros(rng.next_u64() % duration.as_micros().max(1) as u64);
        let mut child = env
            .command(&env.doc, &store, &["--no-chat"])
            .spawn()
            .unwrap();
        std::thread::sleep(wait);
        let _ = child.kill(); // SIGKILL; it may have finished already
        let _ = child.wait();
        let kept = env.stored(&store).map_or(0, |(n, _)| n);

        let rerun = env.run(&env.doc, &store, &["--no-chat"], "");
        assert_eq!(rerun.code, Some(0), "round {round}: {}", rerun.stderr);
        let (restored, computed) = (rerun.field("restored"), rerun.field("computed"));
        eprintln!("round {round}: killed after {wait:?}, {kept} kept, {restored} restored");
        assert_eq!(restored + computed, total, "round {round}");
        assert!(
            restored + INTERVAL >= kept.min(total - 1),
            "round {round}: {kept} tokens were saved, only {restored} restored"
        );
        let (n, got) = env.stored(&store).unwrap();
        assert_eq!(n, total, "round {round}");
        assert!(
            got == want,
            "round {round}: KV bytes differ from the uninterrupted run"
        );
    }
}

#[test]
fn ctrl_c_stops_with_everything_kept_and_a_rerun_resumes() {
    let env = Env::new(3000);
    let mut child = env
        .command(&env.doc, "store", &["--no-chat"])
        .spawn()
        .unwrap();
    // The handler is installed before the line announcing the reading.
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    while stderr.read_line(&mut line).unwrap() > 0 && !line.contains("reading") {
        line.clear();
    }
    // Let it read a little first.
    std::thread::sleep(Duration::from_millis(300));
    let pid = child.id().to_string();
    let signalled = Command::new("kill").args(["-INT", &pid]).status().unwrap();
    assert!(signalled.success());
    let out = child.wait_with_output().unwrap();
    let stopped = Run {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::new(),
    };
    let held = stopped.field("restored") + stopped.field("computed");
    eprintln!("exit {:?} after {held} tokens", stopped.code);
    match stopped.code {
        // Stopped: by the signal, possibly after the last micro-batch (it came in between).
        Some(130) => assert!(held <= 3000),
        // It may have finished before the signal arrived.
        Some(0) => assert_eq!(held, 3000),
        other => panic!("exit {other:?}"),
    }
    // What was read is saved (nothing when it stopped before its first micro-batch).
    let kept = env.stored("store").map_or(0, |(n, _)| n);
    assert_eq!(kept, held);

    let rerun = env.run(&env.doc, "store", &["--no-chat"], "");
    assert_eq!(rerun.code, Some(0), "{}", rerun.stderr);
    assert_eq!(
        rerun.field("restored"),
        (held / INTERVAL * INTERVAL).min(2999 / 64 * 64)
    );
}

#[test]
fn bad_files_are_refused_with_a_message() {
    let env = Env::new(100);
    let empty = env.dir.path().join("empty.txt");
    std::fs::write(&empty, "").unwrap();
    let blank = env.dir.path().join("blank.txt");
    std::fs::write(&blank, " \n\n").unwrap();
    let binary = env.dir.path().join("binary.txt");
    std::fs::write(&binary, b"abc\xff\xfedef").unwrap();
    let missing = env.dir.path().join("missing.txt");
    let long = env.dir.path().join("long.txt");
    std::fs::write(&long, "x".repeat(CTX + 1)).unwrap();
    for (file, says) in [
        (&empty, "is empty"),
        (&blank, "is empty"),
        (&binary, "not UTF-8 text (invalid byte at offset 3)"),
        (&missing, "missing.txt"),
        (&long, "more than the context"),
    ] {
        let run = env.run(file, "store", &["--no-chat", "--no-shift"], "");
        assert_eq!(run.code, Some(1), "{}: {}", file.display(), run.stderr);
        assert!(
            run.stderr.contains(says),
            "{}: {}",
            file.display(),
            run.stderr
        );
        assert!(run.stdout.is_empty(), "{}", run.stdout);
    }
    assert!(env.stored("store").is_none());
}

#[test]
fn the_chat_answers_and_the_summary_comes_last() {
    let env = Env::new(200);
    let run = env.run(
        &env.doc,
        "store",
        &["--max-tokens", "5"],
        "what is it about?\n\nand then?\n",
    );
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    // Two answers (each ends with a line break, and may hold more) and the summary.
    assert!(run.stdout.lines().count() >= 3, "{}", run.stdout);
    assert_eq!(run.field("tokens"), 200);
    // The chat does not change the stored document.
    assert_eq!(env.stored("store").unwrap().0, 200);
}

#[test]
fn a_document_longer_than_the_context_is_read_with_shifts_and_resumes_after_a_kill() {
    let env = Env::new(3000);
    let shifting = ["--no-chat", "--ctx", "1024", "--keep", "16"];
    let run = env.run(&env.doc, "whole", &shifting, "");
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(run.field("tokens"), 3000);
    assert_eq!(run.field("computed"), 3000);
    let shifts = run.field("shifts");
    assert!(shifts >= 3, "{}", run.stdout);
    // Checkpoints go on across shifts: the last one holds what the session held at the end.
    let (held, want) = env.stored("whole").unwrap();
    assert!(held <= 1024 && held > 512, "{held}");

    // Killed once a checkpoint saved after a shift is on disk (its metadata says it covers
    // more than the context holds).
    let model = Model::load(&env.model).unwrap();
    let store_dir = env.dir.path().join("killed");
    let store = SessionStore::open(&store_dir, &model, StoreConfig::default()).unwrap();
    let mut child = env.command(&env.doc, "killed", &shifting).spawn().unwrap();
    let covered = || {
        let (_, meta) = store.read_checkpoint("doc").ok()?;
        meta.app
            .get(engine::ingest::DONE_KEY)?
            .parse::<usize>()
            .ok()
    };
    let started = Instant::now();
    while covered().is_none_or(|done| done <= 1100) {
        assert!(started.elapsed() < Duration::from_secs(300), "no progress");
        std::thread::sleep(Duration::from_millis(5));
    }
    let _ = child.kill();
    let _ = child.wait();
    eprintln!("killed after a checkpoint covering {:?} tokens", covered());
    let rerun = env.run(&env.doc, "killed", &shifting, "");
    assert_eq!(rerun.code, Some(0), "{}", rerun.stderr);
    let (restored, computed) = (rerun.field("restored"), rerun.field("computed"));
    eprintln!("killed: {restored} restored, {computed} computed");
    assert_eq!(restored + computed, 3000);
    assert!(
        restored > 1024,
        "the rerun did not resume after the shift: {restored}"
    );
    assert_eq!(
        rerun.field("shifts"),
        shifts,
        "shifts count from the document's start"
    );
    let (n, got) = env.stored("killed").unwrap();
    assert_eq!(n, held);
    assert!(got == want, "KV bytes differ from the uninterrupted run");
}

/// 28 × 512 bytes: a block file of the tiny model (12 KiB) fits, a manifest fits up to about
/// 1400 tokens (8 bytes of token and position each, aligned to 4 KiB).
const FULL_DISK_BLOCKS: u64 = 28;

#[test]
fn a_full_disk_stops_with_an_error_and_a_rerun_resumes() {
    let env = Env::new(3000);
    let whole = env.run(&env.doc, "whole", &["--no-chat"], "");
    assert_eq!(whole.code, Some(0), "{}", whole.stderr);
    let (_, want) = env.stored("whole").unwrap();

    let full = env.run_limited(FULL_DISK_BLOCKS, &env.doc, "full", &["--no-chat"]);
    eprintln!("{}", full.stderr);
    assert_eq!(full.code, Some(1), "{}", full.stderr);
    assert!(full.stderr.contains("File too large"), "{}", full.stderr);
    assert!(!full.stderr.contains("panicked"), "{}", full.stderr);
    assert!(full.stdout.is_empty(), "{}", full.stdout);
    // Everything saved before the failed write is intact.
    let (checkpoints, blocks, tmp) = verify_store(&env.dir.path().join("full"));
    eprintln!("{checkpoints} checkpoints, {blocks} block files, {tmp} temporary files");
    assert_eq!((checkpoints, tmp), (1, 0));
    let (kept, _) = env.stored("full").unwrap();
    assert!(
        (10 * INTERVAL..3000).contains(&kept) && kept.is_multiple_of(INTERVAL),
        "{kept}"
    );
    assert!(blocks >= kept / 64);

    // With room again, the same command resumes from there (every block stored, those put
    // before the failed manifest included) and ends as an uninterrupted run.
    let rerun = env.run(&env.doc, "full", &["--no-chat"], "");
    assert_eq!(rerun.code, Some(0), "{}", rerun.stderr);
    let restored = rerun.field("restored");
    assert_eq!(restored, blocks * 64);
    assert!(restored >= kept);
    assert_eq!(rerun.field("computed"), 3000 - restored);
    let (n, got) = env.stored("full").unwrap();
    assert_eq!(n, 3000);
    assert!(got == want, "KV bytes differ from the uninterrupted run");
    assert_eq!(verify_store(&env.dir.path().join("full")).0, 1);
}
