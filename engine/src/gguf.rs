//! GGUF files: a bounds-checked reader over a memory map, and a small writer used by tests.
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

use std::collections::HashMap;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use crate::{Error, Result};

/// The four bytes every GGUF file starts with.
pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";
/// The version the writer produces.
pub const GGUF_VERSION: u32 = 3;
/// The data alignment used when `general.alignment` is absent.
pub const GGUF_DEFAULT_ALIGNMENT: u32 = 32;
/// Most dimensions a ggml tensor can have.
pub const GGML_MAX_DIMS: usize = 4;
/// Deepest nesting of arrays inside arrays that the reader accepts.
const MAX_ARRAY_DEPTH: u32 = 4;

/// A metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum MetaValue {
    /// `u8` (type 0).
    U8(u8),
    /// `i8` (type 1).
    I8(i8),
    /// `u16` (type 2).
    U16(u16),
    /// `i16` (type 3).
    I16(i16),
    /// `u32` (type 4).
    U32(u32),
    /// `i32` (type 5).
    I32(i32),
    /// `u64` (type 10).
    U64(u64),
    /// `i64` (type 11).
    I64(i64),
    /// `f32` (type 6).
    F32(f32),
    /// `f64` (type 12).
    F64(f64),
    /// `bool` (type 7), one byte that must be 0 or 1.
    Bool(bool),
    /// A string (type 8). Invalid UTF-8 in a value is replaced with U+FFFD.
    Str(String),
    /// An array (type 9) of values of one type.
    Array(Vec<MetaValue>),
}

impl MetaValue {
    /// The GGUF type name of this value, for messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            MetaValue::U8(_) => "u8",
            MetaValue::I8(_) => "i8",
            MetaValue::U16(_) => "u16",
            MetaValue::I16(_) => "i16",
            MetaValue::U32(_) => "u32",
            MetaValue::I32(_) => "i32",
            MetaValue::U64(_) => "u64",
            MetaValue::I64(_) => "i64",
            MetaValue::F32(_) => "f32",
            MetaValue::F64(_) => "f64",
            MetaValue::Bool(_) => "bool",
            MetaValue::Str(_) => "string",
            MetaValue::Array(_) => "array",
        }
    }

    /// The string, if this is a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetaValue::Str(s) => Some(s),
            _ => None,
        }
    }

    /// The value as an `i64`, if this is an integer that fits.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            MetaValue::U8(v) => Some(v.into()),
            MetaValue::I8(v) => Some(v.into()),
            MetaValue::U16(v) => Some(v.into()),
            MetaValue::I16(v) => Some(v.into()),
            MetaValue::U32(v) => Some(v.into()),
            MetaValue::I32(v) => Some(v.into()),
            MetaValue::U64(v) => i64::try_from(v).ok(),
            MetaValue::I64(v) => Some(v),
            _ => None,
        }
    }

    /// The value as a `u64`, if this is a non-negative integer.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            MetaValue::U64(v) => Some(v),
            _ => self.as_i64().and_then(|v| u64::try_from(v).ok()),
        }
    }

    /// The value as an `f64`, if this is a float.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            MetaValue::F32(v) => Some(v.into()),
            MetaValue::F64(v) => Some(v),
            _ => None,
        }
    }

    /// The value, if this is a bool.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            MetaValue::Bool(v) => Some(v),
            _ => None,
        }
    }

    /// The elements, if this is an array.
    pub fn as_array(&self) -> Option<&[MetaValue]> {
        match self {
            MetaValue::Array(v) => Some(v),
            _ => None,
        }
    }

    /// A short description for error messages: the type, and for arrays the element type.
    fn describe(&self) -> String {
        match self {
            MetaValue::Array(items) => match items.first() {
                Some(first) => format!("array of {}", first.type_name()),
                None => "empty array".to_string(),
            },
            other => other.type_name().to_string(),
        }
    }

    fn type_code(&self) -> u32 {
        match self {
            MetaValue::U8(_) => 0,
            MetaValue::I8(_) => 1,
            MetaValue::U16(_) => 2,
            MetaValue::I16(_) => 3,
            MetaValue::U32(_) => 4,
            MetaValue::I32(_) => 5,
            MetaValue::F32(_) => 6,
            MetaValue::Bool(_) => 7,
            MetaValue::Str(_) => 8,
            MetaValue::Array(_) => 9,
            MetaValue::U64(_) => 10,
            MetaValue::I64(_) => 11,
            MetaValue::F64(_) => 12,
        }
    }
}

macro_rules! ggml_types {
    ($( $(#[$doc:meta])* $name:ident = $code:literal, $block:literal, $size:literal; )*) => {
        /// A ggml tensor element type, with its GGUF type code.
        #[allow(non_camel_case_types)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[repr(u32)]
        pub enum GgmlType {
            $( $(#[$doc])* $name = $code, )*
        }

        impl GgmlType {
            /// The type for a GGUF type code; `None` for codes this engine does not know.
            pub fn from_code(code: u32) -> Option<GgmlType> {
                match code {
                    $( $code => Some(GgmlType::$name), )*
                    _ => None,
                }
            }

            /// Elements per quantization block (1 for plain types).
            pub fn block_size(self) -> u64 {
                match self { $( GgmlType::$name => $block, )* }
            }

            /// Bytes per block.
            pub fn type_size(self) -> u64 {
                match self { $( GgmlType::$name => $size, )* }
            }

            /// The type's name, e.g. `"Q4_1"`.
            pub fn name(self) -> &'static str {
                match self { $( GgmlType::$name => stringify!($name), )* }
            }
        }
    };
}

ggml_types! {
    /// 32-bit float.
    F32 = 0, 1, 4;
    /// 16-bit IEEE float.
    F16 = 1, 1, 2;
    /// 4-bit, one f16 scale per 32.
    Q4_0 = 2, 32, 18;
    /// 4-bit, f16 scale and min per 32.
    Q4_1 = 3, 32, 20;
    /// 5-bit, one f16 scale per 32.
    Q5_0 = 6, 32, 22;
    /// 5-bit, f16 scale and min per 32.
    Q5_1 = 7, 32, 24;
    /// 8-bit, one f16 scale per 32.
    Q8_0 = 8, 32, 34;
    /// 8-bit, f16 scale and sum per 32.
    Q8_1 = 9, 32, 36;
    /// 2-bit k-quant.
    Q2_K = 10, 256, 84;
    /// 3-bit k-quant.
    Q3_K = 11, 256, 110;
    /// 4-bit k-quant.
    Q4_K = 12, 256, 144;
    /// 5-bit k-quant.
    Q5_K = 13, 256, 176;
    /// 6-bit k-quant.
    Q6_K = 14, 256, 210;
    /// 8-bit k-quant (intermediate type).
    Q8_K = 15, 256, 292;
    /// i-quant, 2.06 bits per weight.
    IQ2_XXS = 16, 256, 66;
    /// i-quant, 2.31 bits per weight.
    IQ2_XS = 17, 256, 74;
    /// i-quant, 3.06 bits per weight.
    IQ3_XXS = 18, 256, 98;
    /// i-quant, 1.56 bits per weight.
    IQ1_S = 19, 256, 50;
    /// 4-bit non-linear, blocks of 32.
    IQ4_NL = 20, 32, 18;
    /// i-quant, 3.44 bits per weight.
    IQ3_S = 21, 256, 110;
    /// i-quant, 2.5 bits per weight.
    IQ2_S = 22, 256, 82;
    /// 4-bit non-linear, blocks of 256.
    IQ4_XS = 23, 256, 136;
    /// 8-bit integer.
    I8 = 24, 1, 1;
    /// 16-bit integer.
    I16 = 25, 1, 2;
    /// 32-bit integer.
    I32 = 26, 1, 4;
    /// 64-bit integer.
    I64 = 27, 1, 8;
    /// 64-bit float.
    F64 = 28, 1, 8;
    /// i-quant, 1.75 bits per weight.
    IQ1_M = 29, 256, 56;
    /// bfloat16.
    BF16 = 30, 1, 2;
    /// ternary, 1.69 bits per weight.
    TQ1_0 = 34, 256, 54;
    /// ternary, 2.06 bits per weight.
    TQ2_0 = 35, 256, 66;
    /// 4-bit microscaling float.
    MXFP4 = 39, 32, 17;
}

impl GgmlType {
    /// The type for a GGUF type code, or [`Error::UnsupportedTensorType`] naming `tensor`.
    pub fn from_u32(code: u32, tensor: &str) -> Result<GgmlType> {
        GgmlType::from_code(code).ok_or_else(|| Error::UnsupportedTensorType {
            type_code: code,
            tensor: tensor.to_string(),
        })
    }

    /// Bytes taken by `n` consecutive elements. `n` should be a multiple of
    /// [`block_size`](Self::block_size); a partial block counts as a whole one.
    pub fn row_bytes(self, n: u64) -> u64 {
        n.div_ceil(self.block_size()) * self.type_size()
    }

    /// Bytes of a tensor of this type with `shape`, or `None` when a row is not a whole number of
    /// blocks or the size overflows.
    pub fn tensor_bytes(self, shape: &[u64]) -> Option<u64> {
        let (&ne0, rest) = match shape.split_first() {
            Some(split) => split,
            None => return Some(self.type_size()),
        };
        if ne0 % self.block_size() != 0 {
            return None;
        }
        let row = (ne0 / self.block_size()).checked_mul(self.type_size())?;
        rest.iter().try_fold(row, |acc, &ne| acc.checked_mul(ne))
    }
}

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

enum Backing {
    Mapped(Mmap),
    Owned(Vec<u8>),
}

impl Backing {
    fn bytes(&self) -> &[u8] {
        match self {
            Backing::Mapped(map) => map,
            Backing::Owned(bytes) => bytes,
        }
    }
}

/// An open, validated GGUF file.
pub struct Gguf {
    backing: Backing,
    version: u32,
    alignment: u32,
    data_offset: u64,
    kvs: Vec<(String, MetaValue)>,
    kv_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
}

impl std::fmt::Debug for Gguf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gguf")
            .field("version", &self.version)
            .field("n_kv", &self.kvs.len())
            .field("n_tensors", &self.tensors.len())
            .field("len", &self.bytes().len())
            .finish()
    }
}

impl Gguf {
    /// Maps and validates the file at `path`.
    ///
    /// The file is memory-mapped read-only. It must not be modified while the [`Gguf`] lives
    /// (as with every mmap-based model loader); the engine never writes to model files.
    pub fn open(path: &Path) -> Result<Gguf> {
        let io_err = |source| Error::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(io_err)?;
        let len = file.metadata().map_err(io_err)?.len();
        let backing = if len == 0 {
            // Mapping an empty file fails on some platforms; it is truncated either way.
            Backing::Owned(Vec::new())
        } else {
            // SAFETY: the map is read-only and private to this value. The documented contract of
            // `open` is that the model file is not modified while it is open; every byte read from
            // the map is bounds-checked against its length, which is fixed at map time.
            #[allow(unsafe_code)]
            let map = unsafe { Mmap::map(&file) }.map_err(io_err)?;
            Backing::Mapped(map)
        };
        Gguf::parse(backing, path)
    }

    /// Validates a GGUF file held in memory (used by tests and tools).
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Gguf> {
        Gguf::parse(Backing::Owned(bytes), Path::new("<memory>"))
    }

    fn parse(backing: Backing, path: &Path) -> Result<Gguf> {
        let header = Parser::new(backing.bytes(), path).parse_header()?;
        Ok(Gguf {
            backing,
            version: header.version,
            alignment: header.alignment,
            data_offset: header.data_offset,
            kv_index: header
                .kvs
                .iter()
                .enumerate()
                .map(|(i, (k, _))| (k.clone(), i))
                .collect(),
            kvs: header.kvs,
            tensor_index: header
                .tensors
                .iter()
                .enumerate()
                .map(|(i, t)| (t.name.clone(), i))
                .collect(),
            tensors: header.tensors,
        })
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
        self.kv_index.get(key).map(|&i| &self.kvs[i].1)
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
    pub fn get_array(&self, key: &str) -> Result<&[MetaValue]> {
        let v = self.require(key)?;
        v.as_array()
            .ok_or_else(|| Self::wrong_type(key, "array", v))
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
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// The data of a tensor of this file (its range was validated at open).
    ///
    /// # Panics
    /// If `t` describes a range outside this file (a [`TensorInfo`] from another file).
    pub fn tensor_bytes(&self, t: &TensorInfo) -> &[u8] {
        let start = usize::try_from(t.offset).expect("tensor offset fits usize");
        let len = usize::try_from(t.n_bytes).expect("tensor size fits usize");
        &self.bytes()[start..start + len]
    }

    /// The whole file.
    pub fn bytes(&self) -> &[u8] {
        self.backing.bytes()
    }
}

struct Header {
    version: u32,
    alignment: u32,
    data_offset: u64,
    kvs: Vec<(String, MetaValue)>,
    tensors: Vec<TensorInfo>,
}

/// A cursor over the file bytes that turns every short read into a typed error.
struct Parser<'a> {
    buf: &'a [u8],
    pos: usize,
    path: &'a Path,
}

impl<'a> Parser<'a> {
    fn new(buf: &'a [u8], path: &'a Path) -> Parser<'a> {
        Parser { buf, pos: 0, path }
    }

    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn truncated(&self, at: usize, needed: u64, what: &'static str) -> Error {
        Error::GgufTruncated {
            path: self.path.to_path_buf(),
            offset: at as u64,
            needed,
            what,
        }
    }

    fn corrupt(&self, at: usize, reason: impl Into<String>) -> Error {
        Error::GgufCorrupt {
            path: self.path.to_path_buf(),
            offset: at as u64,
            reason: reason.into(),
        }
    }

    fn path_buf(&self) -> PathBuf {
        self.path.to_path_buf()
    }

    fn take(&mut self, n: u64, what: &'static str) -> Result<&'a [u8]> {
        match usize::try_from(n) {
            Ok(n) if n <= self.remaining() => {
                let s = &self.buf[self.pos..self.pos + n];
                self.pos += n;
                Ok(s)
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

    fn string_bytes(&mut self, what: &'static str) -> Result<&'a [u8]> {
        let len = self.u64(what)?;
        self.take(len, what)
    }

    fn key(&mut self) -> Result<String> {
        let at = self.pos;
        let bytes = self.string_bytes("metadata key")?;
        String::from_utf8(bytes.to_vec()).map_err(|_| self.corrupt(at, "metadata key is not UTF-8"))
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
            7 => {
                let at = self.pos;
                match self.array::<1>(WHAT)?[0] {
                    0 => MetaValue::Bool(false),
                    1 => MetaValue::Bool(true),
                    b => return Err(self.corrupt(at, format!("bool value {b}"))),
                }
            }
            8 => {
                let bytes = self.string_bytes("string value")?;
                MetaValue::Str(match std::str::from_utf8(bytes) {
                    Ok(s) => s.to_owned(),
                    Err(_) => String::from_utf8_lossy(bytes).into_owned(),
                })
            }
            9 => {
                let at = self.pos;
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(self.corrupt(at, "arrays nested too deeply"));
                }
                let elem_type = self.u32("array element type")?;
                if !(0..=12).contains(&elem_type) {
                    return Err(self.corrupt(at, format!("unknown array element type {elem_type}")));
                }
                let count = self.u64("array length")?;
                let fits = count
                    .checked_mul(Self::min_size(elem_type))
                    .is_some_and(|n| n <= self.remaining() as u64);
                if !fits {
                    return Err(self.corrupt(
                        at,
                        format!(
                            "array of {count} elements cannot fit in the {} bytes left",
                            self.remaining()
                        ),
                    ));
                }
                // `count` is bounded by the file length here.
                let mut items = Vec::with_capacity(count as usize);
                for _ in 0..count {
                    items.push(self.value(elem_type, depth + 1)?);
                }
                MetaValue::Array(items)
            }
            10 => MetaValue::U64(u64::from_le_bytes(self.array(WHAT)?)),
            11 => MetaValue::I64(i64::from_le_bytes(self.array(WHAT)?)),
            12 => MetaValue::F64(f64::from_le_bytes(self.array(WHAT)?)),
            other => {
                return Err(self.corrupt(
                    self.pos.saturating_sub(4),
                    format!("unknown metadata value type {other}"),
                ))
            }
        })
    }

    fn parse_header(mut self) -> Result<Header> {
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
        let min_needed = n_kv
            .checked_mul(13)
            .and_then(|a| n_tensors.checked_mul(24).and_then(|b| a.checked_add(b)));
        if min_needed.is_none_or(|n| n > self.remaining() as u64) {
            return Err(self.corrupt(
                at,
                format!(
                    "{n_kv} metadata entries and {n_tensors} tensors cannot fit in the {} bytes left",
                    self.remaining()
                ),
            ));
        }

        let mut kvs = Vec::with_capacity(n_kv as usize);
        let mut seen = HashMap::with_capacity(n_kv as usize);
        for _ in 0..n_kv {
            let at = self.pos;
            let key = self.key()?;
            let type_code = self.u32("metadata value type")?;
            let value = self.value(type_code, 0)?;
            if seen.insert(key.clone(), ()).is_some() {
                return Err(self.corrupt(at, format!("duplicate metadata key {key}")));
            }
            kvs.push((key, value));
        }

        let alignment = match kvs.iter().find(|(k, _)| k == "general.alignment") {
            None => GGUF_DEFAULT_ALIGNMENT,
            Some((_, MetaValue::U32(a))) if a.is_power_of_two() => *a,
            Some((_, v)) => {
                return Err(self.corrupt(0, format!("bad general.alignment {v:?}")));
            }
        };

        let mut raw = Vec::with_capacity(n_tensors as usize);
        let mut names = HashMap::with_capacity(n_tensors as usize);
        for _ in 0..n_tensors {
            let at = self.pos;
            let name_bytes = self.string_bytes("tensor name")?;
            let name = String::from_utf8(name_bytes.to_vec())
                .map_err(|_| self.corrupt(at, "tensor name is not UTF-8"))?;
            let n_dims = self.u32("tensor dimension count")?;
            if n_dims as usize > GGML_MAX_DIMS {
                return Err(self.corrupt(at, format!("tensor {name} has {n_dims} dimensions")));
            }
            let mut shape = Vec::with_capacity(n_dims as usize);
            for _ in 0..n_dims {
                shape.push(self.u64("tensor dimension")?);
            }
            let type_code = self.u32("tensor type")?;
            let dtype = GgmlType::from_u32(type_code, &name)?;
            let rel_offset = self.u64("tensor offset")?;
            let n_bytes = dtype.tensor_bytes(&shape).ok_or_else(|| {
                self.corrupt(
                    at,
                    format!(
                        "tensor {name}: shape {shape:?} is not a whole number of {} blocks or is too large",
                        dtype.name()
                    ),
                )
            })?;
            if rel_offset % u64::from(alignment) != 0 {
                return Err(self.corrupt(
                    at,
                    format!("tensor {name}: offset {rel_offset} is not aligned to {alignment}"),
                ));
            }
            if names.insert(name.clone(), ()).is_some() {
                return Err(self.corrupt(at, format!("duplicate tensor {name}")));
            }
            raw.push((at, name, shape, dtype, rel_offset, n_bytes));
        }

        let align = u64::from(alignment);
        let data_offset = (self.pos as u64).div_ceil(align) * align;
        let file_len = self.buf.len() as u64;
        let mut tensors = Vec::with_capacity(raw.len());
        for (at, name, shape, dtype, rel_offset, n_bytes) in raw {
            let offset = data_offset.checked_add(rel_offset);
            let end = offset.and_then(|o| o.checked_add(n_bytes));
            match (offset, end) {
                (Some(offset), Some(end)) if end <= file_len => tensors.push(TensorInfo {
                    name,
                    shape,
                    dtype,
                    offset,
                    n_bytes,
                }),
                (Some(offset), Some(_)) => {
                    return Err(self.truncated(
                        offset.min(file_len) as usize,
                        n_bytes,
                        "tensor data",
                    ))
                }
                _ => {
                    return Err(
                        self.corrupt(at, format!("tensor {name}: offset {rel_offset} overflows"))
                    )
                }
            }
        }

        Ok(Header {
            version,
            alignment,
            data_offset,
            kvs,
            tensors,
        })
    }
}

/// Builds a GGUF v3 file in memory; tests use it to make tiny models and vocabularies.
#[derive(Debug, Default)]
pub struct GgufWriter {
    kvs: Vec<(String, MetaValue)>,
    tensors: Vec<(String, Vec<u64>, GgmlType, Vec<u8>)>,
}

impl GgufWriter {
    /// An empty file.
    pub fn new() -> GgufWriter {
        GgufWriter::default()
    }

    /// Adds a metadata value of any type. Adding a key twice replaces the earlier value.
    pub fn add(&mut self, key: &str, value: MetaValue) -> &mut Self {
        match self.kvs.iter_mut().find(|(k, _)| k == key) {
            Some(slot) => slot.1 = value,
            None => self.kvs.push((key.to_string(), value)),
        }
        self
    }

    /// Adds a string.
    pub fn add_str(&mut self, key: &str, value: &str) -> &mut Self {
        self.add(key, MetaValue::Str(value.to_string()))
    }

    /// Adds a `u32`.
    pub fn add_u32(&mut self, key: &str, value: u32) -> &mut Self {
        self.add(key, MetaValue::U32(value))
    }

    /// Adds an `f32`.
    pub fn add_f32(&mut self, key: &str, value: f32) -> &mut Self {
        self.add(key, MetaValue::F32(value))
    }

    /// Adds a bool.
    pub fn add_bool(&mut self, key: &str, value: bool) -> &mut Self {
        self.add(key, MetaValue::Bool(value))
    }

    /// Adds an array of strings.
    pub fn add_str_array<S: AsRef<str>>(&mut self, key: &str, values: &[S]) -> &mut Self {
        let items = values
            .iter()
            .map(|s| MetaValue::Str(s.as_ref().to_string()))
            .collect();
        self.add(key, MetaValue::Array(items))
    }

    /// Adds an array of `f32`.
    pub fn add_f32_array(&mut self, key: &str, values: &[f32]) -> &mut Self {
        self.add(
            key,
            MetaValue::Array(values.iter().map(|&v| MetaValue::F32(v)).collect()),
        )
    }

    /// Adds an array of `i32`.
    pub fn add_i32_array(&mut self, key: &str, values: &[i32]) -> &mut Self {
        self.add(
            key,
            MetaValue::Array(values.iter().map(|&v| MetaValue::I32(v)).collect()),
        )
    }

    /// Adds a tensor; `bytes` must hold exactly the data of `shape` (ggml order) in `dtype`.
    pub fn add_tensor(
        &mut self,
        name: &str,
        shape: &[u64],
        dtype: GgmlType,
        bytes: Vec<u8>,
    ) -> &mut Self {
        self.tensors
            .push((name.to_string(), shape.to_vec(), dtype, bytes));
        self
    }

    fn alignment(&self) -> u64 {
        match self.kvs.iter().find(|(k, _)| k == "general.alignment") {
            Some((_, MetaValue::U32(a))) if a.is_power_of_two() => u64::from(*a),
            _ => u64::from(GGUF_DEFAULT_ALIGNMENT),
        }
    }

    /// The encoded file.
    ///
    /// Fails with [`Error::GgufCorrupt`] when a tensor's bytes do not match its shape and type, or
    /// when an array mixes element types.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let bad = |reason: String| Error::GgufCorrupt {
            path: PathBuf::from("<GgufWriter>"),
            offset: 0,
            reason,
        };
        let align = self.alignment();
        let mut out = Vec::new();
        out.extend_from_slice(&GGUF_MAGIC);
        out.extend_from_slice(&GGUF_VERSION.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.kvs.len() as u64).to_le_bytes());
        for (key, value) in &self.kvs {
            write_str(&mut out, key);
            out.extend_from_slice(&value.type_code().to_le_bytes());
            write_value(&mut out, value).map_err(|e| bad(format!("{key}: {e}")))?;
        }
        let mut offset = 0u64;
        let mut offsets = Vec::with_capacity(self.tensors.len());
        for (name, shape, dtype, bytes) in &self.tensors {
            let expected = dtype.tensor_bytes(shape);
            if expected != Some(bytes.len() as u64) {
                return Err(bad(format!(
                    "tensor {name}: {} bytes given, {expected:?} expected",
                    bytes.len()
                )));
            }
            write_str(&mut out, name);
            out.extend_from_slice(&(shape.len() as u32).to_le_bytes());
            for d in shape {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&(*dtype as u32).to_le_bytes());
            out.extend_from_slice(&offset.to_le_bytes());
            offsets.push(offset);
            offset = (offset + bytes.len() as u64).div_ceil(align) * align;
        }
        let pad_to = |out: &mut Vec<u8>, to: u64| out.resize(to as usize, 0);
        let data_start = (out.len() as u64).div_ceil(align) * align;
        if !self.tensors.is_empty() {
            pad_to(&mut out, data_start);
        }
        for ((_, _, _, bytes), off) in self.tensors.iter().zip(offsets) {
            pad_to(&mut out, data_start + off);
            out.extend_from_slice(bytes);
        }
        Ok(out)
    }

    /// Writes the file to `path`.
    pub fn write(&self, path: &Path) -> Result<()> {
        let bytes = self.to_bytes()?;
        let io_err = |source| Error::Io {
            path: path.to_path_buf(),
            source,
        };
        let mut f = File::create(path).map_err(io_err)?;
        f.write_all(&bytes).map_err(io_err)?;
        f.flush().map_err(io_err)
    }
}

fn write_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn write_value(out: &mut Vec<u8>, v: &MetaValue) -> std::result::Result<(), String> {
    match v {
        MetaValue::U8(x) => out.push(*x),
        MetaValue::I8(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::Bool(x) => out.push(u8::from(*x)),
        MetaValue::Str(s) => write_str(out, s),
        MetaValue::Array(items) => {
            let elem = items.first().map_or(4, MetaValue::type_code);
            if items.iter().any(|i| i.type_code() != elem) {
                return Err("array mixes element types".to_string());
            }
            out.extend_from_slice(&elem.to_le_bytes());
            out.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for item in items {
                write_value(out, item)?;
            }
        }
    }
    Ok(())
}
