//! [`KvBytes`]: a cheap, shared, read-only view of one block's KV bytes.

use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

/// The KV bytes of one block, shared without copying between the RAM tier
/// and every reader (cloning costs one reference count).
///
/// A block promoted from disk keeps the whole record read from the file and
/// points at its payload, so promotion copies nothing after the read.
#[derive(Clone)]
pub struct KvBytes {
    buf: Arc<Vec<u8>>,
    start: usize,
    len: usize,
}

impl KvBytes {
    /// Wraps an owned buffer.
    pub fn from_vec(v: Vec<u8>) -> Self {
        let len = v.len();
        KvBytes {
            buf: Arc::new(v),
            start: 0,
            len,
        }
    }

    /// A sub-range `start..start + len` of `buf`; `None` when out of range.
    pub(crate) fn slice_of(buf: Vec<u8>, start: usize, len: usize) -> Option<Self> {
        let end = start.checked_add(len)?;
        if end > buf.len() {
            return None;
        }
        Some(KvBytes {
            buf: Arc::new(buf),
            start,
            len,
        })
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        &self.buf[self.start..self.start + self.len]
    }
}

impl Deref for KvBytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl AsRef<[u8]> for KvBytes {
    fn as_ref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl PartialEq for KvBytes {
    fn eq(&self, other: &Self) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl Eq for KvBytes {}

impl fmt::Debug for KvBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KvBytes({} bytes)", self.len)
    }
}

impl From<Vec<u8>> for KvBytes {
    fn from(v: Vec<u8>) -> Self {
        KvBytes::from_vec(v)
    }
}
