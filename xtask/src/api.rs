//! The public API of `engine`, listed from rustdoc's JSON output and checked (part of `tidy`):
//!
//! - no public item of `engine` names a type of our internal crates ([`INTERNAL`]) that `engine`
//!   does not re-export on purpose (a `pub use` at some public path), so a library user never
//!   needs those crates to name what `engine` hands them;
//! - the listing equals the committed [`LISTING`], so a change to the API shows in review
//!   (`cargo xtask api --bless` rewrites it).
//!
//! The JSON comes from stable rustdoc's unstable `--output-format json` (allowed by
//! `RUSTC_BOOTSTRAP=1`), built in a target directory of its own (`target/api`) so the normal
//! build keeps its fingerprints. The listing has one line per item reachable from the crate root:
//! `path: kind signature`, every type at its full path (`ckptfmt::ids::BlockId`, `engine::SeqId`).
//! Auto-trait and blanket impls are left out (they follow from the rest and vary by toolchain).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::Path;
use std::process::Command;

use clap::Args;
use serde_json::Value;

mod render;

use render::{field, id_key, list, variant, Named, Names, Render};

use crate::tidy::Violation;

/// The crate whose API is listed.
const CRATE: &str = "engine";

/// The committed listing, relative to the workspace root.
const LISTING: &str = "engine/api.txt";

/// Workspace crates whose types `engine` may hand out only re-exported (names as rustdoc writes
/// crate names: `_` for `-`).
const INTERNAL: &[&str] = &["ckptfmt", "kvstore", "ggml_sys"];

/// Trait impls left out of the listing: compiler plumbing of `derive(PartialEq)`.
const HIDDEN_TRAITS: &[&str] = &["StructuralPartialEq", "StructuralEq"];

/// The listing's opening lines.
const HEADER: &str = "\
# The public API of `engine`: one line per item reachable from the crate root, every type at its
# full path. Written by `cargo xtask api --bless` from rustdoc's JSON output; `cargo xtask tidy`
# fails when it is out of date, or when an item names a type of ckptfmt, kvstore or ggml-sys that
# engine does not re-export.
";

/// The command line of `cargo xtask api`.
#[derive(Args, Clone, Debug)]
pub struct ApiArgs {
    /// Rewrite the committed listing first.
    #[arg(long)]
    pub bless: bool,
}

/// `cargo xtask api [--bless]`: the checks of `tidy` on the API alone; `--bless` first rewrites
/// the committed listing.
pub fn api(root: &Path, args: &ApiArgs) -> Result<(), String> {
    let bless = args.bless;
    let entries = entries(&rustdoc_json(root)?)?;
    if bless {
        std::fs::write(root.join(LISTING), listing(&entries))
            .map_err(|e| format!("could not write {LISTING}: {e}"))?;
        eprintln!("api: wrote {LISTING}");
    }
    let violations = violations(root, &entries)?;
    for v in &violations {
        println!("{v}");
    }
    match violations.len() {
        0 => {
            eprintln!("api: no problems");
            Ok(())
        }
        n => Err(format!("the API check found {n} problem(s)")),
    }
}

/// The API checks for `tidy`.
pub fn check(root: &Path) -> Result<Vec<Violation>, String> {
    let entries = entries(&rustdoc_json(root)?)?;
    violations(root, &entries)
}

/// Leaks of internal types, and a listing that differs from the committed one.
fn violations(root: &Path, entries: &[Entry]) -> Result<Vec<Violation>, String> {
    let mut out: Vec<Violation> = leaks(entries, INTERNAL)
        .into_iter()
        .map(|leak| leak.violation())
        .collect();
    let current = listing(entries);
    let committed = match std::fs::read_to_string(root.join(LISTING)) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(format!("could not read {LISTING}: {e}")),
    };
    if let Some((line, diff)) = difference(&committed, &current) {
        out.push(Violation::new(
            LISTING,
            line,
            format!(
                "the public API of `{CRATE}` differs from this listing (- listed, + now):\n{diff}\n\
                 if the change is intended (or comes from a new toolchain's rustdoc), run \
                 `cargo xtask api --bless` and commit {LISTING}"
            ),
        ));
    }
    Ok(out)
}

/// Builds the crate's rustdoc JSON (in `<target>/api`) and parses it.
fn rustdoc_json(root: &Path) -> Result<Value, String> {
    let target = crate::target_dir_in(root, std::env::var_os("CARGO_TARGET_DIR")).join("api");
    eprintln!("api: rustdoc JSON of `{CRATE}` (in {})", target.display());
    let output = Command::new(crate::cargo())
        .args([
            "rustdoc",
            "--quiet",
            "--package",
            CRATE,
            "--lib",
            "--target-dir",
        ])
        .arg(&target)
        .args(["--", "-Z", "unstable-options", "--output-format", "json"])
        // Stable rustdoc's JSON output is unstable; this lets stable toolchains write it.
        .env("RUSTC_BOOTSTRAP", "1")
        // Nothing links: ggml-sys skips compiling ggml's C sources.
        .env("GGML_SYS_DOC_ONLY", "1")
        .current_dir(root)
        .output()
        .map_err(|e| format!("could not run cargo rustdoc: {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "`cargo rustdoc` (for the API listing) failed:\n{}",
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    let path = target
        .join("doc")
        .join(format!("{}.json", CRATE.replace('-', "_")));
    let text = std::fs::read_to_string(&path)
        .map_err(|e| format!("could not read {}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{} is not JSON: {e}", path.display()))
}

// ---------------------------------------------------------------------------------------------
// The listing.
// ---------------------------------------------------------------------------------------------

/// One line of the listing, with what the checks need to know about it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    /// The public path (`engine::Context::block_ids`).
    path: String,
    /// Kind and signature (`fn(&self, seq: engine::SeqId) -> ...`).
    text: String,
    /// Every path the text names.
    named: Vec<Named>,
    /// For a re-export of another crate's item: that item.
    reexport: Option<Named>,
    /// Where the item is defined (file relative to the root, line), when rustdoc says.
    at: Option<(String, usize)>,
}

impl Entry {
    fn line(&self) -> String {
        format!("{}: {}", self.path, self.text)
    }
}

/// The listing file: the header, then the sorted lines.
fn listing(entries: &[Entry]) -> String {
    let lines: BTreeSet<String> = entries.iter().map(Entry::line).collect();
    let mut out = HEADER.to_string();
    for line in lines {
        out.push_str(&line);
        out.push('\n');
    }
    out
}

/// What a public path of the crate is bound to.
enum Binding {
    /// An item of the crate (by id).
    Local(String),
    /// A re-export of another crate's item (by id, if rustdoc resolved it; as written; and
    /// where the re-export is).
    Foreign {
        id: Value,
        source: String,
        at: Option<(String, usize)>,
    },
}

/// The listing's entries from rustdoc's JSON; an error names the JSON's `format_version`.
fn entries(doc: &Value) -> Result<Vec<Entry>, String> {
    walk(doc).map_err(|e| {
        format!(
            "could not read rustdoc's JSON output (format_version {}): {e}",
            doc["format_version"]
        )
    })
}

fn walk(doc: &Value) -> Result<Vec<Entry>, String> {
    let index = &doc["index"];
    if !index.is_object() {
        return Err("no `index` object".to_string());
    }
    let root = id_key(&doc["root"]).ok_or("no `root` id")?;
    let krate = index[&root]["name"]
        .as_str()
        .ok_or("the root module is not in the index")?;

    // Every public path, breadth first from the root (so a shorter path is met first).
    let mut bindings: Vec<(String, Binding)> = Vec::new();
    let mut queue = VecDeque::from([(root, krate.to_string())]);
    let mut modules_seen = BTreeSet::new();
    while let Some((module, path)) = queue.pop_front() {
        if !modules_seen.insert(module.clone()) {
            continue;
        }
        let (_, inner) = variant(&index[&module]["inner"])?;
        for id in list(&inner["items"]) {
            let key = id_key(id).ok_or("a module item without an id")?;
            let item = &index[&key];
            let (kind, inner) = variant(&item["inner"])?;
            let is_local = |key: &str| index[key]["crate_id"] == 0;
            let is_module = |key: &str| index[key]["inner"]["module"].is_object();
            if kind == "use" || kind == "import" {
                let target = id_key(&inner["id"]);
                let source = inner["source"].as_str().unwrap_or("?").to_string();
                let glob = inner["is_glob"] == true || inner["glob"] == true;
                match target {
                    Some(t) if glob && is_local(&t) && is_module(&t) => {
                        queue.push_back((t, path.clone()));
                    }
                    Some(t) if !glob && is_local(&t) => {
                        let name = inner["name"].as_str().ok_or("a `use` without a name")?;
                        let child = format!("{path}::{name}");
                        if is_module(&t) {
                            queue.push_back((t.clone(), child.clone()));
                        }
                        bindings.push((child, Binding::Local(t)));
                    }
                    _ => {
                        let child = match inner["name"].as_str() {
                            Some(name) if !glob => format!("{path}::{name}"),
                            _ => format!("{path}::*"),
                        };
                        let id = inner["id"].clone();
                        let at = span(item);
                        bindings.push((child, Binding::Foreign { id, source, at }));
                    }
                }
                continue;
            }
            let Some(name) = item["name"].as_str() else {
                continue;
            };
            let child = format!("{path}::{name}");
            if !is_local(&key) {
                // Another crate's item inlined here (`#[doc(inline)] pub use`).
                let (source, at) = (child.clone(), span(item));
                let id = id.clone();
                bindings.push((child, Binding::Foreign { id, source, at }));
                continue;
            }
            if kind == "module" {
                queue.push_back((key.clone(), child.clone()));
            }
            bindings.push((child, Binding::Local(key)));
        }
    }

    // Each local item's public path: its shortest (then first in order) binding.
    let mut names = Names::new(doc, krate);
    for (path, binding) in &bindings {
        if let Binding::Local(key) = binding {
            let better = |old: &String| {
                (path.matches("::").count(), path) < (old.matches("::").count(), old)
            };
            if names.public.get(key).is_none_or(better) {
                names.public.insert(key.clone(), path.clone());
            }
        }
    }

    let mut entries = Vec::new();
    for (path, binding) in &bindings {
        match binding {
            Binding::Local(key) if names.public.get(key) == Some(path) => {
                item_entries(&names, &index[key], path, &mut entries)?;
            }
            Binding::Local(key) => entries.push(Entry {
                path: path.clone(),
                text: format!("use {}", names.public[key]),
                named: Vec::new(),
                reexport: None,
                at: None,
            }),
            Binding::Foreign { id, source, at } => {
                let target = names.resolve(id).unwrap_or_else(|| Named {
                    krate: source.split("::").next().unwrap_or("").to_string(),
                    path: source.clone(),
                });
                entries.push(Entry {
                    path: path.clone(),
                    text: format!("use {}", target.path),
                    named: Vec::new(),
                    reexport: Some(target),
                    at: at.clone(),
                });
            }
        }
    }
    Ok(entries)
}

/// The item's file and first line.
fn span(item: &Value) -> Option<(String, usize)> {
    let span = &item["span"];
    let file = span["filename"].as_str()?;
    let line = span["begin"][0].as_u64()?;
    Some((file.replace('\\', "/"), usize::try_from(line).ok()?))
}

/// The entries of one item at its public path: the item, then its fields, variants, methods
/// and trait impls.
fn item_entries(
    names: &Names,
    item: &Value,
    path: &str,
    out: &mut Vec<Entry>,
) -> Result<(), String> {
    let (kind, inner) = variant(&item["inner"])?;
    let mut r = Render::new(names);
    let text = match kind {
        "module" => "mod".to_string(),
        "function" => r.function(inner)?,
        "struct" | "union" => {
            let (params, predicates) = r.generics(&inner["generics"])?;
            let shape = match variant(&inner["kind"]) {
                Ok(("tuple", fields)) => tuple_fields(&mut r, names, fields)?,
                Ok(("plain", plain)) => {
                    let fields = field_items(names, &plain["fields"]);
                    for (name, field) in fields {
                        member(names, field, &format!("{path}::{name}"), out, |r| {
                            Ok(format!("field {}", r.ty(&field["inner"]["struct_field"])?))
                        })?;
                    }
                    stripped(&plain["has_stripped_fields"])
                }
                _ if kind == "union" => {
                    for (name, field) in field_items(names, &inner["fields"]) {
                        member(names, field, &format!("{path}::{name}"), out, |r| {
                            Ok(format!("field {}", r.ty(&field["inner"]["struct_field"])?))
                        })?;
                    }
                    stripped(&inner["has_stripped_fields"])
                }
                _ => String::new(),
            };
            format!("{kind}{params}{shape}{predicates}")
        }
        "enum" => {
            let (params, predicates) = r.generics(&inner["generics"])?;
            for id in list(&inner["variants"]) {
                let Some(v) = id_key(id).map(|k| &names_index(names)[&k]) else {
                    continue;
                };
                let name = v["name"].as_str().unwrap_or("?");
                member(names, v, &format!("{path}::{name}"), out, |r| {
                    variant_text(r, names, &v["inner"]["variant"])
                })?;
            }
            let more = stripped(&inner["has_stripped_variants"]);
            format!("enum{params}{more}{predicates}")
        }
        "trait" => {
            let (params, predicates) = r.generics(&inner["generics"])?;
            let bounds = r.bounds(&inner["bounds"])?;
            let bounds = if bounds.is_empty() {
                String::new()
            } else {
                format!(": {bounds}")
            };
            for id in list(&inner["items"]) {
                let Some(member_item) = id_key(id).map(|k| &names_index(names)[&k]) else {
                    continue;
                };
                let name = member_item["name"].as_str().unwrap_or("?");
                member(names, member_item, &format!("{path}::{name}"), out, |r| {
                    assoc_text(r, member_item)
                })?;
            }
            let unsafety = if inner["is_unsafe"] == true {
                "unsafe "
            } else {
                ""
            };
            format!("{unsafety}trait{params}{bounds}{predicates}")
        }
        "type_alias" | "typedef" => {
            let (params, predicates) = r.generics(&inner["generics"])?;
            format!("type{params} = {}{predicates}", r.ty(&inner["type"])?)
        }
        "constant" => format!("const {}", r.ty(&inner["type"])?),
        "static" => {
            let mutable = if inner["is_mutable"] == true {
                " mut"
            } else {
                ""
            };
            format!("static{mutable} {}", r.ty(&inner["type"])?)
        }
        "macro" => "macro".to_string(),
        other => other.replace('_', " "),
    };
    out.push(Entry {
        path: path.to_string(),
        text,
        named: r.named,
        reexport: None,
        at: span(item),
    });
    impl_entries(names, item, inner, path, out)
}

/// The index of the JSON `names` reads.
fn names_index<'a>(names: &Names<'a>) -> &'a Value {
    &names.doc()["index"]
}

/// ` { .. }` when fields or variants are hidden, else nothing.
fn stripped(flag: &Value) -> String {
    if *flag == true {
        " { .. }".to_string()
    } else {
        String::new()
    }
}

/// The named field items of a list of field ids.
fn field_items<'a>(names: &Names<'a>, ids: &Value) -> Vec<(&'a str, &'a Value)> {
    let index = names_index(names);
    list(ids)
        .filter_map(id_key)
        .map(|k| &index[&k])
        .filter_map(|f| Some((f["name"].as_str()?, f)))
        .collect()
}

/// `(A, _)` for tuple fields, `_` for a hidden one.
fn tuple_fields(r: &mut Render, names: &Names, fields: &Value) -> Result<String, String> {
    let index = names_index(names);
    let mut parts = Vec::new();
    for id in list(fields) {
        match id_key(id) {
            Some(k) if index[&k].is_object() => {
                parts.push(r.ty(&index[&k]["inner"]["struct_field"])?);
            }
            _ => parts.push("_".to_string()),
        }
    }
    Ok(format!("({})", parts.join(", ")))
}

/// A variant: `variant`, `variant(A, B)`, `variant { a: A }`, with ` = discriminant`.
fn variant_text(r: &mut Render, names: &Names, v: &Value) -> Result<String, String> {
    let mut out = "variant".to_string();
    match variant(&v["kind"]) {
        Ok(("tuple", fields)) => out.push_str(&tuple_fields(r, names, fields)?),
        Ok(("struct", s)) => {
            let mut parts = Vec::new();
            for (name, field) in field_items(names, &s["fields"]) {
                parts.push(format!(
                    "{name}: {}",
                    r.ty(&field["inner"]["struct_field"])?
                ));
            }
            if s["has_stripped_fields"] == true {
                parts.push("..".to_string());
            }
            out.push_str(&format!(" {{ {} }}", parts.join(", ")));
        }
        _ => {}
    }
    if let Some(expr) = v["discriminant"]["expr"].as_str() {
        out.push_str(&format!(" = {expr}"));
    }
    Ok(out)
}

/// A trait's or an impl's associated item: `fn ..`, `type: Bounds = T`, `const T`.
fn assoc_text(r: &mut Render, item: &Value) -> Result<String, String> {
    let (kind, inner) = variant(&item["inner"])?;
    Ok(match kind {
        "function" | "method" => r.function(inner)?,
        "assoc_type" => {
            let (params, predicates) = r.generics(&inner["generics"])?;
            let bounds = r.bounds(&inner["bounds"])?;
            let mut out = format!("type{params}");
            if !bounds.is_empty() {
                out.push_str(&format!(": {bounds}"));
            }
            let ty = field(inner, &["type", "default"]);
            if !ty.is_null() {
                out.push_str(&format!(" = {}", r.ty(ty)?));
            }
            out + &predicates
        }
        "assoc_const" => format!("const {}", r.ty(&inner["type"])?),
        other => other.replace('_', " "),
    })
}

/// Pushes the entry of a field, variant or associated item, if it is public.
fn member(
    names: &Names,
    item: &Value,
    path: &str,
    out: &mut Vec<Entry>,
    text: impl FnOnce(&mut Render) -> Result<String, String>,
) -> Result<(), String> {
    if !matches!(item["visibility"].as_str(), Some("public" | "default")) {
        return Ok(());
    }
    let mut r = Render::new(names);
    let text = text(&mut r)?;
    out.push(Entry {
        path: path.to_string(),
        text,
        named: r.named,
        reexport: None,
        at: span(item),
    });
    Ok(())
}

/// A type's inherent methods (and associated items), and its trait impls other than auto-trait,
/// blanket and [`HIDDEN_TRAITS`] ones.
fn impl_entries(
    names: &Names,
    item: &Value,
    inner: &Value,
    path: &str,
    out: &mut Vec<Entry>,
) -> Result<(), String> {
    let index = names_index(names);
    for id in list(&inner["impls"]) {
        let Some(imp) = id_key(id).map(|k| &index[&k]) else {
            continue;
        };
        let Ok(("impl", i)) = variant(&imp["inner"]) else {
            continue;
        };
        if i["is_synthetic"] == true || i["synthetic"] == true || !i["blanket_impl"].is_null() {
            continue;
        }
        let mut r = Render::new(names);
        let (params, predicates) = r.generics(&i["generics"])?;
        let for_self = matches!(variant(&i["for"]), Ok(("resolved_path", p))
            if p["id"] == item["id"] && p["args"].is_null());
        if i["trait"].is_null() {
            // Inherent: each public associated item at `Type::name`.
            let context = if params.is_empty() && predicates.is_empty() && for_self {
                String::new()
            } else {
                format!(" (in impl{params} {}{predicates})", r.ty(&i["for"])?)
            };
            for id in list(&i["items"]) {
                let Some(a) = id_key(id).map(|k| &index[&k]) else {
                    continue;
                };
                let name = a["name"].as_str().unwrap_or("?");
                member(names, a, &format!("{path}::{name}"), out, |m| {
                    let text = assoc_text(m, a)?;
                    m.named.extend(r.named.iter().cloned());
                    Ok(text + &context)
                })?;
            }
            continue;
        }
        let trait_name = i["trait"]["path"]
            .as_str()
            .or(i["trait"]["name"].as_str())
            .unwrap_or("");
        let last = trait_name.rsplit("::").next().unwrap_or("");
        if HIDDEN_TRAITS.contains(&last) {
            continue;
        }
        let negative = if i["is_negative"] == true || i["negative"] == true {
            "!"
        } else {
            ""
        };
        let tr = r.path(&i["trait"])?;
        let target = if for_self {
            String::new()
        } else {
            format!(" for {}", r.ty(&i["for"])?)
        };
        out.push(Entry {
            path: path.to_string(),
            text: format!("impl{params} {negative}{tr}{target}{predicates}"),
            named: r.named,
            reexport: None,
            at: span(imp),
        });
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The checks.
// ---------------------------------------------------------------------------------------------

/// An item that names an internal crate's type the crate does not re-export.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Leak {
    item: String,
    names: String,
    at: Option<(String, usize)>,
}

impl Leak {
    fn violation(&self) -> Violation {
        let (file, line) = self
            .at
            .clone()
            .unwrap_or_else(|| (format!("{CRATE}/src/lib.rs"), 1));
        Violation::new(
            &file,
            line,
            format!(
                "`{}` names `{}`, which `{CRATE}` does not re-export: re-export it on purpose \
                 (`pub use`, with a doc line on why) or wrap it",
                self.item, self.names
            ),
        )
    }
}

/// Every item naming a path of a crate in `internal` that no re-export of the listing covers
/// (the item itself, or a module above it).
fn leaks(entries: &[Entry], internal: &[&str]) -> Vec<Leak> {
    let reexported: Vec<&str> = entries
        .iter()
        .filter_map(|e| e.reexport.as_ref())
        .map(|named| named.path.as_str())
        .collect();
    let covered = |path: &str| {
        reexported.iter().any(|r| {
            path == *r
                || path
                    .strip_prefix(r)
                    .is_some_and(|rest| rest.starts_with("::"))
        })
    };
    let mut out = BTreeSet::new();
    for entry in entries {
        for named in &entry.named {
            if internal.contains(&named.krate.as_str()) && !covered(&named.path) {
                out.insert(Leak {
                    item: entry.path.clone(),
                    names: named.path.clone(),
                    at: entry.at.clone(),
                });
            }
        }
    }
    out.into_iter().collect()
}

/// Where two listings differ: the first differing line (of `committed`) and a short diff
/// (`- line` only in the committed listing, `+ line` only in the current one); `None` when equal.
fn difference(committed: &str, current: &str) -> Option<(usize, String)> {
    if committed == current {
        return None;
    }
    let first = committed
        .lines()
        .zip(current.lines())
        .position(|(a, b)| a != b)
        .unwrap_or_else(|| committed.lines().count().min(current.lines().count()))
        + 1;
    let old: BTreeSet<&str> = committed.lines().collect();
    let new: BTreeSet<&str> = current.lines().collect();
    let mut changes: BTreeMap<&str, char> = BTreeMap::new();
    changes.extend(old.difference(&new).map(|l| (*l, '-')));
    changes.extend(new.difference(&old).map(|l| (*l, '+')));
    const SHOWN: usize = 20;
    let mut diff: Vec<String> = changes
        .iter()
        .take(SHOWN)
        .map(|(line, sign)| format!("  {sign} {line}"))
        .collect();
    if changes.len() > SHOWN {
        diff.push(format!("  … and {} more", changes.len() - SHOWN));
    }
    if changes.is_empty() {
        diff.push("  (the same lines, in another order or repeated)".to_string());
    }
    Some((first, diff.join("\n")))
}

#[cfg(test)]
mod tests;
