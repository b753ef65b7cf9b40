//! Self-contained exports: one file holding a checkpoint and all its blocks.
//!
//! ```text
//! 0            ExportHeader (256 B), zero padding to 4096
//! 4096         block index: n_blocks × ExportIndexEntry (48 B), padding to 4096
//! aligned      the manifest (its own checksums)
//! aligned      block record 0, block record 1, ... (each a multiple of 4096)
//! ```
//!
//! Opening an export checks the header, the index and the manifest; a block
//! is verified when it is read, and reading it touches only its own bytes.

use std::path::{Path, PathBuf};

use zerocopy::byteorder::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, IntoBytes};

use crate::block::{check_magic, check_version, truncated, BlockView};
use crate::error::{FormatError, Result};
use crate::ids::BlockId;
use crate::layout::{
    align_up, crc_parts, ExportHeader, ExportIndexEntry, ALIGN, EXPORT_MAGIC, EXPORT_VERSION,
    HEADER_CRC_OFFSET, HEADER_SIZE,
};
use crate::manifest::{Manifest, ManifestView};
use crate::mmap::Mapped;
use crate::vfs::{StdFs, Vfs, VfsFile};

/// Most blocks an export may index.
pub const MAX_EXPORT_BLOCKS: u32 = 1 << 24;

/// Writes an export of `manifest` whose block records (in manifest order) are
/// `records`, durably and atomically (temporary file, sync, rename, sync of
/// the directory). Returns the file length.
pub fn write_export<V: Vfs>(
    vfs: &V,
    path: &Path,
    manifest: &Manifest,
    records: &[&[u8]],
) -> Result<u64> {
    if records.len() != manifest.block_ids.len() {
        return Err(FormatError::invalid(
            "export",
            format!(
                "{} records for {} blocks",
                records.len(),
                manifest.block_ids.len()
            ),
        ));
    }
    for (i, (rec, id)) in records.iter().zip(&manifest.block_ids).enumerate() {
        let v = BlockView::parse(rec)?;
        v.check_owner(&manifest.fingerprint, &manifest.geometry)?;
        if v.id() != *id {
            return Err(FormatError::BlockIdMismatch {
                expected: id.to_hex(),
                found: format!("{} (record {i})", v.id().to_hex()),
            });
        }
    }
    let man = manifest.encode()?;
    let n = records.len() as u64;
    let index_offset = ALIGN;
    let index_len = 48 * n;
    let manifest_offset = align_up(index_offset + index_len);
    let mut offset = align_up(manifest_offset + man.len() as u64);
    let mut index = Vec::with_capacity(index_len as usize);
    for (rec, id) in records.iter().zip(&manifest.block_ids) {
        let e = ExportIndexEntry {
            block_id: id.0,
            offset: U64::new(offset),
            len: U64::new(rec.len() as u64),
        };
        index.extend_from_slice(e.as_bytes());
        offset += align_up(rec.len() as u64);
    }
    let file_len = offset;
    let mut h = ExportHeader {
        magic: EXPORT_MAGIC,
        version: U16::new(EXPORT_VERSION),
        reserved0: U16::new(0),
        n_blocks: U32::new(n as u32),
        file_len: U64::new(file_len),
        manifest_offset: U64::new(manifest_offset),
        manifest_len: U64::new(man.len() as u64),
        index_offset: U64::new(index_offset),
        index_len: U64::new(index_len),
        index_crc: U32::new(crc32fast::hash(&index)),
        reserved1: U32::new(0),
        fingerprint: manifest.fingerprint.0,
        geometry_digest: manifest.geometry.digest(),
        reserved: [0; 124],
        header_crc: U32::new(0),
    };
    h.header_crc = U32::new(crc_parts(&[&h.as_bytes()[..HEADER_CRC_OFFSET]]));
    let mut head = vec![0u8; manifest_offset as usize];
    head[..HEADER_SIZE].copy_from_slice(h.as_bytes());
    head[index_offset as usize..(index_offset + index_len) as usize].copy_from_slice(&index);
    let man_pad = vec![0u8; (align_up(man.len() as u64) - man.len() as u64) as usize];

    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let mut tmp_name = path.file_name().unwrap_or_default().to_os_string();
    tmp_name.push(crate::store::TMP_SUFFIX);
    let tmp = dir.join(tmp_name);
    let mut f = vfs
        .create(&tmp)
        .map_err(|e| FormatError::io("create", &tmp, e))?;
    let zeros = [0u8; ALIGN as usize];
    let mut write = |b: &[u8]| {
        f.write_all(b)
            .map_err(|e| FormatError::io("write", &tmp, e))
    };
    write(&head)?;
    write(&man)?;
    write(&man_pad)?;
    for rec in records {
        write(rec)?;
        let pad = (align_up(rec.len() as u64) - rec.len() as u64) as usize;
        write(&zeros[..pad])?;
    }
    f.sync().map_err(|e| FormatError::io("fsync", &tmp, e))?;
    vfs.rename(&tmp, path)
        .map_err(|e| FormatError::io("rename", path, e))?;
    vfs.sync_dir(&dir)
        .map_err(|e| FormatError::io("fsync", &dir, e))?;
    Ok(file_len)
}

/// A verified, borrowed view of an export: header, index and manifest checked.
#[derive(Debug, Clone)]
pub struct ExportView<'a> {
    bytes: &'a [u8],
    index: &'a [ExportIndexEntry],
    manifest: Manifest,
}

impl<'a> ExportView<'a> {
    /// Parses an export occupying all of `bytes`, verifying the header, the
    /// index (CRC, bounds, order) and the manifest. Blocks are verified when read.
    pub fn parse(bytes: &'a [u8]) -> Result<Self> {
        let h = Self::parse_header(bytes)?;
        let file_len = h.file_len.get();
        let n = h.n_blocks.get();
        if n > MAX_EXPORT_BLOCKS {
            return Err(FormatError::AbsurdLength {
                what: "export n_blocks",
                len: u64::from(n),
                limit: u64::from(MAX_EXPORT_BLOCKS),
            });
        }
        let (io, il) = (h.index_offset.get(), h.index_len.get());
        if io != ALIGN || il != 48 * u64::from(n) {
            return Err(FormatError::invalid(
                "export index",
                format!("offset {io} length {il} for {n} blocks"),
            ));
        }
        let index_end = io + il;
        if index_end > file_len {
            return Err(FormatError::OutOfBounds {
                what: "export index end",
                value: index_end,
                limit: file_len,
            });
        }
        let index_bytes = &bytes[io as usize..index_end as usize];
        let c = crc32fast::hash(index_bytes);
        if c != h.index_crc.get() {
            return Err(FormatError::ChecksumMismatch {
                what: "export index",
                offset: io,
                expected: h.index_crc.get(),
                found: c,
            });
        }
        let index = <[ExportIndexEntry]>::ref_from_bytes(index_bytes)
            .map_err(|_| FormatError::invalid("export index", "bad length"))?;
        let (mo, ml) = (h.manifest_offset.get(), h.manifest_len.get());
        if mo != align_up(index_end) {
            return Err(FormatError::invalid(
                "export manifest offset",
                format!("{mo}"),
            ));
        }
        let mend =
            mo.checked_add(ml)
                .filter(|&e| e <= file_len)
                .ok_or(FormatError::OutOfBounds {
                    what: "export manifest end",
                    value: mo.saturating_add(ml),
                    limit: file_len,
                })?;
        if bytes[index_end as usize..mo as usize]
            .iter()
            .any(|&b| b != 0)
        {
            return Err(FormatError::invalid("export index", "padding not zero"));
        }
        let mview = ManifestView::parse_at(&bytes[mo as usize..mend as usize], mo)?;
        if mview.fingerprint().0 != h.fingerprint || mview.geometry().digest() != h.geometry_digest
        {
            return Err(FormatError::invalid(
                "export",
                "header and manifest disagree on owner",
            ));
        }
        let manifest = mview.to_manifest();
        if manifest.block_ids.len() != index.len() {
            return Err(FormatError::invalid(
                "export index",
                format!(
                    "{} entries for {} blocks",
                    index.len(),
                    manifest.block_ids.len()
                ),
            ));
        }
        Self::check_blocks(bytes, index, &manifest, mend, file_len)?;
        Ok(ExportView {
            bytes,
            index,
            manifest,
        })
    }

    /// The header of an export occupying all of `bytes`, checked: magic, CRC, version,
    /// reserved bits, length (all of `bytes`) and its zero padding.
    fn parse_header(bytes: &'a [u8]) -> Result<&'a ExportHeader> {
        let avail = bytes.len() as u64;
        let (h, _) = ExportHeader::ref_from_prefix(bytes)
            .map_err(|_| truncated("export header", 0, HEADER_SIZE as u64, avail))?;
        check_magic("export header", &h.magic, &EXPORT_MAGIC, 0)?;
        let crc = crc_parts(&[&bytes[..HEADER_CRC_OFFSET]]);
        if crc != h.header_crc.get() {
            return Err(FormatError::ChecksumMismatch {
                what: "export header",
                offset: 0,
                expected: h.header_crc.get(),
                found: crc,
            });
        }
        check_version("export", h.version.get(), EXPORT_VERSION)?;
        if h.reserved0.get() != 0 || h.reserved1.get() != 0 || h.reserved.iter().any(|&b| b != 0) {
            return Err(FormatError::invalid("export header", "reserved bits set"));
        }
        let file_len = h.file_len.get();
        if avail < file_len {
            return Err(truncated("export", 0, file_len, avail));
        }
        if avail > file_len {
            return Err(FormatError::invalid(
                "export",
                format!(
                    "{} trailing bytes after offset {file_len}",
                    avail - file_len
                ),
            ));
        }
        if bytes[HEADER_SIZE..(ALIGN as usize).min(bytes.len())]
            .iter()
            .any(|&b| b != 0)
        {
            return Err(FormatError::invalid("export header", "padding not zero"));
        }
        Ok(h)
    }

    /// The block records after the manifest (which ends at `mend`): each index entry names the
    /// manifest's block in order, and the records follow one another, aligned, from the
    /// manifest's padding to the end of the file.
    fn check_blocks(
        bytes: &[u8],
        index: &[ExportIndexEntry],
        manifest: &Manifest,
        mend: u64,
        file_len: u64,
    ) -> Result<()> {
        let mut cursor = align_up(mend);
        if bytes[mend as usize..(cursor.min(file_len)) as usize]
            .iter()
            .any(|&b| b != 0)
        {
            return Err(FormatError::invalid("export manifest", "padding not zero"));
        }
        for (i, (e, id)) in index.iter().zip(&manifest.block_ids).enumerate() {
            let (off, len) = (e.offset.get(), e.len.get());
            if e.block_id != id.0 {
                return Err(FormatError::BlockIdMismatch {
                    expected: id.to_hex(),
                    found: format!("{} (index entry {i})", BlockId(e.block_id).to_hex()),
                });
            }
            if off != cursor || len % ALIGN != 0 || len == 0 {
                return Err(FormatError::invalid(
                    "export index entry",
                    format!("entry {i}: offset {off} length {len}, expected offset {cursor}"),
                ));
            }
            cursor = off.checked_add(len).filter(|&end| end <= file_len).ok_or(
                FormatError::OutOfBounds {
                    what: "export block end",
                    value: off.saturating_add(len),
                    limit: file_len,
                },
            )?;
        }
        if cursor != file_len {
            return Err(FormatError::invalid(
                "export",
                format!("blocks end at {cursor}, file at {file_len}"),
            ));
        }
        Ok(())
    }

    /// The checkpoint.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// Number of blocks.
    pub fn n_blocks(&self) -> usize {
        self.index.len()
    }

    /// The bytes of block record `i`, unverified (bounds checked at parse).
    pub fn block_record(&self, i: usize) -> Result<&'a [u8]> {
        let e = self.index.get(i).ok_or(FormatError::OutOfBounds {
            what: "export block index",
            value: i as u64,
            limit: self.index.len() as u64,
        })?;
        let (off, len) = (e.offset.get() as usize, e.len.get() as usize);
        self.bytes
            .get(off..off + len)
            .ok_or(FormatError::OutOfBounds {
                what: "export block end",
                value: (off + len) as u64,
                limit: self.bytes.len() as u64,
            })
    }

    /// Block `i`, fully verified (header, id, owner, payload CRC). Touches
    /// only that block's bytes.
    pub fn block(&self, i: usize) -> Result<BlockView<'a>> {
        let rec = self.block_record(i)?;
        let off = self.index.get(i).map_or(0, |e| e.offset.get());
        let v = BlockView::parse_at(rec, off, true)?;
        v.check_owner(&self.manifest.fingerprint, &self.manifest.geometry)?;
        if v.id() != self.manifest.block_ids[i] {
            return Err(FormatError::BlockIdMismatch {
                expected: self.manifest.block_ids[i].to_hex(),
                found: v.id().to_hex(),
            });
        }
        Ok(v)
    }

    /// Verifies every block.
    pub fn verify_all(&self) -> Result<()> {
        (0..self.n_blocks()).try_for_each(|i| self.block(i).map(|_| ()))
    }
}

#[derive(Debug)]
pub(crate) enum Backing {
    Owned(Vec<u8>),
    Mapped(Mapped),
}

/// An export file held in memory or mapped.
#[derive(Debug)]
pub struct Export {
    pub(crate) backing: Backing,
}

impl Export {
    /// Writes an export; see [`write_export`] (uses the real file system).
    pub fn write(path: &Path, manifest: &Manifest, records: &[&[u8]]) -> Result<u64> {
        write_export(&StdFs, path, manifest, records)
    }

    /// Reads a whole export file into memory and checks it (blocks are verified when read).
    pub fn read(path: &Path) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(|e| FormatError::io("read", path, e))?;
        Self::from_bytes(bytes)
    }

    /// Checks an export held in memory.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Self> {
        ExportView::parse(&bytes)?;
        Ok(Export {
            backing: Backing::Owned(bytes),
        })
    }

    /// The export's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        match &self.backing {
            Backing::Owned(v) => v,
            Backing::Mapped(m) => m,
        }
    }

    /// A verified view (re-checks header, index and manifest).
    pub fn view(&self) -> Result<ExportView<'_>> {
        ExportView::parse(self.as_bytes())
    }
}
