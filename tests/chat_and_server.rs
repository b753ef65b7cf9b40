//! A chat and a server on one store: names are owned. A `/slots` save never replaces the
//! conversation a running chat holds open, nor, unless asked, a checkpoint it did not write; and
//! the chat does not take over (and later overwrite) a checkpoint that a slot save wrote.
//!
//! Needs the chat example built beside the tests (`cargo test` builds it).

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use engine::store::{SessionStore, StoreConfig, OWNER_CHAT, OWNER_SLOT};
use engine::Model;
use serde_json::{json, Value};

#[path = "support/chat_model.rs"]
mod chat_model;

fn chat_bin() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let bin = exe
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("examples")
        .join(format!("chat{}", std::env::consts::EXE_SUFFIX));
    assert!(
        bin.is_file(),
        "{} is missing: cargo build --example chat",
        bin.display()
    );
    bin
}

fn chat(model: &Path, store: &Path, session: &str) -> Command {
    let mut cmd = Command::new(chat_bin());
    cmd.arg("--model")
        .arg(model)
        .arg("--store")
        .arg(store)
        .args(["--session", session, "--threads", "1", "--temp", "0"])
        .args(["--max-tokens", "6", "--ctx", "512", "--cache-ram", "8MiB"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// Reads `child`'s standard error up to a line containing `what`.
fn wait_for(stderr: &mut impl BufRead, what: &str) {
    let mut line = String::new();
    while !line.contains(what) {
        line.clear();
        assert!(
            stderr.read_line(&mut line).unwrap() > 0,
            "the chat ended before saying {what:?}"
        );
    }
}

/// Tokens and owner of checkpoint `name`, read through the library.
fn checkpoint(model: &Path, store: &Path, name: &str) -> (usize, Option<String>) {
    let model = Model::load(model).unwrap();
    let store = SessionStore::open(store, &model, StoreConfig::default()).unwrap();
    let (tokens, meta) = store.read_checkpoint(name).unwrap();
    (tokens.len(), meta.owner)
}

async fn post(client: &reqwest::Client, url: &str, body: Value) -> (u16, Value) {
    let resp = client.post(url).json(&body).send().await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_save_never_overwrites_a_chat_and_the_chat_never_overwrites_a_slot_save() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tiny.gguf");
    let store = dir.path().join("store");
    chat_model::write_model(&model, None);

    // A chat that has saved one turn and stays open (its input is not closed yet).
    let mut live: Child = chat(&model, &store, "live").spawn().unwrap();
    let mut live_in = live.stdin.take().unwrap();
    let mut live_err = BufReader::new(live.stderr.take().unwrap());
    live_in
        .write_all(b"a first message that the chat keeps\n")
        .unwrap();
    wait_for(&mut live_err, "(saved `live`");
    let (chat_tokens, owner) = checkpoint(&model, &store, "live");
    assert_eq!(owner.as_deref(), Some(OWNER_CHAT));

    // A server on the same store with a short conversation in slot 0.
    let argv = [
        "llama-hdd-server",
        "-m",
        model.to_str().unwrap(),
        "--port",
        "0",
        "--cache-dir",
        store.to_str().unwrap(),
        "-t",
        "1",
        "-c",
        "512",
        "-np",
        "1",
    ];
    let config = server::Args::parse_from_argv(argv)
        .unwrap()
        .check()
        .unwrap();
    let srv = server::Server::bind(config).await.unwrap();
    let url = format!("http://{}", srv.local_addr());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(srv.run_until(async {
        let _ = stopped.await;
    }));
    let client = reqwest::Client::new();
    let (status, done) = post(
        &client,
        &format!("{url}/completion"),
        json!({"prompt": "short", "n_predict": 2, "temperature": 0, "id_slot": 0}),
    )
    .await;
    assert_eq!(status, 200, "{done}");
    let save = format!("{url}/slots/0?action=save");

    // Refused while the chat holds the name, even when asked to overwrite.
    for body in [
        json!({"filename": "live"}),
        json!({"filename": "live", "overwrite": true}),
    ] {
        let (status, err) = post(&client, &save, body).await;
        assert_eq!(status, 409, "{err}");
        let message = err["error"]["message"].as_str().unwrap();
        assert!(message.contains(&live.id().to_string()), "{message}");
    }
    assert_eq!(
        checkpoint(&model, &store, "live"),
        (chat_tokens, Some(OWNER_CHAT.to_owned()))
    );

    // The chat goes on, and its next autosave is its own conversation, longer.
    live_in.write_all(b"and a second one\n").unwrap();
    wait_for(&mut live_err, "(saved `live`");
    drop(live_in);
    assert!(live.wait().unwrap().success());
    let (longer, _) = checkpoint(&model, &store, "live");
    assert!(longer > chat_tokens, "{longer} <= {chat_tokens}");

    // The chat has ended: its checkpoint is still not replaced unless asked.
    let (status, err) = post(&client, &save, json!({"filename": "live"})).await;
    assert_eq!(status, 409, "{err}");
    assert!(err["error"]["message"]
        .as_str()
        .unwrap()
        .contains("overwrite"));
    assert_eq!(checkpoint(&model, &store, "live").0, longer);
    let (status, saved) = post(
        &client,
        &save,
        json!({"filename": "live", "overwrite": true}),
    )
    .await;
    assert_eq!(status, 200, "{saved}");
    let n_saved = saved["n_saved"].as_u64().unwrap() as usize;
    assert_eq!(
        checkpoint(&model, &store, "live"),
        (n_saved, Some(OWNER_SLOT.to_owned()))
    );

    // A slot save replaces its own checkpoints, as llama-server's does.
    let (status, again) = post(&client, &save, json!({"filename": "live"})).await;
    assert_eq!(status, 200, "{again}");

    // A chat asked to resume a slot's checkpoint leaves it alone and goes on under a new name.
    let out = chat(&model, &store, "live")
        .spawn()
        .unwrap()
        .wait_with_output_after(b"hello\n");
    assert!(out.contains("left to it"), "{out}");
    assert!(out.contains("live-2"), "{out}");
    assert_eq!(
        checkpoint(&model, &store, "live"),
        (n_saved, Some(OWNER_SLOT.to_owned()))
    );
    assert_eq!(
        checkpoint(&model, &store, "live-2").1.as_deref(),
        Some(OWNER_CHAT)
    );

    let _ = stop.send(());
    task.await.unwrap().unwrap();
}

/// Writing `input` to a child's standard input, then its standard error once it has ended.
trait FeedAndWait {
    fn wait_with_output_after(self, input: &[u8]) -> String;
}

impl FeedAndWait for Child {
    fn wait_with_output_after(mut self, input: &[u8]) -> String {
        self.stdin.take().unwrap().write_all(input).unwrap();
        let out = self.wait_with_output().unwrap();
        assert!(out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    }
}
