//! The manifest checks of `tidy`: the workspace dependency graph read from `cargo metadata`,
//! and the workspace lints reaching each library crate.

use std::collections::BTreeSet;

use serde_json::Value;

use super::{CrateRule, Violation, CRATES};

/// A library crate's manifest says `[lints] workspace = true`, so `missing_docs` reaches it.
pub(super) fn check_lints_inherited(manifest: &str, text: &str) -> Option<Violation> {
    let squeezed = |line: &str| line.split_whitespace().collect::<String>();
    let mut in_lints = false;
    for line in text.lines() {
        let line = squeezed(line.split('#').next().unwrap_or(""));
        if line.starts_with('[') {
            in_lints = line == "[lints]";
        } else if (in_lints && line == "workspace=true")
            || line == "lints.workspace=true"
            || line == "lints={workspace=true}"
        {
            return None;
        }
    }
    Some(Violation::new(
        manifest,
        1,
        "no `[lints] workspace = true`: the workspace's `missing_docs` lint does not reach this crate",
    ))
}

/// The workspace members of `cargo metadata` output: (directory relative to the root, rule).
pub(super) fn workspace_crates(metadata: &Value) -> Vec<(String, Option<&'static CrateRule>)> {
    members(metadata)
        .into_iter()
        .map(|package| {
            let name = package["name"].as_str().unwrap_or("");
            let manifest = relative(metadata, package["manifest_path"].as_str().unwrap_or(""));
            let dir = manifest
                .rsplit_once('/')
                .map_or(String::new(), |(dir, _)| dir.to_string());
            (dir, CRATES.iter().find(|rule| rule.name == name))
        })
        .collect()
}

fn members(metadata: &Value) -> Vec<&Value> {
    let ids: BTreeSet<&str> = metadata["workspace_members"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    metadata["packages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["id"].as_str().is_some_and(|id| ids.contains(id)))
        .collect()
}

/// `path` relative to the metadata's workspace root, with `/` separators.
fn relative(metadata: &Value, path: &str) -> String {
    let root = metadata["workspace_root"].as_str().unwrap_or("");
    let path = path.replace('\\', "/");
    let root = root.replace('\\', "/");
    path.strip_prefix(&root)
        .map(|p| p.trim_start_matches('/').to_string())
        .unwrap_or(path)
}

/// Every workspace crate is declared in [`CRATES`] and uses only the workspace crates allowed to
/// it (normal, build and dev dependencies alike). `read` gives a manifest's text by relative path
/// (for line numbers).
pub(super) fn check_dependencies(
    metadata: &Value,
    read: &dyn Fn(&str) -> Option<String>,
) -> Vec<Violation> {
    let packages = members(metadata);
    let names: BTreeSet<&str> = packages.iter().filter_map(|p| p["name"].as_str()).collect();
    let mut violations = Vec::new();
    for package in &packages {
        let name = package["name"].as_str().unwrap_or("?");
        let manifest = relative(metadata, package["manifest_path"].as_str().unwrap_or("?"));
        let Some(rule) = CRATES.iter().find(|rule| rule.name == name) else {
            violations.push(Violation::new(
                &manifest,
                1,
                format!(
                    "workspace crate `{name}` is not declared in tidy's CRATES table \
                     (xtask/src/tidy.rs): add it with the workspace crates it may depend on"
                ),
            ));
            continue;
        };
        let Some(allowed) = rule.may_use else {
            continue;
        };
        let text = read(&manifest).unwrap_or_default();
        for dep in package["dependencies"].as_array().into_iter().flatten() {
            let dep_name = dep["name"].as_str().unwrap_or("");
            // Ours: a workspace crate by name, taken by path (a registry crate may share the name).
            if !dep["source"].is_null() || !names.contains(dep_name) || dep_name == name {
                continue;
            }
            if allowed.contains(&dep_name) {
                continue;
            }
            let kind = match dep["kind"].as_str() {
                Some("dev") => "dev-dependency",
                Some("build") => "build-dependency",
                _ => "dependency",
            };
            let may = if allowed.is_empty() {
                "none of the workspace crates".to_string()
            } else {
                allowed.join(", ")
            };
            violations.push(Violation::new(
                &manifest,
                dependency_line(&text, dep_name),
                format!("`{name}` has `{dep_name}` as a {kind}, which points upward; it may use only: {may}"),
            ));
        }
    }
    violations
}

/// The first manifest line naming dependency `name` (1 when none does).
pub(super) fn dependency_line(manifest: &str, name: &str) -> usize {
    manifest
        .lines()
        .position(|line| {
            let line = line.trim_start();
            let names_key = line
                .strip_prefix(name)
                .is_some_and(|rest| rest.starts_with([' ', '=', '.']) || rest.is_empty());
            let names_table = line.starts_with('[') && line.contains(&format!(".{name}]"));
            names_key || names_table || line.contains(&format!("package = \"{name}\""))
        })
        .map_or(1, |i| i + 1)
}
