//! MCP servers as tool sources: stdio children from a Cursor-style JSON configuration, whose
//! tools are served at `/tools` as `SERVER_TOOL`.
//!
//! (Interface first; the children are not started yet.)

use std::sync::Arc;

use serde_json::Value;

use crate::args::ToolsArgs;
use crate::error::Result;

/// Every configured MCP server, shared by the `/tools` routes.
#[derive(Debug)]
pub struct McpHub {}

impl McpHub {
    /// Reads the configuration the options name (`--mcp-servers-config`,
    /// `--mcp-servers-json`); `Ok(None)` when none is configured.
    pub fn from_args(args: &ToolsArgs) -> Result<Option<Arc<McpHub>>> {
        if !args.has_mcp() {
            return Ok(None);
        }
        Ok(Some(Arc::new(McpHub {})))
    }

    /// Starts every server and lists its tools; a server that fails is logged and left out.
    /// Called once, before the server listens.
    pub async fn warmup(&self) {}

    /// The tools of every server, each as one `GET /tools` entry.
    pub async fn list(&self) -> Vec<Value> {
        Vec::new()
    }

    /// Calls `name` (`SERVER_TOOL`) with `params`: the `POST /tools` answer's body (with
    /// `error` when the call failed), or `None` when no configured server has that tool.
    pub async fn call(&self, name: &str, params: Value) -> Option<Value> {
        let _ = (name, params);
        None
    }

    /// Ends every child and fails the calls in flight at once (the server is stopping).
    pub async fn shutdown(&self) {}
}
