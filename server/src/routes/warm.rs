//! Replies as clients send them back. Clients such as opencode and Open WebUI drop a reply's
//! reasoning (`reasoning_content`) from the history of their next turn, and templates such as
//! Qwen3's drop it from earlier turns themselves: either way the next prompt leaves the cached
//! conversation where the reply starts, and the reply would be computed again inside that
//! turn.
//!
//! After a reply with reasoning, the conversation is rendered as such a client sends it back
//! (the assistant message with its content and tool calls, no reasoning) and followed by a
//! placeholder message; the rendering is cut after its last control token before the
//! placeholder (the next turn's header, a clean tokenization boundary). That view is evaluated
//! into the cache in the request's namespace, as a job that generates nothing: only its tail,
//! the reply as the template renders it, is computed, on a fork of the resident sequence, so the
//! conversation as generated stays cached for clients that keep the reasoning. Its text and
//! tokens go to the text index, so the next turn's prompt takes exactly these tokens and finds
//! everything up to its new message in the cache.

use std::sync::Arc;

use engine::tokenizer::Tokenizer;
use serde_json::{json, Value};

use super::turn::Turn;
use super::{AppState, ClientKey};
use crate::metrics::Metrics;

/// Stands in for the next message's content: where it shows in the rendering, the view ends.
/// Private-use characters, which no template transforms.
const PLACEHOLDER: &str = "\u{e000}llama-hdd\u{e001}";

/// Starts the warm-up of `turn`'s finished reply `reply` (its text as generated) in the
/// background, when the reply had reasoning and the cache is in use; does nothing otherwise.
pub(super) fn after_reply(st: &Arc<AppState>, client: &ClientKey, turn: &Turn, reply: &str) {
    let chat = &turn.chat;
    let continues = chat.messages.last().and_then(|m| m.get("role")) == Some(&json!("assistant"));
    if st.config.args.no_warm_replies
        || !turn.params.cache_prompt
        || !chat.add_generation_prompt
        || continues
    {
        return;
    }
    let parsed = turn.read(reply);
    if parsed.reasoning.trim().is_empty() {
        return;
    }
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let mut message = json!({ "role": "assistant", "content": parsed.content });
    // The next message: the tool's answer after tool calls, else the user's.
    let next = match parsed.calls.first() {
        Some(call) => {
            if parsed.content.is_empty() {
                message["content"] = Value::Null;
            }
            message["tool_calls"] = parsed.calls.iter().map(|c| c.to_openai()).collect();
            json!({ "role": "tool", "tool_call_id": call.id, "content": PLACEHOLDER })
        }
        None => json!({ "role": "user", "content": PLACEHOLDER }),
    };
    let mut view = chat.clone();
    view.messages.push(message);
    view.messages.push(next);
    view.continue_final_message = Some(false);
    let job = Job {
        st: Arc::clone(st),
        client: *client,
        view,
        text: turn.text.clone(),
        prompt: turn.prompt.clone(),
        params: turn.params.clone(),
    };
    rt.spawn(job.run());
}

/// A warm-up: the conversation's view and the turn it follows.
struct Job {
    st: Arc<AppState>,
    client: ClientKey,
    /// The conversation as the client sends it back, then the placeholder message.
    view: crate::request::Chat,
    /// The turn's prompt and its tokens (the cached sequence starts with them).
    text: String,
    prompt: Vec<u32>,
    /// The turn's settings (its cache salt and lifetime).
    params: crate::scheduler::GenParams,
}

impl Job {
    /// Renders and tokenizes the view, remembers its tokens and evaluates it. A failure costs
    /// only the warm-up (the next turn computes the reply, as without it).
    async fn run(self) {
        let st = self.st;
        let Ok(rendered) = super::render_chat(&st, &self.view).await else {
            return;
        };
        let Some(at) = rendered.rfind(PLACEHOLDER) else {
            return;
        };
        let (text, prompt) = (self.text, self.prompt);
        let model = Arc::clone(&st.model);
        let cut = tokio::task::spawn_blocking(move || {
            view_tokens(model.tokenizer(), &text, &prompt, &rendered[..at])
        })
        .await;
        let Ok(Some((view, tokens))) = cut else {
            return;
        };
        super::generate::remember_text(&st, view, tokens.clone());
        let mut params = self.params;
        params.max_tokens = 0;
        params.warm = true;
        params.grammar = None;
        params.reasoning_budget = None;
        params.return_progress = false;
        params.n_probs = None;
        params.id_slot = None;
        params.cache_reuse = 0;
        params.t_max_predict_ms = None;
        params.stop.clear();
        let limits = st.limits();
        let Ok(runs) = super::generate::submit_all(
            &st,
            &self.client,
            &limits,
            std::slice::from_ref(&tokens),
            &params,
            1,
        ) else {
            return;
        };
        if let Ok(replies) = super::generate::collect_all(runs).await {
            let m = &st.metrics;
            Metrics::add(&m.replies_warmed, 1);
            for r in replies {
                Metrics::add(&m.reply_warm_tokens, r.finish.prompt_n as u64);
            }
        }
    }
}

/// The tokens of `view`, a rendering of the conversation that starts as the turn's prompt
/// `text` (evaluated as `prompt`) does: the prompt's tokens as far as the two agree (all of
/// them, or up to a control token), then the rest of `view` tokenized, up to and including its
/// last control token; with the text they spell. `None` when no control token ends a new part,
/// or when the tokens' bytes do not spell the text (a vocabulary that adds spaces of its own).
fn view_tokens(
    tok: &Tokenizer,
    text: &str,
    prompt: &[u32],
    view: &str,
) -> Option<(String, Vec<u32>)> {
    let (base, kept) = if view.starts_with(text) {
        (text.len(), prompt.len())
    } else {
        let common = text
            .bytes()
            .zip(view.bytes())
            .take_while(|(a, b)| a == b)
            .count();
        agreed(tok, text, prompt, common)?
    };
    let rest = tok.encode(view.get(base..)?, false, true).ok()?;
    let last = rest.iter().rposition(|&t| tok.is_control(t))?;
    let spelled: Vec<u8> = rest[..=last]
        .iter()
        .flat_map(|&t| tok.token_bytes(t).iter().copied())
        .collect();
    let end = base + spelled.len();
    if view.as_bytes().get(base..end) != Some(&spelled[..]) {
        return None;
    }
    let mut tokens = prompt[..kept].to_vec();
    tokens.extend_from_slice(&rest[..=last]);
    Some((view.get(..end)?.to_owned(), tokens))
}

/// The longest start of `prompt` that ends with a control token and spells at most the first
/// `within` bytes of `text`: its length in bytes and in tokens. A first control token that
/// `text` does not spell (a beginning of sequence the tokenizer added) spells nothing.
fn agreed(tok: &Tokenizer, text: &str, prompt: &[u32], within: usize) -> Option<(usize, usize)> {
    let bytes = text.as_bytes();
    let mut at = 0;
    let mut best = None;
    for (i, &t) in prompt.iter().enumerate() {
        let piece = tok.token_bytes(t);
        if bytes.get(at..at + piece.len()) == Some(piece) {
            at += piece.len();
        } else if !(i == 0 && tok.is_control(t)) {
            break;
        }
        if at > within {
            break;
        }
        if tok.is_control(t) {
            best = Some((at, i + 1));
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;
    use engine::testing::TinyChatModel;

    fn tokenizer() -> (tempfile::TempDir, Arc<engine::Model>) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tiny.gguf");
        TinyChatModel::default().write(&path).unwrap();
        let model = engine::Model::load(&path).unwrap();
        (dir, model)
    }

    #[test]
    fn a_view_keeps_the_prompts_tokens_and_ends_after_its_last_control_token() {
        let (_dir, model) = tokenizer();
        let tok = model.tokenizer();
        let text = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n";
        let prompt = tok.encode(text, true, true).unwrap();
        let view = format!("{text}Hello.<|im_end|>\n<|im_start|>user\n");
        let (cut, tokens) = view_tokens(tok, text, &prompt, &view).unwrap();
        assert_eq!(cut, format!("{text}Hello.<|im_end|>\n<|im_start|>"));
        assert_eq!(&tokens[..prompt.len()], &prompt[..]);
        assert_eq!(tokens, tok.encode(&cut, true, true).unwrap());

        // A prompt that opened a thinking block: the view agrees up to the assistant's header;
        // the prompt's tokens are kept up to its last control token there.
        let opened = format!("{text}<think>\n");
        let prompt = tok.encode(&opened, true, true).unwrap();
        let (cut2, tokens2) = view_tokens(tok, &opened, &prompt, &view).unwrap();
        assert_eq!(cut2, cut);
        assert_eq!(tokens2, tokens);
        let header = text.rfind("<|im_start|>").unwrap();
        let kept = tok.encode(&text[..header + 12], true, true).unwrap();
        assert_eq!(&tokens2[..kept.len()], &kept[..]);

        // No control token after the prompt: nothing to keep.
        assert!(view_tokens(tok, text, &prompt, &format!("{text}Hello")).is_none());
        // A view that agrees with nothing: odd input, no panic.
        assert!(view_tokens(tok, text, &prompt, "").is_none());
        assert!(view_tokens(tok, "", &[], "x<|im_end|>").is_some());
    }
}
