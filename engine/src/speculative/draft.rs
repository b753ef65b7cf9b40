//! A smaller model that drafts greedily, in a context of its own.
//!
//! Each caller's sequence (a key: the server's slot) stays in the draft context between
//! calls: a call keeps the longest prefix the sequence shares with the caller's context,
//! feeds the rest, then drafts one token a step for every caller at once. Rejected draft
//! tokens are cut at the next call, as any other difference is.
//!
//! With a store ([`DraftModel::with_store`], the draft model's own, under its fingerprint), a
//! caller's new sequence starts from the longest run of full blocks stored in its namespace,
//! and [`DraftModel::save`] stores a sequence's full blocks: after a restart the draft model finds
//! its prefixes on disk, as the target does.

use std::collections::HashMap;
use std::sync::Arc;

use crate::store::SessionStore;
use crate::{
    Batch, Context, ContextParams, Error, Logits, Model, Namespace, Result, SeqId, PAGE_TOKENS,
};

/// One caller's part of [`DraftModel::draft`].
#[derive(Clone, Copy, Debug)]
pub struct DraftRequest<'a> {
    /// Whose sequence in the draft context (the server's slot).
    pub key: u64,
    /// Every token of the caller's context, the one to draft after last.
    pub context: &'a [u32],
    /// Most tokens to draft.
    pub n_max: usize,
    /// Drafting stops before a token whose probability under the draft model is below this.
    pub p_min: f32,
    /// The caller's prompt-cache namespace: a stored prefix is taken from it only.
    pub namespace: Option<Namespace>,
}

/// A draft model and its context.
pub struct DraftModel {
    ctx: Context,
    seqs: HashMap<u64, SeqId>,
    /// Keys in order of last use, least recent first (dropped first when pages run short).
    recent: Vec<u64>,
    /// Where the draft's KV is kept, if anywhere.
    store: Option<Arc<SessionStore>>,
    /// Tokens taken from the store so far.
    restored: usize,
}

impl DraftModel {
    /// A draft context for `model`, which must share the target's vocabulary: the same
    /// number of tokens, each with the same text ([`Error::DraftVocab`] otherwise).
    pub fn new(model: Arc<Model>, target: &Model, params: ContextParams) -> Result<DraftModel> {
        let (d, t) = (model.tokenizer(), target.tokenizer());
        if d.n_vocab() != t.n_vocab() {
            return Err(Error::DraftVocab(format!(
                "{} tokens against the target's {}",
                d.n_vocab(),
                t.n_vocab()
            )));
        }
        if let Some(id) = (0..d.n_vocab() as u32).find(|&i| d.token_text(i) != t.token_text(i)) {
            return Err(Error::DraftVocab(format!(
                "token {id} is {:?}, the target's {:?}",
                d.token_text(id),
                t.token_text(id)
            )));
        }
        Ok(DraftModel {
            ctx: Context::new(model, params)?,
            seqs: HashMap::new(),
            recent: Vec::new(),
            store: None,
            restored: 0,
        })
    }

    /// Keeps the draft's KV in `store`, which must have been opened for the draft model.
    pub fn with_store(mut self, store: Arc<SessionStore>) -> DraftModel {
        self.store = Some(store);
        self
    }

    /// Tokens whose KV came from the store rather than being computed.
    pub fn restored_tokens(&self) -> usize {
        self.restored
    }

    /// Makes what [`DraftModel::save`] put durable.
    pub fn flush(&self) -> Result<()> {
        match &self.store {
            Some(s) => s.flush(),
            None => Ok(()),
        }
    }

    /// Puts the full blocks of `key`'s sequence that the store lacks into it (its RAM tier;
    /// on disk at its next spill or flush). Nothing without a store or a sequence.
    pub fn save(&mut self, key: u64) -> Result<()> {
        let (Some(store), Some(&seq)) = (&self.store, self.seqs.get(&key)) else {
            return Ok(());
        };
        let blocks = store.copy_blocks(&self.ctx, seq, 0)?;
        store.put_blocks(blocks)?;
        Ok(())
    }

    /// The draft context (its model, parameters and statistics).
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// Drafts for every request at once: up to its `n_max` tokens, each the draft model's
    /// most likely next token, stopping early below `p_min` or at a context's end. A request
    /// whose context does not fit the draft context gets no draft.
    pub fn draft(&mut self, reqs: &[DraftRequest<'_>]) -> Result<Vec<Vec<u32>>> {
        let mut out: Vec<Vec<u32>> = vec![Vec::new(); reqs.len()];
        let n_ctx = self.ctx.params().n_ctx;
        // (request, sequence, logits of its last token)
        let mut live: Vec<(usize, SeqId)> = Vec::new();
        for (i, r) in reqs.iter().enumerate() {
            if r.n_max == 0 || r.context.is_empty() || r.context.len() + r.n_max > n_ctx {
                continue;
            }
            let seq = self.sync(r.key, r.context, r.namespace)?;
            live.push((i, seq));
        }
        if live.is_empty() {
            return Ok(out);
        }
        // Catch up: every sequence's missing tokens, in chunks of `n_batch`, the last
        // token's logits asked for.
        let mut last: Vec<Vec<f32>> = vec![Vec::new(); reqs.len()];
        let n_batch = self.ctx.params().n_batch.max(1);
        let mut pending: Vec<(usize, SeqId, usize)> = live
            .iter()
            .map(|&(i, seq)| (i, seq, self.held(seq)))
            .collect();
        while !pending.is_empty() {
            let mut batch = Batch::new();
            let mut items = Vec::new();
            let mut budget = n_batch;
            for p in pending.iter_mut() {
                let ctx_tokens = reqs[p.0].context;
                let n = (ctx_tokens.len() - p.2).min(budget);
                if n == 0 {
                    continue;
                }
                let end = p.2 + n == ctx_tokens.len();
                let logits = if end { Logits::Last } else { Logits::None };
                batch.add(p.1, &ctx_tokens[p.2..p.2 + n], logits);
                items.push((p.0, end));
                p.2 += n;
                budget -= n;
            }
            let got = self.decode(&batch, &live)?;
            for (item, &(i, end)) in items.iter().enumerate() {
                if end {
                    last[i] = got.logits(item).to_vec();
                }
            }
            pending.retain(|p| p.2 < reqs[p.0].context.len());
        }
        // Draft a token a step for every request still going.
        while !live.is_empty() {
            let mut batch = Batch::new();
            let mut next = Vec::new();
            for &(i, seq) in &live {
                let (token, p) = top(&last[i]);
                if p < reqs[i].p_min {
                    continue;
                }
                out[i].push(token);
                if out[i].len() < reqs[i].n_max {
                    batch.add(seq, &[token], Logits::Last);
                    next.push((i, seq));
                }
            }
            if batch.is_empty() {
                break;
            }
            let got = self.decode(&batch, &next)?;
            for (item, &(i, _)) in next.iter().enumerate() {
                last[i] = got.logits(item).to_vec();
            }
            live = next;
        }
        Ok(out)
    }

    /// Forgets `key`'s sequence.
    pub fn forget(&mut self, key: u64) {
        if let Some(seq) = self.seqs.remove(&key) {
            let _ = self.ctx.remove_sequence(seq);
        }
        self.recent.retain(|&k| k != key);
    }

    /// Tokens `seq` holds.
    fn held(&self, seq: SeqId) -> usize {
        self.ctx.tokens(seq).map_or(0, <[u32]>::len)
    }

    /// `key`'s sequence, cut to the longest prefix it shares with `context`, less one token
    /// when it holds all of `context` (so that the last token is fed again for its logits);
    /// started again from the store when that holds a page more of `context` in `ns`.
    fn sync(&mut self, key: u64, context: &[u32], ns: Option<Namespace>) -> Result<SeqId> {
        self.recent.retain(|&k| k != key);
        self.recent.push(key);
        let usable = &context[..context.len() - 1];
        let mut common = 0;
        if let Some(&seq) = self.seqs.get(&key) {
            let held = self.ctx.tokens(seq)?;
            common = crate::common_prefix_len(held, usable);
            let same_ns = self.ctx.namespace(seq)? == ns;
            match self.ctx.truncate(seq, common) {
                Ok(()) if same_ns => {
                    // Most calls: the context grew by a token or two since the last one.
                    if self.store.is_none() || common + PAGE_TOKENS >= usable.len() {
                        return Ok(seq);
                    }
                }
                Ok(()) => common = 0,
                // A sliding window's released rows: start again.
                Err(Error::WindowReleased { .. }) => common = 0,
                Err(e) => return Err(e),
            }
        }
        let found = self
            .store
            .as_ref()
            .map(|s| s.stored_prefix(usable, ns, None));
        if let Some(&seq) = self.seqs.get(&key) {
            if common > 0
                && found
                    .as_ref()
                    .is_none_or(|f| f.tokens < common + PAGE_TOKENS)
            {
                return Ok(seq);
            }
            let _ = self.ctx.remove_sequence(seq);
            self.seqs.remove(&key);
        }
        let seq = self.ctx.new_sequence();
        self.ctx.set_namespace(seq, ns)?;
        self.seqs.insert(key, seq);
        if let (Some(store), Some(found)) = (&self.store, found.filter(|f| f.tokens > 0)) {
            // Only a cache: a prefix that cannot be read is computed instead.
            if let Ok(n) = store.restore_stored(&mut self.ctx, seq, usable, &found) {
                self.restored += n;
            }
        }
        Ok(seq)
    }

    /// Decodes `batch`, whose sequences are those of `busy`; when pages run short, the least
    /// recently used other sequences are dropped (their keys start again next time) and it is
    /// tried again.
    fn decode(&mut self, batch: &Batch, busy: &[(usize, SeqId)]) -> Result<crate::BatchOutput> {
        loop {
            match self.ctx.decode(batch) {
                Err(e @ Error::OutOfPages { .. }) => {
                    let idle = self.recent.iter().copied().find(|k| {
                        self.seqs
                            .get(k)
                            .is_some_and(|s| busy.iter().all(|&(_, b)| b != *s))
                    });
                    match idle {
                        Some(key) => self.forget(key),
                        None => return Err(e),
                    }
                }
                other => return other,
            }
        }
    }
}

/// The most likely token of `logits` and its probability.
fn top(logits: &[f32]) -> (u32, f32) {
    let (best, max) =
        logits
            .iter()
            .copied()
            .enumerate()
            .fold(
                (0, f32::NEG_INFINITY),
                |acc, (i, l)| {
                    if l > acc.1 {
                        (i, l)
                    } else {
                        acc
                    }
                },
            );
    if !max.is_finite() {
        return (best as u32, 0.0);
    }
    let sum: f32 = logits.iter().map(|&l| (l - max).exp()).sum();
    (best as u32, 1.0 / sum)
}
