//! The only module with `unsafe` code: read-only memory maps of files, and
//! one writeback hint to the kernel (`sync_file_range`, Linux only).
//!
//! Mapping is fenced here and exposed as `unsafe fn`s, because the soundness
//! of a `&[u8]` over a mapped file depends on something the type system
//! cannot see: no process may modify or truncate the file while the map
//! lives. The crate never writes a file in place (it writes a temporary file
//! and renames it), so its own writers keep that promise; other programs are
//! the caller's responsibility.
#![allow(unsafe_code)]

use std::fs::File;
use std::ops::Deref;
use std::path::Path;

use crate::error::{FormatError, Result};
use crate::export::{Backing, Export, ExportView};
use crate::ids::BlockId;
use crate::store::{MappedBlock, Store};
use crate::vfs::StdFs;

/// A read-only mapped file. Dereferences to its bytes.
#[derive(Debug)]
pub struct Mapped {
    map: Option<memmap2::Mmap>,
}

impl Deref for Mapped {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match &self.map {
            Some(m) => m,
            None => &[],
        }
    }
}

/// Maps the whole file at `path` read-only.
///
/// With `populate`, the kernel pre-faults every page (`MAP_POPULATE`), which
/// is faster when the whole file will be read.
///
/// # Safety
///
/// While the returned [`Mapped`] (or any slice borrowed from it) is alive, the
/// file must not be written to or truncated, by this process or any other.
/// Doing so is undefined behaviour (a truncation can raise `SIGBUS`). Files
/// written by this crate are never modified in place, only replaced by
/// rename, which leaves an existing map intact.
pub unsafe fn map_file(path: &Path, populate: bool) -> Result<Mapped> {
    let file = File::open(path).map_err(|e| FormatError::io("open", path, e))?;
    let len = file
        .metadata()
        .map_err(|e| FormatError::io("stat", path, e))?
        .len();
    if len == 0 {
        // Zero-length maps are not allowed by the OS; an empty slice is equivalent.
        return Ok(Mapped { map: None });
    }
    let mut opts = memmap2::MmapOptions::new();
    if populate {
        opts.populate();
    }
    // SAFETY: the caller guarantees the file is not modified or truncated
    // while the map lives (this function's safety contract); the map is
    // read-only, so we never write through it.
    let map = unsafe { opts.map(&file) }.map_err(|e| FormatError::io("mmap", path, e))?;
    Ok(Mapped { map: Some(map) })
}

impl Store<StdFs> {
    /// Maps a block file and verifies it (header, bounds, id, payload CRC,
    /// owner) before returning it.
    ///
    /// # Safety
    ///
    /// The block file must not be modified or truncated while the returned
    /// value lives (see [`crate::mmap::map_file`]). This crate never modifies
    /// block files in place; [`Store::delete_block`] unlinks, which keeps
    /// existing maps valid.
    pub unsafe fn map_block(&self, id: &BlockId) -> Result<MappedBlock> {
        let path = self.block_path(id);
        if !path.exists() {
            return Err(FormatError::NotFound {
                what: "block",
                name: id.to_hex(),
            });
        }
        // SAFETY: forwarded from this function's contract.
        let map = unsafe { map_file(&path, false) }?;
        self.check_block(&map, id)?;
        Ok(MappedBlock { map })
    }
}

impl Store<StdFs> {
    /// Maps a block file and checks its header, bounds, id and owner, but not its payload's
    /// checksum: for a reader that maps a block it has just written and verifies it later,
    /// before first reading it ([`MappedBlock::verify`]).
    ///
    /// # Safety
    ///
    /// As for [`Store::map_block`].
    pub unsafe fn map_block_unverified(&self, id: &BlockId) -> Result<MappedBlock> {
        let path = self.block_path(id);
        // SAFETY: forwarded from this function's contract.
        let map = unsafe { map_file(&path, false) }?;
        let v = crate::block::BlockView::parse_at(&map, 0, false)?;
        v.check_owner(self.fingerprint(), self.geometry())?;
        if v.id() != *id {
            return Err(FormatError::BlockIdMismatch {
                expected: id.to_hex(),
                found: v.id().to_hex(),
            });
        }
        Ok(MappedBlock { map })
    }
}

impl Export {
    /// Maps an export file and checks it.
    ///
    /// # Safety
    ///
    /// The file must not be modified or truncated while the value lives (see
    /// [`crate::mmap::map_file`]).
    pub unsafe fn map(path: &Path) -> Result<Self> {
        // SAFETY: forwarded from this function's contract.
        let map = unsafe { map_file(path, false) }?;
        ExportView::parse(&map)?;
        Ok(Export {
            backing: Backing::Mapped(map),
        })
    }
}

/// Asks the kernel to start writing `file`'s dirty pages back now, without
/// waiting and without any durability promise (the commit protocol still
/// syncs). Overlaps the copy into the page cache with device I/O. No-op
/// outside Linux and on error.
pub(crate) fn start_writeback(file: &File) {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        // SAFETY: `sync_file_range` only reads its integer arguments; the fd
        // is valid for the call because `file` is borrowed; offset 0 and
        // length 0 mean "the whole file"; the flag is a valid constant.
        let _ =
            unsafe { libc::sync_file_range(file.as_raw_fd(), 0, 0, libc::SYNC_FILE_RANGE_WRITE) };
    }
    #[cfg(not(target_os = "linux"))]
    let _ = file;
}
