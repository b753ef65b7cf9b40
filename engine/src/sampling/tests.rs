//! Tests of the sampler chain: recorded draws of the default chain, each sampler's effect,
//! the chain's order, and the probabilities reported with a draw.

use super::*;

/// Deterministic pseudo-random logits in [-4, 4) (no floating-point library calls).
fn lcg_logits(seed: u64, n: usize) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            ((x >> 40) as f32 / (1u64 << 24) as f32) * 8.0 - 4.0
        })
        .collect()
}

/// Temperature 1 and every filter off: the draw follows the plain softmax.
fn plain() -> SamplerParams {
    SamplerParams {
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        seed: 11,
        ..SamplerParams::default()
    }
}

/// The ids left by the chain: the post-sampling report with room for every candidate.
fn kept(params: SamplerParams, logits: &[f32], history: &[u32]) -> Vec<u32> {
    let mut s = Sampler::new(params);
    let (_, top) = s.sample_with_probs(logits, history, logits.len());
    let mut ids: Vec<u32> = top.into_iter().map(|(id, _)| id).collect();
    ids.sort_unstable();
    ids
}

fn ln_probs(p: &[f64]) -> Vec<f32> {
    p.iter().map(|&x| x.ln() as f32).collect()
}

/// Tokens drawn by the sampler as it was before the chain became configurable (penalties,
/// top-k, top-p, min-p, temperature), recorded with that code; the default chain must give
/// them token for token.
#[test]
fn default_chain_reproduces_recorded_tokens() {
    let scenarios: Vec<(&str, SamplerParams, &[u32])> = vec![
        (
            "default",
            SamplerParams {
                seed: 42,
                ..SamplerParams::default()
            },
            &RECORDED_DEFAULT,
        ),
        (
            "pure",
            SamplerParams {
                temperature: 1.0,
                top_k: 0,
                top_p: 1.0,
                min_p: 0.0,
                seed: 7,
                ..SamplerParams::default()
            },
            &RECORDED_PURE,
        ),
        (
            "mixed",
            SamplerParams {
                temperature: 0.7,
                top_k: 10,
                top_p: 0.9,
                min_p: 0.1,
                repeat_penalty: 1.3,
                repeat_last_n: 16,
                frequency_penalty: 0.2,
                presence_penalty: 0.3,
                seed: 123,
                ..SamplerParams::default()
            },
            &RECORDED_MIXED,
        ),
        (
            "hot",
            SamplerParams {
                temperature: 1.5,
                top_k: 5,
                repeat_penalty: 0.8,
                seed: 1,
                ..SamplerParams::default()
            },
            &RECORDED_HOT,
        ),
        (
            "greedy_pen",
            SamplerParams {
                repeat_penalty: 1.5,
                frequency_penalty: 0.5,
                ..SamplerParams::greedy()
            },
            &RECORDED_GREEDY_PEN,
        ),
        (
            "no_window",
            SamplerParams {
                repeat_penalty: 1.5,
                repeat_last_n: 0,
                temperature: 1.0,
                seed: 9,
                ..SamplerParams::default()
            },
            &RECORDED_NO_WINDOW,
        ),
    ];
    for (name, p, want) in scenarios {
        for detailed in [false, true] {
            let mut s = Sampler::new(p.clone());
            let mut hist: Vec<u32> = vec![3, 5, 3];
            let mut out = Vec::new();
            for step in 0..48u64 {
                let mut l = lcg_logits(step + 1, 50);
                if name == "no_window" {
                    l[step as usize % 50] = f32::NAN;
                    l[(step as usize + 7) % 50] = f32::NEG_INFINITY;
                }
                let t = if detailed {
                    s.sample_detailed(&l, &hist, 5, ProbsMode::PostSampling)
                        .token
                } else {
                    s.sample(&l, &hist)
                };
                hist.push(t);
                out.push(t);
            }
            assert_eq!(out, want, "{name} (detailed: {detailed})");
        }
    }
}

#[test]
fn logit_bias_bans_and_boosts() {
    let logits = [0.1f32, 2.5, -1.0, 2.4];
    let mut greedy = Sampler::new(SamplerParams::greedy());
    assert_eq!(greedy.sample(&logits, &[]), 1);
    let ban = SamplerParams {
        logit_bias: vec![(1, f32::NEG_INFINITY)],
        ..SamplerParams::greedy()
    };
    assert_eq!(Sampler::new(ban.clone()).sample(&logits, &[]), 3);
    let boost = SamplerParams {
        logit_bias: vec![(2, 2.0), (2, 2.0), (99, 50.0)],
        ..SamplerParams::greedy()
    };
    assert_eq!(Sampler::new(boost).sample(&logits, &[]), 2, "biases add up");
    // A banned token is never drawn, and has no probability after sampling.
    let mut s = Sampler::new(SamplerParams {
        logit_bias: vec![(1, f32::NEG_INFINITY)],
        ..plain()
    });
    for _ in 0..500 {
        let (t, top) = s.sample_with_probs(&logits, &[], 4);
        assert_ne!(t, 1);
        assert!(top.iter().all(|&(id, _)| id != 1));
    }
}

#[test]
fn typical_p_keeps_the_locally_typical_tokens() {
    // Entropy 1.142 nats; surprises 0.69, 1.20, 1.90, 3.00: token 1 is the most typical,
    // then 0, 2, 3.
    let logits = ln_probs(&[0.5, 0.3, 0.15, 0.05]);
    let typ = |typical_p, min_keep| SamplerParams {
        typical_p,
        min_keep,
        ..plain()
    };
    assert_eq!(kept(typ(0.2, 0), &logits, &[]), [1]);
    assert_eq!(kept(typ(0.5, 0), &logits, &[]), [0, 1]);
    assert_eq!(kept(typ(0.9, 0), &logits, &[]), [0, 1, 2]);
    assert_eq!(kept(typ(1.0, 0), &logits, &[]), [0, 1, 2, 3]);
    assert_eq!(kept(typ(0.2, 3), &logits, &[]), [0, 1, 2], "min_keep");
    // Greedy after typical-p picks the most likely of the typical tokens.
    let greedy = SamplerParams {
        typical_p: 0.2,
        ..SamplerParams::greedy()
    };
    assert_eq!(Sampler::new(greedy).sample(&logits, &[]), 1);
}

#[test]
fn xtc_removes_all_but_the_least_likely_top_choice() {
    let logits = ln_probs(&[0.4, 0.3, 0.2, 0.1]);
    let xtc = |xtc_probability, xtc_threshold, min_keep| SamplerParams {
        xtc_probability,
        xtc_threshold,
        min_keep,
        ..plain()
    };
    assert_eq!(kept(xtc(1.0, 0.25, 0), &logits, &[]), [1, 2, 3]);
    assert_eq!(kept(xtc(1.0, 0.05, 0), &logits, &[]), [3]);
    assert_eq!(
        kept(xtc(1.0, 0.05, 2), &logits, &[]),
        [0, 1, 2, 3],
        "min_keep"
    );
    assert_eq!(
        kept(xtc(1.0, 0.35, 0), &logits, &[]),
        [0, 1, 2, 3],
        "one above"
    );
    assert_eq!(
        kept(xtc(1.0, 0.6, 0), &logits, &[]),
        [0, 1, 2, 3],
        "> 0.5 is off"
    );
    assert_eq!(kept(xtc(0.0, 0.1, 0), &logits, &[]), [0, 1, 2, 3]);

    // Off, it leaves the random stream alone; on, it draws from it.
    let mut off = Sampler::new(xtc(0.0, 0.1, 0));
    let mut base = Sampler::new(plain());
    let mut on = Sampler::new(xtc(0.5, 0.05, 0));
    for _ in 0..10 {
        assert_eq!(off.sample(&logits, &[]), base.sample(&logits, &[]));
        on.sample(&logits, &[]);
    }
    assert_eq!(off.rng_state(), base.rng_state());
    assert_ne!(on.rng_state(), base.rng_state());
    // At probability 0.5, some draws are filtered and some are not.
    let draws: Vec<u32> = (0..200).map(|_| on.sample(&logits, &[])).collect();
    assert!(draws.iter().filter(|&&t| t == 3).count() > 70);
    assert!(draws.contains(&0));
}

#[test]
fn top_n_sigma_keeps_the_tokens_near_the_best() {
    // Mean 3, standard deviation 4.09.
    let logits = [10.0f32, 9.0, 5.0, 0.0, 0.0, 0.0, 0.0, 0.0];
    let sigma = |top_n_sigma, min_keep| SamplerParams {
        top_n_sigma,
        min_keep,
        ..plain()
    };
    assert_eq!(kept(sigma(1.0, 0), &logits, &[]), [0, 1]);
    assert_eq!(kept(sigma(2.0, 0), &logits, &[]), [0, 1, 2]);
    assert_eq!(kept(sigma(1.0, 3), &logits, &[]), [0, 1, 2], "min_keep");
    assert_eq!(kept(sigma(-1.0, 0), &logits, &[]).len(), 8, "off");
    // -inf logits stay out of the statistics.
    let mut with_inf = logits.to_vec();
    with_inf.push(f32::NEG_INFINITY);
    assert_eq!(kept(sigma(1.0, 0), &with_inf, &[]), [0, 1]);
}

#[test]
fn mirostat_mu_evolves_deterministically() {
    for version in [1u8, 2] {
        let params = SamplerParams {
            mirostat: version,
            mirostat_tau: 3.0,
            mirostat_eta: 0.1,
            seed: 5,
            ..SamplerParams::default()
        };
        let run = || {
            let mut s = Sampler::new(params.clone());
            assert_eq!(s.mirostat_mu(), 6.0);
            let mut hist = Vec::new();
            let mut mus = Vec::new();
            for step in 0..30 {
                let t = s.sample(&lcg_logits(step, 200), &hist);
                hist.push(t);
                mus.push(s.mirostat_mu());
            }
            (hist, mus)
        };
        let (a_tokens, a_mus) = run();
        let (b_tokens, b_mus) = run();
        assert_eq!(a_tokens, b_tokens, "mirostat {version}");
        assert_eq!(a_mus, b_mus);
        assert!(a_mus.iter().all(|m| m.is_finite()));
        assert!(a_mus.windows(2).any(|w| w[0] != w[1]), "mu moves");
        // mu goes down after a surprising token and up after an expected one.
        let mut s = Sampler::new(params.clone());
        s.sample(&[0.0, -30.0, -30.0], &[]);
        assert!(s.mirostat_mu() > 6.0, "surprise 0 < tau");
    }
    // Mirostat 2 with mu at 0 keeps only the most likely token.
    let mut s = Sampler::new(SamplerParams {
        mirostat: 2,
        ..plain()
    });
    for _ in 0..20 {
        s.set_mirostat_mu(0.0);
        assert_eq!(s.sample(&[1.0, 3.0, 2.9, 0.5], &[]), 1);
    }
    // Resuming from the saved state repeats the stream.
    let params = SamplerParams {
        mirostat: 2,
        seed: 8,
        ..SamplerParams::default()
    };
    let logits = lcg_logits(3, 100);
    let mut a = Sampler::new(params.clone());
    for _ in 0..5 {
        a.sample(&logits, &[]);
    }
    let (state, mu) = (a.rng_state(), a.mirostat_mu());
    let mut b = Sampler::new(params);
    b.set_rng_state(&state).unwrap();
    b.set_mirostat_mu(mu);
    for _ in 0..20 {
        assert_eq!(a.sample(&logits, &[]), b.sample(&logits, &[]));
    }
}

#[test]
fn dry_penalizes_the_continuation_of_a_repeat() {
    // "1 2 3" repeats; 4 followed it last time: the repeat has length 3, penalty 2^(3-2).
    let history = [1u32, 2, 3, 4, 1, 2, 3];
    let dry = |dry_sequence_breakers: Vec<Vec<u32>>| SamplerParams {
        dry_multiplier: 1.0,
        dry_base: 2.0,
        dry_allowed_length: 2,
        dry_penalty_last_n: 64,
        dry_sequence_breakers,
        ..SamplerParams::greedy()
    };
    let mut logits = [-2.0f32, -2.0, -2.0, -2.0, 1.0, -0.9];
    assert_eq!(
        Sampler::new(SamplerParams::greedy()).sample(&logits, &history),
        4
    );
    assert_eq!(
        Sampler::new(dry(vec![])).sample(&logits, &history),
        5,
        "1 - 2 < -0.9"
    );
    logits[5] = -1.1;
    assert_eq!(
        Sampler::new(dry(vec![])).sample(&logits, &history),
        4,
        "1 - 2 > -1.1"
    );
    logits[5] = -0.9;
    // A breaker ending the history leaves no room for a repeat.
    assert_eq!(
        Sampler::new(dry(vec![vec![3]])).sample(&logits, &history),
        4
    );
    assert_eq!(
        Sampler::new(dry(vec![vec![2, 3]])).sample(&logits, &history),
        4
    );
    assert_eq!(
        Sampler::new(dry(vec![vec![2, 1]])).sample(&logits, &history),
        5
    );
    // A one-token breaker is never penalised itself.
    assert_eq!(
        Sampler::new(dry(vec![vec![4]])).sample(&logits, &history),
        4
    );
    // A window too short to hold the repeat.
    let short = SamplerParams {
        dry_penalty_last_n: 4,
        ..dry(vec![])
    };
    assert_eq!(Sampler::new(short).sample(&logits, &history), 4);
    // Longer repeats cost more: "1 2 3 4 1 2 3" repeats 7 tokens before 4: 1 - 2^5 = -31.
    let long = [1u32, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3];
    let mut logits = [-100.0f32, -100.0, -100.0, -100.0, 1.0, -30.5];
    assert_eq!(Sampler::new(dry(vec![])).sample(&logits, &long), 5);
    logits[5] = -31.5;
    assert_eq!(Sampler::new(dry(vec![])).sample(&logits, &long), 4);
    // Penalties under the `dry_base^exponent` overflow stay finite.
    let huge = SamplerParams {
        dry_base: 1000.0,
        dry_allowed_length: 0,
        ..dry(vec![])
    };
    let many = vec![7u32; 200];
    let mut l = vec![0.0f32; 8];
    l[7] = 1e30;
    let mut s = Sampler::new(huge);
    assert_eq!(s.sample(&l, &many), 0);
}

#[test]
fn dry_breakers_from_text() {
    let vocab = ["hello", "\n", "x:", "a", "b", "xa", "ab"];
    let tokenize = |s: &str| -> Vec<u32> {
        s.chars()
            .map(|c| vocab.iter().position(|v| *v == c.to_string()).unwrap() as u32)
            .collect()
    };
    let mut got = dry_breakers_from_strings(
        &["\n", ":", "abb", ""],
        vocab.len(),
        |id| vocab[id as usize].as_bytes(),
        tokenize,
    );
    got.sort();
    // A token heads a sequence when its text ends with the start of the breaker:
    // "a" + "bb", "xa" + "bb", "ab" + "b".
    assert_eq!(
        got,
        [vec![1], vec![2], vec![3, 4, 4], vec![5, 4, 4], vec![6, 4]]
    );
}

#[test]
fn sampler_order_changes_the_outcome() {
    let logits = [2.0f32, 1.0, 0.0];
    let chain = |samplers: Vec<SamplerKind>| SamplerParams {
        temperature: 0.25,
        top_p: 0.9,
        samplers,
        ..plain()
    };
    use SamplerKind::{Temperature, TopP, Xtc};
    // At temperature 1, 0.665 + 0.245 reach 0.9; at 0.25 the best alone has 0.98.
    assert_eq!(kept(chain(vec![TopP, Temperature]), &logits, &[]), [0, 1]);
    assert_eq!(kept(chain(vec![Temperature, TopP]), &logits, &[]), [0]);
    // Without the step, the setting is unused.
    assert_eq!(kept(chain(vec![Temperature]), &logits, &[]), [0, 1, 2]);
    // XTC before a greedy temperature moves the choice; after it, it cannot.
    let greedy = |samplers| SamplerParams {
        xtc_probability: 1.0,
        xtc_threshold: 0.2,
        samplers,
        ..SamplerParams::greedy()
    };
    assert_eq!(
        Sampler::new(greedy(vec![Xtc, Temperature])).sample(&logits, &[]),
        1
    );
    assert_eq!(
        Sampler::new(greedy(vec![Temperature, Xtc])).sample(&logits, &[]),
        0
    );
}

#[test]
fn min_keep_holds_for_top_p_and_min_p() {
    let logits = [2.0f32, 1.0, 0.0];
    let p = |top_p, min_p, min_keep| SamplerParams {
        top_p,
        min_p,
        min_keep,
        ..plain()
    };
    assert_eq!(kept(p(0.5, 0.0, 0), &logits, &[]), [0]);
    assert_eq!(kept(p(0.5, 0.0, 2), &logits, &[]), [0, 1]);
    assert_eq!(kept(p(1.0, 0.9, 0), &logits, &[]), [0]);
    assert_eq!(kept(p(1.0, 0.9, 3), &logits, &[]), [0, 1, 2]);
    assert_eq!(kept(p(1.0, 0.9, 10), &logits, &[]), [0, 1, 2]);
}

#[test]
fn probabilities_are_sorted_and_sum_to_at_most_one() {
    for (params, max_len) in [
        (
            SamplerParams {
                seed: 4,
                ..SamplerParams::default()
            },
            10,
        ),
        (
            SamplerParams {
                top_k: 3,
                ..plain()
            },
            3,
        ),
        (plain(), 10),
    ] {
        let mut s = Sampler::new(params);
        for step in 0..20 {
            let logits = lcg_logits(step, 100);
            for mode in [ProbsMode::PostSampling, ProbsMode::PreSampling] {
                let r = s.sample_detailed(&logits, &[], 10, mode);
                assert!(!r.top.is_empty() && r.top.len() <= max_len.max(10));
                assert!(r.top.windows(2).all(|w| w[0].prob >= w[1].prob));
                let sum: f32 = r.top.iter().map(|t| t.prob).sum();
                assert!(sum <= 1.0 + 1e-5, "{sum}");
                assert!(r.prob.prob > 0.0 && r.prob.prob <= 1.0);
                assert_eq!(r.prob.id, r.token);
                for t in r.top.iter().chain([&r.prob]) {
                    assert!((t.logprob - t.prob.ln()).abs() < 1e-4);
                }
                if let Some(t) = r.top.iter().find(|t| t.id == r.token) {
                    assert_eq!(*t, r.prob);
                }
                if mode == ProbsMode::PostSampling && max_len == 3 {
                    assert_eq!(r.top.len(), 3);
                    assert!((sum - 1.0).abs() < 1e-5, "the candidates are all there");
                }
            }
        }
    }
    // Before sampling: the softmax of the raw logits, whatever the chain.
    let logits = [1.0f32, 2.0, 0.5, f32::NAN];
    let z: f64 = [1.0f64, 2.0, 0.5].iter().map(|l| l.exp()).sum();
    let mut s = Sampler::new(SamplerParams {
        top_k: 1,
        logit_bias: vec![(1, -5.0)],
        ..plain()
    });
    let r = s.sample_detailed(&logits, &[], 9, ProbsMode::PreSampling);
    assert_eq!(r.token, 0);
    let ids: Vec<u32> = r.top.iter().map(|t| t.id).collect();
    assert_eq!(ids, [1, 0, 2, 3]);
    assert!((f64::from(r.top[0].prob) - 2f64.exp() / z).abs() < 1e-6);
    assert!((f64::from(r.prob.prob) - 1f64.exp() / z).abs() < 1e-6);
    assert_eq!(r.top[3].prob, 0.0);
    assert_eq!(r.top[3].logprob, f32::NEG_INFINITY);
}

#[test]
fn greedy_reports_the_softmax_of_the_logits() {
    let logits = [1.0f32, 3.0, 2.0, 0.0];
    let z: f64 = logits.iter().map(|&l| f64::from(l).exp()).sum();
    let params = SamplerParams {
        top_k: 2,
        ..SamplerParams::greedy()
    };
    for mode in [ProbsMode::PostSampling, ProbsMode::PreSampling] {
        let r = Sampler::new(params.clone()).sample_detailed(&logits, &[], 3, mode);
        assert_eq!(r.token, 1);
        let ids: Vec<u32> = r.top.iter().map(|t| t.id).collect();
        assert_eq!(ids, [1, 2, 0]);
        for t in &r.top {
            let want = f64::from(logits[t.id as usize]).exp() / z;
            assert!((f64::from(t.prob) - want).abs() < 1e-6);
        }
        assert_eq!(r.prob, r.top[0]);
    }
    let (t, top) = Sampler::new(params).sample_with_probs(&logits, &[], 2);
    assert_eq!(t, 1);
    assert_eq!(top.len(), 2);
}

#[test]
fn probabilities_do_not_change_the_draws() {
    let params = SamplerParams {
        seed: 77,
        top_k: 20,
        ..SamplerParams::default()
    };
    let mut a = Sampler::new(params.clone());
    let mut b = Sampler::new(params);
    for step in 0..50 {
        let logits = lcg_logits(step, 64);
        let (t, _) = a.sample_with_probs(&logits, &[], 5);
        assert_eq!(t, b.sample(&logits, &[]));
    }
}

#[test]
fn dynamic_temperature_follows_the_entropy() {
    // A peaked distribution has a low entropy: the temperature drops towards 0.
    let peaked = [5.0f32, 0.0, 0.0, 0.0];
    let dyn_t = |temperature| SamplerParams {
        temperature,
        dynatemp_range: 1.0,
        ..plain()
    };
    let prob0 = |p: SamplerParams| {
        let r = Sampler::new(p).sample_detailed(&peaked, &[], 4, ProbsMode::PostSampling);
        r.top.iter().find(|t| t.id == 0).map_or(0.0, |t| t.prob)
    };
    assert!(prob0(dyn_t(1.0)) > prob0(plain()) + 0.01);
    // At temperature 0 with a range, a flat distribution is still drawn from (t = 0.5).
    let flat = [0.0f32; 4];
    let p = SamplerParams {
        temperature: 0.0,
        dynatemp_range: 0.5,
        ..plain()
    };
    assert_eq!(kept(p, &flat, &[]), [0, 1, 2, 3]);
}

#[test]
fn penalties_can_move_in_the_chain() {
    // After top-k 1, the penalties only see the best token: it stays the choice.
    let logits = [3.0f32, 2.9, 0.0];
    let p = |samplers| SamplerParams {
        top_k: 1,
        repeat_penalty: 2.0,
        samplers,
        ..SamplerParams::greedy()
    };
    use SamplerKind::{Penalties, Temperature, TopK};
    assert_eq!(
        Sampler::new(p(vec![Penalties, TopK, Temperature])).sample(&logits, &[0]),
        1
    );
    assert_eq!(
        Sampler::new(p(vec![TopK, Penalties, Temperature])).sample(&logits, &[0]),
        0
    );
}

const RECORDED_DEFAULT: [u32; 48] = [
    6, 23, 47, 12, 5, 25, 34, 40, 41, 25, 44, 46, 27, 45, 21, 13, 45, 13, 34, 34, 43, 6, 27, 44,
    35, 10, 6, 43, 7, 28, 38, 43, 31, 5, 1, 28, 44, 37, 31, 24, 19, 21, 3, 42, 33, 11, 44, 11,
];
const RECORDED_PURE: [u32; 48] = [
    17, 23, 40, 33, 8, 31, 17, 45, 18, 37, 45, 2, 24, 29, 43, 26, 38, 14, 0, 45, 1, 1, 45, 47, 38,
    45, 14, 38, 33, 43, 11, 9, 24, 40, 42, 0, 11, 8, 22, 14, 24, 46, 9, 11, 24, 11, 11, 12,
];
const RECORDED_MIXED: [u32; 48] = [
    25, 2, 41, 17, 22, 48, 46, 14, 13, 15, 35, 46, 49, 31, 43, 0, 10, 28, 6, 25, 29, 25, 27, 47,
    33, 21, 26, 8, 36, 18, 11, 9, 16, 30, 2, 43, 31, 41, 35, 20, 19, 10, 13, 45, 47, 46, 40, 32,
];
const RECORDED_HOT: [u32; 48] = [
    18, 23, 25, 39, 18, 9, 17, 9, 13, 15, 45, 31, 23, 25, 4, 5, 45, 25, 43, 25, 17, 25, 33, 25, 35,
    45, 4, 43, 0, 8, 33, 43, 15, 9, 33, 43, 15, 8, 9, 30, 17, 8, 19, 8, 13, 8, 27, 8,
];
const RECORDED_GREEDY_PEN: [u32; 48] = [
    6, 48, 46, 17, 25, 9, 26, 45, 0, 37, 39, 15, 13, 7, 4, 19, 10, 18, 43, 32, 1, 49, 33, 47, 35,
    36, 14, 8, 47, 22, 11, 29, 16, 44, 2, 27, 31, 30, 12, 40, 21, 28, 24, 34, 23, 42, 20, 38,
];
const RECORDED_NO_WINDOW: [u32; 48] = [
    6, 45, 46, 15, 21, 25, 10, 34, 0, 10, 46, 29, 13, 27, 27, 27, 10, 25, 46, 1, 17, 18, 33, 47,
    35, 26, 6, 14, 31, 28, 15, 35, 46, 35, 11, 43, 42, 45, 31, 30, 11, 10, 19, 12, 2, 46, 11, 38,
];
