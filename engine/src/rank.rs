//! Reranking through the embeddings path: a prompt's tokens evaluated in micro-batches as
//! [`Context::embed`] does, the last token's final-norm output through the model's classifier
//! head (llama.cpp's rank pooling of a causal model, which reads the last token), the first
//! outputs kept as llama.cpp keeps them: one per classifier label, else one.

use crate::batch::{Batch, Logits, Output};
use crate::context::{Context, SeqId};
use crate::error::{Error, Result};
use crate::model::Model;

impl Context {
    /// Appends `tokens` to `seq` in micro-batches of `n_batch`, like [`Context::embed`], and
    /// returns the rank pooling's outputs after the last one: [`crate::Ranking::n_outputs`]
    /// floats, the classifier head's (the first is the relevance score llama-server reports),
    /// or, for a model without a head, the first floats of the last token's final-norm output,
    /// as llama.cpp reads them (a qwen3 model's through a softmax first).
    ///
    /// Checked first as a whole, as [`Context::feed`] is; no token is
    /// [`Error::EmptyBatch`].
    pub fn rank(&mut self, seq: SeqId, tokens: &[u32]) -> Result<Vec<f32>> {
        if tokens.is_empty() {
            return Err(Error::EmptyBatch);
        }
        self.check_append(seq, tokens)?;
        let n_batch = self.params().n_batch;
        let n_chunks = tokens.len().div_ceil(n_batch);
        let mut row = Vec::new();
        for (i, chunk) in tokens.chunks(n_batch).enumerate() {
            let mut batch = Batch::new();
            if i + 1 == n_chunks {
                batch.output = Output::Rank;
                batch.add(seq, chunk, Logits::Last);
                row = self.decode(&batch)?.embeddings(0).to_vec();
            } else {
                // No row is asked for; an embeddings batch spares the output head.
                batch.output = Output::Embeddings;
                batch.add(seq, chunk, Logits::None);
                self.decode(&batch)?;
            }
        }
        row.truncate(self.model().ranking().n_outputs());
        Ok(row)
    }
}

/// Floats a row of a batch's output holds.
pub(crate) fn row_width(model: &Model, output: Output) -> usize {
    let hp = model.hparams();
    let head = &model.ranking().head;
    match output {
        Output::Logits => hp.n_vocab,
        Output::Embeddings => hp.n_embd,
        Output::Rank if head.out.is_some() => model.ranking().n_outputs(),
        Output::Rank => hp.n_embd,
    }
}
