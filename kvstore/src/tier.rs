//! The tiers: get (with promotion from disk), put, pin, and making room in
//! RAM under the budget.

use std::borrow::Cow;
use std::sync::{Arc, MutexGuard};

use ckptfmt::{BlockId, BlockView, FormatError};

use crate::bytes::KvBytes;
use crate::error::{Result, StoreError};
use crate::io::BlockIo;
use crate::state::{Entry, State, WriteKind};
use crate::store::{lock_mutex, ModelInfo, Shared};

/// What a get does besides returning the bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    /// A caller's read: counted as a hit or miss.
    Get,
    /// A caller's read that also pins the block.
    Pin,
    /// A prefetch: neither counted nor pinned.
    Prefetch,
    /// A caller's read that does not promote a block read from disk into RAM (a restore that
    /// copies the bytes elsewhere at once): counted, never cached.
    Peek,
}

/// Whether a put keeps the block pinned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Hold {
    /// Cached under the eviction policy.
    Cache,
    /// Pinned until unpinned.
    Pin,
}

/// A block file read and verified.
struct ReadBlock {
    data: KvBytes,
    prev: Option<BlockId>,
    tokens: Vec<u32>,
    file_len: u64,
}

impl<V: BlockIo> Shared<V> {
    /// Whether block `id` is in the index, or its file exists (then it is
    /// added to the index: another process wrote it).
    ///
    /// A block the index knows as written is looked for again (one `stat`): another
    /// process's gc or `rm` may have removed its file. Then the index forgets the file: a copy
    /// still in RAM becomes dirty (it is written again), a block without one is no longer
    /// held, so the caller puts it again rather than relying on a file that is gone.
    pub(crate) fn contains(&self, model: usize, info: &ModelInfo<V>, id: &BlockId) -> bool {
        let written = lock_mutex(&self.state)
            .entries
            .get(id)
            .map(|e| e.on_disk && !e.in_flight);
        match written {
            Some(false) => return true,
            Some(true) => {
                if info.store.has_block(id).unwrap_or(true) {
                    return true;
                }
                let mut st = lock_mutex(&self.state);
                st.lost_file(id, info.record_len);
                return st.entries.contains_key(id);
            }
            None => {}
        }
        if !info.store.has_block(id).unwrap_or(false) {
            return false;
        }
        let mut st = lock_mutex(&self.state);
        if !st.entries.contains_key(id) {
            st.entries
                .insert(*id, Entry::on_disk(model, info.block_bytes));
            st.disk_bytes += info.record_len;
        }
        true
    }

    pub(crate) fn touch_if_present(&self, id: &BlockId) -> bool {
        let mut st = lock_mutex(&self.state);
        let t = st.next_tick();
        let len = match st.entries.get_mut(id) {
            Some(e) => {
                e.last_access = t;
                e.len
            }
            None => return false,
        };
        st.m.dedup_blocks += 1;
        st.m.dedup_bytes += len;
        st.policy.touch(id);
        true
    }

    pub(crate) fn put(
        &self,
        model: usize,
        info: &ModelInfo<V>,
        prev: Option<&BlockId>,
        tokens: &[u32],
        kv: KvBytes,
        hold: Hold,
    ) -> Result<BlockId> {
        self.writable("put")?;
        let tpb = info.geometry.tokens_per_block() as usize;
        if tokens.len() != tpb {
            return Err(StoreError::Invalid {
                what: "block tokens",
                detail: format!("{} tokens, a block holds {tpb}", tokens.len()),
            });
        }
        if kv.len() as u64 != info.block_bytes {
            return Err(StoreError::Invalid {
                what: "block KV",
                detail: format!("{} bytes, a block holds {}", kv.len(), info.block_bytes),
            });
        }
        let id = BlockId::chain(&info.fp, prev, tokens);
        // A block another process wrote is found on disk and not written again.
        self.contains(model, info, &id);
        let pin = hold == Hold::Pin;
        let len = kv.len() as u64;
        let mut kv = Some(kv);
        let mut st = lock_mutex(&self.state);
        let t = st.next_tick();
        while let Some(e) = st.entries.get_mut(&id) {
            e.last_access = t;
            if e.ram.is_none() && e.in_flight {
                // Its file is being collected: wait for the outcome.
                st = self.wait(st);
                continue;
            }
            if e.ram.is_none() {
                // On disk only: the caller hands us the bytes, keep them.
                e.ram = kv.take();
                e.chain = Some((prev.copied(), Arc::from(tokens)));
                st.ram_bytes += len;
                st.policy.insert(id, len);
            } else {
                st.policy.touch(&id);
            }
            st.m.dedup_blocks += 1;
            st.m.dedup_bytes += len;
            if pin {
                self.pin_locked(&mut st, &id)?;
            }
            let (st, r) = self.make_room(st);
            drop(st);
            r?;
            return Ok(id);
        }
        if st.pinned_bytes + len > self.cfg.ram_budget {
            return Err(StoreError::RamFull {
                needed: len,
                pinned: st.pinned_bytes,
                budget: self.cfg.ram_budget,
            });
        }
        st.entries.insert(
            id,
            Entry {
                ram: kv.take(),
                on_disk: false,
                found: false,
                pins: u32::from(pin),
                last_access: t,
                chain: Some((prev.copied(), Arc::from(tokens))),
                ..Entry::on_disk(model, len)
            },
        );
        st.ram_bytes += len;
        if pin {
            st.pinned_bytes += len;
        } else {
            st.policy.insert(id, len);
        }
        let (mut st, r) = self.make_room(st);
        if let Err(e) = r {
            // Roll back: the block was never reported stored.
            let undo = st.entries.get_mut(&id).filter(|e| {
                e.ram.is_some() && !e.on_disk && !e.in_flight && e.pins == u32::from(pin)
            });
            if let Some(e) = undo {
                e.pins = 0;
                if pin {
                    st.pinned_bytes -= len;
                }
                st.drop_ram(&id);
            }
            return Err(e);
        }
        Ok(id)
    }

    /// The error of the last failed background spill, as this call's error.
    fn spill_failure(st: &State) -> StoreError {
        match &st.last_spill_error {
            Some(e) => StoreError::Spill {
                source: Arc::clone(e),
            },
            None => StoreError::ShutDown,
        }
    }

    /// Evicts until the RAM tier fits its budget. Clean victims are dropped;
    /// dirty ones are spilled (queued for the spiller, or written inline).
    pub(crate) fn make_room<'a>(
        &'a self,
        mut st: MutexGuard<'a, State>,
    ) -> (MutexGuard<'a, State>, Result<()>) {
        let errors_at_start = st.m.spill_errors;
        loop {
            let items = st.pick_victims(self.cfg.ram_budget);
            let background = self.cfg.background && !st.shutdown;
            if items.is_empty() {
                let failed = background && st.m.spill_errors > errors_at_start;
                if failed {
                    let e = Self::spill_failure(&st);
                    return (st, Err(e));
                }
                if background && st.evicting_bytes > self.cfg.max_spill_backlog {
                    st = self.wait(st);
                    continue;
                }
                return (st, Ok(()));
            }
            if background {
                st.spill_queue.extend(items.iter().map(|i| i.id));
                self.cond.notify_all();
                continue;
            }
            let r;
            (st, r) = self.write_unlocked(st, &items, WriteKind::Spill);
            self.cond.notify_all();
            if let Err(e) = r {
                st.m.spill_errors += 1;
                return (st, Err(e));
            }
        }
    }

    /// Adds a pin to a block that is in RAM.
    pub(crate) fn pin_locked(&self, st: &mut State, id: &BlockId) -> Result<()> {
        let pinned = st.pinned_bytes;
        let Some(e) = st.entries.get_mut(id) else {
            return Err(StoreError::BlockNotFound { id: id.to_hex() });
        };
        if e.pins == 0 {
            if pinned + e.len > self.cfg.ram_budget {
                return Err(StoreError::RamFull {
                    needed: e.len,
                    pinned,
                    budget: self.cfg.ram_budget,
                });
            }
            let len = e.len;
            if std::mem::take(&mut e.evict_after_write) {
                st.evicting_bytes -= len;
            }
            e.pins = 1;
            st.pinned_bytes += len;
            st.policy.remove(id);
        } else {
            e.pins += 1;
        }
        Ok(())
    }

    pub(crate) fn unpin(&self, id: &BlockId) -> Result<()> {
        let mut st = lock_mutex(&self.state);
        let Some(e) = st.entries.get_mut(id).filter(|e| e.pins > 0) else {
            return Err(StoreError::NotPinned { id: id.to_hex() });
        };
        e.pins -= 1;
        if e.pins == 0 {
            let len = e.len;
            st.pinned_bytes -= len;
            st.policy.insert(*id, len);
            let (_st, r) = self.make_room(st);
            r?;
        }
        Ok(())
    }

    /// Reads and verifies a block file. A file that does not verify is
    /// quarantined (on a writable store) before the error is returned.
    fn read_block_file(&self, info: &ModelInfo<V>, id: &BlockId) -> Result<ReadBlock> {
        let p = info.store.block_path(id);
        let bytes = self
            .io
            .read(&p)
            .map_err(|e| StoreError::io("read", &p, e))?;
        let file_len = bytes.len() as u64;
        let parsed = (|| {
            let v = BlockView::parse(&bytes)?;
            v.check_owner(&info.fp, &info.geometry)?;
            if v.id() != *id {
                return Err(FormatError::BlockIdMismatch {
                    expected: id.to_hex(),
                    found: v.id().to_hex(),
                });
            }
            let (range, owned) = match v.kv()? {
                Cow::Borrowed(s) => {
                    let start = s.as_ptr() as usize - bytes.as_ptr() as usize;
                    (Some((start, s.len())), None)
                }
                Cow::Owned(o) => (None, Some(o)),
            };
            Ok((range, owned, v.prev(), v.tokens()))
        })();
        let (range, owned, prev, tokens) = match parsed {
            Ok(p) => p,
            Err(e) => {
                if e.is_corruption() && self.writable("quarantine").is_ok() {
                    // Never reused: the next save of this block writes it again.
                    let _ = info.store.quarantine_block(id);
                    lock_mutex(&self.state).lost_file(id, info.record_len);
                }
                return Err(StoreError::format(&p, e));
            }
        };
        let data = match (range, owned) {
            (Some((start, len)), _) => KvBytes::slice_of(bytes, start, len),
            (None, Some(o)) => Some(KvBytes::from_vec(o)),
            (None, None) => None,
        }
        .ok_or_else(|| StoreError::Invalid {
            what: "block payload",
            detail: format!("payload outside the record in {p:?}"),
        })?;
        Ok(ReadBlock {
            data,
            prev,
            tokens,
            file_len,
        })
    }

    /// Gets a block, promoting it from disk; pins it with [`Access::Pin`].
    pub(crate) fn get(&self, id: &BlockId, access: Access) -> Result<Option<KvBytes>> {
        let pin = access == Access::Pin;
        let count = access != Access::Prefetch;
        let mut st = lock_mutex(&self.state);
        loop {
            let t = st.next_tick();
            let Some(e) = st.entries.get_mut(id) else {
                if count {
                    st.m.misses += 1;
                }
                return Ok(None);
            };
            e.last_access = t;
            if let Some(data) = e.ram.clone() {
                let (len, evicting) = (e.len, e.evict_after_write);
                if count {
                    st.m.ram_hits += 1;
                }
                if pin {
                    self.pin_locked(&mut st, id)?;
                } else if evicting {
                    // Read while its spill is pending: keep it after all.
                    if let Some(e) = st.entries.get_mut(id) {
                        e.evict_after_write = false;
                    }
                    st.evicting_bytes -= len;
                    st.policy.insert(*id, len);
                } else {
                    st.policy.touch(id);
                }
                return Ok(Some(data));
            }
            if e.in_flight {
                // Its file is being deleted by the collector: wait for the outcome.
                st = self.wait(st);
                continue;
            }
            let model = e.model;
            let len = e.len;
            if pin && st.pinned_bytes + len > self.cfg.ram_budget {
                return Err(StoreError::RamFull {
                    needed: len,
                    pinned: st.pinned_bytes,
                    budget: self.cfg.ram_budget,
                });
            }
            drop(st);
            let info = self.model_info(model);
            let read = self.read_block_file(&info, id);
            st = lock_mutex(&self.state);
            let r = match read {
                Ok(r) => r,
                Err(e) => {
                    let gone = e
                        .io_error()
                        .is_some_and(|io| io.kind() == std::io::ErrorKind::NotFound);
                    if gone {
                        // Collected (here or by another process) while we
                        // looked: a miss now, unless rewritten meanwhile.
                        st.lost_file(id, info.record_len);
                        continue;
                    }
                    return Err(e);
                }
            };
            st.m.bytes_read += r.file_len;
            if access == Access::Peek {
                st.m.disk_hits += 1;
                return Ok(Some(r.data));
            }
            let Some(e) = st.entries.get_mut(id) else {
                continue;
            };
            if e.ram.is_some() {
                // Promoted by someone else meanwhile.
                continue;
            }
            e.ram = Some(r.data.clone());
            e.chain = Some((r.prev, Arc::from(r.tokens)));
            st.ram_bytes += len;
            st.m.promotions += 1;
            if count {
                st.m.disk_hits += 1;
            }
            if pin {
                if let Err(e) = self.pin_locked(&mut st, id) {
                    st.policy.insert(*id, len);
                    return Err(e);
                }
            } else {
                st.policy.insert(*id, len);
            }
            let (mut st, res) = self.make_room(st);
            if res.is_err() && !pin {
                // The copy could not be kept; the caller still gets the data.
                if st
                    .entries
                    .get(id)
                    .is_some_and(|e| e.on_disk && !e.in_flight)
                {
                    st.drop_ram(id);
                }
            }
            return Ok(Some(r.data));
        }
    }
}
