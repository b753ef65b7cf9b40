//! A store's state records (FORMAT.md §5.2): the recurrent state after a block's last token,
//! a file beside the block's, named by its id.

use std::path::PathBuf;

use super::{Store, STATE_SUFFIX};
use crate::error::{FormatError, Result};
use crate::ids::BlockId;
use crate::state::{encode_state, StateView};
use crate::vfs::Vfs;

/// A state record read into memory and verified.
#[derive(Debug, Clone)]
pub struct OwnedState {
    bytes: Vec<u8>,
}

impl OwnedState {
    /// The verified view of the record.
    pub fn view(&self) -> Result<StateView<'_>> {
        StateView::parse(&self.bytes)
    }

    /// The record's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }
}

impl<V: Vfs> Store<V> {
    /// Path of the state record taken at the end of block `id`.
    pub fn state_path(&self, id: &BlockId) -> PathBuf {
        self.blocks_dir
            .join(format!("{}{STATE_SUFFIX}", id.to_hex()))
    }

    /// Whether the store holds the state at the end of block `id` (a committed
    /// file; not verified).
    pub fn has_state(&self, id: &BlockId) -> Result<bool> {
        let p = self.state_path(id);
        self.vfs
            .exists(&p)
            .map_err(|e| FormatError::io("stat", &p, e))
    }

    /// Writes the recurrent state after the last token of block `id` (the
    /// sequence's first `n_tokens` tokens) durably, unless present, with the
    /// protocol of a block (FORMAT.md §9.1). Returns whether it was written.
    pub fn put_state(&self, id: &BlockId, n_tokens: u64, state: &[u8]) -> Result<bool> {
        self.owner("put_state")?;
        if self.has_state(id)? {
            return Ok(false);
        }
        let record = encode_state(&self.fingerprint, &self.geometry, id, n_tokens, state)?;
        let name = format!("{}{STATE_SUFFIX}", id.to_hex());
        self.write_file_durable(&self.blocks_dir, &name, &[&record])?;
        Ok(true)
    }

    /// Reads the state at the end of block `id` and verifies it completely
    /// (checksums, owner, geometry, block id).
    pub fn read_state(&self, id: &BlockId) -> Result<OwnedState> {
        let p = self.state_path(id);
        let bytes = self.vfs.read(&p).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => FormatError::NotFound {
                what: "state record",
                name: id.to_hex(),
            },
            _ => FormatError::io("read", &p, e),
        })?;
        StateView::parse(&bytes)?.check_owner(&self.fingerprint, &self.geometry, id)?;
        Ok(OwnedState { bytes })
    }

    /// Deletes the state at the end of block `id` durably.
    pub fn delete_state(&self, id: &BlockId) -> Result<()> {
        self.owner("delete_state")?;
        self.remove_durably(&self.state_path(id), &self.blocks_dir)
    }

    /// Ids of the blocks whose end has a committed state record.
    pub fn list_states(&self) -> Result<Vec<BlockId>> {
        Ok(self
            .list_stems(&self.blocks_dir, STATE_SUFFIX)?
            .iter()
            .filter_map(|h| BlockId::from_hex(h).ok())
            .collect())
    }
}
