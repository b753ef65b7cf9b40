//! The MCP servers' configuration: Cursor's `{"mcpServers": {"NAME": {"command", "args",
//! "env", "cwd", "timeout_ms"}}}`, from `--mcp-servers-config` (a file) and
//! `--mcp-servers-json` (inline), as llama-server reads them. JSON that does not parse and
//! values of the wrong type are errors at start; entries without a command are left out with
//! a warning, as are names given twice.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Map, Value};

use crate::args::ToolsArgs;
use crate::error::{Result, ServerError};

/// A call's time limit when the entry names none (llama-server's 30 s).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// The longest `timeout_ms` taken as given (a day); longer ones are cut to it.
const MAX_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

/// One MCP server: a program started with pipes on its standard input and output.
#[derive(Clone, Debug, PartialEq)]
pub struct ServerConfig {
    /// Its key in `mcpServers`, the prefix of its tools' names.
    pub name: String,
    /// The program (looked up on `PATH` when it has no `/`).
    pub command: String,
    /// Its arguments.
    pub args: Vec<String>,
    /// Variables set over the server's own environment.
    pub env: Vec<(String, String)>,
    /// Its working directory (the server's own when `None`).
    pub cwd: Option<PathBuf>,
    /// How long a request may wait for its answer.
    pub timeout: Duration,
}

/// Every server the options configure, in order (the file's first), and the warnings met.
pub fn from_args(args: &ToolsArgs) -> Result<(Vec<ServerConfig>, Vec<String>)> {
    let mut servers: Vec<ServerConfig> = Vec::new();
    let mut warnings = Vec::new();
    let mut sources = Vec::new();
    if let Some(path) = &args.mcp_servers_config {
        let text = std::fs::read_to_string(path).map_err(|source| ServerError::Io {
            what: format!(
                "reading the MCP servers' configuration (--mcp-servers-config {})",
                path.display()
            ),
            source,
        })?;
        sources.push(("--mcp-servers-config", text));
    }
    if let Some(json) = &args.mcp_servers_json {
        sources.push(("--mcp-servers-json", json.clone()));
    }
    for (option, text) in sources {
        let parsed = parse(&text, &mut warnings)
            .map_err(|reason| ServerError::BadOption { option, reason })?;
        if parsed.is_empty() {
            warnings.push(format!("MCP: {option} configures no server"));
        }
        for s in parsed {
            if servers.iter().any(|t| t.name == s.name) {
                warnings.push(format!(
                    "MCP: server {:?} is configured twice; the first one is kept",
                    s.name
                ));
                continue;
            }
            servers.push(s);
        }
    }
    Ok((servers, warnings))
}

/// The servers of one JSON text; the reason when it is not a valid configuration.
pub fn parse(text: &str, warnings: &mut Vec<String>) -> Result<Vec<ServerConfig>, String> {
    let root: Value = serde_json::from_str(text).map_err(|e| format!("not valid JSON: {e}"))?;
    let Some(entries) = root.get("mcpServers") else {
        warnings.push("MCP: the configuration has no \"mcpServers\" object".into());
        return Ok(Vec::new());
    };
    let Value::Object(entries) = entries else {
        return Err("\"mcpServers\" must be an object of servers by name".into());
    };
    let mut out = Vec::new();
    for (name, entry) in entries {
        let Value::Object(entry) = entry else {
            return Err(format!("MCP server {name:?} must be an object"));
        };
        if let Some(s) = server(name, entry, warnings)? {
            out.push(s);
        }
    }
    Ok(out)
}

/// One entry; `None` when it has no command (with a warning).
fn server(
    name: &str,
    entry: &Map<String, Value>,
    warnings: &mut Vec<String>,
) -> Result<Option<ServerConfig>, String> {
    const KNOWN: [&str; 6] = ["command", "args", "env", "cwd", "timeout_ms", "type"];
    for key in entry.keys().filter(|k| !KNOWN.contains(&k.as_str())) {
        warnings.push(format!(
            "MCP server {name:?}: {key:?} is not read (only stdio servers are supported)"
        ));
    }
    let command = match entry.get("command") {
        None => None,
        Some(Value::String(c)) if c.is_empty() => None,
        Some(Value::String(c)) => Some(c.clone()),
        Some(_) => return Err(format!("MCP server {name:?}: \"command\" must be a string")),
    };
    let Some(command) = command else {
        warnings.push(format!(
            "MCP server {name:?} has no command and is left out (only stdio servers are supported)"
        ));
        return Ok(None);
    };
    if let Some(kind) = entry.get("type") {
        if kind.as_str() != Some("stdio") {
            return Err(format!(
                "MCP server {name:?}: \"type\" {kind} is not supported (only \"stdio\")"
            ));
        }
    }
    let args = match entry.get("args") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| v.as_str().map(str::to_owned))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| format!("MCP server {name:?}: \"args\" must be strings"))?,
        Some(_) => return Err(format!("MCP server {name:?}: \"args\" must be an array")),
    };
    let env = match entry.get("env") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Object(e)) => e
            .iter()
            .map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_owned())))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| format!("MCP server {name:?}: \"env\" values must be strings"))?,
        Some(_) => return Err(format!("MCP server {name:?}: \"env\" must be an object")),
    };
    if env
        .iter()
        .any(|(k, _)| k.is_empty() || k.contains(['=', '\0']))
    {
        return Err(format!(
            "MCP server {name:?}: an \"env\" name is empty or holds '=' or NUL"
        ));
    }
    let cwd = match entry.get("cwd") {
        None | Some(Value::Null) => None,
        Some(Value::String(c)) if c.is_empty() => None,
        Some(Value::String(c)) => Some(PathBuf::from(c)),
        Some(_) => return Err(format!("MCP server {name:?}: \"cwd\" must be a string")),
    };
    let timeout = match entry.get("timeout_ms") {
        None | Some(Value::Null) => DEFAULT_TIMEOUT,
        Some(v) => match v.as_u64() {
            Some(ms) if ms > 0 => Duration::from_millis(ms).min(MAX_TIMEOUT),
            _ => {
                return Err(format!(
                    "MCP server {name:?}: \"timeout_ms\" must be a positive integer, not {v}"
                ))
            }
        },
    };
    Ok(Some(ServerConfig {
        name: name.to_owned(),
        command,
        args,
        env,
        cwd,
        timeout,
    }))
}
