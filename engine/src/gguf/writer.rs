//! A GGUF v3 writer, for tests and tools that need small model files (feature `test-util`).

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use super::{
    GgmlType, MetaArray, MetaValue, StrArray, GGUF_DEFAULT_ALIGNMENT, GGUF_MAGIC, GGUF_VERSION,
};
use crate::error::GgufProblem;
use crate::{Error, Result};

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

    /// Removes a metadata key (nothing happens if it is absent).
    pub fn remove(&mut self, key: &str) -> &mut Self {
        self.kvs.retain(|(k, _)| k != key);
        self
    }

    /// A writer holding all metadata and tensors of `gguf`, to modify and write again; fails
    /// if the tensors' data can no longer be read.
    pub fn from_gguf(gguf: &super::Gguf) -> crate::Result<GgufWriter> {
        let mut w = GgufWriter::new();
        for (key, value) in gguf.metadata() {
            w.add(key, value.clone());
        }
        for t in gguf.tensors() {
            w.add_tensor(&t.name, &t.shape, t.dtype, gguf.read_tensor(t)?);
        }
        Ok(w)
    }

    /// Replaces the shape, type and bytes of the tensor `name` (nothing happens if it is absent).
    pub fn replace_tensor(
        &mut self,
        name: &str,
        shape: &[u64],
        dtype: GgmlType,
        bytes: Vec<u8>,
    ) -> &mut Self {
        if let Some(t) = self.tensors.iter_mut().find(|t| t.0 == name) {
            t.1 = shape.to_vec();
            t.2 = dtype;
            t.3 = bytes;
        }
        self
    }

    /// Removes the tensor `name` (nothing happens if it is absent).
    pub fn remove_tensor(&mut self, name: &str) -> &mut Self {
        self.tensors.retain(|t| t.0 != name);
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
        let items: StrArray = values.iter().collect();
        self.add(key, MetaArray::Str(items).into())
    }

    /// Adds an array of `f32`.
    pub fn add_f32_array(&mut self, key: &str, values: &[f32]) -> &mut Self {
        self.add(key, MetaArray::F32(values.to_vec()).into())
    }

    /// Adds an array of `i32`.
    pub fn add_i32_array(&mut self, key: &str, values: &[i32]) -> &mut Self {
        self.add(key, MetaArray::I32(values.to_vec()).into())
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
    /// Fails with [`Error::GgufCorrupt`] when a tensor's bytes do not match its shape and type.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let align = self.alignment();
        let mut out = Vec::new();
        out.extend_from_slice(&GGUF_MAGIC);
        out.extend_from_slice(&GGUF_VERSION.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.kvs.len() as u64).to_le_bytes());
        for (key, value) in &self.kvs {
            write_str(&mut out, key);
            out.extend_from_slice(&value.type_code().to_le_bytes());
            write_value(&mut out, value);
        }
        let mut offset = 0u64;
        let mut offsets = Vec::with_capacity(self.tensors.len());
        for (name, shape, dtype, bytes) in &self.tensors {
            let expected = dtype.tensor_bytes(shape);
            if expected != Some(bytes.len() as u64) {
                return Err(Error::GgufCorrupt {
                    path: PathBuf::from("<GgufWriter>"),
                    offset: 0,
                    reason: GgufProblem::TensorSize {
                        name: name.clone(),
                        given: bytes.len() as u64,
                        expected,
                    },
                });
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

fn write_value(out: &mut Vec<u8>, v: &MetaValue) {
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
        MetaValue::Array(a) => write_array(out, a),
    }
}

fn write_array(out: &mut Vec<u8>, a: &MetaArray) {
    out.extend_from_slice(&a.elem_type_code().to_le_bytes());
    out.extend_from_slice(&(a.len() as u64).to_le_bytes());
    macro_rules! le {
        ($v:expr) => {
            for x in $v {
                out.extend_from_slice(&x.to_le_bytes());
            }
        };
    }
    match a {
        MetaArray::U8(v) => out.extend_from_slice(v),
        MetaArray::I8(v) => le!(v),
        MetaArray::U16(v) => le!(v),
        MetaArray::I16(v) => le!(v),
        MetaArray::U32(v) => le!(v),
        MetaArray::I32(v) => le!(v),
        MetaArray::U64(v) => le!(v),
        MetaArray::I64(v) => le!(v),
        MetaArray::F32(v) => le!(v),
        MetaArray::F64(v) => le!(v),
        MetaArray::Bool(v) => out.extend(v.iter().map(|&b| u8::from(b))),
        MetaArray::Str(v) => v.iter().for_each(|s| write_str(out, s)),
        MetaArray::Array(v) => v.iter().for_each(|inner| write_array(out, inner)),
    }
}
