//! The META section (FORMAT.md §6): a checkpoint's name, parent and key/value pairs, as
//! length-prefixed UTF-8 strings, read back with every length checked against what is there.

use super::{Metadata, MAX_PAIRS, MAX_STRING};
use crate::block::truncated;
use crate::error::{FormatError, Result};

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u32).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

pub(super) fn encode_meta(m: &Metadata) -> Vec<u8> {
    let mut out = Vec::new();
    put_str(&mut out, &m.name);
    match &m.parent {
        None => out.extend_from_slice(&u32::MAX.to_le_bytes()),
        Some(p) => put_str(&mut out, p),
    }
    out.extend_from_slice(&(m.kv.len() as u32).to_le_bytes());
    for (k, v) in &m.kv {
        put_str(&mut out, k);
        put_str(&mut out, v);
    }
    out
}

struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
    base: u64,
}

impl<'a> Cursor<'a> {
    fn u32(&mut self, what: &'static str) -> Result<u32> {
        let b = self.take(what, 4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn take(&mut self, what: &'static str, n: usize) -> Result<&'a [u8]> {
        let avail = self.bytes.len() - self.pos;
        if n > avail {
            return Err(truncated(
                what,
                self.base + self.pos as u64,
                n as u64,
                avail as u64,
            ));
        }
        let s = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn string_with_len(&mut self, what: &'static str, len: u32) -> Result<String> {
        if len > MAX_STRING {
            return Err(FormatError::AbsurdLength {
                what,
                len: u64::from(len),
                limit: u64::from(MAX_STRING),
            });
        }
        let b = self.take(what, len as usize)?;
        String::from_utf8(b.to_vec())
            .map_err(|e| FormatError::invalid(what, format!("not UTF-8: {e}")))
    }

    fn string(&mut self, what: &'static str) -> Result<String> {
        let len = self.u32(what)?;
        self.string_with_len(what, len)
    }
}

pub(super) fn decode_meta(bytes: &[u8], base: u64, created_unix: u64) -> Result<Metadata> {
    let mut c = Cursor {
        bytes,
        pos: 0,
        base,
    };
    let name = c.string("metadata name")?;
    let plen = c.u32("metadata parent")?;
    let parent = if plen == u32::MAX {
        None
    } else {
        Some(c.string_with_len("metadata parent", plen)?)
    };
    let n = c.u32("metadata pair count")?;
    if n > MAX_PAIRS {
        return Err(FormatError::AbsurdLength {
            what: "metadata pairs",
            len: u64::from(n),
            limit: u64::from(MAX_PAIRS),
        });
    }
    let mut kv = Vec::new();
    for _ in 0..n {
        let k = c.string("metadata key")?;
        let v = c.string("metadata value")?;
        kv.push((k, v));
    }
    if c.pos != bytes.len() {
        return Err(FormatError::invalid(
            "metadata section",
            format!("{} trailing bytes", bytes.len() - c.pos),
        ));
    }
    Ok(Metadata {
        name,
        parent,
        created_unix,
        kv,
    })
}
