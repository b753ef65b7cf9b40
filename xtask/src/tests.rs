//! The command line: every documented example parses, and each option keeps its default and
//! its meaning.

use std::path::{Path, PathBuf};

use clap::{CommandFactory, Parser};

use crate::bench_args::{Only, Plan};
use crate::model::ModelName;
use crate::{Cli, Cmd};

/// The command lines that README.md, docs/BENCHMARKS.md and docs/RELIABILITY.md quote (their
/// optional parts spelled out), and `.ci/run`'s.
const DOCUMENTED: &[&str] = &[
    "cargo xtask ci",
    "cargo xtask tidy",
    "cargo xtask bindgen",
    "cargo xtask api",
    "cargo xtask api --bless",
    "cargo xtask fetch-model",
    "cargo xtask fetch-model smollm2",
    "cargo xtask fetch-model gemma3",
    "cargo xtask fetch-templates",
    "cargo xtask clients",
    "cargo xtask clients --server BIN --model PATH",
    "cargo xtask compare-llama-cpp --refh PATH",
    "cargo xtask compare-llama-cpp --refh PATH --sequences 4 --cache-type q8_0",
    "cargo xtask compare-llama-cpp --refh PATH/TO/refh --reps 5 --prompt-tokens 512 \
     --gen-tokens 128 --threads 2",
    "cargo xtask compare-llama-cpp --refh PATH/TO/refh --model \
     models/gemma-3-270m-q4_k_m.gguf --reps 5",
    "cargo xtask compare-llama-cpp --refh PATH/TO/refh --sequences 8 --prompt-tokens 128 \
     --gen-tokens 64 --reps 3",
    "cargo xtask compare-llama-cpp --refh $REFH --cache-type f16 --reps 5",
    "cargo xtask compare-llama-cpp --refh $REFH --reps 5 --prompt-tokens 1024 --gen-tokens 64 \
     --deterministic",
    "cargo xtask crash-test",
    "cargo xtask crash-test --kills 1000 --model PATH --min-ms 0 --max-ms 1000 \
     --verify-every 10",
    "cargo xtask cuda-build",
    "cargo xtask cuda-build --arch 90",
    "cargo xtask cuda-build --arch 90 --out DIR",
    "cargo xtask cuda-toolkit",
    "cargo xtask cuda-toolkit DIR",
    "cargo xtask bench-server --llama-server PATH",
    "cargo xtask bench-server --ours target/release/llama-hdd-server --llama-server \
     $LLAMA_SERVER --reps 3",
    "cargo xtask bench-server --workload agent --ours target/release/llama-hdd-server \
     --llama-server $LLAMA_SERVER",
    "cargo xtask bench-server --workload multi-round --ours target/release/llama-hdd-server \
     --llama-server $LLAMA_SERVER",
    "cargo xtask bench-server --workload growth --ours target/release/llama-hdd-server --reps 3",
    "cargo xtask bench-remote --ours target/release/llama-hdd-server --reps 5 --netns",
    "cargo xtask bench-remote --skip-ttft --skip-fleet",
    "cargo xtask bench-remote --replicas 1,2,4,8 --users 8 --fleet-turns 4 --reps 3",
];

/// `cargo xtask a b c` as the program sees it (`cargo` and `xtask` stand for argv[0]).
fn argv(line: &str) -> Vec<&str> {
    let words: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(&words[..2], ["cargo", "xtask"], "{line}");
    std::iter::once("xtask")
        .chain(words[2..].iter().copied())
        .collect()
}

/// Parses `line`; panics with clap's message when it does not parse.
fn parse(line: &str) -> Cmd {
    match Cli::try_parse_from(argv(line)) {
        Ok(cli) => cli.command.expect("a command"),
        Err(e) => panic!("`{line}` does not parse:\n{e}"),
    }
}

/// The bench-server plan of `line`.
fn plan(line: &str) -> Result<Plan, String> {
    match parse(line) {
        Cmd::BenchServer(args) => args.plan(),
        other => panic!("`{line}` is not bench-server: {other:?}"),
    }
}

#[test]
fn the_command_line_is_consistent() {
    Cli::command().debug_assert();
}

#[test]
fn every_documented_command_line_parses() {
    for line in DOCUMENTED {
        let command = parse(line);
        // bench-server's workload options are checked after parsing.
        if let Cmd::BenchServer(args) = command {
            if let Err(e) = args.plan() {
                panic!("`{line}`: {e}");
            }
        }
    }
}

#[test]
fn without_a_command_there_is_none_and_unknown_ones_are_refused() {
    assert!(Cli::try_parse_from(["xtask"]).unwrap().command.is_none());
    assert!(Cli::try_parse_from(["xtask", "frobnicate"]).is_err());
    assert!(Cli::try_parse_from(["xtask", "tidy", "--nonsense"]).is_err());
}

#[test]
fn help_is_an_answer_not_an_error_of_the_command_line() {
    for line in [
        "cargo xtask --help",
        "cargo xtask help",
        "cargo xtask bench-server --help",
        "cargo xtask cuda-build -h",
    ] {
        let e = Cli::try_parse_from(argv(line)).unwrap_err();
        assert_eq!(e.kind(), clap::error::ErrorKind::DisplayHelp, "{line}");
    }
}

#[test]
fn fetch_model_takes_a_model_name() {
    let name = |line| match parse(line) {
        Cmd::FetchModel(args) => args.model,
        other => panic!("{other:?}"),
    };
    assert_eq!(name("cargo xtask fetch-model"), ModelName::Smollm2);
    assert_eq!(name("cargo xtask fetch-model smollm2"), ModelName::Smollm2);
    assert_eq!(name("cargo xtask fetch-model gemma3"), ModelName::Gemma3);
    assert_eq!(
        ModelName::Gemma3.source().file_name,
        "gemma-3-270m-q4_k_m.gguf"
    );
    assert!(Cli::try_parse_from(["xtask", "fetch-model", "llama"]).is_err());
}

#[test]
fn bench_server_defaults_are_those_of_the_hand_written_parser() {
    let Ok(Plan::Default(o)) = plan("cargo xtask bench-server") else {
        panic!("not the default plan");
    };
    assert_eq!(o.ours, None);
    assert_eq!(
        o.model,
        crate::workspace_root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf")
    );
    assert_eq!(
        (o.threads, o.prompt_tokens, o.reps, o.repeats),
        (2, 2000, 3, 1)
    );
    assert_eq!(
        (
            o.system_tokens,
            o.conversations,
            o.turns,
            o.clients,
            o.gen_tokens
        ),
        (1000, 8, 6, 4, 32)
    );
    assert_eq!(o.dir, std::env::temp_dir().join("llama-hdd-bench-server"));
    assert_eq!(o.only, None);
    assert!(!o.skip_trace && !o.skip_ttft);
}

#[test]
fn bench_server_options_are_read_and_later_ones_override_earlier_ones() {
    let Ok(Plan::Default(o)) = plan(
        "cargo xtask bench-server --ours A --llama-server B --model M --threads 8 \
         --prompt-tokens 100 --reps 1 --repeats 5 --system-tokens 50 --conversations 2 \
         --turns 3 --clients 2 --gen-tokens 9 --dir D --only llama --skip-trace --skip-ttft \
         --threads 6 --skip-trace",
    ) else {
        panic!("not the default plan");
    };
    assert_eq!(o.ours, Some(PathBuf::from("A")));
    assert_eq!(o.llama, Some(PathBuf::from("B")));
    assert_eq!(o.model, PathBuf::from("M"));
    assert_eq!(
        (o.threads, o.prompt_tokens, o.reps, o.repeats),
        (6, 100, 1, 5)
    );
    assert_eq!(
        (
            o.system_tokens,
            o.conversations,
            o.turns,
            o.clients,
            o.gen_tokens
        ),
        (50, 2, 3, 2, 9)
    );
    assert_eq!(o.dir, PathBuf::from("D"));
    assert_eq!(o.only, Some(Only::Llama));
    assert!(o.skip_trace && o.skip_ttft);
}

#[test]
fn bench_server_numbers_must_be_positive_and_only_names_a_server() {
    for line in [
        "cargo xtask bench-server --threads 0",
        "cargo xtask bench-server --reps x",
        "cargo xtask bench-server --clients",
        "cargo xtask bench-server --only both",
        "cargo xtask bench-server --workload nothing",
        "cargo xtask bench-server --frobnicate",
    ] {
        assert!(Cli::try_parse_from(argv(line)).is_err(), "{line}");
    }
}

#[test]
fn the_agent_workload_has_defaults_of_its_own() {
    let Ok(Plan::Agent(o, a)) = plan("cargo xtask bench-server --workload agent") else {
        panic!("not the agent");
    };
    assert_eq!((o.turns, o.system_tokens, o.gen_tokens), (20, 3000, 64));
    assert_eq!((a.restart_after, a.ctx, a.template), (10, 8192, None));
    let Ok(Plan::Agent(o, a)) = plan(
        "cargo xtask bench-server --turns 4 --workload agent --restart-after 2 --ctx 2048 \
         --chat-template-file t.jinja --gen-tokens 16",
    ) else {
        panic!("not the agent");
    };
    assert_eq!((o.turns, o.system_tokens, o.gen_tokens), (4, 3000, 16));
    assert_eq!(
        (a.restart_after, a.ctx, a.template),
        (2, 2048, Some(PathBuf::from("t.jinja")))
    );
    let e = plan("cargo xtask bench-server --workload agent --turns 10").unwrap_err();
    assert!(e.contains("leaves no turn after the restart"), "{e}");
}

#[test]
fn the_multi_round_workload_reads_its_options() {
    let Ok(Plan::MultiRound(o, m)) = plan("cargo xtask bench-server --workload multi-round") else {
        panic!("not multi-round");
    };
    assert_eq!((o.system_tokens, o.gen_tokens, o.clients), (1000, 32, 4));
    assert_eq!(
        (m.users, m.rounds, m.doc_tokens, m.ctx, m.cache_ram_mib),
        (8, 4, 1500, 4096, 32)
    );
    let Ok(Plan::MultiRound(o, m)) = plan(
        "cargo xtask bench-server --workload multi-round --users 2 --rounds 3 --clients 1 \
         --doc-tokens 100 --ctx 1024 --cache-ram-mib 8",
    ) else {
        panic!("not multi-round");
    };
    assert_eq!(o.clients, 1);
    assert_eq!(
        (m.users, m.rounds, m.doc_tokens, m.ctx, m.cache_ram_mib),
        (2, 3, 100, 1024, 8)
    );
}

#[test]
fn the_growth_workload_reads_its_sizes() {
    let Ok(Plan::Growth(o, sizes)) = plan("cargo xtask bench-server --workload growth") else {
        panic!("not growth");
    };
    assert_eq!((sizes, o.reps), (vec![10, 1000, 10000], 3));
    let Ok(Plan::Growth(_, sizes)) =
        plan("cargo xtask bench-server --workload growth --sizes 1,2 --sizes 5,50")
    else {
        panic!("not growth");
    };
    assert_eq!(sizes, vec![5, 50]);
}

#[test]
fn an_option_of_another_workload_is_refused() {
    for (line, flag) in [
        (
            "cargo xtask bench-server --restart-after 3",
            "--restart-after",
        ),
        (
            "cargo xtask bench-server --workload multi-round --restart-after 3",
            "--restart-after",
        ),
        ("cargo xtask bench-server --ctx 1024", "--ctx"),
        (
            "cargo xtask bench-server --workload growth --ctx 1024",
            "--ctx",
        ),
        (
            "cargo xtask bench-server --workload agent --users 2",
            "--users",
        ),
        ("cargo xtask bench-server --sizes 1,2", "--sizes"),
        (
            "cargo xtask bench-server --cache-ram-mib 8",
            "--cache-ram-mib",
        ),
    ] {
        let e = plan(line).unwrap_err();
        assert!(e.contains(flag), "{line}: {e}");
    }
}

#[test]
fn bench_remote_measures_ours_and_reads_its_options() {
    let remote = |line| match parse(line) {
        Cmd::BenchRemote(args) => args,
        other => panic!("{other:?}"),
    };
    let args = remote("cargo xtask bench-remote");
    assert_eq!(args.replicas, vec![1, 2, 4, 8]);
    assert_eq!((args.users, args.fleet_turns), (8, 4));
    assert!(!args.skip_throughput && !args.skip_fleet && !args.netns);
    let o = args.options();
    assert_eq!(o.only, Some(Only::Ours));
    assert!(!o.skip_ttft);
    let args = remote(
        "cargo xtask bench-remote --replicas 2,3 --users 5 --fleet-turns 2 --skip-ttft \
         --skip-throughput --skip-fleet --netns --prompt-tokens 500 --threads 4",
    );
    assert_eq!(args.replicas, vec![2, 3]);
    assert_eq!((args.users, args.fleet_turns), (5, 2));
    assert!(args.skip_throughput && args.skip_fleet && args.netns);
    let o = args.options();
    assert!(o.skip_ttft);
    assert_eq!((o.prompt_tokens, o.threads), (500, 4));
    assert!(Cli::try_parse_from(["xtask", "bench-remote", "--users", "0"]).is_err());
}

#[test]
fn compare_needs_refh_and_keeps_its_defaults() {
    assert!(Cli::try_parse_from(["xtask", "compare-llama-cpp"]).is_err());
    assert!(Cli::try_parse_from(["xtask", "compare-llama-cpp", "--refh", ""]).is_err());
    let Cmd::CompareLlamaCpp(o) = parse("cargo xtask compare-llama-cpp --refh R") else {
        panic!("not compare");
    };
    assert_eq!(o.refh, "R");
    assert_eq!(o.model, "models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert_eq!(
        (o.prompt, o.gen, o.threads, o.reps, o.sequences),
        (512, 128, 2, 5, 1)
    );
    assert_eq!(o.cache_type, "f16");
    assert!(!o.deterministic);
    assert_eq!(o.evaluation, "invariant");
    let Cmd::CompareLlamaCpp(o) =
        parse("cargo xtask compare-llama-cpp --deterministic --refh R --reps 0 --sequences 0")
    else {
        panic!("not compare");
    };
    assert_eq!((o.reps, o.sequences), (1, 1));
    assert!(o.deterministic);
}

#[test]
fn crash_test_keeps_its_defaults() {
    let Cmd::CrashTest(o) = parse("cargo xtask crash-test") else {
        panic!("not crash-test");
    };
    let root = crate::workspace_root();
    assert_eq!(o.kills, 100);
    assert_eq!(o.model, root.join("models/SmolLM2-135M-Instruct.Q4_1.gguf"));
    assert_eq!(o.dir, crate::target_dir().join("crash-test"));
    assert_eq!((o.min_ms, o.max_ms, o.verify_every), (0, 1000, 10));
    let Cmd::CrashTest(o) = parse("cargo xtask crash-test --kills 7 --verify-every 0") else {
        panic!("not crash-test");
    };
    assert_eq!((o.kills, o.verify_every), (7, 1));
}

#[test]
fn the_small_commands_keep_their_arguments() {
    let Cmd::Api(a) = parse("cargo xtask api") else {
        panic!("not api");
    };
    assert!(!a.bless);
    let Cmd::CudaToolkit(t) = parse("cargo xtask cuda-toolkit") else {
        panic!("not cuda-toolkit");
    };
    assert_eq!(t.dir, crate::target_dir().join("cuda-toolkit"));
    let Cmd::CudaBuild(b) = parse("cargo xtask cuda-build --arch 89") else {
        panic!("not cuda-build");
    };
    assert_eq!(
        (b.arch.as_str(), b.out),
        ("89", crate::target_dir().join("gpu-check"))
    );
    let Cmd::Clients(c) = parse("cargo xtask clients --server S") else {
        panic!("not clients");
    };
    assert_eq!(c.server, Some(PathBuf::from("S")));
    assert_eq!(c.model, crate::clients::ClientsArgs::default().model);
}

#[test]
fn the_target_directory_honours_cargo_target_dir() {
    use std::ffi::OsString;
    let root = Path::new("/work/space");
    let at = |env: Option<&str>| crate::target_dir_in(root, env.map(OsString::from));
    assert_eq!(at(None), root.join("target"));
    assert_eq!(at(Some("")), root.join("target"));
    assert_eq!(at(Some("build/out")), root.join("build/out"));
    assert_eq!(at(Some("/elsewhere/t")), PathBuf::from("/elsewhere/t"));
}
