//! The engine's one error type.

use std::path::PathBuf;

/// Everything that can go wrong in the engine.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An I/O error on a file.
    #[error("{path}: {source}")]
    Io {
        /// The file involved.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A file does not start with the GGUF magic bytes.
    #[error("{path}: not a GGUF file (magic {found:02x?})")]
    GgufBadMagic {
        /// The file involved.
        path: PathBuf,
        /// The first four bytes found.
        found: [u8; 4],
    },
    /// A GGUF file of a version this reader does not handle (only 2 and 3 are).
    #[error("{path}: unsupported GGUF version {version}")]
    GgufVersion {
        /// The file involved.
        path: PathBuf,
        /// The version in the header.
        version: u32,
    },
    /// A GGUF file ends before a structure that it declares.
    #[error("{path}: GGUF file truncated: {what} at byte {offset} needs {needed} bytes but the file ends first")]
    GgufTruncated {
        /// The file involved.
        path: PathBuf,
        /// Where the structure starts.
        offset: u64,
        /// How many bytes it needs from there.
        needed: u64,
        /// What was being read.
        what: &'static str,
    },
    /// A GGUF file whose contents are inconsistent (bad type code, absurd count, bad UTF-8, ...).
    #[error("{path}: corrupt GGUF file at byte {offset}: {reason}")]
    GgufCorrupt {
        /// The file involved.
        path: PathBuf,
        /// Where the problem was found.
        offset: u64,
        /// What is wrong.
        reason: String,
    },
    /// A tensor uses a ggml type code this engine does not know.
    #[error("unsupported tensor type {type_code} for tensor {tensor}")]
    UnsupportedTensorType {
        /// The type code found.
        type_code: u32,
        /// The tensor's name.
        tensor: String,
    },
    /// A required GGUF metadata key is absent.
    #[error("GGUF metadata key {key} is missing")]
    MissingKey {
        /// The key.
        key: String,
    },
    /// A GGUF metadata key holds a value of the wrong type.
    #[error("GGUF metadata key {key}: expected {expected}, found {found}")]
    KeyType {
        /// The key.
        key: String,
        /// The type that was asked for.
        expected: &'static str,
        /// A description of the value found.
        found: String,
    },
    /// The vocabulary in a GGUF file cannot be used, or text cannot be tokenized with it.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// A chat template failed to parse or render.
    #[error("chat template: {0:#}")]
    ChatTemplate(#[source] minijinja::Error),
    /// A saved sampler RNG state has the wrong size or contents.
    #[error("invalid sampler RNG state ({len} bytes)")]
    RngState {
        /// The length of the state given.
        len: usize,
    },
}

/// Result with the engine's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
