//! Where stores live by default: the user's cache directory, shared by the server's prompt
//! cache and the chat's conversations.

use std::ffi::OsString;
use std::path::PathBuf;

/// The platform's per-user cache directory of llama-hdd: `$XDG_CACHE_HOME/llama-hdd`, else
/// `~/.cache/llama-hdd` (`~/Library/Caches/llama-hdd` on macOS), else
/// `%LOCALAPPDATA%\llama-hdd`, else `./llama-hdd-cache`.
pub fn default_cache_dir() -> PathBuf {
    cache_dir_from(|name| std::env::var_os(name))
}

/// [`default_cache_dir`] with the environment read through `var`.
fn cache_dir_from(var: impl Fn(&str) -> Option<OsString>) -> PathBuf {
    let env = |name: &str| var(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(dir) = env("XDG_CACHE_HOME") {
        return dir.join("llama-hdd");
    }
    match env("HOME") {
        Some(home) if cfg!(target_os = "macos") => home.join("Library/Caches/llama-hdd"),
        Some(home) => home.join(".cache/llama-hdd"),
        None => match env("LOCALAPPDATA") {
            Some(dir) => dir.join("llama-hdd"),
            None => PathBuf::from("llama-hdd-cache"),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(vars: &[(&str, &str)]) -> PathBuf {
        cache_dir_from(|name| {
            vars.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| OsString::from(v))
        })
    }

    #[test]
    fn the_cache_directory_follows_the_environment() {
        let xdg = with(&[("XDG_CACHE_HOME", "/x"), ("HOME", "/h")]);
        assert_eq!(xdg, PathBuf::from("/x/llama-hdd"));
        let home = with(&[("XDG_CACHE_HOME", ""), ("HOME", "/h")]);
        let want = if cfg!(target_os = "macos") {
            "/h/Library/Caches/llama-hdd"
        } else {
            "/h/.cache/llama-hdd"
        };
        assert_eq!(home, PathBuf::from(want));
        assert_eq!(
            with(&[("LOCALAPPDATA", "/l")]),
            PathBuf::from("/l/llama-hdd")
        );
        assert_eq!(with(&[]), PathBuf::from("llama-hdd-cache"));
    }
}
