//! The engine's one error type.

use std::path::PathBuf;

/// Everything that can go wrong in the engine.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
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
        reason: GgufProblem,
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
    Tokenizer(#[from] TokenizerError),
    /// A chat template failed to parse or render.
    #[error("chat template: {0:#}")]
    ChatTemplate(#[source] minijinja::Error),
    /// A chat template rendered in the renderer process ([`crate::chat::sandbox`]) failed, ran
    /// past the renderer's memory or time limit, or the renderer could not run.
    #[error("chat template renderer: {0}")]
    TemplateRenderer(String),
    /// A template that is not reviewed was to be rendered in a program that chose neither the
    /// sandbox ([`crate::chat::sandbox::init`]) nor rendering in process
    /// ([`crate::chat::sandbox::render_in_process`]).
    #[error(
        "chat template: this program has not chosen where unreviewed templates render; call \
         engine::chat::sandbox::init() first thing in main (a child process with memory and time \
         limits), or engine::chat::sandbox::render_in_process() to trust every model file"
    )]
    NoSandboxChoice,
    /// A grammar or JSON schema for constrained decoding that does not compile (a GBNF error
    /// says its line, column and rule), or a token that the grammar does not allow.
    #[error("grammar: {0}")]
    Grammar(String),
    /// A saved sampler RNG state has the wrong size or contents.
    #[error("invalid sampler RNG state ({len} bytes)")]
    RngState {
        /// The length of the state given.
        len: usize,
    },
    // --- model, graph and session errors ---
    /// The model file does not exist.
    #[error("model file {path} not found (run `cargo xtask fetch-model` for the default model)")]
    ModelNotFound {
        /// The path that was tried.
        path: PathBuf,
    },
    /// The GGUF's `general.architecture` is not one this engine runs.
    #[error("unsupported model architecture `{arch}` (supported: llama, qwen2, qwen3)")]
    UnsupportedArchitecture {
        /// The architecture named by the file.
        arch: String,
    },
    /// A tensor the architecture needs is absent.
    #[error("model is missing tensor {name}")]
    MissingTensor {
        /// The tensor's name.
        name: String,
    },
    /// A tensor is present but unusable (wrong shape, size or placement).
    #[error("tensor {name}: {reason}")]
    BadTensor {
        /// The tensor's name.
        name: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A hyperparameter (or other model metadata value) that the graph or ggml's kernels cannot
    /// run with; found before any graph is built.
    #[error("GGUF metadata {key} = {value}: {requirement}")]
    InvalidHParam {
        /// The metadata key, e.g. `llama.rope.dimension_count`.
        key: String,
        /// The value found (or derived), as text.
        value: String,
        /// What the engine requires of it.
        requirement: String,
    },
    /// Hyperparameters that contradict each other or the tensors.
    #[error("invalid hyperparameters: {reason}")]
    BadHyperparameters {
        /// What is wrong.
        reason: String,
    },
    /// Feeding these tokens would exceed the session's context window.
    #[error("context full: {needed} tokens needed, the context holds {n_ctx}")]
    ContextFull {
        /// Tokens the session would hold.
        needed: usize,
        /// The context size.
        n_ctx: usize,
    },
    /// A token id outside the vocabulary.
    #[error("token id {id} is outside the vocabulary of {n_vocab}")]
    BadToken {
        /// The id.
        id: u32,
        /// The vocabulary size.
        n_vocab: usize,
    },
    /// A request about KV cache contents outside what the session holds.
    #[error("KV range {start}..{end} of layer {layer} is outside the {len} cached positions")]
    KvRange {
        /// Layer index.
        layer: usize,
        /// First position.
        start: usize,
        /// One past the last position.
        end: usize,
        /// Positions held (or the capacity, for writes).
        len: usize,
    },
    /// KV bytes of the wrong length were supplied.
    #[error("KV bytes for layer {layer}: expected {expected}, got {found}")]
    KvBytes {
        /// Layer index.
        layer: usize,
        /// Bytes expected.
        expected: usize,
        /// Bytes supplied.
        found: usize,
    },
    /// Logits were asked for before any token was evaluated.
    #[error("no logits: no token has been evaluated yet")]
    NoLogits,
    /// Layers were to be offloaded to a GPU that ggml does not find.
    #[error(
        "no GPU {index}: ggml found {found} GPU(s) (this build finds one only with the `cuda` or \
         `metal` feature, and a device and driver present); use --n-gpu-layers 0 to run on the CPU"
    )]
    NoGpu {
        /// The GPU asked for.
        index: usize,
        /// How many GPUs ggml found.
        found: usize,
    },
    /// ggml could not allocate memory.
    #[error("out of memory allocating the {what}")]
    OutOfMemory {
        /// What was being allocated.
        what: &'static str,
    },
    /// ggml reported a failure.
    #[error("ggml: {what}")]
    Ggml {
        /// What failed.
        what: &'static str,
    },
    /// A page spilled beyond the RAM budget could not be read back from its block file
    /// (damaged, truncated, gone or foreign): the batch that would attend to it was not
    /// evaluated.
    #[error("KV page spilled to block {id} cannot be read: {reason}")]
    SpilledBlock {
        /// The block's id (hex).
        id: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The store given to spill pages to holds blocks of another size than the pool's pages
    /// (another model, or other KV types).
    #[error("the spill store's blocks are {store} bytes, the pool's pages {pool}")]
    SpillLayout {
        /// Bytes of one of the store's blocks.
        store: u64,
        /// Bytes of one of the pool's pages.
        pool: u64,
    },
    /// A RAM budget for the KV pool was set, and a page had to leave RAM, but no store was
    /// given to spill to ([`Context::spill_to`](crate::Context::spill_to)).
    #[error("the KV pool is over its RAM budget of {kv_ram} bytes and has no store to spill to")]
    NoSpillStore {
        /// The budget.
        kv_ram: usize,
    },
    /// An operation that rewrites a sequence's cached rows (a context shift) met a page that
    /// was spilled to disk.
    #[error("sequence {seq} has pages spilled to disk; {what} needs them in RAM")]
    SpilledPages {
        /// The sequence.
        seq: crate::SeqId,
        /// The operation.
        what: &'static str,
    },
    /// A checkpoint could not be read or written (corrupt, truncated, foreign, I/O). The
    /// checkpoint format's own error is its [`source`](std::error::Error::source).
    #[error("checkpoint: {source}")]
    Checkpoint {
        /// What kind of failure it is.
        kind: StoreErrorKind,
        /// The checkpoint format's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The conversation store failed (I/O, a damaged or foreign checkpoint, a lock held by
    /// another process). The block store's own error is its
    /// [`source`](std::error::Error::source).
    #[error("store: {source}")]
    Store {
        /// What kind of failure it is.
        kind: StoreErrorKind,
        /// The block store's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A sequence id that the context does not hold (never created, or removed).
    #[error("unknown sequence {seq}")]
    UnknownSequence {
        /// The id.
        seq: crate::SeqId,
    },
    /// A [`Session`](crate::Session)'s own sequence was to be removed from its context
    /// ([`Session::context_mut`](crate::Session::context_mut)): it lives as long as the session.
    #[error("sequence {seq} is its session's own: drop the session to remove it")]
    SessionSequence {
        /// The id.
        seq: crate::SeqId,
    },
    /// An operation that needs an empty sequence got one holding tokens.
    #[error("sequence {seq} is not empty")]
    SequenceNotEmpty {
        /// The id.
        seq: crate::SeqId,
    },
    /// A batch names the same sequence twice.
    #[error("sequence {seq} appears twice in one batch")]
    DuplicateSequence {
        /// The id.
        seq: crate::SeqId,
    },
    /// A batch item's first position does not continue its sequence.
    #[error("sequence {seq}: tokens start at position {found}, but the sequence continues at {expected}")]
    PositionGap {
        /// The id.
        seq: crate::SeqId,
        /// The sequence's length.
        expected: usize,
        /// The position given.
        found: usize,
    },
    /// A batch (or one of its items) holds no token.
    #[error("empty batch")]
    EmptyBatch,
    /// A batch holds more tokens than one graph evaluates.
    #[error("batch of {n_tokens} tokens exceeds the context's n_batch of {n_batch}")]
    BatchTooLarge {
        /// Tokens in the batch.
        n_tokens: usize,
        /// The limit.
        n_batch: usize,
    },
    /// The KV page pool has too few free pages: evict, spill or queue, then try again.
    #[error("KV pool exhausted: {needed} pages needed, {free} free of {total}")]
    OutOfPages {
        /// Pages the operation needs.
        needed: usize,
        /// Pages free.
        free: usize,
        /// Pages in the pool.
        total: usize,
    },
    /// A block reader stopped an import after its bytes were refused (the refusal is the error
    /// the import returns).
    #[error("import aborted")]
    ImportAborted,
    /// A context shift that would keep and discard more tokens than the sequence holds.
    #[error("context shift keeping {n_keep} and discarding {n_discard} of {len} tokens")]
    BadShift {
        /// Tokens to keep at the start.
        n_keep: usize,
        /// Tokens to discard after them.
        n_discard: usize,
        /// Tokens held.
        len: usize,
    },
    /// The rows of sliding-window layers that an operation needs were released
    /// ([`Context::release_windows`](crate::Context::release_windows)): a sequence cannot go
    /// on from a position whose window reaches them, nor can they be read. Its blocks are in
    /// the store, which the caller can import again.
    #[error(
        "the sliding-window KV of sequence {seq} at position {position} was released; \
         import its blocks again"
    )]
    WindowReleased {
        /// The sequence.
        seq: crate::SeqId,
        /// The first position whose rows are missing.
        position: usize,
    },
    /// Not possible with a hybrid model's per-sequence recurrent state, which summarises every
    /// position: cutting back (only clearing), shifting, filling from KV pages alone.
    #[error("{what}: not possible with a recurrent model's per-sequence state")]
    Recurrent {
        /// What was asked.
        what: String,
    },
    /// A draft model's vocabulary differs from its target's.
    #[error("the draft model's vocabulary differs from the target's: {0}")]
    DraftVocab(String),
    /// Chain roots handed to an import are out of order or past the block after the last
    /// full one.
    #[error("chain roots at blocks {roots:?} do not fit a sequence of {n_blocks} full blocks")]
    BadChainRoots {
        /// The blocks the roots name, as given.
        roots: Vec<u64>,
        /// Full blocks of the imported tokens.
        n_blocks: u64,
    },
    /// A document to ingest holds no token.
    #[error("empty document: nothing to ingest")]
    EmptyDocument,
    /// A session handed to an ingestion holds tokens that do not begin the document.
    #[error("sequence {seq} holds {held} tokens that are not a prefix of the document")]
    NotAPrefix {
        /// The session's sequence.
        seq: crate::SeqId,
        /// Tokens it holds.
        held: usize,
    },
    /// An evaluation name that is not one of `invariant`, `llama-cpp`, `fast`.
    #[error("unknown evaluation `{name}` (supported: invariant, llama-cpp, fast)")]
    UnknownEvaluation {
        /// The name given.
        name: String,
    },
    /// A KV cache type name that is not one of `f16`, `q8_0`.
    #[error("unknown KV cache type `{name}` (supported: f16, q8_0)")]
    UnknownKvType {
        /// The name given.
        name: String,
    },
    /// A quantized KV cache type whose block size does not divide the model's head size.
    #[error("KV cache type {kv_type} needs a head size that is a multiple of {block}, the model's is {head_dim}")]
    KvTypeHeadDim {
        /// The cache type.
        kv_type: crate::KvType,
        /// Elements per quantization block.
        block: usize,
        /// The model's head size.
        head_dim: usize,
    },
    /// A quantized V cache without flash attention (the unfused path reads V transposed,
    /// which ggml cannot do over quantized rows).
    #[error("V cache type {kv_type} needs flash attention")]
    KvTypeNeedsFlashAttn {
        /// The V cache type.
        kv_type: crate::KvType,
    },
    /// Conversations stored with one KV cache type opened by a session of another.
    #[error("KV cache types differ: the store holds K {stored_k}, V {stored_v}; this session uses K {session_k}, V {session_v}")]
    KvTypeMismatch {
        /// K type of the stored conversations.
        stored_k: String,
        /// V type of the stored conversations.
        stored_v: String,
        /// K type of the session.
        session_k: crate::KvType,
        /// V type of the session.
        session_v: crate::KvType,
    },
}

/// What kind of failure an [`Error::Store`] or [`Error::Checkpoint`] is, for a caller to
/// match on ([`Error::store_kind`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreErrorKind {
    /// The checkpoint or block asked for is not stored.
    NotFound,
    /// Another process holds the store's lock in a way this call cannot share.
    Busy,
    /// The store cannot be written: opened read-only, a read-only filesystem, no permission.
    ReadOnly,
    /// Stored data is damaged, or was written for another model, geometry or format.
    Corrupt,
    /// The disk or the user's quota is full, or the store's disk budget cannot make room.
    NoSpace,
    /// Another operating-system I/O failure.
    Io,
    /// The remote tier failed (unreachable, timed out, refused the call).
    Remote,
    /// Anything else (an argument the store refuses, a store shutting down, ...).
    Other,
}

impl StoreErrorKind {
    /// The kind of an I/O failure.
    fn of_io(e: &std::io::Error) -> StoreErrorKind {
        use std::io::ErrorKind;
        match e.kind() {
            ErrorKind::StorageFull | ErrorKind::QuotaExceeded => StoreErrorKind::NoSpace,
            ErrorKind::ReadOnlyFilesystem | ErrorKind::PermissionDenied => StoreErrorKind::ReadOnly,
            _ => StoreErrorKind::Io,
        }
    }

    /// The kind of a checkpoint format error.
    fn of_format(e: &ckptfmt::FormatError) -> StoreErrorKind {
        use ckptfmt::FormatError as F;
        match e {
            F::Io { source, .. } => StoreErrorKind::of_io(source),
            F::NotFound { .. } => StoreErrorKind::NotFound,
            F::Busy { .. } => StoreErrorKind::Busy,
            F::ReadOnly { .. } => StoreErrorKind::ReadOnly,
            _ => StoreErrorKind::Corrupt,
        }
    }

    /// The kind of a block store error.
    fn of_store(e: &kvstore::StoreError) -> StoreErrorKind {
        use kvstore::StoreError as S;
        if e.is_no_space() {
            return StoreErrorKind::NoSpace;
        }
        match e {
            S::Io(source) => StoreErrorKind::of_format(source),
            S::NoSpace { .. } => StoreErrorKind::NoSpace,
            S::NotWritable { .. } => StoreErrorKind::ReadOnly,
            S::Format { source, .. } | S::Refused(source) => StoreErrorKind::of_format(source),
            S::CheckpointNotFound { .. } | S::BlockNotFound { .. } | S::MissingBlock { .. } => {
                StoreErrorKind::NotFound
            }
            S::GeometryMismatch { .. } => StoreErrorKind::Corrupt,
            S::Spill { source } => StoreErrorKind::of_store(source),
            S::Remote { .. } | S::RemoteTls { .. } => StoreErrorKind::Remote,
            _ => StoreErrorKind::Other,
        }
    }
}

impl Error {
    /// The kind of a store or checkpoint failure; `None` for every other error.
    pub fn store_kind(&self) -> Option<StoreErrorKind> {
        match self {
            Error::Store { kind, .. } | Error::Checkpoint { kind, .. } => Some(*kind),
            _ => None,
        }
    }

    /// For a [`StoreErrorKind::Busy`] failure: the pids of the live processes holding what
    /// the call wanted (a lock, a claimed name; empty when they could not be read). `None`
    /// for every other error.
    pub fn busy_pids(&self) -> Option<&[u32]> {
        let (Error::Store { source, .. } | Error::Checkpoint { source, .. }) = self else {
            return None;
        };
        if let Some(store) = source.downcast_ref::<kvstore::StoreError>() {
            return store.busy_pids();
        }
        match source.downcast_ref::<ckptfmt::FormatError>() {
            Some(ckptfmt::FormatError::Busy { pids, .. }) => Some(pids),
            _ => None,
        }
    }

    /// A block store failure as the engine's error.
    pub(crate) fn store(e: kvstore::StoreError) -> Error {
        Error::Store {
            kind: StoreErrorKind::of_store(&e),
            source: Box::new(e),
        }
    }

    /// A checkpoint format failure as the engine's error.
    pub(crate) fn checkpoint(e: ckptfmt::FormatError) -> Error {
        Error::Checkpoint {
            kind: StoreErrorKind::of_format(&e),
            source: Box::new(e),
        }
    }
}

/// Results of the block store and the checkpoint format as the engine's (crate-private, so the
/// API names neither crate's error).
pub(crate) trait Foreign<T> {
    /// The result with its error wrapped in [`Error::Store`] or [`Error::Checkpoint`].
    fn ours(self) -> Result<T>;
}

impl<T> Foreign<T> for std::result::Result<T, kvstore::StoreError> {
    fn ours(self) -> Result<T> {
        self.map_err(Error::store)
    }
}

impl<T> Foreign<T> for std::result::Result<T, ckptfmt::FormatError> {
    fn ours(self) -> Result<T> {
        self.map_err(Error::checkpoint)
    }
}

/// What is wrong in a corrupt GGUF file ([`Error::GgufCorrupt`]).
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum GgufProblem {
    /// A bool that is neither 0 nor 1.
    #[error("bool value {0}")]
    BadBool(u8),
    /// A metadata value type code outside 0..=12.
    #[error("unknown metadata value type {0}")]
    UnknownValueType(u32),
    /// An array element type code outside 0..=12.
    #[error("unknown array element type {0}")]
    UnknownElementType(u32),
    /// Arrays nested deeper than the reader accepts.
    #[error("arrays nested more than {max} deep")]
    NestedTooDeep {
        /// The deepest nesting accepted.
        max: u32,
    },
    /// An array count that the rest of the file cannot hold.
    #[error("array of {count} elements cannot fit in the {left} bytes left")]
    ArrayTooLong {
        /// The declared count.
        count: u64,
        /// Bytes left in the file.
        left: u64,
    },
    /// Header counts that the rest of the file cannot hold.
    #[error("{n_kv} metadata entries and {n_tensors} tensors cannot fit in the {left} bytes left")]
    TooManyEntries {
        /// Declared metadata entries.
        n_kv: u64,
        /// Declared tensors.
        n_tensors: u64,
        /// Bytes left in the file.
        left: u64,
    },
    /// A metadata key that is not UTF-8.
    #[error("metadata key is not UTF-8")]
    KeyNotUtf8,
    /// A key that appears twice.
    #[error("duplicate metadata key {0}")]
    DuplicateKey(String),
    /// `general.alignment` that is not a power-of-two `u32`.
    #[error("bad general.alignment {0}")]
    BadAlignment(String),
    /// A tensor name that is not UTF-8.
    #[error("tensor name is not UTF-8")]
    TensorNameNotUtf8,
    /// A tensor with more dimensions than ggml has.
    #[error("tensor {name} has {n_dims} dimensions")]
    TooManyDims {
        /// The tensor's name.
        name: String,
        /// Its declared dimension count.
        n_dims: u32,
    },
    /// A shape whose rows are not whole blocks of the type, or whose size overflows.
    #[error("tensor {name}: shape {shape:?} is not a whole number of {} blocks or is too large", dtype.name())]
    BadShape {
        /// The tensor's name.
        name: String,
        /// Its shape.
        shape: Vec<u64>,
        /// Its type.
        dtype: crate::gguf::GgmlType,
    },
    /// A tensor offset that is not a multiple of the alignment.
    #[error("tensor {name}: offset {offset} is not aligned to {alignment}")]
    Misaligned {
        /// The tensor's name.
        name: String,
        /// Its offset in the data section.
        offset: u64,
        /// The file's alignment.
        alignment: u32,
    },
    /// A tensor offset whose end overflows.
    #[error("tensor {name}: offset {offset} overflows")]
    OffsetOverflow {
        /// The tensor's name.
        name: String,
        /// Its offset in the data section.
        offset: u64,
    },
    /// A tensor name that appears twice.
    #[error("duplicate tensor {0}")]
    DuplicateTensor(String),
    /// The writer was given tensor bytes that do not match the shape and type.
    #[error("tensor {name}: {given} bytes given, {expected:?} expected")]
    TensorSize {
        /// The tensor's name.
        name: String,
        /// Bytes given.
        given: u64,
        /// Bytes the shape and type need (`None` when they cannot be computed).
        expected: Option<u64>,
    },
}

/// Why a vocabulary cannot be used or a text cannot be tokenized ([`Error::Tokenizer`]).
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum TokenizerError {
    /// `tokenizer.ggml.tokens` is empty or has more than `u32::MAX` entries.
    #[error("vocabulary of {n_vocab} tokens")]
    VocabSize {
        /// The number of tokens.
        n_vocab: usize,
    },
    /// A per-token array (scores, token types) shorter than the vocabulary.
    #[error("{key} has {len} entries for a vocabulary of {n_vocab}")]
    ShortArray {
        /// The metadata key.
        key: &'static str,
        /// Its length.
        len: usize,
        /// The vocabulary size.
        n_vocab: usize,
    },
    /// A `tokenizer.ggml.*_token_id` outside the vocabulary.
    #[error("{key} = {id} is outside the vocabulary of {n_vocab}")]
    TokenIdOutOfRange {
        /// The metadata key.
        key: String,
        /// The id found.
        id: u64,
        /// The vocabulary size.
        n_vocab: usize,
    },
    /// `tokenizer.ggml.pre` names a pre-tokenizer this engine does not know.
    #[error("unknown pre-tokenizer type '{0}'")]
    UnknownPreTokenizer(String),
    /// `tokenizer.ggml.model` names a tokenizer model this engine does not run.
    #[error("unsupported tokenizer model '{0}'")]
    UnsupportedModel(String),
    /// BOS or EOS is to be added but the vocabulary has no such token.
    #[error("add_{which} is set but there is no {which} token")]
    MissingSpecialToken {
        /// `"bos"` or `"eos"`.
        which: &'static str,
    },
    /// A byte that neither a `<0xXX>` token nor a one-byte token covers.
    #[error("no byte token for 0x{0:02X}")]
    NoByteToken(u8),
    /// A pre-tokenizer regex failed to compile.
    #[error("pre-tokenizer regex {pattern}: {message}")]
    Regex {
        /// The regex.
        pattern: &'static str,
        /// The regex engine's message.
        message: String,
    },
}

/// Result with the engine's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::{Error, StoreErrorKind};
    use std::io::{Error as IoError, ErrorKind};

    #[test]
    fn store_failures_have_a_kind_and_keep_their_source() {
        let busy = Error::store(kvstore::StoreError::Refused(ckptfmt::FormatError::Busy {
            path: "/s/lock".into(),
            wanted: "exclusive",
            pids: vec![42],
        }));
        assert_eq!(busy.store_kind(), Some(StoreErrorKind::Busy));
        assert_eq!(busy.busy_pids(), Some(&[42][..]));
        let source = std::error::Error::source(&busy).expect("a source");
        assert!(source.downcast_ref::<kvstore::StoreError>().is_some());
        assert!(busy.to_string().starts_with("store: store lock"), "{busy}");

        let cases = [
            (
                Error::store(kvstore::StoreError::io(
                    "write",
                    "/s/b",
                    IoError::from(ErrorKind::StorageFull),
                )),
                StoreErrorKind::NoSpace,
            ),
            (
                Error::store(kvstore::StoreError::QuotaExceeded {
                    needed: 1,
                    used: 2,
                    quota: 2,
                }),
                StoreErrorKind::NoSpace,
            ),
            (
                Error::store(kvstore::StoreError::io(
                    "create",
                    "/s/b",
                    IoError::from(ErrorKind::ReadOnlyFilesystem),
                )),
                StoreErrorKind::ReadOnly,
            ),
            (
                Error::store(kvstore::StoreError::CheckpointNotFound { name: "a".into() }),
                StoreErrorKind::NotFound,
            ),
            (
                Error::store(kvstore::StoreError::io(
                    "read",
                    "/s/b",
                    IoError::from(ErrorKind::Interrupted),
                )),
                StoreErrorKind::Io,
            ),
            (
                Error::checkpoint(ckptfmt::FormatError::invalid("manifest", "bad")),
                StoreErrorKind::Corrupt,
            ),
            (
                Error::checkpoint(ckptfmt::FormatError::ReadOnly {
                    path: "/s".into(),
                    op: "save",
                }),
                StoreErrorKind::ReadOnly,
            ),
            (
                Error::store(kvstore::StoreError::Remote {
                    op: "get",
                    detail: "refused".into(),
                }),
                StoreErrorKind::Remote,
            ),
        ];
        for (e, kind) in cases {
            assert_eq!(e.store_kind(), Some(kind), "{e}");
            assert_eq!(e.busy_pids(), None, "{e}");
        }
        assert_eq!(Error::NoLogits.store_kind(), None);
    }
}
