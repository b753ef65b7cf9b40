//! llama-server's context shift (`--context-shift`): a generation that fills its context keeps
//! its first `n_keep` tokens, drops the next `n_discard` (half of the rest by default) and goes
//! on, the later tokens' cached K rotated to their new positions by the engine.

use engine::SeqId;

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
        match self.ctx.shift(a.seq, n_keep, n_discard) {
            Ok(()) => {
                a.shifted += n_discard;
                true
            }
            Err(e) => {
                self.metrics
                    .log(format!("context shift of slot {slot} failed: {e}"));
                false
            }
        }
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
