//! `file_glob_search` and `grep_search`. Patterns only filter the entries of a walk that starts
//! at the base directory, so no pattern (`..` in it or not) reaches outside it; `grep_search`
//! reads each file through the same checks as `read_file`. Regular expressions are the
//! `regex` crate's, whose matching time is linear in the text.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use serde_json::json;

use super::glob::path_matches;
use super::io::{Io, PathKind};
use super::walk::Kind;
use super::{failure, Params, Reply};

/// Most entries `file_glob_search` returns.
const GLOB_MAX: i64 = 100;
/// Most matches `grep_search` returns.
const GREP_MAX: usize = 100;
/// Larger files are not searched.
const GREP_FILE_MAX: u64 = 16 << 20;
/// Time for one search, listing included.
const GREP_TIME: Duration = Duration::from_secs(30);

/// `file_glob_search`.
pub async fn file_glob_search(io: &Io, p: &Params<'_>) -> Reply {
    let path = p.str("path")?;
    let include = p.opt_str("include").unwrap_or_else(|| "**".into());
    let exclude = p.opt_str("exclude").unwrap_or_default();
    let type_ = p.opt_str("type").unwrap_or_else(|| "file".into());
    let max_depth = usize::try_from(p.int("max_depth", 0)).unwrap_or(0);
    let limit = p.int("limit", GLOB_MAX);
    if limit < 1 {
        return failure(format!("invalid limit: {limit} (expected 1 or more)"));
    }
    let limit = limit.min(GLOB_MAX) as usize;
    let Some(kind) = Kind::parse(&type_) else {
        return failure(format!(
            "invalid type: {type_} (expected \"file\", \"dir\" or \"all\")"
        ));
    };
    let base = io.resolve(&path);
    let listing = match io.list(&base, max_depth, kind).await {
        Ok(l) => l,
        Err(e) => return failure(format!("{e}: {path}")),
    };
    let hits: Vec<_> = listing
        .entries
        .iter()
        .filter(|e| path_matches(&include, &e.rel))
        .filter(|e| exclude.is_empty() || !path_matches(&exclude, &e.rel))
        .collect();
    let mut text = String::new();
    let mut entries = Vec::new();
    for e in hits.iter().take(limit) {
        let _ = writeln!(text, "{}{}", e.rel, if e.is_dir { "/" } else { "" });
        entries.push(json!({ "path": e.rel, "type": if e.is_dir { "dir" } else { "file" } }));
    }
    let _ = write!(text, "\n---\nTotal matches: {}\n", hits.len());
    if hits.len() > limit {
        let _ = writeln!(
            text,
            "[{limit} results limit reached ({} total matches). Refine the glob pattern to narrow the search.]",
            hits.len()
        );
    }
    if listing.truncated {
        text.push_str("[results truncated: time budget or unreadable directory]\n");
    }
    Ok(json!({ "plain_text_response": text, "entries": entries, "base": base }))
}

/// `grep_search`'s options.
struct Grep {
    show_numbers: bool,
    context: usize,
}

/// `grep_search`.
pub async fn grep_search(io: &Io, p: &Params<'_>) -> Reply {
    let path = p.str("path")?;
    let pattern = p.str("pattern")?;
    let include = p.opt_str("include").unwrap_or_else(|| "**".into());
    let exclude = p.opt_str("exclude").unwrap_or_default();
    let context = usize::try_from(p.int("context_lines", 0)).unwrap_or(0);
    let opts = Grep {
        show_numbers: p.bool("return_line_numbers", false) || context > 0,
        context,
    };
    let source = if p.bool("literal", false) {
        regex::escape(&pattern)
    } else {
        pattern
    };
    let re = match regex::RegexBuilder::new(&source)
        .case_insensitive(p.bool("ignore_case", false))
        .size_limit(4 << 20)
        .build()
    {
        Ok(r) => r,
        Err(e) => return failure(format!("invalid regex: {e}")),
    };
    let deadline = Instant::now() + GREP_TIME;
    let abs = io.resolve(&path);
    let files: Vec<(String, String)> = match io.kind(&abs).await {
        PathKind::File => {
            // A file named alone that cannot be read is said so, not searched as empty.
            if let Err(e) = io.open(&abs).await {
                return failure(format!("cannot read {path}: {e}"));
            }
            vec![(abs, path)]
        }
        PathKind::Dir => match io.list(&abs, 0, Kind::Files).await {
            Ok(l) => l
                .entries
                .into_iter()
                .filter(|e| path_matches(&include, &e.rel))
                .filter(|e| exclude.is_empty() || !path_matches(&exclude, &e.rel))
                .map(|e| (format!("{}/{}", abs.trim_end_matches('/'), e.rel), e.rel))
                .collect(),
            Err(e) => return failure(format!("{e}: {path}")),
        },
        PathKind::Other => return failure(format!("path does not exist: {path}")),
    };
    let mut text = String::new();
    let mut total = 0;
    let mut stopped_early = false;
    for (file, shown) in files {
        if total >= GREP_MAX || Instant::now() >= deadline {
            stopped_early = Instant::now() >= deadline;
            break;
        }
        let Ok(bytes) = io.read(&file, GREP_FILE_MAX).await else {
            continue;
        };
        // Binary files hold no lines worth showing.
        if bytes[..bytes.len().min(8192)].contains(&0) {
            continue;
        }
        total += grep_one(
            &String::from_utf8_lossy(&bytes),
            &shown,
            &re,
            &opts,
            GREP_MAX - total,
            &mut text,
        );
    }
    let _ = write!(text, "\n---\nTotal matches: {total}\n");
    if total >= GREP_MAX {
        let _ = writeln!(
            text,
            "[{GREP_MAX} matches limit reached. Narrow the path/pattern/include to see more.]"
        );
    }
    if stopped_early {
        text.push_str("[search stopped: time budget]\n");
    }
    Ok(json!({ "plain_text_response": text }))
}

/// Appends `content`'s matching lines (at most `room`) to `out`; how many matched.
fn grep_one(
    content: &str,
    shown: &str,
    re: &regex::Regex,
    opts: &Grep,
    room: usize,
    out: &mut String,
) -> usize {
    let lines: Vec<&str> = content.split_terminator('\n').collect();
    let mut found = 0;
    for (i, line) in lines.iter().enumerate() {
        if found >= room {
            break;
        }
        if !re.is_match(line) {
            continue;
        }
        let from = i.saturating_sub(opts.context);
        let to = (i + opts.context).min(lines.len() - 1);
        for (j, l) in lines.iter().enumerate().take(to + 1).skip(from) {
            let mark = if j == i { ':' } else { '-' };
            out.push_str(shown);
            out.push(mark);
            if opts.show_numbers {
                let _ = write!(out, "{}{mark}", j + 1);
            }
            out.push_str(l);
            out.push('\n');
        }
        if opts.context > 0 {
            out.push_str("--\n");
        }
        found += 1;
    }
    found
}

#[cfg(test)]
mod tests {
    use super::{grep_one, Grep};

    #[test]
    fn matches_with_numbers_and_context() {
        let re = regex::Regex::new("b").unwrap();
        let mut out = String::new();
        let opts = Grep {
            show_numbers: true,
            context: 1,
        };
        assert_eq!(grep_one("a\nb\nc\n", "f", &re, &opts, 10, &mut out), 1);
        assert_eq!(out, "f-1-a\nf:2:b\nf-3-c\n--\n");
        let mut out = String::new();
        let plain = Grep {
            show_numbers: false,
            context: 0,
        };
        assert_eq!(grep_one("b\nbb\n", "f", &re, &plain, 1, &mut out), 1);
        assert_eq!(out, "f:b\n");
    }
}
