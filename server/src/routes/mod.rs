//! The HTTP side: the router, the shared state handlers see, the API-key check and the body
//! extractor that turns a body over the limit into an OpenAI-style error.

mod anthropic;
mod cache_admin;
mod conversations;
mod cors;
mod cors_proxy;
mod embeddings;
mod gcp;
mod generate;
mod info;
pub(crate) mod ollama;
mod rerank;
mod responses;
mod shape;

pub(crate) use kvstore::unix_now;
mod slots;
mod sse;
mod stream;
mod turn;
pub(crate) mod ui;
mod warm;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::{FromRequest, Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use engine::store::SessionStore;
use engine::Model;
use subtle::ConstantTimeEq;
use tokio::sync::mpsc;

use crate::args::Config;
use crate::error::ServerError;
use crate::metrics::Metrics;
use crate::request::{Chat, Limits};
use crate::scheduler::Command;
use crate::texts::TextIndex;

/// What every handler can reach.
pub struct AppState {
    /// The scheduler's inbox.
    pub tx: mpsc::UnboundedSender<Command>,
    /// The model (tokenizer and chat template are used on the handlers' threads).
    pub model: Arc<Model>,
    /// The checked options.
    pub config: Config,
    /// Positions per request.
    pub n_ctx: usize,
    /// Slots.
    pub n_slots: usize,
    /// Counters.
    pub metrics: Arc<Metrics>,
    /// The prompt cache store, for its byte counters.
    pub store: Option<Arc<SessionStore>>,
    /// Where the prompt cache lives, unless `--no-cache`.
    pub cache_dir: Option<PathBuf>,
    /// Chat texts and the tokens they were evaluated as.
    pub texts: Mutex<TextIndex>,
    /// The finished conversations the web page lists, per tenant.
    pub conversations: Mutex<crate::conversations::Conversations>,
    /// When the server started (Unix seconds).
    pub started_unix: u64,
    /// The chat template given on the command line, if one was.
    pub template: Option<Arc<engine::chat::ChatTemplate>>,
    /// The vocabulary's token trie for grammars, built at the first request with one.
    pub vocab: std::sync::OnceLock<Result<Arc<engine::constraint::Vocab>, String>>,
    /// Recorded conversation streams (`X-Conversation-Id`), per tenant.
    pub streams: stream::Streams,
    /// The agent tools at `/tools` (`None`: off, 403).
    pub tools: Option<Arc<crate::tools::Tools>>,
}

/// The router of every endpoint, under `--api-prefix` when one is given.
pub fn router(state: Arc<AppState>) -> Router {
    let limit = state.config.max_body;
    let prefix = state
        .config
        .args
        .api_prefix
        .trim_end_matches('/')
        .to_owned();
    let routes = Router::new()
        .route("/health", get(info::health))
        .route("/cors-proxy", get(cors_proxy).post(cors_proxy))
        .route("/v1/health", get(info::health))
        .route("/v1/models", get(info::models))
        .route("/models", get(info::models))
        .route("/props", get(info::props).post(info::change_props))
        .route("/v1/chat/completions", post(generate::chat))
        .route("/chat/completions", post(generate::chat))
        .route(
            "/chat/completions/input_tokens",
            post(generate::chat_input_tokens),
        )
        .route(
            "/v1/chat/completions/input_tokens",
            post(generate::chat_input_tokens),
        )
        .route("/v1/completions", post(generate::completions))
        .route("/completion", post(generate::completion))
        .route("/completions", post(generate::completion))
        .route("/tokenize", post(info::tokenize))
        .route("/detokenize", post(info::detokenize))
        .route("/apply-template", post(info::apply_template))
        .route("/cache", get(cache_admin::show))
        .route("/cache/pin", post(cache_admin::pin))
        .route("/cache/clear", post(cache_admin::clear))
        .route("/cache/pin/{id}", axum::routing::delete(cache_admin::unpin))
        .route("/cache/conversations", get(conversations::list))
        .route(
            "/cache/conversations/{id}",
            axum::routing::delete(conversations::forget),
        )
        .route("/slots", get(slots::list))
        .route("/slots/{id}", post(slots::action))
        .route("/metrics", get(slots::metrics))
        .route("/embedding", post(embeddings::native))
        .route("/embeddings", post(embeddings::native))
        .route("/v1/embeddings", post(embeddings::openai))
        .route("/rerank", post(rerank::rerank))
        .route("/v1/rerank", post(rerank::rerank))
        .route("/reranking", post(rerank::rerank))
        .route("/v1/reranking", post(rerank::rerank))
        .route("/v1/messages", post(anthropic::messages))
        .route("/messages", post(anthropic::messages))
        .route("/v1/messages/count_tokens", post(anthropic::count_tokens))
        .route("/messages/count_tokens", post(anthropic::count_tokens))
        .route("/v1/responses", post(responses::create))
        .route("/responses", post(responses::create))
        .route("/v1/responses/input_tokens", post(responses::input_tokens))
        .route("/responses/input_tokens", post(responses::input_tokens))
        .route(
            "/v1/responses/{id}",
            get(responses::fetch).delete(responses::remove),
        )
        .route(
            "/responses/{id}",
            get(responses::fetch).delete(responses::remove),
        )
        .route("/v1/stream", get(stream::resume).delete(stream::stop))
        .route("/stream", get(stream::resume).delete(stream::stop))
        .route("/v1/streams/lookup", post(stream::lookup))
        .route("/streams/lookup", post(stream::lookup))
        .merge(ollama::routes())
        .merge(crate::tools::routes(state.tools.clone()));
    let routes = if state.config.ui {
        routes.merge(ui::assets())
    } else {
        routes
    };
    let routes = if prefix.is_empty() {
        routes
    } else {
        Router::new().nest(&prefix, routes)
    };
    let routes = gcp::mount(routes.fallback(not_found), &state, &prefix);
    routes
        .layer(axum::middleware::from_fn_with_state(
            Arc::clone(&state),
            stream::record,
        ))
        .layer(axum::middleware::from_fn_with_state(
            Arc::clone(&state),
            require_key,
        ))
        .layer(axum::middleware::from_fn_with_state(
            Arc::clone(&state),
            cors::layer,
        ))
        .layer(axum::extract::DefaultBodyLimit::max(limit))
        .with_state(state)
}

/// `/cors-proxy`, with `--ui-mcp-proxy` (or `--agent`).
async fn cors_proxy(State(st): State<Arc<AppState>>, req: Request) -> Response {
    let on = st.config.args.ui_mcp_proxy || st.config.args.tools.agent_on();
    cors_proxy::answer(on, st.config.max_body, req).await
}

async fn not_found() -> Response {
    let body = serde_json::json!({
        "error": { "message": "no such endpoint", "type": "not_found_error", "code": 404 }
    });
    (StatusCode::NOT_FOUND, axum::Json(body)).into_response()
}

/// The API key a request came with, as a hash (`None` when the server has no keys): what
/// separates clients' cached prompts under `--cache-isolation key`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ClientKey(Option<[u8; 32]>);

impl ClientKey {
    /// The client of API key `key`.
    pub(crate) fn of(key: &str) -> ClientKey {
        ClientKey(Some(*blake3::hash(key.as_bytes()).as_bytes()))
    }
}

impl AppState {
    /// The prompt-cache namespace of a request from `client` with `salt`, per
    /// `--cache-isolation`; `None` (the shared cache) when neither applies.
    pub fn namespace(&self, client: &ClientKey, salt: Option<&str>) -> Option<engine::Namespace> {
        use crate::args::CacheIsolation;
        let mode = self.config.args.cache_isolation;
        let key = client.0.filter(|_| mode == CacheIsolation::Key);
        let salt = salt.filter(|_| mode != CacheIsolation::None);
        if key.is_none() && salt.is_none() {
            return None;
        }
        Some(engine::Namespace::new(&[
            &[u8::from(key.is_some())],
            key.as_ref().map_or(&[][..], |k| &k[..]),
            &[u8::from(salt.is_some())],
            salt.map_or(&[][..], str::as_bytes),
        ]))
    }
}

pub use gcp::conflict as gcp_conflict;

pub(crate) use cors::answer as cors_answer;
pub(crate) use cors_proxy::answer as cors_proxy_answer;

/// The web page's routes, which router mode serves too.
pub(crate) fn ui_assets<S: Clone + Send + Sync + 'static>() -> Router<S> {
    ui::assets()
}

/// Paths served without an API key, as llama-server serves them (after `--api-prefix`).
const PUBLIC_PATHS: &[&str] = &["/", "/health", "/v1/health", "/models", "/v1/models"];

/// Refuses requests without one of the API keys (when keys are set), comparing in constant
/// time. The key comes as `Authorization: Bearer KEY` or as Anthropic's `x-api-key`.
async fn require_key(State(st): State<Arc<AppState>>, mut req: Request, next: Next) -> Response {
    match check_key(&st.config, &req) {
        Ok(client) => {
            req.extensions_mut().insert(client);
            next.run(req).await
        }
        Err(refusal) => *refusal,
    }
}

/// The client a request's API key names, or the refusal (in the dialect its path speaks) when
/// keys are set and it has none of them.
pub(crate) fn check_key(config: &crate::Config, req: &Request) -> Result<ClientKey, Box<Response>> {
    let keys = &config.api_keys;
    if keys.is_empty() {
        return Ok(ClientKey::default());
    }
    let path = req.uri().path();
    let path = path
        .strip_prefix(config.args.api_prefix.trim_end_matches('/'))
        .unwrap_or(path);
    if PUBLIC_PATHS.contains(&path) {
        return Ok(ClientKey::default());
    }
    let headers = req.headers();
    let given = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .or_else(|| headers.get("x-api-key").and_then(|v| v.to_str().ok()))
        .unwrap_or("");
    // Every key is compared, so the time says nothing about which one nearly matched.
    let mut matched = None;
    for key in keys {
        if bool::from(given.as_bytes().ct_eq(key.as_bytes())) {
            matched = Some(key);
        }
    }
    match matched {
        Some(k) => Ok(ClientKey::of(k)),
        None if anthropic::is_anthropic_path(path) => Err(Box::new(anthropic::unauthorized())),
        None if ollama::is_ollama_path(path) => Err(Box::new(ollama::unauthorized())),
        None => Err(Box::new(ServerError::Unauthorized.into_response())),
    }
}

/// A request body's bytes; a body over the limit is 413, as an OpenAI-style error. The
/// functions of [`crate::request`] parse it.
pub struct RawBody(pub Bytes);

impl FromRequest<Arc<AppState>> for RawBody {
    type Rejection = ServerError;

    async fn from_request(req: Request, state: &Arc<AppState>) -> Result<Self, Self::Rejection> {
        let limit = state.config.max_body;
        let bytes = Bytes::from_request(req, state).await.map_err(|e| {
            if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ServerError::BodyTooLarge { limit }
            } else {
                ServerError::BadRequest(e.body_text())
            }
        })?;
        Ok(RawBody(bytes))
    }
}

impl AppState {
    /// What request checks compare against.
    pub fn limits(&self) -> Limits {
        let args = &self.config.args;
        Limits {
            max_body: self.config.max_body,
            n_ctx: self.n_ctx,
            n_vocab: self.model.hparams().n_vocab,
            n_slots: self.n_slots,
            n_predict: args.n_predict,
            seed: args.seed,
            sampler: self.config.sampler.clone(),
            ignore_eos: args.ignore_eos,
            cache_prompt: self.config.cache_prompt,
            dry_breakers: self.config.dry_breakers.clone(),
            context_shift: args.context_shift,
            n_keep: args.keep,
            cache_reuse: args.cache_reuse,
        }
    }
}

/// Renders `chat` with the server's chat template on a blocking thread: a template outside
/// the reviewed ones renders in the renderer process, which a hostile template may keep busy up
/// to its time limit. A final assistant message is continued (llama-server's prefill) unless
/// `--no-prefill-assistant` or the request says otherwise.
async fn render_chat(st: &Arc<AppState>, chat: &Chat) -> Result<String, ServerError> {
    let args = &st.config.args;
    let last_is_assistant = chat
        .messages
        .last()
        .and_then(|m| m.get("role"))
        .and_then(|r| r.as_str())
        == Some("assistant");
    let continue_final = match chat.continue_final_message {
        Some(c) => c,
        None => last_is_assistant && !args.no_prefill_assistant && chat.add_generation_prompt,
    };
    let mut kwargs = st.config.chat_template_kwargs.clone();
    kwargs.extend(chat.kwargs.clone());
    let req = engine::chat::RenderRequest {
        messages: chat.messages.clone(),
        tools: chat.tools.clone(),
        add_generation_prompt: chat.add_generation_prompt && !continue_final,
        continue_final_message: continue_final,
        kwargs,
        // llama-server's `--reasoning-budget 0` is reasoning off.
        reasoning: match args.reasoning_budget {
            0 => engine::chat::Reasoning::Off,
            _ => engine::chat::Reasoning::parse(&args.reasoning)
                .unwrap_or(engine::chat::Reasoning::Auto),
        },
    };
    let st = Arc::clone(st);
    tokio::task::spawn_blocking(move || st.template().render_request(&req))
        .await
        .map_err(|e| engine::Error::TemplateRenderer(format!("the render task failed: {e}")))?
        .map_err(ServerError::from)
}

impl AppState {
    /// The vocabulary grammars are compiled against (built once, by a thread started with the
    /// server; a caller that comes first waits for it rather than building another).
    pub fn vocab(&self) -> Result<Arc<engine::constraint::Vocab>, ServerError> {
        // The tokenizer does not change: a failure is kept as an answer too.
        self.vocab
            .get_or_init(|| {
                engine::constraint::Vocab::new(self.model.tokenizer()).map_err(|e| e.to_string())
            })
            .clone()
            .map_err(|e| ServerError::Engine(engine::Error::Grammar(e)))
    }

    /// The chat template in use: `--chat-template`/`--chat-template-file`/`--no-jinja`, or the
    /// model's.
    pub fn template(&self) -> &engine::chat::ChatTemplate {
        self.template
            .as_deref()
            .unwrap_or_else(|| self.model.chat_template())
    }
}
