//! Model fingerprints and content-naming block ids.

use std::fmt;

use crate::error::{FormatError, Result};

/// 32 opaque bytes that identify a model (weights, tokenizer, KV layout
/// choices). Supplied by the caller; data for another fingerprint is refused.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Fingerprint(pub [u8; 32]);

/// Identifies a block: BLAKE3 chained over the model fingerprint, the previous
/// block's id (or a [`ChainRoot`]) and this block's token ids (see [`BlockId::chain`]).
///
/// Equal prefixes give equal ids in every process, so an id names the block's
/// content and serves as the deduplication key.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct BlockId(pub [u8; 32]);

fn to_hex(bytes: &[u8; 32]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(64);
    for b in bytes {
        s.push(HEX[usize::from(b >> 4)] as char);
        s.push(HEX[usize::from(b & 15)] as char);
    }
    s
}

fn from_hex(what: &'static str, s: &str) -> Result<[u8; 32]> {
    let b = s.as_bytes();
    if b.len() != 64 {
        return Err(FormatError::invalid(
            what,
            format!("expected 64 hex digits, got {}", b.len()),
        ));
    }
    let digit = |c: u8| -> Result<u8> {
        match c {
            b'0'..=b'9' => Ok(c - b'0'),
            b'a'..=b'f' => Ok(c - b'a' + 10),
            b'A'..=b'F' => Ok(c - b'A' + 10),
            _ => Err(FormatError::invalid(
                what,
                format!("bad hex digit {:?}", c as char),
            )),
        }
    };
    let mut out = [0u8; 32];
    for (i, o) in out.iter_mut().enumerate() {
        *o = (digit(b[2 * i])? << 4) | digit(b[2 * i + 1])?;
    }
    Ok(out)
}

impl Fingerprint {
    /// Convenience: the BLAKE3 hash of arbitrary bytes (a model file, a config...).
    pub fn of(bytes: &[u8]) -> Self {
        Fingerprint(*blake3::hash(bytes).as_bytes())
    }

    /// Lower-case hex.
    pub fn to_hex(&self) -> String {
        to_hex(&self.0)
    }

    /// Parses 64 hex digits.
    pub fn from_hex(s: &str) -> Result<Self> {
        from_hex("fingerprint", s).map(Fingerprint)
    }
}

impl BlockId {
    /// Domain-separation prefix hashed before everything else.
    pub const DOMAIN: &'static [u8] = b"ckptfmt/block-id/v1";

    /// Computes the id of a block holding `tokens`, following the block `prev`
    /// (or starting the sequence when `prev` is `None`), for model `fp`.
    ///
    /// Hashed, in order: [`BlockId::DOMAIN`], the 32 fingerprint bytes, one
    /// byte 0 (no previous block) or 1 followed by the 32 bytes of `prev`, the
    /// token count as u64 LE, each token as u32 LE. See FORMAT.md.
    pub fn chain(fp: &Fingerprint, prev: Option<&BlockId>, tokens: &[u32]) -> BlockId {
        let mut h = blake3::Hasher::new();
        h.update(Self::DOMAIN);
        h.update(&fp.0);
        match prev {
            None => {
                h.update(&[0u8]);
            }
            Some(p) => {
                h.update(&[1u8]);
                h.update(&p.0);
            }
        }
        h.update(&(tokens.len() as u64).to_le_bytes());
        for t in tokens {
            h.update(&t.to_le_bytes());
        }
        BlockId(*h.finalize().as_bytes())
    }

    /// The ids of every full block of `tokens`, `tokens_per_block` at a time.
    /// The partial tail, if any, gets no id.
    pub fn chain_all(fp: &Fingerprint, tokens: &[u32], tokens_per_block: u32) -> Vec<BlockId> {
        let tpb = tokens_per_block.max(1) as usize;
        let mut prev: Option<BlockId> = None;
        tokens
            .chunks_exact(tpb)
            .map(|chunk| {
                let id = BlockId::chain(fp, prev.as_ref(), chunk);
                prev = Some(id);
                id
            })
            .collect()
    }

    /// The ids of every full block of `tokens`, where block `r.block` of each
    /// root `r` in `roots` chains from `r.id` instead of the block before it
    /// (see [`ChainRoot`]). Without roots this is [`BlockId::chain_all`].
    pub fn chain_all_rooted(
        fp: &Fingerprint,
        tokens: &[u32],
        tokens_per_block: u32,
        roots: &[ChainRoot],
    ) -> Vec<BlockId> {
        let tpb = tokens_per_block.max(1) as usize;
        let mut ids: Vec<BlockId> = Vec::with_capacity(tokens.len() / tpb);
        for (i, chunk) in tokens.chunks_exact(tpb).enumerate() {
            let prev = ChainRoot::find(roots, i).or(ids.last());
            ids.push(BlockId::chain(fp, prev, chunk));
        }
        ids
    }

    /// Lower-case hex (used as the block's file name).
    pub fn to_hex(&self) -> String {
        to_hex(&self.0)
    }

    /// Parses 64 hex digits.
    pub fn from_hex(s: &str) -> Result<Self> {
        from_hex("block id", s).map(BlockId)
    }
}

/// A break in a chain of block ids: block `block` chains from `id` instead of
/// from the block before it (or from nothing, for block 0).
///
/// A sequence whose KV no longer follows from its tokens alone (after a
/// context shift, kept blocks carry what the dropped tokens left in them)
/// names its later blocks from a root that hashes its whole history, so they
/// never share ids with a sequence that computed the same tokens plainly. The
/// root is opaque here: only its producer knows what it hashes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ChainRoot {
    /// Index of the block that chains from `id`.
    pub block: u64,
    /// What that block chains from.
    pub id: BlockId,
}

/// Bytes of one chain root in a manifest's CHAIN_ROOTS section.
const ROOT_BYTES: usize = 40;

impl ChainRoot {
    /// The root of block `block` in `roots`, if there is one.
    pub fn find(roots: &[ChainRoot], block: usize) -> Option<&BlockId> {
        roots
            .iter()
            .find(|r| r.block == block as u64)
            .map(|r| &r.id)
    }

    /// Refuses roots out of strictly increasing block order or past block `n_blocks` (a root
    /// of block `n_blocks`, the one after the last full block, applies when it fills).
    pub fn check(roots: &[ChainRoot], n_blocks: u64) -> Result<()> {
        let mut next = 0;
        for r in roots {
            if r.block < next || r.block > n_blocks {
                return Err(FormatError::invalid(
                    "manifest chain roots",
                    format!(
                        "root of block {} out of order or past block {n_blocks}",
                        r.block
                    ),
                ));
            }
            next = r.block + 1;
        }
        Ok(())
    }

    /// The CHAIN_ROOTS section of `roots`: per root, the block index (u64 LE) and the id.
    pub(crate) fn encode_all(roots: &[ChainRoot]) -> Vec<u8> {
        roots
            .iter()
            .flat_map(|r| r.block.to_le_bytes().into_iter().chain(r.id.0))
            .collect()
    }

    /// Parses a CHAIN_ROOTS section of a manifest with `n_blocks` full blocks (its length
    /// checked first, then [`ChainRoot::check`]).
    pub(crate) fn decode_all(bytes: &[u8], n_blocks: u64) -> Result<Vec<ChainRoot>> {
        if !bytes.len().is_multiple_of(ROOT_BYTES)
            || (bytes.len() / ROOT_BYTES) as u64 > n_blocks + 1
        {
            return Err(FormatError::invalid(
                "manifest chain roots",
                format!("{} bytes for at most {} roots", bytes.len(), n_blocks + 1),
            ));
        }
        let roots: Vec<ChainRoot> = bytes
            .chunks_exact(ROOT_BYTES)
            .map(|c| {
                let mut block = [0u8; 8];
                block.copy_from_slice(&c[..8]);
                let mut id = [0u8; 32];
                id.copy_from_slice(&c[8..]);
                ChainRoot {
                    block: u64::from_le_bytes(block),
                    id: BlockId(id),
                }
            })
            .collect();
        ChainRoot::check(&roots, n_blocks)?;
        Ok(roots)
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({})", self.to_hex())
    }
}

impl fmt::Display for BlockId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for BlockId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BlockId({})", &self.to_hex()[..16])
    }
}
