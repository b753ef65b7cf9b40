//! A store of this model written under an earlier model fingerprint: reported, never used.

/// A store of this model written under fingerprint version 2, which sampled the weights: its
/// checkpoints are never used, since another model differing only inside a tensor had the same
/// fingerprint. Its directory can be deleted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LegacyStore {
    /// Its directory.
    pub dir: std::path::PathBuf,
    /// Its named checkpoints and cached prompt tails.
    pub checkpoints: usize,
}

impl std::fmt::Display for LegacyStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} holds {} checkpoint(s) of this model made by an earlier version, whose model \
             fingerprint sampled the weights rather than hashing all of them; they are not \
             used. Save the conversations again, and delete that directory to reclaim its space",
            self.dir.display(),
            self.checkpoints
        )
    }
}
