//! State records: the recurrent state of a hybrid model's stateful layers at a
//! block boundary (FORMAT.md §5.2).
//!
//! A recurrent layer cannot be cut back to a shorter prefix the way a KV cache
//! can: resuming at position `p` needs the state after exactly `p` tokens. A
//! state record holds it for `p` = the end of one block, keyed by that block's
//! id (which commits to every token before it), so any sequence that shares
//! the prefix finds it. A record is a [`StateHeader`], zero padding up to
//! 4096 bytes, the payload (each stateful layer's bytes in layer order) and
//! zero padding to a multiple of 4096.

use zerocopy::byteorder::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, IntoBytes};

use crate::block::{check_magic, check_version, truncated};
use crate::error::{FormatError, Result};
use crate::geometry::{Geometry, MAX_STATE_BYTES};
use crate::ids::{BlockId, Fingerprint};
use crate::layout::{
    align_up, crc_parts, StateHeader, HEADER_CRC_OFFSET, HEADER_SIZE, STATE_HEADER_LEN,
    STATE_MAGIC, STATE_VERSION,
};

/// Encodes the state record of block `id` (the state after its last token,
/// `n_tokens` tokens from the start of the sequence) as one buffer.
pub fn encode_state(
    fp: &Fingerprint,
    geometry: &Geometry,
    id: &BlockId,
    n_tokens: u64,
    state: &[u8],
) -> Result<Vec<u8>> {
    if !geometry.has_state() {
        return Err(FormatError::invalid(
            "state record",
            "the geometry has no recurrent state",
        ));
    }
    if state.len() as u64 != geometry.state_bytes() {
        return Err(FormatError::invalid(
            "state record",
            format!(
                "{} bytes of state, the geometry has {}",
                state.len(),
                geometry.state_bytes()
            ),
        ));
    }
    let tpb = u64::from(geometry.tokens_per_block());
    if n_tokens == 0 || !n_tokens.is_multiple_of(tpb) {
        return Err(FormatError::invalid(
            "state record",
            format!("{n_tokens} tokens is not the end of a block of {tpb}"),
        ));
    }
    let mut h = StateHeader {
        magic: STATE_MAGIC,
        version: U16::new(STATE_VERSION),
        reserved0: U16::new(0),
        n_layers: U32::new(geometry.n_layers() as u32),
        n_tokens: U64::new(n_tokens),
        payload_len: U64::new(state.len() as u64),
        payload_crc: U32::new(crc32fast::hash(state)),
        flags: U32::new(0),
        fingerprint: fp.0,
        block_id: id.0,
        geometry_digest: geometry.digest(),
        reserved: [0; 116],
        header_crc: U32::new(0),
    };
    let len = STATE_HEADER_LEN + align_up(state.len() as u64);
    let mut out = vec![0u8; len as usize];
    out[..HEADER_SIZE].copy_from_slice(h.as_bytes());
    let padding = &out[HEADER_SIZE..STATE_HEADER_LEN as usize];
    h.header_crc = U32::new(crc_parts(&[&out[..HEADER_CRC_OFFSET], padding]));
    out[..HEADER_SIZE].copy_from_slice(h.as_bytes());
    let start = STATE_HEADER_LEN as usize;
    out[start..start + state.len()].copy_from_slice(state);
    Ok(out)
}

/// A verified, borrowed view of one state record.
#[derive(Debug, Clone, Copy)]
pub struct StateView<'a> {
    header: &'a StateHeader,
    payload: &'a [u8],
}

impl<'a> StateView<'a> {
    /// Parses and fully verifies a state record occupying all of `bytes`:
    /// magic, header CRC (with its padding), version, reserved fields, lengths,
    /// payload CRC and padding. Never panics.
    pub fn parse(bytes: &'a [u8]) -> Result<Self> {
        let avail = bytes.len() as u64;
        let (header, _) = StateHeader::ref_from_prefix(bytes)
            .map_err(|_| truncated("state header", 0, HEADER_SIZE as u64, avail))?;
        check_magic("state header", &header.magic, &STATE_MAGIC, 0)?;
        if avail < STATE_HEADER_LEN {
            return Err(truncated("state header", 0, STATE_HEADER_LEN, avail));
        }
        let hbytes = &bytes[..STATE_HEADER_LEN as usize];
        let crc = crc_parts(&[&hbytes[..HEADER_CRC_OFFSET], &hbytes[HEADER_SIZE..]]);
        if crc != header.header_crc.get() {
            return Err(FormatError::ChecksumMismatch {
                what: "state header",
                offset: 0,
                expected: header.header_crc.get(),
                found: crc,
            });
        }
        check_version("state record", header.version.get(), STATE_VERSION)?;
        if header.reserved0.get() != 0
            || header.flags.get() != 0
            || header.reserved.iter().any(|&b| b != 0)
        {
            return Err(FormatError::invalid("state header", "reserved bits set"));
        }
        if hbytes[HEADER_SIZE..].iter().any(|&b| b != 0) {
            return Err(FormatError::invalid("state header", "padding not zero"));
        }
        let payload_len = header.payload_len.get();
        if payload_len == 0 || payload_len > MAX_STATE_BYTES {
            return Err(FormatError::AbsurdLength {
                what: "state payload_len",
                len: payload_len,
                limit: MAX_STATE_BYTES,
            });
        }
        if header.n_tokens.get() == 0 {
            return Err(FormatError::invalid("state header", "zero tokens"));
        }
        let record_len = STATE_HEADER_LEN + align_up(payload_len);
        if avail < record_len {
            return Err(truncated("state record", 0, record_len, avail));
        }
        if avail > record_len {
            return Err(FormatError::invalid(
                "state record",
                format!(
                    "{} trailing bytes after offset {record_len}",
                    avail - record_len
                ),
            ));
        }
        let start = STATE_HEADER_LEN as usize;
        let end = start + payload_len as usize;
        let payload = &bytes[start..end];
        let crc = crc32fast::hash(payload);
        if crc != header.payload_crc.get() {
            return Err(FormatError::ChecksumMismatch {
                what: "state payload",
                offset: STATE_HEADER_LEN,
                expected: header.payload_crc.get(),
                found: crc,
            });
        }
        if let Some(i) = bytes[end..].iter().position(|&b| b != 0) {
            return Err(FormatError::invalid(
                "state padding",
                format!("non-zero byte at offset {}", end + i),
            ));
        }
        Ok(StateView { header, payload })
    }

    /// Checks that the record belongs to model `fp`, geometry `geometry` and
    /// block `id`.
    pub fn check_owner(&self, fp: &Fingerprint, geometry: &Geometry, id: &BlockId) -> Result<()> {
        if self.fingerprint() != *fp {
            return Err(FormatError::FingerprintMismatch {
                what: "state record",
                expected: fp.to_hex(),
                found: self.fingerprint().to_hex(),
            });
        }
        let tpb = u64::from(geometry.tokens_per_block());
        if self.header.geometry_digest != geometry.digest()
            || self.header.n_layers.get() as usize != geometry.n_layers()
            || self.payload.len() as u64 != geometry.state_bytes()
            || !self.n_tokens().is_multiple_of(tpb)
        {
            return Err(FormatError::GeometryMismatch {
                what: "state record",
                detail: format!(
                    "record has {} layers, {} bytes of state at token {}; store expects {} layers, {} bytes, blocks of {tpb}",
                    self.header.n_layers.get(),
                    self.payload.len(),
                    self.n_tokens(),
                    geometry.n_layers(),
                    geometry.state_bytes()
                ),
            });
        }
        if self.block_id() != *id {
            return Err(FormatError::BlockIdMismatch {
                expected: id.to_hex(),
                found: self.block_id().to_hex(),
            });
        }
        Ok(())
    }

    /// The model fingerprint recorded.
    pub fn fingerprint(&self) -> Fingerprint {
        Fingerprint(self.header.fingerprint)
    }

    /// Id of the block after whose last token the state was taken.
    pub fn block_id(&self) -> BlockId {
        BlockId(self.header.block_id)
    }

    /// Tokens the state has consumed (the end of its block).
    pub fn n_tokens(&self) -> u64 {
        self.header.n_tokens.get()
    }

    /// Every stateful layer's bytes, in layer order (split them with
    /// [`Geometry::split_state`]).
    pub fn state(&self) -> &'a [u8] {
        self.payload
    }
}
