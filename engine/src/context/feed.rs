//! Appending tokens to a sequence: the checks of a batch before anything changes, and
//! prompts fed in micro-batches (a hybrid model's ending at the last page boundary they cross).

use super::*;

impl Context {
    /// The checks of [`Context::decode`] before anything changes (sequences, positions,
    /// tokens, windows, context and pool); returns the pages the batch needs.
    pub(super) fn check_batch(&self, batch: &Batch) -> Result<usize> {
        let mut needed = 0;
        for (i, item) in batch.items.iter().enumerate() {
            if batch.items[..i].iter().any(|o| o.seq == item.seq) {
                return Err(Error::DuplicateSequence { seq: item.seq });
            }
            let s = self.seq(item.seq)?;
            let len = s.tokens.len();
            if let Some(pos) = item.pos.filter(|&p| p != len) {
                return Err(Error::PositionGap {
                    seq: item.seq,
                    expected: len,
                    found: pos,
                });
            }
            if item.tokens.is_empty() {
                return Err(Error::EmptyBatch);
            }
            self.check_tokens(&item.tokens)?;
            self.check_window(item.seq, &s.pages, len)?;
            if len + item.tokens.len() > self.params.n_ctx {
                return Err(Error::ContextFull {
                    needed: len + item.tokens.len(),
                    n_ctx: self.params.n_ctx,
                });
            }
            needed += self.pages_needed(s, item.tokens.len());
        }
        if needed > self.pool.n_free() {
            return Err(Error::OutOfPages {
                needed,
                free: self.pool.n_free(),
                total: self.pool.n_pages(),
            });
        }
        Ok(needed)
    }

    /// Appends `tokens` to `seq` in micro-batches of `n_batch` and returns the logits after the
    /// last one (every token's when `logits` is [`Logits::All`]).
    ///
    /// Checked first as a whole (sequence, vocabulary, context, pages); a failure in a later
    /// micro-batch leaves the earlier ones evaluated.
    pub fn feed(&mut self, seq: SeqId, tokens: &[u32], logits: Logits) -> Result<Vec<f32>> {
        self.check_append(seq, tokens)?;
        let mut all = Vec::new();
        // A hybrid model's micro-batches end at the last page boundary the tokens cross, so the
        // sequence's state there is known (see `Recurrent::snapshot`).
        let start = self.seqs[&seq].tokens.len();
        let split = match self.recurrent {
            Some(_) => ((start + tokens.len()) / PAGE_TOKENS * PAGE_TOKENS).saturating_sub(start),
            None => 0,
        };
        let (head, rest) = tokens.split_at(split.min(tokens.len()));
        let chunks: Vec<&[u32]> = head
            .chunks(self.params.n_batch)
            .chain(rest.chunks(self.params.n_batch))
            .collect();
        let n_chunks = chunks.len();
        for (i, chunk) in chunks.into_iter().enumerate() {
            let want = match logits {
                Logits::All => Logits::All,
                _ if i + 1 == n_chunks => logits,
                _ => Logits::None,
            };
            let mut batch = Batch::new();
            batch.add(seq, chunk, want);
            let out = self.decode(&batch)?;
            if logits == Logits::All {
                all.extend_from_slice(out.logits(0));
            } else if i + 1 == n_chunks {
                all = out.logits(0).to_vec();
            }
        }
        Ok(all)
    }

    /// Appends `tokens` to `seq` in micro-batches of `n_batch`, like [`Context::feed`], and
    /// returns every token's embedding (`n_embd` floats each, in order; see
    /// [`Batch::set_embeddings`]).
    pub fn embed(&mut self, seq: SeqId, tokens: &[u32]) -> Result<Vec<f32>> {
        self.check_append(seq, tokens)?;
        let mut all = Vec::with_capacity(tokens.len() * self.model.hparams().n_embd);
        for chunk in tokens.chunks(self.params.n_batch) {
            let mut batch = Batch::new();
            batch.set_embeddings(true);
            batch.add(seq, chunk, Logits::All);
            let out = self.decode(&batch)?;
            all.extend_from_slice(out.embeddings(0));
        }
        Ok(all)
    }

    /// Whether `tokens` can be appended to `seq` as a whole: the sequence exists, the ids are
    /// in the vocabulary, the context holds them and the pool has the pages.
    pub(crate) fn check_append(&self, seq: SeqId, tokens: &[u32]) -> Result<()> {
        let s = self.seq(seq)?;
        self.check_tokens(tokens)?;
        let needed = s.tokens.len() + tokens.len();
        if needed > self.params.n_ctx {
            return Err(Error::ContextFull {
                needed,
                n_ctx: self.params.n_ctx,
            });
        }
        let pages = self.pages_needed(s, tokens.len());
        if pages > self.pool.n_free() {
            return Err(Error::OutOfPages {
                needed: pages,
                free: self.pool.n_free(),
                total: self.pool.n_pages(),
            });
        }
        Ok(())
    }
}
