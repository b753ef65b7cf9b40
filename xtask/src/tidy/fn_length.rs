//! The function-length check: no hand-written function runs over [`MAX_FN_LINES`] lines, from
//! its `fn` line to its closing brace, save the data tables and the functions still to split of
//! [`LONG_FNS_ALLOWED`].

use syn::spanned::Spanned;
use syn::visit::{self, Visit};

use super::source::Source;
use super::{glob_match, Violation, GENERATED};

/// The longest a function may be, counted from its `fn` line to its closing brace.
pub(super) const MAX_FN_LINES: usize = 150;

/// Functions that may run longer, by file and name, with the reason: a data table (mostly
/// literal rows, which splitting would only scatter), or "to split" (a debt, listed so that it
/// stays visible).
pub(super) const LONG_FNS_ALLOWED: &[(&str, &str, &str)] = &[
    (
        "engine/src/chat/builtin.rs",
        "source",
        "a data table: llama-server's named templates, one arm per name",
    ),
    (
        "engine/src/sampling/tests_params.rs",
        "check_refuses_settings_out_of_range",
        "a data table: one setting out of range per row",
    ),
];

/// One function of a file: its name and the lines of its `fn` keyword and closing brace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct FnSpan {
    pub(super) name: String,
    pub(super) first: usize,
    pub(super) last: usize,
}

impl FnSpan {
    /// Its length in lines, both ends counted.
    pub(super) fn lines(&self) -> usize {
        self.last + 1 - self.first
    }
}

/// Every function with a body in `file` (free, in an `impl`, a trait's defaults, nested), in
/// source order.
pub(super) fn fn_spans(file: &syn::File) -> Vec<FnSpan> {
    let mut found = FnSpans::default();
    found.visit_file(file);
    found.spans
}

/// Collects [`FnSpan`]s.
#[derive(Default)]
struct FnSpans {
    spans: Vec<FnSpan>,
}

impl FnSpans {
    fn push(&mut self, sig: &syn::Signature, body: &syn::Block) {
        self.spans.push(FnSpan {
            name: sig.ident.to_string(),
            first: sig.fn_token.span().start().line,
            last: body.brace_token.span.close().start().line,
        });
    }
}

impl<'ast> Visit<'ast> for FnSpans {
    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        self.push(&f.sig, &f.block);
        visit::visit_item_fn(self, f);
    }

    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        self.push(&f.sig, &f.block);
        visit::visit_impl_item_fn(self, f);
    }

    fn visit_trait_item_fn(&mut self, f: &'ast syn::TraitItemFn) {
        if let Some(body) = &f.default {
            self.push(&f.sig, body);
        }
        visit::visit_trait_item_fn(self, f);
    }
}

/// Functions of `source` over [`MAX_FN_LINES`], generated files and [`LONG_FNS_ALLOWED`] aside.
pub(super) fn check_fn_length(source: &Source) -> Vec<Violation> {
    long_fns(source, LONG_FNS_ALLOWED)
}

/// [`check_fn_length`] with the allow-list `allowed`.
pub(super) fn long_fns(source: &Source, allowed: &[(&str, &str, &str)]) -> Vec<Violation> {
    if GENERATED.iter().any(|g| glob_match(g, &source.path)) {
        return Vec::new();
    }
    source
        .fns
        .iter()
        .filter(|f| {
            f.lines() > MAX_FN_LINES
                && !allowed
                    .iter()
                    .any(|(p, n, _)| *p == source.path && *n == f.name)
        })
        .map(|f| {
            Violation::new(
                &source.path,
                f.first,
                format!(
                    "fn `{}` is {} lines, over the limit of {MAX_FN_LINES}: split it into steps",
                    f.name,
                    f.lines()
                ),
            )
        })
        .collect()
}

/// Entries of [`LONG_FNS_ALLOWED`] that name no function over the limit any more (split, renamed
/// or gone): the list must not outlive its debts.
pub(super) fn check_stale_allowances(sources: &[Source]) -> Vec<Violation> {
    stale_allowances(sources, LONG_FNS_ALLOWED)
}

/// [`check_stale_allowances`] of the allow-list `allowed`.
pub(super) fn stale_allowances(
    sources: &[Source],
    allowed: &[(&str, &str, &str)],
) -> Vec<Violation> {
    allowed
        .iter()
        .filter(|(path, name, _)| {
            !sources.iter().any(|s| {
                s.path == *path
                    && s.fns
                        .iter()
                        .any(|f| f.name == *name && f.lines() > MAX_FN_LINES)
            })
        })
        .map(|(path, name, _)| {
            Violation::new(
                "xtask/src/tidy/fn_length.rs",
                1,
                format!(
                    "LONG_FNS_ALLOWED names `{path}` fn `{name}`, which is not over \
                     {MAX_FN_LINES} lines: remove the entry"
                ),
            )
        })
        .collect()
}
