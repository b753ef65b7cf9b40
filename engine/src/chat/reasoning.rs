//! Splitting a model's reasoning (`<think>...</think>`) from the content of its reply, whole
//! ([`split_reasoning`]) or as it streams ([`ReasoningStream`]), as llama-server's
//! `--reasoning-format` does.
//!
//! The reasoning is the text between `<think>` (at the start of the reply, after optional
//! whitespace, or already opened by the prompt) and `</think>`, without the whitespace around it;
//! the content is what follows `</think>`, without its leading whitespace. A block that never
//! closes is all reasoning. Empty reasoning counts as none.

/// How generated text's reasoning is returned.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ReasoningFormat {
    /// Everything stays in the content, tags included.
    None,
    /// Like [`Deepseek`](Self::Deepseek) (llama-server's default).
    #[default]
    Auto,
    /// Reasoning goes to `reasoning_content`, the rest to `content`.
    Deepseek,
    /// Reasoning goes to `reasoning_content` and also stays in the content, between
    /// `<think>` and `</think>`.
    DeepseekLegacy,
}

impl ReasoningFormat {
    /// Parses llama-server's `--reasoning-format` values: `none`, `auto`, `deepseek`,
    /// `deepseek-legacy`.
    pub fn parse(name: &str) -> Option<ReasoningFormat> {
        Some(match name {
            "none" => ReasoningFormat::None,
            "auto" => ReasoningFormat::Auto,
            "deepseek" => ReasoningFormat::Deepseek,
            "deepseek-legacy" => ReasoningFormat::DeepseekLegacy,
            _ => return None,
        })
    }
}

/// The tag that opens a reasoning block.
pub const THINK_START: &str = "<think>";
/// The tag that closes a reasoning block.
pub const THINK_END: &str = "</think>";

/// Splits a whole reply into `(reasoning, content)`. `prompt_opened_thinking`: the prompt ended
/// inside an open `<think>` block (see [`super::prompt_opens_thinking`]), so the reply starts
/// inside the reasoning.
pub fn split_reasoning(
    text: &str,
    format: ReasoningFormat,
    prompt_opened_thinking: bool,
) -> (Option<String>, String) {
    if format == ReasoningFormat::None {
        return (None, text.to_string());
    }
    let inside = if prompt_opened_thinking {
        text
    } else {
        match text.trim_start().strip_prefix(THINK_START) {
            Some(rest) => rest,
            None => return (None, text.to_string()),
        }
    };
    let (reasoning, rest, closed) = match inside.find(THINK_END) {
        Some(i) => (
            &inside[..i],
            inside[i + THINK_END.len()..].trim_start(),
            true,
        ),
        None => (inside, "", false),
    };
    let reasoning = reasoning.trim();
    if reasoning.is_empty() {
        return (None, rest.to_string());
    }
    let content = if format == ReasoningFormat::DeepseekLegacy {
        let end = if closed { THINK_END } else { "" };
        format!("{THINK_START}{reasoning}{end}{rest}")
    } else {
        rest.to_string()
    };
    (Some(reasoning.to_string()), content)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Not yet known whether the reply opens with `<think>`.
    Start,
    /// Inside the reasoning block.
    Reasoning,
    /// After `</think>`, skipping whitespace.
    AfterEnd,
    /// In the content.
    Content,
}

/// [`split_reasoning`] for a reply that arrives in pieces: [`feed`](Self::feed) each piece,
/// then [`finish`](Self::finish). It never emits part of a tag, nor whitespace that the whole
/// split would trim; the concatenated deltas equal [`split_reasoning`]'s result.
#[derive(Clone, Debug)]
pub struct ReasoningStream {
    format: ReasoningFormat,
    state: State,
    /// Text received and not yet emitted.
    pending: String,
    /// Whether any reasoning was emitted.
    reasoned: bool,
}

impl ReasoningStream {
    /// A stream for a reply in `format`; `prompt_opened_thinking` as for [`split_reasoning`].
    pub fn new(format: ReasoningFormat, prompt_opened_thinking: bool) -> ReasoningStream {
        let state = match (format, prompt_opened_thinking) {
            (ReasoningFormat::None, _) => State::Content,
            (_, true) => State::Reasoning,
            (_, false) => State::Start,
        };
        ReasoningStream {
            format,
            state,
            pending: String::new(),
            reasoned: false,
        }
    }

    /// Takes the next piece of the reply; returns `(reasoning_delta, content_delta)`, either
    /// possibly empty.
    pub fn feed(&mut self, chunk: &str) -> (String, String) {
        self.pending.push_str(chunk);
        let (mut reasoning, mut content) = (String::new(), String::new());
        loop {
            match self.state {
                State::Start => {
                    let t = self.pending.trim_start();
                    if let Some(rest) = t.strip_prefix(THINK_START) {
                        self.pending = rest.to_string();
                        self.state = State::Reasoning;
                    } else if THINK_START.starts_with(t) {
                        break;
                    } else {
                        self.state = State::Content;
                    }
                }
                State::Reasoning => {
                    if !self.reasoned {
                        let t = self.pending.trim_start();
                        if t.len() != self.pending.len() {
                            self.pending = t.to_string();
                        }
                    }
                    if let Some(i) = self.pending.find(THINK_END) {
                        let part = self.pending[..i].trim_end().to_string();
                        self.emit_reasoning(&part, &mut reasoning, &mut content);
                        if self.reasoned && self.format == ReasoningFormat::DeepseekLegacy {
                            content.push_str(THINK_END);
                        }
                        self.pending.drain(..i + THINK_END.len());
                        self.state = State::AfterEnd;
                        continue;
                    }
                    let held = partial_suffix(&self.pending, THINK_END);
                    let ready = self.pending[..self.pending.len() - held].trim_end().len();
                    let part: String = self.pending.drain(..ready).collect();
                    self.emit_reasoning(&part, &mut reasoning, &mut content);
                    break;
                }
                State::AfterEnd => {
                    let t = self.pending.trim_start();
                    if t.is_empty() {
                        self.pending.clear();
                        break;
                    }
                    self.pending = t.to_string();
                    self.state = State::Content;
                }
                State::Content => {
                    content.push_str(&self.pending);
                    self.pending.clear();
                    break;
                }
            }
        }
        (reasoning, content)
    }

    /// Ends the reply: returns what was held back (an unclosed block's last reasoning, or text
    /// that looked like the start of `<think>`).
    pub fn finish(&mut self) -> (String, String) {
        let (mut reasoning, mut content) = (String::new(), String::new());
        let rest = std::mem::take(&mut self.pending);
        match self.state {
            State::Start | State::Content => content = rest,
            State::Reasoning => {
                let part = rest.trim().to_string();
                self.emit_reasoning(&part, &mut reasoning, &mut content);
            }
            State::AfterEnd => {}
        }
        self.state = State::Content;
        (reasoning, content)
    }

    fn emit_reasoning(&mut self, part: &str, reasoning: &mut String, content: &mut String) {
        if part.is_empty() {
            return;
        }
        if self.format == ReasoningFormat::DeepseekLegacy {
            if !self.reasoned {
                content.push_str(THINK_START);
            }
            content.push_str(part);
        }
        self.reasoned = true;
        reasoning.push_str(part);
    }
}

/// The length of the longest proper prefix of `tag` that `text` ends with.
fn partial_suffix(text: &str, tag: &str) -> usize {
    (1..tag.len())
        .rev()
        .find(|&k| tag.is_char_boundary(k) && text.ends_with(&tag[..k]))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const FORMATS: [ReasoningFormat; 4] = [
        ReasoningFormat::None,
        ReasoningFormat::Auto,
        ReasoningFormat::Deepseek,
        ReasoningFormat::DeepseekLegacy,
    ];

    fn some(s: &str) -> Option<String> {
        Some(s.to_string())
    }

    #[test]
    fn splits_a_think_block() {
        let text = "<think>\nLet me see.\n</think>\n\nIt is 4.";
        let d = ReasoningFormat::Deepseek;
        assert_eq!(
            split_reasoning(text, d, false),
            (some("Let me see."), "It is 4.".into())
        );
        assert_eq!(
            split_reasoning(text, ReasoningFormat::Auto, false),
            (some("Let me see."), "It is 4.".into())
        );
        assert_eq!(
            split_reasoning(text, ReasoningFormat::None, false),
            (None, text.into())
        );
        assert_eq!(
            split_reasoning(text, ReasoningFormat::DeepseekLegacy, false),
            (
                some("Let me see."),
                "<think>Let me see.</think>It is 4.".into()
            )
        );
        // Opened by the prompt: the reply starts inside the block.
        assert_eq!(
            split_reasoning("Hmm.\n</think>\nDone", d, true),
            (some("Hmm."), "Done".into())
        );
        // Unclosed: all reasoning.
        assert_eq!(
            split_reasoning("<think>still going", d, false),
            (some("still going"), String::new())
        );
        assert_eq!(
            split_reasoning("still going", ReasoningFormat::DeepseekLegacy, true),
            (some("still going"), "<think>still going".into())
        );
        // Empty reasoning is none; no block is all content.
        assert_eq!(
            split_reasoning("<think>\n\n</think>\n\nHi", d, false),
            (None, "Hi".into())
        );
        assert_eq!(
            split_reasoning(" Plain <think>x</think>", d, false),
            (None, " Plain <think>x</think>".into())
        );
        assert_eq!(
            split_reasoning("  <think>a</think>b", d, false),
            (some("a"), "b".into())
        );
        assert_eq!(
            ReasoningFormat::parse("deepseek-legacy"),
            Some(ReasoningFormat::DeepseekLegacy)
        );
        assert_eq!(ReasoningFormat::parse("r1"), None);
    }

    /// Cutting the text into pieces of 1..=4 bytes (deterministically varied) streams to the same
    /// split as the whole: a tag emitted in part before it completed would land in the deltas.
    #[test]
    fn streaming_matches_the_whole_split() {
        let texts = [
            "<think>\nLet me see.\n</think>\n\nIt is 4.",
            "Hmm, 2+2 \n</think>  4 <think>",
            "  <thinking about it",
            "<thi",
            "<think>a</thin",
            "<think> é ü </think>\u{1F600} ok </think>",
            "no reasoning at all",
            "\n\n",
            "<think>\n\n</think>\n\nHi",
            "",
            "<think>x</think",
            "a </ b </th c</think>d",
        ];
        for text in texts {
            for format in FORMATS {
                for opened in [false, true] {
                    let whole = split_reasoning(text, format, opened);
                    for seed in 0..12usize {
                        let mut s = ReasoningStream::new(format, opened);
                        let (mut r, mut c) = (String::new(), String::new());
                        let mut rest = text;
                        let mut i = seed;
                        while !rest.is_empty() {
                            let mut n = (i % 4 + 1).min(rest.len());
                            while !rest.is_char_boundary(n) {
                                n += 1;
                            }
                            let (piece, tail) = rest.split_at(n);
                            let (dr, dc) = s.feed(piece);
                            r += &dr;
                            c += &dc;
                            rest = tail;
                            i = i.wrapping_mul(7).wrapping_add(3);
                        }
                        let (dr, dc) = s.finish();
                        r += &dr;
                        c += &dc;
                        let got = ((!r.is_empty()).then_some(r), c);
                        assert_eq!(
                            got, whole,
                            "{text:?} {format:?} opened={opened} seed={seed}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn streaming_emits_reasoning_before_the_block_closes() {
        let mut s = ReasoningStream::new(ReasoningFormat::Deepseek, false);
        assert_eq!(s.feed("<thi"), (String::new(), String::new()));
        assert_eq!(s.feed("nk>\nOne two "), ("One two".into(), String::new()));
        assert_eq!(s.feed("three</th"), (" three".into(), String::new()));
        assert_eq!(s.feed("ink>\n\nAns"), (String::new(), "Ans".into()));
        assert_eq!(s.feed("wer"), (String::new(), "wer".into()));
        assert_eq!(s.finish(), (String::new(), String::new()));
    }
}
