//! The command line read as llama-server reads it, and checked.

use super::*;

fn parse(extra: &[&str]) -> std::result::Result<Args, clap::Error> {
    let mut argv = vec!["server", "-m", "m.gguf"];
    argv.extend_from_slice(extra);
    Args::parse_from_argv(argv)
}

#[test]
fn an_infinite_default_temperature_is_refused() {
    let e = parse(&["--temp", "inf"])
        .expect("clap reads inf")
        .check()
        .unwrap_err();
    assert!(
        matches!(
            e,
            ServerError::BadOption {
                option: "--temp",
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn the_test_suites_launch_lines_are_read_as_llama_server_reads_them() {
    let args = parse(&[
        "--port",
        "0",
        "--temp",
        "0.8",
        "--seed",
        "42",
        "--host",
        "127.0.0.1,::1",
        "--offline",
        "--batch-size",
        "32",
        "--ubatch-size",
        "16",
        "--threads",
        "2",
        "-ngl",
        "0",
        "--cont-batching",
        "--no-slots",
        "--alias",
        "b,a",
        "--ctx-size",
        "512",
        "-np",
        "2",
        "-ctk",
        "q8_0",
        "-fa",
        "on",
        "--n-predict",
        "64",
        "--verbose",
        "--no-ui",
        "--jinja",
        "--reasoning-format",
        "none",
        "--cache-ram",
        "0",
        "--cors-origins",
        "http://x",
        "-tb",
        "1",
        "--poll",
        "0",
    ])
    .unwrap();
    assert_eq!(
        (args.batch_size, args.ubatch_size, args.threads),
        (32, 16, 2)
    );
    assert_eq!(args.parallel, 2);
    assert!(args.verbose && args.no_ui && args.no_slots);
    let names: Vec<&str> = args.no_effect.iter().map(|n| n.option.as_str()).collect();
    assert_eq!(
        names,
        ["--offline", "--cont-batching", "--poll", "--verbose"]
    );
    let config = args.check().unwrap();
    assert_eq!(config.hosts, ["127.0.0.1", "::1"]);
    assert_eq!(config.aliases, ["a", "b"]);
    assert_eq!(config.alias, "a");
    assert_eq!(config.cache_ram, 0);
    assert!(!config.slots_endpoint && !config.ui && config.flash_attn);
    assert_eq!(config.n_gpu_layers, 0);
}

#[test]
fn capabilities_it_lacks_are_refused_by_name() {
    for (argv, capability) in [
        (&["--lora", "x.gguf"][..], "LoRA"),
        (
            &["--spec-draft-ngl", "9"],
            "speculative decoding on a device",
        ),
        (&["-hf", "org/repo"], "download"),
        (&["--mmproj", "p.gguf"], "multimodal"),
        (&["--grp-attn-n", "4"], "self-extend"),
    ] {
        let e = parse(argv).unwrap_err().to_string();
        assert!(e.contains(capability), "{argv:?}: {e}");
    }
    // An option no llama-server has is still a mistake.
    assert!(parse(&["--no-such-option"]).is_err());
    // Reranking: `--rerank` (or `--reranking`) pools by rank and serves `/rerank`, as
    // `--embedding --pooling rank` does; `--pooling rank` alone serves neither, and another
    // pooling beside `--rerank` is a contradiction, refused at the check.
    for argv in [
        &["--rerank"][..],
        &["--reranking"],
        &["--embedding", "--pooling", "rank"],
        &["--rerank", "--pooling", "rank"],
    ] {
        let c = parse(argv).unwrap().check().unwrap();
        assert_eq!(c.pooling, Pooling::Rank, "{argv:?}");
        assert!(c.args.embeddings.reranking(), "{argv:?}");
    }
    let c = parse(&["--pooling", "rank"]).unwrap().check().unwrap();
    assert!(!c.args.embeddings.reranking());
    let e = parse(&["--rerank", "--pooling", "mean"])
        .unwrap()
        .check()
        .unwrap_err();
    assert!(e.to_string().contains("--rerank"), "{e}");
    // What is built is accepted: context shift, reasoning budgets, embeddings, POST /props,
    // sleeping, cache reuse, a log file.
    for argv in [
        &["--context-shift", "--keep", "-1"][..],
        &["--reasoning-budget", "0"],
        &["--reasoning-budget", "100"],
        &[
            "--props",
            "--sleep-idle-seconds",
            "30",
            "--cache-reuse",
            "256",
        ],
        &["--log-file", "/dev/null"],
        &["--embedding", "--pooling", "mean"],
    ] {
        parse(argv).unwrap().check().unwrap();
    }
    let e = parse(&["--reasoning-budget", "0", "--reasoning", "on"])
        .unwrap()
        .check()
        .unwrap_err();
    assert!(e.to_string().contains("contradicts"), "{e}");
}

#[test]
fn cache_ram_is_mib_as_llama_server_reads_it_or_a_size() {
    let ram = |v: &str| {
        parse(&["--cache-ram", v])
            .unwrap()
            .check()
            .unwrap()
            .cache_ram
    };
    assert_eq!(ram("8"), 8 << 20);
    assert_eq!(ram("-1"), u64::MAX);
    assert_eq!(ram("1GiB"), 1 << 30);
}

#[test]
fn an_empty_api_key_is_refused_and_key_files_hold_several() {
    assert!(parse(&["--api-key", ""]).unwrap().check().is_err());
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("keys");
    std::fs::write(&file, "# comment\nk1\n\nk2\n").unwrap();
    let config = parse(&["--api-key", "k0", "--api-key-file", file.to_str().unwrap()])
        .unwrap()
        .check()
        .unwrap();
    assert_eq!(config.api_keys, ["k0", "k1", "k2"]);
}

#[test]
fn the_disk_budget_has_a_default_and_minus_one_lifts_it() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("not-yet").join("cache");
    let disk = |extra: &[&str]| {
        let mut argv = vec!["--cache-dir", cache.to_str().unwrap()];
        argv.extend_from_slice(extra);
        parse(&argv).unwrap().check().unwrap().cache_disk
    };
    // Half the free space of the filesystem (the directory does not exist yet: its nearest
    // existing ancestor's), at most 20 GiB.
    let default = disk(&[]).expect("a default budget");
    assert!(default > 0 && default <= 20 << 30, "{default}");
    assert_eq!(super::default_disk_budget(&cache), default);
    assert_eq!(disk(&["--cache-disk", "-1"]), None);
    assert_eq!(disk(&["--cache-disk", "64KiB"]), Some(64 << 10));
}

#[test]
fn remote_tier_options_are_refused_where_they_would_be_ignored() {
    // Without --cache-remote, its namespace and timeout would do nothing.
    assert!(parse(&["--cache-remote-namespace", "x"]).is_err());
    assert!(parse(&["--cache-remote-timeout", "50"]).is_err());
    // With --no-cache there is no prompt cache to put the tier under.
    let args = parse(&["--no-cache", "--cache-remote", "redis://127.0.0.1:1"]).unwrap();
    let e = super::remote_config(&args.remote, args.no_cache).unwrap_err();
    assert!(
        matches!(
            e,
            ServerError::BadOption {
                option: "--cache-remote",
                ..
            }
        ),
        "{e}"
    );
    let args = parse(&["--cache-remote", "http://x"]).unwrap();
    assert!(super::remote_config(&args.remote, false).is_err());
    let args = parse(&[
        "--cache-remote",
        "redis://h:1",
        "--cache-remote-timeout",
        "0",
    ])
    .unwrap();
    assert!(super::remote_config(&args.remote, false).is_err());
    let args = parse(&["--cache-remote", "redis://h:1/2"]).unwrap();
    let c = super::remote_config(&args.remote, false).unwrap().unwrap();
    assert_eq!(
        (c.namespace.as_str(), c.timeout.as_millis(), c.ca),
        ("llama-hdd", 100, None)
    );
    // A CA is for a TLS URL: without a tier, or with one not encrypted, it would be ignored.
    assert!(parse(&["--cache-remote-ca", "ca.pem"]).is_err());
    let args = parse(&[
        "--cache-remote",
        "redis://h:1",
        "--cache-remote-ca",
        "ca.pem",
    ])
    .unwrap();
    let e = super::remote_config(&args.remote, false).unwrap_err();
    assert!(
        matches!(
            e,
            ServerError::BadOption {
                option: "--cache-remote-ca",
                ..
            }
        ),
        "{e}"
    );
    let args = parse(&[
        "--cache-remote",
        "rediss://h:1",
        "--cache-remote-ca",
        "ca.pem",
    ])
    .unwrap();
    let c = super::remote_config(&args.remote, false).unwrap().unwrap();
    assert_eq!(c.ca.as_deref(), Some(std::path::Path::new("ca.pem")));
}

#[test]
fn no_warmup_turns_the_warm_up_off_and_warmup_is_accepted() {
    assert!(!parse(&[]).unwrap().no_warmup);
    assert!(parse(&["--no-warmup"]).unwrap().no_warmup);
    assert!(!parse(&["--warmup"]).unwrap().no_warmup);
}

#[test]
fn repacking_is_off_unless_asked_and_the_last_spelling_wins() {
    assert!(!parse(&[]).unwrap().repack);
    assert!(parse(&["--no-repack"]).unwrap().no_repack);
    assert!(parse(&["-nr"]).unwrap().no_repack);
    assert!(parse(&["--repack"]).unwrap().repack);
    assert!(!parse(&["--repack", "--no-repack"]).unwrap().repack);
    assert!(!parse(&["-nr", "--repack"]).unwrap().no_repack);
}

#[test]
fn auto_parallel_is_four_slots_over_one_unified_context_as_llama_server_sets_it() {
    let slots = |extra: &[&str]| {
        let c = parse(extra).unwrap().check().unwrap();
        (c.n_slots, c.kv_unified)
    };
    assert_eq!(slots(&[]), (4, true));
    assert_eq!(slots(&["-c", "4096"]), (4, true));
    assert_eq!(slots(&["--no-kv-unified"]), (4, true));
    assert_eq!(slots(&["-np", "-1"]), (4, true));
    assert_eq!(slots(&["-np", "2"]), (2, false));
    assert_eq!(slots(&["-np", "4", "--kv-unified"]), (4, true));
    assert_eq!(slots(&["-np", "4", "-kvu", "-no-kvu"]), (4, false));
    for bad in ["0", "-2"] {
        let e = parse(&["-np", bad]).unwrap().check().unwrap_err();
        assert!(
            matches!(
                e,
                ServerError::BadOption {
                    option: "--parallel",
                    ..
                }
            ),
            "{e}"
        );
    }
}

#[test]
fn kv_ram_reads_sizes_as_cache_ram_does_and_none_lifts_the_budget() {
    let kv = |v: &str| parse(&["--kv-ram", v]).unwrap().check().unwrap().kv_ram;
    assert_eq!(parse(&[]).unwrap().check().unwrap().kv_ram, None);
    assert_eq!(kv("8"), Some(8 << 20));
    assert_eq!(kv("4MiB"), Some(4 << 20));
    assert_eq!(kv("1.5GiB"), Some(3 << 29));
    for none in ["0", "none", "-1", "0MiB"] {
        assert_eq!(kv(none), Some(0), "{none}");
    }
    for bad in ["lots", "4 parsecs", "-2"] {
        let e = parse(&["--kv-ram", bad]).unwrap().check().unwrap_err();
        assert!(
            matches!(
                e,
                ServerError::BadOption {
                    option: "--kv-ram",
                    ..
                }
            ),
            "{bad}: {e}"
        );
    }
}

#[test]
fn a_kv_ram_budget_without_a_store_to_spill_to_is_refused() {
    let check = |argv: &[&str]| parse(argv).unwrap().check();
    let e = check(&["--no-cache", "--kv-ram", "1GiB"]).unwrap_err();
    assert!(e.to_string().contains("--no-cache"), "{e}");
    let e = check(&[
        "-ctk",
        "q8_0",
        "--cache-type-stored",
        "f16",
        "--kv-ram",
        "1GiB",
    ])
    .unwrap_err();
    assert!(e.to_string().contains("--cache-type-stored"), "{e}");
    // f16 pages resting as q8_0 are widened as they are read.
    assert_eq!(
        check(&["--cache-type-stored", "q8_0", "--kv-ram", "1GiB"])
            .unwrap()
            .kv_ram,
        Some(1 << 30)
    );
    // No budget asks for no store; a stored type that is the pool's own changes nothing.
    assert_eq!(
        check(&["--no-cache", "--kv-ram", "0"]).unwrap().kv_ram,
        Some(0)
    );
    assert!(check(&["--no-cache"]).unwrap().kv_ram.is_none());
    assert!(check(&[
        "-ctk",
        "q8_0",
        "-ctv",
        "q8_0",
        "--cache-type-stored",
        "q8_0"
    ])
    .unwrap()
    .args
    .no_spill_store()
    .is_none());
    assert!(parse(&["--no-cache"]).unwrap().no_spill_store().is_some());
}

#[test]
fn the_default_kv_budget_is_half_of_what_the_model_and_cache_tier_leave() {
    use super::memory::{kv_ram_rule, MIN_KV_RAM};
    let gib = 1u64 << 30;
    assert_eq!(kv_ram_rule(16 * gib, 4 * gib, 2 * gib), 5 * gib);
    // A cache tier without a limit is not counted; too little memory leaves the least.
    assert_eq!(kv_ram_rule(16 * gib, 4 * gib, u64::MAX), 6 * gib);
    assert_eq!(kv_ram_rule(gib, 2 * gib, 0), MIN_KV_RAM);
    // Here: something, and no more than the machine has.
    if let Some(n) = super::memory::memory_available() {
        assert!(n > 0);
    }
}

#[test]
fn router_mode_is_without_a_model_and_its_folders_need_no_model() {
    // `parse` adds `-m`: the router's folders beside it are refused by name.
    let err = parse(&["--models-dir", "/m"]).unwrap().check().unwrap_err();
    assert!(err.to_string().contains("--models-dir"), "{err}");
    let err = parse(&["--models-preset", "/p.ini"])
        .unwrap()
        .check()
        .unwrap_err();
    assert!(err.to_string().contains("--models-preset"), "{err}");
    // Without `-m`: router mode, its options read as llama-server's.
    let args = Args::parse_from_argv([
        "llama-hdd-server",
        "--models-dir",
        "/m",
        "--models-max",
        "2",
        "--no-models-autoload",
    ])
    .unwrap();
    assert!(args.model.as_os_str().is_empty());
    assert_eq!(args.router.models_max, 2);
    assert!(!args.router.autoload());
    assert!(args.check().is_ok());
    // What router mode would not use is refused, not dropped.
    let err = Args::parse_from_argv(["llama-hdd-server", "--alias", "x"])
        .unwrap()
        .check()
        .unwrap_err();
    assert!(err.to_string().contains("--alias"), "{err}");
}
