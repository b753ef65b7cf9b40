//! The background threads: the write-behind spiller and the prefetcher.

use std::sync::Arc;
use std::thread::JoinHandle;

use ckptfmt::BlockId;

use crate::error::{Result, StoreError};
use crate::io::BlockIo;
use crate::state::WriteKind;
use crate::store::{lock_mutex, Shared};
use crate::tier::Access;

/// Starts the spiller and the prefetcher.
pub(crate) fn spawn<V: BlockIo>(shared: &Arc<Shared<V>>) -> Result<Vec<JoinHandle<()>>> {
    let mut workers = Vec::new();
    let s = Arc::clone(shared);
    workers.push(
        std::thread::Builder::new()
            .name("kvstore-spill".into())
            .spawn(move || s.spill_worker())
            .map_err(|e| StoreError::io("spawn", "kvstore-spill", e))?,
    );
    let s = Arc::clone(shared);
    workers.push(
        std::thread::Builder::new()
            .name("kvstore-prefetch".into())
            .spawn(move || s.prefetch_worker())
            .map_err(|e| StoreError::io("spawn", "kvstore-prefetch", e))?,
    );
    Ok(workers)
}

impl<V: BlockIo> Shared<V> {
    /// Brings `ids` into RAM with up to `prefetch_readers` concurrent
    /// readers (scoped threads, joined before returning). Returns how many
    /// blocks were read from disk.
    pub(crate) fn prefetch_ids(&self, ids: &[BlockId]) -> Result<usize> {
        let readers = self.cfg.prefetch_readers.clamp(1, 64).min(ids.len().max(1));
        let read_part = |k: usize| -> Result<usize> {
            let mut n = 0;
            for id in ids.iter().skip(k).step_by(readers) {
                let was_cold = lock_mutex(&self.state)
                    .entries
                    .get(id)
                    .is_some_and(|e| e.ram.is_none());
                self.get(id, Access::Prefetch)?;
                if was_cold {
                    n += 1;
                }
            }
            Ok(n)
        };
        let n = if readers == 1 {
            read_part(0)?
        } else {
            std::thread::scope(|scope| -> Result<usize> {
                let mut handles = Vec::with_capacity(readers - 1);
                for k in 1..readers {
                    let h = std::thread::Builder::new()
                        .name("kvstore-prefetch-reader".into())
                        .spawn_scoped(scope, move || read_part(k))
                        .map_err(|e| StoreError::io("spawn", "kvstore-prefetch-reader", e))?;
                    handles.push(h);
                }
                let mut total = read_part(0);
                for h in handles {
                    let r = h.join().unwrap_or(Err(StoreError::ShutDown));
                    total = match (total, r) {
                        (Ok(a), Ok(b)) => Ok(a + b),
                        (Err(e), _) | (_, Err(e)) => Err(e),
                    };
                }
                total
            })?
        };
        lock_mutex(&self.state).m.prefetched_blocks += n as u64;
        Ok(n)
    }

    fn spill_worker(&self) {
        loop {
            let mut st = lock_mutex(&self.state);
            while st.spill_queue.is_empty() && !st.shutdown {
                st = self.wait(st);
            }
            if st.shutdown {
                return;
            }
            let (ids, items) = st.claim_spill_batch(self.cfg.spill_batch_bytes);
            let (mut st, r) = self.write_unlocked(st, &items, WriteKind::Spill);
            let unwritten: Vec<BlockId> = ids
                .iter()
                .filter(|id| !items.iter().any(|i| i.id == **id))
                .copied()
                .collect();
            st.release_unwritten(&unwritten);
            if let Err(e) = r {
                st.m.spill_errors += 1;
                st.last_spill_error = Some(Arc::new(e));
            }
            drop(st);
            self.cond.notify_all();
        }
    }

    fn prefetch_worker(&self) {
        loop {
            let job = {
                let mut st = lock_mutex(&self.state);
                loop {
                    if st.shutdown {
                        return;
                    }
                    if let Some(job) = st.prefetch_queue.pop_front() {
                        break job;
                    }
                    st = self.wait(st);
                }
            };
            let r = self.prefetch_ids(&job.ids);
            let _ = job.done.send(r);
        }
    }
}
