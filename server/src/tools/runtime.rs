//! Where tools run other than this host, as llama-server names them: `docker-container:ID` and
//! `podman-container:ID` (commands through `ENGINE exec`), `ssh:TARGET` (through `ssh`, which is
//! remoting, not isolation), and `docker:IMAGE`/`podman:IMAGE` for `--tools-runtime`, a
//! container this server starts, reuses and removes at exit. A name from a client header ends up
//! on a command line, so one that could be read as an option is refused; an unknown scheme is an
//! error, never a quiet fallback to the host.

use std::io::BufRead;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A place commands are sent to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Runtime {
    /// A running container, through `BIN exec`.
    Container {
        /// `docker` or `podman`.
        bin: &'static str,
        /// The container's id or name.
        id: String,
    },
    /// A host reached with `ssh` (key-based, host key already trusted).
    Ssh {
        /// `[user@]host`.
        target: String,
    },
}

/// A runtime spec as written: one to attach to, or an image to start a container from.
#[derive(Debug, PartialEq, Eq)]
pub enum Spec {
    /// An existing place.
    Attach(Runtime),
    /// `BIN:IMAGE`.
    Spawn {
        /// `docker` or `podman`.
        bin: &'static str,
        /// The image.
        image: String,
    },
}

const ENGINES: [&str; 2] = ["docker", "podman"];

impl Spec {
    /// Reads `spec`, refusing unknown schemes and names that could be options.
    pub fn parse(spec: &str) -> Result<Spec, String> {
        for bin in ENGINES {
            if let Some(id) = spec.strip_prefix(&format!("{bin}-container:")) {
                if !valid_id(id) {
                    return Err(format!("invalid container id: {id}"));
                }
                return Ok(Spec::Attach(Runtime::Container {
                    bin,
                    id: id.to_owned(),
                }));
            }
            if let Some(image) = spec.strip_prefix(&format!("{bin}:")) {
                if image.is_empty() || image.starts_with('-') {
                    return Err(format!("invalid image name: {image:?}"));
                }
                return Ok(Spec::Spawn {
                    bin,
                    image: image.to_owned(),
                });
            }
        }
        if let Some(target) = spec.strip_prefix("ssh:") {
            if !valid_target(target) {
                return Err(format!("invalid ssh target: {target}"));
            }
            return Ok(Spec::Attach(Runtime::Ssh {
                target: target.to_owned(),
            }));
        }
        Err(format!("unknown tool runtime: {spec}"))
    }

    /// A spec from a request's `x-tool-runtime`: it must name a running place.
    pub fn attach(spec: &str) -> Result<Runtime, String> {
        match Spec::parse(spec)? {
            Spec::Attach(r) => Ok(r),
            Spec::Spawn { .. } => Err(format!(
                "tool runtime must name a running container: {spec}"
            )),
        }
    }
}

/// Letters and digits first, then also `.`, `-` and `_`.
fn valid_id(id: &str) -> bool {
    id.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
}

/// No leading `-` (ssh would take it as an option), and only host-name characters and `@`.
fn valid_target(t: &str) -> bool {
    !t.is_empty()
        && !t.starts_with('-')
        && t.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | '@'))
}

impl Runtime {
    /// The host command line that runs `inner` (a whole POSIX argv) there.
    pub fn argv(&self, inner: &[String], with_stdin: bool) -> Vec<String> {
        match self {
            Runtime::Container { bin, id } => {
                let mut argv = vec![(*bin).to_owned(), "exec".to_owned()];
                if with_stdin {
                    argv.push("-i".into());
                }
                argv.push(id.clone());
                argv.extend(inner.iter().cloned());
                argv
            }
            Runtime::Ssh { target } => {
                let mut argv: Vec<String> = [
                    "ssh",
                    "-o",
                    "BatchMode=yes",
                    "-o",
                    "PasswordAuthentication=no",
                    "-o",
                    "KbdInteractiveAuthentication=no",
                    "-o",
                    "StrictHostKeyChecking=yes",
                ]
                .map(str::to_owned)
                .to_vec();
                if !with_stdin {
                    argv.push("-n".into());
                }
                // The far side's shell reads the command again: one quoted word.
                argv.push(target.clone());
                argv.push(quote_all(inner));
                argv
            }
        }
    }
}

/// `argv` as one line a POSIX shell splits back into exactly `argv`.
pub fn quote_all(argv: &[String]) -> String {
    argv.iter()
        .map(|a| format!("'{}'", a.replace('\'', r"'\''")))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The container `--tools-runtime BIN:IMAGE` started: `BIN run --rm -i IMAGE sh`, kept alive
/// by its open standard input, started again if it died, ended (and so removed) at shutdown.
#[derive(Debug)]
pub struct Owned {
    bin: &'static str,
    image: String,
    state: Mutex<Option<(Child, String)>>,
}

/// How long a container may take to say its id.
const START_LIMIT: Duration = Duration::from_secs(60);

impl Owned {
    /// Starts the container (blocking).
    pub fn start(bin: &'static str, image: String) -> Result<Owned, String> {
        let owned = Owned {
            bin,
            image,
            state: Mutex::new(None),
        };
        owned.current()?;
        Ok(owned)
    }

    /// The running container (started again when it is gone) as a place to attach to.
    pub fn current(&self) -> Result<Runtime, String> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let alive = match state.as_mut() {
            Some((child, _)) => matches!(child.try_wait(), Ok(None)),
            None => false,
        };
        if !alive {
            *state = Some(self.spawn()?);
        }
        let id = state.as_ref().map(|(_, id)| id.clone()).unwrap_or_default();
        Ok(Runtime::Container { bin: self.bin, id })
    }

    fn spawn(&self) -> Result<(Child, String), String> {
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let cidfile: PathBuf =
            std::env::temp_dir().join(format!("llama-hdd-tools-cid-{}-{n}", std::process::id()));
        let _ = std::fs::remove_file(&cidfile);
        let mut child = Command::new(self.bin)
            .args(["run", "--rm", "-i", "--cidfile"])
            .arg(&cidfile)
            .args([self.image.as_str(), "sh"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("starting {} for the tools runtime: {e}", self.bin))?;
        let start = Instant::now();
        loop {
            if let Ok(id) = std::fs::read_to_string(&cidfile) {
                if !id.trim().is_empty() {
                    let _ = std::fs::remove_file(&cidfile);
                    return Ok((child, id.trim().to_owned()));
                }
            }
            let exited = matches!(child.try_wait(), Ok(Some(_)));
            if exited || start.elapsed() > START_LIMIT {
                let _ = child.kill();
                let _ = child.wait();
                let said = child
                    .stderr
                    .take()
                    .map(|e| {
                        std::io::BufReader::new(e)
                            .lines()
                            .map_while(Result::ok)
                            .collect::<Vec<_>>()
                            .join(" ")
                    })
                    .unwrap_or_default();
                let _ = std::fs::remove_file(&cidfile);
                return Err(format!(
                    "the {} container for the tools runtime (image {}) did not start: {said}",
                    self.bin, self.image
                ));
            }
            // The engine writes the file once the container exists; nothing to wait on but it.
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Ends the container: its shell reads the end of its input and exits, and `--rm`
    /// removes it.
    pub fn stop(&self) {
        let taken = self.state.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some((mut child, _)) = taken {
            drop(child.stdin.take());
            let _ = child.wait();
        }
    }
}

impl Drop for Owned {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::{quote_all, Runtime, Spec};

    #[test]
    fn option_lookalikes_and_unknown_schemes_are_refused() {
        for (spec, said) in [
            ("ssh:-oProxyCommand=touch /tmp/pwned", "invalid ssh target"),
            ("ssh:", "invalid ssh target"),
            ("docker-container:--privileged", "invalid container id"),
            ("podman-container:-x", "invalid container id"),
            ("docker-container:a b", "invalid container id"),
            ("docker:--privileged", "invalid image name"),
            ("fake:does-not-exist", "unknown tool runtime"),
            ("", "unknown tool runtime"),
        ] {
            let err = Spec::parse(spec).unwrap_err();
            assert!(err.contains(said), "{spec}: {err}");
        }
        assert!(Spec::attach("docker:busybox")
            .unwrap_err()
            .contains("must name a running container"));
    }

    #[test]
    fn commands_are_wrapped_for_each_place() {
        let inner: Vec<String> = ["sh", "-c", "echo 'hi'"].map(String::from).to_vec();
        let c = Spec::attach("podman-container:abc_1.2").unwrap();
        assert_eq!(
            c.argv(&inner, true),
            ["podman", "exec", "-i", "abc_1.2", "sh", "-c", "echo 'hi'"]
        );
        let s = Spec::attach("ssh:me@host.example").unwrap();
        assert_eq!(
            s,
            Runtime::Ssh {
                target: "me@host.example".into()
            }
        );
        let argv = s.argv(&inner, false);
        assert_eq!(
            argv[argv.len() - 3..],
            ["-n", "me@host.example", &quote_all(&inner)]
        );
        assert_eq!(quote_all(&inner), r#"'sh' '-c' 'echo '\''hi'\'''"#);
    }
}
