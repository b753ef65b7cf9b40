//! `read_file`, `write_file`, `exec_shell_command` and `get_info`.

use std::io::{BufRead, BufReader, Read};
use std::time::Duration;

use base64::Engine as _;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::exec::Limits;
use super::io::{blocking, Io};
use super::{failure, Params, Reply};

/// Most bytes of text `read_file` answers with; a larger file needs a line range.
const READ_MAX: usize = 16 * 1024;
/// Most bytes of a file read whole as base64 (`x-resp-type: base64`).
const READ_BASE64_MAX: u64 = 32 << 20;
/// `exec_shell_command`'s default and largest time limit, in seconds.
const EXEC_TIMEOUT: (i64, i64) = (10, 60);
/// `exec_shell_command`'s largest output, in bytes (also its default).
const EXEC_OUTPUT_MAX: usize = 16 * 1024;
/// `get_info`'s command limits.
const INFO_LIMITS: Limits = Limits {
    max_output: 4096,
    timeout: Duration::from_secs(5),
};

/// `read_file`: a file's text (a line range, optionally numbered), or with `resp_type`
/// `base64` (from the `x-resp-type` header) its bytes.
pub async fn read_file(io: &Io, p: &Params<'_>, resp_type: Option<&str>) -> Reply {
    let path = p.str("path")?;
    let start = p.int("start_line", 1);
    let end = p.int("end_line", -1);
    let numbered = p.bool("append_loc", false);
    let abs = io.resolve(&path);
    let (reader, size) = match io.open(&abs).await {
        Ok(r) => r,
        Err(e) => return failure(format!("cannot stat file: {path}: {e}")),
    };
    if resp_type == Some("base64") {
        if size > READ_BASE64_MAX {
            return failure(format!(
                "file too large ({size} bytes, max {READ_BASE64_MAX})"
            ));
        }
        let bytes = blocking(move || {
            let mut bytes = Vec::new();
            reader
                .take(READ_BASE64_MAX)
                .read_to_end(&mut bytes)
                .map(|_| bytes)
        })
        .await?;
        return match bytes {
            Ok(b) => Ok(json!({
                "base64": base64::engine::general_purpose::STANDARD.encode(&b),
                "size_bytes": b.len(),
            })),
            Err(e) => failure(format!("failed to open file: {path}: {e}")),
        };
    }
    if size > READ_MAX as u64 && end == -1 {
        return failure(format!(
            "file too large ({size} bytes, max {READ_MAX}). Use start_line/end_line to read a portion."
        ));
    }
    let text = blocking(move || pick_lines(reader, start, end, numbered, READ_MAX)).await?;
    match text {
        Ok(t) => Ok(json!({ "plain_text_response": t })),
        Err(e) => failure(format!("failed to open file: {path}: {e}")),
    }
}

/// Lines `start..=end` (1-based; `end` -1: to the end) of `r`, each ended by a newline and,
/// when `numbered`, led by its number and `→`; at most `cap` bytes, then `[output truncated]`.
/// A line is never held in memory beyond `cap` bytes, however long it is.
fn pick_lines(
    r: impl Read,
    start: i64,
    end: i64,
    numbered: bool,
    cap: usize,
) -> std::io::Result<String> {
    let mut r = BufReader::new(r);
    let mut out = String::new();
    let mut lineno: i64 = 0;
    let mut line = Vec::new();
    loop {
        let wanted = lineno + 1 >= start && (end == -1 || lineno < end);
        line.clear();
        let mut any = false;
        loop {
            let buf = r.fill_buf()?;
            if buf.is_empty() {
                break;
            }
            any = true;
            let (take, used, done) = match buf.iter().position(|&b| b == b'\n') {
                Some(i) => (i, i + 1, true),
                None => (buf.len(), buf.len(), false),
            };
            if wanted {
                let room = (cap + 1).saturating_sub(line.len());
                line.extend_from_slice(&buf[..take.min(room)]);
            }
            r.consume(used);
            if done {
                break;
            }
        }
        if !any {
            break;
        }
        lineno += 1;
        if !wanted {
            if end != -1 && lineno > end {
                break;
            }
            continue;
        }
        let text = String::from_utf8_lossy(&line);
        let piece = if numbered {
            format!("{lineno}\u{2192}{text}\n")
        } else {
            format!("{text}\n")
        };
        if out.len() + piece.len() > cap {
            out.push_str("[output truncated]");
            break;
        }
        out.push_str(&piece);
    }
    Ok(out)
}

/// `write_file`: creates or replaces a file, and the directories it needs.
pub async fn write_file(io: &Io, p: &Params<'_>) -> Reply {
    let path = p.str("path")?;
    let content = p.str("content")?;
    let bytes = content.len();
    match io.write(&io.resolve(&path), content.into_bytes()).await {
        Ok(()) => Ok(json!({
            "result": "file written successfully",
            "path": path,
            "bytes": bytes,
        })),
        Err(e) => failure(format!("failed to write file: {path}: {e}")),
    }
}

/// `exec_shell_command`: `sh -c COMMAND` in the working directory, its output and exit code
/// (streamed to `sink` when given, then nothing is returned).
pub async fn exec_shell_command(
    io: &Io,
    p: &Params<'_>,
    sink: Option<mpsc::Sender<String>>,
) -> Reply {
    let command = p.str("command")?;
    let secs = p.int("timeout", EXEC_TIMEOUT.0).clamp(1, EXEC_TIMEOUT.1);
    let max_output = usize::try_from(p.int("max_output_size", EXEC_OUTPUT_MAX as i64))
        .unwrap_or(0)
        .min(EXEC_OUTPUT_MAX);
    let limits = Limits {
        max_output,
        timeout: Duration::from_secs(secs as u64),
    };
    let argv = ["sh".to_owned(), "-c".to_owned(), command];
    let res = io.run(&argv, limits, sink.as_ref()).await;
    let mut tail = format!("\n[exit code: {}]", res.exit_code);
    if res.timed_out {
        tail.push_str(" [exit due to timed out]");
    }
    match sink {
        Some(sink) => {
            if !res.cancelled {
                let _ = sink.send(tail).await;
            }
            Ok(Value::Null)
        }
        None => Ok(json!({ "plain_text_response": res.output + &tail })),
    }
}

/// `get_info`: the system's name (`uname -a`) and the working directory.
pub async fn get_info(io: &Io) -> Reply {
    let argv = ["uname".to_owned(), "-a".to_owned()];
    let res = io.run(&argv, INFO_LIMITS, None).await;
    let os = if res.exit_code == 0 && !res.timed_out {
        res.output.trim().to_owned()
    } else {
        "unknown".to_owned()
    };
    let cwd = match io.cwd() {
        Some(c) => c,
        None => {
            let pwd = io.run(&["pwd".to_owned()], INFO_LIMITS, None).await;
            if pwd.exit_code == 0 && !pwd.timed_out {
                pwd.output.trim().to_owned()
            } else {
                "unknown".to_owned()
            }
        }
    };
    Ok(json!({ "os": os, "cwd": cwd }))
}

#[cfg(test)]
mod tests {
    use super::pick_lines;

    fn pick(text: &str, start: i64, end: i64, numbered: bool, cap: usize) -> String {
        pick_lines(text.as_bytes(), start, end, numbered, cap).unwrap()
    }

    #[test]
    fn line_ranges_numbers_and_the_cap() {
        assert_eq!(pick("a\nb\nc\n", 1, -1, false, 100), "a\nb\nc\n");
        assert_eq!(pick("a\nb\nc", 1, -1, false, 100), "a\nb\nc\n");
        assert_eq!(pick("a\nb\nc\n", 2, 2, true, 100), "2\u{2192}b\n");
        assert_eq!(pick("a\nb\nc\n", 3, -1, false, 100), "c\n");
        assert_eq!(pick("", 1, -1, false, 100), "");
        assert_eq!(
            pick("aaaa\nbbbb\n", 1, -1, false, 6),
            "aaaa\n[output truncated]"
        );
        let long = "x".repeat(100_000);
        assert_eq!(pick(&long, 1, 1, false, 10), "[output truncated]");
    }
}
