//! Checkpoint manifests: what resumes a sequence exactly.
//!
//! A manifest is a [`ManifestHeader`], a table of [`SectionEntry`]s and the
//! sections themselves, each with its own CRC32. See FORMAT.md, "Manifest".

use zerocopy::byteorder::little_endian::{I32, U16, U32, U64};
use zerocopy::{FromBytes, IntoBytes};

mod meta;

use meta::{decode_meta, encode_meta};

use crate::block::{check_magic, check_version, truncated};
use crate::error::{FormatError, Result};
use crate::geometry::Geometry;
use crate::ids::{BlockId, ChainRoot, Fingerprint};
use crate::layout::{
    align_up, crc_parts, section, ManifestHeader, SectionEntry, ALIGN, HEADER_CRC_OFFSET,
    HEADER_SIZE, MANIFEST_FLAG_HAS_SAMPLER, MANIFEST_MAGIC, MANIFEST_VERSION,
    MANIFEST_VERSION_PLAIN, SECTION_FLAG_REQUIRED,
};

/// Most sections a manifest may have.
pub const MAX_SECTIONS: u32 = 64;
/// Longest string (name, parent, key, value) accepted in metadata.
pub const MAX_STRING: u32 = 1 << 20;
/// Most key/value pairs in metadata.
pub const MAX_PAIRS: u32 = 1 << 16;
/// Largest manifest accepted (4 GiB).
pub const MAX_MANIFEST_BYTES: u64 = 1 << 32;

/// Descriptive metadata of a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Metadata {
    /// Checkpoint name (for a store, also its file name).
    pub name: String,
    /// Name of the checkpoint this one extends, if any.
    pub parent: Option<String>,
    /// Creation time, seconds since the Unix epoch.
    pub created_unix: u64,
    /// Free key/value pairs for the application, in order.
    pub kv: Vec<(String, String)>,
}

/// A checkpoint: everything needed to resume a sequence exactly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    /// Model the KV belongs to.
    pub fingerprint: Fingerprint,
    /// KV geometry.
    pub geometry: Geometry,
    /// Token ids of the whole sequence.
    pub tokens: Vec<u32>,
    /// Position of each token (same length as `tokens`).
    pub positions: Vec<i32>,
    /// Ids of the full blocks, in order: `tokens.len() / tokens_per_block` of
    /// them, chained with [`BlockId::chain`] from the first token (and from
    /// `chain_roots` where there are some).
    pub block_ids: Vec<BlockId>,
    /// Where the chain of ids starts again from an opaque root (see
    /// [`ChainRoot`]), by increasing block index, each at most the number of
    /// full blocks (a root of the block after the last applies when it
    /// fills). Empty for a sequence whose KV follows from its tokens alone.
    pub chain_roots: Vec<ChainRoot>,
    /// KV bytes of the partial tail (`tokens.len() % tokens_per_block`
    /// tokens), laid out like a block (see [`Geometry::layer_spans`]).
    pub tail_kv: Vec<u8>,
    /// The recurrent state after the last token, every stateful layer's bytes
    /// in layer order: exactly [`Geometry::state_bytes`] long (empty for a
    /// geometry without state, and for a manifest without tokens, whose state
    /// is the initial one, all zeros).
    pub tail_state: Vec<u8>,
    /// Optional opaque sampler / RNG state.
    pub sampler_state: Option<Vec<u8>>,
    /// Descriptive metadata.
    pub meta: Metadata,
}

impl Manifest {
    /// Builds a manifest, computing the block ids from the tokens. A geometry
    /// with recurrent state also needs [`Manifest::with_tail_state`].
    pub fn new(
        fingerprint: Fingerprint,
        geometry: Geometry,
        tokens: Vec<u32>,
        positions: Vec<i32>,
        tail_kv: Vec<u8>,
        meta: Metadata,
    ) -> Result<Self> {
        let block_ids = BlockId::chain_all(&fingerprint, &tokens, geometry.tokens_per_block());
        let m = Manifest {
            fingerprint,
            geometry,
            tokens,
            positions,
            block_ids,
            chain_roots: Vec::new(),
            tail_kv,
            tail_state: Vec::new(),
            sampler_state: None,
            meta,
        };
        // A geometry with state is completed by `with_tail_state`.
        m.validate_body()?;
        if m.tail_state_bytes() == 0 {
            m.validate()?;
        }
        Ok(m)
    }

    /// Sets the recurrent state after the last token (a geometry with state
    /// needs it: [`Manifest::validate`] refuses a manifest without it).
    pub fn with_tail_state(mut self, state: Vec<u8>) -> Result<Self> {
        self.tail_state = state;
        self.validate()?;
        Ok(self)
    }

    /// Sets the chain roots and recomputes the block ids from them (see
    /// [`Manifest::chain_roots`]); refuses roots out of order or past the
    /// block after the last full one.
    pub fn with_chain_roots(mut self, roots: Vec<ChainRoot>) -> Result<Self> {
        self.block_ids = BlockId::chain_all_rooted(
            &self.fingerprint,
            &self.tokens,
            self.geometry.tokens_per_block(),
            &roots,
        );
        self.chain_roots = roots;
        // The tail state, if the geometry has one, may come after ([`Manifest::with_tail_state`]).
        self.validate_body()?;
        Ok(self)
    }

    /// The id block `i` chains from: its root if it has one, else the block
    /// before it (`None` for a plain first block).
    pub fn prev_id(&self, i: usize) -> Option<&BlockId> {
        ChainRoot::find(&self.chain_roots, i)
            .or_else(|| i.checked_sub(1).and_then(|p| self.block_ids.get(p)))
    }

    /// Number of tokens in the tail.
    pub fn tail_tokens(&self) -> usize {
        self.tokens.len() % self.geometry.tokens_per_block() as usize
    }

    /// The tokens of full block `i`, or `None` past the last block.
    pub fn block_tokens(&self, i: usize) -> Option<&[u32]> {
        let tpb = self.geometry.tokens_per_block() as usize;
        if i >= self.block_ids.len() {
            return None;
        }
        self.tokens.get(i * tpb..(i + 1) * tpb)
    }

    /// Checks the internal consistency rules of FORMAT.md.
    pub fn validate(&self) -> Result<()> {
        self.validate_body()?;
        if self.tail_state.len() as u64 != self.tail_state_bytes() {
            return Err(FormatError::invalid(
                "manifest tail state",
                format!(
                    "{} bytes, expected {}",
                    self.tail_state.len(),
                    self.tail_state_bytes()
                ),
            ));
        }
        Ok(())
    }

    /// Bytes the tail state must have: the geometry's state bytes, or none
    /// before the first token (the initial state is zero by definition).
    pub fn tail_state_bytes(&self) -> u64 {
        if self.tokens.is_empty() {
            0
        } else {
            self.geometry.state_bytes()
        }
    }

    /// Every rule of [`Manifest::validate`] but the tail state's length.
    fn validate_body(&self) -> Result<()> {
        let tpb = self.geometry.tokens_per_block() as usize;
        if self.positions.len() != self.tokens.len() {
            return Err(FormatError::invalid(
                "manifest positions",
                format!(
                    "{} positions for {} tokens",
                    self.positions.len(),
                    self.tokens.len()
                ),
            ));
        }
        ChainRoot::check(&self.chain_roots, (self.tokens.len() / tpb) as u64)?;
        let expect = BlockId::chain_all_rooted(
            &self.fingerprint,
            &self.tokens,
            tpb as u32,
            &self.chain_roots,
        );
        if self.block_ids.len() != expect.len() {
            return Err(FormatError::invalid(
                "manifest block ids",
                format!(
                    "{} ids for {} full blocks",
                    self.block_ids.len(),
                    expect.len()
                ),
            ));
        }
        if let Some((a, b)) = self.block_ids.iter().zip(&expect).find(|(a, b)| a != b) {
            return Err(FormatError::BlockIdMismatch {
                expected: b.to_hex(),
                found: a.to_hex(),
            });
        }
        let tail_bytes = self.geometry.span_bytes(self.tail_tokens() as u64);
        if self.tail_kv.len() as u64 != tail_bytes {
            return Err(FormatError::invalid(
                "manifest tail KV",
                format!(
                    "{} bytes for {} tail tokens, expected {tail_bytes}",
                    self.tail_kv.len(),
                    self.tail_tokens()
                ),
            ));
        }
        for (what, s) in [("name", &self.meta.name)]
            .into_iter()
            .chain(self.meta.parent.iter().map(|p| ("parent", p)))
            .chain(
                self.meta
                    .kv
                    .iter()
                    .flat_map(|(k, v)| [("key", k), ("value", v)]),
            )
        {
            if s.len() as u64 > u64::from(MAX_STRING) {
                return Err(FormatError::AbsurdLength {
                    what,
                    len: s.len() as u64,
                    limit: u64::from(MAX_STRING),
                });
            }
        }
        if self.meta.kv.len() as u64 > u64::from(MAX_PAIRS) {
            return Err(FormatError::AbsurdLength {
                what: "metadata pairs",
                len: self.meta.kv.len() as u64,
                limit: u64::from(MAX_PAIRS),
            });
        }
        Ok(())
    }

    /// Refuses a manifest of another model or geometry.
    pub fn check_owner(&self, fp: &Fingerprint, geometry: &Geometry) -> Result<()> {
        if self.fingerprint != *fp {
            return Err(FormatError::FingerprintMismatch {
                what: "manifest",
                expected: fp.to_hex(),
                found: self.fingerprint.to_hex(),
            });
        }
        if let Some(detail) = self.geometry.diff(geometry) {
            return Err(FormatError::GeometryMismatch {
                what: "manifest",
                detail,
            });
        }
        Ok(())
    }

    /// Serialises the manifest (after [`Manifest::validate`]).
    pub fn encode(&self) -> Result<Vec<u8>> {
        self.validate()?;
        let mut sections: Vec<(u32, Vec<u8>)> = vec![
            (section::GEOMETRY, self.geometry.encode()),
            (
                section::TOKENS,
                self.tokens.iter().flat_map(|t| t.to_le_bytes()).collect(),
            ),
            (
                section::POSITIONS,
                self.positions
                    .iter()
                    .flat_map(|p| p.to_le_bytes())
                    .collect(),
            ),
            (
                section::BLOCK_IDS,
                self.block_ids.iter().flat_map(|b| b.0).collect(),
            ),
            (section::META, encode_meta(&self.meta)),
        ];
        if !self.chain_roots.is_empty() {
            let roots = ChainRoot::encode_all(&self.chain_roots);
            sections.insert(4, (section::CHAIN_ROOTS, roots));
        }
        if let Some(s) = &self.sampler_state {
            sections.push((section::SAMPLER, s.clone()));
        }
        let has_state = self.geometry.has_state();
        let n_sections = sections.len() + 1 + usize::from(has_state);
        let table_end = HEADER_SIZE + 32 * n_sections;
        let mut out = vec![0u8; table_end];
        let mut entries = Vec::with_capacity(n_sections);
        for (kind, data) in &sections {
            let off = out.len().next_multiple_of(8);
            out.resize(off, 0);
            out.extend_from_slice(data);
            entries.push(entry(*kind, off as u64, data));
        }
        let tail_off = align_up(out.len() as u64) as usize;
        out.resize(tail_off, 0);
        out.extend_from_slice(&self.tail_kv);
        entries.push(entry(section::TAIL_KV, tail_off as u64, &self.tail_kv));
        if has_state {
            let state_off = align_up(out.len() as u64) as usize;
            out.resize(state_off, 0);
            out.extend_from_slice(&self.tail_state);
            entries.push(entry(
                section::TAIL_STATE,
                state_off as u64,
                &self.tail_state,
            ));
        }
        let file_len = align_up(out.len() as u64);
        out.resize(file_len as usize, 0);
        for (i, e) in entries.iter().enumerate() {
            let at = HEADER_SIZE + 32 * i;
            out[at..at + 32].copy_from_slice(e.as_bytes());
        }
        let tpb = u64::from(self.geometry.tokens_per_block());
        let mut h = ManifestHeader {
            magic: MANIFEST_MAGIC,
            version: U16::new(if has_state {
                MANIFEST_VERSION
            } else {
                MANIFEST_VERSION_PLAIN
            }),
            reserved0: U16::new(0),
            n_sections: U32::new(n_sections as u32),
            file_len: U64::new(file_len),
            n_tokens: U64::new(self.tokens.len() as u64),
            n_blocks: U64::new(self.tokens.len() as u64 / tpb),
            tail_tokens: U32::new(self.tail_tokens() as u32),
            flags: U32::new(if self.sampler_state.is_some() {
                MANIFEST_FLAG_HAS_SAMPLER
            } else {
                0
            }),
            fingerprint: self.fingerprint.0,
            geometry_digest: self.geometry.digest(),
            created_unix: U64::new(self.meta.created_unix),
            reserved: [0; 132],
            header_crc: U32::new(0),
        };
        out[..HEADER_SIZE].copy_from_slice(h.as_bytes());
        h.header_crc = U32::new(crc_parts(&[
            &out[..HEADER_CRC_OFFSET],
            &out[HEADER_SIZE..table_end],
        ]));
        out[..HEADER_SIZE].copy_from_slice(h.as_bytes());
        Ok(out)
    }

    /// Parses and verifies a manifest (every checksum and bound).
    pub fn decode(bytes: &[u8]) -> Result<Self> {
        ManifestView::parse(bytes).map(|v| v.to_manifest())
    }
}

fn entry(kind: u32, offset: u64, data: &[u8]) -> SectionEntry {
    SectionEntry {
        kind: U32::new(kind),
        flags: U32::new(SECTION_FLAG_REQUIRED),
        offset: U64::new(offset),
        len: U64::new(data.len() as u64),
        crc: U32::new(crc32fast::hash(data)),
        reserved: U32::new(0),
    }
}

/// A verified, borrowed view of a manifest; the tail KV is not copied.
#[derive(Debug, Clone)]
pub struct ManifestView<'a> {
    header: &'a ManifestHeader,
    geometry: Geometry,
    tokens: &'a [U32],
    positions: &'a [I32],
    block_ids: &'a [[u8; 32]],
    chain_roots: Vec<ChainRoot>,
    tail_kv: &'a [u8],
    tail_state: &'a [u8],
    sampler: Option<&'a [u8]>,
    meta: Metadata,
}

impl<'a> ManifestView<'a> {
    /// Parses and fully verifies a manifest occupying all of `bytes`.
    pub fn parse(bytes: &'a [u8]) -> Result<Self> {
        Self::parse_at(bytes, 0)
    }

    /// As [`ManifestView::parse`]; `base` is the offset of `bytes` in the enclosing file.
    pub(crate) fn parse_at(bytes: &'a [u8], base: u64) -> Result<Self> {
        let (header, table, table_end) = Self::parse_header(bytes, base)?;
        let found = Self::locate_sections(bytes, base, table, table_end, header.file_len.get())?;
        let need = |kind: u32, name: &'static str| {
            found[kind as usize]
                .ok_or_else(|| FormatError::invalid("manifest", format!("missing {name} section")))
        };
        let geometry = Geometry::decode(need(section::GEOMETRY, "geometry")?)?;
        if geometry.digest() != header.geometry_digest {
            return Err(FormatError::invalid(
                "manifest",
                "geometry digest does not match geometry section",
            ));
        }
        let n_tokens = header.n_tokens.get();
        let tpb = u64::from(geometry.tokens_per_block());
        let tok_bytes = need(section::TOKENS, "tokens")?;
        if n_tokens.checked_mul(4) != Some(tok_bytes.len() as u64) {
            return Err(FormatError::invalid(
                "manifest tokens",
                format!("{} bytes for {n_tokens} tokens", tok_bytes.len()),
            ));
        }
        let tokens = <[U32]>::ref_from_bytes(tok_bytes)
            .map_err(|_| FormatError::invalid("manifest tokens", "length not a multiple of 4"))?;
        let positions =
            <[I32]>::ref_from_bytes(need(section::POSITIONS, "positions")?).map_err(|_| {
                FormatError::invalid("manifest positions", "length not a multiple of 4")
            })?;
        if positions.len() != tokens.len() {
            return Err(FormatError::invalid(
                "manifest positions",
                format!("{} positions for {} tokens", positions.len(), tokens.len()),
            ));
        }
        let block_ids = <[[u8; 32]]>::ref_from_bytes(need(section::BLOCK_IDS, "block ids")?)
            .map_err(|_| {
                FormatError::invalid("manifest block ids", "length not a multiple of 32")
            })?;
        if header.n_blocks.get() != n_tokens / tpb
            || block_ids.len() as u64 != n_tokens / tpb
            || u64::from(header.tail_tokens.get()) != n_tokens % tpb
        {
            return Err(FormatError::invalid(
                "manifest counts",
                format!(
                    "{n_tokens} tokens, {} blocks ({} ids), {} tail tokens, {tpb} tokens per block",
                    header.n_blocks.get(),
                    block_ids.len(),
                    header.tail_tokens.get()
                ),
            ));
        }
        let chain_roots = match found[section::CHAIN_ROOTS as usize] {
            Some(bytes) => ChainRoot::decode_all(bytes, n_tokens / tpb)?,
            None => Vec::new(),
        };
        let tail_kv = need(section::TAIL_KV, "tail KV")?;
        if tail_kv.len() as u64 != geometry.span_bytes(n_tokens % tpb) {
            return Err(FormatError::invalid(
                "manifest tail KV",
                format!("{} bytes for {} tail tokens", tail_kv.len(), n_tokens % tpb),
            ));
        }
        // A geometry with state comes only in version 2, and always with its
        // tail state; no other manifest has one.
        let tail_state = found[section::TAIL_STATE as usize];
        let want_state = if n_tokens == 0 {
            0
        } else {
            geometry.state_bytes()
        };
        match (geometry.has_state(), tail_state) {
            (true, Some(s)) if s.len() as u64 == want_state => {}
            (true, Some(s)) => {
                return Err(FormatError::invalid(
                    "manifest tail state",
                    format!("{} bytes, expected {want_state}", s.len()),
                ))
            }
            (true, None) => {
                return Err(FormatError::invalid(
                    "manifest",
                    "missing tail state section",
                ))
            }
            (false, Some(_)) => {
                return Err(FormatError::invalid(
                    "manifest",
                    "tail state section without state in the geometry",
                ))
            }
            (false, None) => {}
        }
        if geometry.has_state() && header.version.get() < MANIFEST_VERSION {
            return Err(FormatError::invalid(
                "manifest",
                "recurrent state in a version 1 manifest",
            ));
        }
        let tail_state = tail_state.unwrap_or(&[]);
        let has_sampler = header.flags.get() & MANIFEST_FLAG_HAS_SAMPLER != 0;
        let sampler = found[section::SAMPLER as usize];
        if sampler.is_some() != has_sampler {
            return Err(FormatError::invalid(
                "manifest",
                "sampler flag and section disagree",
            ));
        }
        let meta_bytes = need(section::META, "metadata")?;
        let meta_off = table
            .iter()
            .find(|e| e.kind.get() == section::META)
            .map_or(0, |e| e.offset.get());
        let meta = decode_meta(meta_bytes, base + meta_off, header.created_unix.get())?;
        let view = ManifestView {
            header,
            geometry,
            tokens,
            positions,
            block_ids,
            chain_roots,
            tail_kv,
            tail_state,
            sampler,
            meta,
        };
        view.check_chain()?;
        Ok(view)
    }

    /// The header and section table of a manifest at the start of `bytes` (at `base` in the
    /// enclosing file), checked: magic, section count, CRC, version, length (all of `bytes`)
    /// and reserved bits. Returns them with the offset where the table ends.
    fn parse_header(
        bytes: &'a [u8],
        base: u64,
    ) -> Result<(&'a ManifestHeader, &'a [SectionEntry], usize)> {
        let avail = bytes.len() as u64;
        let (header, rest) = ManifestHeader::ref_from_prefix(bytes)
            .map_err(|_| truncated("manifest header", base, HEADER_SIZE as u64, avail))?;
        check_magic("manifest header", &header.magic, &MANIFEST_MAGIC, base)?;
        let n_sections = header.n_sections.get();
        if n_sections > MAX_SECTIONS {
            return Err(FormatError::OutOfBounds {
                what: "manifest section count",
                value: u64::from(n_sections),
                limit: u64::from(MAX_SECTIONS),
            });
        }
        let (table, _) = <[SectionEntry]>::ref_from_prefix_with_elems(rest, n_sections as usize)
            .map_err(|_| {
                truncated(
                    "manifest section table",
                    base + HEADER_SIZE as u64,
                    32 * u64::from(n_sections),
                    avail.saturating_sub(HEADER_SIZE as u64),
                )
            })?;
        let table_end = HEADER_SIZE + 32 * n_sections as usize;
        let crc = crc_parts(&[&bytes[..HEADER_CRC_OFFSET], &bytes[HEADER_SIZE..table_end]]);
        if crc != header.header_crc.get() {
            return Err(FormatError::ChecksumMismatch {
                what: "manifest header",
                offset: base,
                expected: header.header_crc.get(),
                found: crc,
            });
        }
        check_version("manifest", header.version.get(), MANIFEST_VERSION)?;
        let file_len = header.file_len.get();
        if file_len > MAX_MANIFEST_BYTES {
            return Err(FormatError::AbsurdLength {
                what: "manifest file_len",
                len: file_len,
                limit: MAX_MANIFEST_BYTES,
            });
        }
        if avail < file_len {
            return Err(truncated("manifest", base, file_len, avail));
        }
        if avail > file_len {
            return Err(FormatError::invalid(
                "manifest",
                format!(
                    "{} trailing bytes after offset {}",
                    avail - file_len,
                    base + file_len
                ),
            ));
        }
        if header.reserved0.get() != 0
            || header.reserved.iter().any(|&b| b != 0)
            || header.flags.get() & !MANIFEST_FLAG_HAS_SAMPLER != 0
        {
            return Err(FormatError::invalid("manifest header", "reserved bits set"));
        }
        Ok((header, table, table_end))
    }

    /// The sections `table` places in `bytes` (a manifest of `file_len` bytes at `base`), by
    /// kind: each within the file, after the table, aligned, its CRC checked, no kind twice, no
    /// unknown required kind; no overlap, and zero padding between and after them.
    fn locate_sections(
        bytes: &'a [u8],
        base: u64,
        table: &[SectionEntry],
        table_end: usize,
        file_len: u64,
    ) -> Result<[Option<&'a [u8]>; 10]> {
        let mut found: [Option<&'a [u8]>; 10] = [None; 10];
        let mut ranges: Vec<(u64, u64)> = Vec::with_capacity(table.len());
        for (i, e) in table.iter().enumerate() {
            let (kind, off, len) = (e.kind.get(), e.offset.get(), e.len.get());
            let end = off.checked_add(len).filter(|&end| end <= file_len).ok_or(
                FormatError::OutOfBounds {
                    what: "manifest section end",
                    value: off.saturating_add(len),
                    limit: file_len,
                },
            )?;
            if off < table_end as u64 {
                return Err(FormatError::OutOfBounds {
                    what: "manifest section offset (overlaps table)",
                    value: off,
                    limit: table_end as u64,
                });
            }
            let align = if kind == section::TAIL_KV || kind == section::TAIL_STATE {
                ALIGN
            } else {
                8
            };
            if off % align != 0
                || e.reserved.get() != 0
                || e.flags.get() & !SECTION_FLAG_REQUIRED != 0
            {
                return Err(FormatError::invalid(
                    "manifest section entry",
                    format!("entry {i}: misaligned offset {off} or reserved bits"),
                ));
            }
            let data = &bytes[off as usize..end as usize];
            let c = crc32fast::hash(data);
            if c != e.crc.get() {
                return Err(FormatError::ChecksumMismatch {
                    what: "manifest section",
                    offset: base + off,
                    expected: e.crc.get(),
                    found: c,
                });
            }
            ranges.push((off, end));
            match kind {
                1..=9 => {
                    let slot = &mut found[kind as usize];
                    if slot.is_some() {
                        return Err(FormatError::invalid(
                            "manifest section table",
                            format!("section kind {kind} appears twice"),
                        ));
                    }
                    *slot = Some(data);
                }
                _ if e.flags.get() & SECTION_FLAG_REQUIRED != 0 => {
                    return Err(FormatError::invalid(
                        "manifest section table",
                        format!(
                            "unknown required section kind {kind} (written by a newer version)"
                        ),
                    ));
                }
                _ => {}
            }
        }
        ranges.sort_unstable();
        let mut cursor = table_end as u64;
        for &(off, end) in &ranges {
            if off < cursor {
                return Err(FormatError::invalid(
                    "manifest sections",
                    format!("overlap at offset {off}"),
                ));
            }
            if bytes[cursor as usize..off as usize].iter().any(|&b| b != 0) {
                return Err(FormatError::invalid(
                    "manifest padding",
                    format!("non-zero bytes before offset {off}"),
                ));
            }
            cursor = end;
        }
        if bytes[cursor as usize..].iter().any(|&b| b != 0) {
            return Err(FormatError::invalid(
                "manifest padding",
                "non-zero bytes at end",
            ));
        }
        Ok(found)
    }

    /// The chain of ids must follow from the tokens (and the roots).
    fn check_chain(&self) -> Result<()> {
        let fp = self.fingerprint();
        let mut prev: Option<BlockId> = None;
        let tpb = self.geometry.tokens_per_block() as usize;
        let toks = self.tokens();
        for (i, raw) in self.block_ids.iter().enumerate() {
            let prev_id = ChainRoot::find(&self.chain_roots, i).or(prev.as_ref());
            let id = BlockId::chain(&fp, prev_id, &toks[i * tpb..(i + 1) * tpb]);
            if id.0 != *raw {
                return Err(FormatError::BlockIdMismatch {
                    expected: id.to_hex(),
                    found: BlockId(*raw).to_hex(),
                });
            }
            prev = Some(id);
        }
        Ok(())
    }

    /// Model fingerprint.
    pub fn fingerprint(&self) -> Fingerprint {
        Fingerprint(self.header.fingerprint)
    }

    /// KV geometry.
    pub fn geometry(&self) -> &Geometry {
        &self.geometry
    }

    /// Token ids.
    pub fn tokens(&self) -> Vec<u32> {
        self.tokens.iter().map(|t| t.get()).collect()
    }

    /// Number of tokens.
    pub fn n_tokens(&self) -> usize {
        self.tokens.len()
    }

    /// Positions.
    pub fn positions(&self) -> Vec<i32> {
        self.positions.iter().map(|p| p.get()).collect()
    }

    /// Block ids, in order.
    pub fn block_ids(&self) -> Vec<BlockId> {
        self.block_ids.iter().map(|b| BlockId(*b)).collect()
    }

    /// Chain roots (empty for a plain chain).
    pub fn chain_roots(&self) -> &[ChainRoot] {
        &self.chain_roots
    }

    /// The tail's KV bytes, borrowed.
    pub fn tail_kv(&self) -> &'a [u8] {
        self.tail_kv
    }

    /// The recurrent state after the last token (empty without state).
    pub fn tail_state(&self) -> &'a [u8] {
        self.tail_state
    }

    /// Sampler state, borrowed.
    pub fn sampler_state(&self) -> Option<&'a [u8]> {
        self.sampler
    }

    /// Metadata.
    pub fn meta(&self) -> &Metadata {
        &self.meta
    }

    /// Copies everything into an owned [`Manifest`].
    pub fn to_manifest(&self) -> Manifest {
        Manifest {
            fingerprint: self.fingerprint(),
            geometry: self.geometry.clone(),
            tokens: self.tokens(),
            positions: self.positions(),
            block_ids: self.block_ids(),
            chain_roots: self.chain_roots.clone(),
            tail_kv: self.tail_kv.to_vec(),
            tail_state: self.tail_state.to_vec(),
            sampler_state: self.sampler.map(<[u8]>::to_vec),
            meta: self.meta.clone(),
        }
    }
}
