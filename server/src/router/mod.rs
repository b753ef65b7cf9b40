//! Router mode: several models behind one server, as llama-server's router runs them. Started
//! without `-m`, the server lists the models of `--models-dir`, `--models-preset` and the hub
//! cache, and runs each in a process of its own (this binary, with the router's options and
//! the model's), loaded when a request names it ([`pool`]) and reached over loopback
//! ([`proxy`]). Every process keeps its prompt cache in the shared cache directory under its
//! model's fingerprint, so a model unloaded and loaded again finds its conversations on disk.

mod catalog;
mod conv;
mod pool;
mod proxy;

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Query, Request, State};
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};

use crate::args::Config;
use crate::error::{Result, ServerError};
use pool::{Launch, Pool};

pub use catalog::{Entry, Source};

/// Set in a model process's environment: it then says on standard output where it listens.
pub const CHILD_ENV: &str = "LLAMA_HDD_ROUTER_CHILD";

/// The router's own variables, kept from its model processes.
const ROUTER_ENV: &[&str] = &[
    FAKE_TIMING_ENV,
    "LLAMA_ARG_MODEL",
    "LLAMA_ARG_MODELS_DIR",
    "LLAMA_ARG_MODELS_PRESET",
    "LLAMA_ARG_MODELS_MAX",
    "LLAMA_ARG_NO_MODELS_AUTOLOAD",
    "LLAMA_ARG_HOST",
    "LLAMA_ARG_PORT",
    "LLAMA_ARG_ALIAS",
    "LLAMA_ARG_TOOLS",
    "LLAMA_ARG_TOOLS_RUNTIME",
    "LLAMA_ARG_TOOLS_ROOT",
    "LLAMA_ARG_MCP_SERVERS_CONFIG",
    "LLAMA_ARG_MCP_SERVERS_JSON",
];

/// llama-server's test knob, honoured with the same meaning: when the variable is set, each
/// request holds its model this long before it is passed on, and each load waits as long
/// before it starts, so that tests of the queue see requests overlap.
const FAKE_TIMING_ENV: &str = "LLAMA_SERVER_DEBUG_FAKE_TIMING";
const FAKE_DELAY: Duration = Duration::from_secs(2);

fn fake_timing() -> bool {
    std::env::var_os(FAKE_TIMING_ENV).is_some_and(|v| !v.is_empty())
}

/// The line a model process prints when it falls asleep (`--sleep-idle-seconds`).
pub const SLEEPING_LINE: &str = "sleeping";
/// The line a model process prints when it wakes up again.
pub const AWAKE_LINE: &str = "awake";

/// The line a model process prints on standard output once it listens.
pub fn ready_line(addr: SocketAddr) -> String {
    format!("ready http://{addr}")
}

fn ready_port(line: &str) -> Option<u16> {
    let addr = line.strip_prefix("ready http://")?;
    addr.rsplit(':').next()?.trim().parse().ok()
}

/// The options of the router's command line (`argv` without the program) that its model
/// processes get: all but the router's own (`--models-*`, `--host`, `--port`, `--alias`).
pub fn child_args(argv: impl IntoIterator<Item = String>) -> Vec<String> {
    let own = crate::args::RouterArgs::OWN;
    let mut out = Vec::new();
    let mut skip_value = false;
    for a in argv {
        if skip_value {
            skip_value = false;
            continue;
        }
        let name = a.split_once('=').map_or(a.as_str(), |(n, _)| n);
        if let Some((_, takes)) = own.iter().find(|(o, _)| *o == name) {
            skip_value = *takes && !a.contains('=');
            continue;
        }
        out.push(a);
    }
    out
}

struct RouterState {
    config: Config,
    pool: Arc<Pool>,
    client: proxy::HttpClient,
    started_unix: u64,
    /// Which model serves each conversation stream (`X-Conversation-Id`).
    convs: conv::Conversations,
    /// The agent tools at `/tools`, served by the router itself.
    tools: Option<Arc<crate::tools::Tools>>,
}

/// A router bound to its addresses.
pub struct RouterServer {
    listeners: Vec<tokio::net::TcpListener>,
    state: Arc<RouterState>,
}

impl RouterServer {
    /// Reads the catalog and binds the addresses; model processes are started by `exe` with
    /// the options `shared` before each model's own.
    pub async fn bind(
        config: Config,
        exe: PathBuf,
        shared: Vec<String>,
        say: Arc<dyn Fn(String) + Send + Sync>,
    ) -> Result<RouterServer> {
        let catalog = catalog::load(&config.args.router)
            .map_err(|(option, reason)| ServerError::BadOption { option, reason })?;
        say(format!("router: {} models", catalog.len()));
        for e in catalog.values() {
            say(format!(
                "router:   [{:>10}] {}{}",
                e.source.as_str(),
                e.name,
                if e.hidden { " (hidden)" } else { "" }
            ));
        }
        let startup: Vec<String> = catalog
            .values()
            .filter(|e| e.load_on_startup)
            .map(|e| e.name.clone())
            .collect();
        let tools = crate::tools::Tools::start(&config.args.tools).await?;
        if let Some(t) = &tools {
            say(t.warning());
            let say = Arc::clone(&say);
            t.set_log(move |line| say(line));
        }
        let max = config.args.router.models_max;
        let pool = Pool::new(catalog, Launch { exe, shared }, max, say);
        let mut listeners = Vec::new();
        for host in &config.hosts {
            let addr = format!("{host}:{}", config.args.port);
            let l = tokio::net::TcpListener::bind(&addr)
                .await
                .map_err(|source| ServerError::Io {
                    what: format!("listening on {host} port {}", config.args.port),
                    source,
                })?;
            listeners.push(l);
        }
        for name in startup {
            let _ = pool.load(&name);
        }
        Ok(RouterServer {
            listeners,
            state: Arc::new(RouterState {
                config,
                pool,
                client: proxy::client(),
                started_unix: kvstore::since_epoch().as_secs(),
                convs: conv::Conversations::default(),
                tools,
            }),
        })
    }

    /// The addresses it listens on.
    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        self.listeners
            .iter()
            .filter_map(|l| l.local_addr().ok())
            .collect()
    }

    /// Serves until `shutdown` completes, then stops every model process.
    pub async fn run_until<F>(self, shutdown: F) -> Result<()>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let app = app(Arc::clone(&self.state));
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let tools = self.state.tools.clone();
        tokio::spawn(async move {
            shutdown.await;
            // Tool commands and MCP calls in flight end now, not after the connections drain.
            if let Some(tools) = tools {
                tools.shutdown().await;
            }
            let _ = stop_tx.send(true);
        });
        let serving: Vec<_> = self
            .listeners
            .into_iter()
            .map(|l| tokio::spawn(crate::serve::serve(l, app.clone(), stop_rx.clone())))
            .collect();
        for task in serving {
            let _ = task.await;
        }
        self.state.pool.close().await;
        Ok(())
    }
}

fn app(state: Arc<RouterState>) -> Router {
    let prefix = state
        .config
        .args
        .api_prefix
        .trim_end_matches('/')
        .to_owned();
    let limit = state.config.max_body;
    let mut routes = Router::new()
        .route("/health", get(health))
        .route("/v1/health", get(health))
        .route("/models", get(models).post(download))
        .route("/v1/models", get(models))
        .route("/models/load", post(load))
        .route("/models/unload", post(unload))
        .route("/props", get(props))
        .route("/cors-proxy", get(cors_proxy).post(cors_proxy))
        .route("/v1/stream", get(conv::resume).delete(conv::stop))
        .route("/stream", get(conv::resume).delete(conv::stop))
        .route("/v1/streams/lookup", post(conv::lookup))
        .route("/streams/lookup", post(conv::lookup))
        .route("/api/tags", get(tags))
        .route("/api/ps", get(ps))
        .route("/api/version", get(version))
        .merge(crate::tools::routes(state.tools.clone()));
    if state.config.ui {
        routes = routes.merge(crate::routes::ui_assets());
    }
    let routes = routes.fallback(forward);
    let routes = if prefix.is_empty() {
        routes
    } else {
        Router::new().nest(&prefix, routes)
    };
    routes
        .layer(axum::middleware::from_fn_with_state(
            Arc::clone(&state),
            require_key,
        ))
        .layer(axum::middleware::from_fn_with_state(
            Arc::clone(&state),
            cors,
        ))
        .layer(axum::extract::DefaultBodyLimit::max(limit))
        .with_state(state)
}

async fn require_key(State(st): State<Arc<RouterState>>, mut req: Request, next: Next) -> Response {
    match crate::routes::check_key(&st.config, &req) {
        Ok(client) => {
            req.extensions_mut().insert(client);
            next.run(req).await
        }
        Err(refusal) => *refusal,
    }
}

async fn cors(State(st): State<Arc<RouterState>>, req: Request, next: Next) -> Response {
    crate::routes::cors_answer(&st.config.args, req, next).await
}

async fn cors_proxy(State(st): State<Arc<RouterState>>, req: Request) -> Response {
    let on = st.config.args.ui_mcp_proxy || st.config.args.tools.agent_on();
    crate::routes::cors_proxy_answer(on, st.config.max_body, req).await
}

async fn health() -> Json<Value> {
    Json(json!({ "status": "ok" }))
}

#[derive(serde::Deserialize)]
struct ModelQuery {
    model: Option<String>,
    reload: Option<String>,
    autoload: Option<String>,
}

impl ModelQuery {
    fn autoload(&self, st: &RouterState) -> bool {
        match self.autoload.as_deref() {
            Some(v) => v == "1" || v == "true",
            None => st.config.args.router.autoload(),
        }
    }
}

/// `GET /models`: every model with its status (`?reload=1` reads the catalog again).
async fn models(State(st): State<Arc<RouterState>>, Query(q): Query<ModelQuery>) -> Response {
    if q.reload.as_deref().is_some_and(|r| !r.is_empty()) {
        match catalog::load(&st.config.args.router) {
            Ok(c) => st.pool.set_catalog(c),
            Err((option, e)) => {
                return ServerError::BadRequest(format!("{option} {e}")).into_response()
            }
        }
    }
    let data: Vec<Value> = st
        .pool
        .list()
        .into_iter()
        .filter(|(e, _, _)| !e.hidden)
        .map(|(e, status, failed)| {
            let mut s = json!({ "value": status.as_str(), "args": e.args });
            if let Some(code) = failed {
                s["failed"] = true.into();
                s["exit_code"] = code.into();
            }
            json!({
                "id": e.name,
                "aliases": [],
                "tags": [],
                "object": "model",
                "owned_by": "llamacpp",
                "created": st.started_unix,
                "status": s,
                "source": e.source.as_str(),
                "path": e.path,
                "architecture": { "input_modalities": ["text"], "output_modalities": ["text"] },
                "can_remove": false,
            })
        })
        .collect();
    Json(json!({ "object": "list", "data": data })).into_response()
}

/// `POST /models`: downloading is not done here (no network); a local file goes in
/// `--models-dir`.
async fn download() -> Response {
    ServerError::Unsupported(
        "downloading models is not done by this server: put the GGUF file in --models-dir \
         or name it in --models-preset"
            .into(),
    )
    .into_response()
}

/// The `model` a JSON body names (or `name`, as Ollama's older `/api/show` and `/api/delete`
/// bodies do).
fn model_of(body: &Bytes) -> std::result::Result<String, ServerError> {
    let v: Value = serde_json::from_slice(body).map_err(|e| ServerError::BadJson {
        reason: e.to_string(),
    })?;
    Ok(["model", "name"]
        .iter()
        .find_map(|k| v.get(*k).and_then(Value::as_str).filter(|m| !m.is_empty()))
        .unwrap_or_default()
        .to_owned())
}

/// `POST /models/load`.
async fn load(State(st): State<Arc<RouterState>>, body: Bytes) -> Response {
    let answer = (|| {
        let name = model_of(&body)?;
        let entry = st
            .pool
            .resolve(&name)
            .ok_or_else(|| ServerError::NotFound("model is not found".into()))?;
        st.pool.load(&entry.name)
    })();
    match answer {
        Ok(()) => Json(json!({ "success": true })).into_response(),
        Err(e) => e.into_response(),
    }
}

/// `POST /models/unload`.
async fn unload(State(st): State<Arc<RouterState>>, body: Bytes) -> Response {
    let answer = (|| {
        let name = model_of(&body)?;
        let entry = st
            .pool
            .resolve(&name)
            .ok_or_else(|| ServerError::BadRequest("model is not found".into()))?;
        st.pool.unload(&entry.name)
    })();
    match answer {
        Ok(()) => Json(json!({ "success": true })).into_response(),
        Err(e) => e.into_response(),
    }
}

/// `GET /props`: the router's own, or a model's with `?model=`.
async fn props(
    State(st): State<Arc<RouterState>>,
    Query(q): Query<ModelQuery>,
    req: Request,
) -> Response {
    if q.model.as_deref().is_some_and(|m| !m.is_empty()) {
        return forward(State(st), req).await;
    }
    let r = &st.config.args.router;
    Json(json!({
        "role": "router",
        "max_instances": r.models_max,
        "models_autoload": r.autoload(),
        "model_alias": "llama-hdd-server",
        "model_path": "none",
        "default_generation_settings": { "params": {}, "n_ctx": 0 },
        "build_info": concat!("b", env!("CARGO_PKG_VERSION"), "-llama-hdd"),
    }))
    .into_response()
}

/// The size, modification time and digest Ollama's listings give of a model file.
fn file_facts(e: &Entry) -> (u64, String, String) {
    let meta = std::fs::metadata(&e.path).ok();
    let size = meta.as_ref().map_or(0, |m| m.len());
    let modified = meta
        .and_then(|m| m.modified().ok())
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .unwrap_or_default();
    let digest =
        blake3::hash(format!("{}:{size}:{}", e.path.display(), modified.as_secs()).as_bytes())
            .to_hex()
            .to_string();
    (size, crate::routes::ollama::rfc3339(modified), digest)
}

fn ollama_entry(e: &Entry) -> Value {
    let (size, modified_at, digest) = file_facts(e);
    json!({
        "name": e.name,
        "model": e.name,
        "modified_at": modified_at,
        "size": size,
        "digest": digest,
        "details": { "format": "gguf", "family": "", "families": null, "parameter_size": "", "quantization_level": "" },
    })
}

/// `GET /api/tags`: the models `/models` lists, as Ollama lists them.
async fn tags(State(st): State<Arc<RouterState>>) -> Json<Value> {
    let models: Vec<Value> = st
        .pool
        .list()
        .iter()
        .filter(|(e, _, _)| !e.hidden)
        .map(|(e, _, _)| ollama_entry(e))
        .collect();
    Json(json!({ "models": models }))
}

/// `GET /api/ps`: the models loaded now.
async fn ps(State(st): State<Arc<RouterState>>) -> Json<Value> {
    // Unloaded only to make room or when asked: a century from now stands for "forever".
    let expires = kvstore::since_epoch() + Duration::from_secs(100 * 365 * 86_400);
    let models: Vec<Value> = st
        .pool
        .list()
        .iter()
        .filter(|(_, s, _)| s.port().is_some())
        .map(|(e, _, _)| {
            let mut v = ollama_entry(e);
            v["expires_at"] = crate::routes::ollama::rfc3339(expires).into();
            v["size_vram"] = 0.into();
            v
        })
        .collect();
    Json(json!({ "models": models }))
}

async fn version() -> Json<Value> {
    Json(json!({ "version": crate::routes::ollama::OLLAMA_VERSION }))
}

/// Every other request goes to the process of the model it names: in the JSON body's `model`,
/// or for a request without a body in the `model` query parameter.
async fn forward(State(st): State<Arc<RouterState>>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let body = match axum::body::to_bytes(body, st.config.max_body).await {
        Ok(b) => b,
        Err(_) => {
            return ServerError::BodyTooLarge {
                limit: st.config.max_body,
            }
            .into_response()
        }
    };
    let query: ModelQuery = parts
        .uri
        .query()
        .and_then(serde_urlencoded_model)
        .unwrap_or(ModelQuery {
            model: None,
            reload: None,
            autoload: None,
        });
    let name = if parts.method == Method::GET
        || parts.method == Method::DELETE
        || parts.method == Method::HEAD
        || body.is_empty()
    {
        query.model.clone().unwrap_or_default()
    } else {
        match model_of(&body) {
            Ok(m) if !m.is_empty() => m,
            Ok(_) => query.model.clone().unwrap_or_default(),
            Err(e) => return e.into_response(),
        }
    };
    if name.is_empty() {
        return if parts.uri.path() == "/" {
            (StatusCode::NOT_FOUND, "").into_response()
        } else {
            ServerError::BadRequest("model name is missing from the request".into()).into_response()
        };
    }
    let Some(entry) = st.pool.resolve(&name) else {
        return ServerError::BadRequest(format!("model '{name}' not found")).into_response();
    };
    let autoload = query.autoload(&st);
    let conv_id = parts
        .headers
        .get(conv::HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty())
        .map(str::to_owned);
    let Some(conv_id) = conv_id else {
        return pass(&st, &entry.name, autoload, parts, body).await;
    };
    // A conversation's stream is recorded by the model process for a later resume: the
    // request goes on when its client leaves (a page reloaded during a load), and only a stop
    // (`DELETE /v1/stream`) cancels it.
    let client = parts
        .extensions
        .get::<crate::routes::ClientKey>()
        .copied()
        .unwrap_or_default();
    let stopped = st.convs.remember(client, &conv_id, &entry.name);
    let task = tokio::spawn({
        let st = Arc::clone(&st);
        let name = entry.name.clone();
        async move {
            tokio::select! {
                r = pass(&st, &name, autoload, parts, body) => r,
                () = stopped.wait() => ServerError::BadRequest(
                    "request cancelled by a stop while the model was loading".into(),
                )
                .into_response(),
            }
        }
    });
    task.await.unwrap_or_else(|_| {
        ServerError::ModelUnavailable("the request's task failed".into()).into_response()
    })
}

/// Takes a place in `name`'s process and passes the request on.
async fn pass(
    st: &RouterState,
    name: &str,
    autoload: bool,
    parts: axum::http::request::Parts,
    body: Bytes,
) -> Response {
    let lease = match st.pool.acquire(name, autoload).await {
        Ok(l) => l,
        Err(e) => return e.into_response(),
    };
    if fake_timing() {
        // The model counts as busy meanwhile, as in llama-server's queue tests.
        tokio::time::sleep(FAKE_DELAY).await;
    }
    // Under `--api-prefix` the router's nesting took the prefix off; the process has it too.
    let uri = parts
        .extensions
        .get::<axum::extract::OriginalUri>()
        .map_or(&parts.uri, |o| &o.0);
    proxy::forward(
        &st.client,
        lease,
        parts.method.clone(),
        uri,
        &parts.headers,
        body,
    )
    .await
}

/// `model` and `autoload` of a query string.
fn serde_urlencoded_model(query: &str) -> Option<ModelQuery> {
    Query::<ModelQuery>::try_from_uri(&format!("/?{query}").parse().ok()?)
        .ok()
        .map(|Query(q)| q)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_router_keeps_its_own_options() {
        let argv = [
            "--models-dir",
            "/m",
            "-c",
            "512",
            "--port=8080",
            "--host",
            "0.0.0.0",
            "--no-models-autoload",
            "--api-key",
            "k",
            "--models-max",
            "2",
        ];
        let got = child_args(argv.iter().map(|s| s.to_string()));
        assert_eq!(got, ["-c", "512", "--api-key", "k"]);
    }

    #[test]
    fn the_ready_line_names_the_port() {
        let line = ready_line(SocketAddr::from(([127, 0, 0, 1], 4321)));
        assert_eq!(ready_port(&line), Some(4321));
        assert_eq!(
            ready_port("llama-hdd-server listening on http://127.0.0.1:1"),
            None
        );
    }
}
