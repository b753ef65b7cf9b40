//! llama-server's `--sleep-idle-seconds`: after that long with nothing to do, the scheduler
//! hands its finished pages to the store and drops its context (the KV page pool and the
//! compute buffers), keeping a one-page stand-in; the next request that needs the model
//! builds the context again. The weights stay mapped (clean file pages the system reclaims
//! under pressure); the tokenizer keeps serving the endpoints that need no context.

use std::time::Duration;

use engine::{Context, ContextParams, PAGE_TOKENS};

use super::{Metrics, Scheduler};

/// The context a sleeping scheduler holds instead of its own: one page, one token a batch.
fn stand_in(params: &ContextParams) -> ContextParams {
    ContextParams {
        n_ctx: PAGE_TOKENS,
        kv_tokens: PAGE_TOKENS,
        n_batch: 1,
        // It evaluates nothing, and has no store to spill to.
        kv_ram: 0,
        ..params.clone()
    }
}

impl Scheduler {
    /// How long the scheduler waits idle before it sleeps, when it may.
    pub(super) fn sleep_due(&self) -> Option<Duration> {
        match self.sleep {
            Some((after, None)) => Some(after),
            _ => None,
        }
    }

    /// Goes to sleep: finished pages go to the store, the resident sequences and the context
    /// are dropped.
    pub(super) fn fall_asleep(&mut self) {
        let Some((after, None)) = self.sleep else {
            return;
        };
        let params = self.ctx.params().clone();
        let small = match Context::new(std::sync::Arc::clone(&self.model), stand_in(&params)) {
            Ok(c) => c,
            Err(e) => {
                self.metrics
                    .log(format!("sleep: no stand-in context ({e}); staying awake"));
                self.sleep = None;
                return;
            }
        };
        self.export_due(true);
        self.cached.clear();
        for slot in &mut self.slots {
            slot.last = None;
        }
        self.metrics.spill_context_dropped(&self.ctx.stats());
        drop(std::mem::replace(&mut self.ctx, small));
        self.sleep = Some((after, Some(params)));
        Metrics::set(&self.metrics.sleeping, 1);
        self.metrics.sleep_changed.notify_one();
        self.metrics.log(format!(
            "sleeping after {} s idle: the KV pool is released",
            after.as_secs()
        ));
    }

    /// Wakes up for a command that needs the model: the context is built again.
    pub(super) fn wake(&mut self) {
        let Some((after, Some(params))) = self.sleep.clone() else {
            return;
        };
        // Built as at start: with a RAM budget, it spills to the prompt cache's store.
        let built = Context::new(std::sync::Arc::clone(&self.model), params).and_then(|mut c| {
            crate::spill_to_store(&mut c, self.store.as_deref())?;
            Ok(c)
        });
        match built {
            Ok(c) => {
                drop(std::mem::replace(&mut self.ctx, c));
                self.sleep = Some((after, None));
                Metrics::set(&self.metrics.sleeping, 0);
                self.metrics.sleep_changed.notify_one();
                self.metrics.log("awake".to_owned());
            }
            Err(e) => self.metrics.log(format!(
                "waking up failed ({e}); requests get errors until it works"
            )),
        }
    }
}
