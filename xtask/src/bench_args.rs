//! The command lines of `cargo xtask bench-server` (every `--workload`) and `cargo xtask
//! bench-remote`, and the settings they resolve to.
//!
//! A few options have a default of their own per workload (`--turns`, `--system-tokens`,
//! `--gen-tokens`, `--ctx`), so they are parsed as optional and the defaults are filled in by
//! [`BenchServerArgs::plan`]; an option of one workload given with another (or none) is an
//! error there, as it always was.

use std::path::PathBuf;

use clap::{ArgAction, Args, ValueEnum};

/// Parses a positive whole number (`--threads`, `--reps`, ...).
pub(crate) fn positive(s: &str) -> Result<usize, String> {
    s.parse::<usize>()
        .ok()
        .filter(|&n| n > 0)
        .ok_or_else(|| format!("wants a positive number, got {s:?}"))
}

/// `--only`: which of the two servers to measure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum Only {
    /// Our `llama-hdd-server` alone.
    Ours,
    /// llama.cpp's `llama-server` alone.
    Llama,
}

/// `--workload`: what `bench-server` plays instead of its default measurements.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum Workload {
    /// One tool-calling conversation with a restart in the middle (`bench_agent`).
    Agent,
    /// Multi-round question answering over private documents (`bench_multiround`).
    MultiRound,
    /// Our server on caches of growing size (`bench_growth`).
    Growth,
    /// Speculative decoding: plain decoding against n-gram drafts, both servers (`bench_spec`).
    Spec,
    /// A reasoning conversation whose client drops `reasoning_content` (`bench_reasoning`).
    Reasoning,
    /// Two models behind one router, one place: a model unloaded and loaded again
    /// (`bench_router`).
    Router,
}

/// The options every benchmark of the servers shares (`bench-server`, `bench-remote`).
#[derive(Args, Clone, Debug)]
pub(crate) struct ServerArgs {
    /// Our server's binary (built, release, when not given).
    #[arg(long, value_name = "BIN")]
    pub(crate) ours: Option<PathBuf>,
    /// llama.cpp's `llama-server`; without it (or `LLAMA_SERVER`), ours is measured alone.
    #[arg(long = "llama-server", value_name = "BIN", env = "LLAMA_SERVER")]
    pub(crate) llama_server: Option<PathBuf>,
    /// The GGUF both servers load.
    #[arg(long, value_name = "PATH", default_value_os_t = crate::model::default_path())]
    pub(crate) model: PathBuf,
    /// `-t` of both servers.
    #[arg(long, value_name = "N", default_value_t = 2, value_parser = positive)]
    pub(crate) threads: usize,
    /// Size of the time-to-first-token prompt, in tokens.
    #[arg(long, value_name = "N", default_value_t = 2000, value_parser = positive)]
    pub(crate) prompt_tokens: usize,
    /// Repetitions of the time-to-first-token measurement.
    #[arg(long, value_name = "N", default_value_t = 3, value_parser = positive)]
    pub(crate) reps: usize,
    /// Repeated requests per repetition (their median is reported) [spec, reasoning: rounds,
    /// every server started afresh in each].
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = positive)]
    pub(crate) repeats: usize,
    /// Size of the shared system prompt, in tokens [default: 1000; agent: 3000; reasoning: 200].
    #[arg(long, value_name = "N", value_parser = positive)]
    pub(crate) system_tokens: Option<usize>,
    /// Conversations of the trace.
    #[arg(long, value_name = "N", default_value_t = 8, value_parser = positive)]
    pub(crate) conversations: usize,
    /// Turns per conversation [default: 6; agent: 20; reasoning: 10].
    #[arg(long, value_name = "N", value_parser = positive)]
    pub(crate) turns: Option<usize>,
    /// Concurrent clients of the trace or multi-round workload (and server slots).
    #[arg(long, value_name = "N", default_value_t = 4, value_parser = positive)]
    pub(crate) clients: usize,
    /// `max_tokens` of each reply [default: 32; agent: 64; reasoning: 128; spec: the tasks' own,
    /// at most this].
    #[arg(long, value_name = "N", value_parser = positive)]
    pub(crate) gen_tokens: Option<usize>,
    /// Where the servers' caches and logs go.
    #[arg(long, value_name = "DIR",
          default_value_os_t = std::env::temp_dir().join("llama-hdd-bench-server"))]
    pub(crate) dir: PathBuf,
    /// Measure one server only.
    #[arg(long, value_enum)]
    pub(crate) only: Option<Only>,
    /// No concurrent trace.
    #[arg(long)]
    pub(crate) skip_trace: bool,
    /// No time-to-first-token measurement.
    #[arg(long)]
    pub(crate) skip_ttft: bool,
}

/// The defaults a workload gives the options that have one of their own.
#[derive(Clone, Copy)]
struct Defaults {
    system_tokens: usize,
    turns: usize,
    gen_tokens: usize,
}

/// The defaults of the time to first token and trace (and of every workload but `agent`).
const DEFAULTS: Defaults = Defaults {
    system_tokens: 1000,
    turns: 6,
    gen_tokens: 32,
};

/// The settings of a benchmark of the servers, every default filled in.
#[derive(Clone, Debug)]
pub(crate) struct Options {
    /// Our server's binary (built when `None`).
    pub(crate) ours: Option<PathBuf>,
    /// llama.cpp's server, if any.
    pub(crate) llama: Option<PathBuf>,
    /// The GGUF both servers load.
    pub(crate) model: PathBuf,
    /// `-t` of both servers.
    pub(crate) threads: usize,
    /// The time-to-first-token prompt's size.
    pub(crate) prompt_tokens: usize,
    /// Repetitions of the time-to-first-token measurement.
    pub(crate) reps: usize,
    /// Repeated requests per repetition.
    pub(crate) repeats: usize,
    /// The shared system prompt's size.
    pub(crate) system_tokens: usize,
    /// Conversations of the trace.
    pub(crate) conversations: usize,
    /// Turns per conversation.
    pub(crate) turns: usize,
    /// Concurrent clients (and server slots).
    pub(crate) clients: usize,
    /// `max_tokens` of each reply.
    pub(crate) gen_tokens: usize,
    /// Where the servers' caches and logs go.
    pub(crate) dir: PathBuf,
    /// Measure one server only.
    pub(crate) only: Option<Only>,
    /// No trace.
    pub(crate) skip_trace: bool,
    /// No time-to-first-token measurement.
    pub(crate) skip_ttft: bool,
}

impl ServerArgs {
    /// The settings, with `d` for the options left out.
    fn options(&self, d: Defaults) -> Options {
        Options {
            ours: self.ours.clone(),
            llama: self.llama_server.clone(),
            model: self.model.clone(),
            threads: self.threads,
            prompt_tokens: self.prompt_tokens,
            reps: self.reps,
            repeats: self.repeats,
            system_tokens: self.system_tokens.unwrap_or(d.system_tokens),
            conversations: self.conversations,
            turns: self.turns.unwrap_or(d.turns),
            clients: self.clients,
            gen_tokens: self.gen_tokens.unwrap_or(d.gen_tokens),
            dir: self.dir.clone(),
            only: self.only,
            skip_trace: self.skip_trace,
            skip_ttft: self.skip_ttft,
        }
    }
}

/// `cargo xtask bench-server`: our server against llama.cpp's `llama-server`.
#[derive(Args, Clone, Debug)]
pub(crate) struct BenchServerArgs {
    /// The options of every workload.
    #[command(flatten)]
    pub(crate) server: ServerArgs,
    /// Another workload instead of the time to first token and the concurrent trace.
    #[arg(long, value_enum)]
    pub(crate) workload: Option<Workload>,
    /// The last turn before the restart [default: 10].
    #[arg(long, value_name = "N", value_parser = positive, help_heading = "--workload agent")]
    pub(crate) restart_after: Option<usize>,
    /// `-c` of both servers, per slot [default: agent 8192, multi-round 4096].
    #[arg(long, value_name = "N", value_parser = positive, help_heading = "--workload agent")]
    pub(crate) ctx: Option<usize>,
    /// `--chat-template-file` of both servers [default: a ChatML template with tools, written
    /// into `--dir`].
    #[arg(long, value_name = "PATH", help_heading = "--workload agent")]
    pub(crate) chat_template_file: Option<PathBuf>,
    /// Users, each with a private document [default: 8].
    #[arg(long, value_name = "N", value_parser = positive, help_heading = "--workload multi-round")]
    pub(crate) users: Option<usize>,
    /// Rounds of questions per user [default: 4].
    #[arg(long, value_name = "N", value_parser = positive, help_heading = "--workload multi-round")]
    pub(crate) rounds: Option<usize>,
    /// Size of each user's document, in tokens [default: 1500].
    #[arg(long, value_name = "N", value_parser = positive, help_heading = "--workload multi-round")]
    pub(crate) doc_tokens: Option<usize>,
    /// `--cache-ram` of both servers, in MiB [default: 32].
    #[arg(long, value_name = "N", value_parser = positive, help_heading = "--workload multi-round")]
    pub(crate) cache_ram_mib: Option<usize>,
    /// Counts of other cached conversations to fill the cache with [default: 10,1000,10000].
    #[arg(long, value_name = "N,N,...", value_delimiter = ',', action = ArgAction::Set,
          help_heading = "--workload growth")]
    pub(crate) sizes: Option<Vec<usize>>,
}

/// What `--workload agent` alone reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Agent {
    /// The last turn before the restart.
    pub(crate) restart_after: usize,
    /// `-c` of both servers (one slot).
    pub(crate) ctx: usize,
    /// `--chat-template-file` of both servers; `None`: the built-in template.
    pub(crate) template: Option<PathBuf>,
}

/// What `--workload multi-round` alone reads (its clients are [`Options::clients`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct MultiRound {
    /// Users, each with a document of their own.
    pub(crate) users: usize,
    /// Rounds per user.
    pub(crate) rounds: usize,
    /// Tokens of each document.
    pub(crate) doc_tokens: usize,
    /// `-c` per slot.
    pub(crate) ctx: usize,
    /// `--cache-ram` of both servers, in MiB.
    pub(crate) cache_ram_mib: usize,
}

/// What `--workload spec` alone reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Spec {
    /// `--gen-tokens`: the most `n_predict` of any task (a smoke run); `None`: each task's own.
    pub(crate) max_predict: Option<usize>,
}

/// What `bench-server` runs, with its settings.
#[derive(Clone, Debug)]
pub(crate) enum Plan {
    /// The time to first token and the concurrent trace.
    Default(Options),
    /// `--workload agent`.
    Agent(Options, Agent),
    /// `--workload multi-round`.
    MultiRound(Options, MultiRound),
    /// `--workload growth`, with `--sizes`.
    Growth(Options, Vec<usize>),
    /// `--workload spec`.
    Spec(Options, Spec),
    /// `--workload reasoning`.
    Reasoning(Options),
    /// `--workload router`.
    Router(Options),
}

impl BenchServerArgs {
    /// The workload and its settings; an error names an option the workload does not read.
    pub(crate) fn plan(&self) -> Result<Plan, String> {
        let given: [(&str, bool, &[Workload]); 8] = [
            (
                "--restart-after",
                self.restart_after.is_some(),
                &[Workload::Agent],
            ),
            (
                "--ctx",
                self.ctx.is_some(),
                &[Workload::Agent, Workload::MultiRound],
            ),
            (
                "--chat-template-file",
                self.chat_template_file.is_some(),
                &[Workload::Agent],
            ),
            ("--users", self.users.is_some(), &[Workload::MultiRound]),
            ("--rounds", self.rounds.is_some(), &[Workload::MultiRound]),
            (
                "--doc-tokens",
                self.doc_tokens.is_some(),
                &[Workload::MultiRound],
            ),
            (
                "--cache-ram-mib",
                self.cache_ram_mib.is_some(),
                &[Workload::MultiRound],
            ),
            ("--sizes", self.sizes.is_some(), &[Workload::Growth]),
        ];
        for (flag, present, workloads) in given {
            if present && !self.workload.is_some_and(|w| workloads.contains(&w)) {
                let names: Vec<String> = workloads
                    .iter()
                    .filter_map(|w| w.to_possible_value())
                    .map(|v| format!("--workload {}", v.get_name()))
                    .collect();
                return Err(format!(
                    "bench-server: {flag} is an option of {} only",
                    names.join(" and ")
                ));
            }
        }
        Ok(match self.workload {
            None => Plan::Default(self.server.options(DEFAULTS)),
            Some(Workload::Agent) => {
                let defaults = Defaults {
                    system_tokens: 3000,
                    turns: 20,
                    gen_tokens: 64,
                };
                let o = self.server.options(defaults);
                let a = Agent {
                    restart_after: self.restart_after.unwrap_or(10),
                    ctx: self.ctx.unwrap_or(8192),
                    template: self.chat_template_file.clone(),
                };
                if a.restart_after >= o.turns {
                    return Err(format!(
                        "bench-server: --restart-after {} leaves no turn after the restart \
                         (--turns {})",
                        a.restart_after, o.turns
                    ));
                }
                Plan::Agent(o, a)
            }
            Some(Workload::MultiRound) => Plan::MultiRound(
                self.server.options(DEFAULTS),
                MultiRound {
                    users: self.users.unwrap_or(8),
                    rounds: self.rounds.unwrap_or(4),
                    doc_tokens: self.doc_tokens.unwrap_or(1500),
                    ctx: self.ctx.unwrap_or(4096),
                    cache_ram_mib: self.cache_ram_mib.unwrap_or(32),
                },
            ),
            Some(Workload::Growth) => Plan::Growth(
                self.server.options(DEFAULTS),
                self.sizes.clone().unwrap_or_else(|| vec![10, 1000, 10000]),
            ),
            Some(Workload::Spec) => Plan::Spec(
                self.server.options(DEFAULTS),
                Spec {
                    max_predict: self.server.gen_tokens,
                },
            ),
            Some(Workload::Reasoning) => Plan::Reasoning(self.server.options(Defaults {
                system_tokens: 200,
                turns: 10,
                gen_tokens: 128,
            })),
            Some(Workload::Router) => Plan::Router(self.server.options(DEFAULTS)),
        })
    }
}

/// `cargo xtask bench-remote`: the prompt cache's Redis tier, our server alone.
#[derive(Args, Clone, Debug)]
pub(crate) struct BenchRemoteArgs {
    /// The options of the servers (`--only` defaults to `ours`; `--skip-ttft` skips the time
    /// to first token here too).
    #[command(flatten)]
    pub(crate) server: ServerArgs,
    /// Fleet sizes: replicas on one Redis, one run each.
    #[arg(long, value_name = "N,N,...", value_delimiter = ',', action = ArgAction::Set,
          default_value = "1,2,4,8")]
    pub(crate) replicas: Vec<usize>,
    /// Users of the fleet run, each with a conversation of their own.
    #[arg(long, value_name = "N", default_value_t = 8, value_parser = positive)]
    pub(crate) users: usize,
    /// Turns of each conversation of the fleet run.
    #[arg(long, value_name = "N", default_value_t = 4, value_parser = positive)]
    pub(crate) fleet_turns: usize,
    /// No read throughput measurement.
    #[arg(long)]
    pub(crate) skip_throughput: bool,
    /// No fleet run.
    #[arg(long)]
    pub(crate) skip_fleet: bool,
    /// Also two replicas in network namespaces of their own (`ip netns`, a veth pair each)
    /// reaching the Redis on the host.
    #[arg(long)]
    pub(crate) netns: bool,
}

impl BenchRemoteArgs {
    /// The settings of the servers: ours only, unless `--only` says otherwise.
    pub(crate) fn options(&self) -> Options {
        let mut o = self.server.options(DEFAULTS);
        o.only = Some(o.only.unwrap_or(Only::Ours));
        o
    }
}
