//! Block records: encoding and zero-copy, verified views.
//!
//! A block record is a [`BlockHeader`], the block's token ids, zero padding
//! to a multiple of 4096, the payload (raw KV or q8_0) and zero padding to a
//! multiple of 4096. The same bytes are a block file in a [`crate::Store`]
//! and a block inside an [`crate::Export`].

use std::borrow::Cow;

use zerocopy::byteorder::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, IntoBytes};

use crate::error::{FormatError, Result};
use crate::geometry::{ElemType, Geometry, MAX_BLOCK_BYTES, MAX_TOKENS_PER_BLOCK};
use crate::ids::{BlockId, Fingerprint};
use crate::layout::{
    align_up, crc_parts, BlockHeader, ALIGN, BLOCK_FLAG_HAS_PREV, BLOCK_MAGIC, BLOCK_VERSION,
    HEADER_CRC_OFFSET, HEADER_SIZE,
};
use crate::quant;

/// How a block's KV bytes are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Encoding {
    /// The KV bytes as given.
    #[default]
    Raw,
    /// f16 KV quantised to q8_0 (lossy, about 53 % of the bytes).
    Q8_0,
}

impl Encoding {
    /// On-disk code.
    pub fn code(self) -> u8 {
        match self {
            Encoding::Raw => 0,
            Encoding::Q8_0 => 1,
        }
    }

    /// Parses an on-disk code.
    pub fn from_code(code: u8) -> Result<Self> {
        match code {
            0 => Ok(Encoding::Raw),
            1 => Ok(Encoding::Q8_0),
            _ => Err(FormatError::invalid(
                "block encoding",
                format!("unknown code {code}"),
            )),
        }
    }

    /// Short name (`"raw"`, `"q8_0"`).
    pub fn name(self) -> &'static str {
        match self {
            Encoding::Raw => "raw",
            Encoding::Q8_0 => "q8_0",
        }
    }
}

/// A block record ready to be written: header bytes, payload, zero padding.
/// The raw payload is borrowed, so writing it costs no copy.
#[derive(Debug, Clone)]
pub struct EncodedBlock<'a> {
    /// The block's id.
    pub id: BlockId,
    header: Vec<u8>,
    payload: Cow<'a, [u8]>,
    padding: usize,
}

impl<'a> EncodedBlock<'a> {
    /// The three consecutive parts of the record.
    pub fn parts(&self) -> [&[u8]; 3] {
        [&self.header, &self.payload, &ZERO_PAGE[..self.padding]]
    }

    /// Total record length.
    pub fn len(&self) -> u64 {
        (self.header.len() + self.payload.len() + self.padding) as u64
    }

    /// Always false: a record has at least a header.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The record as one owned buffer.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.len() as usize);
        for p in self.parts() {
            v.extend_from_slice(p);
        }
        v
    }
}

static ZERO_PAGE: [u8; ALIGN as usize] = [0u8; ALIGN as usize];

/// Encodes the block holding `tokens` (exactly `tokens_per_block` of them)
/// and their `kv` bytes (exactly `geometry.block_bytes()`), following `prev`.
/// The id is computed here with [`BlockId::chain`].
pub fn encode_block<'a>(
    fp: &Fingerprint,
    geometry: &Geometry,
    prev: Option<&BlockId>,
    tokens: &[u32],
    kv: &'a [u8],
    encoding: Encoding,
) -> Result<EncodedBlock<'a>> {
    let tpb = geometry.tokens_per_block() as usize;
    if tokens.len() != tpb {
        return Err(FormatError::invalid(
            "block tokens",
            format!("{} tokens, a block holds {tpb}", tokens.len()),
        ));
    }
    if kv.len() as u64 != geometry.block_bytes() {
        return Err(FormatError::invalid(
            "block KV",
            format!(
                "{} bytes, a block holds {}",
                kv.len(),
                geometry.block_bytes()
            ),
        ));
    }
    if encoding == Encoding::Q8_0 && geometry.elem() != ElemType::F16 {
        return Err(FormatError::invalid(
            "block encoding",
            format!("q8_0 needs f16 KV, geometry is {}", geometry.elem().name()),
        ));
    }
    let id = BlockId::chain(fp, prev, tokens);
    let payload: Cow<'a, [u8]> = match encoding {
        Encoding::Raw => Cow::Borrowed(kv),
        Encoding::Q8_0 => Cow::Owned(quant::quantize_f16(kv)),
    };
    let header_len = align_up((HEADER_SIZE + 4 * tpb) as u64) as usize;
    let mut h = BlockHeader {
        magic: BLOCK_MAGIC,
        version: U16::new(BLOCK_VERSION),
        encoding: encoding.code(),
        elem: geometry.elem().code(),
        header_len: U32::new(header_len as u32),
        n_tokens: U32::new(tpb as u32),
        n_layers: U32::new(geometry.n_layers() as u32),
        raw_len: U64::new(kv.len() as u64),
        payload_len: U64::new(payload.len() as u64),
        payload_crc: U32::new(crc32fast::hash(&payload)),
        flags: U32::new(if prev.is_some() {
            BLOCK_FLAG_HAS_PREV
        } else {
            0
        }),
        fingerprint: fp.0,
        block_id: id.0,
        prev_id: prev.map(|p| p.0).unwrap_or([0; 32]),
        geometry_digest: geometry.digest(),
        reserved: [0; 76],
        header_crc: U32::new(0),
    };
    let mut header = Vec::with_capacity(header_len);
    header.extend_from_slice(h.as_bytes());
    for t in tokens {
        header.extend_from_slice(&t.to_le_bytes());
    }
    header.resize(header_len, 0);
    let crc = crc_parts(&[&header[..HEADER_CRC_OFFSET], &header[HEADER_SIZE..]]);
    h.header_crc = U32::new(crc);
    header[..HEADER_SIZE].copy_from_slice(h.as_bytes());
    let padding = (align_up(payload.len() as u64) - payload.len() as u64) as usize;
    Ok(EncodedBlock {
        id,
        header,
        payload,
        padding,
    })
}

/// A verified, borrowed view of one block record.
///
/// Obtained only through [`BlockView::parse`] (or the store/export readers,
/// which call it), so every accessor reads bytes whose magic, version, bounds
/// and checksums have been checked.
#[derive(Debug, Clone, Copy)]
pub struct BlockView<'a> {
    header: &'a BlockHeader,
    tokens: &'a [U32],
    payload: &'a [u8],
    padding: &'a [u8],
    record_len: u64,
}

pub(crate) fn truncated(
    what: &'static str,
    offset: u64,
    needed: u64,
    available: u64,
) -> FormatError {
    FormatError::Truncated {
        what,
        offset,
        needed,
        available,
    }
}

pub(crate) fn check_magic(
    what: &'static str,
    found: &[u8; 8],
    want: &[u8; 8],
    offset: u64,
) -> Result<()> {
    if found != want {
        return Err(FormatError::BadMagic {
            what,
            offset,
            found: *found,
        });
    }
    Ok(())
}

pub(crate) fn check_version(what: &'static str, found: u16, supported: u16) -> Result<()> {
    if found == 0 || found > supported {
        return Err(FormatError::UnsupportedVersion {
            what,
            found,
            supported,
        });
    }
    Ok(())
}

impl<'a> BlockView<'a> {
    /// Parses and fully verifies a block record occupying all of `bytes`.
    pub fn parse(bytes: &'a [u8]) -> Result<Self> {
        Self::parse_at(bytes, 0, true)
    }

    /// Parses a record; `base` is its offset in the enclosing file (for error
    /// messages). With `verify_payload` false, the payload CRC and padding are
    /// not checked (used only on bytes verified before).
    pub(crate) fn parse_at(bytes: &'a [u8], base: u64, verify_payload: bool) -> Result<Self> {
        let avail = bytes.len() as u64;
        let (header, _) = BlockHeader::ref_from_prefix(bytes)
            .map_err(|_| truncated("block header", base, HEADER_SIZE as u64, avail))?;
        check_magic("block header", &header.magic, &BLOCK_MAGIC, base)?;
        let header_len = u64::from(header.header_len.get());
        let n_tokens = u64::from(header.n_tokens.get());
        if n_tokens == 0 || n_tokens > u64::from(MAX_TOKENS_PER_BLOCK) {
            return Err(FormatError::OutOfBounds {
                what: "block n_tokens",
                value: n_tokens,
                limit: u64::from(MAX_TOKENS_PER_BLOCK),
            });
        }
        let want_header_len = align_up(HEADER_SIZE as u64 + 4 * n_tokens);
        if header_len != want_header_len {
            return Err(FormatError::invalid(
                "block header_len",
                format!("{header_len} at offset {base}, expected {want_header_len}"),
            ));
        }
        if avail < header_len {
            return Err(truncated("block header", base, header_len, avail));
        }
        let hbytes = &bytes[..header_len as usize];
        let crc = crc_parts(&[&hbytes[..HEADER_CRC_OFFSET], &hbytes[HEADER_SIZE..]]);
        if crc != header.header_crc.get() {
            return Err(FormatError::ChecksumMismatch {
                what: "block header",
                offset: base,
                expected: header.header_crc.get(),
                found: crc,
            });
        }
        // Everything below is covered by the header CRC; the checks guard
        // against a writer bug or a forged file rather than bit rot.
        check_version("block", header.version.get(), BLOCK_VERSION)?;
        let encoding = Encoding::from_code(header.encoding)?;
        ElemType::from_code(header.elem)?;
        if header.flags.get() & !BLOCK_FLAG_HAS_PREV != 0 || header.reserved.iter().any(|&b| b != 0)
        {
            return Err(FormatError::invalid("block header", "reserved bits set"));
        }
        let tok_end = HEADER_SIZE + 4 * n_tokens as usize;
        if hbytes[tok_end..].iter().any(|&b| b != 0) {
            return Err(FormatError::invalid("block header", "padding not zero"));
        }
        let raw_len = header.raw_len.get();
        let payload_len = header.payload_len.get();
        if raw_len > MAX_BLOCK_BYTES {
            return Err(FormatError::AbsurdLength {
                what: "block raw_len",
                len: raw_len,
                limit: MAX_BLOCK_BYTES,
            });
        }
        let expect_payload = match encoding {
            Encoding::Raw => raw_len,
            Encoding::Q8_0 => quant::q8_0_len(raw_len),
        };
        if payload_len != expect_payload {
            return Err(FormatError::invalid(
                "block payload_len",
                format!("{payload_len} for {} of {raw_len} bytes", encoding.name()),
            ));
        }
        let record_len = header_len + align_up(payload_len);
        if avail < record_len {
            return Err(truncated("block record", base, record_len, avail));
        }
        if avail > record_len {
            return Err(FormatError::invalid(
                "block record",
                format!(
                    "{} trailing bytes after offset {}",
                    avail - record_len,
                    base + record_len
                ),
            ));
        }
        let (tokens, _) =
            <[U32]>::ref_from_prefix_with_elems(&hbytes[HEADER_SIZE..], n_tokens as usize)
                .map_err(|_| {
                    truncated(
                        "block tokens",
                        base + HEADER_SIZE as u64,
                        4 * n_tokens,
                        avail,
                    )
                })?;
        let payload = &bytes[header_len as usize..(header_len + payload_len) as usize];
        let padding = &bytes[(header_len + payload_len) as usize..record_len as usize];
        let view = BlockView {
            header,
            tokens,
            payload,
            padding,
            record_len,
        };
        let has_prev = header.flags.get() & BLOCK_FLAG_HAS_PREV != 0;
        if !has_prev && header.prev_id != [0; 32] {
            return Err(FormatError::invalid(
                "block header",
                "prev_id set without flag",
            ));
        }
        let recomputed = BlockId::chain(&view.fingerprint(), view.prev().as_ref(), &view.tokens());
        if recomputed != view.id() {
            return Err(FormatError::BlockIdMismatch {
                expected: view.id().to_hex(),
                found: recomputed.to_hex(),
            });
        }
        if verify_payload {
            view.verify_payload(base)?;
        }
        Ok(view)
    }

    fn verify_payload(&self, base: u64) -> Result<()> {
        let crc = crc32fast::hash(self.payload);
        if crc != self.header.payload_crc.get() {
            return Err(FormatError::ChecksumMismatch {
                what: "block payload",
                offset: base + u64::from(self.header.header_len.get()),
                expected: self.header.payload_crc.get(),
                found: crc,
            });
        }
        if let Some(i) = self.padding.iter().position(|&b| b != 0) {
            let at = base
                + u64::from(self.header.header_len.get())
                + self.payload.len() as u64
                + i as u64;
            return Err(FormatError::invalid(
                "block padding",
                format!("non-zero byte at offset {at}"),
            ));
        }
        Ok(())
    }

    /// Checks that the block belongs to model `fp` and geometry `geometry`.
    pub fn check_owner(&self, fp: &Fingerprint, geometry: &Geometry) -> Result<()> {
        if self.fingerprint() != *fp {
            return Err(FormatError::FingerprintMismatch {
                what: "block",
                expected: fp.to_hex(),
                found: self.fingerprint().to_hex(),
            });
        }
        if self.header.geometry_digest != geometry.digest()
            || self.raw_len() != geometry.block_bytes()
            || self.n_tokens() != geometry.tokens_per_block()
            || self.header.elem != geometry.elem().code()
            || self.header.n_layers.get() as usize != geometry.n_layers()
        {
            return Err(FormatError::GeometryMismatch {
                what: "block",
                detail: format!(
                    "block has {} tokens, {} layers, {} bytes; store expects {} tokens, {} layers, {} bytes",
                    self.n_tokens(),
                    self.header.n_layers.get(),
                    self.raw_len(),
                    geometry.tokens_per_block(),
                    geometry.n_layers(),
                    geometry.block_bytes()
                ),
            });
        }
        Ok(())
    }

    /// The block's id.
    pub fn id(&self) -> BlockId {
        BlockId(self.header.block_id)
    }

    /// The previous block's id, if any.
    pub fn prev(&self) -> Option<BlockId> {
        (self.header.flags.get() & BLOCK_FLAG_HAS_PREV != 0).then_some(BlockId(self.header.prev_id))
    }

    /// The model fingerprint recorded in the block.
    pub fn fingerprint(&self) -> Fingerprint {
        Fingerprint(self.header.fingerprint)
    }

    /// How the payload is stored.
    pub fn encoding(&self) -> Encoding {
        // Checked in `parse_at`.
        Encoding::from_code(self.header.encoding).unwrap_or_default()
    }

    /// Number of tokens.
    pub fn n_tokens(&self) -> u32 {
        self.header.n_tokens.get()
    }

    /// The block's token ids.
    pub fn tokens(&self) -> Vec<u32> {
        self.tokens.iter().map(|t| t.get()).collect()
    }

    /// Bytes of the decoded KV.
    pub fn raw_len(&self) -> u64 {
        self.header.raw_len.get()
    }

    /// The stored payload (raw KV, or q8_0 bytes), borrowed from the record.
    pub fn payload(&self) -> &'a [u8] {
        self.payload
    }

    /// The raw KV bytes, borrowed when stored raw, decoded when compressed.
    pub fn kv(&self) -> Result<Cow<'a, [u8]>> {
        match self.encoding() {
            Encoding::Raw => Ok(Cow::Borrowed(self.payload)),
            Encoding::Q8_0 => quant::dequantize_f16(self.payload, self.raw_len())
                .map(Cow::Owned)
                .ok_or_else(|| FormatError::invalid("block payload", "q8_0 length mismatch")),
        }
    }

    /// Length of the whole record in bytes.
    pub fn record_len(&self) -> u64 {
        self.record_len
    }
}
