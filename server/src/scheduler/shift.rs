//! llama-server's context shift (`--context-shift`): a generation that fills its context keeps
//! its first `n_keep` tokens, drops the next `n_discard` (half of the rest by default) and goes
//! on, the later tokens' cached K rotated to their new positions by the engine (or, where
//! some of a sequence's pages are spilled to disk under `--kv-ram`, the kept tokens evaluated
//! again).

use engine::{SeqId, PAGE_TOKENS};

use super::sample::flush_text;
use super::{FinishReason, Scheduler};

impl Scheduler {
    /// Shifts the context of the request in `slot`; false when nothing can be dropped or the
    /// engine refused (the request then ends at its length). Either way the sequence is marked
    /// truncated, so it is never cached as the evaluation of its tokens.
    pub(super) fn shift_context(&mut self, slot: usize) -> bool {
        let Some(a) = self.slots[slot].active.as_mut() else {
            return false;
        };
        a.truncated = true;
        let Ok(len) = self.ctx.tokens(a.seq).map(<[u32]>::len) else {
            return false;
        };
        // As llama-server: -1 keeps the whole prompt, a beginning-of-sequence token is kept
        // besides, and at most all but 4 positions are kept; at least one token after the kept
        // ones stays.
        let bos = usize::from(self.model.tokenizer().add_bos());
        let n_keep = (usize::try_from(a.params.n_keep).unwrap_or(a.prompt.len()) + bos)
            .min(self.ctx.params().n_ctx.saturating_sub(4))
            .min(len);
        let n_left = len - n_keep;
        let n_discard = match a.params.n_discard {
            0 => n_left / 2,
            n => n,
        }
        .min(n_left.saturating_sub(1));
        if n_discard == 0 {
            return false;
        }
        let seq = a.seq;
        match self.ctx.shift(seq, n_keep, n_discard) {
            Ok(()) => {
                a.shifted += n_discard;
                true
            }
            Err(engine::Error::SpilledPages { .. }) => {
                self.shift_by_evaluation(slot, seq, n_keep, n_discard)
            }
            Err(e) => {
                self.metrics
                    .log(format!("context shift of slot {slot} failed: {e}"));
                false
            }
        }
    }

    /// The context shift of a sequence with pages spilled to disk (`--kv-ram`), whose K the
    /// engine cannot rotate where it lies: the kept tokens are evaluated again instead, in a
    /// new sequence that shares the full pages of the first `n_keep` tokens (whole pages only:
    /// a partly kept page may be spilled, and is not to be written into). That takes a
    /// prefill of the rest (the other requests wait for it) and gives the KV a fresh
    /// evaluation of the shortened context would. False, and the request failed with the
    /// reason, when that fails too.
    fn shift_by_evaluation(
        &mut self,
        slot: usize,
        seq: SeqId,
        n_keep: usize,
        n_discard: usize,
    ) -> bool {
        let started = std::time::Instant::now();
        let shared = n_keep / PAGE_TOKENS * PAGE_TOKENS;
        let tail = match self.ctx.tokens(seq) {
            Ok(t) => [&t[shared..n_keep], &t[n_keep + n_discard..]].concat(),
            Err(_) => return false,
        };
        let fresh = match self.ctx.fork(seq, shared) {
            Ok(f) => f,
            Err(e) => return self.shift_failed(slot, &e),
        };
        let _ = self.ctx.remove_sequence(seq);
        if let Some(a) = self.slots[slot].active.as_mut() {
            a.seq = fresh;
        }
        let mut fed = self.ctx.feed(fresh, &tail, engine::Logits::Last);
        if let Err(engine::Error::OutOfPages { needed, .. }) = fed {
            if self.make_room(needed) {
                fed = self.ctx.feed(fresh, &tail, engine::Logits::Last);
            }
        }
        if let Err(e) = fed {
            return self.shift_failed(slot, &e);
        }
        if let Some(a) = self.slots[slot].active.as_mut() {
            a.shifted += n_discard;
        }
        self.metrics.log(format!(
            "context shift of slot {slot}: part of its KV is on disk (--kv-ram), so the {} \
             tokens kept after the first {shared} were evaluated again ({} ms)",
            tail.len(),
            started.elapsed().as_millis()
        ));
        true
    }

    /// Fails the request in `slot`, whose context is full and could not shift because of `e`.
    fn shift_failed(&mut self, slot: usize, e: &engine::Error) -> bool {
        self.metrics
            .log(format!("context shift of slot {slot} failed: {e}"));
        let n_ctx = self.ctx.params().n_ctx;
        self.fail(
            slot,
            crate::error::ServerError::Busy(format!(
                "the request filled its context of {n_ctx} positions, and the context \
                 shift failed ({e})"
            )),
        );
        false
    }

    /// Ends the request in `slot` at its length: the text held back for stop strings goes out
    /// first.
    pub(super) fn finish_at_length(&mut self, slot: usize) {
        if let Some(a) = self.slots[slot].active.as_mut() {
            let rest = a.decoder.flush();
            a.text.push_str(&rest);
            let end = a.text.len();
            flush_text(a, end);
        }
        self.finish(slot, FinishReason::Length);
    }
}

impl Scheduler {
    /// llama-server's `--cache-reuse`: resident sequence `seq` shares `n` tokens with
    /// `prompt`; after them, every run of at least `chunk` cached tokens that the prompt has
    /// next is moved into place by a context shift (the cached tokens before it dropped), and
    /// the sequence is cut after the last one. Returns the tokens now shared and whether any
    /// were moved.
    pub(super) fn reuse_chunks(
        &mut self,
        seq: SeqId,
        prompt: &[u32],
        n: usize,
        chunk: usize,
    ) -> engine::Result<(usize, bool)> {
        let mut cache = self.ctx.tokens(seq)?.to_vec();
        let (mut head_c, mut head_p, mut shared) = (n, n, n);
        let mut moved = false;
        while head_c < cache.len() && head_p < prompt.len() {
            let run = engine::common_prefix_len(&cache[head_c..], &prompt[head_p..]);
            if run < chunk.max(1) {
                head_c += 1;
                continue;
            }
            if head_c > head_p {
                self.ctx.shift(seq, head_p, head_c - head_p)?;
                cache.drain(head_p..head_c);
                moved = true;
            }
            shared = head_p + run;
            head_p += run;
            head_c = head_p;
        }
        self.ctx.truncate(seq, shared)?;
        Ok((shared, moved))
    }
}
