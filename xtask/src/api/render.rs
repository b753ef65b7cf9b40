//! Types, bounds, generics and signatures of rustdoc's JSON written as short Rust-like text for
//! the API listing, every path shown in full and collected on the way (for the re-export check).
//!
//! The JSON's format changes between toolchains, so field names of older formats are accepted
//! where they are known (`name` for `path`, `decl` for `sig`, `const_` for `is_const`), and a
//! type of an unknown kind is an error rather than a guess: a type left out could hide a leak.

use std::collections::BTreeMap;

use serde_json::Value;

/// A path named by a line of the listing: the crate it belongs to and its full path.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Named {
    pub(super) krate: String,
    pub(super) path: String,
}

/// Resolves item ids to full paths: the documented crate's items at their public path, every
/// other item at the path rustdoc records for it (`paths`).
pub(super) struct Names<'a> {
    doc: &'a Value,
    /// The documented crate's name.
    pub(super) local: String,
    /// The documented crate's reachable items: id → public path.
    pub(super) public: BTreeMap<String, String>,
}

impl<'a> Names<'a> {
    pub(super) fn new(doc: &'a Value, local: &str) -> Self {
        Names {
            doc,
            local: local.to_string(),
            public: BTreeMap::new(),
        }
    }

    /// The crate and full path of the item `id`, if rustdoc knows it.
    pub(super) fn resolve(&self, id: &Value) -> Option<Named> {
        let key = id_key(id)?;
        if let Some(path) = self.public.get(&key) {
            return Some(Named {
                krate: self.local.clone(),
                path: path.clone(),
            });
        }
        let summary = self.doc["paths"].get(&key)?;
        let segments: Vec<&str> = list(&summary["path"]).filter_map(Value::as_str).collect();
        if segments.is_empty() {
            return None;
        }
        Some(Named {
            krate: self.crate_name(&summary["crate_id"]),
            path: display_path(&segments),
        })
    }

    /// The JSON it reads.
    pub(super) fn doc(&self) -> &'a Value {
        self.doc
    }

    /// The name of crate `crate_id` (0 is the documented crate).
    pub(super) fn crate_name(&self, crate_id: &Value) -> String {
        match id_key(crate_id).as_deref() {
            Some("0") => self.local.clone(),
            Some(key) => self.doc["external_crates"][key]["name"]
                .as_str()
                .unwrap_or("?")
                .to_string(),
            None => "?".to_string(),
        }
    }
}

/// A path joined with `::`; `core` and `alloc` are shown as `std`, which re-exports both (so the
/// listing reads as users write it, and does not move when std moves an item between them).
pub(super) fn display_path(segments: &[&str]) -> String {
    let mut out = Vec::with_capacity(segments.len());
    for (i, segment) in segments.iter().enumerate() {
        if i == 0 && matches!(*segment, "core" | "alloc") {
            out.push("std");
        } else {
            out.push(segment);
        }
    }
    out.join("::")
}

/// An id as an object key: ids are numbers in recent formats, strings in older ones.
pub(super) fn id_key(id: &Value) -> Option<String> {
    match id {
        Value::Number(n) => Some(n.to_string()),
        Value::String(s) => Some(s.clone()),
        _ => None,
    }
}

/// The elements of a JSON array (none for anything else).
pub(super) fn list(value: &Value) -> impl Iterator<Item = &Value> {
    value.as_array().into_iter().flatten()
}

/// An externally tagged enum value: `"unit"` or `{"variant": value}`.
pub(super) fn variant(value: &Value) -> Result<(&str, &Value), String> {
    match value {
        Value::String(s) => Ok((s.as_str(), &Value::Null)),
        Value::Object(map) if map.len() == 1 => {
            let (key, inner) = map.iter().next().expect("one entry");
            Ok((key.as_str(), inner))
        }
        other => Err(format!("expected a tagged value, found {}", short(other))),
    }
}

/// A JSON value, cut short for an error message.
fn short(value: &Value) -> String {
    let text = value.to_string();
    match text.char_indices().nth(80) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text,
    }
}

/// The first of `keys` that `value` has (fields renamed between format versions).
pub(super) fn field<'v>(value: &'v Value, keys: &[&str]) -> &'v Value {
    keys.iter()
        .map(|k| &value[*k])
        .find(|v| !v.is_null())
        .unwrap_or(&Value::Null)
}

fn text<'v>(value: &'v Value, what: &str) -> Result<&'v str, String> {
    value
        .as_str()
        .ok_or_else(|| format!("expected {what} as a string, found {}", short(value)))
}

/// Writes types and signatures, collecting every path it writes.
pub(super) struct Render<'n, 'a> {
    names: &'n Names<'a>,
    pub(super) named: Vec<Named>,
}

impl<'n, 'a> Render<'n, 'a> {
    pub(super) fn new(names: &'n Names<'a>) -> Self {
        Render {
            names,
            named: Vec::new(),
        }
    }

    /// A type.
    pub(super) fn ty(&mut self, ty: &Value) -> Result<String, String> {
        let (kind, v) = variant(ty)?;
        Ok(match kind {
            "resolved_path" => self.path(v)?,
            "dyn_trait" => {
                let mut parts = Vec::new();
                for poly in list(&v["traits"]) {
                    let hrtb = self.for_params(&poly["generic_params"])?;
                    parts.push(format!("{hrtb}{}", self.path(&poly["trait"])?));
                }
                if let Some(lifetime) = v["lifetime"].as_str() {
                    parts.push(lifetime.to_string());
                }
                format!("dyn {}", parts.join(" + "))
            }
            "generic" | "primitive" => text(v, kind)?.to_string(),
            "function_pointer" => {
                let hrtb = self.for_params(&v["generic_params"])?;
                let sig = field(v, &["sig", "decl"]);
                let mut inputs = Vec::new();
                for input in list(&sig["inputs"]) {
                    inputs.push(self.ty(&input[1])?);
                }
                let head = header(&v["header"]);
                format!("{hrtb}{head}fn({}){}", inputs.join(", "), self.output(sig)?)
            }
            "tuple" => {
                let items = list(v).map(|t| self.ty(t)).collect::<Result<Vec<_>, _>>()?;
                match items.as_slice() {
                    [one] => format!("({one},)"),
                    _ => format!("({})", items.join(", ")),
                }
            }
            "slice" => format!("[{}]", self.ty(v)?),
            "array" => format!(
                "[{}; {}]",
                self.ty(&v["type"])?,
                v["len"].as_str().unwrap_or("_")
            ),
            "pat" => self.ty(&v["type"])?,
            "impl_trait" => format!("impl {}", self.bounds(v)?),
            "infer" => "_".to_string(),
            "raw_pointer" => format!(
                "*{} {}",
                if v["is_mutable"] == true {
                    "mut"
                } else {
                    "const"
                },
                self.ty(&v["type"])?
            ),
            "borrowed_ref" => {
                let lifetime = v["lifetime"]
                    .as_str()
                    .map_or(String::new(), |l| format!("{l} "));
                let mutable = if v["is_mutable"] == true { "mut " } else { "" };
                format!("&{lifetime}{mutable}{}", self.ty(&v["type"])?)
            }
            "qualified_path" => {
                let self_type = self.ty(&v["self_type"])?;
                let name = text(&v["name"], "an associated item's name")?;
                let args = self.args(&v["args"])?;
                if v["trait"].is_null() {
                    format!("{self_type}::{name}{args}")
                } else {
                    let tr = self.path(&v["trait"])?;
                    format!("<{self_type} as {tr}>::{name}{args}")
                }
            }
            other => return Err(format!("a type of unknown kind `{other}`")),
        })
    }

    /// A path (`{"path", "id", "args"}`) at its full path, with its generic arguments.
    pub(super) fn path(&mut self, p: &Value) -> Result<String, String> {
        let written = field(p, &["path", "name"]).as_str().unwrap_or("?");
        let full = match self.names.resolve(&p["id"]) {
            Some(named) => {
                let path = named.path.clone();
                self.named.push(named);
                path
            }
            None => {
                // Not resolvable: the path as written, its first segment taken for its crate.
                if let Some((krate, _)) = written.split_once("::") {
                    self.named.push(Named {
                        krate: krate.to_string(),
                        path: written.to_string(),
                    });
                }
                written.to_string()
            }
        };
        Ok(format!("{full}{}", self.args(&p["args"])?))
    }

    /// Generic arguments: `<A, B = C>`, `(A, B) -> C`, or nothing.
    fn args(&mut self, args: &Value) -> Result<String, String> {
        if args.is_null() {
            return Ok(String::new());
        }
        let (kind, v) = variant(args)?;
        match kind {
            "angle_bracketed" => {
                let mut parts = Vec::new();
                for arg in list(&v["args"]) {
                    let (kind, a) = variant(arg)?;
                    parts.push(match kind {
                        "lifetime" => text(a, "a lifetime")?.to_string(),
                        "type" => self.ty(a)?,
                        "const" => a["expr"].as_str().unwrap_or("_").to_string(),
                        _ => "_".to_string(),
                    });
                }
                for c in list(field(v, &["constraints", "bindings"])) {
                    let name = text(&c["name"], "an associated type's name")?;
                    let args = self.args(&c["args"])?;
                    let (kind, b) = variant(&c["binding"])?;
                    parts.push(match kind {
                        "equality" => format!("{name}{args} = {}", self.term(b)?),
                        _ => format!("{name}{args}: {}", self.bounds(b)?),
                    });
                }
                Ok(if parts.is_empty() {
                    String::new()
                } else {
                    format!("<{}>", parts.join(", "))
                })
            }
            "parenthesized" => {
                let inputs = list(&v["inputs"])
                    .map(|t| self.ty(t))
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(format!("({}){}", inputs.join(", "), self.output(v)?))
            }
            _ => Ok("(..)".to_string()),
        }
    }

    /// A type or a constant (the right side of `A = B`).
    fn term(&mut self, term: &Value) -> Result<String, String> {
        match variant(term)? {
            ("type", t) => self.ty(t),
            (_, c) => Ok(c["expr"].as_str().unwrap_or("_").to_string()),
        }
    }

    /// ` -> T` for an `output` that is not unit, else nothing.
    fn output(&mut self, sig: &Value) -> Result<String, String> {
        match &sig["output"] {
            Value::Null => Ok(String::new()),
            t => Ok(format!(" -> {}", self.ty(t)?)),
        }
    }

    /// Bounds joined with ` + `.
    pub(super) fn bounds(&mut self, bounds: &Value) -> Result<String, String> {
        let mut parts = Vec::new();
        for bound in list(bounds) {
            let (kind, b) = variant(bound)?;
            parts.push(match kind {
                "trait_bound" => {
                    let hrtb = self.for_params(&b["generic_params"])?;
                    let modifier = match b["modifier"].as_str() {
                        Some("maybe") => "?",
                        Some("maybe_const") => "~const ",
                        _ => "",
                    };
                    format!("{hrtb}{modifier}{}", self.path(&b["trait"])?)
                }
                "outlives" => text(b, "a lifetime")?.to_string(),
                _ => {
                    let captured: Vec<String> = list(b)
                        .map(|c| match c {
                            Value::String(s) => s.clone(),
                            other => variant(other)
                                .ok()
                                .and_then(|(_, v)| v.as_str())
                                .unwrap_or("_")
                                .to_string(),
                        })
                        .collect();
                    format!("use<{}>", captured.join(", "))
                }
            });
        }
        Ok(parts.join(" + "))
    }

    /// `for<'a> ` for higher-ranked parameters, else nothing.
    fn for_params(&mut self, params: &Value) -> Result<String, String> {
        let params = self.params(params)?;
        Ok(if params.is_empty() {
            String::new()
        } else {
            format!("for<{}> ", params.join(", "))
        })
    }

    /// Generic parameters, the synthetic ones of `impl Trait` arguments left out.
    fn params(&mut self, params: &Value) -> Result<Vec<String>, String> {
        let mut out = Vec::new();
        for param in list(params) {
            let name = text(&param["name"], "a generic parameter's name")?;
            let (kind, k) = variant(&param["kind"])?;
            match kind {
                "lifetime" => {
                    let outlives: Vec<&str> =
                        list(&k["outlives"]).filter_map(Value::as_str).collect();
                    out.push(if outlives.is_empty() {
                        name.to_string()
                    } else {
                        format!("{name}: {}", outlives.join(" + "))
                    });
                }
                "type" => {
                    if k["is_synthetic"] == true || k["synthetic"] == true {
                        continue;
                    }
                    let bounds = self.bounds(&k["bounds"])?;
                    let mut p = name.to_string();
                    if !bounds.is_empty() {
                        p = format!("{p}: {bounds}");
                    }
                    if !k["default"].is_null() {
                        p = format!("{p} = {}", self.ty(&k["default"])?);
                    }
                    out.push(p);
                }
                _ => out.push(format!("const {name}: {}", self.ty(&k["type"])?)),
            }
        }
        Ok(out)
    }

    /// Generics as `<..>` and ` where ..` (each empty when there is nothing to say).
    pub(super) fn generics(&mut self, generics: &Value) -> Result<(String, String), String> {
        let params = self.params(&generics["params"])?;
        let params = if params.is_empty() {
            String::new()
        } else {
            format!("<{}>", params.join(", "))
        };
        let mut predicates = Vec::new();
        for predicate in list(&generics["where_predicates"]) {
            let (kind, p) = variant(predicate)?;
            predicates.push(match kind {
                "bound_predicate" => {
                    let hrtb = self.for_params(&p["generic_params"])?;
                    let ty = self.ty(&p["type"])?;
                    format!("{hrtb}{ty}: {}", self.bounds(&p["bounds"])?)
                }
                "lifetime_predicate" => {
                    let outlives: Vec<&str> =
                        list(&p["outlives"]).filter_map(Value::as_str).collect();
                    let lifetime = text(&p["lifetime"], "a lifetime")?;
                    format!("{lifetime}: {}", outlives.join(" + "))
                }
                _ => format!("{} = {}", self.ty(&p["lhs"])?, self.term(&p["rhs"])?),
            });
        }
        let predicates = if predicates.is_empty() {
            String::new()
        } else {
            format!(" where {}", predicates.join(", "))
        };
        Ok((params, predicates))
    }

    /// A function item (`{"sig", "generics", "header"}`): `const unsafe fn<G>(a: A) -> R where ..`.
    pub(super) fn function(&mut self, f: &Value) -> Result<String, String> {
        let (params, predicates) = self.generics(&f["generics"])?;
        let sig = field(f, &["sig", "decl"]);
        let mut inputs = Vec::new();
        for input in list(&sig["inputs"]) {
            let name = text(&input[0], "a parameter's name")?;
            inputs.push(if name == "self" {
                self.self_param(&input[1])?
            } else {
                format!("{name}: {}", self.ty(&input[1])?)
            });
        }
        let output = self.output(sig)?;
        let head = header(&f["header"]);
        Ok(format!(
            "{head}fn{params}({}){output}{predicates}",
            inputs.join(", ")
        ))
    }

    /// `self`, `&self`, `&'a mut self`, or `self: T`.
    fn self_param(&mut self, ty: &Value) -> Result<String, String> {
        let is_self = |t: &Value| t["generic"] == "Self";
        if is_self(ty) {
            return Ok("self".to_string());
        }
        let r = &ty["borrowed_ref"];
        if r.is_object() && is_self(&r["type"]) {
            let lifetime = r["lifetime"]
                .as_str()
                .map_or(String::new(), |l| format!("{l} "));
            let mutable = if r["is_mutable"] == true { "mut " } else { "" };
            return Ok(format!("&{lifetime}{mutable}self"));
        }
        Ok(format!("self: {}", self.ty(ty)?))
    }
}

/// `const async unsafe extern "C" ` from a function header (nothing for a plain Rust fn).
fn header(header: &Value) -> String {
    let flag = |new: &str, old: &str| header[new] == true || header[old] == true;
    let mut out = String::new();
    if flag("is_const", "const_") {
        out.push_str("const ");
    }
    if flag("is_async", "async_") {
        out.push_str("async ");
    }
    if flag("is_unsafe", "unsafe_") {
        out.push_str("unsafe ");
    }
    match &header["abi"] {
        Value::Null => {}
        Value::String(abi) if abi == "Rust" => {}
        other => {
            let abi = variant(other).map_or("?", |(name, _)| name);
            out.push_str(&format!("extern \"{abi}\" "));
        }
    }
    out
}
