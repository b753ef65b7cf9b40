//! [`ToolCallStream`]: the calls and content of a reply parsed as its text streams in.

use std::hash::{BuildHasher, Hasher};

use super::parse::{parse, Piece};
use super::{ToolCall, ToolCallEvent, ToolFormat};

/// Parses tool calls out of a reply as it streams: [`push`](Self::push) each text delta, then
/// [`finish`](Self::finish) at the end. Content that may be the start of a call (a marker's
/// first characters, whitespace before one) is held back until the text after it decides.
#[derive(Clone, Debug)]
pub struct ToolCallStream {
    format: ToolFormat,
    buf: String,
    /// Where the next parse starts: everything before is settled.
    resume: usize,
    /// Whether `resume` is just after a call (whitespace there is dropped).
    after_call: bool,
    /// Content is emitted up to here.
    emitted_to: usize,
    /// Calls settled before `resume`.
    calls_done: usize,
    calls: Vec<ToolCall>,
    content: String,
    rng: u64,
    finished: bool,
}

impl ToolCallStream {
    /// A stream for replies in `format`, with random call ids.
    pub fn new(format: ToolFormat) -> ToolCallStream {
        let seed = std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish();
        ToolCallStream::with_seed(format, seed)
    }

    /// A stream whose call ids follow from `seed`: the same seed gives the same ids.
    pub fn with_seed(format: ToolFormat, seed: u64) -> ToolCallStream {
        ToolCallStream {
            format,
            buf: String::new(),
            resume: 0,
            after_call: false,
            emitted_to: 0,
            calls_done: 0,
            calls: Vec::new(),
            content: String::new(),
            rng: seed,
            finished: false,
        }
    }

    /// Feeds the next piece of the reply; returns the events it settles.
    pub fn push(&mut self, delta: &str) -> Vec<ToolCallEvent> {
        if self.finished {
            return Vec::new();
        }
        self.buf.push_str(delta);
        self.step(false)
    }

    /// Ends the reply: flushes held-back content and closes the last call.
    pub fn finish(&mut self) -> Vec<ToolCallEvent> {
        if self.finished {
            return Vec::new();
        }
        let events = self.step(true);
        self.finished = true;
        events
    }

    /// The calls so far (the last one's arguments may be incomplete before
    /// [`finish`](Self::finish)).
    pub fn calls(&self) -> &[ToolCall] {
        &self.calls
    }

    /// The content emitted so far.
    pub fn content(&self) -> &str {
        &self.content
    }

    /// The content and the calls.
    pub fn into_parts(self) -> (String, Vec<ToolCall>) {
        (self.content, self.calls)
    }

    fn next_id(&mut self) -> String {
        call_id(&mut self.rng)
    }

    fn step(&mut self, eof: bool) -> Vec<ToolCallEvent> {
        let pieces = parse(&self.buf, self.resume, self.after_call, eof, self.format);
        let mut events = Vec::new();
        let mut n_calls = 0;
        for (piece, resume) in pieces {
            match piece {
                Piece::Text { range, text } => {
                    if range.end > self.emitted_to {
                        let s = match text {
                            Some(t) => t,
                            None => self.buf[range.start.max(self.emitted_to)..range.end].into(),
                        };
                        self.emitted_to = range.end;
                        if !s.is_empty() {
                            self.content.push_str(&s);
                            events.push(ToolCallEvent::Content(s));
                        }
                    }
                }
                Piece::Call(call) => {
                    let index = self.calls_done + n_calls;
                    n_calls += 1;
                    if index == self.calls.len() {
                        let id = match call.id {
                            Some(id) => id,
                            None => self.next_id(),
                        };
                        events.push(ToolCallEvent::CallStart {
                            index,
                            id: id.clone(),
                            name: call.name.clone(),
                        });
                        self.calls.push(ToolCall {
                            id,
                            name: call.name,
                            arguments: String::new(),
                        });
                    }
                    let have = &mut self.calls[index].arguments;
                    debug_assert!(call.args.starts_with(have.as_str()));
                    if call.args.len() > have.len() && call.args.starts_with(have.as_str()) {
                        let fragment = call.args[have.len()..].to_string();
                        have.push_str(&fragment);
                        events.push(ToolCallEvent::Arguments { index, fragment });
                    }
                }
            }
            if let Some((at, after_call)) = resume {
                self.resume = at;
                self.after_call = after_call;
                self.calls_done += n_calls;
                n_calls = 0;
            }
        }
        events
    }
}

/// A tool call's id: 9 letters and digits drawn from the generator state `rng` (Mistral's
/// templates require 9).
pub(crate) fn call_id(rng: &mut u64) -> String {
    const ALNUM: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    (0..9)
        .map(|_| {
            *rng = rng.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = *rng;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            ALNUM[(z % ALNUM.len() as u64) as usize] as char
        })
        .collect()
}
