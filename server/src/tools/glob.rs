//! Glob patterns as the tools take them: `*` and `?` stay within one path component, `**`
//! crosses components, `**/` also matches no directory at all, `[abc]`, `[a-z]` and `[!x]` (or
//! `[^x]`) match one character of a class. Matching simulates the pattern as a small automaton,
//! one set of positions per character of the path, so its cost is the product of the two
//! lengths whatever the pattern (a model's pattern never backtracks exponentially).

/// Whether `pattern` matches `rel`, a `/`-separated path relative to the search's base: a
/// pattern without `/` is matched against the last component at any depth; one with `/` against
/// the whole path, anchored at the base when it starts with `/` or `**`, else at any depth.
pub fn path_matches(pattern: &str, rel: &str) -> bool {
    if !pattern.contains('/') {
        let name = rel.rsplit('/').next().unwrap_or(rel);
        return matches(pattern, name);
    }
    if let Some(anchored) = pattern.strip_prefix('/') {
        return matches(anchored, rel);
    }
    if pattern == "**" || pattern.starts_with("**/") {
        return matches(pattern, rel);
    }
    matches(&format!("**/{pattern}"), rel)
}

/// Whether the whole of `text` matches `pattern`.
pub fn matches(pattern: &str, text: &str) -> bool {
    let toks = compile(pattern);
    let n = toks.len();
    let mut live = vec![false; n + 1];
    live[0] = true;
    close(&toks, &mut live);
    for c in text.chars() {
        let mut next = vec![false; n + 1];
        for (i, tok) in toks.iter().enumerate() {
            if !live[i] {
                continue;
            }
            match tok {
                Tok::Lit(l) if *l == c => next[i + 1] = true,
                Tok::One if c != '/' => next[i + 1] = true,
                Tok::Class { neg, ranges } if c != '/' => {
                    let hit = ranges.iter().any(|&(lo, hi)| lo <= c && c <= hi);
                    if hit != *neg {
                        next[i + 1] = true;
                    }
                }
                Tok::Star if c != '/' => next[i] = true,
                Tok::Globstar => next[i] = true,
                Tok::Dirs => {
                    next[i] = true;
                    if c == '/' {
                        next[i + 1] = true;
                    }
                }
                _ => {}
            }
        }
        close(&toks, &mut next);
        if !next.iter().any(|&b| b) {
            return false;
        }
        live = next;
    }
    live[n]
}

#[derive(Debug)]
enum Tok {
    Lit(char),
    One,
    Star,
    Globstar,
    /// `**/`: nothing, or anything that ends with `/`.
    Dirs,
    Class {
        neg: bool,
        ranges: Vec<(char, char)>,
    },
}

/// The positions reachable without reading a character: past any star.
fn close(toks: &[Tok], live: &mut [bool]) {
    for i in 0..toks.len() {
        if live[i] && matches!(toks[i], Tok::Star | Tok::Globstar | Tok::Dirs) {
            live[i + 1] = true;
        }
    }
}

fn compile(pattern: &str) -> Vec<Tok> {
    let chars: Vec<char> = pattern.chars().collect();
    let mut toks = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        match chars[i] {
            '*' if chars.get(i + 1) == Some(&'*') => {
                if chars.get(i + 2) == Some(&'/') {
                    toks.push(Tok::Dirs);
                    i += 3;
                } else {
                    toks.push(Tok::Globstar);
                    i += 2;
                }
            }
            '*' => {
                toks.push(Tok::Star);
                i += 1;
            }
            '?' => {
                toks.push(Tok::One);
                i += 1;
            }
            '[' => match class(&chars[i + 1..]) {
                Some((tok, used)) => {
                    toks.push(tok);
                    i += 1 + used;
                }
                None => {
                    toks.push(Tok::Lit('['));
                    i += 1;
                }
            },
            c => {
                toks.push(Tok::Lit(c));
                i += 1;
            }
        }
    }
    toks
}

/// A class after its `[`: the token and the characters it used (its `]` included), or `None`
/// when it never closes (then `[` is a plain character).
fn class(chars: &[char]) -> Option<(Tok, usize)> {
    let mut i = 0;
    let neg = matches!(chars.first(), Some('!' | '^'));
    if neg {
        i += 1;
    }
    let mut ranges = Vec::new();
    let start = i;
    loop {
        let c = *chars.get(i)?;
        if c == ']' && i > start {
            return Some((Tok::Class { neg, ranges }, i + 1));
        }
        match (chars.get(i + 1), chars.get(i + 2)) {
            (Some('-'), Some(&hi)) if hi != ']' => {
                ranges.push((c, hi));
                i += 3;
            }
            _ => {
                ranges.push((c, c));
                i += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{matches, path_matches};

    #[test]
    fn stars_stay_within_a_component_unless_doubled() {
        assert!(matches("*.rs", "main.rs"));
        assert!(!matches("*.rs", "src/main.rs"));
        assert!(matches("**.rs", "src/main.rs"));
        assert!(matches("src/**/*.rs", "src/a/b/main.rs"));
        assert!(matches("src/**/*.rs", "src/main.rs"));
        assert!(matches("**", ""));
        assert!(matches("?a[b-d][!x]", "zacy"));
        assert!(!matches("?a[b-d][!x]", "zacx"));
        assert!(matches("[]]", "]"));
        assert!(matches("a[", "a["));
        assert!(!matches("a", "ab"));
    }

    #[test]
    fn bare_patterns_match_the_name_at_any_depth() {
        assert!(path_matches("*proj*", "project-alpha"));
        assert!(path_matches("main.cpp", "a/b/main.cpp"));
        assert!(path_matches("b/main.cpp", "a/b/main.cpp"));
        assert!(path_matches("/a/*/main.cpp", "a/b/main.cpp"));
        assert!(!path_matches("/b/main.cpp", "a/b/main.cpp"));
        assert!(path_matches("**", "a/b"));
        // `..` in a pattern names nothing outside the base: entries never hold it.
        assert!(!path_matches("../*", "a/b"));
    }

    #[test]
    fn long_hostile_patterns_stay_cheap() {
        let text = "a".repeat(4000);
        let pattern = "*a".repeat(200) + "b";
        let t = std::time::Instant::now();
        assert!(!matches(&pattern, &text));
        assert!(t.elapsed() < std::time::Duration::from_secs(5));
    }
}
