//! Request parsing on hand-made bodies: limits, prompts, lengths, samplers, slots.

use super::*;

fn limits() -> Limits {
    Limits {
        max_body: 1 << 20,
        n_ctx: 8,
        n_vocab: 100,
        n_slots: 2,
        n_predict: -1,
        seed: 5,
        sampler: SamplerParams::default(),
        ignore_eos: false,
        cache_prompt: true,
        dry_breakers: None,
        context_shift: false,
        n_keep: 0,
        cache_reuse: 0,
    }
}

fn status(e: &ServerError) -> u16 {
    e.status().as_u16()
}

#[test]
fn slot_filenames_cannot_leave_the_store() {
    for bad in ["", "../x", "a/b", "/abs", "a\\b", "..", ".hidden", "a..b"] {
        assert!(check_filename(bad).is_err(), "{bad:?} was accepted");
    }
    for good in ["chat1", "agent.v2", "a-b_c"] {
        assert!(check_filename(good).is_ok(), "{good:?} was refused");
    }
}

#[test]
fn a_body_over_the_limit_is_413_and_bad_json_is_400() {
    let small = Limits {
        max_body: 10,
        ..limits()
    };
    let e = tokenize(br#"{"content": "too long"}"#, &small).unwrap_err();
    assert_eq!(status(&e), 413);
    let e = tokenize(br#"{"content": 1}"#, &limits()).unwrap_err();
    assert!(matches!(e, ServerError::BadJson { .. }), "{e}");
}

#[test]
fn the_length_field_that_wins_depends_on_the_endpoint() {
    let body = br#"{"prompt": [1, 2], "max_tokens": 3, "n_predict": 4}"#;
    let openai = completion(body, &limits(), CompletionApi::OpenAi).unwrap();
    let native = completion(body, &limits(), CompletionApi::Native).unwrap();
    assert_eq!(openai.params.max_tokens, 3);
    assert_eq!(native.params.max_tokens, 4);
    assert_eq!(native.prompts, [vec![Piece::Token(1), Piece::Token(2)]]);
    // Unset and negative lengths fall back to the server's default (-1: no limit).
    let chat = chat(
        br#"{"messages": [{"role": "user"}], "max_tokens": -3}"#,
        &limits(),
    )
    .unwrap();
    assert_eq!(chat.params.max_tokens, usize::MAX);
    assert_eq!(chat.params.sampler.seed, 5);
}

#[test]
fn token_prompts_and_slots_are_checked_against_the_server() {
    let l = limits();
    for (body, code) in [
        (&br#"{"prompt": []}"#[..], 400),
        (br#"{"prompt": [100]}"#, 400),
        (br#"{"prompt": [["a"], [100]]}"#, 400),
        (br#"{"prompt": [1, {"x": 1}]}"#, 400),
        (br#"{"prompt": "x", "id_slot": 2}"#, 400),
        (
            br#"{"prompt": {"prompt_string": "x", "multimodal_data": ["AA=="]}}"#,
            501,
        ),
        (
            br#"{"prompt": "x", "lora": [{"id": 0, "scale": 1.0}]}"#,
            501,
        ),
        (
            br#"{"prompt": "x", "response_format": {"type": "json_schema"}}"#,
            400,
        ),
    ] {
        let e = completion(body, &l, CompletionApi::Native).unwrap_err();
        assert_eq!(status(&e), code, "{e}");
    }
    assert!(detokenize(br#"{"tokens": [99, 100]}"#, &l).is_err());
    assert_eq!(detokenize(br#"{"tokens": [99]}"#, &l).unwrap(), vec![99]);
    assert!(matches!(
        slot_action("1", Some("erase"), b"", &l),
        Ok((1, SlotAction::Erase))
    ));
    assert!(slot_action("2", Some("erase"), b"", &l).is_err());
    assert!(slot_action("0", Some("save"), br#"{"filename": "../x"}"#, &l).is_err());
    assert!(slot_action("0", None, b"", &l).is_err());
}

#[test]
fn prompts_are_read_as_llama_server_reads_them() {
    let l = limits();
    let read = |body: &str| {
        completion(body.as_bytes(), &l, CompletionApi::Native)
            .unwrap()
            .prompts
    };
    let t = |s: &str| Piece::Text(s.to_owned());
    assert_eq!(read(r#"{"prompt": "a"}"#), [vec![t("a")]]);
    assert_eq!(
        read(r#"{"prompt": ["a", "b"]}"#),
        [vec![t("a")], vec![t("b")]]
    );
    // A top-level id makes one mixed prompt.
    assert_eq!(
        read(r#"{"prompt": [1, "a", 2]}"#),
        [vec![Piece::Token(1), t("a"), Piece::Token(2)]]
    );
    assert_eq!(
        read(r#"{"prompt": [[1, 2], "a", {"prompt_string": "b"}]}"#),
        [
            vec![Piece::Token(1), Piece::Token(2)],
            vec![t("a")],
            vec![t("b")]
        ]
    );
}

#[test]
fn requests_cannot_set_values_the_sampler_refuses() {
    for body in [
        r#"{"prompt": "x", "top_p": -3}"#,
        r#"{"prompt": "x", "min_p": 7}"#,
        r#"{"prompt": "x", "repeat_penalty": 0}"#,
    ] {
        let e = completion(body.as_bytes(), &limits(), CompletionApi::Native).unwrap_err();
        assert_eq!(status(&e), 400, "{body}: {e}");
    }
    // `n_predict: 0` asks for nothing, and the server's `-n` is the default of requests.
    let zero = completion(
        br#"{"prompt": "x", "n_predict": 0}"#,
        &limits(),
        CompletionApi::Native,
    )
    .unwrap();
    assert_eq!(zero.params.max_tokens, 0);
    let four = Limits {
        n_predict: 4,
        ..limits()
    };
    let r = completion(br#"{"prompt": "x"}"#, &four, CompletionApi::Native).unwrap();
    assert_eq!(r.params.max_tokens, 4);
    let r = completion(
        br#"{"prompt": "x", "n_predict": 9}"#,
        &four,
        CompletionApi::Native,
    )
    .unwrap();
    assert_eq!(r.params.max_tokens, 9);
}

#[test]
fn sampling_values_past_f32_are_refused() {
    // 1e39 is a valid JSON number but no finite f32: it would reach the sampler as infinity.
    for field in [
        "temperature",
        "top_p",
        "min_p",
        "repeat_penalty",
        "frequency_penalty",
        "presence_penalty",
    ] {
        for value in ["1e39", "-1e39"] {
            let body = format!(r#"{{"prompt": "x", "{field}": {value}}}"#);
            let e = completion(body.as_bytes(), &limits(), CompletionApi::OpenAi).unwrap_err();
            assert_eq!(status(&e), 400, "{field} = {value}: {e}");
            assert!(e.to_string().contains(field), "{e}");
        }
    }
    let ok = completion(
        br#"{"prompt": "x", "temperature": 3e38}"#,
        &limits(),
        CompletionApi::OpenAi,
    )
    .unwrap();
    assert_eq!(ok.params.sampler.temperature, 3e38);
}
