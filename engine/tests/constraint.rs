//! Constrained decoding (`engine::constraint`): masks checked token by token against
//! hand-written recognizers on a tiny vocabulary, and generations of the real model that must
//! parse.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use engine::constraint::{Constraint, Grammar, Vocab};
use engine::sampling::{Sampler, SamplerParams};
use engine::testing::{SplitMix64, TinyChatModel};
use engine::tokenizer::Tokenizer;
use engine::{ContextParams, Error, Model, Session};

/// The tiny chat model's tokenizer: the 256 byte tokens, the 64 pairs of `a`-`h`, then
/// `<|im_start|>` and `<|im_end|>` (EOS).
fn tiny_model() -> Arc<Model> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    TinyChatModel {
        letter_merges: true,
        ..Default::default()
    }
    .write(&path)
    .unwrap();
    Model::load(&path).unwrap()
}

fn allowed(c: &mut Constraint, n: usize) -> Vec<u32> {
    let mut logits = vec![0.0f32; n];
    c.mask_logits(&mut logits).unwrap();
    (0..n as u32)
        .filter(|&t| logits[t as usize] == 0.0)
        .collect()
}

fn id(tok: &Tokenizer, text: &str) -> u32 {
    tok.token_id(text)
        .unwrap_or_else(|| panic!("no token {text:?}"))
}

fn gbnf(vocab: &Arc<Vocab>, text: &str) -> Constraint {
    Constraint::new(vocab, &Grammar::Gbnf(text.to_string())).unwrap()
}

/// A server shares one `Vocab` between threads and moves constraints between them.
#[test]
fn vocab_is_shared_and_constraints_move_between_threads() {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}
    send_sync::<Vocab>();
    send::<Constraint>();
    let model = tiny_model();
    let vocab = Vocab::new(model.tokenizer()).unwrap();
    let c = gbnf(&vocab, r#"root ::= "a""#);
    let n = model.tokenizer().n_vocab();
    let got = std::thread::spawn(move || {
        let mut c = c;
        allowed(&mut c, n)
    })
    .join()
    .unwrap();
    assert_eq!(got, vec![id(model.tokenizer(), "a")]);
}

#[test]
fn yes_no_mask_is_exact_on_a_byte_vocabulary() {
    let model = tiny_model();
    let tok = model.tokenizer();
    let vocab = Vocab::new(tok).unwrap();
    let n = tok.n_vocab();
    let im_end = id(tok, "<|im_end|>");
    assert_eq!(vocab.eog_tokens(), &[im_end]);

    let mut c = gbnf(&vocab, r#"root ::= ("yes" | "no")"#);
    assert_eq!(allowed(&mut c, n), vec![id(tok, "n"), id(tok, "y")]);
    assert!(!c.can_end());
    assert!(!c.is_allowed(im_end).unwrap());
    c.accept(id(tok, "y")).unwrap();
    assert_eq!(allowed(&mut c, n), vec![id(tok, "e")]);
    c.accept(id(tok, "e")).unwrap();
    assert!(!c.is_done());
    assert_eq!(allowed(&mut c, n), vec![id(tok, "s")]);
    c.accept(id(tok, "s")).unwrap();
    assert!(c.is_done());
    assert!(c.can_end());
    assert_eq!(allowed(&mut c, n), vec![im_end]);
    c.accept(im_end).unwrap();
    assert!(c.is_done());
}

#[test]
fn a_disallowed_token_is_an_error() {
    let model = tiny_model();
    let tok = model.tokenizer();
    let vocab = Vocab::new(tok).unwrap();
    let mut c = gbnf(&vocab, r#"root ::= "yes" | "no""#);
    assert!(!c.is_allowed(id(tok, "x")).unwrap());
    assert!(c.is_allowed(id(tok, "y")).unwrap());
    let err = c.accept(id(tok, "x")).unwrap_err();
    assert!(matches!(err, Error::Grammar(_)), "{err}");
    assert!(c.error().is_some());
    // EOS before the grammar may end is refused too.
    let mut c = gbnf(&vocab, r#"root ::= "yes" | "no""#);
    assert!(c.accept(id(tok, "<|im_end|>")).is_err());
    // So is a token past the vocabulary.
    let mut c = gbnf(&vocab, r#"root ::= "yes" | "no""#);
    assert!(c.accept(tok.n_vocab() as u32).is_err());
}

#[test]
fn padding_logits_past_the_vocabulary_are_masked() {
    let model = tiny_model();
    let tok = model.tokenizer();
    let vocab = Vocab::new(tok).unwrap();
    let mut c = gbnf(&vocab, "root ::= [^x]");
    let n = tok.n_vocab();
    let mut logits = vec![1.0f32; n + 40];
    c.mask_logits(&mut logits).unwrap();
    assert!(logits[n..].iter().all(|l| *l == f32::NEG_INFINITY));
    assert_eq!(logits[id(tok, "a") as usize], 1.0);
    assert_eq!(logits[id(tok, "x") as usize], f32::NEG_INFINITY);
    // Control tokens are never text.
    assert_eq!(logits[id(tok, "<|im_start|>") as usize], f32::NEG_INFINITY);
}

/// Whether `s` starts a word of `[` d+ (`,` ` `? d+)* `]` (d a digit), and whether it is one.
fn digit_list(s: &[u8]) -> (bool, bool) {
    // States: 0 before `[`, 1 after `[` or `,` or `, `, 2 in a number, 3 after `,`, 4 done.
    let mut state = 0;
    for &b in s {
        state = match (state, b) {
            (0, b'[') => 1,
            (1, b'0'..=b'9') | (2, b'0'..=b'9') | (3, b'0'..=b'9') => 2,
            (2, b',') => 3,
            (3, b' ') => 1,
            (2, b']') => 4,
            _ => return (false, false),
        };
    }
    (true, state == 4)
}

/// Whether `s` starts a word of `[a-h]{2,5} "!"?`, and whether it is one (the letters merge).
fn letters(s: &[u8]) -> (bool, bool) {
    let n = s.iter().take_while(|b| (b'a'..=b'h').contains(b)).count();
    let rest = &s[n..];
    if n > 5 {
        return (false, false);
    }
    match rest {
        [] => (true, n >= 2),
        [b'!'] => (n >= 2, n >= 2),
        _ => (false, false),
    }
}

/// Random walks through a grammar: at each step the mask must be exactly the tokens the
/// recognizer accepts after the text so far, and EOS exactly when the text is complete.
fn check_walks(grammar: &str, recognize: fn(&[u8]) -> (bool, bool), walks: u64) {
    let model = tiny_model();
    let tok = model.tokenizer();
    let vocab = Vocab::new(tok).unwrap();
    let n = tok.n_vocab();
    let im_end = id(tok, "<|im_end|>");
    let mut rng = SplitMix64(7);
    let mut finished = 0;
    for _ in 0..walks {
        let mut c = gbnf(&vocab, grammar);
        let mut text = Vec::new();
        for _ in 0..40 {
            let got = allowed(&mut c, n);
            let want: Vec<u32> = (0..n as u32)
                .filter(|&t| {
                    if t == im_end {
                        return recognize(&text).1;
                    }
                    let bytes = tok.visible_bytes(t);
                    if bytes.is_empty() {
                        return false;
                    }
                    let mut s = text.clone();
                    s.extend_from_slice(bytes);
                    recognize(&s).0
                })
                .collect();
            assert_eq!(got, want, "after {:?}", String::from_utf8_lossy(&text));
            assert!(!got.is_empty());
            // Prefer ending a third of the time it is possible, so that walks both end and grow.
            let t = if got.contains(&im_end) && rng.next_u64().is_multiple_of(3) {
                im_end
            } else {
                got[(rng.next_u64() % got.len() as u64) as usize]
            };
            for other in [t, got[0]] {
                assert!(c.is_allowed(other).unwrap());
            }
            c.accept(t).unwrap();
            if t == im_end {
                finished += 1;
                break;
            }
            text.extend_from_slice(tok.visible_bytes(t));
            if c.is_done() {
                assert_eq!(allowed(&mut c, n), vec![im_end]);
                assert!(recognize(&text).1);
                finished += 1;
                break;
            }
        }
    }
    assert!(finished > walks / 2, "{finished} of {walks} walks ended");
}

#[test]
fn digit_list_masks_match_a_recognizer() {
    check_walks(
        r#"root ::= "[" num ("," " "? num)* "]"
num ::= [0-9]+ # one or more digits"#,
        digit_list,
        12,
    );
}

#[test]
fn merged_letter_tokens_respect_repetition_bounds() {
    check_walks(r#"root ::= [a-h]{2,5} "!"?"#, letters, 12);
}

/// Feeds a string's byte tokens one by one; true when every one was accepted.
fn accepts_bytes(c: &mut Constraint, tok: &Tokenizer, s: &str) -> bool {
    s.bytes().all(|b| {
        let t = id(
            tok,
            &engine::testing::byte_alphabet()[b as usize].to_string(),
        );
        c.accept(t).is_ok()
    })
}

#[test]
fn gbnf_is_matched_by_character_not_by_greedy_lexemes() {
    let model = tiny_model();
    let tok = model.tokenizer();
    let vocab = Vocab::new(tok).unwrap();
    // A greedy lexer would take "ab" and then fail on "c".
    let mut c = gbnf(&vocab, r#"root ::= ("a" | "ab") "bc""#);
    assert!(accepts_bytes(&mut c, tok, "abc"));
    assert!(c.is_done());
    let mut c = gbnf(&vocab, "root ::= word \"s\"\nword ::= [a-z]+");
    assert!(accepts_bytes(&mut c, tok, "cats"));
    assert!(c.can_end());
    assert!(!c.is_done(), "`catss` may still follow");
    // Escapes, `.`, negated classes and bounded repetition.
    let mut c = gbnf(&vocab, r#"root ::= "\x41\u0042\"\\" . [^a-z]{2} "\t""#);
    assert!(accepts_bytes(&mut c, tok, "AB\"\\\n#Z\t"));
    assert!(c.is_done());
    let mut c = gbnf(&vocab, r#"root ::= "x" [^a-z]"#);
    assert!(!accepts_bytes(&mut c, tok, "xq"));
    // A token reference by text.
    let mut c = gbnf(&vocab, r#"root ::= <|im_start|> "x""#);
    assert_eq!(
        allowed(&mut c, tok.n_vocab()),
        vec![id(tok, "<|im_start|>")]
    );
}

#[test]
fn llguidance_lark_is_accepted_after_its_marker() {
    let model = tiny_model();
    let tok = model.tokenizer();
    let vocab = Vocab::new(tok).unwrap();
    for g in [
        Grammar::Gbnf("%llguidance {}\nstart: \"ok\" | /[0-9]+/\n".into()),
        Grammar::Lark("start: \"ok\" | /[0-9]+/".into()),
    ] {
        let mut c = Constraint::new(&vocab, &g).unwrap();
        let got = allowed(&mut c, tok.n_vocab());
        let mut want: Vec<u32> = "0123456789o"
            .chars()
            .map(|ch| id(tok, &ch.to_string()))
            .collect();
        want.sort_unstable();
        assert_eq!(got, want, "{g:?}");
    }
}

#[test]
fn malformed_grammars_are_typed_errors() {
    let model = tiny_model();
    let vocab = Vocab::new(model.tokenizer()).unwrap();
    let cases = [
        (Grammar::Gbnf("root ::= \"abc".into()), "line 1, column 10"),
        (
            Grammar::Gbnf("root ::= item\nitem ::= (\"a\" | \"b\"".into()),
            "rule `item`",
        ),
        (
            Grammar::Gbnf("root ::= missing".into()),
            "undefined rule `missing`",
        ),
        (Grammar::Gbnf("item ::= \"a\"".into()), "no `root` rule"),
        (Grammar::Gbnf("root ::= <|nope|>".into()), "not a token"),
        (Grammar::Lark("start: (".into()), "Expected token"),
        (
            Grammar::Gbnf("%llguidance {}\nstart: foo".into()),
            "unknown name",
        ),
        (
            Grammar::JsonSchema(serde_json::json!({"type": "object", "required": 3})),
            "required",
        ),
        (
            Grammar::JsonSchema(serde_json::json!({"type": "integer", "minimum": 5, "maximum": 1})),
            "Unsatisfiable",
        ),
    ];
    for (g, what) in cases {
        match Constraint::new(&vocab, &g) {
            Err(Error::Grammar(msg)) => {
                eprintln!("{msg}");
                assert!(msg.contains(what), "{g:?}: {msg}");
            }
            other => panic!("{g:?}: {other:?}"),
        }
    }
}

#[test]
fn json_schema_walks_on_a_byte_vocabulary_give_valid_json() {
    let model = tiny_model();
    let tok = model.tokenizer();
    let vocab = Vocab::new(tok).unwrap();
    let im_end = id(tok, "<|im_end|>");
    let schema = serde_json::json!({
        "type": "object",
        "properties": {
            "k": {"enum": ["ab", "cd"]},
            "n": {"type": "integer", "minimum": 0, "maximum": 99}
        },
        "required": ["k", "n"],
        "additionalProperties": false
    });
    let mut rng = SplitMix64(3);
    for walk in 0..10 {
        let grammar = if walk % 2 == 0 {
            Grammar::JsonSchema(schema.clone())
        } else {
            Grammar::JsonObject
        };
        let mut c = Constraint::new(&vocab, &grammar).unwrap();
        let mut text = Vec::new();
        let mut ended = false;
        for _ in 0..400 {
            let got = allowed(&mut c, tok.n_vocab());
            // Close objects as soon as possible, to keep `JsonObject` walks short: prefer `}`,
            // `]` and `"` (short keys, strings) over anything else half of the time.
            let pick = ["}", "]", "\""].iter().find_map(|s| {
                let t = id(tok, s);
                (got.contains(&t) && rng.next_u64().is_multiple_of(2)).then_some(t)
            });
            let t = if got.contains(&im_end) {
                im_end
            } else {
                pick.unwrap_or_else(|| got[(rng.next_u64() % got.len() as u64) as usize])
            };
            c.accept(t).unwrap();
            if t == im_end {
                ended = true;
                break;
            }
            text.extend_from_slice(tok.visible_bytes(t));
        }
        assert!(ended, "walk {walk}: {:?}", String::from_utf8_lossy(&text));
        let v: serde_json::Value = serde_json::from_slice(&text)
            .unwrap_or_else(|e| panic!("{e}: {:?}", String::from_utf8_lossy(&text)));
        let obj = v.as_object().expect("an object");
        if walk % 2 == 0 {
            assert!(["ab", "cd"].contains(&obj["k"].as_str().unwrap()), "{v}");
            assert!(obj["n"].as_u64().unwrap() <= 99, "{v}");
            assert_eq!(obj.len(), 2, "{v}");
        }
    }
}

// ---- the real model ----

const CHAT: &str = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n";

struct Real {
    session: Session,
    vocab: Arc<Vocab>,
}

fn real() -> Option<Real> {
    let path = common::real_model_path()?;
    let model = Model::load(&path).unwrap();
    let vocab = Vocab::new(model.tokenizer()).unwrap();
    let session = Session::new(
        model,
        ContextParams {
            n_ctx: 1024,
            ..Default::default()
        },
    )
    .unwrap();
    Some(Real { session, vocab })
}

/// Timings of one constrained generation.
#[derive(Default)]
struct Cost {
    tokens: usize,
    constraint: Duration,
    sample: Duration,
}

/// Generates from `prompt` under `grammar` until the grammar is done or an end-of-generation
/// token, at most `max_tokens`; the text and whether it ended.
fn generate(
    r: &mut Real,
    prompt: &str,
    grammar: &Grammar,
    sampler: &mut Sampler,
    max_tokens: usize,
    cost: &mut Cost,
) -> (String, bool) {
    r.session.truncate(0).unwrap();
    let mut logits = r.session.feed_text(prompt).unwrap().to_vec();
    let mut c = Constraint::new(&r.vocab, grammar).unwrap();
    let mut out = Vec::new();
    let model = r.session.model().clone();
    let tok = model.tokenizer();
    for _ in 0..max_tokens {
        let t0 = Instant::now();
        c.mask_logits(&mut logits).unwrap();
        let t1 = Instant::now();
        let token = sampler.sample(&logits, r.session.tokens());
        let t2 = Instant::now();
        c.accept(token).unwrap();
        let t3 = Instant::now();
        cost.tokens += 1;
        cost.constraint += (t1 - t0) + (t3 - t2);
        cost.sample += t2 - t1;
        if tok.is_eog(token) {
            return (String::from_utf8(out).unwrap(), true);
        }
        out.extend_from_slice(tok.token_bytes(token));
        if c.is_done() {
            return (String::from_utf8(out).unwrap(), true);
        }
        logits = r.session.feed(&[token]).unwrap().to_vec();
    }
    (String::from_utf8_lossy(&out).into_owned(), false)
}

fn person_schema() -> serde_json::Value {
    serde_json::json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "minLength": 1, "maxLength": 24},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "color": {"enum": ["red", "green", "blue"]},
            "hobbies": {
                "type": "array",
                "items": {"type": "string", "maxLength": 16},
                "maxItems": 3
            }
        },
        "required": ["name", "age", "color", "hobbies"],
        "additionalProperties": false
    })
}

#[test]
fn real_model_json_schema_generations_parse_and_validate() {
    let Some(mut r) = real() else { return };
    let prompt = format!(
        "{CHAT}Describe a person as JSON with their name, age, favourite color and hobbies.\
         <|im_end|>\n<|im_start|>assistant\n"
    );
    let grammar = Grammar::JsonSchema(person_schema());
    let mut cost = Cost::default();
    let mut names = std::collections::HashSet::new();
    for seed in 0..20 {
        let mut sampler = Sampler::new(SamplerParams {
            seed,
            ..SamplerParams::default()
        });
        let (text, ended) = generate(&mut r, &prompt, &grammar, &mut sampler, 300, &mut cost);
        eprintln!("seed {seed}: {text}");
        assert!(ended, "seed {seed}: no end in 300 tokens: {text:?}");
        let v: serde_json::Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("seed {seed}: {e}: {text:?}"));
        let o = v.as_object().unwrap_or_else(|| panic!("{text}"));
        let name = o["name"].as_str().expect("name is a string");
        assert!((1..=24).contains(&name.chars().count()), "{text}");
        let age = o["age"].as_i64().expect("age is an integer");
        assert!((0..=120).contains(&age), "{text}");
        assert!(
            ["red", "green", "blue"].contains(&o["color"].as_str().unwrap()),
            "{text}"
        );
        let hobbies = o["hobbies"].as_array().expect("hobbies is an array");
        assert!(
            hobbies.len() <= 3 && hobbies.iter().all(|h| h.is_string()),
            "{text}"
        );
        assert_eq!(o.len(), 4, "{text}");
        names.insert(name.to_string());
    }
    assert!(names.len() > 1, "20 seeds gave one name: {names:?}");
    eprintln!(
        "json schema: {} tokens, mask+accept {:.1} us/token, sampling {:.1} us/token",
        cost.tokens,
        cost.constraint.as_secs_f64() * 1e6 / cost.tokens as f64,
        cost.sample.as_secs_f64() * 1e6 / cost.tokens as f64
    );
}

#[test]
fn real_model_gbnf_yes_no_and_digit_lists() {
    let Some(mut r) = real() else { return };
    let mut cost = Cost::default();
    let yes_no = Grammar::Gbnf(r#"root ::= ("yes" | "no")"#.into());
    for q in ["Is water wet?", "Is the sun cold?", "Can fish fly?"] {
        let prompt = format!("{CHAT}{q} Answer yes or no.<|im_end|>\n<|im_start|>assistant\n");
        let mut sampler = Sampler::new(SamplerParams::greedy());
        let (text, ended) = generate(&mut r, &prompt, &yes_no, &mut sampler, 10, &mut cost);
        assert!(ended && (text == "yes" || text == "no"), "{q}: {text:?}");
    }
    let digits = Grammar::Gbnf(
        "root ::= \"[\" num (\", \" num){0,5} \"]\"\n\
         num ::= [1-9] [0-9]{0,2} # no leading zeros\n"
            .into(),
    );
    let prompt = format!("{CHAT}List some prime numbers.<|im_end|>\n<|im_start|>assistant\n");
    for seed in 0..5 {
        let mut sampler = Sampler::new(SamplerParams {
            seed,
            ..SamplerParams::default()
        });
        let (text, ended) = generate(&mut r, &prompt, &digits, &mut sampler, 60, &mut cost);
        assert!(ended, "{text:?}");
        let list: Vec<u32> =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text:?}"));
        assert!((1..=6).contains(&list.len()), "{text}");
        assert!(list.iter().all(|&n| (1..1000).contains(&n)), "{text}");
        assert!(!text.contains("[0") && !text.contains(" 0"), "{text}");
    }
}

/// The cost of the constraint per token next to sampling's:
/// `cargo test -p engine --test constraint measure -- --ignored --nocapture` (the dev profile
/// builds llguidance with `opt-level = 2`).
#[test]
#[ignore = "a measurement"]
fn measure_constraint_cost_per_token() {
    let Some(mut r) = real() else { return };
    let prompt = format!(
        "{CHAT}Describe a person as JSON with their name, age, favourite color and hobbies.\
         <|im_end|>\n<|im_start|>assistant\n"
    );
    let t0 = Instant::now();
    let vocab = Vocab::new(r.session.model().tokenizer()).unwrap();
    eprintln!("Vocab::new: {:.1} ms", t0.elapsed().as_secs_f64() * 1e3);
    let t0 = Instant::now();
    let _ = Constraint::new(&vocab, &Grammar::JsonSchema(person_schema())).unwrap();
    eprintln!(
        "Constraint::new (schema): {:.2} ms",
        t0.elapsed().as_secs_f64() * 1e3
    );
    for (name, grammar) in [
        ("json schema", Grammar::JsonSchema(person_schema())),
        ("json object", Grammar::JsonObject),
    ] {
        let mut cost = Cost::default();
        for seed in 0..10 {
            let mut sampler = Sampler::new(SamplerParams {
                seed,
                ..SamplerParams::default()
            });
            generate(&mut r, &prompt, &grammar, &mut sampler, 120, &mut cost);
        }
        eprintln!(
            "{name}: {} tokens; mask_logits+accept {:.1} us/token; unconstrained sampling \
             (llama.cpp's default chain) {:.1} us/token",
            cost.tokens,
            cost.constraint.as_secs_f64() * 1e6 / cost.tokens as f64,
            cost.sample.as_secs_f64() * 1e6 / cost.tokens as f64
        );
    }
}

#[test]
fn listed_properties_close_an_object_as_llama_cpp_reads_schemas() {
    let model = tiny_model();
    let tok = model.tokenizer();
    let vocab = Vocab::new(tok).unwrap();
    let schema = serde_json::json!({
        "type": "object",
        "properties": { "path": { "type": "string" } },
        "required": ["path"]
    });
    let mut c = Constraint::new(&vocab, &Grammar::JsonSchema(schema.clone())).unwrap();
    assert!(accepts_bytes(&mut c, tok, r#"{"path": "a"}"#));
    // A key the schema does not list is refused where it starts.
    let mut c = Constraint::new(&vocab, &Grammar::JsonSchema(schema.clone())).unwrap();
    assert!(!accepts_bytes(&mut c, tok, r#"{"path": "a", "type": "x"}"#));
    // `additionalProperties: true` opens it again.
    let mut open = schema;
    open["additionalProperties"] = serde_json::json!(true);
    let mut c = Constraint::new(&vocab, &Grammar::JsonSchema(open)).unwrap();
    assert!(accepts_bytes(&mut c, tok, r#"{"path": "a", "type": "x"}"#));
}
