//! One running MCP server: a child process in its own process group, with three tasks around
//! it (a writer for its standard input, a reader for its output, a drain for its standard
//! error) and a supervisor that reaps it. Requests are matched to answers by id, so any
//! number may be in flight; a child that exits, closes its output or is killed fails every
//! request waiting on it at once. Nothing here waits for a pipe's end of file: a grandchild
//! may hold the pipes open after the child is gone.

use std::collections::HashMap;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use std::os::fd::AsFd;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot, watch, Notify};

use super::config::ServerConfig;
use super::wire::{self, Frame, LineReader, Message};
use super::Log;

/// Requests one child may have in flight; more are refused at once.
const MAX_IN_FLIGHT: usize = 1024;
/// Lines queued for a child's standard input.
const WRITE_QUEUE: usize = 64;
/// How long the reader may go on after the child exits, for an answer already in the pipe.
const DRAIN_AFTER_EXIT: Duration = Duration::from_millis(250);
/// How long a child that closed a pipe has to exit by itself before it is killed.
const EXIT_AFTER_CLOSE: Duration = Duration::from_millis(100);
/// The end of a child's standard error kept for the log and for errors.
const STDERR_TAIL: usize = 2048;

/// Request ids, unique across every child of the process: an answer to a request that timed
/// out can never be taken for another's, even after a respawn.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// Why a request got no result.
#[derive(Clone, Debug, PartialEq)]
pub enum CallError {
    /// The server answered with a JSON-RPC error.
    Rpc(String),
    /// No answer within the server's time limit.
    Timeout(Duration),
    /// The child is gone (exited, closed its output, was killed); why.
    Closed(String),
    /// The child was gone before the request was sent (so it may be sent to another).
    Unsent(String),
    /// The hub is shutting down.
    ShuttingDown,
    /// Too many requests in flight.
    Busy,
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::Rpc(m) => f.write_str(m),
            CallError::Timeout(t) => write!(f, "no answer within {} ms", t.as_millis()),
            CallError::Closed(why) | CallError::Unsent(why) => {
                write!(f, "the MCP server is gone: {why}")
            }
            CallError::ShuttingDown => f.write_str("the server is shutting down"),
            CallError::Busy => write!(f, "{MAX_IN_FLIGHT} calls are already in flight"),
        }
    }
}

type Reply = Result<Value, CallError>;

/// A running child; cheap to share, every method callable from any task.
pub struct Child {
    name: String,
    pid: Option<u32>,
    to_child: mpsc::Sender<Outgoing>,
    pending: Mutex<HashMap<u64, Waiter>>,
    /// Bytes written to its standard input so far.
    written: AtomicU64,
    /// Why it is gone; `None` while it runs.
    gone: Mutex<Option<String>>,
    alive: AtomicBool,
    /// Whether its process group may still hold processes (cleared once it was killed).
    group_live: AtomicBool,
    /// Wakes the supervisor to kill the child.
    kill: Notify,
    /// Wakes the supervisor: the child closed its output or input.
    pipe_closed: Notify,
    stderr_tail: Mutex<Vec<u8>>,
    stopping: watch::Receiver<bool>,
    log: Log,
}

impl Child {
    /// Starts `config`'s program; the error says why it could not be.
    pub fn spawn(
        config: &ServerConfig,
        stopping: watch::Receiver<bool>,
        log: Log,
    ) -> Result<Arc<Child>, String> {
        let mut cmd = tokio::process::Command::new(&config.command);
        cmd.args(&config.args)
            .envs(config.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .process_group(0);
        if let Some(cwd) = &config.cwd {
            cmd.current_dir(cwd);
        }
        let mut proc = cmd
            .spawn()
            .map_err(|e| format!("cannot start {:?}: {e}", config.command))?;
        let (tx, rx) = mpsc::channel(WRITE_QUEUE);
        let child = Arc::new(Child {
            name: config.name.clone(),
            pid: proc.id(),
            to_child: tx,
            pending: Mutex::new(HashMap::new()),
            written: AtomicU64::new(0),
            gone: Mutex::new(None),
            alive: AtomicBool::new(true),
            group_live: AtomicBool::new(true),
            kill: Notify::new(),
            pipe_closed: Notify::new(),
            stderr_tail: Mutex::new(Vec::new()),
            stopping,
            log,
        });
        let (Some(stdin), Some(stdout), Some(stderr)) =
            (proc.stdin.take(), proc.stdout.take(), proc.stderr.take())
        else {
            child.kill_group();
            return Err("the child's pipes were not opened".into());
        };
        // A second handle on its input, to see what it left unread when it exits.
        let input = stdin.as_fd().try_clone_to_owned().ok();
        let writer = tokio::spawn(write_loop(Arc::clone(&child), stdin, rx));
        let reader = tokio::spawn(read_loop(Arc::clone(&child), stdout));
        let drain = tokio::spawn(stderr_loop(Arc::clone(&child), stderr));
        let tasks = Tasks {
            reader,
            others: [writer, drain],
            input,
        };
        tokio::spawn(supervise(Arc::clone(&child), proc, tasks));
        Ok(child)
    }

    /// Whether it still runs and reads. Asks the kernel too: the supervisor hears of an exit
    /// a moment after it happens, and a call sent in that moment would be lost.
    pub fn is_alive(&self) -> bool {
        self.alive.load(Ordering::SeqCst) && !self.has_exited()
    }

    /// Whether the process has exited (reaped or not), asked without reaping it (the
    /// supervisor does that).
    fn has_exited(&self) -> bool {
        use rustix::process::{waitid, Pid, WaitId, WaitIdOptions};
        let Some(pid) = self
            .pid
            .and_then(|p| i32::try_from(p).ok())
            .and_then(Pid::from_raw)
        else {
            return true;
        };
        let options = WaitIdOptions::EXITED | WaitIdOptions::NOHANG | WaitIdOptions::NOWAIT;
        match waitid(WaitId::Pid(pid), options) {
            Ok(status) => status.is_some(),
            // No such child: reaped already.
            Err(rustix::io::Errno::CHILD) => true,
            Err(_) => false,
        }
    }

    /// Sends `method` with `params` and waits for its answer, for at most `timeout`. A request
    /// that times out is cancelled (`notifications/cancelled`); the child stays.
    pub async fn request(&self, method: &str, params: Value, timeout: Duration) -> Reply {
        let deadline = tokio::time::Instant::now() + timeout;
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        {
            let mut pending = lock(&self.pending);
            if let Some(why) = lock(&self.gone).clone() {
                return Err(CallError::Unsent(why));
            }
            if self.has_exited() {
                return Err(CallError::Unsent("it exited".into()));
            }
            if pending.len() >= MAX_IN_FLIGHT {
                return Err(CallError::Busy);
            }
            pending.insert(id, Waiter { tx, end: None });
        }
        // Whatever ends this call (an answer, the time limit, the caller dropping it), the
        // id leaves the table.
        let _entry = PendingEntry { child: self, id };
        let mut stopping = self.stopping.clone();
        let line = wire::request_line(id, method, params);
        let wait = async {
            self.to_child
                .send((Some(id), line))
                .await
                .map_err(|_| CallError::Unsent(self.why_gone()))?;
            rx.await
                .unwrap_or_else(|_| Err(CallError::Closed(self.why_gone())))
        };
        tokio::select! {
            reply = tokio::time::timeout_at(deadline, wait) => match reply {
                Ok(reply) => reply,
                Err(_) => {
                    let cancel = serde_json::json!({"requestId": id, "reason": "timed out"});
                    let line = wire::notification_line("notifications/cancelled", Some(cancel));
                    let _ = self.to_child.try_send((None, line));
                    Err(CallError::Timeout(timeout))
                }
            },
            _ = stopping.wait_for(|s| *s) => Err(CallError::ShuttingDown),
        }
    }

    /// Sends a notification (no answer); `false` when the child's input is gone or full.
    pub fn notify(&self, method: &str, params: Option<Value>) -> bool {
        self.to_child
            .try_send((None, wire::notification_line(method, params)))
            .is_ok()
    }

    /// Kills it (its whole process group) and fails its requests with `why`.
    pub fn terminate(&self, why: &str) {
        self.retire(why.to_owned(), ShutdownReply::Closed);
        self.kill_group();
        self.kill.notify_one();
    }

    /// Kills it as the hub shuts down: its requests end as [`CallError::ShuttingDown`].
    pub fn shut_down(&self) {
        self.retire(
            "the server is shutting down".into(),
            ShutdownReply::Stopping,
        );
        self.kill_group();
        self.kill.notify_one();
    }

    /// Requests waiting for their answers.
    #[cfg(test)]
    pub fn in_flight(&self) -> usize {
        lock(&self.pending).len()
    }

    /// Its process id.
    #[cfg(test)]
    pub fn pid(&self) -> Option<u32> {
        self.pid
    }

    /// The end of its standard error, as text (empty when it wrote none).
    pub fn stderr_tail(&self) -> String {
        let tail = lock(&self.stderr_tail);
        String::from_utf8_lossy(&tail).trim().to_owned()
    }

    fn why_gone(&self) -> String {
        lock(&self.gone)
            .clone()
            .unwrap_or_else(|| "its input is closed".into())
    }

    /// Marks it gone (the first reason wins) and fails every waiting request.
    fn retire(&self, why: String, kind: ShutdownReply) {
        self.retire_reading(why, kind, u64::MAX);
    }

    /// [`Child::retire`], knowing that the child read its input up to byte `consumed`: a
    /// request written past that was never read, and fails as [`CallError::Unsent`].
    fn retire_reading(&self, why: String, kind: ShutdownReply, consumed: u64) {
        self.alive.store(false, Ordering::SeqCst);
        let (first, waiting): (bool, Vec<_>) = {
            let mut pending = lock(&self.pending);
            let mut gone = lock(&self.gone);
            let first = gone.is_none();
            if first {
                *gone = Some(why);
            }
            (first, pending.drain().map(|(_, w)| w).collect())
        };
        let why = self.why_gone();
        if first && matches!(kind, ShutdownReply::Closed) {
            (self.log)(format!("MCP server {:?}: {why}", self.name));
        }
        for w in waiting {
            let unread = w.end.is_none_or(|end| end > consumed);
            let _ = w.tx.send(Err(match kind {
                ShutdownReply::Stopping => CallError::ShuttingDown,
                ShutdownReply::Closed if unread => CallError::Unsent(why.clone()),
                ShutdownReply::Closed => CallError::Closed(why.clone()),
            }));
        }
    }

    /// SIGKILL to its process group (the child and whatever it started that did not leave
    /// the group), once.
    fn kill_group(&self) {
        if !self.group_live.swap(false, Ordering::SeqCst) {
            return;
        }
        let pid = self.pid.and_then(|p| i32::try_from(p).ok());
        if let Some(pid) = pid.and_then(rustix::process::Pid::from_raw) {
            let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
        }
    }

    /// Hands one answer to its request.
    fn deliver(&self, id: u64, reply: Reply) -> bool {
        match lock(&self.pending).remove(&id) {
            Some(w) => {
                let _ = w.tx.send(reply);
                true
            }
            None => false,
        }
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        self.kill_group();
    }
}

/// A line for the child's input, with the id of the request it carries.
type Outgoing = (Option<u64>, Vec<u8>);

/// A request waiting for its answer.
struct Waiter {
    tx: oneshot::Sender<Reply>,
    /// Where its line ends in the child's input, once written.
    end: Option<u64>,
}

/// The tasks around a child, for its supervisor.
struct Tasks {
    reader: tokio::task::JoinHandle<()>,
    others: [tokio::task::JoinHandle<()>; 2],
    /// The child's input (a second handle), to ask what it left unread.
    input: Option<std::os::fd::OwnedFd>,
}

#[derive(Clone, Copy)]
enum ShutdownReply {
    Closed,
    Stopping,
}

/// Takes a request's id out of the table when its call ends, however it ends.
struct PendingEntry<'a> {
    child: &'a Child,
    id: u64,
}

impl Drop for PendingEntry<'_> {
    fn drop(&mut self) {
        lock(&self.child.pending).remove(&self.id);
    }
}

/// A poisoned lock still guards valid data here (every critical section is a plain update).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// How a child's run ended, as its supervisor saw it first.
enum Ended {
    /// It exited (or could not be waited for).
    Exited(std::io::Result<std::process::ExitStatus>),
    /// [`Child::terminate`] or [`Child::shut_down`] killed it.
    Killed,
    /// It closed its output or input while running.
    PipeClosed,
}

/// Reaps the child. When it exits, the reader gets a moment for an answer already written;
/// when it closes a pipe, it gets a moment to exit by itself before it is killed. Then every
/// task ends and every waiting request fails.
async fn supervise(child: Arc<Child>, mut proc: tokio::process::Child, tasks: Tasks) {
    let Tasks {
        mut reader,
        others,
        input,
    } = tasks;
    let ended = tokio::select! {
        status = proc.wait() => Ended::Exited(status),
        _ = child.kill.notified() => Ended::Killed,
        _ = child.pipe_closed.notified() => Ended::PipeClosed,
    };
    let status = match ended {
        Ended::Exited(status) => {
            // No new call is sent to it; the calls in flight get what it wrote.
            child.alive.store(false, Ordering::SeqCst);
            // What the child wrote before it exited is in the pipe already.
            if tokio::time::timeout(DRAIN_AFTER_EXIT, &mut reader)
                .await
                .is_err()
            {
                reader.abort();
            }
            Some(status)
        }
        Ended::Killed => None,
        Ended::PipeClosed => tokio::time::timeout(EXIT_AFTER_CLOSE, proc.wait())
            .await
            .ok(),
    };
    reader.abort();
    // Its helpers go with it (once only: the group's id is free once they are gone).
    child.kill_group();
    let _ = proc.start_kill();
    for task in others {
        task.abort();
    }
    let why = match status {
        Some(Ok(s)) => format!("it exited ({s})"),
        Some(Err(e)) => format!("it cannot be waited for: {e}"),
        None => {
            let _ = proc.wait().await;
            "it closed its standard input or output".into()
        }
    };
    let tail = child.stderr_tail();
    let why = if tail.is_empty() {
        why
    } else {
        format!("{why}; its standard error ends: {tail}")
    };
    // What it never read (the bytes still in the pipe) can go to its successor.
    let unread = input.and_then(|fd| rustix::io::ioctl_fionread(&fd).ok());
    let written = child.written.load(Ordering::SeqCst);
    let consumed = unread.map_or(written, |u| written.saturating_sub(u));
    child.retire_reading(why, ShutdownReply::Closed, consumed);
}

/// Writes queued lines to the child's standard input, until it is closed or the task ends.
async fn write_loop(
    child: Arc<Child>,
    mut stdin: tokio::process::ChildStdin,
    mut rx: mpsc::Receiver<Outgoing>,
) {
    while let Some((id, line)) = rx.recv().await {
        if stdin.write_all(&line).await.is_err() || stdin.flush().await.is_err() {
            child.pipe_closed.notify_one();
            return;
        }
        let end = child.written.fetch_add(line.len() as u64, Ordering::SeqCst) + line.len() as u64;
        if let Some(id) = id {
            if let Some(w) = lock(&child.pending).get_mut(&id) {
                w.end = Some(end);
            }
        }
    }
}

/// Reads the child's output into messages: answers go to their requests, requests from the
/// server are answered, notifications and lines that are not JSON-RPC are passed over.
async fn read_loop(child: Arc<Child>, mut stdout: tokio::process::ChildStdout) {
    let mut lines = LineReader::new(wire::MAX_LINE);
    let mut chunk = vec![0u8; 64 << 10];
    let mut reported = Reported::default();
    loop {
        let n = match stdout.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        lines.push(&chunk[..n], |frame| match frame {
            Frame::Line(line) => dispatch(&child, wire::parse_message(line), &mut reported),
            Frame::Oversized => reported.once(&child, "a line longer than 8 MiB (dropped)"),
        });
    }
    child.pipe_closed.notify_one();
}

/// What the reader has logged already (each kind of misbehaviour once per child, so a child
/// that floods cannot flood the log).
#[derive(Default)]
struct Reported(Vec<&'static str>);

impl Reported {
    fn once(&mut self, child: &Child, what: &'static str) {
        if !self.0.contains(&what) {
            self.0.push(what);
            (child.log)(format!(
                "MCP server {:?} wrote {what}; ignored (reported once)",
                child.name
            ));
        }
    }
}

fn dispatch(child: &Child, message: Message, reported: &mut Reported) {
    match message {
        Message::Response { id, outcome } => {
            let reply = outcome.map_err(|e| CallError::Rpc(e.message));
            if !child.deliver(id, reply) {
                reported.once(child, "an answer to no request in flight");
            }
        }
        Message::ForeignResponse => reported.once(child, "an answer with an id we never sent"),
        Message::Request { id, method } => {
            let _ = child
                .to_child
                .try_send((None, wire::answer_line(id, &method)));
        }
        Message::Notification { .. } => {}
        Message::Invalid(why) => reported.once(child, why),
    }
}

/// Keeps the end of the child's standard error (an undrained pipe would block it).
async fn stderr_loop(child: Arc<Child>, mut stderr: impl AsyncRead + Unpin) {
    let mut chunk = vec![0u8; 8 << 10];
    loop {
        let n = match stderr.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let mut tail = lock(&child.stderr_tail);
        tail.extend_from_slice(&chunk[..n]);
        if tail.len() > STDERR_TAIL {
            let cut = tail.len() - STDERR_TAIL;
            tail.drain(..cut);
        }
    }
}
