//! What a checkpoint carries besides its tokens and KV ([`CheckpointMeta`]), as typed fields
//! and as the manifest's key/value pairs, and how stored checkpoints are listed.

use std::collections::BTreeMap;

use ckptfmt::Manifest;

/// What a checkpoint carries besides its tokens and KV.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CheckpointMeta {
    /// The sampler's RNG state, to continue the same random stream.
    pub sampler_state: Option<Vec<u8>>,
    /// Token counts at the end of each turn, oldest first (what `undo` goes back to).
    pub turns: Vec<usize>,
    /// Application data (the chat keeps its messages here), by key.
    pub app: BTreeMap<String, String>,
    /// The checkpoint this one was branched from, if any.
    pub parent: Option<String>,
    /// When it was saved (Unix seconds).
    pub saved_unix: u64,
    /// Which program wrote it ([`OWNER_CHAT`], [`OWNER_SLOT`], or another tool's own name);
    /// `None` for checkpoints written before owners were recorded. A program replaces a
    /// checkpoint that another owner wrote only when its user asks.
    pub owner: Option<String>,
}

/// [`CheckpointMeta::owner`] of the chat's conversations.
pub const OWNER_CHAT: &str = "chat";
/// [`CheckpointMeta::owner`] of the server's `/slots` saves.
pub const OWNER_SLOT: &str = "slot";

/// One stored checkpoint, as [`SessionStore::checkpoints`](super::SessionStore::checkpoints) lists them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckpointInfo {
    /// Its name.
    pub name: String,
    /// Tokens it holds.
    pub tokens: usize,
    /// Bytes no other checkpoint shares: what deleting it frees.
    pub own_bytes: u64,
    /// When it was last saved (Unix seconds).
    pub last_used_unix: u64,
}

const TURNS_KEY: &str = "turns";
const OWNER_KEY: &str = "owner";
const APP_PREFIX: &str = "app.";

impl CheckpointMeta {
    pub(super) fn to_pairs(&self) -> Vec<(String, String)> {
        let turns = self.turns.iter().map(usize::to_string).collect::<Vec<_>>();
        let mut kv = vec![(TURNS_KEY.to_owned(), turns.join(","))];
        if let Some(owner) = &self.owner {
            kv.push((OWNER_KEY.to_owned(), owner.clone()));
        }
        kv.extend(
            self.app
                .iter()
                .map(|(k, v)| (format!("{APP_PREFIX}{k}"), v.clone())),
        );
        kv
    }

    pub(super) fn from_manifest(m: &Manifest) -> CheckpointMeta {
        let mut meta = CheckpointMeta {
            sampler_state: m.sampler_state.clone(),
            parent: m.meta.parent.clone(),
            saved_unix: m.meta.created_unix,
            ..CheckpointMeta::default()
        };
        for (k, v) in &m.meta.kv {
            if k == TURNS_KEY {
                meta.turns = v.split(',').filter_map(|t| t.parse().ok()).collect();
            } else if k == OWNER_KEY {
                meta.owner = Some(v.clone());
            } else if let Some(key) = k.strip_prefix(APP_PREFIX) {
                meta.app.insert(key.to_owned(), v.clone());
            } else {
                // Checkpoints written before typed metadata kept application data unprefixed.
                meta.app.insert(k.clone(), v.clone());
            }
        }
        meta
    }
}
