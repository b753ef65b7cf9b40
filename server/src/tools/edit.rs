//! `edit_file`: exact replacements, each `old_text` found once in the file as it was before the
//! call, the edits never overlapping. When some `old_text` is not found as written, the file
//! and the texts are compared line by line with trailing blanks dropped and typographic quotes,
//! dashes and spaces read as their ASCII forms; the lines an edit does not touch are then kept
//! byte for byte.

use serde_json::json;

use super::io::Io;
use super::{failure, Params, Reply};

/// Most bytes of a file `edit_file` reads.
const EDIT_MAX: u64 = 64 << 20;

/// `edit_file`.
pub async fn edit_file(io: &Io, p: &Params<'_>) -> Reply {
    let path = p.str("path")?;
    let list = p.array("edits")?;
    if list.is_empty() {
        return failure("\"edits\" must be a non-empty array".into());
    }
    let mut edits = Vec::with_capacity(list.len());
    for (i, e) in list.iter().enumerate() {
        let item = Params::new(e);
        let old = item.str("old_text")?;
        let new = item.str("new_text")?;
        if old.is_empty() {
            return failure(format!("edits[{i}].old_text must not be empty"));
        }
        edits.push((old, new));
    }
    let abs = io.resolve(&path);
    let original = match io.read(&abs, EDIT_MAX).await {
        Ok(b) => String::from_utf8_lossy(&b).into_owned(),
        Err(e) => return failure(format!("failed to open file: {path}: {e}")),
    };
    let edited = match apply(&original, &edits, &path) {
        Ok(t) => t,
        Err(e) => return failure(e),
    };
    if let Err(e) = io.write(&abs, edited.into_bytes()).await {
        return failure(format!("failed to write file: {path}: {e}"));
    }
    Ok(json!({
        "result": "file edited successfully",
        "path": path,
        "edits_applied": edits.len(),
    }))
}

/// One edit's place in the text it applies to.
#[derive(Debug)]
struct Hit<'a> {
    index: usize,
    at: usize,
    len: usize,
    new: &'a str,
}

/// `original` with `edits` (old, new) made, or why not.
fn apply(original: &str, edits: &[(String, String)], path: &str) -> Result<String, String> {
    let loose_original = loosen(original);
    let mut loose = false;
    for (i, (old, _)) in edits.iter().enumerate() {
        if original.contains(old.as_str()) {
            continue;
        }
        if !loose_original.contains(&loosen(old)) {
            return Err(format!(
                "could not find edits[{i}].old_text in {path}, it must match the file's current content exactly"
            ));
        }
        loose = true;
    }
    let base = if loose {
        loose_original.as_str()
    } else {
        original
    };
    let mut hits = Vec::with_capacity(edits.len());
    for (i, (old, new)) in edits.iter().enumerate() {
        let loose_old = loosen(old);
        // Uniqueness is judged loosely, so a copy differing only in blanks still counts.
        let n = count(&loose_original, &loose_old);
        if n > 1 {
            return Err(format!(
                "found {n} occurrences of edits[{i}].old_text in {path}, it must be unique"
            ));
        }
        let needle = if loose {
            loose_old.as_str()
        } else {
            old.as_str()
        };
        let at = base.find(needle).unwrap_or(base.len());
        hits.push(Hit {
            index: i,
            at,
            len: needle.len(),
            new,
        });
    }
    hits.sort_by_key(|h| h.at);
    for w in hits.windows(2) {
        if w[0].at + w[0].len > w[1].at {
            return Err(format!(
                "edits[{}] and edits[{}] overlap in {path}; merge them into one edit or target disjoint regions",
                w[0].index, w[1].index
            ));
        }
    }
    let edited = if loose {
        keep_untouched_lines(original, base, &hits)
    } else {
        replace(base, &hits, 0)
    };
    if edited == original {
        return Err("no changes made: the replacement(s) produced identical content".into());
    }
    Ok(edited)
}

/// `text` with each line's trailing blanks dropped and typographic characters made ASCII;
/// the line count is kept.
fn loosen(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for (i, line) in text.split('\n').enumerate() {
        if i > 0 {
            out.push('\n');
        }
        let line = line.trim_end_matches([' ', '\t', '\r']);
        out.extend(line.chars().map(|c| match c {
            '\u{2018}'..='\u{201B}' => '\'',
            '\u{201C}'..='\u{201F}' => '"',
            '\u{2010}'..='\u{2015}' | '\u{2212}' => '-',
            '\u{00A0}' | '\u{2002}'..='\u{200A}' | '\u{202F}' | '\u{205F}' | '\u{3000}' => ' ',
            c => c,
        }));
    }
    out
}

/// Occurrences of `needle` in `text` that do not overlap.
fn count(text: &str, needle: &str) -> usize {
    if needle.is_empty() {
        return 0;
    }
    text.matches(needle).count()
}

/// `text` (which starts at `offset` of the text the hits index) with the hits replaced.
fn replace(text: &str, hits: &[Hit<'_>], offset: usize) -> String {
    let mut out = String::with_capacity(text.len());
    let mut pos = 0;
    for h in hits {
        let at = h.at - offset;
        out.push_str(&text[pos..at]);
        out.push_str(h.new);
        pos = at + h.len;
    }
    out.push_str(&text[pos..]);
    out
}

/// The hits (found in `base`, the loosened text) applied to the lines they touch, every other
/// line taken from `original` as it was.
fn keep_untouched_lines(original: &str, base: &str, hits: &[Hit<'_>]) -> String {
    let original_lines: Vec<&str> = original.split_inclusive('\n').collect();
    let mut spans = Vec::new();
    let mut at = 0;
    for l in base.split_inclusive('\n') {
        spans.push((at, at + l.len()));
        at += l.len();
    }
    let line_of = |pos: usize| {
        spans
            .iter()
            .position(|&(s, e)| pos >= s && pos < e)
            .unwrap_or(spans.len().saturating_sub(1))
    };
    // Groups of hits over shared lines: (first line, end line, hits).
    let mut groups: Vec<(usize, usize, Vec<&Hit<'_>>)> = Vec::new();
    for h in hits {
        let first = line_of(h.at);
        let last = line_of((h.at + h.len).saturating_sub(1).max(h.at));
        match groups.last_mut() {
            Some(g) if first < g.1 => {
                g.1 = g.1.max(last + 1);
                g.2.push(h);
            }
            _ => groups.push((first, last + 1, vec![h])),
        }
    }
    let mut out = String::with_capacity(original.len());
    let mut next_line = 0;
    for (first, end, group) in groups {
        for l in original_lines.iter().take(first).skip(next_line) {
            out.push_str(l);
        }
        let (from, to) = (spans[first].0, spans[end - 1].1);
        let owned: Vec<Hit<'_>> = group
            .iter()
            .map(|h| Hit {
                index: h.index,
                at: h.at,
                len: h.len,
                new: h.new,
            })
            .collect();
        out.push_str(&replace(&base[from..to], &owned, from));
        next_line = end;
    }
    for l in original_lines.iter().skip(next_line) {
        out.push_str(l);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::apply;

    fn edits(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
            .collect()
    }

    #[test]
    fn exact_edits_apply_against_the_original() {
        let e = edits(&[("line2", "line2-edited"), ("line3\n", "line3\nline4\n")]);
        assert_eq!(
            apply("line1\nline2\nline3\n", &e, "f").unwrap(),
            "line1\nline2-edited\nline3\nline4\n"
        );
    }

    #[test]
    fn duplicates_overlaps_and_misses_are_refused() {
        let dup = apply("dup\ndup\n", &edits(&[("dup", "x")]), "f").unwrap_err();
        assert!(dup.contains("unique"), "{dup}");
        let e = edits(&[("line1\nline2", "a"), ("line2", "b")]);
        let overlap = apply("line1\nline2\n", &e, "f").unwrap_err();
        assert!(overlap.contains("overlap"), "{overlap}");
        let miss = apply("abc", &edits(&[("xyz", "q")]), "f").unwrap_err();
        assert!(miss.contains("could not find edits[0]"), "{miss}");
        let same = apply("abc", &edits(&[("b", "b")]), "f").unwrap_err();
        assert!(same.contains("no changes"), "{same}");
    }

    #[test]
    fn loose_matches_keep_other_lines_as_they_were() {
        let original = "keep \u{201C}this\u{201D}  \nsay \u{201C}hi\u{201D}\ntail\u{00A0}\n";
        let e = edits(&[("say \"hi\"", "say \"bye\"")]);
        assert_eq!(
            apply(original, &e, "f").unwrap(),
            "keep \u{201C}this\u{201D}  \nsay \"bye\"\ntail\u{00A0}\n"
        );
    }
}
