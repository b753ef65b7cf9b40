//! Saving a session's KV cache as a `ckptfmt` checkpoint and restoring it without running the
//! model.
//!
//! The session's cache layout (`kv.rs`: per layer, K then V rows of f16, token-major) maps onto
//! ckptfmt's block span (per layer, the K bytes of the block's tokens then their V bytes), so a
//! block is gathered with one copy per layer and restored with one write per layer.
//!
//! Restoring streams block by block rather than reading everything first: holding all blocks
//! at once cost fresh memory (page faults) for the whole checkpoint, 5x the time of streaming
//! (docs/BENCHMARKS.md).

use std::borrow::Cow;
use std::collections::HashMap;
use std::time::{SystemTime, UNIX_EPOCH};

use ckptfmt::{
    BlockId, ElemType, Encoding, Fingerprint, Geometry, LayerGeometry, Manifest, Metadata, Store,
};

use crate::error::{Error, Result};
use crate::kv::KvLayout;
use crate::session::Session;

/// Tokens per block in stores the engine creates (ckptfmt's measured default).
pub const TOKENS_PER_BLOCK: u32 = ckptfmt::DEFAULT_TOKENS_PER_BLOCK;

/// What a save did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SaveSummary {
    /// Full blocks written now.
    pub blocks_written: usize,
    /// Full blocks already in the store (shared prefix or an earlier save).
    pub blocks_reused: usize,
    /// Bytes written, including headers and the manifest.
    pub bytes_written: u64,
}

/// The checkpoint geometry of a KV layout: f16 elements, `tokens_per_block` tokens per block.
pub fn geometry(layout: &KvLayout, tokens_per_block: u32) -> Result<Geometry> {
    let layers = (0..layout.n_layers)
        .map(|l| LayerGeometry {
            k_bytes_per_token: layout.k_bytes_per_token[l] as u32,
            v_bytes_per_token: layout.v_bytes_per_token[l] as u32,
        })
        .collect();
    Ok(Geometry::new(layers, ElemType::F16, tokens_per_block)?)
}

/// Opens (or creates) a checkpoint store at `dir` for `session`'s model.
pub fn open_store(dir: &std::path::Path, session: &Session) -> Result<Store> {
    let geometry = geometry(session.kv_layout(), TOKENS_PER_BLOCK)?;
    let fingerprint = Fingerprint(session.model().fingerprint());
    Ok(Store::open(dir, fingerprint, geometry)?)
}

impl Session {
    /// Clears this session and starts it from the longest run of `tokens`' leading full blocks that
    /// `store` already holds, from any conversation: block ids are chained hashes of the model
    /// and every token before them, so an id present in the store means that whole prefix was
    /// computed before. Returns the number of tokens restored (a multiple of the block size,
    /// possibly 0); feed `tokens[n..]` next. On failure the session is left as it was.
    pub fn restore_prefix(&mut self, store: &Store, tokens: &[u32]) -> Result<usize> {
        let tpb = TOKENS_PER_BLOCK as usize;
        // Keep at least one token to evaluate, so the caller gets logits.
        let usable = tokens.len().saturating_sub(1).min(self.params().n_ctx);
        let ids = BlockId::chain_all(
            &Fingerprint(self.model().fingerprint()),
            &tokens[..usable],
            TOKENS_PER_BLOCK,
        );
        let mut n_blocks = 0;
        while n_blocks < ids.len() && store.has_block(&ids[n_blocks])? {
            n_blocks += 1;
        }
        let n = n_blocks * tpb;
        let seq = self.seq();
        self.context_mut()
            .import(seq, &tokens[..n], &[], |_, id, sink| {
                read_block(store, id, sink)
            })?;
        Ok(n)
    }

    /// Saves the session under `name` in `store`: writes only the blocks the store lacks (a
    /// shared prefix or an earlier save of this conversation is reused), then the manifest,
    /// durably. `meta` and `sampler_state` travel with it.
    pub fn save_checkpoint(
        &self,
        store: &Store,
        name: &str,
        meta: Vec<(String, String)>,
        sampler_state: Option<Vec<u8>>,
    ) -> Result<SaveSummary> {
        let ctx = self.context();
        let seq = self.seq();
        let geometry = geometry(self.kv_layout(), TOKENS_PER_BLOCK)?;
        let fingerprint = Fingerprint(self.model().fingerprint());
        let tpb = geometry.tokens_per_block() as usize;
        let tokens = self.tokens().to_vec();
        let n_full = tokens.len() / tpb;
        let mut tail = Vec::new();
        if !tokens.len().is_multiple_of(tpb) {
            ctx.read_page(seq, n_full, &mut tail)?;
        }
        let created_unix = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let positions = (0..tokens.len() as i32).collect();
        let metadata = Metadata {
            name: name.to_owned(),
            parent: None,
            created_unix,
            kv: meta,
        };
        let mut manifest = Manifest::new(
            fingerprint,
            geometry.clone(),
            tokens,
            positions,
            tail,
            metadata,
        )?;
        manifest.sampler_state = sampler_state;
        // Gather only the blocks the store does not have yet.
        let mut missing = HashMap::new();
        for (i, id) in manifest.block_ids.iter().enumerate() {
            if !store.has_block(id)? {
                let mut span = Vec::new();
                ctx.read_page(seq, i, &mut span)?;
                missing.insert(i, span);
            }
        }
        let report = store.save(
            &manifest,
            |i| {
                missing
                    .get(&i)
                    .map(|kv| Cow::Borrowed(kv.as_slice()))
                    .ok_or(ckptfmt::FormatError::NotFound {
                        what: "block gathered for saving",
                        name: format!("block {i}"),
                    })
            },
            Encoding::Raw,
        )?;
        Ok(SaveSummary {
            blocks_written: report.blocks_written,
            blocks_reused: report.blocks_reused,
            bytes_written: report.bytes_written,
        })
    }

    /// Replaces this session's contents with checkpoint `name` of `store`. The manifest's
    /// model fingerprint and geometry are checked first; then each block the session does not
    /// already hold is read, verified (checksums, id) and copied into a free page. If anything
    /// fails the session is left exactly as it was. Returns the manifest (metadata, sampler
    /// state).
    pub fn restore_checkpoint(&mut self, store: &Store, name: &str) -> Result<Manifest> {
        let manifest = store.read_manifest(name)?;
        manifest.check_owner(
            &Fingerprint(self.model().fingerprint()),
            &geometry(self.kv_layout(), manifest.geometry.tokens_per_block())?,
        )?;
        if manifest.geometry.tokens_per_block() != TOKENS_PER_BLOCK {
            return Err(ckptfmt::FormatError::invalid(
                "checkpoint geometry",
                format!(
                    "{} tokens per block, the engine's pages hold {TOKENS_PER_BLOCK}",
                    manifest.geometry.tokens_per_block()
                ),
            )
            .into());
        }
        if manifest.tokens.len() > self.params().n_ctx {
            return Err(Error::ContextFull {
                needed: manifest.tokens.len(),
                n_ctx: self.params().n_ctx,
            });
        }
        let seq = self.seq();
        self.context_mut()
            .import(seq, &manifest.tokens, &manifest.tail_kv, |i, id, sink| {
                if manifest.block_ids.get(i) != Some(id) {
                    return Err(ckptfmt::FormatError::invalid(
                        "checkpoint manifest",
                        format!("block {i} id does not chain from its tokens"),
                    )
                    .into());
                }
                read_block(store, id, sink)
            })?;
        Ok(manifest)
    }
}

/// Reads and verifies block `id` of `store` and hands its KV span to `sink`.
fn read_block(
    store: &Store,
    id: &BlockId,
    sink: &mut dyn FnMut(&[u8]) -> Result<()>,
) -> Result<()> {
    let block = store.read_block(id)?;
    let view = block.view()?;
    sink(&view.kv()?)
}
