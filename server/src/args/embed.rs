//! `--embedding`, `--pooling` and `--embd-normalize`: the embeddings endpoints' options.

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
}

/// The embeddings options, flattened into [`super::Args`].
#[derive(Clone, Debug, clap::Args)]
pub struct EmbeddingArgs {
    /// Serve `/embedding` and `/v1/embeddings` (`--embeddings`).
    #[arg(long = "embedding", action = ArgAction::SetTrue, env = "LLAMA_ARG_EMBEDDINGS")]
    pub embedding: bool,
    /// Pooling of the embeddings: none, mean, cls or last (default: the model's, which is none
    /// for the llama family).
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
}

impl EmbeddingArgs {
    /// The pooling asked for, or why it cannot be served.
    pub fn pooling(&self) -> Result<Pooling, String> {
        match self.pooling.as_deref() {
            None | Some("none" | "unspecified") => Ok(Pooling::None),
            Some("mean") => Ok(Pooling::Mean),
            Some("cls") => Ok(Pooling::Cls),
            Some("last") => Ok(Pooling::Last),
            Some("rank") => Err(
                "rank pooling needs a reranking model's classifier head, which this server does \
                 not run"
                    .into(),
            ),
            Some(other) => Err(format!("{other:?} is not one of none, mean, cls, last")),
        }
    }
}
