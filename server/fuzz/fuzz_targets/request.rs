//! Arbitrary bytes as each kind of request body: parsing never panics, and gives either an
//! error that answers 400 or 413 or a request whose values keep the bounds `server::request`
//! promises.
//!
//! Input: a byte choosing the endpoint, a byte choosing the limits, then the body. For
//! `/slots/{id}`, the body is preceded by the path's id and the query's action, each ended by
//! a 0 byte (an action of `-` stands for no `?action=`).

#![no_main]

use libfuzzer_sys::fuzz_target;
use server::request::{self, CompletionApi, Limits, Piece, MAX_FILENAME};
use server::scheduler::{GenParams, SlotAction};
use server::ServerError;

fn check_error(e: &ServerError, limits: &Limits, len: usize) {
    let status = e.status().as_u16();
    assert!(matches!(status, 400 | 413 | 501), "{e} answers {status}");
    if status == 413 {
        assert!(len > limits.max_body, "{e} for a body of {len} bytes");
    }
}

fn check_params(p: &GenParams, limits: &Limits) {
    let s = &p.sampler;
    for (name, x) in [
        ("temperature", s.temperature),
        ("top_p", s.top_p),
        ("min_p", s.min_p),
        ("repeat_penalty", s.repeat_penalty),
        ("frequency_penalty", s.frequency_penalty),
        ("presence_penalty", s.presence_penalty),
    ] {
        assert!(x.is_finite(), "{name} = {x}");
    }
    if let Some(id) = p.id_slot {
        assert!(id < limits.n_slots);
    }
}

fn check_tokens(ids: &[u32], limits: &Limits) {
    assert!(ids.iter().all(|&id| (id as usize) < limits.n_vocab));
}

fn check_filename(name: &str) {
    assert!(!name.is_empty() && name.len() <= MAX_FILENAME, "{name:?}");
    assert!(!name.starts_with('.') && !name.contains(".."), "{name:?}");
    assert!(!name.contains(['/', '\\', '\0']), "{name:?}");
}

fn split0(data: &[u8]) -> (&[u8], &[u8]) {
    match data.iter().position(|&b| b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[][..]),
    }
}

fuzz_target!(|data: &[u8]| {
    let [endpoint, shape, body @ ..] = data else {
        return;
    };
    let limits = Limits {
        max_body: if shape & 0x80 != 0 { 64 } else { 8 << 20 },
        n_ctx: 2 + usize::from(shape & 0x0f),
        n_vocab: 1 + usize::from(shape >> 4 & 0x07) * 1000,
        n_slots: 1 + usize::from(shape & 0x03),
        n_predict: if shape & 0x40 != 0 { -1 } else { 16 },
        seed: if shape & 0x20 != 0 { -1 } else { 42 },
        sampler: request::SamplerParams::default(),
        ignore_eos: false,
        cache_prompt: true,
        dry_breakers: None,
    };
    match endpoint % 7 {
        0 => match request::chat(body, &limits) {
            Ok(r) => {
                assert!(!r.chat.messages.is_empty());
                check_params(&r.params, &limits);
            }
            Err(e) => check_error(&e, &limits, body.len()),
        },
        n @ (1 | 2) => {
            let api = if n == 1 {
                CompletionApi::OpenAi
            } else {
                CompletionApi::Native
            };
            match request::completion(body, &limits, api) {
                Ok(r) => {
                    check_params(&r.params, &limits);
                    assert!(!r.prompts.is_empty() && r.prompts.len() <= request::MAX_PROMPTS);
                    for prompt in &r.prompts {
                        assert!(!prompt.is_empty());
                        let ids: Vec<u32> = prompt
                            .iter()
                            .filter_map(|p| match p {
                                Piece::Token(id) => Some(*id),
                                Piece::Text(_) => None,
                            })
                            .collect();
                        check_tokens(&ids, &limits);
                    }
                }
                Err(e) => check_error(&e, &limits, body.len()),
            }
        }
        3 => {
            if let Err(e) = request::tokenize(body, &limits) {
                check_error(&e, &limits, body.len());
            }
        }
        4 => match request::detokenize(body, &limits) {
            Ok(ids) => check_tokens(&ids, &limits),
            Err(e) => check_error(&e, &limits, body.len()),
        },
        5 => match request::apply_template(body, &limits) {
            Ok(chat) => assert!(!chat.messages.is_empty()),
            Err(e) => check_error(&e, &limits, body.len()),
        },
        _ => {
            let (id, rest) = split0(body);
            let (action, body) = split0(rest);
            let id = String::from_utf8_lossy(id);
            let action = String::from_utf8_lossy(action);
            let action = (action != "-").then_some(&*action);
            match request::slot_action(&id, action, body, &limits) {
                Ok((slot, what)) => {
                    assert!(slot < limits.n_slots);
                    match what {
                        SlotAction::Save { name, .. } | SlotAction::Restore(name) => check_filename(&name),
                        SlotAction::Erase => {}
                    }
                }
                Err(e) => check_error(&e, &limits, body.len()),
            }
        }
    }
});
