//! Call objects: JSON objects scanned as far as the text goes, and the calls they hold.

use super::parse::{is_ws, skip_ws, undecided, Attempt, CallPiece, Piece};

/// Which keys a call object has.
#[derive(Clone, Copy, PartialEq)]
pub(super) enum Style {
    /// `name`, `arguments` (or `parameters`), in any order.
    Hermes,
    /// `name` first (or after `"type": "function"`), `parameters` (or `arguments`).
    Llama3,
    /// Like Hermes, plus the call's `id`.
    Mistral,
}

/// The call object at `i` as a call that ends where the object does.
pub(super) fn single_object(buf: &str, i: usize, eof: bool, style: Style) -> Attempt {
    match call_object(buf, i, eof, style) {
        ObjCall::Invalid => Attempt::Invalid,
        ObjCall::Hold => undecided(eof),
        ObjCall::Call(call, end) => {
            let end = end.or(eof.then_some(buf.len()));
            Attempt::Pieces(vec![Piece::Call(call)], end)
        }
    }
}

pub(super) enum ObjCall {
    Invalid,
    Hold,
    /// The call, and the end of its object (`None` while it goes on).
    Call(CallPiece, Option<usize>),
}

/// A key of a scanned object and its value's span (`end` is `None` while the value goes on).
pub(super) struct Entry {
    pub(super) key: String,
    pub(super) start: usize,
    pub(super) end: Option<usize>,
}

/// A JSON object scanned as far as the text goes.
pub(super) struct ObjScan {
    pub(super) entries: Vec<Entry>,
    /// Just past the closing brace, or where the object stopped being JSON.
    pub(super) end: Option<usize>,
    /// The object stopped being JSON at `end`.
    pub(super) broken: bool,
}

/// Scans the object at `i` (`s[i] == b'{'`): its keys and the spans of their values. Values are
/// skipped by their brackets and strings only.
pub(super) fn scan_object(buf: &str, i: usize) -> ObjScan {
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
pub(super) fn skip_value(s: &[u8], i: usize) -> Option<usize> {
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
pub(super) fn string_value(buf: &str, e: &Entry) -> Option<String> {
    let end = e.end?;
    serde_json::from_str::<String>(&buf[e.start..end]).ok()
}

/// The call the object at `i` holds. It is a call (committed: later text cannot undo it) once
/// its name and the start of its arguments are known, or when it ends with a name.
pub(super) fn call_object(buf: &str, i: usize, eof: bool, style: Style) -> ObjCall {
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
