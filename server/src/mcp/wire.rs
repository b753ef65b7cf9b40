//! MCP's stdio framing: one JSON-RPC 2.0 message per line (NDJSON). [`LineReader`] cuts a
//! child's output into lines within a length cap; [`parse_message`] says what one line is.
//! Both are pure (no I/O, no state beyond the line being read), so the fuzz target calls them
//! as the reader task does.

use serde_json::{Map, Value};

/// The longest line a child may write (8 MiB); a longer one is dropped whole, up to its
/// newline, so a child that never ends its line holds at most this much of our memory.
pub const MAX_LINE: usize = 8 << 20;

/// One unit out of a [`LineReader`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Frame<'a> {
    /// A line without its `\n` (nor a `\r` before it), never blank.
    Line(&'a [u8]),
    /// A line longer than the cap, reported once, as soon as it passes the cap; its bytes up
    /// to the next newline are dropped.
    Oversized,
}

/// Splits a byte stream, as it arrives in chunks of any size, into [`Frame`]s. The result
/// does not depend on how the stream is chunked. A line counts its `\r` toward the cap but
/// not its `\n`; blank lines (ASCII whitespace only) are skipped; an unterminated last line
/// is never reported (the writer died mid-line).
#[derive(Debug)]
pub struct LineReader {
    max_line: usize,
    buf: Vec<u8>,
    /// Inside a line already reported as [`Frame::Oversized`].
    skipping: bool,
}

impl LineReader {
    /// A reader whose lines hold at most `max_line` bytes.
    pub fn new(max_line: usize) -> LineReader {
        LineReader {
            max_line,
            buf: Vec::new(),
            skipping: false,
        }
    }

    /// Bytes of the current, unterminated line kept so far (at most the cap).
    pub fn pending(&self) -> usize {
        self.buf.len()
    }

    /// Feeds `bytes`; `on_frame` gets every frame they complete, in order.
    pub fn push(&mut self, mut bytes: &[u8], mut on_frame: impl FnMut(Frame<'_>)) {
        while let Some(nl) = bytes.iter().position(|&b| b == b'\n') {
            let (piece, rest) = (&bytes[..nl], &bytes[nl + 1..]);
            bytes = rest;
            if std::mem::take(&mut self.skipping) {
                continue;
            }
            if self.buf.len() + piece.len() > self.max_line {
                self.buf.clear();
                on_frame(Frame::Oversized);
                continue;
            }
            let line = if self.buf.is_empty() {
                piece
            } else {
                self.buf.extend_from_slice(piece);
                &self.buf[..]
            };
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if !line.iter().all(u8::is_ascii_whitespace) {
                on_frame(Frame::Line(line));
            }
            self.buf.clear();
            if self.buf.capacity() > 1 << 20 {
                self.buf.shrink_to(64 << 10);
            }
        }
        if self.skipping {
            return;
        }
        if self.buf.len() + bytes.len() > self.max_line {
            self.buf.clear();
            self.buf.shrink_to(64 << 10);
            self.skipping = true;
            on_frame(Frame::Oversized);
        } else {
            self.buf.extend_from_slice(bytes);
        }
    }
}

/// A JSON-RPC error object, as a response carries it.
#[derive(Clone, Debug, PartialEq)]
pub struct RpcError {
    /// The error's code (0 when the server gave none).
    pub code: i64,
    /// Its message, or a description of what the server sent instead of one.
    pub message: String,
}

/// What one line from an MCP server is.
#[derive(Clone, Debug, PartialEq)]
pub enum Message {
    /// The answer to a request of ours: our ids are integers, so only an integer id can
    /// name one.
    Response {
        /// The request's id.
        id: u64,
        /// Its `result`, or its `error`.
        outcome: Result<Value, RpcError>,
    },
    /// A response whose id cannot be one of ours (a string, a fraction, `null`).
    ForeignResponse,
    /// A request from the server (`ping`, `roots/list`, …): it waits for an answer.
    Request {
        /// Its id, echoed in the answer.
        id: Value,
        /// What it asks for.
        method: String,
    },
    /// A notification (no id): nothing to answer.
    Notification {
        /// Its method.
        method: String,
    },
    /// Not a JSON-RPC message; why.
    Invalid(&'static str),
}

/// Parses one line (as [`LineReader`] cuts them) into a [`Message`]. Never panics; nesting
/// deeper than serde_json's limit is [`Message::Invalid`], as is any text that is not UTF-8.
pub fn parse_message(line: &[u8]) -> Message {
    let value: Value = match serde_json::from_slice(line) {
        Ok(v) => v,
        Err(_) => return Message::Invalid("not JSON"),
    };
    let Value::Object(mut obj) = value else {
        return Message::Invalid("not a JSON object (batches are not used by MCP over stdio)");
    };
    if let Some(method) = obj.get("method") {
        let Some(method) = method.as_str().map(str::to_owned) else {
            return Message::Invalid("a method that is not a string");
        };
        return match obj.remove("id") {
            None | Some(Value::Null) => Message::Notification { method },
            Some(id) => Message::Request { id, method },
        };
    }
    let outcome = match (obj.remove("result"), obj.remove("error")) {
        (Some(result), None) => Ok(result),
        (None, Some(error)) => Err(rpc_error(error)),
        (Some(_), Some(_)) => return Message::Invalid("a response with both result and error"),
        (None, None) => return Message::Invalid("neither a request nor a response"),
    };
    match obj.get("id") {
        None => Message::Invalid("a response without an id"),
        Some(id) => match id.as_u64() {
            Some(id) => Message::Response { id, outcome },
            None => Message::ForeignResponse,
        },
    }
}

/// A response's `error`, whatever shape the server gave it.
fn rpc_error(error: Value) -> RpcError {
    match error {
        Value::Object(mut e) => RpcError {
            code: e.get("code").and_then(Value::as_i64).unwrap_or(0),
            message: match e.remove("message") {
                Some(Value::String(m)) => m,
                _ => "unknown error (no message)".into(),
            },
        },
        Value::String(message) => RpcError { code: 0, message },
        _ => RpcError {
            code: 0,
            message: "unknown error (an error that is not an object)".into(),
        },
    }
}

/// A request of ours, as one line (with its `\n`).
pub fn request_line(id: u64, method: &str, params: Value) -> Vec<u8> {
    let mut obj = Map::new();
    obj.insert("jsonrpc".into(), "2.0".into());
    obj.insert("id".into(), id.into());
    obj.insert("method".into(), method.into());
    obj.insert("params".into(), params);
    line_of(Value::Object(obj))
}

/// A notification of ours, as one line.
pub fn notification_line(method: &str, params: Option<Value>) -> Vec<u8> {
    let mut obj = Map::new();
    obj.insert("jsonrpc".into(), "2.0".into());
    obj.insert("method".into(), method.into());
    if let Some(params) = params {
        obj.insert("params".into(), params);
    }
    line_of(Value::Object(obj))
}

/// Our answer to a server's request: `ping` is answered with an empty result, anything
/// else with "method not found" (we offer no client capabilities).
pub fn answer_line(id: Value, method: &str) -> Vec<u8> {
    let mut obj = Map::new();
    obj.insert("jsonrpc".into(), "2.0".into());
    obj.insert("id".into(), id);
    if method == "ping" {
        obj.insert("result".into(), Value::Object(Map::new()));
    } else {
        obj.insert(
            "error".into(),
            serde_json::json!({"code": -32601, "message": format!("method not found: {method}")}),
        );
    }
    line_of(Value::Object(obj))
}

fn line_of(v: Value) -> Vec<u8> {
    // Serializing a `Value` cannot fail (its keys are strings).
    let mut line = serde_json::to_vec(&v).unwrap_or_default();
    line.push(b'\n');
    line
}
