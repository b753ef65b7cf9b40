//! The one error type of `kvstore`: every failure names the path, block or
//! checkpoint involved.

use std::path::PathBuf;

use ckptfmt::FormatError;

/// Result alias used throughout the crate.
pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// Every way a store operation can fail.
///
/// A failed call leaves the store consistent: what it reported durable
/// before stays durable, and a failed save or delete leaves either the old
/// or the new checkpoint, never a checkpoint with missing blocks.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// An operating-system I/O call failed (other than for want of space or permission):
    /// always the checkpoint format's [`FormatError::Io`], the operation, the path and the
    /// operating system's error, for kvstore's own files too ([`StoreError::io_error`]).
    #[error(transparent)]
    Io(FormatError),
    /// The disk (or the filesystem's quota for this user) is full: nothing was written in
    /// place of what was there.
    #[error("no space left on the device during {op} on {path:?}")]
    NoSpace {
        /// The operation that failed (`"write"`, `"fsync"`, ...).
        op: &'static str,
        /// The file or directory involved.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The store's directory cannot be written: a read-only filesystem or no permission.
    #[error(
        "cannot write during {op} on {path:?} (read-only filesystem or no permission): {source}"
    )]
    NotWritable {
        /// The operation that failed (`"create"`, `"rename"`, ...).
        op: &'static str,
        /// The file or directory involved.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A `ckptfmt` call failed (a corrupt or foreign file, a bad checkpoint name, ...).
    #[error("checkpoint format error at {path:?}: {source}")]
    Format {
        /// The file or directory involved.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: FormatError,
    },
    /// The checkpoint format's refusals, which kvstore raises for its own locks, claims and
    /// read-only stores too: another process holds a lock (or a claim) in a way this call
    /// cannot share, for longer than the lock timeout ([`FormatError::Busy`], naming the live
    /// writers' pids: [`StoreError::busy_pids`]); or the store was opened read-only and the
    /// call would write ([`FormatError::ReadOnly`]).
    #[error(transparent)]
    Refused(FormatError),
    /// The named checkpoint does not exist.
    #[error("checkpoint {name:?} not found")]
    CheckpointNotFound {
        /// Its name.
        name: String,
    },
    /// The block is stored in neither tier.
    #[error("block {id} not found")]
    BlockNotFound {
        /// Block id (hex).
        id: String,
    },
    /// A checkpoint refers to a block the store does not hold.
    #[error("checkpoint {checkpoint:?} refers to block {id}, which the store does not hold")]
    MissingBlock {
        /// The checkpoint being saved.
        checkpoint: String,
        /// Block id (hex).
        id: String,
    },
    /// Pinned blocks alone would exceed the RAM budget.
    #[error("RAM budget exceeded: {pinned} bytes pinned + {needed} requested > budget {budget}")]
    RamFull {
        /// Bytes the call needed.
        needed: u64,
        /// Bytes already pinned.
        pinned: u64,
        /// The RAM budget.
        budget: u64,
    },
    /// Writing would exceed the disk quota even after garbage collection.
    #[error("disk quota exceeded: {used} bytes used + {needed} needed > quota {quota}")]
    QuotaExceeded {
        /// Bytes the call needed.
        needed: u64,
        /// Bytes in use after garbage collection.
        used: u64,
        /// The disk quota.
        quota: u64,
    },
    /// The block is not pinned.
    #[error("block {id} is not pinned")]
    NotPinned {
        /// Block id (hex).
        id: String,
    },
    /// An argument does not fit the model's geometry or the store's rules.
    #[error("invalid {what}: {detail}")]
    Invalid {
        /// The argument.
        what: &'static str,
        /// What is wrong with it.
        detail: String,
    },
    /// The model was registered with another geometry.
    #[error("model {fingerprint} is stored with another geometry: {detail}")]
    GeometryMismatch {
        /// Fingerprint (hex).
        fingerprint: String,
        /// Which part differs.
        detail: String,
    },
    /// A write-behind spill this call waited for failed (the blocks stayed in RAM).
    #[error("write-behind spill failed: {source}")]
    Spill {
        /// The spill's error.
        #[source]
        source: std::sync::Arc<StoreError>,
    },
    /// The remote tier failed (unreachable, timed out, refused the call): a miss, never data
    /// lost.
    #[error("remote cache {op} failed: {detail}")]
    Remote {
        /// The call (`"get"`, `"exists"`, `"put"`).
        op: &'static str,
        /// What went wrong, with the tier's address (never its password).
        detail: String,
    },
    /// The remote tier's TLS handshake failed: the server's certificate did not verify (signed
    /// by an unknown CA, for another name, expired) or the server refused the session or does
    /// not speak TLS. Like [`StoreError::Remote`], a miss: the tier counts as down.
    #[error("remote cache {op} failed: {detail}")]
    RemoteTls {
        /// The call (`"get"`, `"exists"`, `"put"`).
        op: &'static str,
        /// What went wrong, with the tier's address (never its password).
        detail: String,
    },
    /// The background worker stopped (the store is being dropped).
    #[error("the store's background worker has stopped")]
    ShutDown,
}

impl StoreError {
    /// Wraps an I/O error with the operation and path.
    /// A full disk becomes [`StoreError::NoSpace`], a read-only filesystem or a refused
    /// permission [`StoreError::NotWritable`].
    pub fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        use std::io::ErrorKind;
        let path = path.into();
        match source.kind() {
            ErrorKind::StorageFull | ErrorKind::QuotaExceeded => {
                StoreError::NoSpace { op, path, source }
            }
            ErrorKind::ReadOnlyFilesystem | ErrorKind::PermissionDenied => {
                StoreError::NotWritable { op, path, source }
            }
            _ => StoreError::Io(FormatError::Io { op, path, source }),
        }
    }

    /// Wraps a `ckptfmt` error with the path involved.
    pub fn format(path: impl Into<PathBuf>, source: FormatError) -> Self {
        match source {
            source @ (FormatError::Busy { .. } | FormatError::ReadOnly { .. }) => {
                StoreError::Refused(source)
            }
            // I/O inside the format crate is I/O: typed the same way as the store's own.
            FormatError::Io { op, path, source } => StoreError::io(op, path, source),
            source => StoreError::Format {
                path: path.into(),
                source,
            },
        }
    }

    /// The underlying I/O error, if this error is one (directly or inside `ckptfmt`).
    pub fn io_error(&self) -> Option<&std::io::Error> {
        match self {
            StoreError::NoSpace { source, .. } | StoreError::NotWritable { source, .. } => {
                Some(source)
            }
            StoreError::Io(source) | StoreError::Format { source, .. } => source.io_error(),
            _ => None,
        }
    }

    /// For a refusal because another process holds a lock or a claim: the pids of the live
    /// holders (empty when they could not be read). `None` for every other error.
    pub fn busy_pids(&self) -> Option<&[u32]> {
        match self {
            StoreError::Refused(FormatError::Busy { pids, .. }) => Some(pids),
            _ => None,
        }
    }

    /// True when the disk is full (ENOSPC) or the quota is exhausted.
    pub fn is_no_space(&self) -> bool {
        match self {
            StoreError::QuotaExceeded { .. } | StoreError::NoSpace { .. } => return true,
            StoreError::Spill { source } => return source.is_no_space(),
            _ => {}
        }
        self.io_error()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::StorageFull)
    }
}
