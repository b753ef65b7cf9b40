//! `server`: an OpenAI- and llama-server-compatible HTTP server over the engine, whose prompt
//! cache survives restarts.
//!
//! One scheduler thread ([`scheduler`]) owns the engine's context and runs continuous batching
//! over every active request; the HTTP handlers (`routes`, on tokio and axum) tokenize, check
//! and hand work to it through channels, and stream the text back. Every prompt starts from the
//! longest prefix already computed, in memory or in the store directory ([`cache`]), and its
//! new KV blocks are written behind the response.
//!
//! ```no_run
//! # async fn run() -> server::Result<()> {
//! let args = server::Args::parse_from_argv(["llama-hdd-server", "-m", "model.gguf"]).unwrap();
//! let server = server::Server::bind(args.check()?).await?;
//! println!("listening on http://{}", server.local_addr());
//! server.run_until(async { let _ = tokio::signal::ctrl_c().await; }).await
//! # }
//! ```

#![forbid(unsafe_code)]
#![recursion_limit = "256"]

pub mod args;
pub mod cache;
pub mod conversations;
pub mod error;
pub mod mcp;
pub mod metrics;
pub mod request;
pub mod router;
mod routes;
pub mod scheduler;
mod serve;
pub mod texts;
pub mod tools;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use engine::store::{SessionStore, StoreConfig};
use engine::{Context, ContextParams, Model, PAGE_TOKENS};
use tokio::sync::mpsc;

pub use args::{Args, Config};
pub use error::{Result, ServerError};

use crate::conversations::Conversations;
use crate::metrics::Metrics;
use crate::routes::AppState;
use crate::scheduler::{Command, Parts};
use crate::texts::TextIndex;

/// Conversations the chat text index remembers.
const TEXT_INDEX_ENTRIES: usize = 1024;

/// Conversations the web page's list keeps (all tenants together).
const CONVERSATIONS_LISTED: usize = 1024;

/// A server bound to its addresses, its model loaded and its scheduler running.
pub struct Server {
    listeners: Vec<tokio::net::TcpListener>,
    state: Arc<AppState>,
    scheduler: std::thread::JoinHandle<()>,
    log: Option<std::sync::mpsc::Receiver<String>>,
}

impl Server {
    /// Loads the model, opens the cache, starts the scheduler and binds the addresses.
    pub async fn bind(config: Config) -> Result<Server> {
        let args = &config.args;
        // Repacked weights give sums that depend on a batch's row count: only when asked.
        let model = Model::load_with(
            &args.model,
            &engine::ModelParams {
                repack: args.repack && !args.no_repack,
                ..engine::ModelParams::gpu_layers(config.n_gpu_layers)
            },
        )?;
        let mut ctx_params = context_params(&config, &model)?;
        let budget = kv_budget(&config, &model, &ctx_params)?;
        ctx_params.kv_ram = budget.0;
        // The store first: it knows the model's fingerprint when the file is unchanged, and the
        // context needs it.
        let store_config = StoreConfig {
            ram_bytes: config.cache_ram,
            disk_bytes: config.cache_disk,
            stored_type_k: args.cache_type_stored,
            stored_type_v: args.cache_type_stored,
            read_delay: std::time::Duration::from_millis(args.fault_read_delay_ms),
            remote: crate::args::remote_config(&args.remote, args.no_cache)?,
            ..StoreConfig::for_context(&ctx_params)
        };
        let store = if args.no_cache {
            None
        } else {
            Some(Arc::new(SessionStore::open(
                &config.cache_dir,
                &model,
                store_config.clone(),
            )?))
        };
        let slot_store = match &args.slot_save_path {
            Some(dir) => Some(Arc::new(SessionStore::open(
                dir,
                &model,
                store_config.clone(),
            )?)),
            None => store.clone(),
        };
        let mut spec = speculation(&config, &model, &ctx_params, &store_config)?;
        if let (Some(spec), Some(store)) = (spec.as_mut(), &store) {
            spec.seed(store);
        }
        let mut ctx = Context::new(Arc::clone(&model), ctx_params)?;
        spill_to_store(&mut ctx, store.as_deref())?;
        let n_ctx = ctx.params().n_ctx;
        let template = chat_template(&config, &model)?;
        let metrics = Arc::new(Metrics::default());
        let (log_tx, log_rx) = std::sync::mpsc::channel();
        if let Ok(mut log) = metrics.log.lock() {
            *log = Some(log_tx);
        }
        if let Some(store) = &store {
            log_store(store, &metrics);
        }
        Metrics::set(&metrics.kv_ram_budget, budget.0 as u64);
        metrics.log(budget.1);
        let (tx, rx) = mpsc::unbounded_channel();
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let scheduler = scheduler::spawn(
            Parts {
                ctx,
                n_slots: config.n_slots,
                store: store.clone(),
                slot_store,
                metrics: Arc::clone(&metrics),
                sleep_after: u64::try_from(config.args.sleep_idle_seconds)
                    .ok()
                    .map(std::time::Duration::from_secs),
                wake: tx.downgrade(),
                spec,
                warm_up: (!args.no_warmup).then_some(ready_tx),
            },
            rx,
        );
        // Answer nothing before the warm-up is done, as llama-server.
        let _ = ready_rx.await;
        let tools = start_tools(&config.args, &metrics).await?;
        let mut listeners = Vec::with_capacity(config.hosts.len());
        for host in &config.hosts {
            // `[::1]` and `::1` alike.
            let host = host.trim_start_matches('[').trim_end_matches(']');
            let listener = tokio::net::TcpListener::bind((host, args.port))
                .await
                .map_err(|source| ServerError::Io {
                    what: format!("listening on {host} port {}", args.port),
                    source,
                })?;
            listeners.push(listener);
        }
        // The text index lives beside the blocks it names, per model.
        let fp: String = model.fingerprint()[..16]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let (texts, conversations) = match &store {
            Some(_) => (
                TextIndex::open(config.cache_dir.join("texts").join(&fp), TEXT_INDEX_ENTRIES),
                Conversations::open(
                    config.cache_dir.join("conversations").join(&fp),
                    CONVERSATIONS_LISTED,
                ),
            ),
            None => (
                TextIndex::new(TEXT_INDEX_ENTRIES),
                Conversations::new(CONVERSATIONS_LISTED),
            ),
        };
        let state = Arc::new(AppState {
            tx,
            model,
            n_ctx,
            n_slots: config.n_slots,
            metrics,
            cache_dir: store.as_ref().map(|_| config.cache_dir.clone()),
            store,
            texts: Mutex::new(texts),
            conversations: Mutex::new(conversations),
            started_unix: kvstore::unix_now(),
            template,
            vocab: std::sync::OnceLock::new(),
            streams: Default::default(),
            tools,
            config,
        });
        // The grammars' token trie is built and the template renderer started before the
        // server answers anything (as llama-server answers only once warmed up): a first
        // request with a grammar or a forced tool call does not wait for them.
        let renderer = std::thread::Builder::new()
            .name("warm-up".into())
            .spawn(|| {
                if let Some(sandbox) = engine::chat::sandbox::active() {
                    sandbox.prestart();
                }
            });
        let early = Arc::clone(&state);
        let _ = tokio::task::spawn_blocking(move || drop(early.vocab())).await;
        if let Ok(renderer) = renderer {
            let _ = renderer.join();
        }
        Ok(Server {
            listeners,
            state,
            scheduler,
            log: Some(log_rx),
        })
    }

    /// The server's log lines (a full disk, a failed context shift, …), for the caller to
    /// print or keep; `None` after the first call.
    pub fn log_lines(&mut self) -> Option<std::sync::mpsc::Receiver<String>> {
        self.log.take()
    }

    /// The addresses it listens on, in `--host` order.
    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        self.listeners
            .iter()
            .filter_map(|l| l.local_addr().ok())
            .collect()
    }

    /// The counters its scheduler keeps.
    pub fn metrics(&self) -> Arc<Metrics> {
        Arc::clone(&self.state.metrics)
    }

    /// The first address it listens on (the port chosen when `--port 0`).
    pub fn local_addr(&self) -> SocketAddr {
        // A bound listener always has an address.
        self.local_addrs()
            .first()
            .copied()
            .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 0)))
    }

    /// Serves until `shutdown` completes; then takes no more connections, lets the requests
    /// in flight finish, stops the scheduler and flushes the prompt cache to disk.
    pub async fn run_until<F>(self, shutdown: F) -> Result<()>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let Server {
            listeners,
            state,
            scheduler,
            ..
        } = self;
        let tx = state.tx.clone();
        let tools = state.tools.clone();
        let app = routes::router(state);
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            shutdown.await;
            // Tool commands and MCP calls in flight end now, not after the connections drain.
            if let Some(tools) = tools {
                tools.shutdown().await;
            }
            let _ = stop_tx.send(true);
        });
        let serving: Vec<_> = listeners
            .into_iter()
            .map(|listener| tokio::spawn(serve::serve(listener, app.clone(), stop_rx.clone())))
            .collect();
        for task in serving {
            let _ = task.await;
        }
        let _ = tx.send(Command::Shutdown);
        drop(tx);
        let _ = tokio::task::spawn_blocking(move || scheduler.join()).await;
        Ok(())
    }
}

/// The agent tools (`/tools`), their MCP servers started before the server listens, and the
/// warning that says they are on.
async fn start_tools(args: &Args, metrics: &Arc<Metrics>) -> Result<Option<Arc<tools::Tools>>> {
    let tools = tools::Tools::start(&args.tools).await?;
    if let Some(t) = &tools {
        metrics.log(t.warning());
        let metrics = Arc::clone(metrics);
        t.set_log(move |line| metrics.log(line));
    }
    Ok(tools)
}

/// Speculative decoding's state, with the draft model loaded into a context of its own (the
/// target's settings, `-cd` for its length).
fn speculation(
    config: &Config,
    model: &Model,
    ctx_params: &ContextParams,
    store_config: &StoreConfig,
) -> Result<Option<scheduler::Speculation>> {
    let Some(spec) = config.spec.clone() else {
        return Ok(None);
    };
    let draft = match &spec.draft_model {
        None => None,
        Some(path) => {
            let bad = |reason: String| ServerError::BadOption {
                option: "--spec-draft-model",
                reason,
            };
            let draft = Model::load(path).map_err(|e| bad(e.to_string()))?;
            let n_ctx = if spec.draft_ctx == 0 {
                ctx_params.n_ctx
            } else {
                spec.draft_ctx
            };
            let params = ContextParams {
                n_ctx,
                kv_tokens: ctx_params.kv_tokens.max(n_ctx),
                kv_ram: 0,
                ..ctx_params.clone()
            };
            let mut dm = engine::speculative::DraftModel::new(Arc::clone(&draft), model, params)
                .map_err(|e| bad(e.to_string()))?;
            // The draft's KV is cached like any model's, under its own fingerprint.
            if !config.args.no_cache {
                let store = SessionStore::open(&config.cache_dir, &draft, store_config.clone())?;
                dm = dm.with_store(Arc::new(store));
            }
            Some(dm)
        }
    };
    Ok(Some(scheduler::Speculation::new(spec, draft)))
}

/// The context's parameters, as llama-server sizes it: the whole context (`-c`, 0 for the
/// model's) split among the slots unless unified, and a page pool for every slot's context and
/// as much again for finished prompts kept resident.
fn context_params(config: &Config, model: &Model) -> Result<ContextParams> {
    let args = &config.args;
    let n_train = model.hparams().n_ctx_train.max(2);
    // llama-server's context: the whole of it (`-c`, 0 for the model's) split among the
    // slots, unless any one request may use all of it (unified: `--kv-unified`, or
    // `--parallel` left to auto).
    let total = if args.ctx_size == 0 {
        n_train
    } else {
        args.ctx_size
    };
    let per_slot = if config.kv_unified {
        total
    } else {
        total / config.n_slots
    };
    if per_slot < 2 {
        return Err(ServerError::BadOption {
            option: "--ctx-size",
            reason: format!(
                "{total} positions over {} slots leave fewer than 2 to each",
                config.n_slots
            ),
        });
    }
    let n_ctx = per_slot.min(n_train);
    // Each slot may need its context plus one copied page (unified, the slots share one
    // context, as llama-server's: the same pool as split, one request may take all of
    // it); as much again keeps finished prompts resident for the next requests.
    let contexts = if config.kv_unified {
        n_ctx.div_ceil(PAGE_TOKENS)
    } else {
        config.n_slots * n_ctx.div_ceil(PAGE_TOKENS)
    };
    let kv_tokens = 2 * (contexts + config.n_slots) * PAGE_TOKENS;
    let ctx_params = ContextParams {
        n_ctx,
        kv_tokens,
        n_threads: config.n_threads,
        n_batch: args.batch_size.min(args.ubatch_size),
        flash_attn: config.flash_attn,
        type_k: args.cache_type_k,
        type_v: args.cache_type_v,
        evaluation: args.evaluation,
        ..ContextParams::default()
    };
    Ok(ctx_params)
}

/// The KV pool's RAM budget in bytes (0: none) for `pool`, and the line that says it in the
/// log: `--kv-ram`'s, or by default the rule of [`args::memory`] over the memory available
/// now; none by default when the whole pool fits in that (nothing would spill, and a pool
/// without a budget never reads KV from disk), or when there is no store to spill to.
fn kv_budget(config: &Config, model: &Model, pool: &ContextParams) -> Result<(usize, String)> {
    let args = &config.args;
    let size = kvstore::format_size;
    let layout = engine::KvLayout::with_types(model.hparams(), pool.type_k, pool.type_v)?;
    let page = layout.bytes_per_page() as u64;
    let pool_bytes = (pool.kv_tokens as u64).saturating_mul(layout.bytes_per_token() as u64);
    let pool_text = format!(
        "the pool of {} tokens takes {}",
        pool.kv_tokens,
        size(pool_bytes)
    );
    let rule = "half the memory available after the model file and --cache-ram";
    let none = |why: String| Ok((0, format!("KV RAM budget: none ({why})")));
    let (bytes, how) = match config.kv_ram {
        Some(0) => return none("--kv-ram 0".into()),
        Some(n) => (n, "--kv-ram".to_owned()),
        None => {
            if let Some((why, _)) = args.no_spill_store() {
                return none(why.to_owned());
            }
            let model_bytes = std::fs::metadata(&args.model).map_or(0, |m| m.len());
            match args::default_kv_ram(model_bytes, config.cache_ram) {
                None => {
                    return none("the memory available cannot be read; --kv-ram sets one".into())
                }
                Some(n) if n >= pool_bytes => {
                    return none(format!(
                        "{pool_text}, within {} ({rule}); --kv-ram sets one",
                        size(n)
                    ))
                }
                Some(n) => (n, format!("{rule}; --kv-ram to set it")),
            }
        }
    };
    // The engine keeps at least a batch's pages and one more in RAM, whatever the budget.
    let floor = (pool.n_batch.div_ceil(PAGE_TOKENS) as u64 + 1) * page;
    let held = match bytes < floor {
        true => format!(", at least {} (a batch's pages and one more)", size(floor)),
        false => String::new(),
    };
    let fate = match bytes >= pool_bytes {
        true => "nothing spills",
        false => "full pages past it are spilled to the cache directory and read from there",
    };
    let line = format!(
        "KV RAM budget: {} ({how}){held}; {pool_text}: {fate}",
        size(bytes)
    );
    Ok((usize::try_from(bytes).unwrap_or(usize::MAX), line))
}

/// Gives `ctx` the prompt cache's store to spill to, when it has a RAM budget (one is set only
/// where the store can take its pages: see `Args::no_spill_store`).
pub(crate) fn spill_to_store(
    ctx: &mut Context,
    store: Option<&SessionStore>,
) -> engine::Result<()> {
    match store {
        Some(store) if ctx.params().kv_ram > 0 => ctx.spill_to(store),
        _ => Ok(()),
    }
}

/// Says where the prompt cache's model fingerprint came from and any legacy store, and sends the
/// remote tier's log lines to the server's log.
fn log_store(store: &Arc<SessionStore>, metrics: &Arc<Metrics>) {
    metrics.log(match store.fingerprint_origin() {
        engine::FingerprintOrigin::Hashed => {
            "prompt cache: the model file was hashed (its fingerprint is remembered \
             for the next start)"
                .to_owned()
        }
        _ => "prompt cache: the model file's fingerprint was remembered".to_owned(),
    });
    if let Some(old) = store.legacy_store() {
        metrics.log(format!("prompt cache: note: {old}"));
    }
    if store.is_hybrid() {
        metrics.log(
            "prompt cache: this model is a hybrid: its recurrent layers' state cannot be cut \
             back, so a prompt resumes where a state was kept (the end of a previous \
             conversation turn, or the last 64-token boundary with a snapshot before it \
             parts from a cached one); --cache-reuse, context shifts and speculative \
             decoding do not apply to it"
                .to_owned(),
        );
    }
    let log = Arc::clone(metrics);
    store.set_remote_log(move |line| log.log(line));
}

/// The chat template the command line asks for: `--chat-template-file`, `--chat-template` (one
/// of llama-server's built-in names, else Jinja source), `--no-jinja` (the built-in named by
/// `--chat-template`, else ChatML); `None` for the model's own.
fn chat_template(
    config: &Config,
    model: &Model,
) -> Result<Option<Arc<engine::chat::ChatTemplate>>> {
    use engine::chat::ChatTemplate;
    let args = &config.args;
    let tok = model.tokenizer();
    let bos = tok.bos().map_or("", |b| tok.token_text(b)).to_owned();
    let eos = tok.eos().map_or("", |e| tok.token_text(e)).to_owned();
    let builtin = |name: &str| ChatTemplate::builtin(name, &bos, &eos);
    let template = if let Some(path) = &args.chat_template_file {
        let source = std::fs::read_to_string(path).map_err(|source| ServerError::Io {
            what: format!("reading the chat template {}", path.display()),
            source,
        })?;
        Some(ChatTemplate::new(&source, &bos, &eos)?)
    } else if args.no_jinja {
        let name = args.chat_template.as_deref().unwrap_or("chatml");
        Some(builtin(name).ok_or_else(|| ServerError::BadOption {
            option: "--chat-template",
            reason: format!(
                "{name:?} is not a built-in template; with --no-jinja one of: {}",
                engine::chat::builtin_names().join(", ")
            ),
        })?)
    } else {
        match &args.chat_template {
            Some(name) => match builtin(name) {
                Some(t) => Some(t),
                None => Some(ChatTemplate::new(name, &bos, &eos)?),
            },
            None => None,
        }
    };
    Ok(template.map(Arc::new))
}
