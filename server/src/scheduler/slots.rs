//! `/slots`: the slots as llama-server's JSON, and save, restore and erase of a slot's last
//! conversation as named checkpoints of the store.
//!
//! With API keys (and `--cache-isolation` other than `none`) a slot's conversation is its
//! namespace's ([`SlotScope`]): a request saves or erases it only from that namespace, and
//! otherwise finds the slot as empty. Each key's saves have names of their own
//! ([`slot_file`]): another key's save of a name is not found, nor replaced.

use std::time::Instant;

use engine::store::{CheckpointMeta, Claim, SessionStore, OWNER_SLOT};
use serde_json::json;

use super::{Scheduler, SlotAction};
use crate::error::{Result, ServerError};

/// Whose conversations a `/slots` request may save or erase.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotScope {
    /// Every slot's, as llama-server (no API keys, or `--cache-isolation none`).
    All,
    /// Those in this namespace: the request's key's, with its `cache_salt`.
    Namespace(engine::Namespace),
    /// None (`--cache-isolation salt` with keys: a namespace there does not tell the keys
    /// apart, so no conversation is known to be the request's).
    Nothing,
}

impl SlotScope {
    /// Whether a conversation in namespace `ns` is in scope.
    fn holds(self, ns: Option<engine::Namespace>) -> bool {
        match self {
            SlotScope::All => true,
            SlotScope::Namespace(own) => ns == Some(own),
            SlotScope::Nothing => false,
        }
    }
}

/// What separates a tenant from a filename in the name of its save (a filename never holds
/// two dots in a row).
const TENANT_MARK: &str = "..";

/// The checkpoint name of `tenant`'s slot save `filename`: `TENANT..FILENAME`, or the filename
/// alone without a tenant.
pub fn slot_file(tenant: Option<&str>, filename: &str) -> String {
    match tenant {
        Some(t) => format!("{t}{TENANT_MARK}{filename}"),
        None => filename.to_owned(),
    }
}

/// The filename the client gave for the save named `file` ([`slot_file`]).
fn client_filename(file: &str) -> &str {
    file.split_once(TENANT_MARK).map_or(file, |(_, f)| f)
}

impl Scheduler {
    /// The slots as llama-server's `/slots` JSON; a slot whose conversation is out of `scope`
    /// shows none (no tokens), though whether it is processing shows.
    pub(super) fn slots_json(&self, scope: SlotScope) -> serde_json::Value {
        let n_ctx = self.ctx.params().n_ctx;
        let slots: Vec<_> = self
            .slots
            .iter()
            .enumerate()
            .map(|(id, s)| {
                let seq = s.active.as_ref().map(|a| a.seq).or(s.last);
                let shown = seq.filter(|&q| scope.holds(self.ctx.namespace(q).ok().flatten()));
                let active = s.active.as_ref().filter(|_| shown.is_some());
                let n_past = shown
                    .and_then(|q| self.ctx.tokens(q).ok())
                    .map_or(0, <[u32]>::len);
                json!({
                    "id": id,
                    "n_ctx": n_ctx,
                    "is_processing": s.active.is_some(),
                    "n_past": n_past,
                    "n_decoded": active.map_or(0, |a| a.generated.len()),
                    "n_cached": active.map_or(0, |a| a.cache_n),
                })
            })
            .collect();
        serde_json::Value::Array(slots)
    }

    /// Saves, restores or erases slot `id`'s conversation, within `scope`; a conversation out
    /// of scope answers as none.
    pub(super) fn slot_action(
        &mut self,
        id: usize,
        action: SlotAction,
        scope: SlotScope,
    ) -> Result<serde_json::Value> {
        let n_slots = self.slots.len();
        let slot = self
            .slots
            .get(id)
            .ok_or(ServerError::UnknownSlot { id, n_slots })?;
        if slot.active.is_some() {
            return Err(ServerError::BadRequest(format!(
                "slot {id} is processing a request"
            )));
        }
        let slot_store = self.slot_store.clone().ok_or(ServerError::NotEnabled {
            what: "saving and restoring slots",
            how: "give --slot-save-path, or run with the prompt cache",
        })?;
        let started = Instant::now();
        let ms = || started.elapsed().as_secs_f64() * 1e3;
        let last = slot
            .last
            .filter(|&q| scope.holds(self.ctx.namespace(q).ok().flatten()));
        match action {
            SlotAction::Save { name, overwrite } => {
                let seq = last.ok_or_else(|| {
                    ServerError::BadRequest(format!("slot {id} holds no conversation to save"))
                })?;
                // Held until the save is committed: no chat can take the name meanwhile.
                let _claim = claim_to_save(&slot_store, &name, overwrite)?;
                let meta = CheckpointMeta {
                    owner: Some(OWNER_SLOT.to_owned()),
                    ..CheckpointMeta::default()
                };
                let summary = slot_store.save_seq(&self.ctx, seq, &name, &meta)?;
                let n_saved = self.ctx.tokens(seq)?.len();
                Ok(json!({
                    "id_slot": id,
                    "filename": client_filename(&name),
                    "n_saved": n_saved,
                    "n_written": summary.bytes_written,
                    "timings": { "save_ms": ms() },
                }))
            }
            SlotAction::Restore(name) => {
                if !slot_store.exists(&name)? {
                    return Err(ServerError::BadRequest(format!(
                        "no saved slot named {:?}",
                        client_filename(&name)
                    )));
                }
                let seq = self.ctx.new_sequence();
                let mut result = slot_store.restore_seq(&mut self.ctx, seq, &name);
                if let Err(engine::Error::OutOfPages { needed, .. }) = result {
                    self.make_room(needed);
                    result = slot_store.restore_seq(&mut self.ctx, seq, &name);
                }
                if let Err(e) = result {
                    let _ = self.ctx.remove_sequence(seq);
                    return Err(e.into());
                }
                let n_restored = self.ctx.tokens(seq)?.len();
                let n_read = self.ctx.span_bytes(n_restored);
                self.slots[id].last = Some(seq);
                self.cached.push_back(seq);
                Ok(json!({
                    "id_slot": id,
                    "filename": client_filename(&name),
                    "n_restored": n_restored,
                    "n_read": n_read,
                    "timings": { "restore_ms": ms() },
                }))
            }
            SlotAction::Erase => {
                let n_erased = match last {
                    Some(seq) => {
                        self.slots[id].last = None;
                        let n = self.ctx.tokens(seq).map_or(0, <[u32]>::len);
                        self.cached.retain(|&s| s != seq);
                        // Its pages leave the pool, not the prompt cache.
                        self.export(seq);
                        let _ = self.ctx.remove_sequence(seq);
                        n
                    }
                    None => 0,
                };
                Ok(json!({ "id_slot": id, "n_erased": n_erased }))
            }
        }
    }
}

/// Claims `name` for a slot save: refused (409) while another process (a chat, another server)
/// holds it, and when a checkpoint of that name exists that no slot save wrote, unless the
/// client sent `"overwrite": true`. The claim is released when dropped.
fn claim_to_save(store: &SessionStore, name: &str, overwrite: bool) -> Result<Claim> {
    let shown = client_filename(name);
    let claim = store.claim(name).map_err(|e| match e.busy_pids() {
        Some(pids) => {
            let who = match pids.first() {
                Some(pid) => format!("process {pid}"),
                None => "another process".to_owned(),
            };
            ServerError::Conflict(format!(
                "{shown:?} is in use by {who}; the slot was not saved (choose another filename)"
            ))
        }
        None => ServerError::Engine(e),
    })?;
    if overwrite || !store.exists(name)? {
        return Ok(claim);
    }
    let owner = match store.read_checkpoint(name) {
        Ok((_, meta)) if meta.owner.as_deref() == Some(OWNER_SLOT) => return Ok(claim),
        Ok((_, meta)) => meta
            .owner
            .map_or_else(|| "another program".to_owned(), |o| format!("the {o}")),
        Err(_) => "another program (it cannot be read)".to_owned(),
    };
    Err(ServerError::Conflict(format!(
        "a checkpoint named {shown:?} exists, saved by {owner}; the slot was not saved \
         (send \"overwrite\": true to replace it, or choose another filename)"
    )))
}
