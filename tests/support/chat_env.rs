//! The harness of `chat_cli.rs`: a directory with a tiny model, the chat run in it on piped
//! input, and the store read back through the library.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use engine::store::{SessionStore, StoreConfig};
use engine::{ContextParams, KvType, Model, Session};

#[path = "chat_model.rs"]
mod chat_model;
use chat_model::{write_model, write_model_wide};
pub use engine::testing::files_under;

/// The chat example next to this test's executable (`target/<profile>/examples/chat`).
fn chat_bin() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe.parent().unwrap().parent().unwrap();
    let bin = profile_dir
        .join("examples")
        .join(format!("chat{}", std::env::consts::EXE_SUFFIX));
    assert!(
        bin.is_file(),
        "{} is missing: build it with `cargo build --example chat`",
        bin.display()
    );
    bin
}

/// A directory with a tiny model and a store.
pub struct Env {
    /// The directory (the chat's working directory).
    pub dir: tempfile::TempDir,
    /// The tiny model in it.
    pub model: PathBuf,
}

impl Env {
    /// A tiny model with the default template.
    pub fn new() -> Env {
        Env::with_template(None)
    }

    /// A tiny model with `template` as its chat template (the default when `None`).
    pub fn with_template(template: Option<&str>) -> Env {
        let dir = tempfile::tempdir().unwrap();
        let model = dir.path().join("tiny.gguf");
        write_model(&model, template);
        Env { dir, model }
    }

    /// A tiny model whose heads hold whole q8_0 blocks (head size 32).
    pub fn for_q8_0() -> Env {
        let dir = tempfile::tempdir().unwrap();
        let model = dir.path().join("tiny.gguf");
        write_model_wide(&model, None, 128);
        Env { dir, model }
    }

    /// The store the tests give the chat (`--store`).
    pub fn store(&self) -> PathBuf {
        self.dir.path().join("store")
    }

    /// The user's cache directory the chat is given (`XDG_CACHE_HOME`).
    pub fn cache_home(&self) -> PathBuf {
        self.dir.path().join("cache")
    }

    /// The store a chat without `--store` uses: `llama-hdd/chat` in the user's cache directory.
    pub fn default_store(&self) -> PathBuf {
        self.cache_home().join("llama-hdd").join("chat")
    }

    /// The chat command with the test's defaults (tiny model, greedy, short replies); `args`
    /// come last, so they override.
    pub fn command(&self, args: &[&str]) -> Command {
        let mut cmd = self.command_without_store(&[]);
        cmd.arg("--store").arg(self.store()).args(args);
        cmd
    }

    /// The chat command, run in the test's directory, without `--store`; the user's home and
    /// cache directories are the test's too.
    pub fn command_without_store(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(chat_bin());
        cmd.current_dir(self.dir.path())
            .env("XDG_CACHE_HOME", self.cache_home())
            .env("HOME", self.dir.path().join("home"))
            .arg("--model")
            .arg(&self.model)
            .args(["--threads", "1", "--temp", "0", "--max-tokens", "6"])
            .args(["--ctx", "2048", "--cache-ram", "8MiB"])
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        cmd
    }

    /// Runs the chat on `input` to its end.
    pub fn run(&self, args: &[&str], input: &str) -> Run {
        run(self.command(args), input)
    }

    /// Runs the chat on `input` and checks that it succeeded.
    pub fn chat(&self, args: &[&str], input: &str) -> Run {
        let run = self.run(args, input);
        assert!(run.ok, "chat failed:\n{}", run.stderr);
        run
    }

    /// The messages of checkpoint `name`, restored through the library (every block read and
    /// verified), and its token count.
    pub fn restore(&self, name: &str) -> engine::Result<(Vec<(String, String)>, usize)> {
        self.restore_typed(name, KvType::F16)
    }

    /// As [`Env::restore`], with K and V of `kv_type`.
    pub fn restore_typed(
        &self,
        name: &str,
        kv_type: KvType,
    ) -> engine::Result<(Vec<(String, String)>, usize)> {
        self.restore_from(&self.store(), name, kv_type)
    }

    /// As [`Env::restore_typed`], from the store at `dir`.
    pub fn restore_from(
        &self,
        dir: &Path,
        name: &str,
        kv_type: KvType,
    ) -> engine::Result<(Vec<(String, String)>, usize)> {
        let model = Model::load(&self.model)?;
        let config = StoreConfig {
            type_k: kv_type,
            type_v: kv_type,
            ..StoreConfig::default()
        };
        let store = SessionStore::open(dir, &model, config)?;
        let params = ContextParams {
            n_ctx: 8192,
            n_threads: 1,
            type_k: kv_type,
            type_v: kv_type,
            ..ContextParams::default()
        };
        let mut session = Session::new(model.clone(), params)?;
        let meta = store.restore(&mut session, name)?;
        let json: serde_json::Value = serde_json::from_str(&meta.app["messages"]).unwrap();
        let messages = json
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                (
                    m["role"].as_str().unwrap().to_owned(),
                    m["content"].as_str().unwrap().to_owned(),
                )
            })
            .collect();
        Ok((messages, session.tokens().len()))
    }

    /// Whether the store holds a checkpoint `name`.
    pub fn exists(&self, name: &str) -> bool {
        let model = Model::load(&self.model).unwrap();
        let store = SessionStore::open(&self.store(), &model, StoreConfig::default()).unwrap();
        store.exists(name).unwrap()
    }

    /// Files under the store whose path has a component `dir` (`blocks`, `manifests`).
    pub fn files_in(&self, dir: &str) -> Vec<PathBuf> {
        files_under(&self.store())
            .into_iter()
            .filter(|p| p.components().any(|c| c.as_os_str() == dir))
            .collect()
    }
}

/// Runs `cmd` on `input` to its end.
pub fn run(mut cmd: Command, input: &str) -> Run {
    let mut child = cmd.spawn().unwrap();
    // A chat that refused its options has exited and closed its input already.
    let _ = child.stdin.take().unwrap().write_all(input.as_bytes());
    let out = child.wait_with_output().unwrap();
    Run {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// How a chat ran.
pub struct Run {
    /// It exited with success.
    pub ok: bool,
    /// Its standard output.
    pub stdout: String,
    /// Its standard error.
    pub stderr: String,
}

impl Run {
    /// How many times `needle` appears on stderr.
    pub fn count(&self, needle: &str) -> usize {
        self.stderr.matches(needle).count()
    }

    /// Numbers following `prefix` on each stderr line that has it.
    pub fn numbers_after(&self, prefix: &str) -> Vec<usize> {
        self.stderr
            .lines()
            .filter_map(|l| l.split_once(prefix))
            .map(|(_, rest)| {
                rest.trim_start()
                    .split(|c: char| !c.is_ascii_digit())
                    .next()
                    .unwrap()
                    .parse()
                    .unwrap()
            })
            .collect()
    }
}

/// The contents of the user's messages.
pub fn users(messages: &[(String, String)]) -> Vec<&str> {
    messages
        .iter()
        .filter(|(role, _)| role == "user")
        .map(|(_, content)| content.as_str())
        .collect()
}
