//! The check of a tiny model against llama.cpp's reference harness (`refh golden`'s fixture
//! lines), shared by the arch tests.

use engine::Model;

/// Checks `s` (a fresh session of `model`) against one line of a `refh golden` fixture: the
/// prompt's token ids, its ten largest logits within 1e-3 of llama.cpp's, and the greedy tokens
/// after it. Returns the prompt and the largest logit difference.
pub fn check_golden_line(model: &Model, s: &mut engine::Session, line: &str) -> (String, f64) {
    let want: serde_json::Value = serde_json::from_str(line).unwrap();
    let prompt = want["prompt"].as_str().unwrap().to_owned();
    let ids: Vec<u32> = model.tokenizer().encode(&prompt, true, false).unwrap();
    let want_ids: Vec<u32> = serde_json::from_value(want["prompt_ids"].clone()).unwrap();
    assert_eq!(ids, want_ids, "{prompt:?}: token ids");
    let logits = s.feed(&ids).unwrap().to_vec();
    let mut worst = 0f64;
    for pair in want["top10"].as_array().unwrap() {
        let (id, logit) = (
            pair[0].as_u64().unwrap() as usize,
            pair[1].as_f64().unwrap(),
        );
        let got = f64::from(logits[id]);
        worst = worst.max((got - logit).abs());
        assert!(
            (got - logit).abs() <= 1e-3,
            "{prompt:?}: logit of {id} is {got}, llama.cpp {logit}"
        );
    }
    let argmax = |v: &[f32]| {
        v.iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .map_or(0, |(i, _)| i as u32)
    };
    let want_greedy: Vec<u32> = serde_json::from_value(want["greedy"].clone()).unwrap();
    let mut greedy = Vec::new();
    let mut next = argmax(&logits);
    for _ in 0..want_greedy.len() {
        greedy.push(next);
        next = argmax(s.feed(&[next]).unwrap());
    }
    assert_eq!(greedy, want_greedy, "{prompt:?}: greedy tokens");
    eprintln!("{prompt:?}: largest logit difference {worst:.2e}");
    (prompt, worst)
}
