//! `--embedding`, `--pooling`, `--embd-normalize` and `--rerank`: the embeddings and reranking
//! endpoints' options.

use clap::ArgAction;

/// How one input's token embeddings become its embedding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pooling {
    /// Every token's embedding, unpooled and not normalised (`/embedding` only).
    None,
    /// The mean over the tokens.
    Mean,
    /// The first token's.
    Cls,
    /// The last token's (the usual choice for a causal model).
    Last,
    /// A relevance score: the last token's through the model's classifier head (`/rerank`; the
    /// embeddings endpoints refuse it).
    Rank,
}

/// The embeddings options, flattened into [`super::Args`].
#[derive(Clone, Debug, clap::Args)]
pub struct EmbeddingArgs {
    /// Serve `/embedding` and `/v1/embeddings` (`--embeddings`).
    #[arg(long = "embedding", action = ArgAction::SetTrue, env = "LLAMA_ARG_EMBEDDINGS")]
    pub embedding: bool,
    /// Pooling of the embeddings: none, mean, cls, last or rank (default: none; rank serves
    /// `/rerank`, with `--embedding`).
    #[arg(long = "pooling", value_name = "TYPE", env = "LLAMA_ARG_POOLING")]
    pub pooling: Option<String>,
    /// Default normalisation of pooled embeddings, as a request's `embd_normalize`: -1 none,
    /// 0 scaled to int16's range, 1 taxicab, 2 Euclidean, more: that p-norm.
    #[arg(
        long = "embd-normalize",
        value_name = "N",
        default_value_t = 2,
        allow_negative_numbers = true
    )]
    pub embd_normalize: i32,
    /// Serve `/rerank` (`--reranking`): pooling rank, the model's classifier head scoring each
    /// document against the query.
    #[arg(long = "rerank", action = ArgAction::SetTrue, env = "LLAMA_ARG_RERANKING")]
    pub rerank: bool,
}

impl EmbeddingArgs {
    /// The pooling asked for (`--rerank` is pooling rank), or why it cannot be served.
    pub fn pooling(&self) -> Result<Pooling, String> {
        let pooling = match self.pooling.as_deref() {
            None | Some("none" | "unspecified") => Pooling::None,
            Some("mean") => Pooling::Mean,
            Some("cls") => Pooling::Cls,
            Some("last") => Pooling::Last,
            Some("rank") => Pooling::Rank,
            Some(other) => {
                return Err(format!(
                    "{other:?} is not one of none, mean, cls, last, rank"
                ))
            }
        };
        match (self.rerank, pooling) {
            (false, p) => Ok(p),
            (true, Pooling::None | Pooling::Rank) => Ok(Pooling::Rank),
            (true, _) => Err(format!(
                "{:?} contradicts --rerank, which pools by rank",
                self.pooling.as_deref().unwrap_or_default()
            )),
        }
    }

    /// Whether `/rerank` is served: pooling rank with `--rerank` or `--embedding`, as
    /// llama-server.
    pub fn reranking(&self) -> bool {
        (self.rerank || self.embedding) && self.pooling() == Ok(Pooling::Rank)
    }
}
