//! MCP servers as tool sources, as llama-server has them: stdio children from a Cursor-style
//! JSON configuration ([`config`]), each tool served at `/tools` as `SERVER_TOOL`.
//!
//! Each server runs as a child in its own process group ([`child`]), speaking JSON-RPC 2.0 one
//! message per line ([`wire`]). Calls to one server may overlap: answers are matched to
//! requests by id, notifications and lines that are not JSON-RPC are passed over, and every
//! call has the server's time limit (`timeout_ms`). A server that dies is started again at its
//! next call ([`slot`]). A server that crashes, hangs, floods or lies costs its own calls an
//! error at worst: lines are capped at [`MAX_LINE`], and shutting down kills every child's
//! group and fails the calls in flight at once, without waiting for any pipe to close.

mod child;
mod config;
mod slot;
mod wire;

#[cfg(test)]
mod tests;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::Duration;

use serde_json::{json, Map, Value};
use tokio::sync::watch;

pub use child::CallError;
pub use config::{ServerConfig, DEFAULT_TIMEOUT};
pub use wire::{parse_message, Frame, LineReader, Message, RpcError, MAX_LINE};

use crate::args::ToolsArgs;
use crate::error::Result;
use slot::Slot;

/// How long [`McpHub::warmup`] gives each server to start and list its tools (as
/// llama-server: a server that takes longer is left out).
pub const WARMUP_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a server has to answer `initialize` once started, and `tools/list` at warmup,
/// whatever its calls' `timeout_ms`: starting a program (an interpreter, a package runner)
/// may take longer than a call to it.
pub const START_TIMEOUT: Duration = Duration::from_secs(10);
/// The most tools taken from one server.
const MAX_TOOLS: usize = 1024;
/// The most `tools/list` pages read from one server.
const MAX_PAGES: usize = 32;
/// Log lines kept until [`McpHub::set_log`] names where they go.
const EARLY_LOG_LINES: usize = 64;

/// Where the hub's log lines go (the library writes nothing to standard error itself).
type Log = Arc<dyn Fn(String) + Send + Sync>;

/// One tool of one server.
#[derive(Clone, Debug)]
struct Tool {
    slot: usize,
    /// Its name at its server.
    name: String,
    /// `SERVER_TOOL`.
    full_name: String,
    description: String,
    schema: Value,
}

/// Every configured MCP server, shared by the `/tools` routes.
pub struct McpHub {
    slots: Vec<Arc<Slot>>,
    tools: RwLock<Vec<Tool>>,
    stopping: watch::Sender<bool>,
    stopped: Arc<AtomicBool>,
    sink: Arc<LogSink>,
}

impl std::fmt::Debug for McpHub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.slots.iter().map(|s| s.config.name.as_str()).collect();
        f.debug_struct("McpHub").field("servers", &names).finish()
    }
}

impl McpHub {
    /// Reads the configuration the options name (`--mcp-servers-config`,
    /// `--mcp-servers-json`); `Ok(None)` when neither is given. A file that cannot be read,
    /// JSON that does not parse or a value of the wrong type is an error.
    pub fn from_args(args: &ToolsArgs) -> Result<Option<Arc<McpHub>>> {
        if !args.has_mcp() {
            return Ok(None);
        }
        let (servers, warnings) = config::from_args(args)?;
        let hub = McpHub::new(servers);
        for w in warnings {
            hub.sink.say(w);
        }
        Ok(Some(Arc::new(hub)))
    }

    /// A hub for `servers`, none started yet.
    pub fn new(servers: Vec<ServerConfig>) -> McpHub {
        let (stopping, rx) = watch::channel(false);
        let stopped = Arc::new(AtomicBool::new(false));
        let sink = Arc::new(LogSink::default());
        let log: Log = {
            let sink = Arc::clone(&sink);
            Arc::new(move |line| sink.say(line))
        };
        let slots = servers
            .into_iter()
            .map(|c| Arc::new(Slot::new(c, rx.clone(), Arc::clone(&stopped), log.clone())))
            .collect();
        McpHub {
            slots,
            tools: RwLock::new(Vec::new()),
            stopping,
            stopped,
            sink,
        }
    }

    /// Sends the hub's log lines (a server that failed, exited or misbehaved) to `log`,
    /// those written before this call first. Only the first call counts.
    pub fn set_log(&self, log: impl Fn(String) + Send + Sync + 'static) {
        self.sink.set(Box::new(log));
    }

    /// Whether the configuration names no server.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Starts every server and lists its tools, all at once, each within
    /// [`WARMUP_TIMEOUT`]; a server that fails is logged and left out (its tools are not
    /// served). Called once, before the server listens; the children started stay up for
    /// the calls.
    pub async fn warmup(&self) {
        let mut set = tokio::task::JoinSet::new();
        for (i, slot) in self.slots.iter().enumerate() {
            let slot = Arc::clone(slot);
            set.spawn(async move {
                let found = tokio::time::timeout(WARMUP_TIMEOUT, discover(&slot)).await;
                let found = found.unwrap_or_else(|_| {
                    Err(format!("no tools within {} s", WARMUP_TIMEOUT.as_secs()))
                });
                (i, found)
            });
        }
        let mut found = Vec::new();
        while let Some(done) = set.join_next().await {
            if let Ok(done) = done {
                found.push(done);
            }
        }
        found.sort_by_key(|(i, _)| *i);
        let mut tools: Vec<Tool> = Vec::new();
        for (i, result) in found {
            let slot = &self.slots[i];
            let name = &slot.config.name;
            match result {
                Ok(list) => {
                    self.sink
                        .say(format!("MCP server {name:?}: {} tools", list.len()));
                    for (tool, description, schema) in list {
                        let full_name = format!("{name}_{tool}");
                        if tools.iter().any(|t| t.full_name == full_name) {
                            self.sink.say(format!(
                                "MCP tool {full_name:?} of server {name:?} has the name of \
                                 another one and is left out"
                            ));
                            continue;
                        }
                        tools.push(Tool {
                            slot: i,
                            name: tool,
                            full_name,
                            description,
                            schema,
                        });
                    }
                }
                Err(why) => {
                    self.sink
                        .say(format!("MCP server {name:?} is left out: {why}"));
                    slot.stop_child("it was left out at start");
                }
            }
        }
        *self.tools.write().unwrap_or_else(|e| e.into_inner()) = tools;
    }

    /// The tools of every server, each as one `GET /tools` entry (llama-server's shape:
    /// `tool`, `display_name`, `type` "mcp", `permissions`, `uses_cwd`, and the function
    /// `definition` a chat request takes).
    pub async fn list(&self) -> Vec<Value> {
        let tools = self.tools.read().unwrap_or_else(|e| e.into_inner());
        tools.iter().map(entry).collect()
    }

    /// Whether some server has the tool `name` (`SERVER_TOOL`).
    pub fn has_tool(&self, name: &str) -> bool {
        let tools = self.tools.read().unwrap_or_else(|e| e.into_inner());
        tools.iter().any(|t| t.full_name == name)
    }

    /// Calls `name` (`SERVER_TOOL`) with `params`: the `POST /tools` answer's body
    /// (`plain_text_response`, or `error` when the call failed), or `None` when no server
    /// has that tool.
    pub async fn call(&self, name: &str, params: Value) -> Option<Value> {
        let (slot, tool) = {
            let tools = self.tools.read().unwrap_or_else(|e| e.into_inner());
            let t = tools.iter().find(|t| t.full_name == name)?;
            (Arc::clone(&self.slots[t.slot]), t.name.clone())
        };
        let server = &slot.config.name;
        let arguments = match params {
            Value::Null => Value::Object(Map::new()),
            Value::Object(o) => Value::Object(o),
            _ => return Some(json!({"error": "params must be a JSON object"})),
        };
        if self.stopped.load(Ordering::SeqCst) {
            return Some(json!({"error": CallError::ShuttingDown.to_string()}));
        }
        let params = json!({"name": tool, "arguments": arguments});
        let mut reply = Err(CallError::Unsent(String::new()));
        // A child found gone before the call was written to it is replaced once.
        for _ in 0..2 {
            let child = match slot.child().await {
                Ok(c) => c,
                Err(e) => {
                    let e = format!("MCP server {server:?} is unavailable: {e}");
                    return Some(json!({ "error": e }));
                }
            };
            let timeout = slot.config.timeout;
            reply = child.request("tools/call", params.clone(), timeout).await;
            if !matches!(reply, Err(CallError::Unsent(_))) {
                break;
            }
        }
        Some(match reply {
            Ok(result) => answer(result),
            Err(CallError::Rpc(message)) => json!({ "error": message }),
            Err(e @ CallError::ShuttingDown) => json!({"error": e.to_string()}),
            Err(e) => json!({"error": format!("MCP server {server:?}, tool {tool:?}: {e}")}),
        })
    }

    /// Ends every child (its whole process group) and fails the calls in flight at once
    /// (the server is stopping); later calls fail at once too.
    pub async fn shutdown(&self) {
        self.stop_all();
    }

    /// Calls waiting for an answer, over every server.
    #[cfg(test)]
    fn in_flight(&self) -> usize {
        let children = self.slots.iter().filter_map(|s| s.current());
        children.map(|c| c.in_flight()).sum()
    }

    fn stop_all(&self) {
        self.stopped.store(true, Ordering::SeqCst);
        self.stopping.send_replace(true);
        for slot in &self.slots {
            slot.shut_down();
        }
    }
}

impl Drop for McpHub {
    fn drop(&mut self) {
        self.stop_all();
    }
}

/// Starts a server (or takes its running child) and lists its tools, every page.
async fn discover(slot: &Slot) -> Result<Vec<(String, String, Value)>, String> {
    let child = slot.child().await.map_err(|e| e.to_string())?;
    let limit = START_TIMEOUT;
    let mut tools = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..MAX_PAGES {
        let params = match &cursor {
            Some(c) => json!({ "cursor": c }),
            None => json!({}),
        };
        let result = child
            .request("tools/list", params, limit)
            .await
            .map_err(|e| format!("tools/list: {e}"))?;
        let Some(list) = result.get("tools").and_then(Value::as_array) else {
            return Err("its tools/list result has no \"tools\" array".into());
        };
        for t in list {
            let Some(name) = t.get("name").and_then(Value::as_str) else {
                continue;
            };
            if name.is_empty() || tools.len() >= MAX_TOOLS {
                continue;
            }
            let description = t.get("description").and_then(Value::as_str);
            let schema = match t.get("inputSchema") {
                Some(Value::Object(o)) => Value::Object(o.clone()),
                _ => Value::Object(Map::new()),
            };
            tools.push((
                name.to_owned(),
                description.unwrap_or("").to_owned(),
                schema,
            ));
        }
        cursor = result
            .get("nextCursor")
            .and_then(Value::as_str)
            .map(str::to_owned);
        if cursor.is_none() {
            break;
        }
    }
    Ok(tools)
}

/// A tool's `GET /tools` entry.
fn entry(t: &Tool) -> Value {
    json!({
        "display_name": t.full_name,
        "tool": t.full_name,
        "type": "mcp",
        "permissions": {"write": false},
        "uses_cwd": false,
        "definition": {
            "type": "function",
            "function": {
                "name": t.full_name,
                "description": t.description,
                "parameters": t.schema,
            },
        },
    })
}

/// A `tools/call` result as `/tools` answers it: the text of its content, one part a line
/// (parts that are not text are named, not dropped unseen), as `plain_text_response`, or as
/// `error` when the tool says it failed.
fn answer(result: Value) -> Value {
    let mut parts: Vec<String> = Vec::new();
    if let Some(content) = result.get("content").and_then(Value::as_array) {
        for part in content {
            let text = match part.get("type").and_then(Value::as_str) {
                Some("text") => part.get("text").and_then(Value::as_str).map(str::to_owned),
                Some("resource") => part
                    .pointer("/resource/text")
                    .and_then(Value::as_str)
                    .map(str::to_owned),
                _ => None,
            };
            parts.push(text.unwrap_or_else(|| {
                let kind = part
                    .get("type")
                    .and_then(Value::as_str)
                    .unwrap_or("untyped");
                format!("[{kind} content, not shown]")
            }));
        }
    } else if let Some(structured) = result.get("structuredContent") {
        parts.push(structured.to_string());
    }
    let text = parts.join("\n");
    if result.get("isError").and_then(Value::as_bool) == Some(true) {
        if text.is_empty() {
            return json!({"error": "the MCP tool returned an error"});
        }
        return json!({ "error": text });
    }
    json!({ "plain_text_response": text })
}

/// The hub's log: lines go to the sink once it is set, and wait (the last few) until then.
#[derive(Default)]
struct LogSink {
    sink: OnceLock<Box<dyn Fn(String) + Send + Sync>>,
    early: Mutex<Vec<String>>,
}

impl LogSink {
    fn say(&self, line: String) {
        let mut early = self.early.lock().unwrap_or_else(|e| e.into_inner());
        match self.sink.get() {
            Some(sink) => {
                drop(early);
                sink(line);
            }
            None => {
                if early.len() == EARLY_LOG_LINES {
                    early.remove(0);
                }
                early.push(line);
            }
        }
    }

    fn set(&self, sink: Box<dyn Fn(String) + Send + Sync>) {
        if self.sink.set(sink).is_err() {
            return;
        }
        let early = std::mem::take(&mut *self.early.lock().unwrap_or_else(|e| e.into_inner()));
        if let Some(sink) = self.sink.get() {
            for line in early {
                sink(line);
            }
        }
    }
}
