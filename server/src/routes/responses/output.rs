//! The response object and its output items (reasoning, message, function calls).

use serde_json::{json, Value};

use super::Asked;
use crate::routes::turn::{self, Parsed};
use crate::scheduler::{Finish, FinishReason};

/// The output items of a finished reply: reasoning, message, function calls.
pub(super) fn output_items(p: &Parsed, f: &Finish) -> Vec<Value> {
    let mut out = Vec::new();
    if !p.reasoning.is_empty() {
        out.push(reasoning_item(
            &turn::random_id("rs"),
            &p.reasoning,
            "completed",
        ));
    }
    let status = item_status(f);
    if !p.content.is_empty() || (out.is_empty() && p.calls.is_empty()) {
        out.push(message_item(&turn::random_id("msg"), &p.content, status));
    }
    for c in &p.calls {
        out.push(call_item(&c.id, &c.name, &c.arguments, "completed"));
    }
    out
}

pub(super) fn item_status(f: &Finish) -> &'static str {
    if f.reason == FinishReason::Length {
        "incomplete"
    } else {
        "completed"
    }
}

pub(super) fn output_text(text: &str) -> Value {
    json!({ "type": "output_text", "text": text, "annotations": [], "logprobs": [] })
}

pub(super) fn message_item(id: &str, text: &str, status: &str) -> Value {
    json!({
        "id": id,
        "type": "message",
        "role": "assistant",
        "status": status,
        "content": [output_text(text)],
    })
}

pub(super) fn reasoning_item(id: &str, text: &str, status: &str) -> Value {
    json!({
        "id": id,
        "type": "reasoning",
        "summary": [],
        "content": [{ "type": "reasoning_text", "text": text }],
        "status": status,
    })
}

pub(super) fn call_item(call_id: &str, name: &str, arguments: &str, status: &str) -> Value {
    json!({
        "id": format!("fc_{call_id}"),
        "type": "function_call",
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    })
}

/// What a response object holds besides its output.
pub(super) struct Head {
    pub(super) id: String,
    pub(super) created_at: u64,
    pub(super) model: String,
    pub(super) asked: Asked,
    /// The tenant the response is stored for ([`crate::routes::cache_admin::tenant`]).
    pub(super) tenant: Option<String>,
}

impl Head {
    /// The response object: in progress until `finish` is known.
    pub(super) fn response(&self, output: &[Value], finish: Option<&Finish>) -> Value {
        let mut v = json!({
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": "in_progress",
            "error": null,
            "incomplete_details": null,
            "model": self.model,
            "output": output,
            "previous_response_id": self.asked.previous,
            "usage": null,
        });
        if let Some(o) = v.as_object_mut() {
            for (k, e) in &self.asked.echo {
                o.insert(k.clone(), e.clone());
            }
        }
        if let Some(f) = finish {
            let incomplete = f.reason == FinishReason::Length;
            v["status"] = json!(if incomplete {
                "incomplete"
            } else {
                "completed"
            });
            v["completed_at"] = json!(kvstore::unix_now());
            if incomplete {
                v["incomplete_details"] = json!({ "reason": "max_output_tokens" });
            }
            v["usage"] = json!({
                "input_tokens": f.n_prompt,
                "input_tokens_details": { "cached_tokens": f.cache_n },
                "output_tokens": f.predicted_n,
                "output_tokens_details": { "reasoning_tokens": 0 },
                "total_tokens": f.n_prompt + f.predicted_n,
            });
        }
        v
    }
}
