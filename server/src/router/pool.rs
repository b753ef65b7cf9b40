//! The model processes of a router: each model runs in a `llama-hdd-server` process of its own
//! on a loopback port, started when a request needs it and stopped when a request for another
//! model needs its place.
//!
//! At most `--models-max` processes run (loading, loaded or stopping). A request for a model
//! that is not running waits in one first-come queue with an entry per model (requests for the
//! same model share it, and one load). The entry at its head starts its model when there is
//! room, or else stops the least recently used model that serves no request and that no
//! request waits for, one at a time; when every running model is busy it waits. A request that
//! leaves while queued leaves the queue, and costs no model its place.

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::io::AsyncBufReadExt;
use tokio::sync::{oneshot, watch};

use super::catalog::{Catalog, Entry};
use crate::error::ServerError;

/// How long a stopping process has to finish its requests and flush its cache before it is
/// killed, unless its preset says (`stop-timeout`).
const STOP_TIMEOUT: Duration = Duration::from_secs(30);

/// Where a model stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// No process.
    Unloaded,
    /// Its process is starting.
    Loading,
    /// Its process answers on this loopback port.
    Loaded(u16),
    /// Its process answers on this port but has released its KV pool
    /// (`--sleep-idle-seconds`); the next request wakes it.
    Sleeping(u16),
    /// Its process is finishing.
    Stopping,
}

impl Status {
    /// The name `/models` gives the status.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Unloaded => "unloaded",
            Status::Loading => "loading",
            Status::Loaded(_) => "loaded",
            Status::Sleeping(_) => "sleeping",
            // Still holding its place; llama-server says so until the process is gone.
            Status::Stopping => "loaded",
        }
    }

    /// The port of a process that takes requests (loaded or sleeping).
    pub fn port(self) -> Option<u16> {
        match self {
            Status::Loaded(port) | Status::Sleeping(port) => Some(port),
            _ => None,
        }
    }

    /// Whether a process holds a place.
    fn running(self) -> bool {
        !matches!(self, Status::Unloaded)
    }
}

#[derive(Debug)]
struct Instance {
    status: Status,
    /// Requests it is serving.
    busy: usize,
    last_used: Instant,
    /// Asks the process's task to stop it.
    stop: Option<oneshot::Sender<()>>,
    /// The exit status of its last process when that ended without being asked to.
    failed: Option<i32>,
    /// Bumped at each start, so a waiter can tell a failure of the load it waited for.
    generation: u64,
}

impl Instance {
    fn new() -> Instance {
        Instance {
            status: Status::Unloaded,
            busy: 0,
            last_used: Instant::now(),
            stop: None,
            failed: None,
            generation: 0,
        }
    }
}

#[derive(Default)]
struct State {
    catalog: Catalog,
    instances: HashMap<String, Instance>,
    /// Requests waiting, per model.
    wants: HashMap<String, usize>,
    /// Models waiting for a place, in the order their first request came.
    queue: VecDeque<String>,
    closing: bool,
}

/// How model processes are started.
#[derive(Clone, Debug)]
pub struct Launch {
    /// The server binary.
    pub exe: PathBuf,
    /// Options every model process gets (the router's own, less its router-only ones).
    pub shared: Vec<String>,
}

/// The router's processes and the queue for their places.
pub struct Pool {
    state: Mutex<State>,
    tick: watch::Sender<u64>,
    launch: Launch,
    max: usize,
    say: Arc<dyn Fn(String) + Send + Sync>,
}

/// A model's place held for one request: while it lives, the model is not stopped for
/// another.
pub struct Lease {
    pool: Arc<Pool>,
    name: String,
    /// The model's loopback port.
    pub port: u16,
}

impl Drop for Lease {
    fn drop(&mut self) {
        let mut st = self.pool.lock();
        if let Some(inst) = st.instances.get_mut(&self.name) {
            inst.busy = inst.busy.saturating_sub(1);
            inst.last_used = Instant::now();
        }
        drop(st);
        self.pool.bump();
    }
}

/// A request counted as waiting for a model until it is dropped.
struct Want {
    pool: Arc<Pool>,
    name: String,
}

impl Drop for Want {
    fn drop(&mut self) {
        let mut st = self.pool.lock();
        let left = st.wants.get_mut(&self.name).map_or(0, |n| {
            *n = n.saturating_sub(1);
            *n
        });
        if left == 0 {
            st.wants.remove(&self.name);
            st.queue.retain(|m| m != &self.name);
        }
        drop(st);
        self.pool.bump();
    }
}

impl Pool {
    /// A pool over `catalog`, with at most `max` processes (0: no limit).
    pub fn new(
        catalog: Catalog,
        launch: Launch,
        max: usize,
        say: Arc<dyn Fn(String) + Send + Sync>,
    ) -> Arc<Pool> {
        Arc::new(Pool {
            state: Mutex::new(State {
                catalog,
                ..State::default()
            }),
            tick: watch::channel(0).0,
            launch,
            max,
            say,
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn bump(&self) {
        self.tick.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// The catalog entry a request's `model` names: its own name, or with Ollama's `:latest`
    /// left off.
    pub fn resolve(&self, name: &str) -> Option<Entry> {
        let st = self.lock();
        st.catalog
            .get(name)
            .or_else(|| name.strip_suffix(":latest").and_then(|n| st.catalog.get(n)))
            .cloned()
    }

    /// Replaces the catalog (`/models?reload=1`); running models keep running.
    pub fn set_catalog(&self, catalog: Catalog) {
        self.lock().catalog = catalog;
        self.bump();
    }

    /// Every entry with its status and, for a failed last process, its exit status.
    pub fn list(&self) -> Vec<(Entry, Status, Option<i32>)> {
        let st = self.lock();
        st.catalog
            .values()
            .map(|e| {
                let inst = st.instances.get(&e.name);
                (
                    e.clone(),
                    inst.map_or(Status::Unloaded, |i| i.status),
                    inst.and_then(|i| i.failed),
                )
            })
            .collect()
    }

    /// The status of `name`.
    pub fn status(&self, name: &str) -> Status {
        self.lock()
            .instances
            .get(name)
            .map_or(Status::Unloaded, |i| i.status)
    }

    /// A place in `name`'s process for one request: waits for a load (starting one when
    /// `autoload`), or for a place in the queue. Dropping the future leaves the queue.
    pub async fn acquire(
        self: &Arc<Self>,
        name: &str,
        autoload: bool,
    ) -> Result<Lease, ServerError> {
        let mut rx = self.tick.subscribe();
        let mut want: Option<Want> = None;
        let mut first_generation: Option<u64> = None;
        loop {
            {
                let mut st = self.lock();
                if st.closing {
                    return Err(ServerError::ShuttingDown);
                }
                let known = st.catalog.contains_key(name);
                let inst = st
                    .instances
                    .entry(name.to_owned())
                    .or_insert_with(Instance::new);
                match inst.status {
                    Status::Loaded(port) | Status::Sleeping(port) => {
                        inst.busy += 1;
                        inst.last_used = Instant::now();
                        drop(st);
                        drop(want);
                        return Ok(Lease {
                            pool: Arc::clone(self),
                            name: name.to_owned(),
                            port,
                        });
                    }
                    // The load waited for is this generation: its failure counts.
                    Status::Loading => {
                        first_generation.get_or_insert(inst.generation.saturating_sub(1));
                    }
                    Status::Stopping => {
                        first_generation.get_or_insert(inst.generation);
                    }
                    Status::Unloaded => {
                        let first = *first_generation.get_or_insert(inst.generation);
                        if !known {
                            // Gone from the catalog (a reload) while it waited.
                            return Err(ServerError::BadRequest(format!(
                                "model '{name}' not found"
                            )));
                        }
                        // A load that began while this request waited, and failed.
                        if let Some(code) = inst.failed.filter(|_| inst.generation > first) {
                            return Err(ServerError::ModelUnavailable(format!(
                                "model '{name}' failed to load (its process exited with status {code})"
                            )));
                        }
                        if !autoload {
                            return Err(ServerError::BadRequest("model is not loaded".into()));
                        }
                        if want.is_none() {
                            *st.wants.entry(name.to_owned()).or_default() += 1;
                            want = Some(Want {
                                pool: Arc::clone(self),
                                name: name.to_owned(),
                            });
                        }
                        if !st.queue.contains(&name.to_owned()) {
                            st.queue.push_back(name.to_owned());
                        }
                        if st.queue.front().is_some_and(|m| m == name) {
                            self.advance(&mut st, name);
                        }
                    }
                }
                if want.is_none() {
                    *st.wants.entry(name.to_owned()).or_default() += 1;
                    want = Some(Want {
                        pool: Arc::clone(self),
                        name: name.to_owned(),
                    });
                }
            }
            if rx.changed().await.is_err() {
                return Err(ServerError::ShuttingDown);
            }
        }
    }

    /// Starts the queue's head `name` when there is room, or stops the model that makes room.
    fn advance(self: &Arc<Self>, st: &mut State, name: &str) {
        let running = st.instances.values().filter(|i| i.status.running()).count();
        if self.max == 0 || running < self.max {
            st.queue.pop_front();
            self.start(st, name);
            return;
        }
        if st.instances.values().any(|i| i.status == Status::Stopping) {
            return; // a place is being freed: wait for it
        }
        let victim = st
            .instances
            .iter()
            .filter(|(n, i)| {
                i.status.port().is_some()
                    && i.busy == 0
                    && st.wants.get(*n).copied().unwrap_or(0) == 0
            })
            .min_by_key(|(_, i)| i.last_used)
            .map(|(n, _)| n.clone());
        if let Some(v) = victim {
            (self.say)(format!("router: unloading {v} to make room for {name}"));
            Self::stop(st, &v);
        }
    }

    fn stop(st: &mut State, name: &str) {
        if let Some(inst) = st.instances.get_mut(name) {
            if let Some(stop) = inst.stop.take() {
                inst.status = Status::Stopping;
                let _ = stop.send(());
            }
        }
    }

    /// Starts `name`'s process (`POST /models/load`): refused when it runs, queued like a
    /// request when there is no room.
    pub fn load(self: &Arc<Self>, name: &str) -> Result<(), ServerError> {
        let pool = Arc::clone(self);
        let name = name.to_owned();
        if self.status(&name).running() {
            return Err(ServerError::BadRequest("model is already running".into()));
        }
        tokio::spawn(async move {
            // The place is taken as a request would take it, then let go at once.
            if let Err(e) = pool.acquire(&name, true).await {
                (pool.say)(format!("router: loading {name}: {e}"));
            }
        });
        Ok(())
    }

    /// Stops `name`'s process (`POST /models/unload`).
    pub fn unload(&self, name: &str) -> Result<(), ServerError> {
        let mut st = self.lock();
        match st.instances.get(name).map(|i| i.status) {
            Some(Status::Loaded(_) | Status::Sleeping(_) | Status::Loading) => {
                Self::stop(&mut st, name);
                drop(st);
                self.bump();
                Ok(())
            }
            _ => Err(ServerError::BadRequest("model is not running".into())),
        }
    }

    /// Stops every process and waits for them to end.
    pub async fn close(&self) {
        let mut rx = self.tick.subscribe();
        {
            let mut st = self.lock();
            st.closing = true;
            let names: Vec<String> = st.instances.keys().cloned().collect();
            for n in names {
                Self::stop(&mut st, &n);
            }
        }
        self.bump();
        loop {
            if !self.lock().instances.values().any(|i| i.status.running()) {
                return;
            }
            if rx.changed().await.is_err() {
                return;
            }
        }
    }

    fn start(self: &Arc<Self>, st: &mut State, name: &str) {
        let Some(entry) = st.catalog.get(name).cloned() else {
            return;
        };
        let inst = st
            .instances
            .entry(name.to_owned())
            .or_insert_with(Instance::new);
        let (stop_tx, stop_rx) = oneshot::channel();
        inst.status = Status::Loading;
        inst.stop = Some(stop_tx);
        inst.failed = None;
        inst.generation += 1;
        (self.say)(format!(
            "router: loading {name} from {}",
            entry.path.display()
        ));
        let pool = Arc::clone(self);
        tokio::spawn(async move { pool.run(entry, stop_rx).await });
    }

    fn set(&self, name: &str, f: impl FnOnce(&mut Instance)) {
        let mut st = self.lock();
        if let Some(inst) = st.instances.get_mut(name) {
            f(inst);
        }
        drop(st);
        self.bump();
    }

    /// Runs one process of `entry` until it ends or is asked to stop.
    async fn run(self: Arc<Self>, entry: Entry, mut stop: oneshot::Receiver<()>) {
        let name = entry.name.clone();
        if super::fake_timing() {
            tokio::time::sleep(super::FAKE_DELAY).await;
        }
        let mut cmd = tokio::process::Command::new(&self.launch.exe);
        cmd.args(&self.launch.shared)
            .args(&entry.args)
            .arg("--model")
            .arg(&entry.path)
            .args(["--alias", &name, "--host", "127.0.0.1", "--port", "0"])
            .env(super::CHILD_ENV, "1")
            // Its end of the pipe closes when this process ends, however it ends: the model
            // process then stops too.
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        for var in super::ROUTER_ENV {
            cmd.env_remove(var);
        }
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                (self.say)(format!("router: starting {name}: {e}"));
                self.set(&name, |i| {
                    i.status = Status::Unloaded;
                    i.failed = Some(-1);
                    i.stop = None;
                });
                return;
            }
        };
        let pid = child.id();
        let _stdin = child.stdin.take();
        let mut lines = child
            .stdout
            .take()
            .map(|o| tokio::io::BufReader::new(o).lines());
        let mut asked = false;
        // Until the process says where it listens.
        let ready = loop {
            let Some(l) = lines.as_mut() else { break None };
            tokio::select! {
                line = l.next_line() => match line {
                    Ok(Some(line)) => {
                        if let Some(port) = super::ready_port(&line) {
                            break Some(port);
                        }
                    }
                    _ => break None,
                },
                _ = &mut stop, if !asked => {
                    asked = true;
                    terminate(pid);
                }
            }
        };
        if let (Some(port), false) = (ready, asked) {
            (self.say)(format!("router: {name} is loaded (port {port})"));
            self.set(&name, |i| {
                if i.status == Status::Loading {
                    i.status = Status::Loaded(port);
                    i.last_used = Instant::now();
                }
            });
        }
        // Keep reading what it prints, so its pipe never fills: it says when it falls asleep
        // and wakes up.
        if let Some(mut l) = lines {
            let pool = Arc::clone(&self);
            let name = name.clone();
            tokio::spawn(async move {
                while let Ok(Some(line)) = l.next_line().await {
                    pool.set(&name, |i| {
                        i.status = match (i.status, line.trim()) {
                            (Status::Loaded(p), super::SLEEPING_LINE) => Status::Sleeping(p),
                            (Status::Sleeping(p), super::AWAKE_LINE) => Status::Loaded(p),
                            (s, _) => s,
                        }
                    });
                }
            });
        }
        let status = tokio::select! {
            s = child.wait() => s,
            _ = &mut stop, if !asked => {
                asked = true;
                terminate(pid);
                match tokio::time::timeout(entry.stop_timeout.unwrap_or(STOP_TIMEOUT), child.wait()).await {
                    Ok(s) => s,
                    Err(_) => {
                        let _ = child.start_kill();
                        child.wait().await
                    }
                }
            }
        };
        let code = status.ok().and_then(|s| s.code()).unwrap_or(-1);
        let failed = (!asked && code != 0).then_some(code);
        match failed {
            Some(c) => (self.say)(format!("router: {name}'s process ended with status {c}")),
            None => (self.say)(format!("router: {name} is unloaded")),
        }
        self.set(&name, |i| {
            i.status = Status::Unloaded;
            i.stop = None;
            i.failed = failed;
            i.busy = 0;
        });
    }
}

/// Asks process `pid` to finish (SIGTERM: it completes its requests and flushes its cache).
fn terminate(pid: Option<u32>) {
    if let Some(pid) = pid
        .and_then(|p| i32::try_from(p).ok())
        .and_then(rustix::process::Pid::from_raw)
    {
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
    }
}
