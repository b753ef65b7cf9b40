//! What goes in and out of the scheduler: jobs and their settings, the events a request
//! receives, the figures of a finished one, and the commands of its inbox.

use std::sync::Arc;

use engine::sampling::SamplerParams;
use engine::store::SessionStore;
use engine::Context;
use tokio::sync::{mpsc, oneshot};

use crate::error::{Result, ServerError};
use crate::metrics::Metrics;

/// How one request generates.
#[derive(Clone, Debug)]
pub struct GenParams {
    /// The request's `cache_salt` (vLLM's name): its prompt shares cached blocks only with
    /// requests of the same salt (and, per `--cache-isolation`, the same API key).
    pub cache_salt: Option<String>,
    /// `cache_ttl`: seconds after which the prompt's stored tails expire (and the blocks only
    /// they hold go with them at the writer's next round).
    pub cache_ttl: Option<u64>,
    /// The prompt cache's namespace for the request, from its API key and salt
    /// ([`crate::routes::AppState::namespace`]); `None`: the shared one.
    pub namespace: Option<engine::Namespace>,
    /// Most tokens to generate (also cut by the context).
    pub max_tokens: usize,
    /// Sampling.
    pub sampler: SamplerParams,
    /// Generation stops before the first of these strings.
    pub stop: Vec<String>,
    /// Reuse cached prefixes (llama.cpp's `cache_prompt`; on by default).
    pub cache_prompt: bool,
    /// The slot to run in, if the client asked for one.
    pub id_slot: Option<usize>,
    /// Never sample an end-of-generation token (llama.cpp's `ignore_eos`).
    pub ignore_eos: bool,
    /// Report this many most likely tokens (and the chosen one's probability) for each
    /// generated token; `None` reports nothing.
    pub n_probs: Option<usize>,
    /// Report probabilities after the sampler chain rather than the model's softmax.
    pub post_sampling_probs: bool,
    /// Stop once this long has passed since the first token and a newline was generated.
    pub t_max_predict_ms: Option<u64>,
    /// Prompt tokens kept when the context shifts (-1: all).
    pub n_keep: i64,
    /// Tokens a context shift drops (0: half of those after the kept ones).
    pub n_discard: usize,
    /// A generation that fills its context shifts it and goes on, rather than stopping.
    pub context_shift: bool,
    /// Smallest chunk of a resident prompt reused after the shared prefix by shifting it into
    /// place (0: off).
    pub cache_reuse: usize,
    /// `--reasoning-budget N` (N > 0): a thinking block is closed after N tokens.
    pub reasoning_budget: Option<ReasoningBudget>,
    /// Report the prompt's evaluation after each chunk.
    pub return_progress: bool,
    /// The grammar the output must follow (the handler compiles it into the job's constraint).
    pub grammar: Option<engine::constraint::Grammar>,
    /// `logit_bias` as sent: the handler tokenizes text targets into `sampler.logit_bias`.
    pub bias: Vec<(crate::request::BiasTarget, f32)>,
    /// DRY sequence breakers as text (`None`: llama-server's defaults), tokenized by the
    /// handler into `sampler.dry_sequence_breakers`.
    pub dry_breakers: Option<Vec<String>>,
    /// A warm-up, not a client's request: a reply evaluated ahead as its client will send it
    /// back (see `routes/warm.rs`). It starts from a fork of the resident sequence it shares
    /// a prefix with rather than taking that sequence over, so the conversation as generated
    /// stays cached too.
    pub warm: bool,
    /// The request's own speculative settings (the server's where unset).
    pub speculative: super::SpecRequest,
}

/// A request for the scheduler.
#[derive(Debug)]
pub struct Job {
    /// Prompt tokens (not empty, checked against the context by the handler).
    pub prompt: Vec<u32>,
    /// How to generate.
    pub params: GenParams,
    /// Where the text goes; dropping the receiver cancels the request.
    pub events: mpsc::UnboundedSender<Event>,
    /// The grammar compiled for this job, when it has one.
    pub constraint: Option<engine::constraint::Constraint>,
}

/// Generated text with the tokens it came from.
#[derive(Debug, Default)]
pub struct Chunk {
    /// More text (never part of a stop string, never a partial character).
    pub text: String,
    /// The tokens generated since the last chunk.
    pub tokens: Vec<u32>,
    /// Their probabilities, when the request asked for them.
    pub probs: Vec<TokenProbs>,
}

/// One generated token's probability and the most likely alternatives: from the softmax of
/// the model's logits, or after the sampler chain (llama-server's `post_sampling_probs`).
pub type TokenProbs = engine::sampling::Sampled;

/// How far a prompt's evaluation has come (llama-server's `prompt_progress`).
#[derive(Clone, Copy, Debug)]
pub struct Progress {
    /// Prompt tokens in all.
    pub total: usize,
    /// Prompt tokens that came from a cache.
    pub cache: usize,
    /// Prompt tokens held so far, cached ones included.
    pub processed: usize,
    /// Time since the request was admitted.
    pub time_ms: f64,
}

/// What a request receives.
#[derive(Debug)]
pub enum Event {
    /// More text.
    Text(Chunk),
    /// A prompt chunk was evaluated (only for requests that asked).
    Progress(Progress),
    /// The end, with its figures.
    Done(Box<Finish>),
    /// The request failed.
    Failed(ServerError),
}

/// Why a generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-generation token.
    EndOfGeneration,
    /// A stop string.
    StopString,
    /// `max_tokens` or the context ran out.
    Length,
    /// The client left.
    Cancelled,
}

impl FinishReason {
    /// OpenAI's `finish_reason`.
    pub fn as_openai(self) -> &'static str {
        match self {
            FinishReason::Length => "length",
            _ => "stop",
        }
    }
}

/// The figures of a finished request.
#[derive(Clone, Debug)]
pub struct Finish {
    /// Why it ended.
    pub reason: FinishReason,
    /// The slot it ran in.
    pub slot: usize,
    /// Prompt tokens in all.
    pub n_prompt: usize,
    /// Prompt tokens whose KV came from a cache (pool or store).
    pub cache_n: usize,
    /// Prompt tokens evaluated.
    pub prompt_n: usize,
    /// Time from admission to the first token's logits.
    pub prompt_ms: f64,
    /// Tokens generated.
    pub predicted_n: usize,
    /// Time from the first token to the end.
    pub predicted_ms: f64,
    /// The generated tokens (without an end-of-generation token).
    pub tokens: Vec<u32>,
    /// The stop string that ended it (empty for other reasons).
    pub stopping_word: String,
    /// Every generated token's probabilities, when asked for.
    pub probs: Vec<TokenProbs>,
    /// The context was shifted: older tokens were dropped to go on.
    pub truncated: bool,
    /// Draft tokens verified and accepted.
    pub drafts: super::DraftCounts,
}

/// A `/slots/{id}` action.
#[derive(Clone, Debug)]
pub enum SlotAction {
    /// Save the slot's last conversation as a named checkpoint.
    Save {
        /// The checkpoint's name.
        name: String,
        /// Replace a checkpoint of that name that another program wrote (never one that a
        /// live process holds).
        overwrite: bool,
    },
    /// Load a named checkpoint into the slot.
    Restore(String),
    /// Forget the slot's last conversation.
    Erase,
}

/// A message to the scheduler.
#[derive(Debug)]
pub enum Command {
    /// Generate (boxed: a job is far larger than the other commands).
    Generate(Box<Job>),
    /// Report the slots as llama-server's `/slots` JSON.
    Slots {
        /// Whose conversations it shows.
        scope: super::SlotScope,
        /// The JSON.
        reply: oneshot::Sender<serde_json::Value>,
    },
    /// Act on one slot.
    Slot {
        /// Slot id.
        id: usize,
        /// What to do.
        action: SlotAction,
        /// Whose conversation it may save or erase.
        scope: super::SlotScope,
        /// The llama-server JSON answer.
        reply: oneshot::Sender<Result<serde_json::Value>>,
    },
    /// Every token's embedding of each input (`n_embd` floats a token, in order), evaluated
    /// between two steps in sequences of their own that are dropped afterwards.
    Embed {
        /// The inputs' tokens, each within a slot's context.
        inputs: Vec<Vec<u32>>,
        /// The embeddings, an input at a time.
        reply: oneshot::Sender<Result<Vec<Vec<f32>>>>,
    },
    /// Each input's rank pooling (`engine::Context::rank`: the classifier head's outputs, the
    /// first being the relevance score), evaluated as [`Command::Embed`]'s inputs are.
    Rank {
        /// The prompts' tokens, each within a slot's context.
        inputs: Vec<Vec<u32>>,
        /// The outputs, an input at a time.
        reply: oneshot::Sender<Result<Vec<Vec<f32>>>>,
    },
    /// Pin the full blocks of `tokens`, which a finished sequence of `namespace` holds (a
    /// request computed them), as pin `id` ([`promptcache::PromptCache::pin`]).
    Pin {
        /// The pin's id.
        id: String,
        /// The prompt's tokens.
        tokens: Vec<u32>,
        /// Its namespace.
        namespace: Option<engine::Namespace>,
        /// When it expires (seconds since the epoch).
        expires_unix: Option<u64>,
        /// The tokens pinned, once the writer stored the pin.
        reply: oneshot::Sender<std::result::Result<usize, String>>,
    },
    /// Clear a namespace: its cached sequences in memory, then its checkpoints and blocks in
    /// the store (after the writes queued before).
    Clear(crate::cache::ClearWork),
    /// Take no more requests; finish the running and waiting ones, flush the cache and end.
    Shutdown,
    /// Nothing to do but look again: the loader has read a waiting request's blocks.
    Wake,
    /// Wake up if asleep (`--sleep-idle-seconds`), as for a request that needs the model
    /// (llama-server wakes for every endpoint but the read-only ones); answered once awake.
    Rouse(oneshot::Sender<()>),
}

/// llama-server's reasoning budget: once a thinking block has run for `tokens` tokens, the
/// tokens of `close` (its end tag) are the next ones, not sampled, and the reply goes on.
#[derive(Clone, Debug)]
pub struct ReasoningBudget {
    /// Tokens a thinking block may take.
    pub tokens: usize,
    /// The tokens that close it (`</think>`).
    pub close: Vec<u32>,
    /// The prompt left a thinking block open (the reply starts inside it).
    pub opened: bool,
    /// The text that opens a thinking block in the reply (`<think>`; harmony's analysis
    /// header).
    pub start: &'static str,
    /// The text that ends it (`</think>`; harmony's `<|end|>`).
    pub end: &'static str,
}

/// What the scheduler needs besides its context.
pub struct Parts {
    /// The context (moved onto the scheduler thread).
    pub ctx: Context,
    /// Slots (requests evaluated at once).
    pub n_slots: usize,
    /// The prompt cache store, unless `--no-cache`.
    pub store: Option<Arc<SessionStore>>,
    /// Where `/slots` save and restore go, if anywhere.
    pub slot_store: Option<Arc<SessionStore>>,
    /// Shared counters.
    pub metrics: Arc<Metrics>,
    /// Sleep after this long idle (`--sleep-idle-seconds`), if at all.
    pub sleep_after: Option<std::time::Duration>,
    /// The scheduler's own command channel, for the loader to wake it (weak: it does not keep
    /// the scheduler running).
    pub wake: mpsc::WeakUnboundedSender<Command>,
    /// Speculative decoding, when the server was started with it.
    pub spec: Option<super::Speculation>,
    /// Warm up on the scheduler thread first, then say so here. On the thread that evaluates
    /// every batch: ggml's OpenMP workers spin between operations only while no more threads
    /// exist than cores, and a second thread that once ran a graph keeps its own idle workers,
    /// so a warm-up elsewhere halved decoding speed on two cores.
    pub warm_up: Option<oneshot::Sender<()>>,
}
