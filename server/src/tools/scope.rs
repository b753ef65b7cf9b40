//! Where the file tools may reach on this host. Without `--tools-root` (llama-server's
//! behaviour) a path is the client's: a relative one is taken from the request's working
//! directory (`x-tool-cwd`, else the server's), `~/` from `$HOME`, and anything is opened.
//!
//! Under a root, every path must lie inside it after symbolic links are resolved: the parent
//! directory is canonicalized and compared with the canonical root, a final component that is
//! a link is resolved and compared the same way, and the file is then opened with `O_NOFOLLOW`,
//! so a link swapped in for the final component is refused rather than followed. Directories
//! that `write_file` creates are made one at a time, each checked before the next. What this
//! cannot stop: a directory of the path renamed between the check and the open (a race only a
//! process already writing inside the root can run), and hard links made from outside.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Component, Path, PathBuf};

/// The paths one tool call may use.
#[derive(Clone, Debug)]
pub struct Scope {
    /// The canonical root, when one is configured.
    root: Option<PathBuf>,
    /// The absolute directory relative paths start from.
    cwd: PathBuf,
}

impl Scope {
    /// The scope of a call under `root` (canonical) with the client's working directory `cwd`
    /// (relative to the root, or the server's directory, when it is relative); refuses a `cwd`
    /// outside the root.
    pub fn new(root: Option<&Path>, cwd: Option<&str>) -> Result<Scope, String> {
        let base = match root {
            Some(r) => r.to_path_buf(),
            None => std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/")),
        };
        let mut scope = Scope {
            root: root.map(Path::to_path_buf),
            cwd: base,
        };
        if let Some(cwd) = cwd.filter(|c| !c.is_empty()) {
            let wanted = scope.resolve(cwd);
            scope.cwd = match &scope.root {
                None => wanted,
                Some(_) => {
                    let dir = scope.dir(&wanted)?;
                    if !dir.is_dir() {
                        return Err(format!("x-tool-cwd {cwd} is not a directory"));
                    }
                    dir
                }
            };
        }
        Ok(scope)
    }

    /// The working directory of the call.
    pub fn cwd(&self) -> &Path {
        &self.cwd
    }

    /// Whether a root confines the call.
    pub fn confined(&self) -> bool {
        self.root.is_some()
    }

    /// `path` made absolute (from the working directory, `~/` from `$HOME`) with `.` and `..`
    /// taken out by their names; nothing is read from the file system.
    pub fn resolve(&self, path: &str) -> PathBuf {
        let home = std::env::var_os("HOME").map(PathBuf::from);
        let expanded = match (path.strip_prefix('~'), home) {
            (Some(""), Some(h)) => h,
            (Some(rest), Some(h)) if rest.starts_with('/') => h.join(rest.trim_start_matches('/')),
            _ => PathBuf::from(path),
        };
        let full = self.cwd.join(expanded);
        let mut out = PathBuf::from("/");
        for c in full.components() {
            match c {
                Component::Normal(n) => out.push(n),
                Component::ParentDir => {
                    out.pop();
                }
                Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
            }
        }
        out
    }

    /// A directory to list or search: its canonical path, which must be inside the root.
    pub fn dir(&self, path: &Path) -> Result<PathBuf, String> {
        if self.root.is_none() {
            return Ok(path.to_path_buf());
        }
        let real = std::fs::canonicalize(path)
            .map_err(|e| format!("{}: {}", path.display(), brief(&e)))?;
        self.inside(&real, path)?;
        Ok(real)
    }

    /// Opens `path` (absolute, from [`Scope::resolve`]) to read.
    pub fn open_read(&self, path: &Path) -> Result<File, String> {
        let target = self.target(path)?;
        let mut opts = OpenOptions::new();
        opts.read(true);
        if self.root.is_some() {
            opts.custom_flags(nofollow());
        }
        let file = opts
            .open(&target)
            .map_err(|e| format!("{}: {}", path.display(), brief(&e)))?;
        Ok(file)
    }

    /// Opens `path` to write it anew, creating the directories it needs.
    pub fn create(&self, path: &Path) -> Result<File, String> {
        let fail = |e: io::Error| format!("{}: {}", path.display(), brief(&e));
        let Some(parent) = path.parent() else {
            return Err(format!("{} is not a file", path.display()));
        };
        if self.root.is_none() {
            std::fs::create_dir_all(parent).map_err(fail)?;
            return File::create(path).map_err(fail);
        }
        self.make_dirs(parent)?;
        let target = self.target(path)?;
        OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .custom_flags(nofollow())
            .open(&target)
            .map_err(fail)
    }

    /// What opening `path` reaches under the root: the canonical parent joined with the name,
    /// or, when the name is a symbolic link, its canonical target (a link to nowhere refused).
    fn target(&self, path: &Path) -> Result<PathBuf, String> {
        if self.root.is_none() {
            return Ok(path.to_path_buf());
        }
        let fail = |e: io::Error| format!("{}: {}", path.display(), brief(&e));
        let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
            return Err(format!("{} is not a file", path.display()));
        };
        let parent = std::fs::canonicalize(parent).map_err(fail)?;
        self.inside(&parent, path)?;
        let full = parent.join(name);
        match std::fs::symlink_metadata(&full) {
            Ok(m) if m.file_type().is_symlink() => {
                let real = std::fs::canonicalize(&full)
                    .map_err(|_| format!("{} is a symbolic link to nothing", path.display()))?;
                self.inside(&real, path)?;
                Ok(real)
            }
            _ => Ok(full),
        }
    }

    /// Creates the missing directories of `dir` one at a time, each checked inside the root.
    fn make_dirs(&self, dir: &Path) -> Result<(), String> {
        let mut missing = Vec::new();
        let mut existing = dir;
        while std::fs::symlink_metadata(existing).is_err() {
            match (existing.parent(), existing.file_name()) {
                (Some(p), Some(n)) => {
                    missing.push(n.to_owned());
                    existing = p;
                }
                _ => break,
            }
        }
        let fail = |e: io::Error| format!("{}: {}", dir.display(), brief(&e));
        let mut real = std::fs::canonicalize(existing).map_err(fail)?;
        self.inside(&real, dir)?;
        for name in missing.into_iter().rev() {
            let next = real.join(&name);
            match std::fs::create_dir(&next) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(fail(e)),
            }
            real = std::fs::canonicalize(&next).map_err(fail)?;
            self.inside(&real, dir)?;
        }
        Ok(())
    }

    fn inside(&self, real: &Path, asked: &Path) -> Result<(), String> {
        match &self.root {
            Some(root) if !real.starts_with(root) => Err(format!(
                "{} is outside the tools root {}",
                asked.display(),
                root.display()
            )),
            _ => Ok(()),
        }
    }
}

/// `O_NOFOLLOW`: the final component is never followed if it is a symbolic link.
fn nofollow() -> i32 {
    rustix::fs::OFlags::NOFOLLOW.bits() as i32
}

/// An I/O error's words without the `(os error N)` tail.
pub fn brief(e: &io::Error) -> String {
    let text = e.to_string();
    match text.find(" (os error") {
        Some(i) => text[..i].to_owned(),
        None => text,
    }
}

#[cfg(test)]
mod tests {
    use super::Scope;
    use std::os::unix::fs::symlink;

    fn setup() -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        std::fs::create_dir_all(root.join("sub")).unwrap();
        std::fs::write(root.join("sub/in.txt"), "in").unwrap();
        std::fs::write(dir.path().join("secret.txt"), "secret").unwrap();
        let root = std::fs::canonicalize(root).unwrap();
        (dir, root)
    }

    #[test]
    fn resolve_is_lexical_and_never_leaves_slash() {
        let s = Scope::new(None, Some("/a/b")).unwrap();
        assert_eq!(s.resolve("../../../x"), std::path::PathBuf::from("/x"));
        assert_eq!(s.resolve("c/./d/.."), std::path::PathBuf::from("/a/b/c"));
        assert_eq!(
            s.resolve("/etc/passwd"),
            std::path::PathBuf::from("/etc/passwd")
        );
    }

    #[test]
    fn every_escape_under_a_root_is_refused() {
        let (dir, root) = setup();
        let outside = dir.path().join("secret.txt");
        symlink(&outside, root.join("link")).unwrap();
        symlink(dir.path(), root.join("updir")).unwrap();
        symlink(dir.path().join("nowhere"), root.join("dangling")).unwrap();
        let s = Scope::new(Some(&root), None).unwrap();
        for p in [
            "../secret.txt",
            "sub/../../secret.txt",
            "link",
            "updir/secret.txt",
        ] {
            let err = s.open_read(&s.resolve(p)).unwrap_err();
            assert!(err.contains("outside the tools root"), "{p}: {err}");
        }
        let abs = outside.to_str().unwrap();
        assert!(s.open_read(&s.resolve(abs)).is_err());
        for p in ["dangling", "updir/new.txt", "updir/deep/new.txt", "link"] {
            assert!(s.create(&s.resolve(p)).is_err(), "{p}");
        }
        assert!(!dir.path().join("nowhere").exists());
        assert!(!dir.path().join("deep").exists());
        assert_eq!(std::fs::read_to_string(&outside).unwrap(), "secret");
        assert!(Scope::new(Some(&root), Some(dir.path().to_str().unwrap())).is_err());
        assert!(Scope::new(Some(&root), Some("updir")).is_err());
        assert!(Scope::new(Some(&root), Some("../..")).is_err());
    }

    #[test]
    fn paths_inside_the_root_work() {
        let (_dir, root) = setup();
        symlink(root.join("sub/in.txt"), root.join("inner-link")).unwrap();
        let s = Scope::new(Some(&root), Some("sub")).unwrap();
        assert!(s.open_read(&s.resolve("in.txt")).is_ok());
        assert!(s.open_read(&s.resolve("../inner-link")).is_ok());
        assert!(s.create(&s.resolve("new/dir/out.txt")).is_ok());
        assert!(root.join("sub/new/dir/out.txt").is_file());
    }
}
