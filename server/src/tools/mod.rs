//! Built-in agent tools at `/tools`, as llama-server serves them with `--tools`: `read_file`,
//! `file_glob_search`, `grep_search`, `exec_shell_command`, `write_file`, `edit_file`,
//! `get_info`, then the MCP servers' tools ([`crate::mcp`]). `GET /tools` lists them; `POST
//! /tools` `{"tool", "params", "stream"}` calls one, its failure an `error` in a 200 answer (the
//! model reads it), `exec_shell_command`'s output streamed as `{"chunk"}` events then
//! `{"done": true}`. `x-tool-cwd` is a call's working directory, `x-tool-runtime` (or
//! `--tools-runtime`) sends it to a container or an ssh host ([`runtime`]), and
//! `--tools-root` confines the file tools on this host to one directory ([`scope`]).
//!
//! Commands run in process groups killed on their time limit, when their client goes away and
//! as soon as the server is told to stop ([`Tools::shutdown`]), which also ends the MCP servers.

mod defs;
mod edit;
mod exec;
mod files;
mod glob;
mod http;
mod io;
mod runtime;
mod scope;
mod search;
mod walk;

use std::path::PathBuf;
use std::sync::Arc;

use serde_json::{json, Value};
use tokio::sync::{mpsc, watch};

use crate::args::ToolsArgs;
use crate::error::{Result, ServerError};
use crate::mcp::McpHub;
pub use defs::Builtin;
pub use http::routes;
use io::{Io, Place};
use runtime::{Owned, Runtime, Spec};
use scope::Scope;

/// The tools one server serves: the built-in ones enabled, where they run, and the MCP hub.
#[derive(Debug)]
pub struct Tools {
    builtin: Vec<Builtin>,
    root: Option<PathBuf>,
    runtime: Option<Source>,
    mcp: Option<Arc<McpHub>>,
    stop: watch::Sender<bool>,
}

/// Where `--tools-runtime` sends calls.
#[derive(Debug)]
enum Source {
    Attach(Runtime),
    Owned(Arc<Owned>),
}

/// One `POST /tools` request.
#[derive(Debug, Default)]
pub struct Call {
    /// The tool's name.
    pub tool: String,
    /// Its parameters.
    pub params: Value,
    /// Whether the output is streamed.
    pub stream: bool,
    /// `x-tool-cwd`.
    pub cwd: Option<String>,
    /// `x-tool-runtime`.
    pub runtime: Option<String>,
    /// `x-resp-type`.
    pub resp_type: Option<String>,
}

/// Why a call was not made (answered with an HTTP error, not as the tool's result).
#[derive(Debug)]
pub enum CallError {
    /// Parameters missing or of the wrong type (400).
    BadParams(String),
    /// No such tool, or it does not stream (404).
    NotFound(String),
    /// Refused by the tools root (403).
    Forbidden(String),
    /// The runtime cannot be used (500).
    Runtime(String),
}

impl From<CallError> for ServerError {
    fn from(e: CallError) -> ServerError {
        match e {
            CallError::BadParams(m) => ServerError::BadRequest(m),
            CallError::NotFound(m) => ServerError::NotFound(m),
            CallError::Forbidden(m) => ServerError::Forbidden(m),
            CallError::Runtime(m) => ServerError::ToolRuntime(m),
        }
    }
}

impl From<String> for CallError {
    fn from(m: String) -> CallError {
        CallError::Runtime(m)
    }
}

/// A tool's answer: its JSON (with `error` when it failed), or why it was not called.
pub type Reply = std::result::Result<Value, CallError>;

/// A tool's failure, as the model sees it.
fn failure(message: String) -> Reply {
    Ok(json!({ "error": message }))
}

impl Tools {
    /// The tools the options ask for, checked, the MCP servers started and `--tools-runtime`'s
    /// container running; `None` when `/tools` is off.
    pub async fn start(args: &ToolsArgs) -> Result<Option<Arc<Tools>>> {
        let bad = |option: &'static str, reason: String| ServerError::BadOption { option, reason };
        if !args.enabled() {
            // Options about the tools, with no tool to apply them to, are refused, not dropped.
            let given = [
                ("--tools-runtime", args.tools_runtime.is_some()),
                ("--tools-root", args.tools_root.is_some()),
            ];
            if let Some((option, _)) = given.iter().find(|(_, on)| *on) {
                return Err(bad(
                    option,
                    "no tools are on (--tools or MCP servers)".into(),
                ));
            }
            return Ok(None);
        }
        let mut builtin = Vec::new();
        for name in args.builtin() {
            if name == "all" {
                builtin = defs::ALL.to_vec();
                break;
            }
            match Builtin::by_name(&name) {
                Some(b) if !builtin.contains(&b) => builtin.push(b),
                Some(_) => {}
                None => {
                    let known: Vec<&str> = defs::ALL.iter().map(|b| b.name()).collect();
                    return Err(bad(
                        "--tools",
                        format!(
                            "unknown tool \"{name}\". available tools: {}",
                            known.join(", ")
                        ),
                    ));
                }
            }
        }
        builtin.sort_by_key(|b| defs::ALL.iter().position(|a| a == b));
        let root = match &args.tools_root {
            None => None,
            Some(dir) => {
                let real = std::fs::canonicalize(dir)
                    .map_err(|e| bad("--tools-root", format!("{}: {e}", dir.display())))?;
                if !real.is_dir() {
                    return Err(bad(
                        "--tools-root",
                        format!("{} is not a directory", dir.display()),
                    ));
                }
                Some(real)
            }
        };
        let runtime = match &args.tools_runtime {
            None => None,
            Some(_) if root.is_some() => {
                return Err(bad(
                    "--tools-runtime",
                    "--tools-root confines the tools to this host's directory: not both".into(),
                ))
            }
            Some(spec) => Some(
                match Spec::parse(spec).map_err(|e| bad("--tools-runtime", e))? {
                    Spec::Attach(r) => Source::Attach(r),
                    Spec::Spawn { bin, image } => {
                        let owned = tokio::task::spawn_blocking(move || Owned::start(bin, image))
                            .await
                            .map_err(|e| bad("--tools-runtime", e.to_string()))?
                            .map_err(|e| bad("--tools-runtime", e))?;
                        Source::Owned(Arc::new(owned))
                    }
                },
            ),
        };
        let mcp = McpHub::from_args(args)?;
        if let Some(hub) = &mcp {
            hub.warmup().await;
        }
        let (stop, _) = watch::channel(false);
        Ok(Some(Arc::new(Tools {
            builtin,
            root,
            runtime,
            mcp,
            stop,
        })))
    }

    /// Where the MCP servers' log lines go (those of their warmup included).
    pub fn set_log(&self, log: impl Fn(String) + Send + Sync + 'static) {
        if let Some(hub) = &self.mcp {
            hub.set_log(log);
        }
    }

    /// The start-up line saying what is on and that it is not for untrusted networks.
    pub fn warning(&self) -> String {
        let mut on = Vec::new();
        if !self.builtin.is_empty() {
            on.push("server tools");
        }
        if self.runtime.is_some() {
            on.push("tools runtime");
        }
        if self.mcp.is_some() {
            on.push("MCP servers");
        }
        format!(
            "security: {} enabled - do not expose to untrusted environments{}",
            on.join(", "),
            match &self.root {
                Some(r) => format!(" (file tools confined to {})", r.display()),
                None => String::new(),
            }
        )
    }

    /// Every tool as a `GET /tools` entry: the built-in ones, then the MCP servers' (any
    /// whose name a built-in tool has left out).
    pub async fn list(&self) -> Vec<Value> {
        let mut out: Vec<Value> = self.builtin.iter().map(|b| b.entry()).collect();
        if let Some(hub) = &self.mcp {
            for entry in hub.list().await {
                let name = entry.get("tool").and_then(Value::as_str).unwrap_or("");
                if !self.builtin.iter().any(|b| b.name() == name) {
                    out.push(entry);
                }
            }
        }
        out
    }

    /// Makes `call`; with `sink`, a streaming tool's output goes there as it comes.
    pub async fn call(&self, call: Call, sink: Option<mpsc::Sender<String>>) -> Reply {
        let found = Builtin::by_name(&call.tool).filter(|b| self.builtin.contains(b));
        let Some(tool) = found else {
            return self.call_mcp(call).await;
        };
        let io = self.io(&call).await?;
        let p = Params::new(&call.params);
        match tool {
            Builtin::ReadFile => files::read_file(&io, &p, call.resp_type.as_deref()).await,
            Builtin::FileGlobSearch => search::file_glob_search(&io, &p).await,
            Builtin::GrepSearch => search::grep_search(&io, &p).await,
            Builtin::ExecShellCommand => files::exec_shell_command(&io, &p, sink).await,
            Builtin::WriteFile => files::write_file(&io, &p).await,
            Builtin::EditFile => edit::edit_file(&io, &p).await,
            Builtin::GetInfo => files::get_info(&io).await,
        }
    }

    /// Refuses what cannot be called as asked, before a stream starts.
    pub async fn check(&self, call: &Call) -> std::result::Result<(), CallError> {
        let unsupported = || {
            CallError::NotFound(format!(
                "tool \"{}\" does not support stream = true",
                call.tool
            ))
        };
        if let Some(b) = Builtin::by_name(&call.tool).filter(|b| self.builtin.contains(b)) {
            if call.stream && !b.streams() {
                return Err(unsupported());
            }
            self.io(call).await?;
            return Ok(());
        }
        let listed = self
            .mcp
            .as_ref()
            .is_some_and(|hub| hub.has_tool(&call.tool));
        match listed {
            true if call.stream => Err(unsupported()),
            true => Ok(()),
            false => Err(unknown(&call.tool)),
        }
    }

    async fn call_mcp(&self, call: Call) -> Reply {
        let Some(hub) = &self.mcp else {
            return Err(unknown(&call.tool));
        };
        if call.stream {
            return Err(CallError::NotFound(format!(
                "tool \"{}\" does not support stream = true",
                call.tool
            )));
        }
        hub.call(&call.tool, call.params)
            .await
            .ok_or_else(|| unknown(&call.tool))
    }

    /// Where `call` runs: its header's runtime, `--tools-runtime`'s, or this host.
    async fn io(&self, call: &Call) -> std::result::Result<Io, CallError> {
        let runtime = match (&call.runtime, &self.runtime) {
            (Some(_), _) if self.root.is_some() => {
                return Err(CallError::Forbidden(
                    "x-tool-runtime is refused: the tools are confined by --tools-root".into(),
                ))
            }
            (Some(spec), _) => Some(Spec::attach(spec)?),
            (None, Some(Source::Attach(r))) => Some(r.clone()),
            (None, Some(Source::Owned(o))) => {
                let o = Arc::clone(o);
                Some(io::blocking(move || o.current()).await??)
            }
            (None, None) => None,
        };
        let place = match runtime {
            Some(runtime) => Place::Runtime {
                runtime,
                cwd: call.cwd.clone(),
            },
            None => Place::Host(
                Scope::new(self.root.as_deref(), call.cwd.as_deref())
                    .map_err(CallError::Forbidden)?,
            ),
        };
        Ok(Io {
            place,
            stop: self.stop.subscribe(),
        })
    }

    /// Kills every command running for a tool and ends the MCP servers and the runtime's
    /// container: the server is stopping. Calls in flight answer at once.
    pub async fn shutdown(&self) {
        let _ = self.stop.send(true);
        if let Some(hub) = &self.mcp {
            hub.shutdown().await;
        }
        if let Some(Source::Owned(o)) = &self.runtime {
            let o = Arc::clone(o);
            let _ = tokio::task::spawn_blocking(move || o.stop()).await;
        }
    }
}

fn unknown(name: &str) -> CallError {
    CallError::NotFound(format!("unknown tool \"{name}\""))
}

/// A call's parameters: required ones refused when missing, optional ones at their defaults
/// when missing or of another type.
pub struct Params<'a>(&'a Value);

impl<'a> Params<'a> {
    /// The parameters `v`.
    pub fn new(v: &'a Value) -> Params<'a> {
        Params(v)
    }

    /// A required string.
    pub fn str(&self, key: &str) -> std::result::Result<String, CallError> {
        self.opt_str(key)
            .ok_or_else(|| CallError::BadParams(format!("\"{key}\" must be a string")))
    }

    /// An optional string.
    pub fn opt_str(&self, key: &str) -> Option<String> {
        self.0.get(key).and_then(Value::as_str).map(str::to_owned)
    }

    /// An optional integer.
    pub fn int(&self, key: &str, default: i64) -> i64 {
        self.0.get(key).and_then(Value::as_i64).unwrap_or(default)
    }

    /// An optional boolean.
    pub fn bool(&self, key: &str, default: bool) -> bool {
        self.0.get(key).and_then(Value::as_bool).unwrap_or(default)
    }

    /// A required array.
    pub fn array(&self, key: &str) -> std::result::Result<&'a Vec<Value>, CallError> {
        self.0
            .get(key)
            .and_then(Value::as_array)
            .ok_or_else(|| CallError::BadParams(format!("\"{key}\" must be an array")))
    }
}

#[cfg(test)]
mod start_tests {
    use super::*;

    #[tokio::test]
    async fn tool_options_without_tools_are_refused() {
        let none = ToolsArgs::default();
        assert!(Tools::start(&none).await.unwrap().is_none());
        for (args, option) in [
            (
                ToolsArgs {
                    tools_runtime: Some("ssh:host".into()),
                    ..ToolsArgs::default()
                },
                "--tools-runtime",
            ),
            (
                ToolsArgs {
                    tools_root: Some(std::env::temp_dir()),
                    ..ToolsArgs::default()
                },
                "--tools-root",
            ),
        ] {
            match Tools::start(&args).await {
                Err(ServerError::BadOption { option: o, .. }) => assert_eq!(o, option),
                other => panic!("{option}: {:?}", other.map(|t| t.is_some())),
            }
        }
    }
}
