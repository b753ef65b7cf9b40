//! `/slots`: the slots as llama-server's JSON, and save, restore and erase of a slot's last
//! conversation as named checkpoints of the store.

use std::time::Instant;

use engine::store::{CheckpointMeta, SessionStore, OWNER_SLOT};
use serde_json::json;

use super::{Scheduler, SlotAction};
use crate::error::{Result, ServerError};

impl Scheduler {
    pub(super) fn slots_json(&self) -> serde_json::Value {
        let n_ctx = self.ctx.params().n_ctx;
        let slots: Vec<_> = self
            .slots
            .iter()
            .enumerate()
            .map(|(id, s)| {
                let seq = s.active.as_ref().map(|a| a.seq).or(s.last);
                let n_past = seq
                    .and_then(|q| self.ctx.tokens(q).ok())
                    .map_or(0, <[u32]>::len);
                json!({
                    "id": id,
                    "n_ctx": n_ctx,
                    "is_processing": s.active.is_some(),
                    "n_past": n_past,
                    "n_decoded": s.active.as_ref().map_or(0, |a| a.generated.len()),
                    "n_cached": s.active.as_ref().map_or(0, |a| a.cache_n),
                })
            })
            .collect();
        serde_json::Value::Array(slots)
    }

    pub(super) fn slot_action(
        &mut self,
        id: usize,
        action: SlotAction,
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
        match action {
            SlotAction::Save { name, overwrite } => {
                let seq = slot.last.ok_or_else(|| {
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
                    "filename": name,
                    "n_saved": n_saved,
                    "n_written": summary.bytes_written,
                    "timings": { "save_ms": ms() },
                }))
            }
            SlotAction::Restore(name) => {
                if !slot_store.exists(&name)? {
                    return Err(ServerError::BadRequest(format!(
                        "no saved slot named {name:?}"
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
                    "filename": name,
                    "n_restored": n_restored,
                    "n_read": n_read,
                    "timings": { "restore_ms": ms() },
                }))
            }
            SlotAction::Erase => {
                let n_erased = match self.slots[id].last.take() {
                    Some(seq) => {
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
fn claim_to_save(store: &SessionStore, name: &str, overwrite: bool) -> Result<kvstore::Claim> {
    let claim = kvstore::claim(store.root(), name).map_err(|e| match e {
        kvstore::StoreError::Busy { pids, .. } => {
            let who = match pids.first() {
                Some(pid) => format!("process {pid}"),
                None => "another process".to_owned(),
            };
            ServerError::Conflict(format!(
                "{name:?} is in use by {who}; the slot was not saved (choose another filename)"
            ))
        }
        e => ServerError::Engine(e.into()),
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
        "a checkpoint named {name:?} exists, saved by {owner}; the slot was not saved \
         (send \"overwrite\": true to replace it, or choose another filename)"
    )))
}
