//! The server's one error type, and how each variant answers over HTTP: an OpenAI-style JSON
//! object `{"error": {"message", "type", "code"}}` with the matching status.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

/// Everything that can go wrong in the server, from the command line to a request.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    /// A request body that is not the JSON the endpoint expects.
    #[error("invalid request body: {reason}")]
    BadJson {
        /// What serde said (line, column and the field).
        reason: String,
    },
    /// A request that parsed but asks for something impossible.
    #[error("{0}")]
    BadRequest(String),
    /// A prompt that does not fit the context.
    #[error("the prompt has {n_prompt} tokens, more than the context of {n_ctx} allows (one position is needed to generate)")]
    PromptTooLong {
        /// Tokens in the prompt.
        n_prompt: usize,
        /// Positions per sequence.
        n_ctx: usize,
    },
    /// A token id outside the vocabulary.
    #[error("token id {id} is outside the vocabulary of {n_vocab}")]
    BadToken {
        /// The id.
        id: u32,
        /// Vocabulary size.
        n_vocab: usize,
    },
    /// No API key, or the wrong one.
    #[error("invalid or missing API key")]
    Unauthorized,
    /// A body over the size limit.
    #[error("the request body is larger than the limit of {limit} bytes")]
    BodyTooLarge {
        /// The limit in bytes.
        limit: usize,
    },
    /// A slot id that does not exist.
    #[error("slot {id} does not exist (there are {n_slots})")]
    UnknownSlot {
        /// The id asked for.
        id: usize,
        /// Slots the server has.
        n_slots: usize,
    },
    /// A slot filename that could name a path outside the store.
    #[error("invalid slot filename {name:?}: a plain name without '/', '\\' or '..' is required")]
    BadFilename {
        /// The name given.
        name: String,
    },
    /// An endpoint that is switched off.
    #[error("{what} is not enabled on this server ({how})")]
    NotEnabled {
        /// The feature.
        what: &'static str,
        /// The option that enables it.
        how: &'static str,
    },
    /// A request field for a capability this server lacks (never silently ignored).
    #[error("{0}")]
    Unsupported(String),
    /// The KV pool cannot hold the request even after the prompt cache was emptied.
    #[error("the KV cache is full: {0}")]
    Busy(String),
    /// A name that another program owns: a checkpoint it wrote, or one a live process holds.
    #[error("{0}")]
    Conflict(String),
    /// No such thing (a pin).
    #[error("{0}")]
    NotFound(String),
    /// The prompt cache could not do what an operator asked (pin, clear).
    #[error("prompt cache: {0}")]
    Cache(String),
    /// Router mode: the named model's process could not be started or ended.
    #[error("{0}")]
    ModelUnavailable(String),
    /// Refused by policy (a path outside `--tools-root`).
    #[error("{0}")]
    Forbidden(String),
    /// A tool's runtime (`x-tool-runtime`, `--tools-runtime`) that cannot be used.
    #[error("{0}")]
    ToolRuntime(String),
    /// The server is stopping.
    #[error("the server is shutting down")]
    ShuttingDown,
    /// The engine failed (model, KV cache, store).
    #[error(transparent)]
    Engine(#[from] engine::Error),
    /// A command-line option that makes no sense.
    #[error("invalid option {option}: {reason}")]
    BadOption {
        /// The option.
        option: &'static str,
        /// Why.
        reason: String,
    },
    /// I/O outside the engine: binding the port, reading the key file.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

/// The server's result type.
pub type Result<T, E = ServerError> = std::result::Result<T, E>;

impl ServerError {
    /// The HTTP status this error answers with.
    pub fn status(&self) -> StatusCode {
        match self {
            ServerError::BadJson { .. }
            | ServerError::BadRequest(_)
            | ServerError::PromptTooLong { .. }
            | ServerError::BadToken { .. }
            | ServerError::UnknownSlot { .. }
            | ServerError::BadFilename { .. } => StatusCode::BAD_REQUEST,
            ServerError::Unauthorized => StatusCode::UNAUTHORIZED,
            ServerError::Conflict(_) => StatusCode::CONFLICT,
            ServerError::Forbidden(_) => StatusCode::FORBIDDEN,
            ServerError::NotFound(_) => StatusCode::NOT_FOUND,
            ServerError::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ServerError::NotEnabled { .. } | ServerError::Unsupported(_) => {
                StatusCode::NOT_IMPLEMENTED
            }
            ServerError::Busy(_) | ServerError::ShuttingDown | ServerError::ModelUnavailable(_) => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            ServerError::Engine(engine::Error::ContextFull { .. }) => StatusCode::BAD_REQUEST,
            ServerError::Engine(_)
            | ServerError::Cache(_)
            | ServerError::ToolRuntime(_)
            | ServerError::BadOption { .. }
            | ServerError::Io { .. } => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The OpenAI error `type` string.
    pub fn kind(&self) -> &'static str {
        if matches!(self, ServerError::PromptTooLong { .. }) {
            return "exceed_context_size_error";
        }
        match self.status() {
            StatusCode::UNAUTHORIZED => "authentication_error",
            StatusCode::NOT_IMPLEMENTED => "not_supported_error",
            StatusCode::SERVICE_UNAVAILABLE => "unavailable_error",
            s if s.is_client_error() => "invalid_request_error",
            _ => "server_error",
        }
    }

    /// The error as the JSON object clients read.
    pub fn to_json(&self) -> serde_json::Value {
        let mut v = serde_json::json!({
            "error": {
                "message": self.to_string(),
                "type": self.kind(),
                "code": self.status().as_u16(),
            }
        });
        if let ServerError::PromptTooLong { n_prompt, n_ctx } = self {
            v["error"]["n_prompt_tokens"] = (*n_prompt).into();
            v["error"]["n_ctx"] = (*n_ctx).into();
        }
        v
    }
}

impl IntoResponse for ServerError {
    fn into_response(self) -> Response {
        (self.status(), Json(self.to_json())).into_response()
    }
}
