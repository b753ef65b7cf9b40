//! Where the user's lines come from: a line editor on a terminal, plain lines from a pipe or a
//! file otherwise (so scripts can drive the chat; it ends at end of input).

use std::io::{BufRead, IsTerminal};

use anyhow::Result;
use rustyline::error::ReadlineError;

/// The chat's input.
pub enum Input {
    /// An interactive terminal: line editing and history.
    Terminal(Box<rustyline::DefaultEditor>),
    /// Anything else: one message or command per line.
    Lines(std::io::Lines<std::io::StdinLock<'static>>),
}

impl Input {
    /// A line editor when standard input is a terminal, plain lines otherwise.
    pub fn from_stdin() -> Result<Input> {
        let stdin = std::io::stdin();
        Ok(if stdin.is_terminal() {
            Input::Terminal(Box::new(rustyline::DefaultEditor::new()?))
        } else {
            Input::Lines(stdin.lock().lines())
        })
    }

    /// The next line; `None` at the end of input (Ctrl-D). Ctrl-C at the prompt gives an empty
    /// line.
    pub fn next_line(&mut self) -> Result<Option<String>> {
        match self {
            Input::Terminal(editor) => match editor.readline("> ") {
                Ok(line) => Ok(Some(line)),
                Err(ReadlineError::Interrupted) => Ok(Some(String::new())),
                Err(ReadlineError::Eof) => Ok(None),
                Err(e) => Err(e.into()),
            },
            Input::Lines(lines) => Ok(lines.next().transpose()?),
        }
    }

    /// Adds `line` to the editor's history (nothing for piped input).
    pub fn remember(&mut self, line: &str) {
        if let Input::Terminal(editor) = self {
            let _ = editor.add_history_entry(line);
        }
    }
}
