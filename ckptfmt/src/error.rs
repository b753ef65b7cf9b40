//! The one error type of `ckptfmt`: every failure names what went wrong and where.

use std::path::PathBuf;

/// Result alias used throughout the crate.
pub type Result<T, E = FormatError> = std::result::Result<T, E>;

/// Every way reading, writing or verifying checkpoint data can fail.
///
/// Parsers never panic on input bytes: a short file, a flipped bit, a wrong
/// magic or version, an out-of-range index or an absurd length all end up
/// here as a variant that names the structure (`what`) and the byte offset.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FormatError {
    /// An operating-system I/O call failed.
    #[error("I/O error during {op} on {path:?}: {source}")]
    Io {
        /// The operation that failed (`"write"`, `"fsync"`, `"rename"`, ...).
        op: &'static str,
        /// The file or directory involved.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The input ends before a structure does.
    #[error("truncated {what}: need {needed} bytes at offset {offset}, have {available}")]
    Truncated {
        /// The structure being read.
        what: &'static str,
        /// Offset at which the structure starts.
        offset: u64,
        /// Bytes the structure needs.
        needed: u64,
        /// Bytes that were available from `offset`.
        available: u64,
    },
    /// The magic bytes do not identify the expected structure.
    #[error("bad magic for {what} at offset {offset}: found {found:02x?}")]
    BadMagic {
        /// The structure expected.
        what: &'static str,
        /// Offset of the magic.
        offset: u64,
        /// The bytes found instead.
        found: [u8; 8],
    },
    /// The format version is one this reader does not support.
    #[error("unsupported {what} version {found} (this reader supports {supported})")]
    UnsupportedVersion {
        /// The structure.
        what: &'static str,
        /// The version in the file.
        found: u16,
        /// The highest version this reader understands.
        supported: u16,
    },
    /// A stored CRC32 does not match the bytes it covers.
    #[error("checksum mismatch in {what} at offset {offset}: stored {expected:#010x}, computed {found:#010x}")]
    ChecksumMismatch {
        /// The region checked.
        what: &'static str,
        /// Offset of the region.
        offset: u64,
        /// The stored checksum.
        expected: u32,
        /// The checksum of the bytes present.
        found: u32,
    },
    /// An offset, index or length points outside the valid range.
    #[error("{what} out of bounds: {value} not within limit {limit}")]
    OutOfBounds {
        /// The field.
        what: &'static str,
        /// The value found.
        value: u64,
        /// The limit it exceeded.
        limit: u64,
    },
    /// A length field asks for more memory than any valid file could need.
    #[error("absurd length for {what}: {len} exceeds the limit {limit}")]
    AbsurdLength {
        /// The field.
        what: &'static str,
        /// The length found.
        len: u64,
        /// The maximum accepted.
        limit: u64,
    },
    /// A field has a value that is not allowed (reserved bits, unknown enum value, bad UTF-8, ...).
    #[error("invalid {what}: {detail}")]
    Invalid {
        /// The field.
        what: &'static str,
        /// What is wrong with it.
        detail: String,
    },
    /// The data was written for another model.
    #[error("{what} belongs to model {found}, expected {expected}")]
    FingerprintMismatch {
        /// The structure.
        what: &'static str,
        /// Fingerprint expected by the caller (hex).
        expected: String,
        /// Fingerprint found in the data (hex).
        found: String,
    },
    /// The data was written for another KV geometry.
    #[error("{what} has a different KV geometry: {detail}")]
    GeometryMismatch {
        /// The structure.
        what: &'static str,
        /// Which part differs.
        detail: String,
    },
    /// A block's content does not agree with its id.
    #[error("block id mismatch: asked for {expected}, record holds {found}")]
    BlockIdMismatch {
        /// Id asked for (hex).
        expected: String,
        /// Id stored or recomputed (hex).
        found: String,
    },
    /// The named block or checkpoint does not exist.
    #[error("{what} not found: {name}")]
    NotFound {
        /// What was looked for.
        what: &'static str,
        /// Its name or id.
        name: String,
    },
    /// A manifest file holds the checkpoint of another name (it was copied
    /// over this one).
    #[error("manifest {path:?} holds checkpoint {found:?}, not {expected:?}")]
    NameMismatch {
        /// The manifest file.
        path: PathBuf,
        /// The name its file name gives.
        expected: String,
        /// The name inside.
        found: String,
    },
    /// Another process holds the store's lock in a way this call cannot share.
    #[error("store lock {path:?} is held ({wanted} wanted) by another process; live writers: pids {pids:?}")]
    Busy {
        /// The lock file.
        path: PathBuf,
        /// The mode this call needed (`"shared"` or `"exclusive"`).
        wanted: &'static str,
        /// Pids of the processes with the store open for writing (one of them holds it).
        pids: Vec<u32>,
    },
    /// The store was opened read-only and the call would write.
    #[error("store {path:?} is open read-only; {op} would write")]
    ReadOnly {
        /// The store's directory.
        path: PathBuf,
        /// The refused operation.
        op: &'static str,
    },
}

impl FormatError {
    /// Wraps an `std::io::Error` with the operation and path.
    pub fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        FormatError::Io {
            op,
            path: path.into(),
            source,
        }
    }

    /// The operating-system error inside, when this is [`FormatError::Io`].
    pub fn io_error(&self) -> Option<&std::io::Error> {
        match self {
            FormatError::Io { source, .. } => Some(source),
            _ => None,
        }
    }

    /// True when this is an I/O failure because the file or directory does not exist (one
    /// deleted meanwhile, by another process or an earlier attempt).
    pub fn is_io_not_found(&self) -> bool {
        self.io_error()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::NotFound)
    }

    /// Shorthand for [`FormatError::Invalid`].
    pub fn invalid(what: &'static str, detail: impl Into<String>) -> Self {
        FormatError::Invalid {
            what,
            detail: detail.into(),
        }
    }

    /// True when the error says the data is damaged or foreign, as opposed to
    /// an I/O failure or a missing item.
    pub fn is_corruption(&self) -> bool {
        !matches!(
            self,
            FormatError::Io { .. }
                | FormatError::NotFound { .. }
                | FormatError::Busy { .. }
                | FormatError::ReadOnly { .. }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::FormatError;
    use std::io::{Error, ErrorKind};

    #[test]
    fn io_error_is_the_os_error_of_an_io_failure_only() {
        let gone = FormatError::io("remove", "/x", Error::from(ErrorKind::NotFound));
        assert_eq!(gone.io_error().map(Error::kind), Some(ErrorKind::NotFound));
        assert!(gone.is_io_not_found());
        let denied = FormatError::io("remove", "/x", Error::from(ErrorKind::PermissionDenied));
        assert!(denied.io_error().is_some() && !denied.is_io_not_found());
        let missing = FormatError::NotFound {
            what: "checkpoint",
            name: "a".into(),
        };
        assert!(missing.io_error().is_none() && !missing.is_io_not_found());
    }
}
