//! Arbitrary bytes as an MCP server's output: the line reader cuts them the same way however
//! they are chunked, and as the plain definition does (split at `\n`, a `\r` before it taken
//! off, blank lines skipped, a line over the cap reported once as oversized, an unterminated
//! last line never reported); it never holds more than the cap; and every line parses into a
//! message without panicking, a response's id and a request's method being the line's own.
//!
//! Input: a byte choosing the line cap (1 to 64 bytes, or the real 8 MiB), a byte choosing
//! the chunk sizes, then the stream.

#![no_main]

use libfuzzer_sys::fuzz_target;
use server::mcp::{parse_message, Frame, LineReader, Message, MAX_LINE};

/// Frames as owned values (`None` for an oversized line).
type Frames = Vec<Option<Vec<u8>>>;

/// The definition the reader must agree with, on the whole stream at once.
fn defined(data: &[u8], cap: usize) -> Frames {
    let mut pieces: Vec<&[u8]> = data.split(|&b| b == b'\n').collect();
    let unterminated = pieces.pop().unwrap_or_default();
    let mut out = Frames::new();
    for p in pieces {
        if p.len() > cap {
            out.push(None);
            continue;
        }
        let line = p.strip_suffix(b"\r").unwrap_or(p);
        if !line.iter().all(u8::is_ascii_whitespace) {
            out.push(Some(line.to_vec()));
        }
    }
    if unterminated.len() > cap {
        out.push(None);
    }
    out
}

fn check_message(line: &[u8]) {
    let message = parse_message(line);
    let value: Option<serde_json::Value> = serde_json::from_slice(line).ok();
    match message {
        Message::Response { id, .. } => {
            let v = value.expect("a response is JSON");
            assert_eq!(v["id"].as_u64(), Some(id));
        }
        Message::Request { method, .. } | Message::Notification { method } => {
            let v = value.expect("a request is JSON");
            assert_eq!(v["method"].as_str(), Some(method.as_str()));
        }
        Message::ForeignResponse => {
            let v = value.expect("a response is JSON");
            assert!(v.get("id").is_some_and(|id| id.as_u64().is_none()));
        }
        Message::Invalid(_) => {}
    }
}

fuzz_target!(|data: &[u8]| {
    let [cap, chunking, stream @ ..] = data else {
        return;
    };
    let cap = match cap {
        255 => MAX_LINE,
        c => usize::from(c % 64) + 1,
    };
    let mut reader = LineReader::new(cap);
    let mut got = Frames::new();
    let mut rest = stream;
    let mut step = usize::from(*chunking);
    while !rest.is_empty() {
        step = step.wrapping_mul(31).wrapping_add(7);
        let n = (step % 23 + 1).min(rest.len());
        let (chunk, tail) = rest.split_at(n);
        rest = tail;
        reader.push(chunk, |f| match f {
            Frame::Line(line) => {
                assert!(line.len() <= cap && !line.contains(&b'\n'));
                check_message(line);
                got.push(Some(line.to_vec()));
            }
            Frame::Oversized => got.push(None),
        });
        assert!(reader.pending() <= cap);
    }
    assert_eq!(got, defined(stream, cap));
    check_message(stream);
});
