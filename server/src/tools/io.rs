//! The file and process operations the tools are written against, on this host (through a
//! [`Scope`]) or in a runtime (each operation a small POSIX command there: `sh`, `cat`, `wc`,
//! `mkdir`, `find`, `timeout`).

use std::io::Read;
use std::path::Path;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, watch};

use super::exec::{self, Job, Limits, Outcome, Stderr};
use super::runtime::Runtime;
use super::scope::{brief, Scope};
use super::walk::{self, Entry, Kind, Listing};

/// Time for one listing, git's or the walker's.
const LIST_TIME: Duration = Duration::from_secs(15);
/// Most bytes of `git ls-files` output read.
const LIST_OUTPUT: usize = 8 << 20;
/// Time for one helper command in a runtime.
const HELPER_TIME: Duration = Duration::from_secs(15);
/// Most bytes read from a file in a runtime.
pub const RUNTIME_READ_MAX: u64 = 64 << 20;

/// Where a call's operations happen.
#[derive(Clone, Debug)]
pub enum Place {
    /// This host, within the scope.
    Host(Scope),
    /// A runtime, with the working directory from `x-tool-cwd`.
    Runtime {
        /// Where.
        runtime: Runtime,
        /// Relative paths start here (the runtime's own directory when `None`).
        cwd: Option<String>,
    },
}

/// A call's operations, stopped when the server stops.
#[derive(Clone, Debug)]
pub struct Io {
    /// Where.
    pub place: Place,
    /// Turns true when the server stops.
    pub stop: watch::Receiver<bool>,
}

/// What a path names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PathKind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// Nothing, or something else.
    Other,
}

impl Io {
    /// `path` made absolute from the working directory.
    pub fn resolve(&self, path: &str) -> String {
        match &self.place {
            Place::Host(scope) => scope.resolve(path).to_string_lossy().into_owned(),
            Place::Runtime { cwd, .. } => match cwd {
                Some(c) if !path.starts_with('/') => format!("{c}/{path}"),
                _ => path.to_owned(),
            },
        }
    }

    /// The working directory, when known without asking the runtime.
    pub fn cwd(&self) -> Option<String> {
        match &self.place {
            Place::Host(scope) => Some(scope.cwd().to_string_lossy().into_owned()),
            Place::Runtime { cwd, .. } => cwd.clone(),
        }
    }

    /// What `abs` names (links followed).
    pub async fn kind(&self, abs: &str) -> PathKind {
        match &self.place {
            Place::Host(_) => {
                let p = abs.to_owned();
                blocking(move || match std::fs::metadata(p) {
                    Ok(m) if m.is_file() => PathKind::File,
                    Ok(m) if m.is_dir() => PathKind::Dir,
                    _ => PathKind::Other,
                })
                .await
                .unwrap_or(PathKind::Other)
            }
            Place::Runtime { .. } => {
                let script = "if [ -f \"$1\" ]; then echo f; elif [ -d \"$1\" ]; then echo d; fi";
                let out = self.helper(&["sh", "-c", script, "_", abs], 64).await;
                match out.output.trim() {
                    "f" => PathKind::File,
                    "d" => PathKind::Dir,
                    _ => PathKind::Other,
                }
            }
        }
    }

    /// A reader of the file `abs` and its size; in a runtime at most [`RUNTIME_READ_MAX`]
    /// bytes are read.
    pub async fn open(&self, abs: &str) -> Result<(Box<dyn Read + Send>, u64), String> {
        match &self.place {
            Place::Host(scope) => {
                let (scope, p) = (scope.clone(), abs.to_owned());
                blocking(move || {
                    let file = scope.open_read(Path::new(&p))?;
                    let meta = file.metadata().map_err(|e| brief(&e))?;
                    if !meta.is_file() {
                        return Err(format!("{p} is not a file"));
                    }
                    Ok((Box::new(file) as Box<dyn Read + Send>, meta.len()))
                })
                .await?
            }
            Place::Runtime { .. } => {
                let job = ["cat", "--", abs];
                let out = self
                    .helper_job(&job, RUNTIME_READ_MAX as usize, Stderr::Dropped, None)
                    .await;
                if out.exit_code != 0 || out.timed_out {
                    return Err(format!("cannot read {abs}"));
                }
                let bytes = out.raw;
                let len = bytes.len() as u64;
                Ok((Box::new(std::io::Cursor::new(bytes)), len))
            }
        }
    }

    /// The whole file `abs`, if it is at most `max` bytes.
    pub async fn read(&self, abs: &str, max: u64) -> Result<Vec<u8>, String> {
        let (reader, len) = self.open(abs).await?;
        if len > max {
            return Err(format!("file too large ({len} bytes, max {max})"));
        }
        blocking(move || {
            let mut bytes = Vec::new();
            reader
                .take(max)
                .read_to_end(&mut bytes)
                .map_err(|e| brief(&e))?;
            Ok(bytes)
        })
        .await?
    }

    /// Writes `bytes` as the file `abs`, creating its directories.
    pub async fn write(&self, abs: &str, bytes: Vec<u8>) -> Result<(), String> {
        match &self.place {
            Place::Host(scope) => {
                let (scope, p) = (scope.clone(), abs.to_owned());
                blocking(move || {
                    use std::io::Write;
                    let mut file = scope.create(Path::new(&p))?;
                    file.write_all(&bytes).map_err(|e| brief(&e))
                })
                .await?
            }
            Place::Runtime { .. } => {
                let script = "mkdir -p \"$(dirname \"$1\")\" && cat > \"$1\"";
                let job = ["sh", "-c", script, "_", abs];
                let out = self
                    .helper_job(&job, 4096, Stderr::Merged, Some(bytes))
                    .await;
                if out.exit_code != 0 || out.timed_out {
                    return Err(out.output.trim().to_owned());
                }
                Ok(())
            }
        }
    }

    /// The entries under the directory `abs` (`max_depth` 0: all levels). Files come from
    /// `git ls-files` where the directory is in a repository (so ignored files are left out),
    /// except under a tools root, whose walk reads nothing outside it.
    pub async fn list(&self, abs: &str, max_depth: usize, kind: Kind) -> Result<Listing, String> {
        let not_dir = || "path does not exist or is not a directory".to_owned();
        let base = match &self.place {
            Place::Host(scope) => {
                let dir = scope.dir(Path::new(abs))?;
                if !dir.is_dir() {
                    return Err(not_dir());
                }
                Some((dir, scope.confined()))
            }
            Place::Runtime { .. } if self.kind(abs).await != PathKind::Dir => return Err(not_dir()),
            Place::Runtime { .. } => None,
        };
        let use_git = kind == Kind::Files && !base.as_ref().is_some_and(|(_, c)| *c);
        if use_git {
            if let Some(mut listing) = self.git_files(abs).await {
                listing
                    .entries
                    .retain(|e| max_depth == 0 || walk::depth(&e.rel) <= max_depth);
                if let Some((dir, _)) = &base {
                    let dir = dir.clone();
                    listing = blocking(move || {
                        listing.entries.retain(|e| dir.join(&e.rel).is_file());
                        listing
                    })
                    .await?;
                }
                return Ok(listing);
            }
        }
        match base {
            Some((dir, _)) => {
                let deadline = Instant::now() + LIST_TIME;
                blocking(move || walk::walk(&dir, max_depth, kind, deadline)).await
            }
            None => Ok(self.find(abs, max_depth, kind).await),
        }
    }

    async fn git_files(&self, abs: &str) -> Option<Listing> {
        let script = "cd \"$1\" && exec git -c core.fsmonitor=false ls-files -z --cached --others --exclude-standard";
        let job = ["sh", "-c", script, "_", abs];
        let limits = Limits {
            max_output: LIST_OUTPUT,
            timeout: LIST_TIME,
        };
        let out = self.command(&job, limits, Stderr::Dropped, None).await;
        if out.exit_code != 0 || out.timed_out || out.output.ends_with("[output truncated]") {
            return None;
        }
        let mut entries: Vec<Entry> = out
            .output
            .split('\0')
            .filter(|l| !l.is_empty())
            .map(|l| Entry {
                rel: l.to_owned(),
                is_dir: false,
            })
            .collect();
        entries.sort_by(|a, b| a.rel.cmp(&b.rel));
        Some(Listing {
            entries,
            truncated: false,
        })
    }

    /// One `find` in a runtime per kind, junk directories pruned.
    async fn find(&self, abs: &str, max_depth: usize, kind: Kind) -> Listing {
        let prune = walk::JUNK
            .iter()
            .map(|n| format!("-name '{n}'"))
            .collect::<Vec<_>>()
            .join(" -o ");
        let mut out = Listing::default();
        for is_dir in [true, false] {
            if (is_dir && kind == Kind::Files) || (!is_dir && kind == Kind::Dirs) {
                continue;
            }
            let depth = match max_depth {
                0 => String::new(),
                d => format!(" -maxdepth {d}"),
            };
            let tail = if is_dir {
                "-print -o -type d -print"
            } else {
                "-o -type f -print"
            };
            let script =
                format!("cd \"$1\" && find . -mindepth 1{depth} \\( {prune} \\) -prune {tail}");
            let limits = Limits {
                max_output: LIST_OUTPUT,
                timeout: LIST_TIME,
            };
            let res = self
                .command(
                    &["sh", "-c", &script, "_", abs],
                    limits,
                    Stderr::Dropped,
                    None,
                )
                .await;
            out.truncated |= res.timed_out || res.output.ends_with("[output truncated]");
            for line in res.output.lines() {
                let rel = line.strip_prefix("./").unwrap_or(line);
                if !rel.is_empty() && !rel.starts_with('\n') && !rel.starts_with('[') {
                    out.entries.push(Entry {
                        rel: rel.to_owned(),
                        is_dir,
                    });
                }
            }
        }
        out.entries.sort_by(|a, b| a.rel.cmp(&b.rel));
        out
    }

    /// Runs `argv` in the working directory, output streamed to `sink` when given.
    pub async fn run(
        &self,
        argv: &[String],
        limits: Limits,
        sink: Option<&mpsc::Sender<String>>,
    ) -> Outcome {
        match &self.place {
            Place::Host(scope) => {
                let job = Job {
                    argv,
                    cwd: Some(scope.cwd()),
                    stdin: None,
                    stderr: Stderr::Merged,
                };
                exec::run(job, limits, sink, self.stop.clone()).await
            }
            Place::Runtime { runtime, cwd } => {
                // Killing the local client does not end the command there: `timeout` does.
                let mut inner = vec![
                    "timeout".to_owned(),
                    format!("{}s", limits.timeout.as_secs()),
                ];
                if let Some(cwd) = cwd {
                    let script = "cd \"$1\" || exit 127; shift; exec \"$@\"";
                    inner = ["sh", "-c", script, "_", cwd.as_str()]
                        .map(str::to_owned)
                        .into_iter()
                        .chain(inner)
                        .collect();
                }
                inner.extend(argv.iter().cloned());
                let host_argv = runtime.argv(&inner, true);
                let limits = Limits {
                    timeout: limits.timeout + Duration::from_secs(5),
                    ..limits
                };
                let job = Job {
                    argv: &host_argv,
                    cwd: None,
                    stdin: Some(Vec::new()),
                    stderr: Stderr::Merged,
                };
                exec::run(job, limits, sink, self.stop.clone()).await
            }
        }
    }

    async fn helper(&self, inner: &[&str], max_output: usize) -> Outcome {
        self.helper_job(inner, max_output, Stderr::Merged, None)
            .await
    }

    async fn helper_job(
        &self,
        inner: &[&str],
        max_output: usize,
        stderr: Stderr,
        stdin: Option<Vec<u8>>,
    ) -> Outcome {
        let limits = Limits {
            max_output,
            timeout: HELPER_TIME,
        };
        self.command(inner, limits, stderr, stdin).await
    }

    /// `inner` run where this call's operations happen (on the host: in no directory of its
    /// own choosing; every path given is absolute).
    async fn command(
        &self,
        inner: &[&str],
        limits: Limits,
        stderr: Stderr,
        stdin: Option<Vec<u8>>,
    ) -> Outcome {
        let inner: Vec<String> = inner.iter().map(|s| (*s).to_owned()).collect();
        let argv = match &self.place {
            Place::Host(_) => inner,
            Place::Runtime { runtime, .. } => runtime.argv(&inner, stdin.is_some()),
        };
        let job = Job {
            argv: &argv,
            cwd: None,
            stdin,
            stderr,
        };
        exec::run(job, limits, None, self.stop.clone()).await
    }
}

/// `f` on a blocking thread.
pub async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, String> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| format!("the tool's task failed: {e}"))
}
