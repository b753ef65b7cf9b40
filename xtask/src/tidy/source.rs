//! One parsed `.rs` file for `tidy`: its tokens (comments gone, strings and characters as
//! literals) and the lines of its test-only items; token helpers for the checks.

use proc_macro2::{TokenStream, TokenTree};
use syn::spanned::Spanned;
use syn::visit::{self, Visit};

use super::fn_length::{fn_spans, FnSpan};
use super::{join, normalize, Violation};

/// One `.rs` file: its path relative to the workspace root, text, tokens, and the line ranges
/// of test-only items (`#[cfg(test)]`, `#[test]`) and its functions.
pub(super) struct Source {
    pub(super) path: String,
    pub(super) text: String,
    pub(super) tokens: TokenStream,
    pub(super) fns: Vec<FnSpan>,
    test_lines: Vec<(usize, usize)>,
}

impl Source {
    pub(super) fn parse(path: &str, text: &str) -> Result<Self, Violation> {
        let tokens: TokenStream = strip_shebang(text)
            .parse()
            .map_err(|e| Violation::new(path, 1, format!("cannot lex as Rust: {e}")))?;
        let file: syn::File = syn::parse2(tokens.clone()).map_err(|e| {
            Violation::new(
                path,
                e.span().start().line,
                format!("cannot parse as Rust: {e}"),
            )
        })?;
        let mut tests = TestItems::default();
        tests.visit_file(&file);
        Ok(Source {
            path: path.to_string(),
            text: text.to_string(),
            tokens,
            fns: fn_spans(&file),
            test_lines: tests.ranges,
        })
    }

    pub(super) fn in_test_code(&self, line: usize) -> bool {
        self.test_lines.iter().any(|&(a, b)| a <= line && line <= b)
    }

    /// Files this one pulls in with `include!("path")`, relative to the workspace root.
    pub(super) fn included_files(&self) -> Vec<String> {
        let dir = self.path.rsplit_once('/').map_or("", |(dir, _)| dir);
        let mut found = Vec::new();
        each_level(&self.tokens, &mut |trees| {
            for (i, tt) in trees.iter().enumerate() {
                if is_ident(tt, "include") && is_punct(trees.get(i + 1), '!') {
                    let Some(TokenTree::Group(args)) = trees.get(i + 2) else {
                        continue;
                    };
                    if let Ok(lit) = syn::parse2::<syn::LitStr>(args.stream()) {
                        found.push(normalize(&join(dir, &lit.value())));
                    }
                }
            }
        });
        found
    }
}

/// A shebang line is not Rust; blank it so line numbers stay right.
fn strip_shebang(text: &str) -> std::borrow::Cow<'_, str> {
    if text.starts_with("#!") && !text.starts_with("#![") {
        let end = text.find('\n').unwrap_or(text.len());
        std::borrow::Cow::Owned(text[end..].to_string())
    } else {
        std::borrow::Cow::Borrowed(text)
    }
}

/// Finds the line ranges of test-only items.
#[derive(Default)]
struct TestItems {
    ranges: Vec<(usize, usize)>,
}

impl TestItems {
    /// Records `node` when `attrs` make it test-only; says whether it did.
    fn skip(&mut self, attrs: &[syn::Attribute], node: &dyn Spanned) -> bool {
        if attrs.iter().any(is_test_only) {
            let span = node.span();
            self.ranges.push((span.start().line, span.end().line));
            true
        } else {
            false
        }
    }
}

impl<'ast> Visit<'ast> for TestItems {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        if !self.skip(item_attrs(item), item) {
            visit::visit_item(self, item);
        }
    }

    fn visit_impl_item(&mut self, item: &'ast syn::ImplItem) {
        let attrs: &[syn::Attribute] = match item {
            syn::ImplItem::Const(i) => &i.attrs,
            syn::ImplItem::Fn(i) => &i.attrs,
            syn::ImplItem::Type(i) => &i.attrs,
            syn::ImplItem::Macro(i) => &i.attrs,
            _ => &[],
        };
        if !self.skip(attrs, item) {
            visit::visit_impl_item(self, item);
        }
    }

    fn visit_trait_item(&mut self, item: &'ast syn::TraitItem) {
        let attrs: &[syn::Attribute] = match item {
            syn::TraitItem::Const(i) => &i.attrs,
            syn::TraitItem::Fn(i) => &i.attrs,
            syn::TraitItem::Type(i) => &i.attrs,
            syn::TraitItem::Macro(i) => &i.attrs,
            _ => &[],
        };
        if !self.skip(attrs, item) {
            visit::visit_trait_item(self, item);
        }
    }
}

fn item_attrs(item: &syn::Item) -> &[syn::Attribute] {
    use syn::Item;
    match item {
        Item::Const(i) => &i.attrs,
        Item::Enum(i) => &i.attrs,
        Item::ExternCrate(i) => &i.attrs,
        Item::Fn(i) => &i.attrs,
        Item::ForeignMod(i) => &i.attrs,
        Item::Impl(i) => &i.attrs,
        Item::Macro(i) => &i.attrs,
        Item::Mod(i) => &i.attrs,
        Item::Static(i) => &i.attrs,
        Item::Struct(i) => &i.attrs,
        Item::Trait(i) => &i.attrs,
        Item::TraitAlias(i) => &i.attrs,
        Item::Type(i) => &i.attrs,
        Item::Union(i) => &i.attrs,
        Item::Use(i) => &i.attrs,
        _ => &[],
    }
}

/// `#[test]`, `#[cfg(test)]` or `#[cfg(all(.., test, ..))]`.
fn is_test_only(attr: &syn::Attribute) -> bool {
    if attr.path().is_ident("test") {
        return true;
    }
    if !attr.path().is_ident("cfg") {
        return false;
    }
    let Ok(list) = attr.meta.require_list() else {
        return false;
    };
    let trees: Vec<TokenTree> = list.tokens.clone().into_iter().collect();
    match trees.as_slice() {
        [t] => is_ident(t, "test"),
        [all, TokenTree::Group(g)] if is_ident(all, "all") => {
            g.stream().into_iter().any(|t| is_ident(&t, "test"))
        }
        _ => false,
    }
}

/// Calls `f` with the trees of `stream`, then of every group in it, depth first.
pub(super) fn each_level(stream: &TokenStream, f: &mut dyn FnMut(&[TokenTree])) {
    let trees: Vec<TokenTree> = stream.clone().into_iter().collect();
    f(&trees);
    for tree in &trees {
        if let TokenTree::Group(group) = tree {
            each_level(&group.stream(), f);
        }
    }
}

pub(super) fn is_ident(tree: &TokenTree, name: &str) -> bool {
    matches!(tree, TokenTree::Ident(i) if i == name)
}

pub(super) fn is_punct(tree: Option<&TokenTree>, ch: char) -> bool {
    matches!(tree, Some(TokenTree::Punct(p)) if p.as_char() == ch)
}

pub(super) fn line_of(tree: &TokenTree) -> usize {
    tree.span().start().line
}
