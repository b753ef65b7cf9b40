//! Rendering untrusted chat templates in a child process with a memory and a time limit.
//!
//! Fuel bounds how many instructions a render runs, not what one costs: minijinja concatenates
//! and repeats values without a size limit, so `{% set ns.x = ns.x ~ ns.x %}` in a loop of 60
//! asks for an exabyte, and printing `[1] * 2000000000` walks two billion items in one
//! instruction; compiling folds constants, so `{{ 'abcd' * 20000000 + 0 + 0 ... }}` builds an
//! 80 MB string once per `+` before anything renders. A template comes from a model file, which is untrusted input; such a template must
//! fail one render, not kill or stall the process that loaded the model.
//!
//! A binary calls [`init`] first thing in `main`. Started normally, that turns the sandbox on
//! for the process; started as a renderer (the environment variable [`RENDERER_ENV`] is set), it
//! serves renders on standard input and output and exits. The choice cannot be forgotten: a
//! program that made none (neither [`init`] nor [`enable`] nor [`render_in_process`]) gets
//! [`Error::NoSandboxChoice`] from any render of an unreviewed template, never an unbounded
//! render in its own process. With the sandbox on,
//! [`ChatTemplate::render`] sends every template that is not
//! [reviewed](ChatTemplate::is_reviewed) to one long-lived renderer: the same executable, which
//! caps its own address space (on Unix; `RLIMIT_AS`) and is killed when a render takes longer
//! than the time limit. A renderer that dies or is killed fails that render with
//! [`Error::TemplateRenderer`]; the next render starts a fresh one.
//!
//! Requests and replies are one JSON object per line: `{"source", "bos", "eos", "messages":
//! [[role, content], ...], "add_generation_prompt", "check"}` (with `check`, the template is only
//! compiled), or `{"source", "bos", "eos", "request": {...}}` for
//! [`ChatTemplate::render_request`] (the request as [`RenderRequest::to_json`] writes it),
//! answered by `{"ok": text}` or `{"err": message}`. The renderer's first line is a greeting, so that a program which prints
//! something else first (a test harness) can serve as the renderer too.

use std::ffi::{OsStr, OsString};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Mutex, OnceLock, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use serde_json::{json, Value as Json};

use super::{ChatTemplate, Message, RenderRequest};
use crate::{Error, Result};

/// Set (to the memory limit in bytes) in the environment of a renderer process.
pub const RENDERER_ENV: &str = "LLAMA_HDD_TEMPLATE_RENDERER";

/// The renderer's first line.
const GREETING: &str = "llama-hdd template renderer 1";

/// How long a new renderer may take to greet.
const START_TIMEOUT: Duration = Duration::from_secs(20);

/// What a renderer may use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// The renderer's address space in bytes (its executable, libraries and heap).
    pub memory_bytes: u64,
    /// Wall-clock time for one render, after which the renderer is killed.
    pub time: Duration,
}

impl Default for Limits {
    /// 1 GiB and 10 s: real chat templates render in well under a millisecond and a megabyte
    /// beyond the conversation's own size.
    fn default() -> Limits {
        Limits {
            memory_bytes: 1 << 30,
            time: Duration::from_secs(10),
        }
    }
}

/// Where this process renders templates that are not reviewed, once it chose.
enum Choice {
    /// In the sandbox's renderer process.
    Sandboxed(Sandbox),
    /// Here, bounded only by fuel ([`render_in_process`]).
    InProcess,
}

/// The process's choice; the first one made stands.
static CHOICE: OnceLock<Choice> = OnceLock::new();

/// Call first thing in `main`: serves renders and exits when this process was started as a
/// renderer; otherwise turns the sandbox on, with this executable as the renderer and
/// [`Limits::default`].
pub fn init() {
    serve_if_renderer();
    if let Ok(exe) = std::env::current_exe() {
        enable(exe, Vec::new(), Limits::default());
    }
}

/// Turns the sandbox on with `program args...` as the renderer (a program whose start calls
/// [`serve_if_renderer`]). The first call in a process wins; returns whether this one did.
pub fn enable(program: PathBuf, args: Vec<OsString>, limits: Limits) -> bool {
    CHOICE
        .set(Choice::Sandboxed(Sandbox {
            program,
            args,
            limits,
            renderer: Mutex::new(None),
        }))
        .is_ok()
}

/// Renders every template in this process, bounded by fuel alone (see the
/// [module](self) for what fuel does not bound): for programs that load only model files they
/// trust, such as tests. The first choice in a process wins; returns whether this one did.
pub fn render_in_process() -> bool {
    CHOICE.set(Choice::InProcess).is_ok()
}

/// The sandbox, when [`init`] or [`enable`] turned it on.
pub fn active() -> Option<&'static Sandbox> {
    match CHOICE.get() {
        Some(Choice::Sandboxed(s)) => Some(s),
        _ => None,
    }
}

/// Where an unreviewed template renders: in the sandbox (`Some`), here (`None`), or nowhere
/// when the program has not chosen ([`Error::NoSandboxChoice`]).
pub(super) fn placement() -> Result<Option<&'static Sandbox>> {
    match CHOICE.get() {
        Some(Choice::Sandboxed(s)) => Ok(Some(s)),
        Some(Choice::InProcess) => Ok(None),
        None => Err(Error::NoSandboxChoice),
    }
}

/// Whether the program has chosen where unreviewed templates render.
pub(super) fn chosen() -> bool {
    CHOICE.get().is_some()
}

/// When this process was started as a renderer, serves renders until its input ends, then exits
/// the process; otherwise returns at once.
pub fn serve_if_renderer() {
    if let Some(limit) = std::env::var_os(RENDERER_ENV) {
        let code = match serve(&limit) {
            Ok(()) => 0,
            Err(_) => 1,
        };
        std::process::exit(code);
    }
}

/// The renderer's side: limit memory, greet, answer each request line.
fn serve(limit: &OsStr) -> std::io::Result<()> {
    // The renderer is the sandbox: it compiles and renders here.
    render_in_process();
    if let Some(bytes) = limit.to_str().and_then(|s| s.parse::<u64>().ok()) {
        limit_address_space(bytes);
    }
    let mut out = std::io::stdout().lock();
    writeln!(out, "{GREETING}")?;
    out.flush()?;
    let mut template: Option<ChatTemplate> = None;
    for line in std::io::stdin().lock().lines() {
        let reply = match answer(&line?, &mut template) {
            Ok(text) => json!({ "ok": text }),
            Err(e) => json!({ "err": e.to_string() }),
        };
        serde_json::to_writer(&mut out, &reply)?;
        out.write_all(b"\n")?;
        out.flush()?;
    }
    Ok(())
}

/// Lowers the address-space limit to `bytes`, or to the hard limit when that is lower already.
/// Where the system refuses (or, as on macOS, accepts but does not enforce it), the renderer
/// still runs, bounded by the time limit.
#[cfg(unix)]
fn limit_address_space(bytes: u64) {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let hard = getrlimit(Resource::As).maximum;
    let bytes = hard.map_or(bytes, |h| h.min(bytes));
    let limit = Rlimit {
        current: Some(bytes),
        maximum: hard,
    };
    // Refused: the time limit still holds.
    let _ = setrlimit(Resource::As, limit);
}

#[cfg(not(unix))]
fn limit_address_space(_bytes: u64) {}

/// Renders one request, compiling its template unless it is the one compiled last.
fn answer(line: &str, template: &mut Option<ChatTemplate>) -> Result<String> {
    let bad = |what: &str| Error::TemplateRenderer(format!("malformed request: {what}"));
    let req: Json = serde_json::from_str(line).map_err(|e| bad(&e.to_string()))?;
    let text = |key: &str| req[key].as_str().ok_or_else(|| bad(key));
    let (source, bos, eos) = (text("source")?, text("bos")?, text("eos")?);
    let same = template
        .as_ref()
        .is_some_and(|t| t.source == source && t.bos_token == bos && t.eos_token == eos);
    if !same {
        // The renderer renders in process (`serve`): this compiles here.
        *template = Some(ChatTemplate::new(source, bos, eos)?);
    }
    let Some(t) = template else {
        return Err(bad("no template"));
    };
    if req["check"].as_bool() == Some(true) {
        return Ok(String::new());
    }
    if !req["request"].is_null() {
        let request = RenderRequest::from_json(&req["request"]).ok_or_else(|| bad("request"))?;
        return t.render_request_here(&request);
    }
    let add_generation_prompt = req["add_generation_prompt"]
        .as_bool()
        .ok_or_else(|| bad("add_generation_prompt"))?;
    let messages = req["messages"]
        .as_array()
        .ok_or_else(|| bad("messages"))?
        .iter()
        .map(|m| match (m[0].as_str(), m[1].as_str()) {
            (Some(role), Some(content)) => Ok(Message::new(role, content)),
            _ => Err(bad("messages")),
        })
        .collect::<Result<Vec<_>>>()?;
    t.render_here(&messages, add_generation_prompt)
}

/// The renderer of a process whose sandbox is on.
#[derive(Debug)]
pub struct Sandbox {
    program: PathBuf,
    args: Vec<OsString>,
    limits: Limits,
    /// The running renderer, started at the first render and after each failure.
    renderer: Mutex<Option<Renderer>>,
}

impl Sandbox {
    /// The limits each render runs under.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// The running renderer's process id, if one is running.
    pub fn renderer_pid(&self) -> Option<u32> {
        let slot = self.renderer.lock().unwrap_or_else(PoisonError::into_inner);
        slot.as_ref().map(|r| r.child.id())
    }

    /// Compiles `template` in the renderer, to report a template that does not compile (or
    /// takes longer than the time limit to) without compiling it in this process.
    pub fn check(&self, template: &ChatTemplate) -> Result<()> {
        self.exchange(
            template,
            json!({ "messages": [], "add_generation_prompt": false, "check": true }),
        )
        .map(drop)
    }

    /// Renders `messages` with `template` in the renderer. Renders are serialized: each takes
    /// microseconds for real templates.
    pub fn render(
        &self,
        template: &ChatTemplate,
        messages: &[Message],
        add_generation_prompt: bool,
    ) -> Result<String> {
        let messages: Vec<[&str; 2]> = messages
            .iter()
            .map(|m| [m.role.as_str(), m.content.as_str()])
            .collect();
        self.exchange(
            template,
            json!({ "messages": messages, "add_generation_prompt": add_generation_prompt }),
        )
    }

    /// [`ChatTemplate::render_request`] in the renderer.
    pub fn render_request(&self, template: &ChatTemplate, req: &RenderRequest) -> Result<String> {
        self.exchange(template, json!({ "request": req.to_json() }))
    }

    /// One request (the template's fields added to `fields`) and its reply.
    fn exchange(&self, template: &ChatTemplate, mut fields: Json) -> Result<String> {
        fields["source"] = json!(template.source);
        fields["bos"] = json!(template.bos_token);
        fields["eos"] = json!(template.eos_token);
        let mut request =
            serde_json::to_vec(&fields).map_err(|e| Error::TemplateRenderer(e.to_string()))?;
        request.push(b'\n');

        let mut slot = self.renderer.lock().unwrap_or_else(PoisonError::into_inner);
        // A renderer left from an earlier render may have exited since (a Ctrl-C reaches the
        // whole process group): one restart covers that.
        let mut restarted = false;
        loop {
            let renderer = match slot.as_mut() {
                Some(r) => r,
                None => slot.insert(self.start()?),
            };
            if renderer.send(&request).is_err() {
                let gone = slot.take().map(Renderer::stop).unwrap_or_default();
                if !restarted {
                    restarted = true;
                    continue;
                }
                return Err(Error::TemplateRenderer(format!(
                    "the renderer stopped before the request was sent{gone}"
                )));
            }
            return match renderer.lines.recv_timeout(self.limits.time) {
                Ok(Ok(line)) => parse_reply(&line),
                Err(RecvTimeoutError::Timeout) => {
                    slot.take().map(Renderer::stop);
                    Err(Error::TemplateRenderer(format!(
                        "compiling or rendering took longer than {:?}; the renderer was stopped",
                        self.limits.time
                    )))
                }
                Ok(Err(_)) | Err(RecvTimeoutError::Disconnected) => {
                    let why = slot.take().map(Renderer::stop).unwrap_or_default();
                    Err(Error::TemplateRenderer(format!(
                        "the renderer died while rendering (its memory limit is {} MiB){why}",
                        self.limits.memory_bytes >> 20
                    )))
                }
            };
        }
    }

    /// Starts the renderer now, when none is running, so that the first render does not wait
    /// for a process to start. Best effort: a failure here is met again at the first render.
    pub fn prestart(&self) {
        let mut slot = self.renderer.lock().unwrap_or_else(PoisonError::into_inner);
        if slot.is_none() {
            *slot = self.start().ok();
        }
    }

    /// Starts a renderer and waits for its greeting.
    fn start(&self) -> Result<Renderer> {
        let failed = |e: &dyn std::fmt::Display| {
            Error::TemplateRenderer(format!(
                "starting {} as the renderer: {e}",
                self.program.display()
            ))
        };
        let mut child = Command::new(&self.program)
            .args(&self.args)
            .env(RENDERER_ENV, self.limits.memory_bytes.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| failed(&e))?;
        let (stdin, stdout, stderr) =
            match (child.stdin.take(), child.stdout.take(), child.stderr.take()) {
                (Some(i), Some(o), Some(e)) => (i, o, e),
                _ => return Err(failed(&"its pipes are missing")),
            };
        let (tx, lines) = mpsc::channel();
        std::thread::Builder::new()
            .name("template-renderer-out".into())
            .spawn(move || {
                for line in BufReader::new(stdout).lines() {
                    let end = line.is_err();
                    if tx.send(line).is_err() || end {
                        break;
                    }
                }
            })
            .map_err(|e| failed(&e))?;
        let stderr_tail = std::thread::Builder::new()
            .name("template-renderer-err".into())
            .spawn(move || keep_tail(stderr))
            .map_err(|e| failed(&e))?;
        let renderer = Renderer {
            child,
            stdin,
            lines,
            stderr_tail: Some(stderr_tail),
        };
        // Whatever comes before the greeting (a test harness's banner, on its line too) is skipped.
        loop {
            match renderer.lines.recv_timeout(START_TIMEOUT) {
                Ok(Ok(line)) if line.ends_with(GREETING) => return Ok(renderer),
                Ok(Ok(_)) => continue,
                Ok(Err(e)) => return Err(failed(&format!("{e}{}", renderer.stop()))),
                Err(_) => {
                    return Err(failed(&format!(
                        "no greeting within {START_TIMEOUT:?}{}",
                        renderer.stop()
                    )))
                }
            }
        }
    }
}

/// A reply line: the text, or the renderer's error.
fn parse_reply(line: &str) -> Result<String> {
    let reply: Json = serde_json::from_str(line)
        .map_err(|e| Error::TemplateRenderer(format!("malformed reply: {e}")))?;
    match (reply["ok"].as_str(), reply["err"].as_str()) {
        (Some(text), _) => Ok(text.to_string()),
        (None, Some(message)) => Err(Error::TemplateRenderer(message.to_string())),
        (None, None) => Err(Error::TemplateRenderer("malformed reply".into())),
    }
}

/// Keeps the first and the last few kilobytes a renderer writes to its standard error: an
/// allocation failure or panic message comes first, a backtrace may follow.
fn keep_tail(mut from: impl Read) -> Vec<u8> {
    const KEEP: usize = 4096;
    let mut buf = [0u8; 1024];
    let (mut head, mut tail) = (Vec::new(), Vec::new());
    while let Ok(n @ 1..) = from.read(&mut buf) {
        let room = KEEP.saturating_sub(head.len()).min(n);
        head.extend_from_slice(&buf[..room]);
        tail.extend_from_slice(&buf[room..n]);
        let excess = tail.len().saturating_sub(KEEP);
        tail.drain(..excess);
    }
    head.push(b'\n');
    head.extend_from_slice(&tail);
    head
}

/// A running renderer process.
#[derive(Debug)]
struct Renderer {
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<std::io::Result<String>>,
    /// Ends, with what the renderer last wrote to standard error, when the process does.
    stderr_tail: Option<JoinHandle<Vec<u8>>>,
}

impl Renderer {
    fn send(&mut self, request: &[u8]) -> std::io::Result<()> {
        self.stdin.write_all(request)?;
        self.stdin.flush()
    }

    /// Kills and reaps the renderer; describes how it ended and what it last wrote to standard
    /// error, as text to append to a message.
    fn stop(mut self) -> String {
        let _ = self.child.kill();
        let status = self.child.wait();
        let tail = self
            .stderr_tail
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or_default();
        let tail = String::from_utf8_lossy(&tail);
        // The allocation failure or panic message, not the backtrace after it.
        let last = tail
            .lines()
            .find(|l| l.contains("memory allocation") || l.contains("panicked"))
            .or_else(|| tail.lines().rev().find(|l| !l.trim().is_empty()));
        let mut out = match status {
            Ok(s) => format!(" ({s})"),
            Err(_) => String::new(),
        };
        if let Some(line) = last {
            out.push_str(&format!(": {}", line.trim()));
        }
        out
    }
}

impl Drop for Renderer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
