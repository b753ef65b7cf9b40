//! Parsing a reply's text into content and call pieces: finding call markers and reading
//! each family's call syntax.

use std::ops::Range;

use serde_json::Value;

use super::object::{
    call_object, scan_object, single_object, skip_value, string_value, Entry, ObjCall, Style,
};
use super::ToolFormat;

/// A settled or growing part of the reply.
#[derive(Debug)]
pub(super) enum Piece {
    /// Content: `text` when it is not the reply's own text (llama-server's `response`).
    Text {
        range: Range<usize>,
        text: Option<String>,
    },
    Call(CallPiece),
}

/// A call as far as the text goes: `args` only grows as the text does.
#[derive(Debug)]
pub(super) struct CallPiece {
    pub(super) name: String,
    pub(super) id: Option<String>,
    pub(super) args: String,
}

/// Where parsing may resume after a piece (and whether that is just after a call); `None` while
/// the piece may still grow.
type Resume = Option<(usize, bool)>;

/// What a call marker turned out to start.
pub(super) enum Attempt {
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

pub(super) fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

pub(super) fn skip_ws(s: &[u8], mut i: usize) -> usize {
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
pub(super) fn parse(
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
                Some(Candidate::Full(m, kind)) => match attempt(buf, pos, m, kind, eof, format) {
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

/// A Llama 3 call written as a bare JSON object at `m`, as llama-server takes one: only the
/// first `{` of the content (from `run`), an object that is whole JSON, followed by nothing but
/// further calls (`;` and whitespace between). What follows it is known only when the reply is
/// complete, so the object is held until then: a reply that writes JSON among its text keeps
/// it as content, streamed or not.
fn llama3_object(buf: &str, run: usize, m: usize, eof: bool) -> Attempt {
    if buf[run..m].contains('{') {
        return Attempt::Invalid;
    }
    if !eof {
        return Attempt::Hold;
    }
    let attempt = single_object(buf, m, true, Style::Llama3);
    let Attempt::Pieces(_, Some(end)) = &attempt else {
        return Attempt::Invalid;
    };
    let whole = serde_json::from_str::<Value>(&buf[m..*end]).is_ok();
    let rest = buf[*end..].trim_start_matches(|c: char| c.is_ascii_whitespace() || c == ';');
    let only_calls = rest.is_empty() || rest.starts_with('{') || rest.starts_with("<|python_tag|>");
    if whole && only_calls {
        attempt
    } else {
        Attempt::Invalid
    }
}

/// Tries the call the marker `kind` at `m` starts (the content before it from `run`, where the
/// text or the last call ended).
fn attempt(buf: &str, run: usize, m: usize, kind: usize, eof: bool, format: ToolFormat) -> Attempt {
    let marker = markers(format)[kind];
    let after = m + marker.len();
    match (format, marker) {
        (ToolFormat::Hermes | ToolFormat::QwenXml, _) => hermes(buf, after, eof),
        (ToolFormat::Llama3, "{") => llama3_object(buf, run, m, eof),
        (ToolFormat::Llama3, _) => python_tag(buf, after, eof),
        (ToolFormat::Mistral | ToolFormat::MistralArgs, _) => mistral(buf, after, eof),
        (ToolFormat::Generic, _) => generic(buf, m, eof),
    }
}

/// An unfinished construct: wait for more text, or (at the end) it is no call.
pub(super) fn undecided(eof: bool) -> Attempt {
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
