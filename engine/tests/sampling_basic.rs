//! Sampling: greedy is argmax, filters and penalties change the choice where they should, a seed
//! fixes the stream, a saved RNG state resumes it, and draws follow the softmax.

use engine::sampling::{Sampler, SamplerParams};

fn params(temperature: f32) -> SamplerParams {
    SamplerParams {
        temperature,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        ..SamplerParams::default()
    }
}

#[test]
fn defaults_are_llama_cpp_like() {
    let p = SamplerParams::default();
    assert_eq!(p.temperature, 0.8);
    assert_eq!(p.top_k, 40);
    assert_eq!(p.top_p, 0.95);
    assert_eq!(p.min_p, 0.05);
    assert_eq!(p.repeat_penalty, 1.0);
    assert_eq!(p.repeat_last_n, 64);
    assert!(SamplerParams::greedy().temperature <= 0.0);
}

#[test]
fn greedy_is_argmax() {
    let mut s = Sampler::new(SamplerParams::greedy());
    assert_eq!(s.sample(&[0.1, 2.5, -1.0, 2.4], &[]), 1);
    assert_eq!(s.sample(&[-3.0, -2.0, -5.0], &[]), 1);
    // Ties go to the lowest id, NaN never wins.
    assert_eq!(s.sample(&[1.0, 3.0, 3.0], &[]), 1);
    assert_eq!(s.sample(&[f32::NAN, 0.5, 0.2], &[]), 1);
    let logits: Vec<f32> = (0..49152)
        .map(|i| ((i * 7919) % 1000) as f32 * 0.01)
        .collect();
    let best = logits
        .iter()
        .enumerate()
        .fold((0, f32::MIN), |b, (i, &v)| if v > b.1 { (i, v) } else { b })
        .0 as u32;
    assert_eq!(s.sample(&logits, &[]), best);
}

#[test]
fn top_k_one_equals_greedy() {
    let logits: Vec<f32> = (0..1000).map(|i| ((i * 31) % 97) as f32 * 0.1).collect();
    let want = Sampler::new(SamplerParams::greedy()).sample(&logits, &[]);
    for seed in 0..20 {
        let mut s = Sampler::new(SamplerParams {
            top_k: 1,
            seed,
            temperature: 1.5,
            ..SamplerParams::default()
        });
        assert_eq!(s.sample(&logits, &[]), want);
    }
}

#[test]
fn filters_remove_unlikely_tokens() {
    // p ≈ [0.665, 0.245, 0.090]
    let logits = [2.0, 1.0, 0.0];
    for seed in 0..200 {
        let mut top_p = Sampler::new(SamplerParams {
            top_p: 0.8,
            seed,
            ..params(1.0)
        });
        assert_ne!(top_p.sample(&logits, &[]), 2, "top-p 0.8 keeps two tokens");
        let mut min_p = Sampler::new(SamplerParams {
            min_p: 0.2,
            seed,
            ..params(1.0)
        });
        assert_ne!(min_p.sample(&logits, &[]), 2, "0.090 < 0.2 * 0.665");
        let mut top_k = Sampler::new(SamplerParams {
            top_k: 2,
            seed,
            ..params(1.0)
        });
        assert_ne!(top_k.sample(&logits, &[]), 2);
    }
}

#[test]
fn seeded_runs_are_identical_and_seeds_differ() {
    let logits: Vec<f32> = (0..500).map(|i| (i % 13) as f32 * 0.3).collect();
    let run = |seed| {
        let mut s = Sampler::new(SamplerParams {
            seed,
            ..params(1.0)
        });
        (0..200).map(|_| s.sample(&logits, &[])).collect::<Vec<_>>()
    };
    assert_eq!(run(7), run(7));
    assert_ne!(run(7), run(8));
}

#[test]
fn rng_state_round_trip() {
    let logits: Vec<f32> = (0..300).map(|i| (i % 17) as f32 * 0.2).collect();
    let mut a = Sampler::new(SamplerParams {
        seed: 99,
        ..params(0.9)
    });
    for _ in 0..37 {
        a.sample(&logits, &[]);
    }
    let state = a.rng_state();
    let next_a: Vec<u32> = (0..100).map(|_| a.sample(&logits, &[])).collect();

    let mut b = Sampler::new(SamplerParams {
        seed: 12345,
        ..params(0.9)
    });
    b.set_rng_state(&state).unwrap();
    let next_b: Vec<u32> = (0..100).map(|_| b.sample(&logits, &[])).collect();
    assert_eq!(next_a, next_b);

    assert!(b.set_rng_state(&state[..31]).is_err());
    assert!(b.set_rng_state(&[0; 32]).is_err());
}

#[test]
fn penalties_change_the_choice() {
    let logits = [3.0, 2.9, 0.0, -1.0];
    let greedy = SamplerParams::greedy();
    assert_eq!(Sampler::new(greedy.clone()).sample(&logits, &[0]), 0);
    // Repeat penalty: 3.0 / 1.1 < 2.9.
    let mut s = Sampler::new(SamplerParams {
        repeat_penalty: 1.1,
        ..greedy.clone()
    });
    assert_eq!(s.sample(&logits, &[0]), 1);
    // Outside the window the penalty does not apply.
    let mut s = Sampler::new(SamplerParams {
        repeat_penalty: 1.1,
        repeat_last_n: 2,
        ..greedy.clone()
    });
    assert_eq!(s.sample(&logits, &[0, 3, 3]), 0);
    // Frequency penalty scales with the count, presence does not.
    let mut s = Sampler::new(SamplerParams {
        frequency_penalty: 0.06,
        ..greedy.clone()
    });
    assert_eq!(s.sample(&logits, &[0]), 0, "3.0 - 0.06 > 2.9");
    assert_eq!(s.sample(&logits, &[0, 0]), 1, "3.0 - 0.12 < 2.9");
    let mut s = Sampler::new(SamplerParams {
        presence_penalty: 0.2,
        ..greedy.clone()
    });
    assert_eq!(s.sample(&logits, &[0]), 1);
    assert_eq!(s.sample(&logits, &[0, 1]), 0, "both penalised equally");
    // A negative logit is multiplied, pushing it further down.
    let mut s = Sampler::new(SamplerParams {
        repeat_penalty: 2.0,
        ..greedy
    });
    assert_eq!(s.sample(&[-1.0, -1.5], &[0]), 1);
}

#[test]
fn draws_follow_the_softmax() {
    let logits = [1.0f32, 2.0, 0.5];
    for temperature in [1.0f32, 0.5] {
        let z: f64 = logits
            .iter()
            .map(|&l| (f64::from(l) / f64::from(temperature)).exp())
            .sum();
        let want: Vec<f64> = logits
            .iter()
            .map(|&l| (f64::from(l) / f64::from(temperature)).exp() / z)
            .collect();
        let mut s = Sampler::new(SamplerParams {
            seed: 3,
            ..params(temperature)
        });
        let n = 20_000;
        let mut counts = [0usize; 3];
        for _ in 0..n {
            counts[s.sample(&logits, &[]) as usize] += 1;
        }
        for i in 0..3 {
            let got = counts[i] as f64 / n as f64;
            // Five standard deviations of a binomial proportion.
            let tol = 5.0 * (want[i] * (1.0 - want[i]) / n as f64).sqrt();
            assert!(
                (got - want[i]).abs() < tol,
                "t={temperature} token {i}: {got} vs {}",
                want[i]
            );
        }
    }
}
