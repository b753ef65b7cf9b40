//! The agent options: built-in tools (`--tools`, `--tools-runtime`), MCP servers
//! (`--mcp-servers-config`, `--mcp-servers-json`) and `-ag`/`--agent`, as llama-server spells
//! them. All are off by default; any of them limits `--cors-origins` to localhost unless it is
//! given.

use std::path::PathBuf;

use clap::ArgAction;

/// The agent options, flattened into [`super::Args`].
#[derive(Clone, Debug, Default, clap::Args)]
pub struct ToolsArgs {
    /// Built-in tools to serve at `/tools` (comma-separated, or `all`): read_file,
    /// file_glob_search, grep_search, exec_shell_command, write_file, edit_file, get_info.
    #[arg(
        long = "tools",
        value_name = "TOOL1,TOOL2,...",
        value_delimiter = ',',
        env = "LLAMA_ARG_TOOLS"
    )]
    pub tools: Vec<String>,
    /// Where the tools run: `docker:IMAGE`, `podman:IMAGE`, `docker-container:ID`,
    /// `podman-container:ID` or `ssh:TARGET` (default: this host).
    #[arg(
        long = "tools-runtime",
        value_name = "OPTION",
        env = "LLAMA_ARG_TOOLS_RUNTIME"
    )]
    pub tools_runtime: Option<String>,
    /// A JSON file of MCP servers (Cursor's `{"mcpServers": {...}}`), whose tools are served
    /// at `/tools` as `SERVER_TOOL`.
    #[arg(
        long = "mcp-servers-config",
        value_name = "PATH",
        env = "LLAMA_ARG_MCP_SERVERS_CONFIG"
    )]
    pub mcp_servers_config: Option<PathBuf>,
    /// The same MCP servers' JSON, inline.
    #[arg(
        long = "mcp-servers-json",
        value_name = "JSON",
        env = "LLAMA_ARG_MCP_SERVERS_JSON"
    )]
    pub mcp_servers_json: Option<String>,
    /// Confines the file tools to DIR (not llama-server's): every path they open, list or
    /// create must lie inside it once symbolic links are resolved, `x-tool-cwd` too, and
    /// `x-tool-runtime` is refused. `exec_shell_command` is not confined by it. Default: none,
    /// where paths are the client's, relative ones from the working directory.
    #[arg(long = "tools-root", value_name = "DIR", env = "LLAMA_ARG_TOOLS_ROOT")]
    pub tools_root: Option<PathBuf>,
    /// Every built-in tool and `/cors-proxy` (`--tools all --ui-mcp-proxy`).
    #[arg(long = "agent", action = ArgAction::SetTrue, overrides_with = "no_agent")]
    pub agent: bool,
    /// Not `--agent` (the default).
    #[arg(long = "no-agent", action = ArgAction::SetTrue, overrides_with = "agent")]
    pub no_agent: bool,
}

impl ToolsArgs {
    /// Whether `-ag`/`--agent` is on (every tool and `/cors-proxy`).
    pub fn agent_on(&self) -> bool {
        self.agent && !self.no_agent
    }

    /// The built-in tools asked for (`all` expanded by the tools module), `--agent` included.
    pub fn builtin(&self) -> Vec<String> {
        if self.agent_on() {
            return vec!["all".into()];
        }
        self.tools
            .iter()
            .map(|t| t.trim().to_owned())
            .filter(|t| !t.is_empty())
            .collect()
    }

    /// Whether any MCP server is configured.
    pub fn has_mcp(&self) -> bool {
        self.mcp_servers_config.is_some() || self.mcp_servers_json.is_some()
    }

    /// Whether `/tools` is served: built-in tools or MCP servers.
    pub fn enabled(&self) -> bool {
        !self.builtin().is_empty() || self.has_mcp()
    }
}
