//! What the server's tests share: a tiny model written by the test, a server started in this
//! process on 127.0.0.1 with port 0, and small HTTP helpers.

#![allow(dead_code)]

use std::path::{Path, PathBuf};

use engine::gguf::{GgmlType, GgufWriter};
use serde_json::Value;
use server::{Args, Server};
use tokio::sync::oneshot;

/// Pseudo-random weights (SplitMix64), the same for every run.
struct Weights(u64);

impl Weights {
    fn next(&mut self) -> f32 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }

    fn bytes(&mut self, n: usize, scale: f32, offset: f32) -> Vec<u8> {
        (0..n)
            .flat_map(|_| (offset + self.next() * scale).to_le_bytes())
            .collect()
    }
}

/// A tiny llama with a byte-level vocabulary (every byte is a token, so any text encodes),
/// ChatML's control tokens (the default template) and `<|im_end|>` as end of generation.
pub fn write_tiny_model(path: &Path) {
    write_tiny_model_with_template(path, None);
}

/// [`write_tiny_model`] with `template` as `tokenizer.chat_template`.
pub fn write_tiny_model_with_template(path: &Path, template: Option<&str>) {
    let (n_embd, n_head, n_head_kv, n_ff, n_layer) = (32usize, 4usize, 2usize, 64usize, 2usize);
    let n_embd_kv = n_embd / n_head * n_head_kv;
    // GPT-2's byte alphabet: printable bytes stand for themselves, the rest from U+0100 on.
    let mut shifted = 0;
    let mut tokens: Vec<String> = (0..=255u32)
        .map(|b| {
            let printable = (33..=126).contains(&b) || (161..=172).contains(&b) || b >= 174;
            if printable {
                char::from_u32(b).unwrap().to_string()
            } else {
                shifted += 1;
                char::from_u32(255 + shifted).unwrap().to_string()
            }
        })
        .collect();
    let mut types = vec![1i32; tokens.len()];
    for special in ["<|im_start|>", "<|im_end|>"] {
        tokens.push(special.to_owned());
        types.push(3);
    }
    let n_vocab = tokens.len();
    let mut g = GgufWriter::new();
    g.add_str("general.architecture", "llama")
        .add_u32("llama.context_length", 4096)
        .add_u32("llama.embedding_length", n_embd as u32)
        .add_u32("llama.block_count", n_layer as u32)
        .add_u32("llama.feed_forward_length", n_ff as u32)
        .add_u32("llama.attention.head_count", n_head as u32)
        .add_u32("llama.attention.head_count_kv", n_head_kv as u32)
        .add_f32("llama.attention.layer_norm_rms_epsilon", 1e-5)
        .add_f32("llama.rope.freq_base", 10000.0)
        .add_str("tokenizer.ggml.model", "gpt2")
        .add_str("tokenizer.ggml.pre", "default")
        .add_str_array("tokenizer.ggml.tokens", &tokens)
        .add_i32_array("tokenizer.ggml.token_type", &types)
        .add_str_array::<&str>("tokenizer.ggml.merges", &[])
        .add_u32("tokenizer.ggml.eos_token_id", n_vocab as u32 - 1);
    let mut w = Weights(11);
    let (e, v, kv, ff) = (n_embd as u64, n_vocab as u64, n_embd_kv as u64, n_ff as u64);
    g.add_tensor(
        "token_embd.weight",
        &[e, v],
        GgmlType::F32,
        w.bytes(n_embd * n_vocab, 1.0, 0.0),
    );
    g.add_tensor(
        "output_norm.weight",
        &[e],
        GgmlType::F32,
        w.bytes(n_embd, 0.5, 1.0),
    );
    g.add_tensor(
        "output.weight",
        &[e, v],
        GgmlType::F32,
        w.bytes(n_embd * n_vocab, 0.3, 0.0),
    );
    for l in 0..n_layer {
        let mut add = |name: &str, dims: &[u64], scale: f32, offset: f32| {
            let n = dims.iter().product::<u64>() as usize;
            g.add_tensor(
                &format!("blk.{l}.{name}"),
                dims,
                GgmlType::F32,
                w.bytes(n, scale, offset),
            );
        };
        add("attn_norm.weight", &[e], 0.5, 1.0);
        add("attn_q.weight", &[e, e], 0.3, 0.0);
        add("attn_k.weight", &[e, kv], 0.3, 0.0);
        add("attn_v.weight", &[e, kv], 0.3, 0.0);
        add("attn_output.weight", &[e, e], 0.3, 0.0);
        add("ffn_norm.weight", &[e], 0.5, 1.0);
        add("ffn_gate.weight", &[e, ff], 0.3, 0.0);
        add("ffn_up.weight", &[e, ff], 0.3, 0.0);
        add("ffn_down.weight", &[ff, e], 0.3, 0.0);
    }
    if let Some(t) = template {
        g.add_str("tokenizer.chat_template", t);
    }
    g.write(path).unwrap();
}

/// A directory holding a tiny model and a cache directory.
pub struct Env {
    pub dir: tempfile::TempDir,
    pub model: PathBuf,
}

impl Env {
    pub fn new() -> Env {
        Env::with_template(None)
    }

    /// A tiny model with `template` as its chat template (ChatML when `None`).
    pub fn with_template(template: Option<&str>) -> Env {
        let dir = tempfile::tempdir().unwrap();
        let model = dir.path().join("tiny.gguf");
        write_tiny_model_with_template(&model, template);
        Env { dir, model }
    }

    pub fn cache(&self) -> PathBuf {
        self.dir.path().join("cache")
    }

    /// Starts a server on the tiny model and this directory's cache, with `extra` options.
    pub async fn start(&self, extra: &[&str]) -> TestServer {
        let model = self.model.display().to_string();
        let cache = self.cache().display().to_string();
        let mut argv = vec![
            "llama-hdd-server",
            "-m",
            &model,
            "--port",
            "0",
            "--cache-dir",
            &cache,
            "-t",
            "1",
            "-c",
            "512",
        ];
        argv.extend_from_slice(extra);
        TestServer::start(&argv).await
    }
}

/// A server running in this process.
pub struct TestServer {
    pub url: String,
    pub client: reqwest::Client,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<server::Result<()>>>,
}

impl TestServer {
    /// Starts a server with the command line `argv` (program name first).
    pub async fn start(argv: &[&str]) -> TestServer {
        let config = Args::parse_from_argv(argv.iter().copied())
            .unwrap()
            .check()
            .unwrap();
        let server = Server::bind(config).await.unwrap();
        let url = format!("http://{}", server.local_addr());
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(server.run_until(async {
            let _ = stopped.await;
        }));
        TestServer {
            url,
            client: reqwest::Client::new(),
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// Stops it as SIGTERM would: requests finish, the cache is flushed.
    pub async fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.task.take() {
            t.await.unwrap().unwrap();
        }
    }

    /// POSTs `body` as JSON; returns the status and the parsed body.
    pub async fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let resp = self
            .client
            .post(format!("{}{path}", self.url))
            .json(body)
            .send()
            .await
            .unwrap();
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    /// GETs `path`; returns the status and the parsed body (or the text).
    pub async fn get(&self, path: &str) -> (u16, Value) {
        let resp = self
            .client
            .get(format!("{}{path}", self.url))
            .send()
            .await
            .unwrap();
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    /// POSTs `body` and reads the server-sent events: the `data:` payloads, in order.
    pub async fn post_stream(&self, path: &str, body: &Value) -> (u16, String, Vec<String>) {
        let mut resp = self
            .client
            .post(format!("{}{path}", self.url))
            .json(body)
            .send()
            .await
            .unwrap();
        let status = resp.status().as_u16();
        let ctype = resp
            .headers()
            .get("content-type")
            .map(|v| v.to_str().unwrap().to_owned())
            .unwrap_or_default();
        let mut raw = Vec::new();
        while let Some(chunk) = resp.chunk().await.unwrap() {
            raw.extend_from_slice(&chunk);
        }
        let text = String::from_utf8(raw).unwrap();
        let events = text
            .split("\n\n")
            .filter_map(|e| e.strip_prefix("data: "))
            .map(str::to_owned)
            .collect();
        (status, ctype, events)
    }
}

/// The OpenAI error object's fields, checked to be there.
pub fn assert_error(body: &Value, code: u16) {
    let e = &body["error"];
    assert!(
        e["message"].as_str().is_some_and(|m| !m.is_empty()),
        "no message in {body}"
    );
    assert!(e["type"].as_str().is_some(), "no type in {body}");
    assert_eq!(e["code"], code, "{body}");
}

/// Bytes of every regular file under `dir`, recursively.
pub fn dir_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => dir_bytes(&e.path()),
            Ok(t) if t.is_file() => e.metadata().map_or(0, |m| m.len()),
            _ => 0,
        })
        .sum()
}
