//! The models a router knows: the GGUF files of `--models-dir`, the sections of
//! `--models-preset` and the models in the hub's download cache, each under the name a request
//! gives in `model`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::args::RouterArgs;

/// Where a model entry comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// A file or subfolder of `--models-dir`.
    Dir,
    /// A section of `--models-preset`.
    Preset,
    /// The hub's download cache.
    Cache,
}

impl Source {
    /// The name `/models` gives the source.
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Dir => "models_dir",
            Source::Preset => "preset",
            Source::Cache => "cache",
        }
    }
}

/// One model a request can name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// The name requests give.
    pub name: String,
    /// The GGUF file (for a split model, its first part).
    pub path: PathBuf,
    /// Where the entry comes from.
    pub source: Source,
    /// Options of the model's own process, after the router's shared ones.
    pub args: Vec<String>,
    /// Hidden from `/models` (a cache entry a preset stands for), still usable by name.
    pub hidden: bool,
    /// Loaded when the router starts (`load-on-startup = true`).
    pub load_on_startup: bool,
    /// How long its process may take to finish when stopped before it is killed
    /// (`stop-timeout = SECONDS`; `None`: the router's default).
    pub stop_timeout: Option<std::time::Duration>,
}

/// Every model the router knows, by name.
pub type Catalog = BTreeMap<String, Entry>;

/// Reads the catalog from the options and the cache; a preset or folder that cannot be read is
/// an error (with the option that names it), a single unreadable entry is left out.
pub fn load(args: &RouterArgs) -> Result<Catalog, (&'static str, String)> {
    let mut out = Catalog::new();
    let cached = cache_models(&cache_dir());
    for e in &cached {
        out.insert(e.name.clone(), e.clone());
    }
    if let Some(dir) = &args.models_dir {
        for e in dir_models(dir).map_err(|e| ("--models-dir", e))? {
            out.insert(e.name.clone(), e);
        }
    }
    if let Some(preset) = &args.models_preset {
        let bad = |e: String| ("--models-preset", format!("{}: {e}", preset.display()));
        let text = std::fs::read_to_string(preset).map_err(|e| bad(e.to_string()))?;
        let (entries, hide) = preset_models(&text, &cached).map_err(bad)?;
        for name in hide {
            if let Some(e) = out.get_mut(&name) {
                e.hidden = true;
            }
        }
        for e in entries {
            out.insert(e.name.clone(), e);
        }
    }
    Ok(out)
}

/// The hub cache's folder, found as llama.cpp finds it: `LLAMA_CACHE`, `HF_HUB_CACHE`,
/// `HUGGINGFACE_HUB_CACHE`, `HF_HOME/hub`, `XDG_CACHE_HOME/huggingface/hub`, then
/// `~/.cache/huggingface/hub`.
pub fn cache_dir() -> PathBuf {
    let var = |name: &str| {
        std::env::var_os(name)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    var("LLAMA_CACHE")
        .or_else(|| var("HF_HUB_CACHE"))
        .or_else(|| var("HUGGINGFACE_HUB_CACHE"))
        .or_else(|| var("HF_HOME").map(|h| h.join("hub")))
        .or_else(|| var("XDG_CACHE_HOME").map(|h| h.join("huggingface").join("hub")))
        .or_else(|| var("HOME").map(|h| h.join(".cache").join("huggingface").join("hub")))
        .unwrap_or_default()
}

/// The quantization tag of a GGUF file name (`model-Q4_K_M.gguf` → `Q4_K_M`), with the part
/// number of a split file (1 for a whole file); `None` for a name without `.gguf`.
fn split_and_tag(file: &str) -> Option<(String, u32, String)> {
    let mut stem = file.strip_suffix(".gguf")?.to_owned();
    let mut part = 1;
    // `name-00001-of-00003`
    if let Some(at) = stem.rfind("-of-") {
        let (head, count) = (&stem[..at], &stem[at + 4..]);
        if count.len() == 5 && count.bytes().all(|b| b.is_ascii_digit()) && head.len() > 6 {
            let (head2, index) = head.split_at(head.len() - 6);
            if index.starts_with('-') && index[1..].bytes().all(|b| b.is_ascii_digit()) {
                part = index[1..].parse().unwrap_or(0);
                stem = head2.to_owned();
            }
        }
    }
    let tag_start = stem.rfind(['-', '.']).map_or(stem.len(), |i| i + 1);
    let tag = &stem[tag_start..];
    let tag =
        if tag_start < stem.len() && tag.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
            tag.to_ascii_uppercase()
        } else {
            String::new()
        };
    Some((stem, part, tag))
}

/// Companion files that are not models of their own: projectors and draft heads.
fn is_companion(file: &str) -> bool {
    file.contains("mmproj")
        || ["mtp-", "eagle3-", "dflash-", "dspark-"]
            .iter()
            .any(|p| file.starts_with(p))
}

/// The models in the hub cache at `dir`, named `org/repo:TAG`.
pub fn cache_models(dir: &Path) -> Vec<Entry> {
    let mut out = Vec::new();
    let Ok(repos) = std::fs::read_dir(dir) else {
        return out;
    };
    let mut repos: Vec<_> = repos.flatten().map(|e| e.path()).collect();
    repos.sort();
    for repo in repos {
        let Some(folder) = repo.file_name().and_then(|f| f.to_str()) else {
            continue;
        };
        let Some(id) = folder.strip_prefix("models--") else {
            continue;
        };
        let id = id.replace("--", "/");
        let Ok(commit) = std::fs::read_to_string(repo.join("refs").join("main")) else {
            continue;
        };
        let snapshot = repo.join("snapshots").join(commit.trim());
        let mut files = Vec::new();
        collect_gguf(&snapshot, &mut files, 4);
        files.sort();
        for file in files {
            let Some(name) = file.file_name().and_then(|f| f.to_str()) else {
                continue;
            };
            let Some((_, part, tag)) = split_and_tag(name) else {
                continue;
            };
            if part != 1 || tag.is_empty() || is_companion(name) {
                continue;
            }
            let model = format!("{id}:{tag}");
            if out.iter().any(|e: &Entry| e.name == model) {
                continue;
            }
            out.push(Entry {
                name: model,
                path: file,
                source: Source::Cache,
                args: Vec::new(),
                hidden: false,
                load_on_startup: false,
                stop_timeout: None,
            });
        }
    }
    out
}

fn collect_gguf(dir: &Path, out: &mut Vec<PathBuf>, depth: usize) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let path = e.path();
        if path.is_dir() {
            if depth > 0 {
                collect_gguf(&path, out, depth - 1);
            }
        } else if path.extension().is_some_and(|x| x == "gguf") {
            out.push(path);
        }
    }
}

/// The models of a `--models-dir` folder: each `.gguf` file directly in it (named without
/// `.gguf`), and each subfolder holding one (named after the subfolder; of a split model, the
/// first part).
pub fn dir_models(dir: &Path) -> Result<Vec<Entry>, String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut out = Vec::new();
    for e in entries.flatten() {
        let path = e.path();
        let Some(name) = path.file_name().and_then(|f| f.to_str()).map(str::to_owned) else {
            continue;
        };
        let file = if path.is_dir() {
            let Ok(inner) = std::fs::read_dir(&path) else {
                continue;
            };
            let mut files: Vec<PathBuf> = inner
                .flatten()
                .map(|e| e.path())
                .filter(|p| {
                    p.is_file()
                        && p.file_name().and_then(|f| f.to_str()).is_some_and(|f| {
                            f.ends_with(".gguf")
                                && !is_companion(f)
                                && split_and_tag(f).is_some_and(|(_, part, _)| part == 1)
                        })
                })
                .collect();
            files.sort();
            match files.into_iter().next() {
                Some(f) => f,
                None => continue,
            }
        } else if name.ends_with(".gguf") && !is_companion(&name) {
            path.clone()
        } else {
            continue;
        };
        let name = if path.is_dir() {
            name
        } else {
            name.trim_end_matches(".gguf").to_owned()
        };
        out.push(Entry {
            name,
            path: file,
            source: Source::Dir,
            args: Vec::new(),
            hidden: false,
            load_on_startup: false,
            stop_timeout: None,
        });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// Keys of a preset section that the router reads itself rather than passing on (`host`,
/// `port`, `alias` and `tags` it sets itself: a process listens where the router says, under
/// its section's name).
const ROUTER_KEYS: &[&str] = &[
    "model",
    "m",
    "hf-repo",
    "hf",
    "hf-file",
    "load-on-startup",
    "dedup-cache-models",
    "stop-timeout",
    "alias",
    "tags",
    "host",
    "port",
];

/// A preset file's models, and the cache entries it hides (`dedup-cache-models`).
pub fn preset_models(text: &str, cached: &[Entry]) -> Result<(Vec<Entry>, Vec<String>), String> {
    let mut sections: Vec<(String, Vec<(String, String)>)> = Vec::new();
    for (n, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with(';') || line.starts_with('#') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            sections.push((name.trim().to_owned(), Vec::new()));
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            return Err(format!("line {}: expected `key = value`", n + 1));
        };
        let Some(section) = sections.last_mut() else {
            return Err(format!("line {}: a key before any [section]", n + 1));
        };
        let key = key.trim().trim_start_matches('-').to_owned();
        section.1.push((key, value.trim().to_owned()));
    }
    let global: Vec<(String, String)> = sections
        .iter()
        .filter(|(n, _)| n == "*")
        .flat_map(|(_, kv)| kv.clone())
        .collect();
    let truthy = |v: &str| matches!(v, "1" | "true" | "on" | "yes");
    let global_dedup = global
        .iter()
        .any(|(k, v)| k == "dedup-cache-models" && truthy(v));
    let mut models = Vec::new();
    let mut hide = Vec::new();
    for (name, own) in sections.iter().filter(|(n, _)| n != "*") {
        let kv: Vec<&(String, String)> = global.iter().chain(own.iter()).collect();
        let get = |key: &[&str]| {
            kv.iter()
                .rev()
                .find(|(k, _)| key.contains(&k.as_str()))
                .map(|(_, v)| v.clone())
        };
        let from_cache = |repo: &str| -> Option<&Entry> {
            let want = if repo.contains(':') {
                repo.to_owned()
            } else {
                format!("{repo}:")
            };
            cached.iter().find(|e| {
                if repo.contains(':') {
                    e.name.eq_ignore_ascii_case(&want)
                } else {
                    e.name.starts_with(&want)
                }
            })
        };
        let path = if let Some(p) = get(&["model", "m"]) {
            PathBuf::from(p)
        } else if let Some(repo) = get(&["hf-repo", "hf"]) {
            match from_cache(&repo) {
                Some(e) => e.path.clone(),
                None => return Err(format!("[{name}]: {repo} is not in the hub cache")),
            }
        } else {
            return Err(format!("[{name}]: no `model` or `hf-repo`"));
        };
        let dedup = global_dedup
            || own
                .iter()
                .any(|(k, v)| k == "dedup-cache-models" && truthy(v));
        if dedup {
            for key in ["hf-repo", "hf", "spec-draft-hf", "hf-repo-draft"] {
                if let Some(repo) = get(&[key]) {
                    if let Some(e) = from_cache(&repo) {
                        hide.push(e.name.clone());
                    }
                }
            }
        }
        let stop_timeout = match get(&["stop-timeout"]) {
            None => None,
            Some(v) => Some(std::time::Duration::from_secs(v.parse().map_err(|_| {
                format!("[{name}]: stop-timeout {v:?} is not a number of seconds")
            })?)),
        };
        let mut args = Vec::new();
        for (k, v) in own.iter().chain(global.iter()) {
            if ROUTER_KEYS.contains(&k.as_str()) || k == "spec-draft-hf" {
                continue;
            }
            if args.iter().any(|a| a == &format!("--{k}")) {
                continue;
            }
            match v.as_str() {
                "true" | "on" => args.push(format!("--{k}")),
                "false" | "off" => {}
                _ => {
                    args.push(format!("--{k}"));
                    args.push(v.clone());
                }
            }
        }
        if let Some(repo) = get(&["spec-draft-hf"]) {
            if let Some(e) = from_cache(&repo) {
                args.push("--spec-draft-model".into());
                args.push(e.path.display().to_string());
            }
        }
        models.push(Entry {
            name: name.clone(),
            path,
            source: Source::Preset,
            args,
            hidden: false,
            load_on_startup: get(&["load-on-startup"]).is_some_and(|v| truthy(&v)),
            stop_timeout,
        });
    }
    Ok((models, hide))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_come_from_the_file_name() {
        let t = |f: &str| split_and_tag(f).map(|(_, p, t)| (p, t));
        assert_eq!(t("tinygemma3-Q8_0.gguf"), Some((1, "Q8_0".into())));
        assert_eq!(
            t("SmolLM2-135M-Instruct.Q4_1.gguf"),
            Some((1, "Q4_1".into()))
        );
        assert_eq!(
            t("big-q4_k_m-00002-of-00003.gguf"),
            Some((2, "Q4_K_M".into()))
        );
        assert_eq!(t("plain.gguf"), Some((1, String::new())));
        assert_eq!(t("notes.txt"), None);
    }

    #[test]
    fn a_preset_takes_global_keys_and_its_own() {
        let cached = vec![Entry {
            name: "org/repo:Q8_0".into(),
            path: "/c/repo-Q8_0.gguf".into(),
            source: Source::Cache,
            args: vec![],
            hidden: false,
            load_on_startup: false,
            stop_timeout: None,
        }];
        let text = "[*]\nctx-size = 512\ndedup-cache-models = 1\n\n[a]\nhf-repo = org/repo\n\
                    no-warmup = true\n[b]\nmodel = /m/b.gguf\nctx-size = 1024\n";
        let (models, hide) = preset_models(text, &cached).unwrap();
        assert_eq!(hide, vec!["org/repo:Q8_0".to_owned()]);
        assert_eq!(models[0].path, PathBuf::from("/c/repo-Q8_0.gguf"));
        assert_eq!(models[0].args, ["--no-warmup", "--ctx-size", "512"]);
        assert_eq!(models[1].args, ["--ctx-size", "1024"]);
        assert!(preset_models("[c]\nhf-repo = other/x\n", &cached).is_err());
        let (models, _) =
            preset_models("[d]\nmodel = /d.gguf\nstop-timeout = 5\n", &cached).unwrap();
        assert_eq!(
            models[0].stop_timeout,
            Some(std::time::Duration::from_secs(5))
        );
        assert!(models[0].args.is_empty());
        assert!(preset_models("[d]\nmodel = /d.gguf\nstop-timeout = soon\n", &cached).is_err());
        assert!(preset_models("key = 1\n", &cached).is_err());
    }
}
