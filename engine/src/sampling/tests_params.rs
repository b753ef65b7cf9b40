//! Tests of sampler settings: parsing sampler names and letters, and refusing values out of
//! range.

use super::*;

#[test]
fn sampler_names_and_letters_parse_like_llama_server() {
    let (chain, unknown) = sampler_chain_from_names(&[
        "dry",
        "top_k",
        "typ_p",
        "top_p",
        "min_p",
        "xtc",
        "temperature",
    ]);
    use SamplerKind::*;
    assert_eq!(chain, [Dry, TopK, TypicalP, TopP, MinP, Xtc, Temperature]);
    assert!(unknown.is_empty());
    let (chain, unknown) = sampler_chain_from_names(&[
        "Top-K",
        "topk",
        "nucleus",
        "temp",
        "typical_p",
        "typ",
        "top-n-sigma",
        "topnsigma",
        "penalties",
        "infill",
        "MIN-P",
        "foo",
        "top k",
    ]);
    assert_eq!(
        chain,
        [
            TopK,
            TopK,
            TopP,
            Temperature,
            TypicalP,
            TypicalP,
            TopNSigma,
            TopNSigma,
            Penalties,
            Infill,
            MinP
        ]
    );
    assert_eq!(unknown, ["foo", "top k"]);
    let (chain, unknown) = sampler_chain_from_letters("edskypmxt");
    assert_eq!(chain, SamplerKind::DEFAULT_CHAIN);
    assert!(unknown.is_empty());
    let (chain, unknown) = sampler_chain_from_letters("kzT");
    assert_eq!(chain, [TopK]);
    assert_eq!(unknown, ['z', 'T']);
    for k in SamplerKind::ALL {
        assert_eq!(SamplerKind::from_name(k.name()), Some(k));
        assert_eq!(SamplerKind::from_letter(k.letter()), Some(k));
        assert_eq!(k.to_string().parse::<SamplerKind>(), Ok(k));
    }
    assert!("nope".parse::<SamplerKind>().is_err());
    assert_eq!(
        SamplerParams::default().samplers,
        SamplerKind::DEFAULT_CHAIN
    );
}

#[test]
fn check_refuses_settings_out_of_range() {
    assert_eq!(SamplerParams::default().check(), Ok(()));
    assert_eq!(SamplerParams::greedy().check(), Ok(()));
    let ok = SamplerParams {
        top_p: 1.0,
        min_p: 1.0,
        typical_p: 0.5,
        xtc_probability: 1.0,
        xtc_threshold: 0.9,
        mirostat: 2,
        dry_multiplier: 0.8,
        dry_sequence_breakers: vec![vec![1], vec![2, 3]],
        logit_bias: vec![(3, f32::NEG_INFINITY), (4, 2.0)],
        top_n_sigma: 1.5,
        ..SamplerParams::default()
    };
    assert_eq!(ok.check(), Ok(()));
    let d = SamplerParams::default;
    let cases: Vec<(&str, SamplerParams)> = vec![
        (
            "temperature",
            SamplerParams {
                temperature: -0.1,
                ..d()
            },
        ),
        (
            "temperature",
            SamplerParams {
                temperature: f32::NAN,
                ..d()
            },
        ),
        ("top_p", SamplerParams { top_p: 0.0, ..d() }),
        ("top_p", SamplerParams { top_p: 1.5, ..d() }),
        ("min_p", SamplerParams { min_p: -0.1, ..d() }),
        ("min_p", SamplerParams { min_p: 1.1, ..d() }),
        (
            "repeat_penalty",
            SamplerParams {
                repeat_penalty: 0.0,
                ..d()
            },
        ),
        (
            "frequency_penalty",
            SamplerParams {
                frequency_penalty: f32::INFINITY,
                ..d()
            },
        ),
        (
            "presence_penalty",
            SamplerParams {
                presence_penalty: f32::NAN,
                ..d()
            },
        ),
        (
            "typical_p",
            SamplerParams {
                typical_p: 0.0,
                ..d()
            },
        ),
        (
            "typical_p",
            SamplerParams {
                typical_p: 1.01,
                ..d()
            },
        ),
        (
            "xtc_probability",
            SamplerParams {
                xtc_probability: 1.5,
                ..d()
            },
        ),
        (
            "xtc_threshold",
            SamplerParams {
                xtc_threshold: -0.5,
                ..d()
            },
        ),
        (
            "dry_multiplier",
            SamplerParams {
                dry_multiplier: -1.0,
                ..d()
            },
        ),
        (
            "dry_base",
            SamplerParams {
                dry_base: 0.5,
                ..d()
            },
        ),
        ("mirostat", SamplerParams { mirostat: 3, ..d() }),
        (
            "mirostat_tau",
            SamplerParams {
                mirostat_tau: -1.0,
                ..d()
            },
        ),
        (
            "mirostat_eta",
            SamplerParams {
                mirostat_eta: f32::NAN,
                ..d()
            },
        ),
        (
            "top_n_sigma",
            SamplerParams {
                top_n_sigma: f32::INFINITY,
                ..d()
            },
        ),
        (
            "dynatemp_range",
            SamplerParams {
                dynatemp_range: -1.0,
                ..d()
            },
        ),
        (
            "dynatemp_exponent",
            SamplerParams {
                dynatemp_exponent: -1.0,
                ..d()
            },
        ),
        (
            "dry_sequence_breakers",
            SamplerParams {
                dry_sequence_breakers: vec![vec![]],
                ..d()
            },
        ),
        (
            "logit_bias",
            SamplerParams {
                logit_bias: vec![(1, f32::NAN)],
                ..d()
            },
        ),
        (
            "logit_bias",
            SamplerParams {
                logit_bias: vec![(1, f32::INFINITY)],
                ..d()
            },
        ),
    ];
    for (field, p) in cases {
        let err = p.check().unwrap_err();
        assert_eq!(err.field, field);
        assert!(err.to_string().starts_with(&format!("\"{field}\" ")));
    }
}
