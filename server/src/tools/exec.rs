//! Running a command for a tool: in a process group of its own, its standard output and error
//! through one pipe (or its error dropped), at most `max_output` bytes kept, and the whole group
//! killed when the time limit passes, when the client goes away (the sink's receiver is
//! dropped), when the server stops, or when the future running it is dropped.

use std::os::fd::OwnedFd;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, watch};

/// What one command may take.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Output bytes kept; the rest is read and dropped.
    pub max_output: usize,
    /// Time before the group is killed.
    pub timeout: Duration,
}

/// What the command's standard error becomes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stderr {
    /// Into the same pipe as its output, in order.
    Merged,
    /// Discarded (a file's bytes must not be mixed with messages).
    Dropped,
}

/// How a command ended.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Its output (lossy UTF-8), with `[output truncated]` after the limit.
    pub output: String,
    /// Its exit status; -1 when it was killed by a signal or could not start.
    pub exit_code: i32,
    /// The time limit killed it.
    pub timed_out: bool,
    /// The client or the server went away and it was killed.
    pub cancelled: bool,
    /// The output's bytes as they came (no truncation note).
    pub raw: Vec<u8>,
}

/// One command to run.
pub struct Job<'a> {
    /// The program and its arguments.
    pub argv: &'a [String],
    /// Its working directory (the server's when `None`).
    pub cwd: Option<&'a Path>,
    /// Bytes for its standard input (closed at once when `None`).
    pub stdin: Option<Vec<u8>>,
    /// Where its standard error goes.
    pub stderr: Stderr,
}

/// Time given to the readers of a killed group's pipe and to its leader's exit.
const AFTER_KILL: Duration = Duration::from_secs(2);

/// Runs `job`; each piece of output also goes to `sink` as it comes (a closed sink kills the
/// command); `stop` turning true kills it too.
pub async fn run(
    job: Job<'_>,
    limits: Limits,
    sink: Option<&mpsc::Sender<String>>,
    mut stop: watch::Receiver<bool>,
) -> Outcome {
    let Some((program, args)) = job.argv.split_first() else {
        return failed("no command".into());
    };
    let (reader, writer) = match std::io::pipe() {
        Ok(p) => p,
        Err(e) => return failed(format!("failed to spawn process: {e}")),
    };
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args)
        .stdin(if job.stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .process_group(0)
        .kill_on_drop(true);
    match writer.try_clone() {
        Ok(w) if job.stderr == Stderr::Merged => cmd.stderr(w),
        _ => cmd.stderr(Stdio::null()),
    };
    cmd.stdout(writer);
    if let Some(dir) = job.cwd {
        cmd.current_dir(dir);
    }
    let spawned = cmd.spawn();
    // The command holds our copies of the pipe's write end: the pipe ends only once it is gone.
    drop(cmd);
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) => return failed(format!("failed to spawn process: {e}")),
    };
    let mut group = Group(child.id().and_then(|id| i32::try_from(id).ok()));
    if let (Some(bytes), Some(mut input)) = (job.stdin, child.stdin.take()) {
        tokio::spawn(async move {
            let _ = input.write_all(&bytes).await;
        });
    }
    let mut pipe = match tokio::net::unix::pipe::Receiver::from_owned_fd(OwnedFd::from(reader)) {
        Ok(p) => p,
        Err(e) => return failed(format!("failed to read the process: {e}")),
    };
    let mut out = Output::new(limits.max_output);
    let deadline = tokio::time::Instant::now() + limits.timeout;
    let mut buf = vec![0u8; 8192];
    let mut end = End::Eof;
    loop {
        tokio::select! {
            n = pipe.read(&mut buf) => match n {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let piece = out.push(&buf[..n]);
                    if let (Some(sink), Some(piece)) = (sink, piece) {
                        if sink.send(piece).await.is_err() {
                            end = End::Cancelled;
                            break;
                        }
                    }
                }
            },
            () = tokio::time::sleep_until(deadline) => { end = End::TimedOut; break; }
            // The guard `wait_for` gives back is dropped at once (it is not `Send`).
            () = async { let _ = stop.wait_for(|&s| s).await; } => { end = End::Cancelled; break; }
            () = closed(sink) => { end = End::Cancelled; break; }
        }
    }
    if end != End::Eof {
        group.kill();
        // Whatever the group wrote before it died, if the pipe ends soon.
        let _ = tokio::time::timeout(AFTER_KILL, async {
            while let Ok(n) = pipe.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                out.push(&buf[..n]);
            }
        })
        .await;
    }
    let status = match tokio::time::timeout(limits.timeout.max(AFTER_KILL), child.wait()).await {
        Ok(s) => s.ok(),
        Err(_) => {
            end = End::TimedOut;
            group.kill();
            tokio::time::timeout(AFTER_KILL, child.wait())
                .await
                .ok()
                .and_then(Result::ok)
        }
    };
    // Anything it left running in the background goes with it.
    group.kill();
    group.0 = None;
    if let Some(sink) = sink {
        if let Some(rest) = out.flush() {
            let _ = sink.send(rest).await;
        }
    }
    let (output, raw) = out.finish();
    Outcome {
        output,
        raw,
        exit_code: status.and_then(|s| s.code()).unwrap_or(-1),
        timed_out: end == End::TimedOut,
        cancelled: end == End::Cancelled,
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum End {
    Eof,
    TimedOut,
    Cancelled,
}

fn failed(output: String) -> Outcome {
    Outcome {
        output,
        exit_code: -1,
        ..Outcome::default()
    }
}

/// Completes when `sink`'s receiver is gone; never without a sink.
async fn closed(sink: Option<&mpsc::Sender<String>>) {
    match sink {
        Some(s) => s.closed().await,
        None => std::future::pending().await,
    }
}

/// The process group of a running command, killed when dropped unless disarmed.
struct Group(Option<i32>);

impl Group {
    fn kill(&self) {
        let pid = self.0.and_then(rustix::process::Pid::from_raw);
        if let Some(pid) = pid {
            let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
        }
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The output kept so far, and what of it is valid UTF-8 yet to be streamed.
struct Output {
    kept: Vec<u8>,
    max: usize,
    truncated: bool,
    /// The start of the bytes not yet streamed (an incomplete character at the end waits).
    streamed: usize,
}

impl Output {
    fn new(max: usize) -> Output {
        Output {
            kept: Vec::new(),
            max,
            truncated: false,
            streamed: 0,
        }
    }

    /// Keeps what fits of `bytes`; the text newly complete, to stream.
    fn push(&mut self, bytes: &[u8]) -> Option<String> {
        let room = self.max.saturating_sub(self.kept.len());
        if bytes.len() > room {
            self.truncated = true;
        }
        self.kept.extend_from_slice(&bytes[..bytes.len().min(room)]);
        let pending = &self.kept[self.streamed..];
        let upto = match std::str::from_utf8(pending) {
            Ok(_) => pending.len(),
            Err(e) if e.error_len().is_none() => e.valid_up_to(),
            Err(_) => pending.len(),
        };
        if upto == 0 {
            return None;
        }
        let text = String::from_utf8_lossy(&pending[..upto]).into_owned();
        self.streamed += upto;
        Some(text)
    }

    /// The bytes held back for a character that never completed.
    fn flush(&mut self) -> Option<String> {
        let rest = &self.kept[self.streamed..];
        self.streamed = self.kept.len();
        (!rest.is_empty()).then(|| String::from_utf8_lossy(rest).into_owned())
    }

    fn finish(self) -> (String, Vec<u8>) {
        let mut text = String::from_utf8_lossy(&self.kept).into_owned();
        if self.truncated {
            text.push_str("\n[output truncated]");
        }
        (text, self.kept)
    }
}

#[cfg(test)]
mod tests {
    use super::{run, Job, Limits, Stderr};
    use std::time::{Duration, Instant};

    fn sh(cmd: &str) -> Vec<String> {
        vec!["sh".into(), "-c".into(), cmd.into()]
    }

    fn limits(max_output: usize, secs: u64) -> Limits {
        Limits {
            max_output,
            timeout: Duration::from_secs(secs),
        }
    }

    fn job(argv: &[String]) -> Job<'_> {
        Job {
            argv,
            cwd: None,
            stdin: None,
            stderr: Stderr::Merged,
        }
    }

    #[tokio::test]
    async fn output_errors_and_exit_code_come_back() {
        let (_tx, stop) = tokio::sync::watch::channel(false);
        let argv = sh("echo out; echo err >&2; exit 3");
        let o = run(job(&argv), limits(1000, 10), None, stop).await;
        assert_eq!(o.output, "out\nerr\n");
        assert_eq!(o.exit_code, 3);
        assert!(!o.timed_out);
    }

    #[tokio::test]
    async fn output_is_capped_and_the_group_killed_at_the_limit() {
        let (_tx, stop) = tokio::sync::watch::channel(false);
        let argv = sh("yes | head -c 100000; sleep 30 & sleep 30");
        let t = Instant::now();
        let o = run(job(&argv), limits(10, 1), None, stop).await;
        assert!(o.timed_out);
        assert!(o.output.ends_with("\n[output truncated]"), "{}", o.output);
        assert_eq!(o.output.len(), 10 + "\n[output truncated]".len());
        assert!(t.elapsed() < Duration::from_secs(8), "{:?}", t.elapsed());
    }

    #[tokio::test]
    async fn a_stop_kills_it_at_once() {
        let (tx, stop) = tokio::sync::watch::channel(false);
        let argv = sh("sleep 30");
        let t = Instant::now();
        let running =
            tokio::spawn(async move { run(job(&argv), limits(10, 60), None, stop).await });
        tx.send(true).unwrap();
        let o = running.await.unwrap();
        assert!(o.cancelled);
        assert!(t.elapsed() < Duration::from_secs(5));
    }
}
