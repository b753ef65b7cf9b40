//! GGUF files: a bounds-checked reader (and, with the `test-util` feature, a small writer that
//! tests use to make tiny models).
//!
//! A file's header is read into memory (`pread`); its tensor data is mapped read-only for ggml,
//! which reads the weights in place. No Rust reference is ever made into that map (it is a
//! [`memmap2::MmapRaw`], handed to ggml as a raw pointer): another process changing the file
//! changes what ggml computes with, never what safe Rust code holds, and Rust code reads tensor
//! data through [`Gguf::read_at`], a copy.
//!
//! Parts: [`value`] (the metadata value model), [`types`] (the ggml type table), the parser, and
//! the writer.
//!
//! The format (GGUF v2 and v3, little-endian):
//!
//! ```text
//! u32 magic "GGUF" | u32 version | u64 n_tensors | u64 n_kv
//! n_kv    x { string key | u32 value_type | value }
//! n_tensors x { string name | u32 n_dims | u64 ne[n_dims] | u32 ggml_type | u64 offset }
//! padding to `general.alignment` (default 32)
//! tensor data; each tensor's `offset` is relative to the start of this section
//! ```
//!
//! A string is a `u64` byte length followed by that many bytes. An array value is a `u32` element
//! type, a `u64` count and the elements. Every length and count is checked against the bytes that
//! remain before anything is allocated, so a truncated or corrupt file gives an [`Error`] and never
//! a panic or a huge allocation. Tensor data ranges are validated once, at open.

use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::{MmapOptions, MmapRaw};

use crate::{Error, Result};

mod parse;
pub mod types;
pub mod value;
#[cfg(any(test, feature = "test-util"))]
mod writer;

pub use types::GgmlType;
pub use value::{MetaArray, MetaValue, StrArray};
#[cfg(any(test, feature = "test-util"))]
pub use writer::GgufWriter;

/// The four bytes every GGUF file starts with.
pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";
/// The version the writer produces.
pub const GGUF_VERSION: u32 = 3;
/// The data alignment used when `general.alignment` is absent.
pub const GGUF_DEFAULT_ALIGNMENT: u32 = 32;
/// Most dimensions a ggml tensor can have.
pub const GGML_MAX_DIMS: usize = 4;

/// Where a tensor's data lies in the file, with its shape and type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    /// The tensor's name, e.g. `blk.0.attn_q.weight`.
    pub name: String,
    /// Dimensions in ggml order: `shape[0]` (ne0) is the contiguous one.
    pub shape: Vec<u64>,
    /// The element type.
    pub dtype: GgmlType,
    /// Absolute byte offset of the data in the file.
    pub offset: u64,
    /// Size of the data in bytes.
    pub n_bytes: u64,
}

impl TensorInfo {
    /// Number of elements.
    pub fn n_elements(&self) -> u64 {
        self.shape.iter().product()
    }
}

/// Where the tensor data lives.
enum Backing {
    /// A file, read with `pread`, and mapped (when not empty) for ggml.
    File { file: File, map: Option<MmapRaw> },
    /// Bytes in memory.
    Owned(Vec<u8>),
}

/// Reads `buf.len()` bytes of `file` at `offset`.
#[cfg(unix)]
fn read_exact_at(file: &File, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
    std::os::unix::fs::FileExt::read_exact_at(file, buf, offset)
}

/// Reads `buf.len()` bytes of `file` at `offset`.
#[cfg(windows)]
fn read_exact_at(file: &File, mut buf: &mut [u8], mut offset: u64) -> std::io::Result<()> {
    use std::os::windows::fs::FileExt;
    while !buf.is_empty() {
        match file.seek_read(buf, offset)? {
            0 => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            n => {
                buf = &mut buf[n..];
                offset += n as u64;
            }
        }
    }
    Ok(())
}

/// An open, validated GGUF file.
pub struct Gguf {
    backing: Backing,
    /// The file's length in bytes.
    len: u64,
    /// Where it was opened from (`<memory>` for bytes).
    path: PathBuf,
    version: u32,
    alignment: u32,
    data_offset: u64,
    kvs: Vec<(String, MetaValue)>,
    /// Indices into `kvs`, sorted by key.
    kv_order: Vec<u32>,
    tensors: Vec<TensorInfo>,
    /// Indices into `tensors`, sorted by name.
    tensor_order: Vec<u32>,
    /// The file it was opened from, when it was (and the platform says enough of it).
    identity: Option<FileIdentity>,
}

/// A model file as the file system saw it when it was opened: what decides whether a
/// fingerprint remembered for it still holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileIdentity {
    /// The canonical path.
    pub path: PathBuf,
    /// Length in bytes.
    pub len: u64,
    /// Modification time, nanoseconds since the epoch.
    pub modified_ns: i128,
    /// Status change time, nanoseconds since the epoch (set by the kernel on every change,
    /// and not settable by users).
    pub changed_ns: i128,
    /// Inode number.
    pub inode: u64,
    /// Device number.
    pub device: u64,
}

impl FileIdentity {
    #[cfg(unix)]
    fn of(path: &Path, meta: &std::fs::Metadata) -> Option<FileIdentity> {
        use std::os::unix::fs::MetadataExt;
        let ns = |s: i64, n: i64| i128::from(s) * 1_000_000_000 + i128::from(n);
        Some(FileIdentity {
            path: std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf()),
            len: meta.len(),
            modified_ns: ns(meta.mtime(), meta.mtime_nsec()),
            changed_ns: ns(meta.ctime(), meta.ctime_nsec()),
            inode: meta.ino(),
            device: meta.dev(),
        })
    }

    #[cfg(not(unix))]
    fn of(_path: &Path, _meta: &std::fs::Metadata) -> Option<FileIdentity> {
        None
    }
}

impl std::fmt::Debug for Gguf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gguf")
            .field("version", &self.version)
            .field("n_kv", &self.kvs.len())
            .field("n_tensors", &self.tensors.len())
            .field("len", &self.len)
            .finish()
    }
}

impl Gguf {
    /// Opens and validates the file at `path`: reads its header and maps its tensor data
    /// read-only for ggml.
    ///
    /// The engine never writes to model files. Another process that changes the file while it
    /// is open changes the weights ggml computes with (and one that truncates it can make that
    /// read fault), as with every mmap-based model loader; no Rust reference points into the
    /// map, so safe code never observes the change.
    pub fn open(path: &Path) -> Result<Gguf> {
        let io_err = |source| Error::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(io_err)?;
        let meta = file.metadata().map_err(io_err)?;
        let len = meta.len();
        let too_long = || {
            io_err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "larger than this platform's address space",
            ))
        };
        let len_usize = usize::try_from(len).map_err(|_| too_long())?;
        let header =
            parse::Parser::new(parse::Source::file(&file, len_usize), path).parse_header()?;
        // Mapping an empty file fails on some platforms; an empty file has no header anyway.
        let map = match len {
            0 => None,
            _ => Some(
                MmapOptions::new()
                    .map_raw_read_only(&file)
                    .map_err(io_err)?,
            ),
        };
        let mut gguf = Gguf::new(Backing::File { file, map }, len, path, header);
        gguf.identity = FileIdentity::of(path, &meta);
        Ok(gguf)
    }

    /// Validates a GGUF file held in memory (used by tests and tools).
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Gguf> {
        let path = Path::new("<memory>");
        let header = parse::Parser::new(parse::Source::memory(&bytes), path).parse_header()?;
        let len = bytes.len() as u64;
        Ok(Gguf::new(Backing::Owned(bytes), len, path, header))
    }

    fn new(backing: Backing, len: u64, path: &Path, header: parse::Header) -> Gguf {
        Gguf {
            backing,
            len,
            path: path.to_path_buf(),
            version: header.version,
            alignment: header.alignment,
            data_offset: header.data_offset,
            kvs: header.kvs,
            kv_order: header.kv_order,
            tensors: header.tensors,
            tensor_order: header.tensor_order,
            identity: None,
        }
    }

    /// The file it was opened from, as the file system saw it then (`None` for a file held in
    /// memory).
    pub fn identity(&self) -> Option<&FileIdentity> {
        self.identity.as_ref()
    }

    /// The GGUF version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The data alignment in bytes.
    pub fn alignment(&self) -> u32 {
        self.alignment
    }

    /// Absolute offset of the tensor data section.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// The value of a metadata key.
    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        let i = self
            .kv_order
            .binary_search_by(|&i| self.kvs[i as usize].0.as_str().cmp(key))
            .ok()?;
        Some(&self.kvs[self.kv_order[i] as usize].1)
    }

    fn require(&self, key: &str) -> Result<&MetaValue> {
        self.get(key).ok_or_else(|| Error::MissingKey {
            key: key.to_string(),
        })
    }

    fn wrong_type(key: &str, expected: &'static str, found: &MetaValue) -> Error {
        Error::KeyType {
            key: key.to_string(),
            expected,
            found: found.describe(),
        }
    }

    /// A string value.
    pub fn get_str(&self, key: &str) -> Result<&str> {
        let v = self.require(key)?;
        v.as_str().ok_or_else(|| Self::wrong_type(key, "string", v))
    }

    /// An integer value of any integer type that fits in `u32`.
    pub fn get_u32(&self, key: &str) -> Result<u32> {
        let v = self.require(key)?;
        v.as_u64()
            .and_then(|x| u32::try_from(x).ok())
            .ok_or_else(|| Self::wrong_type(key, "integer that fits u32", v))
    }

    /// A float value (`f32`, or `f64` rounded to `f32`).
    pub fn get_f32(&self, key: &str) -> Result<f32> {
        let v = self.require(key)?;
        v.as_f64()
            .map(|x| x as f32)
            .ok_or_else(|| Self::wrong_type(key, "float", v))
    }

    /// A bool value.
    pub fn get_bool(&self, key: &str) -> Result<bool> {
        let v = self.require(key)?;
        v.as_bool().ok_or_else(|| Self::wrong_type(key, "bool", v))
    }

    /// An array value.
    pub fn get_array(&self, key: &str) -> Result<&MetaArray> {
        let v = self.require(key)?;
        v.as_array()
            .ok_or_else(|| Self::wrong_type(key, "array", v))
    }

    /// An array of strings.
    pub fn get_strs(&self, key: &str) -> Result<&StrArray> {
        let v = self.require(key)?;
        v.as_array()
            .and_then(MetaArray::as_strs)
            .ok_or_else(|| Self::wrong_type(key, "array of strings", v))
    }

    /// All metadata, in file order.
    pub fn metadata(&self) -> impl Iterator<Item = (&str, &MetaValue)> {
        self.kvs.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// All tensors, in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// A tensor by name.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        let i = self
            .tensor_order
            .binary_search_by(|&i| self.tensors[i as usize].name.as_str().cmp(name))
            .ok()?;
        Some(&self.tensors[self.tensor_order[i] as usize])
    }

    /// The file's length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the file is empty (it never is once opened: a GGUF has a header).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Copies `buf.len()` bytes of the file at `offset` into `buf`.
    pub fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let end = offset.checked_add(buf.len() as u64);
        if end.is_none_or(|end| end > self.len) {
            return Err(Error::GgufTruncated {
                path: self.path.clone(),
                offset: offset.min(self.len),
                needed: buf.len() as u64,
                what: "bytes asked for",
            });
        }
        match &self.backing {
            // In bounds: checked above against the length of these very bytes.
            Backing::Owned(bytes) => {
                buf.copy_from_slice(&bytes[offset as usize..offset as usize + buf.len()]);
                Ok(())
            }
            Backing::File { file, .. } => {
                read_exact_at(file, buf, offset).map_err(|source| Error::Io {
                    path: self.path.clone(),
                    source,
                })
            }
        }
    }

    /// A copy of the data of tensor `t` of this file.
    pub fn read_tensor(&self, t: &TensorInfo) -> Result<Vec<u8>> {
        let len = usize::try_from(t.n_bytes).map_err(|_| Error::GgufTruncated {
            path: self.path.clone(),
            offset: t.offset,
            needed: t.n_bytes,
            what: "tensor data",
        })?;
        let mut out = vec![0; len];
        self.read_at(t.offset, &mut out)?;
        Ok(out)
    }

    /// The whole file as memory only ggml reads: its start and length. Nothing in Rust may
    /// make a reference from it (the file behind it can change).
    pub(crate) fn raw_memory(&self) -> (*const u8, usize) {
        match &self.backing {
            Backing::Owned(bytes) => (bytes.as_ptr(), bytes.len()),
            Backing::File { map: Some(map), .. } => (map.as_ptr(), map.len()),
            Backing::File { map: None, .. } => (std::ptr::NonNull::<u8>::dangling().as_ptr(), 0),
        }
    }
}
