//! Streamed responses: the reply's pieces as Responses events, output items opened, filled
//! and closed one after the other.

use std::sync::Arc;
use std::time::Instant;

use engine::chat::tools::ToolCallEvent;
use serde_json::{json, Value};

use super::output::{call_item, item_status, message_item, output_text, reasoning_item, Head};
use super::store::{record, save};
use crate::error::ServerError;
use crate::routes::sse::Named;
use crate::routes::turn::{self, NamedStream, Piece};
use crate::routes::{shape, AppState};
use crate::scheduler::{Event, Progress};

/// The output item being streamed.
pub(super) enum Open {
    Reasoning {
        index: usize,
        id: String,
        text: String,
    },
    Message {
        index: usize,
        id: String,
        text: String,
    },
    Call {
        index: usize,
        call: usize,
        id: String,
        name: String,
        args: String,
    },
}

/// A streamed response: output items are opened, filled and closed one after the other.
pub(super) struct Stream {
    pub(super) seq: u64,
    pub(super) head: Head,
    pub(super) reader: turn::Reader,
    pub(super) started: bool,
    pub(super) items: Vec<Value>,
    pub(super) open: Option<Open>,
    pub(super) timings_per_token: bool,
    pub(super) n_prompt: usize,
    pub(super) t0: Instant,
    pub(super) first_token: Option<Instant>,
    pub(super) n_generated: usize,
    pub(super) progress: Option<Progress>,
    pub(super) conversation: Vec<Value>,
}

impl NamedStream for Stream {
    fn reader(&mut self) -> &mut turn::Reader {
        &mut self.reader
    }

    fn event(&mut self, ev: Event, st: &Arc<AppState>) -> Vec<Named> {
        let mut out = Vec::new();
        if !self.started {
            self.started = true;
            let r = self.head.response(&[], None);
            self.push(&mut out, "response.created", json!({ "response": r }));
            self.push(&mut out, "response.in_progress", json!({ "response": r }));
        }
        match ev {
            Event::Progress(p) => {
                self.progress = Some(p);
                let r = self.head.response(&[], None);
                let mut data = json!({ "response": r });
                data["prompt_progress"] = shape::progress(&p);
                self.push(&mut out, "response.in_progress", data);
            }
            Event::Text(chunk) => {
                self.first_token.get_or_insert_with(Instant::now);
                self.n_generated += chunk.tokens.len();
                self.feed(&chunk.text, &mut out);
            }
            Event::Done(f) => {
                self.finish(&mut out);
                if self.items.is_empty() && self.open.is_none() {
                    self.open_message(&mut out);
                }
                self.close(&mut out, item_status(&f));
                let response = self.head.response(&self.items, Some(&*f));
                if self.head.asked.store {
                    let mut conversation = std::mem::take(&mut self.conversation);
                    conversation.extend(self.items.iter().cloned());
                    let record = record(&response, conversation, self.head.tenant.as_deref());
                    if let Err(e) = save(st, &self.head.id, &record) {
                        let e = ServerError::Io {
                            what: "storing the response".into(),
                            source: e,
                        };
                        self.error(&mut out, &e);
                        return out;
                    }
                }
                let mut data = json!({ "response": response });
                data["timings"] = shape::timings(&f);
                self.push(&mut out, "response.completed", data);
            }
            Event::Failed(e) => self.error(&mut out, &e),
        }
        out
    }

    fn pieces(&mut self, pieces: Vec<Piece>, out: &mut Vec<Named>) {
        for p in pieces {
            match p {
                Piece::Reasoning(s) => {
                    if !matches!(self.open, Some(Open::Reasoning { .. })) {
                        self.close(out, "completed");
                        let index = self.items.len();
                        let id = turn::random_id("rs");
                        let item = json!({ "id": id, "type": "reasoning", "summary": [], "content": [], "status": "in_progress" });
                        self.push(
                            out,
                            "response.output_item.added",
                            json!({ "output_index": index, "item": item }),
                        );
                        self.open = Some(Open::Reasoning {
                            index,
                            id,
                            text: String::new(),
                        });
                    }
                    let data = match &mut self.open {
                        Some(Open::Reasoning { index, id, text }) => {
                            text.push_str(&s);
                            json!({ "item_id": id, "output_index": index, "content_index": 0, "delta": s })
                        }
                        _ => continue,
                    };
                    self.push(out, "response.reasoning_text.delta", data);
                }
                Piece::Reply(ToolCallEvent::Content(s)) => {
                    if !matches!(self.open, Some(Open::Message { .. })) {
                        self.open_message(out);
                    }
                    let timings = self.timings_per_token.then(|| self.live_timings());
                    let mut data = match &mut self.open {
                        Some(Open::Message { index, id, text }) => {
                            text.push_str(&s);
                            json!({ "item_id": id, "output_index": index, "content_index": 0, "delta": s, "logprobs": [] })
                        }
                        _ => continue,
                    };
                    if let Some(t) = timings {
                        data["timings"] = t;
                    }
                    self.push(out, "response.output_text.delta", data);
                }
                Piece::Reply(ToolCallEvent::CallStart {
                    index: call,
                    id,
                    name,
                }) => {
                    self.close(out, "completed");
                    let index = self.items.len();
                    let item = call_item(&id, &name, "", "in_progress");
                    self.push(
                        out,
                        "response.output_item.added",
                        json!({ "output_index": index, "item": item }),
                    );
                    self.open = Some(Open::Call {
                        index,
                        call,
                        id,
                        name,
                        args: String::new(),
                    });
                }
                Piece::Reply(ToolCallEvent::Arguments {
                    index: which,
                    fragment,
                }) => {
                    let data = match &mut self.open {
                        Some(Open::Call {
                            index,
                            call,
                            id,
                            args,
                            ..
                        }) if *call == which => {
                            args.push_str(&fragment);
                            json!({ "item_id": format!("fc_{id}"), "output_index": index, "delta": fragment })
                        }
                        _ => continue,
                    };
                    self.push(out, "response.function_call_arguments.delta", data);
                }
            }
        }
    }
}

impl Stream {
    fn push(&mut self, out: &mut Vec<Named>, name: &'static str, mut data: Value) {
        data["type"] = json!(name);
        data["sequence_number"] = json!(self.seq);
        self.seq += 1;
        out.push((name, data));
    }

    fn error(&mut self, out: &mut Vec<Named>, e: &ServerError) {
        let data = json!({ "code": e.kind(), "message": e.to_string(), "param": null });
        self.push(out, "error", data);
    }

    /// Timings so far, measured here (llama-server's `timings_per_token`).
    fn live_timings(&self) -> Value {
        let now = Instant::now();
        let first = self.first_token.unwrap_or(now);
        let (prompt_n, cache_n) = match self.progress {
            Some(p) => (p.processed.saturating_sub(p.cache), p.cache),
            None => (self.n_prompt, 0),
        };
        let prompt_ms = first.duration_since(self.t0).as_secs_f64() * 1e3;
        let predicted_ms = now.duration_since(first).as_secs_f64() * 1e3;
        let rate = |n: usize, ms: f64| if ms > 0.0 { n as f64 * 1e3 / ms } else { 0.0 };
        json!({
            "cache_n": cache_n,
            "prompt_n": prompt_n,
            "prompt_ms": prompt_ms,
            "prompt_per_second": rate(prompt_n, prompt_ms),
            "predicted_n": self.n_generated,
            "predicted_ms": predicted_ms,
            "predicted_per_second": rate(self.n_generated.saturating_sub(1), predicted_ms),
        })
    }

    fn open_message(&mut self, out: &mut Vec<Named>) {
        self.close(out, "completed");
        let index = self.items.len();
        let id = turn::random_id("msg");
        let item = json!({ "id": id, "type": "message", "role": "assistant", "status": "in_progress", "content": [] });
        self.push(
            out,
            "response.output_item.added",
            json!({ "output_index": index, "item": item }),
        );
        let part = json!({ "type": "output_text", "text": "", "annotations": [] });
        let data =
            json!({ "item_id": id, "output_index": index, "content_index": 0, "part": part });
        self.push(out, "response.content_part.added", data);
        self.open = Some(Open::Message {
            index,
            id,
            text: String::new(),
        });
    }

    /// Closes the open item; a message takes `status` (incomplete when cut by the length).
    fn close(&mut self, out: &mut Vec<Named>, status: &str) {
        let item = match self.open.take() {
            None => return,
            Some(Open::Reasoning { index, id, text }) => {
                let data = json!({ "item_id": id, "output_index": index, "content_index": 0, "text": text });
                self.push(out, "response.reasoning_text.done", data);
                (index, reasoning_item(&id, &text, "completed"))
            }
            Some(Open::Message { index, id, text }) => {
                let data = json!({ "item_id": id, "output_index": index, "content_index": 0, "text": text, "logprobs": [] });
                self.push(out, "response.output_text.done", data);
                let data = json!({ "item_id": id, "output_index": index, "content_index": 0, "part": output_text(&text) });
                self.push(out, "response.content_part.done", data);
                (index, message_item(&id, &text, status))
            }
            Some(Open::Call {
                index,
                id,
                name,
                args,
                ..
            }) => {
                let data = json!({ "item_id": format!("fc_{id}"), "output_index": index, "name": name, "arguments": args });
                self.push(out, "response.function_call_arguments.done", data);
                (index, call_item(&id, &name, &args, "completed"))
            }
        };
        let (index, item) = item;
        self.push(
            out,
            "response.output_item.done",
            json!({ "output_index": index, "item": item }),
        );
        self.items.push(item);
    }
}
