//! The built-in tools' names and their definitions as `GET /tools` lists them (OpenAI function
//! definitions, which a client hands to the model).

use serde_json::{json, Value};

/// A built-in tool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Builtin {
    /// Reads a file.
    ReadFile,
    /// Finds files by glob.
    FileGlobSearch,
    /// Searches file contents.
    GrepSearch,
    /// Runs a shell command.
    ExecShellCommand,
    /// Writes a file.
    WriteFile,
    /// Replaces text in a file.
    EditFile,
    /// Says what system it runs on.
    GetInfo,
}

/// Every built-in tool, in the order `GET /tools` lists them.
pub const ALL: [Builtin; 7] = [
    Builtin::ReadFile,
    Builtin::FileGlobSearch,
    Builtin::GrepSearch,
    Builtin::ExecShellCommand,
    Builtin::WriteFile,
    Builtin::EditFile,
    Builtin::GetInfo,
];

impl Builtin {
    /// Its name, as `--tools` and requests spell it.
    pub fn name(self) -> &'static str {
        match self {
            Builtin::ReadFile => "read_file",
            Builtin::FileGlobSearch => "file_glob_search",
            Builtin::GrepSearch => "grep_search",
            Builtin::ExecShellCommand => "exec_shell_command",
            Builtin::WriteFile => "write_file",
            Builtin::EditFile => "edit_file",
            Builtin::GetInfo => "get_info",
        }
    }

    /// The tool named `name`.
    pub fn by_name(name: &str) -> Option<Builtin> {
        ALL.into_iter().find(|b| b.name() == name)
    }

    /// Whether it changes anything (files, or anything at all for a shell).
    pub fn writes(self) -> bool {
        matches!(
            self,
            Builtin::ExecShellCommand | Builtin::WriteFile | Builtin::EditFile
        )
    }

    /// Whether it can stream its output (`"stream": true`).
    pub fn streams(self) -> bool {
        self == Builtin::ExecShellCommand
    }

    /// Its `GET /tools` entry.
    pub fn entry(self) -> Value {
        let display = match self {
            Builtin::ReadFile => "Read file",
            Builtin::FileGlobSearch => "File search",
            Builtin::GrepSearch => "Grep search",
            Builtin::ExecShellCommand => "Execute shell command",
            Builtin::WriteFile => "Write file",
            Builtin::EditFile => "Edit file",
            Builtin::GetInfo => "Get Runtime Info",
        };
        let (description, properties, required) = self.schema();
        json!({
            "display_name": display,
            "tool": self.name(),
            "type": "server",
            "permissions": { "write": self.writes() },
            "uses_cwd": true,
            "definition": {
                "type": "function",
                "function": {
                    "name": self.name(),
                    "description": description,
                    "parameters": {
                        "type": "object",
                        "properties": properties,
                        "required": required,
                    },
                },
            },
        })
    }

    fn schema(self) -> (&'static str, Value, Value) {
        let s = |d: &str| json!({ "type": "string", "description": d });
        let i = |d: &str| json!({ "type": "integer", "description": d });
        let b = |d: &str| json!({ "type": "boolean", "description": d });
        match self {
            Builtin::ReadFile => (
                "Returns a text file's contents, or the lines start_line to end_line (counted from 1). \
                 With append_loc, each line starts with its number and an arrow (\"12\u{2192}...\"). \
                 Files over 16 KiB need a line range.",
                json!({
                    "path": s("The file"),
                    "start_line": i("First line, from 1 (default 1)"),
                    "end_line": i("Last line, included (default: the end)"),
                    "append_loc": b("Start each line with its number"),
                }),
                json!(["path"]),
            ),
            Builtin::FileGlobSearch => (
                "Lists the files (type \"dir\" or \"all\": also the directories, shown with a trailing '/') \
                 under a directory whose path matches a glob. A pattern without '/' (\"*.rs\") matches \
                 the name at any depth; one with '/' matches the path from the directory, at any depth \
                 unless it starts with '/' or \"**/\". Files that git ignores are left out inside a \
                 repository, and junk directories (.git, node_modules, target, build, ...) are not entered.",
                json!({
                    "path": s("The directory to search"),
                    "include": s("Glob the entries must match (default **)"),
                    "exclude": s("Glob of entries to leave out"),
                    "type": s("\"file\" (default), \"dir\" or \"all\""),
                    "max_depth": i("Levels to descend: 1 is the directory's own entries (default 0: all)"),
                    "limit": i("Most entries returned, at most 100 (default 100)"),
                }),
                json!(["path"]),
            ),
            Builtin::GrepSearch => (
                "Finds the lines matching a regular expression in a file, or in the files under a \
                 directory (shown by their path from it). include and exclude filter the files as \
                 file_glob_search's globs do; ignored and junk files are skipped the same way.",
                json!({
                    "path": s("A file or a directory"),
                    "pattern": s("The regular expression (a plain string with literal)"),
                    "include": s("Glob of files to search (default **)"),
                    "exclude": s("Glob of files to skip"),
                    "return_line_numbers": b("Show each line's number"),
                    "literal": b("The pattern is plain text (default false)"),
                    "ignore_case": b("Ignore letter case (default false)"),
                    "context_lines": i("Lines shown before and after each match (default 0)"),
                }),
                json!(["path", "pattern"]),
            ),
            Builtin::ExecShellCommand => (
                "Runs a command with sh in the working directory and returns what it printed \
                 (output and errors together) and its exit code.",
                json!({
                    "command": s("The command line"),
                    "timeout": i("Seconds before it is killed (default 10, at most 60)"),
                    "max_output_size": i("Most bytes of output kept (default and largest 16384)"),
                }),
                json!(["command"]),
            ),
            Builtin::WriteFile => (
                "Writes a file whole, creating it and its directories if needed. For changes to part \
                 of a file, edit_file is usually better.",
                json!({ "path": s("The file"), "content": s("Its new contents") }),
                json!(["path", "content"]),
            ),
            Builtin::EditFile => (
                "Replaces text in a file. Each edits[].old_text must occur exactly once in the file as \
                 it is before the call (edits do not see each other's results) and must not overlap \
                 another edit's; join nearby changes into one edit. write_file replaces a whole file.",
                json!({
                    "path": s("The file"),
                    "edits": {
                        "type": "array",
                        "description": "The replacements",
                        "items": {
                            "type": "object",
                            "properties": {
                                "old_text": s("Text found once in the file, overlapping no other edit"),
                                "new_text": s("What replaces it"),
                            },
                            "required": ["old_text", "new_text"],
                        },
                    },
                }),
                json!(["path", "edits"]),
            ),
            Builtin::GetInfo => (
                "Returns the operating system's name and version and the working directory.",
                json!({}),
                json!([]),
            ),
        }
    }
}
