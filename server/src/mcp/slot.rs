//! One configured MCP server across its lives: the child that runs now (started on demand,
//! `initialize`d before anyone else uses it), started again after it dies, with a pause after
//! a start that failed so that a broken server is not started once per call.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::sync::watch;
use tokio::time::Instant;

use super::child::{CallError, Child};
use super::config::ServerConfig;
use super::{Log, START_TIMEOUT};

/// After a failed start, calls fail at once for this long instead of starting it again.
const COOLDOWN: Duration = Duration::from_secs(2);
/// The MCP version we speak.
const PROTOCOL_VERSION: &str = "2024-11-05";

/// A configured server and its current child.
pub struct Slot {
    /// Its configuration.
    pub config: ServerConfig,
    /// The child that answers calls (initialized).
    current: Mutex<Option<Arc<Child>>>,
    /// A child being initialized (seen by `shut_down`, not by callers).
    booting: Mutex<Option<Arc<Child>>>,
    /// Held while a child is started and initialized, so that one start serves every caller.
    starting: tokio::sync::Mutex<Option<Instant>>,
    stopping: watch::Receiver<bool>,
    stopped: Arc<AtomicBool>,
    log: Log,
}

impl Slot {
    /// A slot for `config`; nothing runs yet.
    pub fn new(
        config: ServerConfig,
        stopping: watch::Receiver<bool>,
        stopped: Arc<AtomicBool>,
        log: Log,
    ) -> Slot {
        Slot {
            config,
            current: Mutex::new(None),
            booting: Mutex::new(None),
            starting: tokio::sync::Mutex::new(None),
            stopping,
            stopped,
            log,
        }
    }

    /// The running, initialized child, started if there is none (its `initialize` within
    /// [`START_TIMEOUT`]).
    pub async fn child(&self) -> Result<Arc<Child>, CallError> {
        if let Some(c) = self.live() {
            return Ok(c);
        }
        let mut stopping = self.stopping.clone();
        let mut failed_at = tokio::select! {
            guard = self.starting.lock() => guard,
            _ = stopping.wait_for(|s| *s) => return Err(CallError::ShuttingDown),
        };
        if let Some(c) = self.live() {
            return Ok(c);
        }
        if let Some(at) = *failed_at {
            if at.elapsed() < COOLDOWN {
                return Err(CallError::Closed(format!(
                    "it failed to start less than {} s ago",
                    COOLDOWN.as_secs()
                )));
            }
        }
        match self.start(START_TIMEOUT).await {
            Ok(c) => {
                *failed_at = None;
                Ok(c)
            }
            Err(e) => {
                if e != CallError::ShuttingDown {
                    *failed_at = Some(Instant::now());
                }
                Err(e)
            }
        }
    }

    /// Kills the current child, if any, as the hub shuts down.
    pub fn shut_down(&self) {
        for c in [lock(&self.current).take(), lock(&self.booting).take()]
            .into_iter()
            .flatten()
        {
            c.shut_down();
        }
    }

    /// Kills the current child (the next call starts another).
    pub fn stop_child(&self, why: &str) {
        if let Some(c) = lock(&self.current).take() {
            c.terminate(why);
        }
    }

    /// The current child, alive or not (for tests).
    #[cfg(test)]
    pub fn current(&self) -> Option<Arc<Child>> {
        lock(&self.current).clone()
    }

    fn live(&self) -> Option<Arc<Child>> {
        let current = lock(&self.current);
        current.as_ref().filter(|c| c.is_alive()).cloned()
    }

    /// Starts a child and initializes it (with `starting` held).
    async fn start(&self, init_timeout: Duration) -> Result<Arc<Child>, CallError> {
        let child = match Child::spawn(&self.config, self.stopping.clone(), self.log.clone()) {
            Ok(c) => c,
            Err(why) => {
                (self.log)(format!("MCP server {:?}: {why}", self.config.name));
                return Err(CallError::Closed(why));
            }
        };
        // Seen by `shut_down` from here on; and if the hub stopped before it could see it,
        // this start sees that.
        *lock(&self.booting) = Some(Arc::clone(&child));
        let ready = self.initialize(&child, init_timeout).await;
        lock(&self.booting).take();
        match ready {
            Ok(()) => {
                *lock(&self.current) = Some(Arc::clone(&child));
                if self.stopped.load(Ordering::SeqCst) {
                    child.shut_down();
                    return Err(CallError::ShuttingDown);
                }
                Ok(child)
            }
            Err(CallError::ShuttingDown) => {
                child.shut_down();
                Err(CallError::ShuttingDown)
            }
            Err(e) => {
                let why = format!("initialize failed: {e}");
                child.terminate(&why);
                Err(CallError::Closed(why))
            }
        }
    }

    /// MCP's handshake: `initialize`, then `notifications/initialized`.
    async fn initialize(&self, child: &Child, timeout: Duration) -> Result<(), CallError> {
        if self.stopped.load(Ordering::SeqCst) {
            return Err(CallError::ShuttingDown);
        }
        let params = json!({
            "protocolVersion": PROTOCOL_VERSION,
            "capabilities": {},
            "clientInfo": {"name": "llama-hdd", "version": env!("CARGO_PKG_VERSION")},
        });
        match child.request("initialize", params, timeout).await? {
            Value::Object(_) => {}
            _ => return Err(CallError::Rpc("its result is not an object".into())),
        }
        if !child.notify("notifications/initialized", None) {
            return Err(CallError::Closed("its input is closed or full".into()));
        }
        Ok(())
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
