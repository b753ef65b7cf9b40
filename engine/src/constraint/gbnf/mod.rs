//! llama.cpp's GBNF dialect, parsed and rewritten as an llguidance Lark grammar.
//!
//! GBNF is matched character by character, with no lexer. The translation keeps that meaning
//! exactly: every terminal of the Lark output (a literal's character, a character class, `.`)
//! matches exactly one character, so llguidance's lexer never has a choice to make between
//! longer and shorter lexemes, and its Earley parser sees the same context-free language as the
//! GBNF. (Literals are split into their characters for this reason: a whole-literal lexeme would
//! be matched greedily, and `("a" | "ab") "bc"` would then refuse `abc`.)
//!
//! The syntax follows llama.cpp's parser:
//!
//! - a grammar is a list of rules `name ::= alternatives`, names made of `[a-zA-Z0-9-]`; the
//!   start rule is `root`; a later definition of a name replaces an earlier one;
//! - a rule ends at the end of its line, but a newline may follow `::=`, `|` and `(`, and
//!   appear anywhere inside parentheses;
//! - `"literal"` with the escapes `\n \r \t \\ \" \[ \] \xHH \uHHHH \UHHHHHHHH`;
//! - `[a-z0-9_]`, `[^...]` character classes (same escapes; `-` first or last is literal);
//! - `.` for any character, `( ... )` groups, `|` alternatives, the postfix operators
//!   `* + ?` and `{m}` `{m,}` `{m,n}` (at most 2000 repetitions);
//! - `<[123]>` a token by id, `<|name|>` a token by its text, and `!<...>` any token but it;
//! - `#` comments to the end of the line.
//!
//! llama.cpp refuses left-recursive grammars; llguidance's Earley parser runs them, so they are
//! accepted here.
//!
//! Two bounds keep a hostile grammar from exhausting a stack, checked before anything recurses
//! that deep: groups and repetitions nest at most [`MAX_NESTING`] deep, and a chain of rules,
//! each referring to the next, is at most [`MAX_RULE_DEPTH`] long (llguidance's compile time
//! grows with the square of such a chain).

use std::collections::HashMap;
use std::fmt::{self, Write as _};

/// The most repetitions `{m,n}` may ask for (llama.cpp's limit).
const MAX_REPETITIONS: u32 = 2000;

/// How deep groups and repetition operators may nest inside one rule (`((x)*)?` is 4).
pub(crate) const MAX_NESTING: usize = 128;

/// Groups and repetitions nested deeper than this in the output are emitted as rules of their
/// own (llguidance's Lark parser refuses nesting past 30).
const FLATTEN_DEPTH: usize = 12;

/// The longest chain of rules, each referring to the next, that a grammar may hold.
pub(crate) const MAX_RULE_DEPTH: usize = 500;

/// A GBNF syntax or reference error, with where it was found.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct GbnfError {
    /// 1-based line, or 0 for errors about the grammar as a whole.
    pub line: usize,
    /// 1-based column, in characters.
    pub column: usize,
    /// The rule being parsed, if any.
    pub rule: Option<String>,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for GbnfError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("GBNF")?;
        if self.line > 0 {
            write!(f, " line {}, column {}", self.line, self.column)?;
        }
        if let Some(rule) = &self.rule {
            write!(f, " (rule `{rule}`)")?;
        }
        write!(f, ": {}", self.message)
    }
}

/// One character: a literal's, a class, or any.
#[derive(Debug, Clone, PartialEq)]
enum CharSet {
    Class {
        negated: bool,
        ranges: Vec<(char, char)>,
    },
    Any,
}

#[derive(Debug, Clone, PartialEq)]
enum Expr {
    /// A literal string (possibly empty).
    Literal(Vec<char>),
    Chars(CharSet),
    /// A reference to the rule with this index.
    Rule(usize),
    /// A token by id, or (negated) any token but it.
    Token {
        id: u32,
        negated: bool,
    },
    /// Alternatives of sequences.
    Group(Vec<Vec<Expr>>),
    Repeat {
        inner: Box<Expr>,
        min: u32,
        max: Option<u32>,
    },
}

struct Rule {
    name: String,
    /// `None` while only referenced.
    body: Option<Vec<Vec<Expr>>>,
    /// Where it was first referenced, for the "undefined rule" error.
    first_use: (usize, usize),
}

struct Parser<'a> {
    src: &'a str,
    pos: usize,
    rules: Vec<Rule>,
    by_name: HashMap<String, usize>,
    current_rule: Option<String>,
    token_id: &'a dyn Fn(&str) -> Option<u32>,
    n_vocab: usize,
    /// Groups open at the parser's position.
    open_groups: usize,
}

/// Parses a GBNF grammar and returns the equivalent Lark grammar. `token_id` gives the id of a
/// `<...>` token reference's text (angle brackets included); ids must be below `n_vocab`.
pub(crate) fn gbnf_to_lark(
    src: &str,
    token_id: &dyn Fn(&str) -> Option<u32>,
    n_vocab: usize,
) -> Result<String, GbnfError> {
    let mut p = Parser {
        src,
        pos: 0,
        rules: Vec::new(),
        by_name: HashMap::new(),
        current_rule: None,
        token_id,
        n_vocab,
        open_groups: 0,
    };
    p.parse_grammar()?;
    p.check()?;
    Ok(p.emit())
}

fn is_word_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '-'
}

impl<'a> Parser<'a> {
    fn peek(&self) -> Option<char> {
        self.src[self.pos..].chars().next()
    }

    fn peek_at(&self, n: usize) -> Option<char> {
        self.src[self.pos..].chars().nth(n)
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.peek()?;
        self.pos += c.len_utf8();
        Some(c)
    }

    fn error_at(&self, pos: usize, message: impl Into<String>) -> GbnfError {
        let (line, column) = line_col(self.src, pos);
        GbnfError {
            line,
            column,
            rule: self.current_rule.clone(),
            message: message.into(),
        }
    }

    fn error(&self, message: impl Into<String>) -> GbnfError {
        self.error_at(self.pos, message)
    }

    /// Skips blanks and comments, and newlines when `newline_ok`.
    fn skip_space(&mut self, newline_ok: bool) {
        while let Some(c) = self.peek() {
            match c {
                ' ' | '\t' => {
                    self.pos += 1;
                }
                '#' => {
                    while let Some(c) = self.peek() {
                        if c == '\n' || c == '\r' {
                            break;
                        }
                        self.bump();
                    }
                }
                '\r' | '\n' if newline_ok => {
                    self.pos += 1;
                }
                _ => break,
            }
        }
    }

    fn parse_name(&mut self) -> Result<String, GbnfError> {
        let start = self.pos;
        while self.peek().is_some_and(is_word_char) {
            self.pos += 1;
        }
        if self.pos == start {
            return Err(self.error(match self.peek() {
                Some(c) => format!("expected a rule name, found {c:?}"),
                None => "expected a rule name, found the end of the grammar".to_string(),
            }));
        }
        Ok(self.src[start..self.pos].to_string())
    }

    fn rule_index(&mut self, name: &str, at: usize) -> usize {
        if let Some(&i) = self.by_name.get(name) {
            return i;
        }
        let i = self.rules.len();
        self.rules.push(Rule {
            name: name.to_string(),
            body: None,
            first_use: line_col(self.src, at),
        });
        self.by_name.insert(name.to_string(), i);
        i
    }

    fn parse_grammar(&mut self) -> Result<(), GbnfError> {
        self.skip_space(true);
        while self.peek().is_some() {
            self.parse_rule()?;
        }
        Ok(())
    }

    fn parse_rule(&mut self) -> Result<(), GbnfError> {
        self.current_rule = None;
        let name_at = self.pos;
        let name = self.parse_name()?;
        self.current_rule = Some(name.clone());
        let i = self.rule_index(&name, name_at);
        self.skip_space(false);
        if !self.src[self.pos..].starts_with("::=") {
            return Err(self.error("expected `::=` after the rule name"));
        }
        self.pos += 3;
        self.skip_space(true);
        let (body, _) = self.parse_alternatives(false)?;
        match self.peek() {
            None => {}
            Some('\r') => {
                self.pos += 1;
                if self.peek() == Some('\n') {
                    self.pos += 1;
                }
            }
            Some('\n') => self.pos += 1,
            Some(c) => {
                return Err(self.error(format!("expected the end of the line, found {c:?}")));
            }
        }
        self.rules[i].body = Some(body);
        self.current_rule = None;
        self.skip_space(true);
        Ok(())
    }

    /// Alternatives, and how deep their items nest.
    fn parse_alternatives(&mut self, nested: bool) -> Result<(Vec<Vec<Expr>>, usize), GbnfError> {
        let (first, mut depth) = self.parse_sequence(nested)?;
        let mut alts = vec![first];
        while self.peek() == Some('|') {
            self.pos += 1;
            self.skip_space(true);
            let (seq, d) = self.parse_sequence(nested)?;
            alts.push(seq);
            depth = depth.max(d);
        }
        Ok((alts, depth))
    }

    /// Refuses an item nested deeper than [`MAX_NESTING`].
    fn check_nesting(&self, depth: usize, at: usize) -> Result<(), GbnfError> {
        if depth > MAX_NESTING {
            return Err(self.error_at(
                at,
                format!("groups and repetitions nest more than {MAX_NESTING} deep"),
            ));
        }
        Ok(())
    }

    /// A sequence of items, and how deep the deepest nests (an atom is 0, a group or a
    /// repetition one more than what it holds).
    fn parse_sequence(&mut self, nested: bool) -> Result<(Vec<Expr>, usize), GbnfError> {
        let mut seq: Vec<Expr> = Vec::new();
        // How deep each item of `seq` nests.
        let mut depths: Vec<usize> = Vec::new();
        while let Some(c) = self.peek() {
            depths.resize(seq.len(), 0);
            let item_at = self.pos;
            match c {
                '"' => {
                    self.pos += 1;
                    let mut chars = Vec::new();
                    loop {
                        match self.peek() {
                            None => {
                                return Err(self.error_at(item_at, "unterminated string literal"))
                            }
                            Some('"') => break,
                            Some(_) => chars.push(self.parse_char()?),
                        }
                    }
                    self.pos += 1;
                    seq.push(Expr::Literal(chars));
                }
                '[' => seq.push(self.parse_class(item_at)?),
                '.' => {
                    self.pos += 1;
                    seq.push(Expr::Chars(CharSet::Any));
                }
                '(' => {
                    // Refused before recursing: the bound holds for the parser's own stack.
                    self.check_nesting(self.open_groups + 1, item_at)?;
                    self.pos += 1;
                    self.skip_space(true);
                    self.open_groups += 1;
                    let (alts, inner) = self.parse_alternatives(true)?;
                    self.open_groups -= 1;
                    if self.peek() != Some(')') {
                        return Err(self.error(match self.peek() {
                            Some(c) => format!("expected `)`, found {c:?}"),
                            None => "expected `)`, found the end of the grammar".to_string(),
                        }));
                    }
                    self.pos += 1;
                    self.check_nesting(inner + 1, item_at)?;
                    depths.resize(seq.len(), 0);
                    depths.push(inner + 1);
                    seq.push(Expr::Group(alts));
                }
                '<' | '!' => {
                    let negated = c == '!';
                    if negated {
                        self.pos += 1;
                        if self.peek() != Some('<') {
                            return Err(self.error("expected `<` after `!`"));
                        }
                    }
                    let id = self.parse_token_ref()?;
                    seq.push(Expr::Token { id, negated });
                }
                '*' | '+' | '?' => {
                    self.pos += 1;
                    let (min, max) = match c {
                        '*' => (0, None),
                        '+' => (1, None),
                        _ => (0, Some(1)),
                    };
                    self.repeat_last(&mut seq, item_at, c, min, max)?;
                    self.deepen_last(&mut depths, seq.len(), item_at)?;
                }
                '{' => {
                    let (min, max) = self.parse_bounds(nested, item_at)?;
                    self.repeat_last(&mut seq, item_at, '{', min, max)?;
                    self.deepen_last(&mut depths, seq.len(), item_at)?;
                }
                c if is_word_char(c) => {
                    let name = self.parse_name()?;
                    let i = self.rule_index(&name, item_at);
                    seq.push(Expr::Rule(i));
                }
                _ => break,
            }
            self.skip_space(nested);
        }
        depths.resize(seq.len(), 0);
        Ok((seq, depths.into_iter().max().unwrap_or(0)))
    }

    /// A character class `[...]` (or `[^...]`) at `item_at`: its ranges, none reversed.
    fn parse_class(&mut self, item_at: usize) -> Result<Expr, GbnfError> {
        self.pos += 1;
        let negated = if self.peek() == Some('^') {
            self.pos += 1;
            true
        } else {
            false
        };
        let mut ranges = Vec::new();
        loop {
            match self.peek() {
                None => return Err(self.error_at(item_at, "unterminated character class")),
                Some(']') => break,
                Some(_) => {}
            }
            let lo = self.parse_char()?;
            let hi = if self.peek() == Some('-') && self.peek_at(1) != Some(']') {
                self.pos += 1;
                if self.peek().is_none() {
                    return Err(self.error_at(item_at, "unterminated character class"));
                }
                let range_at = self.pos;
                let hi = self.parse_char()?;
                if hi < lo {
                    return Err(self.error_at(
                        range_at,
                        format!("character range {lo:?}-{hi:?} is reversed"),
                    ));
                }
                hi
            } else {
                lo
            };
            ranges.push((lo, hi));
        }
        self.pos += 1;
        if ranges.is_empty() && !negated {
            return Err(self.error_at(item_at, "empty character class `[]`"));
        }
        Ok(Expr::Chars(CharSet::Class { negated, ranges }))
    }

    /// The bounds of a repetition `{m}`, `{m,}` or `{m,n}` at `item_at`: the maximum not below
    /// the minimum, neither over [`MAX_REPETITIONS`].
    fn parse_bounds(
        &mut self,
        nested: bool,
        item_at: usize,
    ) -> Result<(u32, Option<u32>), GbnfError> {
        self.pos += 1;
        self.skip_space(nested);
        let min = self.parse_count()?;
        self.skip_space(nested);
        let max = if self.peek() == Some(',') {
            self.pos += 1;
            self.skip_space(nested);
            if self.peek().is_some_and(|c| c.is_ascii_digit()) {
                let max = self.parse_count()?;
                self.skip_space(nested);
                Some(max)
            } else {
                None
            }
        } else {
            Some(min)
        };
        if self.peek() != Some('}') {
            return Err(self.error("expected `}` to close the repetition"));
        }
        self.pos += 1;
        if let Some(max) = max {
            if max < min {
                return Err(self.error_at(
                    item_at,
                    format!("repetition {{{min},{max}}} has its maximum below its minimum"),
                ));
            }
        }
        if min.max(max.unwrap_or(0)) > MAX_REPETITIONS {
            return Err(self.error_at(item_at, format!("more than {MAX_REPETITIONS} repetitions")));
        }
        Ok((min, max))
    }

    /// The last item of a sequence of `len` became a repetition: it nests one deeper.
    fn deepen_last(&self, depths: &mut Vec<usize>, len: usize, at: usize) -> Result<(), GbnfError> {
        depths.resize(len, 0);
        if let Some(d) = depths.last_mut() {
            *d += 1;
            self.check_nesting(*d, at)?;
        }
        Ok(())
    }

    fn repeat_last(
        &self,
        seq: &mut [Expr],
        at: usize,
        op: char,
        min: u32,
        max: Option<u32>,
    ) -> Result<(), GbnfError> {
        let Some(last) = seq.last_mut() else {
            return Err(self.error_at(at, format!("`{op}` with nothing before it to repeat")));
        };
        let inner = std::mem::replace(last, Expr::Literal(Vec::new()));
        *last = Expr::Repeat {
            inner: Box::new(inner),
            min,
            max,
        };
        Ok(())
    }

    fn parse_count(&mut self) -> Result<u32, GbnfError> {
        let start = self.pos;
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.pos += 1;
        }
        if start == self.pos {
            return Err(self.error("expected a number"));
        }
        self.src[start..self.pos]
            .parse::<u32>()
            .ok()
            .filter(|&n| n <= MAX_REPETITIONS)
            .ok_or_else(|| self.error_at(start, format!("more than {MAX_REPETITIONS} repetitions")))
    }

    /// `<[123]>` or `<text>`, at `<`.
    fn parse_token_ref(&mut self) -> Result<u32, GbnfError> {
        let start = self.pos;
        self.pos += 1;
        let body_start = self.pos;
        loop {
            match self.peek() {
                None | Some('\n') | Some('\r') => {
                    return Err(self.error_at(start, "unterminated token reference `<...>`"))
                }
                Some('>') => break,
                Some(_) => {
                    self.bump();
                }
            }
        }
        let body = &self.src[body_start..self.pos];
        self.pos += 1;
        let id = if let Some(num) = body.strip_prefix('[').and_then(|b| b.strip_suffix(']')) {
            num.parse::<u32>()
                .map_err(|_| self.error_at(start, format!("bad token id in `<{body}>`")))?
        } else {
            let text = format!("<{body}>");
            (self.token_id)(&text).ok_or_else(|| {
                self.error_at(start, format!("`{text}` is not a token of the vocabulary"))
            })?
        };
        if id as usize >= self.n_vocab {
            return Err(self.error_at(
                start,
                format!(
                    "token id {id} is outside the vocabulary of {}",
                    self.n_vocab
                ),
            ));
        }
        Ok(id)
    }

    /// One character of a literal or class, with its escapes.
    fn parse_char(&mut self) -> Result<char, GbnfError> {
        let at = self.pos;
        let c = self
            .bump()
            .ok_or_else(|| self.error("unexpected end of the grammar"))?;
        if c != '\\' {
            return Ok(c);
        }
        let e = self
            .bump()
            .ok_or_else(|| self.error("unexpected end of the grammar after `\\`"))?;
        let digits = match e {
            'n' => return Ok('\n'),
            'r' => return Ok('\r'),
            't' => return Ok('\t'),
            '\\' | '"' | '[' | ']' => return Ok(e),
            'x' => 2,
            'u' => 4,
            'U' => 8,
            _ => {
                let e = e.escape_default();
                return Err(self.error_at(at, format!("unknown escape `\\{e}`")));
            }
        };
        let hex_start = self.pos;
        for _ in 0..digits {
            match self.peek() {
                Some(h) if h.is_ascii_hexdigit() => self.pos += 1,
                _ => {
                    return Err(
                        self.error_at(at, format!("`\\{e}` needs {digits} hexadecimal digits"))
                    )
                }
            }
        }
        let code = u32::from_str_radix(&self.src[hex_start..self.pos], 16)
            .expect("checked hexadecimal digits");
        char::from_u32(code)
            .ok_or_else(|| self.error_at(at, format!("U+{code:X} is not a Unicode scalar value")))
    }

    fn check(&mut self) -> Result<(), GbnfError> {
        self.current_rule = None;
        if self.rules.is_empty() {
            return Err(GbnfError {
                line: 0,
                column: 0,
                rule: None,
                message: "the grammar is empty".into(),
            });
        }
        for r in &self.rules {
            if r.body.is_none() {
                return Err(GbnfError {
                    line: r.first_use.0,
                    column: r.first_use.1,
                    rule: None,
                    message: format!("undefined rule `{}`", r.name),
                });
            }
        }
        if !self.by_name.contains_key("root") {
            return Err(GbnfError {
                line: 0,
                column: 0,
                rule: None,
                message: "the grammar has no `root` rule".into(),
            });
        }
        self.check_rule_depth()
    }

    fn lark_name(&self, i: usize) -> String {
        let mangled: String = self.rules[i]
            .name
            .chars()
            .map(|c| {
                if c.is_ascii_lowercase() || c.is_ascii_digit() {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        format!("g{i}_{mangled}")
    }

    fn emit(&self) -> String {
        let mut out = String::new();
        let root = self.by_name["root"];
        let _ = writeln!(out, "start: {}", self.lark_name(root));
        let mut aux = Vec::new();
        for (i, r) in self.rules.iter().enumerate() {
            let _ = write!(out, "{}: ", self.lark_name(i));
            self.emit_alts(&mut out, r.body.as_deref().unwrap_or(&[]), 0, &mut aux);
            out.push('\n');
        }
        for rule in aux {
            out.push_str(&rule);
            out.push('\n');
        }
        out
    }

    /// Emits alternatives nested `depth` deep in their rule; groups and repetitions deeper than
    /// [`FLATTEN_DEPTH`] become rules of their own in `aux` (llguidance's Lark parser refuses
    /// deep nesting).
    fn emit_alts(&self, out: &mut String, alts: &[Vec<Expr>], depth: usize, aux: &mut Vec<String>) {
        for (k, seq) in alts.iter().enumerate() {
            if k > 0 {
                out.push_str(" | ");
            }
            if seq.is_empty() {
                out.push_str("()");
            }
            for (j, e) in seq.iter().enumerate() {
                if j > 0 {
                    out.push(' ');
                }
                self.emit_expr(out, e, depth, aux);
            }
        }
    }

    /// Emits `e` as one Lark atom (parenthesized when it is not one already).
    fn emit_expr(&self, out: &mut String, e: &Expr, depth: usize, aux: &mut Vec<String>) {
        let nests = matches!(e, Expr::Group(_) | Expr::Repeat { .. });
        if nests && depth >= FLATTEN_DEPTH {
            // The rule's place is taken first: rules emitted inside it come after.
            let index = aux.len();
            aux.push(String::new());
            let mut body = format!("aux_{index}: ");
            self.emit_expr(&mut body, e, 0, aux);
            aux[index] = body;
            let _ = write!(out, "aux_{index}");
            return;
        }
        match e {
            Expr::Literal(chars) if chars.len() == 1 => {
                emit_class(out, false, &[(chars[0], chars[0])])
            }
            Expr::Literal(chars) => {
                // The empty literal is an empty group.
                out.push('(');
                for (j, &c) in chars.iter().enumerate() {
                    if j > 0 {
                        out.push(' ');
                    }
                    emit_class(out, false, &[(c, c)]);
                }
                out.push(')');
            }
            Expr::Chars(CharSet::Any) => out.push_str("/(?s:.)/"),
            Expr::Chars(CharSet::Class { negated, ranges }) => emit_class(out, *negated, ranges),
            Expr::Rule(i) => out.push_str(&self.lark_name(*i)),
            Expr::Token { id, negated } => {
                let _ = write!(out, "<[{}{id}]>", if *negated { "^" } else { "" });
            }
            Expr::Group(alts) => {
                out.push('(');
                self.emit_alts(out, alts, depth + 1, aux);
                out.push(')');
            }
            Expr::Repeat {
                min: 0,
                max: Some(0),
                ..
            } => out.push_str("()"),
            Expr::Repeat { inner, min, max } => {
                out.push('(');
                self.emit_expr(out, inner, depth + 1, aux);
                out.push(')');
                match (min, max) {
                    (0, None) => out.push('*'),
                    (1, None) => out.push('+'),
                    (0, Some(1)) => out.push('?'),
                    (m, None) => {
                        let _ = write!(out, "{{{m},}}");
                    }
                    (m, Some(n)) if m == n => {
                        let _ = write!(out, "{{{m}}}");
                    }
                    (m, Some(n)) => {
                        let _ = write!(out, "{{{m},{n}}}");
                    }
                }
            }
        }
    }
}

/// Emits a one-character Lark regex terminal: every character other than ASCII letters and
/// digits is written as `\x{..}`, so nothing in it can end the `/.../` or mean anything else.
fn emit_class(out: &mut String, negated: bool, ranges: &[(char, char)]) {
    let ch = |out: &mut String, c: char| {
        if c.is_ascii_alphanumeric() {
            out.push(c);
        } else {
            let _ = write!(out, "\\x{{{:x}}}", u32::from(c));
        }
    };
    out.push('/');
    if negated || ranges.len() != 1 || ranges[0].0 != ranges[0].1 {
        out.push('[');
        if negated {
            out.push('^');
        }
        for &(lo, hi) in ranges {
            ch(out, lo);
            if hi != lo {
                out.push('-');
                ch(out, hi);
            }
        }
        out.push(']');
    } else {
        ch(out, ranges[0].0);
    }
    out.push('/');
}

/// 1-based line and column (in characters) of byte offset `pos`.
fn line_col(src: &str, pos: usize) -> (usize, usize) {
    let before = &src[..pos.min(src.len())];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    (line, before[line_start..].chars().count() + 1)
}

mod depth;
#[cfg(test)]
mod tests;
