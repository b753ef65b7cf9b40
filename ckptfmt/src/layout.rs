//! On-disk structures as zerocopy types. FORMAT.md is the normative text;
//! this module mirrors its byte tables. All integers are little-endian and
//! every structure has explicit reserved bytes, so there is no implicit padding.
//!
//! ```text
//! BlockHeader (256 B)            ManifestHeader (256 B)          ExportHeader (256 B)
//!   0 magic "CKPTBLK\0"            0 magic "CKPTMAN\0"             0 magic "CKPTEXP\0"
//!   8 version u16                  8 version u16                   8 version u16
//!  10 encoding u8                 10 reserved u16                 10 reserved u16
//!  11 elem u8                     12 n_sections u32               12 n_blocks u32
//!  12 header_len u32              16 file_len u64                 16 file_len u64
//!  16 n_tokens u32                24 n_tokens u64                 24 manifest_offset u64
//!  20 n_layers u32                32 n_blocks u64                 32 manifest_len u64
//!  24 raw_len u64                 40 tail_tokens u32              40 index_offset u64
//!  32 payload_len u64             44 flags u32                    48 index_len u64
//!  40 payload_crc u32             48 fingerprint [32]             56 index_crc u32
//!  44 flags u32                   80 geometry_digest [32]         60 reserved u32
//!  48 fingerprint [32]           112 created_unix u64             64 fingerprint [32]
//!  80 block_id [32]              120 reserved [132]               96 geometry_digest [32]
//! 112 prev_id [32]               252 header_crc u32              128 reserved [124]
//! 144 geometry_digest [32]                                       252 header_crc u32
//! 176 reserved [76]              SectionEntry (32 B)
//! 252 header_crc u32               0 kind u32   4 flags u32      ExportIndexEntry (48 B)
//!                                  8 offset u64 16 len u64         0 block_id [32]
//!                                 24 crc u32   28 reserved u32    32 offset u64  40 len u64
//!
//! StateHeader (256 B)
//!   0 magic "CKPTSTA\0"   8 version u16   10 reserved u16   12 n_layers u32
//!  16 n_tokens u64       24 payload_len u64  32 payload_crc u32  36 flags u32
//!  40 fingerprint [32]   72 block_id [32]   104 geometry_digest [32]
//! 136 reserved [116]    252 header_crc u32
//! ```

use zerocopy::byteorder::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// Alignment of every payload and of every record inside an export.
pub const ALIGN: u64 = 4096;
/// Size of each fixed header.
pub const HEADER_SIZE: usize = 256;
/// Offset of the header CRC inside each fixed header (the CRC covers the
/// bytes before it, then the variable part that follows the header).
pub const HEADER_CRC_OFFSET: usize = 252;

/// Magic of a block record.
pub const BLOCK_MAGIC: [u8; 8] = *b"CKPTBLK\0";
/// Magic of a manifest.
pub const MANIFEST_MAGIC: [u8; 8] = *b"CKPTMAN\0";
/// Magic of an export.
pub const EXPORT_MAGIC: [u8; 8] = *b"CKPTEXP\0";
/// Magic of a state record.
pub const STATE_MAGIC: [u8; 8] = *b"CKPTSTA\0";

/// Block record version written and read by this crate.
pub const BLOCK_VERSION: u16 = 1;
/// Newest manifest version read by this crate. Writers write version 2 only
/// for a geometry with recurrent state (it has a TAIL_STATE section), and
/// version 1, byte for byte as before, for every other manifest.
pub const MANIFEST_VERSION: u16 = 2;
/// Manifest version of a geometry without recurrent state.
pub const MANIFEST_VERSION_PLAIN: u16 = 1;
/// Export version written and read by this crate.
pub const EXPORT_VERSION: u16 = 1;
/// State record version written and read by this crate.
pub const STATE_VERSION: u16 = 1;
/// Bytes before a state record's payload (the header, then zero padding).
pub const STATE_HEADER_LEN: u64 = ALIGN;

/// Geometry record flag (byte 9): per-layer recurrent state sizes follow the
/// layer table.
pub const GEOMETRY_FLAG_HAS_STATE: u8 = 1;

/// Block flag: the record has a previous block (`prev_id` is meaningful).
pub const BLOCK_FLAG_HAS_PREV: u32 = 1;

/// Manifest flag: a sampler-state section is present.
pub const MANIFEST_FLAG_HAS_SAMPLER: u32 = 1;

/// Section flag: a reader that does not know this section kind must refuse the file.
pub const SECTION_FLAG_REQUIRED: u32 = 1;

/// Section kinds of a manifest.
pub mod section {
    /// Canonical geometry record.
    pub const GEOMETRY: u32 = 1;
    /// Token ids, u32 LE each.
    pub const TOKENS: u32 = 2;
    /// Positions, i32 LE each.
    pub const POSITIONS: u32 = 3;
    /// Block ids, 32 bytes each.
    pub const BLOCK_IDS: u32 = 4;
    /// KV bytes of the partial tail (offset aligned to 4096).
    pub const TAIL_KV: u32 = 5;
    /// Opaque sampler / RNG state.
    pub const SAMPLER: u32 = 6;
    /// Metadata: name, parent, key/value pairs.
    pub const META: u32 = 7;
    /// Chain roots: per root, the block index (u64 LE) and the 32-byte id that
    /// block chains from. Written only when there is a root.
    pub const CHAIN_ROOTS: u32 = 8;
    /// The recurrent state after the last token (offset aligned to 4096).
    /// Present exactly when the geometry has state; only in version 2.
    pub const TAIL_STATE: u32 = 9;
}

/// Fixed header of a block record. Followed by the token ids (u32 LE) and
/// zero padding up to `header_len`, then the payload.
#[derive(Debug, Clone, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct BlockHeader {
    /// [`BLOCK_MAGIC`].
    pub magic: [u8; 8],
    /// [`BLOCK_VERSION`].
    pub version: U16,
    /// Payload encoding (0 raw, 1 q8_0 of f16).
    pub encoding: u8,
    /// Element type code of the raw KV.
    pub elem: u8,
    /// Bytes before the payload, a multiple of [`ALIGN`].
    pub header_len: U32,
    /// Tokens in the block (the store's tokens per block).
    pub n_tokens: U32,
    /// Layers in the geometry.
    pub n_layers: U32,
    /// Bytes of the decoded KV.
    pub raw_len: U64,
    /// Bytes of the stored payload.
    pub payload_len: U64,
    /// CRC32 of the stored payload.
    pub payload_crc: U32,
    /// [`BLOCK_FLAG_HAS_PREV`]; other bits zero.
    pub flags: U32,
    /// Model fingerprint.
    pub fingerprint: [u8; 32],
    /// This block's id.
    pub block_id: [u8; 32],
    /// The previous block's id, zero when there is none.
    pub prev_id: [u8; 32],
    /// BLAKE3 digest of the canonical geometry.
    pub geometry_digest: [u8; 32],
    /// Zero.
    pub reserved: [u8; 76],
    /// CRC32 of bytes 0..252 then bytes 256..header_len.
    pub header_crc: U32,
}

/// Fixed header of a manifest. Followed by `n_sections` [`SectionEntry`]s.
#[derive(Debug, Clone, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct ManifestHeader {
    /// [`MANIFEST_MAGIC`].
    pub magic: [u8; 8],
    /// [`MANIFEST_VERSION`].
    pub version: U16,
    /// Zero.
    pub reserved0: U16,
    /// Entries in the section table.
    pub n_sections: U32,
    /// Length of the whole manifest.
    pub file_len: U64,
    /// Tokens in the checkpoint.
    pub n_tokens: U64,
    /// Full blocks referenced.
    pub n_blocks: U64,
    /// Tokens in the tail (`n_tokens - n_blocks * tokens_per_block`).
    pub tail_tokens: U32,
    /// [`MANIFEST_FLAG_HAS_SAMPLER`]; other bits zero.
    pub flags: U32,
    /// Model fingerprint.
    pub fingerprint: [u8; 32],
    /// BLAKE3 digest of the canonical geometry.
    pub geometry_digest: [u8; 32],
    /// Creation time, seconds since the Unix epoch.
    pub created_unix: U64,
    /// Zero.
    pub reserved: [u8; 132],
    /// CRC32 of bytes 0..252 then the section table.
    pub header_crc: U32,
}

/// One entry of a manifest's section table.
#[derive(Debug, Clone, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct SectionEntry {
    /// Section kind, see [`section`].
    pub kind: U32,
    /// [`SECTION_FLAG_REQUIRED`]; other bits zero.
    pub flags: U32,
    /// Offset from the start of the manifest.
    pub offset: U64,
    /// Length in bytes.
    pub len: U64,
    /// CRC32 of the section's bytes.
    pub crc: U32,
    /// Zero.
    pub reserved: U32,
}

/// Fixed header of an export file.
#[derive(Debug, Clone, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct ExportHeader {
    /// [`EXPORT_MAGIC`].
    pub magic: [u8; 8],
    /// [`EXPORT_VERSION`].
    pub version: U16,
    /// Zero.
    pub reserved0: U16,
    /// Blocks in the export.
    pub n_blocks: U32,
    /// Length of the whole file.
    pub file_len: U64,
    /// Offset of the embedded manifest (aligned).
    pub manifest_offset: U64,
    /// Length of the embedded manifest.
    pub manifest_len: U64,
    /// Offset of the block index (aligned).
    pub index_offset: U64,
    /// Length of the block index (`n_blocks * 48`).
    pub index_len: U64,
    /// CRC32 of the block index.
    pub index_crc: U32,
    /// Zero.
    pub reserved1: U32,
    /// Model fingerprint.
    pub fingerprint: [u8; 32],
    /// BLAKE3 digest of the canonical geometry.
    pub geometry_digest: [u8; 32],
    /// Zero.
    pub reserved: [u8; 124],
    /// CRC32 of bytes 0..252.
    pub header_crc: U32,
}

/// Fixed header of a state record: the recurrent state of every stateful
/// layer after the last token of one block. Followed by zero padding up to
/// [`STATE_HEADER_LEN`], the payload and zero padding to a multiple of
/// [`ALIGN`].
#[derive(Debug, Clone, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct StateHeader {
    /// [`STATE_MAGIC`].
    pub magic: [u8; 8],
    /// [`STATE_VERSION`].
    pub version: U16,
    /// Zero.
    pub reserved0: U16,
    /// Layers in the geometry.
    pub n_layers: U32,
    /// Tokens the state has consumed: the end of the block, `(j + 1) × tokens_per_block`.
    pub n_tokens: U64,
    /// Bytes of the payload (the geometry's state bytes).
    pub payload_len: U64,
    /// CRC32 of the payload.
    pub payload_crc: U32,
    /// Zero.
    pub flags: U32,
    /// Model fingerprint.
    pub fingerprint: [u8; 32],
    /// Id of the block after whose last token the state was taken.
    pub block_id: [u8; 32],
    /// BLAKE3 digest of the canonical geometry.
    pub geometry_digest: [u8; 32],
    /// Zero.
    pub reserved: [u8; 116],
    /// CRC32 of bytes 0..252 then bytes 256..4096 (the padding).
    pub header_crc: U32,
}

/// One entry of an export's block index.
#[derive(Debug, Clone, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct ExportIndexEntry {
    /// Block id (equal to the manifest's id at the same position).
    pub block_id: [u8; 32],
    /// Offset of the block record (aligned).
    pub offset: U64,
    /// Length of the block record.
    pub len: U64,
}

const _: () = assert!(std::mem::size_of::<BlockHeader>() == HEADER_SIZE);
const _: () = assert!(std::mem::size_of::<ManifestHeader>() == HEADER_SIZE);
const _: () = assert!(std::mem::size_of::<ExportHeader>() == HEADER_SIZE);
const _: () = assert!(std::mem::size_of::<StateHeader>() == HEADER_SIZE);
const _: () = assert!(std::mem::size_of::<SectionEntry>() == 32);
const _: () = assert!(std::mem::size_of::<ExportIndexEntry>() == 48);

/// Rounds `n` up to a multiple of [`ALIGN`] (saturating).
pub fn align_up(n: u64) -> u64 {
    n.saturating_add(ALIGN - 1) / ALIGN * ALIGN
}

/// CRC32 of several slices in sequence.
pub fn crc_parts(parts: &[&[u8]]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    for p in parts {
        h.update(p);
    }
    h.finalize()
}
