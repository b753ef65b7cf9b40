//! A model's blocks and checkpoints through the remote tier: read-through after the local
//! tiers, write-behind from the caller's background thread.

use std::borrow::Cow;
use std::collections::HashSet;

use ckptfmt::store::BlockInput;
use ckptfmt::{encode_block, BlockId, BlockView, Manifest, StateView};

use super::{Remote, RemoteMetrics};
use crate::bytes::KvBytes;
use crate::error::Result;
use crate::handle::ModelStore;
use crate::io::BlockIo;
use crate::store::Access;
use crate::tier::Hold;

/// What [`ModelStore::fetch_remote`] brought from the remote tier.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RemoteFetch {
    /// Leading blocks of the ids asked for that the store now holds.
    pub blocks: usize,
    /// Whether the tier answered (false: no tier, or it failed; the blocks are then those
    /// that arrived and verified before the failure).
    pub answered: bool,
}

impl<V: BlockIo> ModelStore<V> {
    /// The store's remote tier, if it has one ([`crate::Config::remote`]).
    pub fn remote(&self) -> Option<&Remote> {
        self.shared.cfg.remote.as_ref()
    }

    /// Extends a prefix from the remote tier, in one pipelined exchange: `ids` continue what
    /// the local tiers hold (the first chains from the last block held). Stops at the first
    /// block the tier lacks or whose value does not verify (checksums, owner, geometry,
    /// chained id: a bad value is counted as rejected and never used), and asks for nothing
    /// after it; each verified block is put into the RAM tier as it arrives (durable once
    /// spilled or flushed). Never fails: a tier that is absent, slow or broken brings nothing
    /// more than the blocks that arrived whole before it failed.
    pub fn fetch_remote(&self, ids: &[BlockId]) -> RemoteFetch {
        let Some(remote) = self.remote() else {
            return RemoteFetch::default();
        };
        if ids.is_empty() || self.shared.access == Access::ReadOnly {
            return RemoteFetch::default();
        }
        let keys: Vec<String> = ids
            .iter()
            .map(|id| remote.block_key(&self.info.fp, &self.info.geometry, id))
            .collect();
        // Each value is verified and kept as it arrives, while the tier sends the next; the
        // first missing or bad one ends the prefix, and nothing after it is fetched.
        let m = remote.metrics();
        let mut held = 0;
        let mut ids_left = ids.iter();
        let answered = remote
            .tier()
            .get_each(&keys, &mut |value| {
                let Some(id) = ids_left.next() else {
                    return false;
                };
                let Some(bytes) = value else {
                    RemoteMetrics::add(&m.misses, 1);
                    return false;
                };
                RemoteMetrics::add(&m.bytes_read, bytes.len() as u64);
                let Some((prev, tokens, kv)) = self.verify_record(bytes, id) else {
                    m.reject("a block");
                    return false;
                };
                let put = self.shared.put(
                    self.idx,
                    &self.info,
                    prev.as_ref(),
                    &tokens,
                    kv,
                    Hold::Cache,
                );
                if put.is_err() {
                    return false;
                }
                RemoteMetrics::add(&m.hits, 1);
                held += 1;
                true
            })
            .is_ok();
        RemoteFetch {
            blocks: held,
            answered,
        }
    }

    /// The previous id, tokens and KV of a block record read from the tier, when it is block
    /// `id` of this model, whole and undamaged. A raw payload stays where it was received (the
    /// KV is a view of the record's buffer, no copy).
    fn verify_record(
        &self,
        bytes: Vec<u8>,
        id: &BlockId,
    ) -> Option<(Option<BlockId>, Vec<u32>, KvBytes)> {
        let view = BlockView::parse(&bytes).ok()?;
        view.check_owner(&self.info.fp, &self.info.geometry).ok()?;
        let (prev, tokens) = (view.prev(), view.tokens());
        if view.id() != *id || BlockId::chain(&self.info.fp, prev.as_ref(), &tokens) != *id {
            return None;
        }
        let kv = match view.kv().ok()? {
            Cow::Borrowed(payload) => {
                let start = payload.as_ptr() as usize - bytes.as_ptr() as usize;
                let len = payload.len();
                KvBytes::slice_of(bytes, start, len)?
            }
            Cow::Owned(decoded) => KvBytes::from_vec(decoded),
        };
        Some((prev, tokens, kv))
    }

    /// Writes `blocks` to the remote tier as block records (the store's encoding): one round
    /// trip asks which the tier lacks, one more writes those. Returns how many were written.
    /// A failure is the tier's (already counted); nothing local changes either way.
    pub fn push_remote(&self, blocks: &[BlockInput<'_>]) -> Result<usize> {
        let fp = &self.info.fp;
        let ids: Vec<BlockId> = blocks
            .iter()
            .map(|b| BlockId::chain(fp, b.prev, b.tokens))
            .collect();
        self.push_missing(&ids, |i| self.record(&blocks[i]))
    }

    /// Block `b`'s record in the store's encoding.
    fn record(&self, b: &BlockInput<'_>) -> Result<Vec<u8>> {
        let (fp, geometry) = (&self.info.fp, &self.info.geometry);
        encode_block(
            fp,
            geometry,
            b.prev,
            b.tokens,
            b.kv,
            self.shared.cfg.encoding,
        )
        .map(|r| r.to_vec())
        .map_err(|e| crate::StoreError::format(&self.info.blocks_dir, e))
    }

    /// Writes the blocks `ids` that the tier lacks (one round trip asks, one writes), the
    /// record of block `i` from `record(i)`, asked for only for those: what another process
    /// already put there is neither read nor sent again.
    fn push_missing(
        &self,
        ids: &[BlockId],
        record: impl Fn(usize) -> Result<Vec<u8>>,
    ) -> Result<usize> {
        let Some(remote) = self.remote() else {
            return Ok(0);
        };
        let (fp, geometry) = (&self.info.fp, &self.info.geometry);
        let mut seen = HashSet::new();
        let wanted: Vec<usize> = (0..ids.len()).filter(|&i| seen.insert(ids[i])).collect();
        let keys: Vec<String> = wanted
            .iter()
            .map(|&i| remote.block_key(fp, geometry, &ids[i]))
            .collect();
        let held = remote.tier().exists_many(&keys)?;
        let mut records = Vec::new();
        for ((&i, key), held) in wanted.iter().zip(keys).zip(held) {
            if !held {
                records.push((key, record(i)?));
            }
        }
        let items: Vec<(String, &[u8])> = records
            .iter()
            .map(|(k, v)| (k.clone(), v.as_slice()))
            .collect();
        remote.tier().put_many(&items)?;
        let m = remote.metrics();
        RemoteMetrics::add(&m.blocks_written, items.len() as u64);
        let bytes: usize = items.iter().map(|(_, v)| v.len()).sum();
        RemoteMetrics::add(&m.bytes_written, bytes as u64);
        Ok(items.len())
    }

    /// Writes `manifest` to the remote tier under its name (after its blocks: see
    /// [`ModelStore::push_remote`]).
    pub fn push_remote_manifest(&self, manifest: &Manifest) -> Result<()> {
        let Some(remote) = self.remote() else {
            return Ok(());
        };
        let key = remote.manifest_key(&self.info.fp, &self.info.geometry, &manifest.meta.name);
        let bytes = manifest
            .encode()
            .map_err(|e| crate::StoreError::format(&self.info.blocks_dir, e))?;
        remote.tier().put_many(&[(key, bytes.as_slice())])?;
        let m = remote.metrics();
        RemoteMetrics::add(&m.manifests_written, 1);
        RemoteMetrics::add(&m.bytes_written, bytes.len() as u64);
        Ok(())
    }

    /// Writes a saved checkpoint to the remote tier: the blocks the tier lacks (only those
    /// are read from the local tiers), then its manifest. Returns how many blocks were written.
    pub fn push_remote_checkpoint(&self, manifest: &Manifest) -> Result<usize> {
        if self.remote().is_none() {
            return Ok(0);
        }
        let tpb = self.info.geometry.tokens_per_block() as usize;
        let ids = &manifest.block_ids;
        let written = self.push_missing(ids, |i| {
            let kv =
                self.get_uncached(&ids[i])?
                    .ok_or_else(|| crate::StoreError::BlockNotFound {
                        id: ids[i].to_hex(),
                    })?;
            self.record(&BlockInput {
                prev: ckptfmt::ChainRoot::find(&manifest.chain_roots, i)
                    .or_else(|| i.checked_sub(1).map(|p| &ids[p])),
                tokens: &manifest.tokens[i * tpb..(i + 1) * tpb],
                kv: &kv,
            })
        })?;
        self.push_remote_manifest(manifest)?;
        Ok(written)
    }

    /// Writes small values of the caller's own beside this model's blocks, `kind` naming what
    /// they are (the server keeps a conversation's text with the tokens it was evaluated as).
    /// A failure is the tier's (counted).
    pub fn push_remote_values(&self, kind: &str, items: &[(String, Vec<u8>)]) -> Result<()> {
        let Some(remote) = self.remote() else {
            return Ok(());
        };
        let (fp, geometry) = (&self.info.fp, &self.info.geometry);
        let keyed: Vec<(String, &[u8])> = items
            .iter()
            .map(|(name, v)| (remote.value_key(fp, geometry, kind, name), v.as_slice()))
            .collect();
        remote.tier().put_many(&keyed)?;
        let bytes: usize = items.iter().map(|(_, v)| v.len()).sum();
        RemoteMetrics::add(&remote.metrics().bytes_written, bytes as u64);
        Ok(())
    }

    /// Values [`ModelStore::push_remote_values`] wrote, in one round trip: `None` for a name
    /// the tier lacks, and for every name when there is no tier or it failed. What they hold
    /// is the caller's to check.
    pub fn fetch_remote_values(&self, kind: &str, names: &[String]) -> Vec<Option<Vec<u8>>> {
        let none = || vec![None; names.len()];
        let Some(remote) = self.remote() else {
            return none();
        };
        let (fp, geometry) = (&self.info.fp, &self.info.geometry);
        let keys: Vec<String> = names
            .iter()
            .map(|name| remote.value_key(fp, geometry, kind, name))
            .collect();
        match remote.tier().get_many(&keys) {
            Ok(values) => {
                let bytes: usize = values.iter().flatten().map(Vec::len).sum();
                RemoteMetrics::add(&remote.metrics().bytes_read, bytes as u64);
                values
            }
            Err(_) => none(),
        }
    }

    /// Checkpoint `name`'s manifest from the remote tier, when the tier holds one that
    /// verifies and belongs to this model and geometry (else `None`, counted as a miss or a
    /// rejection). Its blocks are not read: see [`ModelStore::fetch_remote`].
    pub fn fetch_remote_manifest(&self, name: &str) -> Option<Manifest> {
        let remote = self.remote()?;
        let key = remote.manifest_key(&self.info.fp, &self.info.geometry, name);
        let value = remote.tier().get_many(&[key]).ok()?.pop().flatten();
        let m = remote.metrics();
        let Some(bytes) = value else {
            RemoteMetrics::add(&m.misses, 1);
            return None;
        };
        RemoteMetrics::add(&m.bytes_read, bytes.len() as u64);
        let manifest = Manifest::decode(&bytes).ok().filter(|man| {
            man.meta.name == name && man.check_owner(&self.info.fp, &self.info.geometry).is_ok()
        });
        match manifest {
            Some(man) => {
                RemoteMetrics::add(&m.hits, 1);
                Some(man)
            }
            None => {
                m.reject("a checkpoint's manifest");
                None
            }
        }
    }

    /// Brings checkpoint `name` from the remote tier into the local store (manifest and
    /// every block, then saved as a local checkpoint): true when it is now held locally.
    /// A checkpoint the local store already holds is left as it is.
    pub fn fetch_remote_checkpoint(&self, name: &str) -> Result<bool> {
        if self.has_checkpoint(name)? {
            return Ok(true);
        }
        let Some(manifest) = self.fetch_remote_manifest(name) else {
            return Ok(false);
        };
        if self.held_prefix(&manifest.block_ids) < manifest.block_ids.len() {
            return Ok(false);
        }
        self.save(&manifest)?;
        Ok(true)
    }

    /// Writes the snapshot at the end of block `id` (read from the local store, verified) to
    /// the remote tier unless the tier holds it. Returns whether it was written; `Ok(false)`
    /// too when there is no tier or no local snapshot.
    pub fn push_remote_state(&self, id: &BlockId) -> Result<bool> {
        let Some(remote) = self.remote() else {
            return Ok(false);
        };
        let store = &self.info.store;
        let record = match store.read_state(id) {
            Ok(r) => r,
            Err(ckptfmt::FormatError::NotFound { .. }) => return Ok(false),
            Err(e) => return Err(crate::StoreError::format(store.root(), e)),
        };
        let key = remote.state_key(&self.info.fp, &self.info.geometry, id);
        if remote.tier().exists_many(std::slice::from_ref(&key))? == [true] {
            return Ok(false);
        }
        let bytes = record.as_bytes();
        remote.tier().put_many(&[(key, bytes)])?;
        RemoteMetrics::add(&remote.metrics().bytes_written, bytes.len() as u64);
        Ok(true)
    }

    /// The latest end-of-block snapshot of `ids[after..]` (`ids` a chain's blocks from the
    /// first, in order) that the remote tier holds and that verifies as this model's (one
    /// round trip asks which it holds, one more reads that one): its block's index in `ids`
    /// and the state, kept in the local store too. `None` without a tier, when it holds none,
    /// or on any failure (counted).
    pub fn fetch_remote_state(&self, ids: &[BlockId], after: usize) -> Option<(usize, Vec<u8>)> {
        let remote = self.remote()?;
        if after >= ids.len() || self.shared.access == Access::ReadOnly {
            return None;
        }
        let (fp, geometry) = (&self.info.fp, &self.info.geometry);
        let keys: Vec<String> = ids[after..]
            .iter()
            .map(|id| remote.state_key(fp, geometry, id))
            .collect();
        let held = remote.tier().exists_many(&keys).ok()?;
        let m = remote.metrics();
        let Some(k) = held.iter().rposition(|&h| h) else {
            RemoteMetrics::add(&m.misses, 1);
            return None;
        };
        let i = after + k;
        let bytes = remote
            .tier()
            .get_many(std::slice::from_ref(&keys[k]))
            .ok()?
            .pop()
            .flatten()?;
        RemoteMetrics::add(&m.bytes_read, bytes.len() as u64);
        let tpb = u64::from(geometry.tokens_per_block());
        let state = StateView::parse(&bytes)
            .ok()
            .filter(|v| {
                v.check_owner(fp, geometry, &ids[i]).is_ok() && v.n_tokens() == (i as u64 + 1) * tpb
            })
            .map(|v| v.state().to_vec());
        let Some(state) = state else {
            m.reject("a state snapshot");
            return None;
        };
        RemoteMetrics::add(&m.hits, 1);
        let _ = self.put_state(&ids[i], (i as u64 + 1) * tpb, &state);
        Some((i, state))
    }
}
