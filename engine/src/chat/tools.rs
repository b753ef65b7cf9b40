//! Tool calls: a model's reply turned into OpenAI `tool_calls`, whole or as it streams, and
//! grammars that force a reply to be a valid call.
//!
//! Each model family writes its calls its own way ([`ToolFormat`], found from the chat template
//! by [`detect_tool_format`]). [`parse_tool_calls`] splits a finished reply into its content and
//! its calls; [`ToolCallStream`] does the same on text deltas, with events shaped as OpenAI's
//! streamed deltas ([`ToolCallEvent::to_openai_delta`]). A parse of the whole text and the
//! stream agree on every chunking of it: the whole parse is the stream fed once.
//!
//! Text that looks like the start of a call but is not one stays content. Whitespace next to a
//! call is dropped. A call cut off (length limit) keeps the arguments it got, as OpenAI's do.
//! Arguments are the JSON text the model wrote (a string of JSON when the model wrote one).
//!
//! The parser reads the text of the reply: markers that are control tokens (Mistral's
//! `[TOOL_CALLS]`, Llama's `<|python_tag|>`) must be in it, detokenized with their text.
//!
//! [`tool_grammar`] builds a Lark grammar (with `%json` schemas for the arguments) that allows
//! only calls in the family's syntax, for `tool_choice` `required` or a named function. Its
//! markers are plain text: a family whose marker is a control token gets the marker's text
//! spelled with ordinary tokens, which the parser reads just as well.

#![forbid(unsafe_code)]

use std::hash::{BuildHasher, Hasher};
use std::ops::Range;

use serde_json::{json, Value};

use crate::constraint::Grammar;

/// How a model family writes tool calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ToolFormat {
    /// `<tool_call>{"name": .., "arguments": {..}}</tool_call>`, one block per call: Hermes 2/3,
    /// Qwen 2.5/3, SmolLM3 and other ChatML tool templates.
    Hermes,
    /// XML calls inside `<tool_call>`: Qwen3-Coder, Qwen 3.5, Nemotron 3 Nano:
    /// `<tool_call>\n<function=name>\n<parameter=key>\nvalue\n</parameter>\n</function>\n</tool_call>`.
    /// A value that parses as JSON other than a string (`3`, `true`, `[1]`) is taken as that
    /// JSON, anything else as a string. Hermes' JSON calls are parsed too.
    QwenXml,
    /// Llama 3.x: `{"name": .., "parameters": {..}}` (or with `"type": "function"` first), and
    /// `<|python_tag|>` followed by such a call, a builtin tool's `name.call(key="value")`, or
    /// code for the `python` tool. Several calls may follow each other, separated by `;` or
    /// whitespace.
    Llama3,
    /// Mistral Nemo: `[TOOL_CALLS][{"name": .., "arguments": {..}, "id": ".."}, ..]`. The
    /// newer form ([`ToolFormat::MistralArgs`]) is parsed too.
    Mistral,
    /// Newer Mistral (Small 3.2, Devstral, Magistral, Ministral 3):
    /// `[TOOL_CALLS]name[ARGS]{..}` per call, optionally `[CALL_ID]id` before `[ARGS]`. The
    /// Nemo form is parsed too.
    MistralArgs,
    /// llama-server's generic form, for templates with no tool syntax: the whole reply is one
    /// JSON object, `{"tool_call": {"name": .., "arguments": {..}}}`,
    /// `{"tool_calls": [{"name": .., "arguments": {..}}, ..]}` or `{"response": ".."}`.
    Generic,
}

/// The tool-call format of the chat template `template_source`, from the markers it writes:
/// `[TOOL_CALLS]` (Mistral; with `[ARGS]` the newer form), `<tool_call>` (Hermes; with
/// `<function=` and `<parameter=` Qwen's XML calls),
/// `<|python_tag|>` or an `ipython` header (Llama 3.x); [`ToolFormat::Generic`] otherwise.
pub fn detect_tool_format(template_source: &str) -> ToolFormat {
    let has = |s: &str| template_source.contains(s);
    if has("[TOOL_CALLS]") {
        if has("[ARGS]") {
            ToolFormat::MistralArgs
        } else {
            ToolFormat::Mistral
        }
    } else if has("<tool_call>") && has("<function=") && has("<parameter=") {
        ToolFormat::QwenXml
    } else if has("<tool_call>") {
        ToolFormat::Hermes
    } else if has("<|python_tag|>")
        || (has("<|start_header_id|>") && has("ipython") && has("\"parameters\""))
    {
        ToolFormat::Llama3
    } else {
        ToolFormat::Generic
    }
}

/// One tool call, as OpenAI's `tool_calls` entries hold it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolCall {
    /// The call's id: the model's own when it wrote one (Mistral), else 9 random letters and
    /// digits (Mistral's templates require 9).
    pub id: String,
    /// The function's name.
    pub name: String,
    /// The arguments, as JSON text.
    pub arguments: String,
}

impl ToolCall {
    /// The call as an entry of OpenAI's `message.tool_calls`.
    pub fn to_openai(&self) -> Value {
        json!({
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        })
    }
}

/// Splits a model's finished reply in `format` into its content (the text outside the calls)
/// and its tool calls, with random ids. Text that is not a valid call stays content.
pub fn parse_tool_calls(text: &str, format: ToolFormat) -> (String, Vec<ToolCall>) {
    let mut stream = ToolCallStream::new(format);
    stream.push(text);
    stream.finish();
    stream.into_parts()
}

/// What a [`ToolCallStream`] gives for a delta of text, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToolCallEvent {
    /// Content text (never a piece that may still turn out to start a call).
    Content(String),
    /// Call `index` (counting from 0 in the reply) starts: its id and name.
    CallStart {
        /// The call's position among the reply's calls.
        index: usize,
        /// Its id.
        id: String,
        /// The function's name.
        name: String,
    },
    /// More of call `index`'s arguments text.
    Arguments {
        /// The call's position among the reply's calls.
        index: usize,
        /// The next piece of the arguments text.
        fragment: String,
    },
}

impl ToolCallEvent {
    /// The event as an OpenAI chat-completion chunk's `delta`: `{"content": ..}`, or
    /// `{"tool_calls": [{"index", "id", "type": "function", "function": {"name", "arguments":
    /// ""}}]}` when a call starts, then `{"tool_calls": [{"index", "function": {"arguments"}}]}`.
    pub fn to_openai_delta(&self) -> Value {
        match self {
            ToolCallEvent::Content(text) => json!({ "content": text }),
            ToolCallEvent::CallStart { index, id, name } => json!({"tool_calls": [{
                "index": index,
                "id": id,
                "type": "function",
                "function": {"name": name, "arguments": ""},
            }]}),
            ToolCallEvent::Arguments { index, fragment } => json!({"tool_calls": [{
                "index": index,
                "function": {"arguments": fragment},
            }]}),
        }
    }
}

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
        const ALNUM: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
        (0..9)
            .map(|_| {
                self.rng = self.rng.wrapping_add(0x9E37_79B9_7F4A_7C15);
                let mut z = self.rng;
                z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
                z ^= z >> 31;
                ALNUM[(z % ALNUM.len() as u64) as usize] as char
            })
            .collect()
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

// ---- parsing ----

/// A settled or growing part of the reply.
#[derive(Debug)]
enum Piece {
    /// Content: `text` when it is not the reply's own text (llama-server's `response`).
    Text {
        range: Range<usize>,
        text: Option<String>,
    },
    Call(CallPiece),
}

/// A call as far as the text goes: `args` only grows as the text does.
#[derive(Debug)]
struct CallPiece {
    name: String,
    id: Option<String>,
    args: String,
}

/// Where parsing may resume after a piece (and whether that is just after a call); `None` while
/// the piece may still grow.
type Resume = Option<(usize, bool)>;

/// What a call marker turned out to start.
enum Attempt {
    /// Not a call: the marker is content.
    Invalid,
    /// Undecided until more text comes.
    Hold,
    /// Content and calls, and where they end (`None`: the last one may still grow).
    Pieces(Vec<Piece>, Option<usize>),
}

/// A place where a call may start.
enum Candidate {
    /// A whole marker at this offset (its kind: an index into the format's markers).
    Full(usize, usize),
    /// The text from this offset to the end may be the start of a marker.
    Partial(usize),
}

fn markers(format: ToolFormat) -> &'static [&'static str] {
    match format {
        ToolFormat::Hermes | ToolFormat::QwenXml => &["<tool_call>"],
        ToolFormat::Llama3 => &["<|python_tag|>", "{"],
        ToolFormat::Mistral | ToolFormat::MistralArgs => &["[TOOL_CALLS]"],
        ToolFormat::Generic => &["{"],
    }
}

/// The first candidate at or after `from`.
fn find_candidate(buf: &str, from: usize, eof: bool, format: ToolFormat) -> Option<Candidate> {
    if format == ToolFormat::Generic {
        // Only a reply that is one JSON object is a call.
        let start = buf.len() - buf.trim_start().len();
        return (start >= from && buf[start..].starts_with('{'))
            .then_some(Candidate::Full(start, 0));
    }
    let hay = &buf[from..];
    let mut best: Option<(usize, usize)> = None;
    for (kind, m) in markers(format).iter().enumerate() {
        if let Some(i) = hay.find(m) {
            if best.is_none_or(|(b, _)| i < b) {
                best = Some((i, kind));
            }
        }
    }
    let partial = if eof {
        None
    } else {
        // The earliest suffix of the text that is a proper prefix of a marker.
        let longest = markers(format).iter().map(|m| m.len()).max().unwrap_or(0);
        (hay.len().saturating_sub(longest)..hay.len())
            .filter(|&i| hay.is_char_boundary(i))
            .find(|&i| {
                let tail = &hay[i..];
                markers(format)
                    .iter()
                    .any(|m| m.len() > tail.len() && m.starts_with(tail))
            })
    };
    match (best, partial) {
        (Some((i, _)), Some(p)) if p < i => Some(Candidate::Partial(from + p)),
        (Some((i, kind)), _) => Some(Candidate::Full(from + i, kind)),
        (None, Some(p)) => Some(Candidate::Partial(from + p)),
        (None, None) => None,
    }
}

fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

fn skip_ws(s: &[u8], mut i: usize) -> usize {
    while i < s.len() && is_ws(s[i]) {
        i += 1;
    }
    i
}

/// The start of the whitespace that ends `buf[..end]` (not before `floor`).
fn trim_back(buf: &str, floor: usize, end: usize) -> usize {
    let s = buf.as_bytes();
    let mut i = end;
    while i > floor && is_ws(s[i - 1]) {
        i -= 1;
    }
    i
}

/// Parses `buf` from `pos` (just after a call when `after_call`) into pieces, each with where
/// parsing may resume after it. `eof`: the text is complete.
fn parse(
    buf: &str,
    mut pos: usize,
    after_call: bool,
    eof: bool,
    format: ToolFormat,
) -> Vec<(Piece, Resume)> {
    let s = buf.as_bytes();
    let mut out = Vec::new();
    let mut after_call = after_call;
    loop {
        if after_call {
            while pos < s.len()
                && (is_ws(s[pos]) || (format == ToolFormat::Llama3 && s[pos] == b';'))
            {
                pos += 1;
            }
            if pos == s.len() && !eof {
                return out;
            }
        }
        let mut search = pos;
        loop {
            let text = |end: usize| Piece::Text {
                range: pos..end,
                text: None,
            };
            match find_candidate(buf, search, eof, format) {
                None => {
                    let end = if eof {
                        s.len()
                    } else {
                        trim_back(buf, pos, s.len())
                    };
                    out.push((text(end), Some((end, false))));
                    return out;
                }
                Some(Candidate::Partial(m)) => {
                    let end = trim_back(buf, pos, m);
                    out.push((text(end), Some((end, false))));
                    return out;
                }
                Some(Candidate::Full(m, kind)) => match attempt(buf, m, kind, eof, format) {
                    Attempt::Invalid => search = m + 1,
                    Attempt::Hold => {
                        let end = trim_back(buf, pos, m);
                        out.push((text(end), Some((end, false))));
                        return out;
                    }
                    Attempt::Pieces(pieces, end) => {
                        let before = trim_back(buf, pos, m);
                        out.push((text(before), Some((before, false))));
                        let n = pieces.len();
                        for (i, p) in pieces.into_iter().enumerate() {
                            let resume = match end {
                                Some(e) if i + 1 == n => Some((e, true)),
                                _ => None,
                            };
                            out.push((p, resume));
                        }
                        match end {
                            Some(e) => {
                                pos = e;
                                after_call = true;
                                break;
                            }
                            None => return out,
                        }
                    }
                },
            }
        }
    }
}

/// Tries the call the marker `kind` at `m` starts.
fn attempt(buf: &str, m: usize, kind: usize, eof: bool, format: ToolFormat) -> Attempt {
    let marker = markers(format)[kind];
    let after = m + marker.len();
    match (format, marker) {
        (ToolFormat::Hermes | ToolFormat::QwenXml, _) => hermes(buf, after, eof),
        (ToolFormat::Llama3, "{") => single_object(buf, m, eof, Style::Llama3),
        (ToolFormat::Llama3, _) => python_tag(buf, after, eof),
        (ToolFormat::Mistral | ToolFormat::MistralArgs, _) => mistral(buf, after, eof),
        (ToolFormat::Generic, _) => generic(buf, m, eof),
    }
}

/// An unfinished construct: wait for more text, or (at the end) it is no call.
fn undecided(eof: bool) -> Attempt {
    if eof {
        Attempt::Invalid
    } else {
        Attempt::Hold
    }
}

fn hermes(buf: &str, after: usize, eof: bool) -> Attempt {
    const CLOSE: &str = "</tool_call>";
    let s = buf.as_bytes();
    let i = skip_ws(s, after);
    if i == s.len() {
        return undecided(eof);
    }
    let rest = &buf[i..];
    let inner = if rest.starts_with(FUNCTION) {
        xml_call(buf, i + FUNCTION.len(), eof)
    } else if FUNCTION.starts_with(rest) {
        return undecided(eof);
    } else if s[i] == b'{' {
        single_object(buf, i, eof, Style::Hermes)
    } else {
        return Attempt::Invalid;
    };
    match inner {
        Attempt::Pieces(pieces, Some(end)) => {
            let j = skip_ws(s, end);
            let rest = &buf[j..];
            if rest.starts_with(CLOSE) {
                Attempt::Pieces(pieces, Some(j + CLOSE.len()))
            } else if !eof && CLOSE.starts_with(rest) {
                Attempt::Pieces(pieces, None)
            } else {
                Attempt::Pieces(pieces, Some(end))
            }
        }
        other => other,
    }
}

const FUNCTION: &str = "<function=";

/// Qwen's XML call from just after `<function=`: `name>`, then `<parameter=key>\nvalue\n
/// </parameter>` each, then `</function>`. It is a call once its name is read; each parameter
/// joins the arguments when its closing tag comes.
fn xml_call(buf: &str, p: usize, eof: bool) -> Attempt {
    const PARAM: &str = "<parameter=";
    const PARAM_END: &str = "</parameter>";
    const FUNCTION_END: &str = "</function>";
    let s = buf.as_bytes();
    let Some(gt) = buf[p..].find(['>', '\n', '<']).map(|k| p + k) else {
        return undecided(eof);
    };
    let name = buf[p..gt].trim();
    if s[gt] != b'>' || name.is_empty() {
        return Attempt::Invalid;
    }
    // The arguments text: `{`, the parameters so far, `}` once the call is over.
    let mut args = String::from("{");
    let mut q = gt + 1;
    let done = |args: &String, end: Option<usize>| {
        let mut text = args.clone();
        if end.is_some() {
            text.push('}');
        }
        let call = CallPiece {
            name: name.to_string(),
            id: None,
            args: text,
        };
        Attempt::Pieces(vec![Piece::Call(call)], end)
    };
    loop {
        q = skip_ws(s, q);
        let rest = &buf[q..];
        if rest.starts_with(FUNCTION_END) {
            return done(&args, Some(q + FUNCTION_END.len()));
        }
        if rest.starts_with(PARAM) {
            let k = q + PARAM.len();
            let Some(gt) = buf[k..].find('>').map(|g| k + g) else {
                return done(&args, eof.then_some(s.len()));
            };
            let key = buf[k..gt].trim().to_string();
            let v = gt + 1 + usize::from(buf[gt + 1..].starts_with('\n'));
            let Some(close) = buf[v..].find(PARAM_END).map(|c| v + c) else {
                return done(&args, eof.then_some(s.len()));
            };
            let raw = buf[v..close].strip_suffix('\n').unwrap_or(&buf[v..close]);
            if args.len() > 1 {
                args.push_str(", ");
            }
            args.push_str(&format!("{}: {}", Value::String(key), xml_value(raw)));
            q = close + PARAM_END.len();
            continue;
        }
        if !eof && (PARAM.starts_with(rest) || FUNCTION_END.starts_with(rest)) {
            return done(&args, None);
        }
        // Anything else ends the call.
        return done(&args, Some(q));
    }
}

/// A parameter's text as JSON: itself when it is JSON other than a string, else a string.
fn xml_value(raw: &str) -> Value {
    match serde_json::from_str::<Value>(raw.trim()) {
        Ok(v) if !v.is_string() => v,
        _ => Value::String(raw.to_string()),
    }
}

/// Which keys a call object has.
#[derive(Clone, Copy, PartialEq)]
enum Style {
    /// `name`, `arguments` (or `parameters`), in any order.
    Hermes,
    /// `name` first (or after `"type": "function"`), `parameters` (or `arguments`).
    Llama3,
    /// Like Hermes, plus the call's `id`.
    Mistral,
}

/// The call object at `i` as a call that ends where the object does.
fn single_object(buf: &str, i: usize, eof: bool, style: Style) -> Attempt {
    match call_object(buf, i, eof, style) {
        ObjCall::Invalid => Attempt::Invalid,
        ObjCall::Hold => undecided(eof),
        ObjCall::Call(call, end) => {
            let end = end.or(eof.then_some(buf.len()));
            Attempt::Pieces(vec![Piece::Call(call)], end)
        }
    }
}

enum ObjCall {
    Invalid,
    Hold,
    /// The call, and the end of its object (`None` while it goes on).
    Call(CallPiece, Option<usize>),
}

/// A key of a scanned object and its value's span (`end` is `None` while the value goes on).
struct Entry {
    key: String,
    start: usize,
    end: Option<usize>,
}

/// A JSON object scanned as far as the text goes.
struct ObjScan {
    entries: Vec<Entry>,
    /// Just past the closing brace, or where the object stopped being JSON.
    end: Option<usize>,
    /// The object stopped being JSON at `end`.
    broken: bool,
}

/// Scans the object at `i` (`s[i] == b'{'`): its keys and the spans of their values. Values are
/// skipped by their brackets and strings only.
fn scan_object(buf: &str, i: usize) -> ObjScan {
    let s = buf.as_bytes();
    let mut scan = ObjScan {
        entries: Vec::new(),
        end: None,
        broken: false,
    };
    let broken = |mut scan: ObjScan, at: usize| {
        scan.end = Some(at);
        scan.broken = true;
        scan
    };
    let mut p = skip_ws(s, i + 1);
    if p < s.len() && s[p] == b'}' {
        scan.end = Some(p + 1);
        return scan;
    }
    loop {
        if p == s.len() {
            return scan;
        }
        if s[p] != b'"' {
            return broken(scan, p);
        }
        let Some(key_end) = skip_string(s, p) else {
            return scan;
        };
        let Ok(key) = serde_json::from_str::<String>(&buf[p..key_end]) else {
            return broken(scan, p);
        };
        p = skip_ws(s, key_end);
        if p == s.len() {
            return scan;
        }
        if s[p] != b':' {
            return broken(scan, p);
        }
        p = skip_ws(s, p + 1);
        if p == s.len() {
            return scan;
        }
        if matches!(s[p], b'}' | b']' | b',' | b':') {
            return broken(scan, p);
        }
        let end = skip_value(s, p);
        scan.entries.push(Entry { key, start: p, end });
        let Some(end) = end else {
            return scan;
        };
        p = skip_ws(s, end);
        if p == s.len() {
            return scan;
        }
        match s[p] {
            b',' => p = skip_ws(s, p + 1),
            b'}' => {
                scan.end = Some(p + 1);
                return scan;
            }
            _ => return broken(scan, p),
        }
    }
}

/// The end of the JSON string at `i` (`s[i] == b'"'`), if it ends in `s`.
fn skip_string(s: &[u8], i: usize) -> Option<usize> {
    let mut p = i + 1;
    while p < s.len() {
        match s[p] {
            b'\\' => p += 2,
            b'"' => return Some(p + 1),
            _ => p += 1,
        }
    }
    None
}

/// The end of the JSON value at `i`, if it ends in `s`: an object or array by its brackets
/// (strings inside skipped), a string by its quote, anything else by the first delimiter.
fn skip_value(s: &[u8], i: usize) -> Option<usize> {
    match s[i] {
        b'"' => skip_string(s, i),
        b'{' | b'[' => {
            let mut depth = 0usize;
            let mut p = i;
            while p < s.len() {
                match s[p] {
                    b'"' => {
                        p = skip_string(s, p)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(p + 1);
                        }
                    }
                    _ => {}
                }
                p += 1;
            }
            None
        }
        _ => {
            let p = i + s[i..]
                .iter()
                .position(|&b| is_ws(b) || matches!(b, b',' | b'}' | b']' | b':'))?;
            Some(p)
        }
    }
}

/// A complete string value's text.
fn string_value(buf: &str, e: &Entry) -> Option<String> {
    let end = e.end?;
    serde_json::from_str::<String>(&buf[e.start..end]).ok()
}

/// The call the object at `i` holds. It is a call (committed: later text cannot undo it) once
/// its name and the start of its arguments are known, or when it ends with a name.
fn call_object(buf: &str, i: usize, eof: bool, style: Style) -> ObjCall {
    let scan = scan_object(buf, i);
    let s = buf.as_bytes();
    if style == Style::Llama3 {
        // `{"name": ..` or `{"type": "function", "name": ..`.
        match scan.entries.first() {
            None if scan.end.is_some() => return ObjCall::Invalid,
            None => {
                // Before the first key ends: a prefix of `"name"` or `"type"` may still be one.
                let head = &buf[skip_ws(s, i + 1)..];
                let possible = ["\"name\"", "\"type\""]
                    .iter()
                    .any(|k| k.starts_with(head) || head.starts_with(k));
                return if possible && !eof && scan.end.is_none() {
                    ObjCall::Hold
                } else {
                    ObjCall::Invalid
                };
            }
            Some(first) if first.key == "name" => {}
            Some(first) if first.key == "type" => {
                if first.end.is_some() && string_value(buf, first).as_deref() != Some("function") {
                    return ObjCall::Invalid;
                }
                if let Some(second) = scan.entries.get(1) {
                    if second.key != "name" {
                        return ObjCall::Invalid;
                    }
                }
            }
            Some(_) => return ObjCall::Invalid,
        }
    }
    let find = |keys: &[&str]| scan.entries.iter().find(|e| keys.contains(&e.key.as_str()));
    let name = find(&["name"]).and_then(|e| string_value(buf, e));
    let args_keys: &[&str] = match style {
        Style::Llama3 => &["parameters", "arguments"],
        _ => &["arguments", "parameters"],
    };
    let args = find(args_keys);
    let id = if style == Style::Mistral {
        find(&["id"]).and_then(|e| string_value(buf, e))
    } else {
        None
    };
    let Some(name) = name.filter(|n| !n.is_empty()) else {
        return if scan.end.is_some() || eof {
            ObjCall::Invalid
        } else {
            ObjCall::Hold
        };
    };
    let args_text = match args {
        Some(e) if s[e.start] == b'"' => match e.end {
            // Arguments written as a string of JSON: its text once it is whole.
            Some(_) => string_value(buf, e).unwrap_or_default(),
            None => String::new(),
        },
        Some(e) => buf[e.start..e.end.unwrap_or(buf.len())].to_string(),
        None if scan.end.is_some() || eof => "{}".to_string(),
        // Wait for the arguments (or the object's end) before committing to the call.
        None => return ObjCall::Hold,
    };
    // Mistral's id follows the arguments: the call (and its id) is known at the object's end.
    if style == Style::Mistral && scan.end.is_none() && !eof {
        return ObjCall::Hold;
    }
    let call = CallPiece {
        name,
        id,
        args: args_text,
    };
    ObjCall::Call(call, scan.end)
}

fn mistral(buf: &str, after: usize, eof: bool) -> Attempt {
    let s = buf.as_bytes();
    let i = skip_ws(s, after);
    if i == s.len() {
        return undecided(eof);
    }
    if s[i] == b'[' {
        return mistral_array(buf, i, eof);
    }
    // `name[ARGS]{..}` or `name[CALL_ID]id[ARGS]{..}`.
    let name_end = i + s[i..]
        .iter()
        .position(|&b| !(b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.')))
        .unwrap_or(s.len() - i);
    if name_end == s.len() || name_end == i {
        return if name_end == s.len() {
            undecided(eof)
        } else {
            Attempt::Invalid
        };
    }
    let name = buf[i..name_end].to_string();
    const CALL_ID: &str = "[CALL_ID]";
    const ARGS: &str = "[ARGS]";
    // `Some(true)`: `marker` is at `p`; `Some(false)`: the text ends in a prefix of it.
    let at = |p: usize, marker: &str| {
        let rest = &buf[p..];
        if rest.starts_with(marker) {
            Some(true)
        } else if marker.starts_with(rest) {
            Some(false)
        } else {
            None
        }
    };
    let mut p = name_end;
    let mut id = None;
    match (at(p, CALL_ID), at(p, ARGS)) {
        (Some(true), _) => {
            p += CALL_ID.len();
            let id_end = p + s[p..]
                .iter()
                .position(|&b| !b.is_ascii_alphanumeric())
                .unwrap_or(s.len() - p);
            if id_end == s.len() {
                return undecided(eof);
            }
            id = Some(buf[p..id_end].to_string()).filter(|s| !s.is_empty());
            p = id_end;
        }
        (_, Some(true)) => {}
        (Some(false), _) | (_, Some(false)) => return undecided(eof),
        (None, None) => return Attempt::Invalid,
    }
    match at(p, ARGS) {
        Some(true) => {}
        Some(false) => return undecided(eof),
        None => return Attempt::Invalid,
    }
    let start = skip_ws(s, p + ARGS.len());
    if start == s.len() {
        let call = CallPiece {
            name,
            id,
            args: if eof { "{}".into() } else { String::new() },
        };
        return Attempt::Pieces(vec![Piece::Call(call)], eof.then_some(s.len()));
    }
    let end = skip_value(s, start).or(eof.then_some(s.len()));
    let call = CallPiece {
        name,
        id,
        args: buf[start..end.unwrap_or(s.len())].to_string(),
    };
    Attempt::Pieces(vec![Piece::Call(call)], end)
}

/// `[{call}, {call}, ..]`: the calls that are known, ending with the array.
fn mistral_array(buf: &str, i: usize, eof: bool) -> Attempt {
    let s = buf.as_bytes();
    let mut calls = Vec::new();
    let mut p = skip_ws(s, i + 1);
    let stop = |calls: Vec<Piece>, at: Option<usize>| {
        if calls.is_empty() {
            if at.is_some() || eof {
                Attempt::Invalid
            } else {
                Attempt::Hold
            }
        } else {
            Attempt::Pieces(calls, at.or(eof.then_some(s.len())))
        }
    };
    loop {
        if p == s.len() {
            return stop(calls, None);
        }
        if s[p] != b'{' {
            return stop(calls, Some(p));
        }
        match call_object(buf, p, eof, Style::Mistral) {
            ObjCall::Invalid => return stop(calls, Some(p)),
            ObjCall::Hold => return stop(calls, None),
            ObjCall::Call(call, end) => {
                calls.push(Piece::Call(call));
                let Some(end) = end else {
                    return stop(calls, None);
                };
                p = skip_ws(s, end);
                if p == s.len() {
                    return stop(calls, None);
                }
                match s[p] {
                    b',' => p = skip_ws(s, p + 1),
                    b']' => return stop(calls, Some(p + 1)),
                    _ => return stop(calls, Some(end)),
                }
            }
        }
    }
}

/// After `<|python_tag|>`: a JSON call, a builtin tool's `name.call(key=value, ..)`, or code
/// for the `python` tool (the rest of the reply).
fn python_tag(buf: &str, after: usize, eof: bool) -> Attempt {
    let s = buf.as_bytes();
    let i = skip_ws(s, after);
    if i == s.len() {
        return undecided(eof);
    }
    if s[i] == b'{' {
        if let a @ (Attempt::Pieces(..) | Attempt::Hold) = single_object(buf, i, eof, Style::Llama3)
        {
            return a;
        }
    }
    // `ident.call(`
    let ident_end = i + s[i..]
        .iter()
        .position(|&b| !(b.is_ascii_alphanumeric() || b == b'_'))
        .unwrap_or(s.len() - i);
    const CALL: &str = ".call(";
    let rest = &buf[ident_end..];
    if ident_end > i && !s[i].is_ascii_digit() {
        if rest.starts_with(CALL) {
            return builtin_call(buf, &buf[i..ident_end], ident_end + CALL.len(), eof);
        }
        if !eof && CALL.starts_with(rest) {
            return Attempt::Hold;
        }
    }
    // Code for the python tool, to the end of the reply.
    let code = &buf[i..];
    let mut args = String::from("{\"code\": \"");
    args.push_str(&escape_json(code));
    if eof {
        args.push_str("\"}");
    }
    let call = CallPiece {
        name: "python".into(),
        id: None,
        args,
    };
    Attempt::Pieces(vec![Piece::Call(call)], eof.then_some(s.len()))
}

/// `s` escaped as the inside of a JSON string (escaping is per character, so the escapes of
/// two pieces are the escape of both).
fn escape_json(s: &str) -> String {
    let quoted = Value::String(s.into()).to_string();
    quoted[1..quoted.len() - 1].to_string()
}

/// The arguments of `name.call(` from `p` to its closing parenthesis, as a JSON object:
/// `key="string"` (or single quotes), numbers, `True`, `False`, `None`, JSON values.
fn builtin_call(buf: &str, name: &str, p: usize, eof: bool) -> Attempt {
    let s = buf.as_bytes();
    // The closing parenthesis, outside strings.
    let mut q = p;
    let mut close = None;
    while q < s.len() {
        match s[q] {
            quote @ (b'"' | b'\'') => {
                q += 1;
                while q < s.len() && s[q] != quote {
                    q += if s[q] == b'\\' { 2 } else { 1 };
                }
                q += 1;
            }
            b')' => {
                close = Some(q);
                break;
            }
            _ => q += 1,
        }
    }
    let (inner_end, end) = match close {
        Some(c) => (c, Some(c + 1)),
        None if eof => (s.len(), Some(s.len())),
        None => {
            // Committed to the call: its arguments come whole at the parenthesis.
            let call = CallPiece {
                name: name.into(),
                id: None,
                args: String::new(),
            };
            return Attempt::Pieces(vec![Piece::Call(call)], None);
        }
    };
    let args = kwargs_to_json(&buf[p..inner_end.min(buf.len())]);
    let call = CallPiece {
        name: name.into(),
        id: None,
        args,
    };
    Attempt::Pieces(vec![Piece::Call(call)], end)
}

/// `a="x", b=2` as `{"a": "x", "b": 2}` (values that do not parse are kept as strings).
fn kwargs_to_json(text: &str) -> String {
    let mut obj = Vec::new();
    let b = text.as_bytes();
    let mut i = 0;
    while i < b.len() {
        i = skip_ws(b, i);
        let key_end = i + b[i..]
            .iter()
            .position(|&c| c == b'=')
            .unwrap_or(b.len() - i);
        if key_end >= b.len() {
            break;
        }
        let key = text[i..key_end].trim().to_string();
        let mut v = skip_ws(b, key_end + 1);
        let start = v;
        // The value runs to the next comma outside quotes and brackets.
        let mut depth = 0i32;
        while v < b.len() {
            match b[v] {
                quote @ (b'"' | b'\'') => {
                    v += 1;
                    while v < b.len() && b[v] != quote {
                        v += if b[v] == b'\\' { 2 } else { 1 };
                    }
                }
                b'[' | b'{' | b'(' => depth += 1,
                b']' | b'}' | b')' => depth -= 1,
                b',' if depth == 0 => break,
                _ => {}
            }
            v += 1;
        }
        let raw = text[start..v.min(b.len())].trim();
        obj.push(format!("{}: {}", Value::String(key), python_literal(raw)));
        i = v + 1;
    }
    format!("{{{}}}", obj.join(", "))
}

fn python_literal(raw: &str) -> Value {
    match raw {
        "True" => return Value::Bool(true),
        "False" => return Value::Bool(false),
        "None" => return Value::Null,
        _ => {}
    }
    if let Ok(v) = serde_json::from_str::<Value>(raw) {
        return v;
    }
    if raw.len() >= 2 && raw.starts_with('\'') && raw.ends_with('\'') {
        let inner = &raw[1..raw.len() - 1];
        return Value::String(inner.replace("\\'", "'").replace("\\\\", "\\"));
    }
    Value::String(raw.into())
}

/// llama-server's generic form: the reply is one JSON object.
fn generic(buf: &str, m: usize, eof: bool) -> Attempt {
    let s = buf.as_bytes();
    let Some(end) = skip_value(s, m) else {
        return undecided(eof);
    };
    let scan = scan_object(buf, m);
    if scan.broken || scan.end != Some(end) || serde_json::from_str::<Value>(&buf[m..end]).is_err()
    {
        return Attempt::Invalid;
    }
    let [entry] = scan.entries.as_slice() else {
        return Attempt::Invalid;
    };
    let Some(vend) = entry.end else {
        return Attempt::Invalid;
    };
    let whole = |e: &Entry| -> Option<CallPiece> {
        if s[e.start] != b'{' {
            return None;
        }
        match call_object(buf, e.start, true, Style::Mistral) {
            ObjCall::Call(call, Some(_)) => Some(call),
            _ => None,
        }
    };
    let pieces = match entry.key.as_str() {
        "response" => {
            let text = match string_value(buf, entry) {
                Some(t) => t,
                None => buf[entry.start..vend].to_string(),
            };
            vec![Piece::Text {
                range: m..end,
                text: Some(text),
            }]
        }
        "tool_call" => match whole(entry) {
            Some(call) => vec![Piece::Call(call)],
            None => return Attempt::Invalid,
        },
        "tool_calls" => {
            if s[entry.start] != b'[' {
                return Attempt::Invalid;
            }
            let mut calls = Vec::new();
            let mut p = skip_ws(s, entry.start + 1);
            while p < vend && s[p] != b']' {
                let Some(e) = skip_value(s, p) else {
                    return Attempt::Invalid;
                };
                let item = Entry {
                    key: String::new(),
                    start: p,
                    end: Some(e),
                };
                match whole(&item) {
                    Some(call) => calls.push(Piece::Call(call)),
                    None => return Attempt::Invalid,
                }
                p = skip_ws(s, e);
                if p < vend && s[p] == b',' {
                    p = skip_ws(s, p + 1);
                }
            }
            if calls.is_empty() {
                return Attempt::Invalid;
            }
            calls
        }
        _ => return Attempt::Invalid,
    };
    Attempt::Pieces(pieces, Some(end))
}

// ---- grammars ----

/// `s` as a Lark string literal (JSON's syntax).
fn lit(s: &str) -> String {
    Value::String(s.into()).to_string()
}

/// `schema` with short whitespace runs between JSON tokens and lenient handling of keywords
/// llguidance does not know, unless it sets `x-guidance` itself.
fn with_guidance(schema: &Value) -> Value {
    let mut schema = schema.clone();
    if let Some(o) = schema.as_object_mut() {
        o.entry("x-guidance")
            .or_insert_with(|| json!({"whitespace_pattern": ARGS_WHITESPACE, "lenient": true}));
    }
    schema
}

/// `s` with the characters a regex gives meaning to (and Lark's `/`) escaped.
fn regex_escape(s: &str) -> String {
    let mut out = String::new();
    for c in s.chars() {
        if c.is_ascii_punctuation() {
            out.push('\\');
        }
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c => out.push(c),
        }
    }
    out
}

/// The parameters of tool `k` as Qwen's XML writes them, in the schema's order, the required
/// ones mandatory: a string's value is raw text (an enum's one of its values, a length within
/// the schema's bounds) up to `\n</parameter>`, any other value JSON valid against its schema.
fn xml_parameters(k: usize, schema: &Value, rules: &mut Vec<String>) -> String {
    let Some(props) = schema.get("properties").and_then(Value::as_object) else {
        return lit("");
    };
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let mut seq = Vec::new();
    for (i, (key, sub)) in props.iter().enumerate() {
        let head = lit(&format!("<parameter={key}>\n"));
        let strings: Option<Vec<&str>> = sub
            .get("enum")
            .and_then(Value::as_array)
            .and_then(|e| e.iter().map(Value::as_str).collect());
        let is_string = sub.get("type").and_then(Value::as_str) == Some("string");
        let item = if is_string || strings.is_some() {
            // The value and its closing tag in one terminal, which holds `</parameter>` only
            // at its end.
            let value = match strings {
                Some(values) => format!(
                    "({})",
                    values
                        .iter()
                        .map(|v| regex_escape(v))
                        .collect::<Vec<_>>()
                        .join("|")
                ),
                None => {
                    let bound = |key: &str| sub.get(key).and_then(Value::as_u64);
                    match (bound("minLength"), bound("maxLength")) {
                        (None, None) => "(?s:.)*".to_string(),
                        (min, max) => format!(
                            "(?s:.){{{},{}}}",
                            min.unwrap_or(0),
                            max.map(|m| m.to_string()).unwrap_or_default()
                        ),
                    }
                }
            };
            let name = format!("XML_{k}_{i}");
            rules.push(format!(
                "{name}: /{value}\\n<\\/parameter>\\n/ & ~/(?s:.)*<\\/parameter>(?s:.)(?s:.)+/"
            ));
            format!("{head} {name}")
        } else {
            let name = format!("xml_{k}_{i}");
            rules.push(format!("{name}: %json {}", with_guidance(sub)));
            format!("{head} {name} {}", lit("\n</parameter>\n"))
        };
        let optional = if required.contains(&key.as_str()) {
            ""
        } else {
            "?"
        };
        seq.push(format!("({item}){optional}"));
    }
    if seq.is_empty() {
        return lit("");
    }
    seq.join(" ")
}

/// OpenAI's `tool_choice`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToolChoice {
    /// The model may call tools or answer (no grammar: the reply is parsed afterwards).
    Auto,
    /// The model must not call tools.
    None,
    /// The model must call one of the tools.
    Required,
    /// The model must call this function.
    Named(String),
}

impl ToolChoice {
    /// OpenAI's `tool_choice` value: `"auto"`, `"none"`, `"required"` or
    /// `{"type": "function", "function": {"name": ..}}`; `None` for anything else.
    pub fn from_openai(v: &Value) -> Option<ToolChoice> {
        match v {
            Value::String(s) => match s.as_str() {
                "auto" => Some(ToolChoice::Auto),
                "none" => Some(ToolChoice::None),
                "required" => Some(ToolChoice::Required),
                _ => None,
            },
            Value::Object(o) => o
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .map(|n| ToolChoice::Named(n.into())),
            _ => None,
        }
    }
}

/// The whitespace allowed between JSON tokens of the arguments: short runs, so that a model
/// cannot spend its budget on blanks.
const ARGS_WHITESPACE: &str = r"[\x20\x0A\x0D\x09]{1,20}";

/// A grammar that allows only tool calls in `format`'s syntax whose arguments validate
/// against the tool's `parameters` schema: exactly one call, or when `parallel` one or more.
/// `tools` are OpenAI tools (`{"type": "function", "function": {"name", "description",
/// "parameters"}}`). [`ToolChoice::Required`] allows any of the tools,
/// [`ToolChoice::Named`] only that one; [`ToolChoice::Auto`] and [`ToolChoice::None`] give
/// `None` (free text), as do no tools and a name that no tool has.
pub fn tool_grammar(
    tools: &[Value],
    choice: ToolChoice,
    parallel: bool,
    format: ToolFormat,
) -> Option<Grammar> {
    let functions: Vec<(&str, Value)> = tools
        .iter()
        .filter_map(|t| {
            let f = t.get("function").unwrap_or(t);
            let name = f.get("name")?.as_str()?;
            let schema = f
                .get("parameters")
                .filter(|p| p.is_object())
                .cloned()
                .unwrap_or_else(|| json!({"type": "object"}));
            Some((name, schema))
        })
        .filter(|(name, _)| match &choice {
            ToolChoice::Named(n) => n == name,
            _ => true,
        })
        .collect();
    if matches!(choice, ToolChoice::Auto | ToolChoice::None) || functions.is_empty() {
        return None;
    }
    let mut rules = Vec::new();
    let mut alternatives = Vec::new();
    for (k, (name, schema)) in functions.iter().enumerate() {
        rules.push(format!("args_{k}: %json {}", with_guidance(schema)));
        let body = match format {
            ToolFormat::QwenXml => format!(
                "{} {} {}",
                lit(&format!("<tool_call>\n<function={name}>\n")),
                xml_parameters(k, schema, &mut rules),
                lit("</function>\n</tool_call>")
            ),
            ToolFormat::Hermes => format!(
                "{} args_{k} {}",
                lit(&format!(
                    "<tool_call>\n{{\"name\": {}, \"arguments\": ",
                    lit(name)
                )),
                lit("}\n</tool_call>")
            ),
            ToolFormat::Llama3 => format!(
                "{} args_{k} {}",
                lit(&format!("{{\"name\": {}, \"parameters\": ", lit(name))),
                lit("}")
            ),
            ToolFormat::Mistral => format!(
                "{} args_{k} {} CALL_ID {}",
                lit(&format!("{{\"name\": {}, \"arguments\": ", lit(name))),
                lit(", \"id\": "),
                lit("}")
            ),
            ToolFormat::MistralArgs => {
                format!("{} args_{k}", lit(&format!("[TOOL_CALLS]{name}[ARGS]")))
            }
            ToolFormat::Generic => format!(
                "{} args_{k} {}",
                lit(&format!("{{\"name\": {}, \"arguments\": ", lit(name))),
                lit("}")
            ),
        };
        rules.push(format!("call_{k}: {body}"));
        alternatives.push(format!("call_{k}"));
    }
    rules.push(format!("call: {}", alternatives.join(" | ")));
    let start = match (format, parallel) {
        (ToolFormat::Hermes | ToolFormat::QwenXml | ToolFormat::Llama3, false) => "call".into(),
        (ToolFormat::Hermes | ToolFormat::QwenXml | ToolFormat::Llama3, true) => {
            format!("call ({} call)*", lit("\n"))
        }
        (ToolFormat::Mistral, false) => format!("{} call {}", lit("[TOOL_CALLS]["), lit("]")),
        (ToolFormat::Mistral, true) => format!(
            "{} call ({} call)* {}",
            lit("[TOOL_CALLS]["),
            lit(", "),
            lit("]")
        ),
        (ToolFormat::MistralArgs, false) => "call".to_string(),
        (ToolFormat::MistralArgs, true) => "call+".to_string(),
        (ToolFormat::Generic, false) => format!("{} call {}", lit("{\"tool_call\": "), lit("}")),
        (ToolFormat::Generic, true) => format!(
            "{} call ({} call)* {}",
            lit("{\"tool_calls\": ["),
            lit(", "),
            lit("]}")
        ),
    };
    let mut lark = format!("start: {start}\n");
    for r in rules {
        lark.push_str(&r);
        lark.push('\n');
    }
    if format == ToolFormat::Mistral {
        lark.push_str("CALL_ID: /\"[a-zA-Z0-9]{9}\"/\n");
    }
    Some(Grammar::Lark(lark))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str, format: ToolFormat) -> (String, Vec<(String, String)>) {
        let (content, calls) = parse_tool_calls(text, format);
        let calls = calls.into_iter().map(|c| (c.name, c.arguments)).collect();
        (content, calls)
    }

    fn call(name: &str, args: &str) -> (String, String) {
        (name.into(), args.into())
    }

    #[test]
    fn detects_formats_from_templates() {
        assert_eq!(
            detect_tool_format("{{- '<tool_call>\\n' }}"),
            ToolFormat::Hermes
        );
        assert_eq!(
            detect_tool_format("'<tool_call>\\n<function=' + name + '>\\n<parameter=' + k"),
            ToolFormat::QwenXml
        );
        assert_eq!(
            detect_tool_format("{{- \"[TOOL_CALLS][\" }}"),
            ToolFormat::Mistral
        );
        assert_eq!(
            detect_tool_format("'[TOOL_CALLS]' + name + '[ARGS]'"),
            ToolFormat::MistralArgs
        );
        assert_eq!(
            detect_tool_format("{{- \"<|python_tag|>\" + tool_call.name }}"),
            ToolFormat::Llama3
        );
        assert_eq!(
            detect_tool_format(crate::chat::CHATML_TEMPLATE),
            ToolFormat::Generic
        );
    }

    #[test]
    fn hermes_calls_and_content() {
        let text = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";
        let (content, calls) = parse(text, ToolFormat::Hermes);
        assert_eq!(content, "Let me check.");
        assert_eq!(
            calls,
            vec![
                call("get_weather", "{\"location\": \"Paris\"}"),
                call("get_time", "{}")
            ]
        );
        // Arguments as a string of JSON, keys in another order, no closing tag.
        let text = "<tool_call>{\"arguments\": \"{\\\"a\\\": 1}\", \"name\": \"f\"}";
        assert_eq!(
            parse(text, ToolFormat::Hermes).1,
            vec![call("f", "{\"a\": 1}")]
        );
        // No arguments at all.
        let text = "<tool_call>{\"name\": \"f\"}</tool_call>";
        assert_eq!(parse(text, ToolFormat::Hermes).1, vec![call("f", "{}")]);
    }

    #[test]
    fn malformed_calls_stay_content() {
        for text in [
            "<tool_call>not json</tool_call>",
            "<tool_call>{\"nome\": \"f\"}</tool_call>",
            "<tool_call>{\"name\": 3}</tool_call> after",
            "<tool_call>{\"arguments\": {}",
            "<tool_call>",
            "a <tool_ca",
        ] {
            let (content, calls) = parse(text, ToolFormat::Hermes);
            assert!(calls.is_empty(), "{text}: {calls:?}");
            assert_eq!(content, text);
        }
    }

    #[test]
    fn llama3_json_builtin_and_code() {
        let text = "{\"name\": \"get_weather\", \"parameters\": {\"location\": \"Paris\"}}";
        assert_eq!(
            parse(text, ToolFormat::Llama3),
            (
                String::new(),
                vec![call("get_weather", "{\"location\": \"Paris\"}")]
            )
        );
        let text = "{\"type\": \"function\", \"name\": \"f\", \"parameters\": {\"x\": [1, {\"y\": \"}\"}]}}; {\"name\": \"g\", \"parameters\": {}}";
        assert_eq!(
            parse(text, ToolFormat::Llama3).1,
            vec![call("f", "{\"x\": [1, {\"y\": \"}\"}]}"), call("g", "{}")]
        );
        let text = "<|python_tag|>brave_search.call(query=\"today's weather\", count=3)";
        assert_eq!(
            parse(text, ToolFormat::Llama3).1,
            vec![call(
                "brave_search",
                "{\"query\": \"today's weather\", \"count\": 3}"
            )]
        );
        let text = "<|python_tag|>print(\"hi\")\nx = 1";
        assert_eq!(
            parse(text, ToolFormat::Llama3).1,
            vec![call("python", "{\"code\": \"print(\\\"hi\\\")\\nx = 1\"}")]
        );
        // JSON that is not a call is content.
        let text = "Here: {\"a\": 1} and {\"type\": \"x\", \"name\": \"f\", \"parameters\": {}}";
        assert_eq!(parse(text, ToolFormat::Llama3), (text.to_string(), vec![]));
    }

    #[test]
    fn mistral_both_forms_and_ids() {
        let text = "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {\"a\": 1}, \"id\": \"abcDEF123\"}, {\"name\": \"g\", \"arguments\": {}}]";
        let (content, calls) = parse_tool_calls(text, ToolFormat::Mistral);
        assert_eq!(content, "");
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0].id, "abcDEF123");
        assert_eq!(
            (calls[0].name.as_str(), calls[0].arguments.as_str()),
            ("f", "{\"a\": 1}")
        );
        assert_eq!(calls[1].id.len(), 9);
        assert!(calls[1].id.bytes().all(|b| b.is_ascii_alphanumeric()));
        let text = "Sure.[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}[TOOL_CALLS]get_time[CALL_ID]x1[ARGS]{}";
        let (content, calls) = parse_tool_calls(text, ToolFormat::MistralArgs);
        assert_eq!(content, "Sure.");
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0].arguments, "{\"city\": \"Paris\"}");
        assert_eq!(
            (calls[1].name.as_str(), calls[1].id.as_str()),
            ("get_time", "x1")
        );
        assert_eq!(parse("[TOOL_CALLS] oops", ToolFormat::Mistral).1, vec![]);
    }

    #[test]
    fn generic_forms() {
        let text = "{\"tool_call\": {\"name\": \"f\", \"arguments\": {\"a\": 1}}}";
        assert_eq!(
            parse(text, ToolFormat::Generic),
            (String::new(), vec![call("f", "{\"a\": 1}")])
        );
        let text = " {\"tool_calls\": [{\"name\": \"f\", \"arguments\": {}}, {\"name\": \"g\", \"arguments\": \"{}\"}]}";
        assert_eq!(
            parse(text, ToolFormat::Generic).1,
            vec![call("f", "{}"), call("g", "{}")]
        );
        let text = "{\"response\": \"Hello \\\"you\\\"\"}";
        assert_eq!(
            parse(text, ToolFormat::Generic),
            ("Hello \"you\"".into(), vec![])
        );
        for text in [
            "{\"other\": 1}",
            "plain {\"tool_call\": {\"name\": \"f\"}}",
            "{\"tool_call\":",
        ] {
            assert_eq!(parse(text, ToolFormat::Generic), (text.to_string(), vec![]));
        }
    }

    #[test]
    fn ids_are_unique_and_follow_the_seed() {
        let text = "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>".repeat(50);
        let ids = |seed| {
            let mut s = ToolCallStream::with_seed(ToolFormat::Hermes, seed);
            s.push(&text);
            s.finish();
            s.into_parts()
                .1
                .into_iter()
                .map(|c| c.id)
                .collect::<Vec<_>>()
        };
        let a = ids(1);
        assert_eq!(a.len(), 50);
        assert_eq!(a, ids(1));
        assert_ne!(a, ids(2));
        let unique: std::collections::HashSet<_> = a.iter().collect();
        assert_eq!(unique.len(), 50);
        assert!(a
            .iter()
            .all(|id| id.len() == 9 && id.bytes().all(|b| b.is_ascii_alphanumeric())));
    }

    #[test]
    fn streaming_holds_back_marker_prefixes() {
        let mut s = ToolCallStream::with_seed(ToolFormat::Hermes, 0);
        assert_eq!(
            s.push("Hi <tool"),
            vec![ToolCallEvent::Content("Hi".into())]
        );
        assert_eq!(s.push("_call>{\"name\": \"f\", "), vec![]);
        let ev = s.push("\"arguments\": {\"a\"");
        assert!(matches!(&ev[0], ToolCallEvent::CallStart { index: 0, name, .. } if name == "f"));
        assert_eq!(
            ev[1],
            ToolCallEvent::Arguments {
                index: 0,
                fragment: "{\"a\"".into()
            }
        );
        let ev = s.push(": 2}}</tool_call> done");
        assert_eq!(
            ev,
            vec![
                ToolCallEvent::Arguments {
                    index: 0,
                    fragment: ": 2}".into()
                },
                ToolCallEvent::Content("done".into())
            ]
        );
        assert_eq!(s.finish(), vec![]);
        let delta = ToolCallEvent::Arguments {
            index: 0,
            fragment: "x".into(),
        }
        .to_openai_delta();
        assert_eq!(delta["tool_calls"][0]["function"]["arguments"], "x");
    }

    #[test]
    fn grammars_only_for_required_and_named() {
        let tools = vec![
            json!({"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}),
        ];
        assert!(tool_grammar(&tools, ToolChoice::Auto, false, ToolFormat::Hermes).is_none());
        assert!(tool_grammar(&tools, ToolChoice::None, false, ToolFormat::Hermes).is_none());
        assert!(tool_grammar(
            &tools,
            ToolChoice::Named("g".into()),
            false,
            ToolFormat::Hermes
        )
        .is_none());
        assert!(tool_grammar(&[], ToolChoice::Required, false, ToolFormat::Hermes).is_none());
        let Some(Grammar::Lark(g)) =
            tool_grammar(&tools, ToolChoice::Required, true, ToolFormat::Hermes)
        else {
            panic!()
        };
        assert!(g.contains("%json"), "{g}");
        assert_eq!(
            ToolChoice::from_openai(&json!({"type": "function", "function": {"name": "f"}})),
            Some(ToolChoice::Named("f".into()))
        );
    }
}
