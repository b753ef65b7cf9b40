//! Prompt-cache namespaces: sequences in different namespaces share no block, in the pool, in
//! a store or anywhere a block id is the key. A namespace is the root the first block of a
//! sequence chains from (a [`ckptfmt::ChainRoot`] of block 0), so every later block differs
//! too, and a checkpoint records it like any other root.

use ckptfmt::{BlockId, ChainRoot};

/// Domain separation: no other BLAKE3 input of this project starts like this.
const DOMAIN: &[u8] = b"llama-hdd cache namespace\0";

/// A prompt-cache namespace (an API key's, a request's `cache_salt`, or both).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Namespace([u8; 32]);

impl std::fmt::Debug for Namespace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Namespace({})", &BlockId(self.0).to_hex()[..16])
    }
}

impl Namespace {
    /// The namespace named by `parts`, in order (each length-prefixed, so no two lists give
    /// the same bytes): a hash, from which the parts cannot be read back.
    pub fn new(parts: &[&[u8]]) -> Namespace {
        let mut h = blake3::Hasher::new();
        h.update(DOMAIN);
        for p in parts {
            h.update(&(p.len() as u64).to_le_bytes());
            h.update(p);
        }
        Namespace(*h.finalize().as_bytes())
    }

    /// The namespace's 32 bytes (a hash: they name it, and say nothing of its parts).
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// What the first block of a sequence in this namespace chains from.
    pub(crate) fn root(self) -> BlockId {
        BlockId(self.0)
    }

    /// The namespace whose root `id` is.
    pub(crate) fn from_root(id: BlockId) -> Namespace {
        Namespace(id.0)
    }

    /// The chain roots of a sequence in `ns` that was never shifted.
    pub(crate) fn roots(ns: Option<Namespace>) -> Vec<ChainRoot> {
        ns.map(|ns| ChainRoot {
            block: 0,
            id: ns.root(),
        })
        .into_iter()
        .collect()
    }
}
