//! The GGUF parser: a cursor over the file bytes that turns every short read into a typed error.
//! A file is read into memory as far as the header reaches (a prefix that grows on demand,
//! [`Source`]); the tensor data after it is never read here.
//!
//! Memory stays bounded by the file: every count is checked against the bytes left before
//! anything is allocated, arrays are parsed into typed vectors (one `u8` element costs one byte),
//! and no key or name is copied twice (lookups use sorted index vectors, not hash maps of cloned
//! strings). See `docs/RELIABILITY.md` for the measured worst case.

use std::borrow::Cow;
use std::fs::File;
use std::path::{Path, PathBuf};

use super::types::GgmlType;
use super::value::{MetaArray, MetaValue, StrArray};
use super::{TensorInfo, GGML_MAX_DIMS, GGUF_DEFAULT_ALIGNMENT, GGUF_MAGIC};
use crate::error::GgufProblem;
use crate::{Error, Result};

/// Deepest nesting of arrays inside arrays that the reader accepts.
const MAX_ARRAY_DEPTH: u32 = 4;

/// Everything before the tensor data.
pub(super) struct Header {
    pub version: u32,
    pub alignment: u32,
    pub data_offset: u64,
    pub kvs: Vec<(String, MetaValue)>,
    /// Indices into `kvs`, sorted by key.
    pub kv_order: Vec<u32>,
    pub tensors: Vec<TensorInfo>,
    /// Indices into `tensors`, sorted by name.
    pub tensor_order: Vec<u32>,
}

/// Smallest read from a file when the prefix in memory grows.
const FIRST_READ: usize = 256 << 10;

/// The bytes the parser reads: all of them in memory, or a file of `len` bytes of which the
/// first `buf.len()` have been read (`pread`, so the parser never holds a reference into a map
/// of a file another process could change).
pub(super) struct Source<'a> {
    buf: Cow<'a, [u8]>,
    file: Option<&'a File>,
    len: usize,
}

impl<'a> Source<'a> {
    /// Bytes already in memory.
    pub(super) fn memory(bytes: &'a [u8]) -> Source<'a> {
        Source {
            buf: Cow::Borrowed(bytes),
            file: None,
            len: bytes.len(),
        }
    }

    /// A file of `len` bytes, read as the parser asks for them.
    pub(super) fn file(file: &'a File, len: usize) -> Source<'a> {
        Source {
            buf: Cow::Owned(Vec::new()),
            file: Some(file),
            len,
        }
    }

    /// Makes the first `end` bytes (at most `len`) available, reading at least twice what is
    /// in memory so a header costs a few reads.
    fn ensure(&mut self, end: usize, path: &Path) -> Result<()> {
        let (Some(file), Cow::Owned(buf)) = (self.file, &mut self.buf) else {
            return Ok(());
        };
        if end <= buf.len() {
            return Ok(());
        }
        let have = buf.len();
        let want = end
            .max(have.saturating_mul(2))
            .max(FIRST_READ)
            .min(self.len);
        buf.resize(want, 0);
        super::read_exact_at(file, &mut buf[have..], have as u64).map_err(|source| {
            buf.truncate(have);
            Error::Io {
                path: path.to_path_buf(),
                source,
            }
        })
    }
}

/// A cursor over the file bytes.
pub(super) struct Parser<'a> {
    src: Source<'a>,
    pos: usize,
    path: &'a Path,
}

impl<'a> Parser<'a> {
    pub(super) fn new(src: Source<'a>, path: &'a Path) -> Parser<'a> {
        Parser { src, pos: 0, path }
    }

    fn remaining(&self) -> usize {
        self.src.len - self.pos
    }

    fn truncated(&self, at: usize, needed: u64, what: &'static str) -> Error {
        Error::GgufTruncated {
            path: self.path_buf(),
            offset: at as u64,
            needed,
            what,
        }
    }

    fn corrupt(&self, at: usize, reason: GgufProblem) -> Error {
        Error::GgufCorrupt {
            path: self.path_buf(),
            offset: at as u64,
            reason,
        }
    }

    fn path_buf(&self) -> PathBuf {
        self.path.to_path_buf()
    }

    fn take(&mut self, n: u64, what: &'static str) -> Result<&[u8]> {
        match usize::try_from(n) {
            Ok(n) if n <= self.remaining() => {
                let start = self.pos;
                self.src.ensure(start + n, self.path)?;
                self.pos += n;
                Ok(&self.src.buf[start..start + n])
            }
            _ => Err(self.truncated(self.pos, n, what)),
        }
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N]> {
        let s = self.take(N as u64, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(s);
        Ok(out)
    }

    fn u32(&mut self, what: &'static str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &'static str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    fn string_bytes(&mut self, what: &'static str) -> Result<&[u8]> {
        let len = self.u64(what)?;
        self.take(len, what)
    }

    fn key(&mut self) -> Result<String> {
        let at = self.pos;
        let bytes = self.string_bytes("metadata key")?.to_vec();
        String::from_utf8(bytes).map_err(|_| self.corrupt(at, GgufProblem::KeyNotUtf8))
    }

    /// A string value: invalid UTF-8 is replaced with U+FFFD.
    fn lossy_str(&mut self) -> Result<Cow<'_, str>> {
        let bytes = self.string_bytes("string value")?;
        Ok(String::from_utf8_lossy(bytes))
    }

    fn bool(&mut self) -> Result<bool> {
        let at = self.pos;
        match self.array::<1>("metadata value")?[0] {
            0 => Ok(false),
            1 => Ok(true),
            b => Err(self.corrupt(at, GgufProblem::BadBool(b))),
        }
    }

    /// Smallest encoding of one value of a type, used to reject impossible array counts before
    /// allocating.
    fn min_size(type_code: u32) -> u64 {
        match type_code {
            0 | 1 | 7 => 1,
            2 | 3 => 2,
            4..=6 => 4,
            8 | 10..=12 => 8,
            9 => 12,
            _ => 1,
        }
    }

    fn value(&mut self, type_code: u32, depth: u32) -> Result<MetaValue> {
        const WHAT: &str = "metadata value";
        Ok(match type_code {
            0 => MetaValue::U8(self.array::<1>(WHAT)?[0]),
            1 => MetaValue::I8(i8::from_le_bytes(self.array(WHAT)?)),
            2 => MetaValue::U16(u16::from_le_bytes(self.array(WHAT)?)),
            3 => MetaValue::I16(i16::from_le_bytes(self.array(WHAT)?)),
            4 => MetaValue::U32(u32::from_le_bytes(self.array(WHAT)?)),
            5 => MetaValue::I32(i32::from_le_bytes(self.array(WHAT)?)),
            6 => MetaValue::F32(f32::from_le_bytes(self.array(WHAT)?)),
            7 => MetaValue::Bool(self.bool()?),
            8 => MetaValue::Str(self.lossy_str()?.into_owned()),
            9 => MetaValue::Array(Box::new(self.meta_array(depth)?)),
            10 => MetaValue::U64(u64::from_le_bytes(self.array(WHAT)?)),
            11 => MetaValue::I64(i64::from_le_bytes(self.array(WHAT)?)),
            12 => MetaValue::F64(f64::from_le_bytes(self.array(WHAT)?)),
            other => {
                return Err(self.corrupt(
                    self.pos.saturating_sub(4),
                    GgufProblem::UnknownValueType(other),
                ))
            }
        })
    }

    /// Reads `count` fixed-size elements decoded by `f`.
    fn plain<const N: usize, T>(&mut self, count: usize, f: fn([u8; N]) -> T) -> Result<Vec<T>> {
        let bytes = self.take(count as u64 * N as u64, "array elements")?;
        Ok(bytes
            .chunks_exact(N)
            .map(|c| {
                let mut a = [0u8; N];
                a.copy_from_slice(c);
                f(a)
            })
            .collect())
    }

    /// An array: element type, count, elements.
    fn meta_array(&mut self, depth: u32) -> Result<MetaArray> {
        let at = self.pos;
        if depth >= MAX_ARRAY_DEPTH {
            return Err(self.corrupt(
                at,
                GgufProblem::NestedTooDeep {
                    max: MAX_ARRAY_DEPTH,
                },
            ));
        }
        let elem_type = self.u32("array element type")?;
        if !(0..=12).contains(&elem_type) {
            return Err(self.corrupt(at, GgufProblem::UnknownElementType(elem_type)));
        }
        let count = self.u64("array length")?;
        let left = self.remaining() as u64;
        if count
            .checked_mul(Self::min_size(elem_type))
            .is_none_or(|n| n > left)
        {
            return Err(self.corrupt(at, GgufProblem::ArrayTooLong { count, left }));
        }
        // `count` is bounded by the file length here.
        let n = count as usize;
        Ok(match elem_type {
            0 => MetaArray::U8(self.plain(n, |[b]| b)?),
            1 => MetaArray::I8(self.plain(n, i8::from_le_bytes)?),
            2 => MetaArray::U16(self.plain(n, u16::from_le_bytes)?),
            3 => MetaArray::I16(self.plain(n, i16::from_le_bytes)?),
            4 => MetaArray::U32(self.plain(n, u32::from_le_bytes)?),
            5 => MetaArray::I32(self.plain(n, i32::from_le_bytes)?),
            6 => MetaArray::F32(self.plain(n, f32::from_le_bytes)?),
            7 => {
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(self.bool()?);
                }
                MetaArray::Bool(v)
            }
            8 => {
                // Sizes first, so the text buffer is allocated once.
                let start = self.pos;
                let mut total = 0usize;
                for _ in 0..n {
                    total += self.string_bytes("string value")?.len();
                }
                self.pos = start;
                let mut strs = StrArray::with_capacity(n, total);
                for _ in 0..n {
                    let s = self.lossy_str()?;
                    strs.push(&s);
                }
                MetaArray::Str(strs)
            }
            9 => {
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(self.meta_array(depth + 1)?);
                }
                MetaArray::Array(v)
            }
            10 => MetaArray::U64(self.plain(n, u64::from_le_bytes)?),
            11 => MetaArray::I64(self.plain(n, i64::from_le_bytes)?),
            _ => MetaArray::F64(self.plain(n, f64::from_le_bytes)?),
        })
    }

    pub(super) fn parse_header(mut self) -> Result<Header> {
        let magic: [u8; 4] = self.array("magic")?;
        if magic != GGUF_MAGIC {
            return Err(Error::GgufBadMagic {
                path: self.path_buf(),
                found: magic,
            });
        }
        let version = self.u32("version")?;
        if version != 2 && version != 3 {
            return Err(Error::GgufVersion {
                path: self.path_buf(),
                version,
            });
        }
        let n_tensors = self.u64("tensor count")?;
        let n_kv = self.u64("metadata count")?;
        // Each key/value needs at least 8 (key length) + 4 (type) + 1 bytes; each tensor info at
        // least 8 + 4 + 4 + 8.
        let at = self.pos;
        let left = self.remaining() as u64;
        let min_needed = n_kv
            .checked_mul(13)
            .and_then(|a| n_tensors.checked_mul(24).and_then(|b| a.checked_add(b)));
        if min_needed.is_none_or(|n| n > left) || n_kv > u64::from(u32::MAX) {
            return Err(self.corrupt(
                at,
                GgufProblem::TooManyEntries {
                    n_kv,
                    n_tensors,
                    left,
                },
            ));
        }

        let mut kvs = Vec::with_capacity(n_kv as usize);
        for _ in 0..n_kv {
            let key = self.key()?;
            let type_code = self.u32("metadata value type")?;
            let value = self.value(type_code, 0)?;
            kvs.push((key, value));
        }
        let mut kv_order: Vec<u32> = (0..kvs.len() as u32).collect();
        kv_order.sort_unstable_by(|&a, &b| kvs[a as usize].0.cmp(&kvs[b as usize].0));
        if let Some(w) = kv_order
            .windows(2)
            .find(|w| kvs[w[0] as usize].0 == kvs[w[1] as usize].0)
        {
            let key = kvs[w[0] as usize].0.clone();
            return Err(self.corrupt(0, GgufProblem::DuplicateKey(key)));
        }

        let alignment = match kvs.iter().find(|(k, _)| k == "general.alignment") {
            None => GGUF_DEFAULT_ALIGNMENT,
            Some((_, MetaValue::U32(a))) if a.is_power_of_two() => *a,
            Some((_, v)) => {
                return Err(self.corrupt(0, GgufProblem::BadAlignment(format!("{v:?}"))));
            }
        };

        // Offsets are relative to the data section until its start is known.
        let mut tensors = Vec::with_capacity(n_tensors as usize);
        let mut starts = Vec::with_capacity(n_tensors as usize);
        for _ in 0..n_tensors {
            starts.push(self.pos);
            tensors.push(self.tensor_info(alignment)?);
        }
        let mut tensor_order: Vec<u32> = (0..tensors.len() as u32).collect();
        tensor_order
            .sort_unstable_by(|&a, &b| tensors[a as usize].name.cmp(&tensors[b as usize].name));
        if let Some(w) = tensor_order
            .windows(2)
            .find(|w| tensors[w[0] as usize].name == tensors[w[1] as usize].name)
        {
            let i = w[1] as usize;
            let name = tensors[i].name.clone();
            return Err(self.corrupt(starts[i], GgufProblem::DuplicateTensor(name)));
        }

        let align = u64::from(alignment);
        let data_offset = (self.pos as u64).div_ceil(align) * align;
        let file_len = self.src.len as u64;
        for (t, &at) in tensors.iter_mut().zip(&starts) {
            let rel_offset = t.offset;
            let offset = data_offset.checked_add(rel_offset);
            let end = offset.and_then(|o| o.checked_add(t.n_bytes));
            match (offset, end) {
                (Some(offset), Some(end)) if end <= file_len => t.offset = offset,
                (Some(offset), Some(_)) => {
                    return Err(self.truncated(
                        offset.min(file_len) as usize,
                        t.n_bytes,
                        "tensor data",
                    ))
                }
                _ => {
                    return Err(self.corrupt(
                        at,
                        GgufProblem::OffsetOverflow {
                            name: t.name.clone(),
                            offset: rel_offset,
                        },
                    ))
                }
            }
        }

        Ok(Header {
            version,
            alignment,
            data_offset,
            kvs,
            kv_order,
            tensors,
            tensor_order,
        })
    }

    /// One tensor's entry: name, shape, type and offset (relative to the data section, a
    /// multiple of `alignment`), its byte count known for its shape and type.
    fn tensor_info(&mut self, alignment: u32) -> Result<TensorInfo> {
        let at = self.pos;
        let name_bytes = self.string_bytes("tensor name")?.to_vec();
        let name = String::from_utf8(name_bytes)
            .map_err(|_| self.corrupt(at, GgufProblem::TensorNameNotUtf8))?;
        let n_dims = self.u32("tensor dimension count")?;
        if n_dims as usize > GGML_MAX_DIMS {
            return Err(self.corrupt(at, GgufProblem::TooManyDims { name, n_dims }));
        }
        let mut shape = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            shape.push(self.u64("tensor dimension")?);
        }
        let type_code = self.u32("tensor type")?;
        let dtype = GgmlType::from_u32(type_code, &name)?;
        let rel_offset = self.u64("tensor offset")?;
        let Some(n_bytes) = dtype.tensor_bytes(&shape) else {
            return Err(self.corrupt(at, GgufProblem::BadShape { name, shape, dtype }));
        };
        if rel_offset % u64::from(alignment) != 0 {
            return Err(self.corrupt(
                at,
                GgufProblem::Misaligned {
                    name,
                    offset: rel_offset,
                    alignment,
                },
            ));
        }
        Ok(TensorInfo {
            name,
            shape,
            dtype,
            offset: rel_offset,
            n_bytes,
        })
    }
}
