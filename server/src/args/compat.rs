//! llama-server's options beyond those [`super::Args`] parses: its short and alternative
//! spellings (rewritten to the long names clap knows), its options that tune only what
//! llama.cpp has (accepted, kept to be named at start), and its options for capabilities this
//! server lacks (refused with the capability's name).

/// How many values an option takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Arity {
    /// A switch.
    Flag,
    /// One value.
    One,
    /// Two values (`--control-vector-layer-range START END`).
    Two,
    /// An optional value from a closed set (`--log-colors [on|off|auto]`).
    Optional(&'static [&'static str]),
}

use Arity::{Flag, One, Optional, Two};

/// llama-server's other spellings of options [`super::Args`] parses, and the name clap knows.
const SPELLINGS: &[(&str, &str)] = &[
    ("-np", "--parallel"),
    ("-nr", "--no-repack"),
    ("-ngl", "--n-gpu-layers"),
    ("-ctk", "--cache-type-k"),
    ("-ctv", "--cache-type-v"),
    ("-fa", "--flash-attn"),
    ("-b", "--batch-size"),
    ("-ub", "--ubatch-size"),
    ("-tb", "--threads-batch"),
    ("-n", "--n-predict"),
    ("-kvu", "--kv-unified"),
    ("-no-kvu", "--no-kv-unified"),
    ("-to", "--timeout"),
    ("-sps", "--slot-prompt-similarity"),
    ("-cram", "--cache-ram"),
    ("-ctxcp", "--ctx-checkpoints"),
    ("-lv", "--verbosity"),
    ("-v", "--verbose"),
    ("-rea", "--reasoning"),
    ("--embeddings", "--embedding"),
    ("--reranking", "--rerank"),
    ("-ag", "--agent"),
    ("-no-ag", "--no-agent"),
    ("--top-nsigma", "--top-n-sigma"),
    ("--usage", "--help"),
    ("-l", "--logit-bias"),
    ("-md", "--spec-draft-model"),
    ("--model-draft", "--spec-draft-model"),
    ("-cd", "--spec-draft-ctx-size"),
    ("--ctx-size-draft", "--spec-draft-ctx-size"),
    ("--draft", "--spec-draft-n-max"),
    ("--draft-n", "--spec-draft-n-max"),
    ("--draft-max", "--spec-draft-n-max"),
    ("--draft-min", "--spec-draft-n-min"),
    ("--draft-n-min", "--spec-draft-n-min"),
    ("--draft-p-min", "--spec-draft-p-min"),
    ("--spec-ngram-simple-size-n", "--spec-ngram-size-n"),
    ("--spec-ngram-map-k-size-n", "--spec-ngram-size-n"),
    ("--spec-ngram-map-k4v-size-n", "--spec-ngram-size-n"),
    ("--spec-ngram-mod-n-match", "--spec-ngram-size-n"),
    ("--spec-ngram-simple-size-m", "--spec-ngram-size-m"),
    ("--spec-ngram-map-k-size-m", "--spec-ngram-size-m"),
    ("--spec-ngram-map-k4v-size-m", "--spec-ngram-size-m"),
    ("--spec-ngram-mod-n-max", "--spec-ngram-size-m"),
];

/// Options that tune only what llama.cpp has: what each would tune.
const NO_EFFECT: &[(&[&str], Arity, &str)] = &[
    (
        &["-C", "--cpu-mask", "-Cb", "--cpu-mask-batch"],
        One,
        "thread affinity",
    ),
    (
        &["-Cr", "--cpu-range", "-Crb", "--cpu-range-batch"],
        One,
        "thread affinity",
    ),
    (
        &["--cpu-strict", "--cpu-strict-batch"],
        One,
        "thread affinity",
    ),
    (&["--prio", "--prio-batch"], One, "thread priority"),
    (
        &[
            "-td",
            "--threads-draft",
            "--spec-draft-threads",
            "-tbd",
            "--threads-batch-draft",
            "--spec-draft-threads-batch",
        ],
        One,
        "the draft model's threads (it runs on the target's)",
    ),
    (
        &[
            "-Cd",
            "--cpu-mask-draft",
            "--spec-draft-cpu-mask",
            "-Crd",
            "--cpu-range-draft",
            "--spec-draft-cpu-range",
            "--cpu-strict-draft",
            "--spec-draft-cpu-strict",
            "--prio-draft",
            "--spec-draft-prio",
            "--poll-draft",
            "--spec-draft-poll",
            "-Cbd",
            "--cpu-mask-batch-draft",
            "--spec-draft-cpu-mask-batch",
            "-Crbd",
            "--cpu-range-batch-draft",
            "--spec-draft-cpu-range-batch",
            "--cpu-strict-batch-draft",
            "--spec-draft-cpu-strict-batch",
            "--prio-batch-draft",
            "--spec-draft-prio-batch",
            "--poll-batch-draft",
            "--spec-draft-poll-batch",
        ],
        One,
        "the draft model's thread affinity",
    ),
    (
        &[
            "-ctkd",
            "--cache-type-k-draft",
            "--spec-draft-type-k",
            "-ctvd",
            "--cache-type-v-draft",
            "--spec-draft-type-v",
        ],
        One,
        "the draft model's KV type (it takes the target's)",
    ),
    (
        &[
            "-ncmoed",
            "--n-cpu-moe-draft",
            "--spec-draft-n-cpu-moe",
            "--spec-draft-ncmoe",
        ],
        One,
        "the draft model's per-layer CPU placement",
    ),
    (
        &["--spec-draft-p-split", "--draft-p-split", "--spec-ngram-simple-min-hits", "--spec-ngram-map-k-min-hits", "--spec-ngram-map-k4v-min-hits", "--spec-ngram-min-hits", "--spec-ngram-mod-n-min"],
        One,
        "llama.cpp's draft tree splitting and n-gram hit counts (drafts here are the longest match)",
    ),
    (
        &[
            "--spec-draft-backend-sampling",
            "--no-spec-draft-backend-sampling",
        ],
        Flag,
        "the draft model's sampling on a device",
    ),
    (&["--poll", "--poll-batch"], One, "thread polling"),
    (
        &["--swa-full"],
        Flag,
        "sliding-window caches (every layer keeps its full window here)",
    ),
    (
        &["--perf", "--no-perf"],
        Flag,
        "libllama's internal timings",
    ),
    (
        &["-e", "--escape", "--no-escape"],
        Flag,
        "escapes in command-line prompts",
    ),
    (
        &["-kvo", "--kv-offload", "-nkvo", "--no-kv-offload"],
        Flag,
        "KV offload (offloaded layers keep their KV on the device)",
    ),
    (&["--no-host"], Flag, "host buffers"),
    (
        &["-dt", "--defrag-thold"],
        One,
        "defragmentation (the paged pool never fragments)",
    ),
    (
        &["-lm", "--load-mode"],
        One,
        "model loading (always mapped)",
    ),
    (&["-lzm", "--lazy-mode"], One, "lazy tensor reads"),
    (&["--mlock", "--no-mmap", "--mmap"], Flag, "memory mapping"),
    (&["--numa"], One, "NUMA placement"),
    (
        &["-fit", "--fit"],
        Optional(&["on", "off"]),
        "fitting options to device memory",
    ),
    (
        &["-fitt", "--fit-target"],
        One,
        "fitting options to device memory",
    ),
    (
        &["-fitc", "--fit-ctx"],
        One,
        "fitting options to device memory",
    ),
    (
        &["--check-tensors"],
        Flag,
        "tensor checks at load (every tensor's size and type are checked)",
    ),
    (
        &["--op-offload", "--no-op-offload"],
        Flag,
        "host operation offload",
    ),
    (&["--log-jsonl", "--no-log-jsonl"], Flag, "JSON log lines"),
    (
        &["--log-colors"],
        Optional(&["on", "off", "auto"]),
        "log colours",
    ),
    (&["--log-prefix", "--no-log-prefix"], Flag, "log prefixes"),
    (
        &["--log-timestamps", "--no-log-timestamps"],
        Flag,
        "log timestamps",
    ),
    (
        &["--offline"],
        Flag,
        "downloads (this server never downloads)",
    ),
    (
        &["-cb", "--cont-batching"],
        Flag,
        "continuous batching (always on)",
    ),
    (&["--warmup"], Flag, "a warm-up run (already on by default)"),
    (
        &["-cms", "--checkpoint-min-step"],
        One,
        "context checkpoints (every 64-token page is one)",
    ),
    (
        &["--cache-idle-slots", "--no-cache-idle-slots"],
        Flag,
        "caching idle slots (finished prompts always stay cached)",
    ),
    (
        &["-sp", "--special"],
        Flag,
        "special tokens in command-line output",
    ),
    (&["--sse-ping-interval"], One, "SSE pings"),
    (&["--reuse-port"], Flag, "shared ports"),
    (
        &["--cors-credentials", "--no-cors-credentials"],
        Flag,
        "CORS credentials",
    ),
    (
        &["--ui-config", "--webui-config"],
        One,
        "the llama.cpp web UI's settings",
    ),
    (
        &["--ui-config-file", "--webui-config-file"],
        One,
        "the llama.cpp web UI's settings",
    ),
    (
        &["--skip-chat-parsing", "--no-skip-chat-parsing"],
        Flag,
        "chat output parsing",
    ),
    (
        &["--reasoning-preserve", "--no-reasoning-preserve"],
        Flag,
        "reasoning kept in history",
    ),
    (
        &["-bs", "--backend-sampling", "--backend_sampling"],
        Flag,
        "sampling on the backend",
    ),
    (
        &["--no-mmproj", "--mmproj-auto", "--no-mmproj-auto"],
        Flag,
        "multimodal projectors",
    ),
    (&["--spm-infill"], Flag, "infill order"),
    (
        &["-dev", "--device"],
        One,
        "device lists (`-ngl` picks the first GPU)",
    ),
    (&["-sm", "--split-mode"], One, "splitting over several GPUs"),
    (
        &["-mg", "--main-gpu"],
        One,
        "the main GPU (the first one is used)",
    ),
];

/// Options for capabilities this server lacks: the capability.
const UNSUPPORTED: &[(&[&str], Arity, &str)] = &[
    (&["-cl", "--cache-list"], Flag, "the model download cache"),
    (&["--completion-bash"], Flag, "shell completion scripts"),
    (
        &[
            "--rope-scaling",
            "--rope-scale",
            "--rope-freq-base",
            "--rope-freq-scale",
        ],
        One,
        "RoPE scaling overrides",
    ),
    (
        &[
            "--yarn-orig-ctx",
            "--yarn-ext-factor",
            "--yarn-attn-factor",
            "--yarn-beta-slow",
            "--yarn-beta-fast",
        ],
        One,
        "YaRN context extension",
    ),
    (&["--rpc"], One, "RPC backends"),
    (&["--list-devices"], Flag, "device listing"),
    (
        &["-ot", "--override-tensor"],
        One,
        "tensor buffer overrides",
    ),
    (
        &[
            "-cmoe",
            "--cpu-moe",
            "-cmoed",
            "--cpu-moe-draft",
            "--spec-draft-cpu-moe",
        ],
        Flag,
        "mixture-of-experts placement",
    ),
    (
        &["-ncmoe", "--n-cpu-moe", "-ncffn", "--n-cpu-ffn"],
        One,
        "per-layer CPU placement",
    ),
    (
        &["-ts", "--tensor-split"],
        One,
        "splitting over several GPUs",
    ),
    (&["--override-kv"], One, "model metadata overrides"),
    (&["--lora", "--lora-scaled"], One, "LoRA adapters"),
    (&["--lora-init-without-apply"], Flag, "LoRA adapters"),
    (
        &["--control-vector", "--control-vector-scaled"],
        One,
        "control vectors",
    ),
    (&["--control-vector-layer-range"], Two, "control vectors"),
    (
        &[
            "-mu",
            "--model-url",
            "-dr",
            "--docker-repo",
            "-hf",
            "-hfr",
            "--hf-repo",
            "-hff",
            "--hf-file",
            "-hft",
            "--hf-token",
        ],
        One,
        "model downloads (give a local file with -m)",
    ),
    (
        &["-hfd", "-hfrd", "--hf-repo-draft", "--spec-draft-hf"],
        One,
        "draft model downloads (give a local file with -md)",
    ),
    (
        &[
            "-devd",
            "--device-draft",
            "--spec-draft-device",
            "-ngld",
            "--gpu-layers-draft",
            "--n-gpu-layers-draft",
            "--spec-draft-ngl",
            "-otd",
            "--override-tensor-draft",
            "--spec-draft-override-tensor",
            "--spec-synth-len",
        ],
        One,
        "speculative decoding on a device, or with a synthetic acceptance length (the draft \
         model runs on the CPU; give --spec-synth-rates)",
    ),
    (
        &[
            "-lcs",
            "--lookup-cache-static",
            "-lcd",
            "--lookup-cache-dynamic",
        ],
        One,
        "lookup decoding",
    ),
    (
        &["--kv-unified-per-slot"],
        One,
        "per-slot limits of a unified KV pool",
    ),
    (&["-r", "--reverse-prompt"], One, "interactive mode"),
    (
        &[
            "-mm",
            "--mmproj",
            "-mmu",
            "--mmproj-url",
            "-mmdev",
            "--mmproj-device",
            "--image-min-tokens",
            "--image-max-tokens",
            "--mtmd-batch-max-tokens",
            "--video-fps",
            "--video-timestamp-interval",
            "--video-ffmpeg-dir",
            "--media-path",
        ],
        One,
        "multimodal input (images, audio, video)",
    ),
    (
        &["--mmproj-offload", "--no-mmproj-offload"],
        Flag,
        "multimodal input (images, audio, video)",
    ),
    (&["--path"], One, "serving static files"),
    (
        &["--ssl-key-file", "--ssl-cert-file"],
        One,
        "TLS (put a TLS proxy in front)",
    ),
    (
        &["--reasoning-effort", "--reasoning-budget-message"],
        One,
        "reasoning effort levels",
    ),
    (&["--log-prompts-dir"], One, "prompt logging"),
    (
        &[
            "--embd-gemma-default",
            "--fim-qwen-1.5b-default",
            "--fim-qwen-3b-default",
            "--fim-qwen-7b-default",
            "--fim-qwen-7b-spec",
            "--fim-qwen-14b-spec",
            "--fim-qwen-30b-default",
        ],
        Flag,
        "model downloads (give a local file with -m)",
    ),
    (
        &["--grp-attn-n", "--grp-attn-w"],
        One,
        "self-extend (group attention)",
    ),
    (
        &["--adaptive-target", "--adaptive-decay"],
        One,
        "the adaptive-p sampler",
    ),
    (
        &[
            "--grammar",
            "--grammar-file",
            "-j",
            "--json-schema",
            "-jf",
            "--json-schema-file",
        ],
        One,
        "server-wide grammars (send `grammar` or `json_schema` per request)",
    ),
];

/// One accepted llama-server option that tunes nothing here.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NoEffect {
    /// The option as given.
    pub option: String,
    /// What it tunes in llama.cpp.
    pub tunes: &'static str,
}

/// The command line sorted: what clap is to parse, and the options without effect here.
pub(super) struct Sorted {
    pub argv: Vec<String>,
    pub no_effect: Vec<NoEffect>,
}

/// Rewrites llama-server's spellings, takes out the options without effect here and refuses
/// those for capabilities this server lacks (the message names option and capability).
pub(super) fn sort(argv: Vec<String>) -> Result<Sorted, String> {
    let mut out = Vec::with_capacity(argv.len());
    let mut no_effect = Vec::new();
    let mut it = argv.into_iter().peekable();
    if let Some(program) = it.next() {
        out.push(program);
    }
    while let Some(arg) = it.next() {
        if arg == "--" {
            out.push(arg);
            out.extend(it);
            break;
        }
        let (name, inline) = match arg.split_once('=') {
            Some((n, v)) if n.starts_with('-') => (n.to_owned(), Some(v.to_owned())),
            _ => (arg.clone(), None),
        };
        if let Some(&(_, long)) = SPELLINGS.iter().find(|(short, _)| *short == name) {
            out.push(match inline {
                Some(v) => format!("{long}={v}"),
                None => long.to_owned(),
            });
            continue;
        }
        let known = |table: &'static [(&'static [&'static str], Arity, &'static str)]| {
            table
                .iter()
                .find(|(names, _, _)| names.contains(&name.as_str()))
                .map(|&(_, arity, what)| (arity, what))
        };
        if let Some((_, capability)) = known(UNSUPPORTED) {
            return Err(format!(
                "{name}: llama-hdd-server has no {capability}; leave the option out"
            ));
        }
        if let Some((arity, tunes)) = known(NO_EFFECT) {
            if inline.is_none() {
                let takes = match arity {
                    Flag => 0,
                    One => 1,
                    Two => 2,
                    Optional(values) => {
                        usize::from(it.peek().is_some_and(|v| values.contains(&v.as_str())))
                    }
                };
                for _ in 0..takes {
                    if it.next().is_none() {
                        return Err(format!("{name} needs a value"));
                    }
                }
            }
            no_effect.push(NoEffect {
                option: name,
                tunes,
            });
            continue;
        }
        out.push(arg);
    }
    Ok(Sorted {
        argv: out,
        no_effect,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_is_in_one_table_only() {
        let mut seen = std::collections::HashSet::new();
        let names = SPELLINGS
            .iter()
            .map(|(n, _)| *n)
            .chain(NO_EFFECT.iter().flat_map(|(ns, _, _)| ns.iter().copied()))
            .chain(UNSUPPORTED.iter().flat_map(|(ns, _, _)| ns.iter().copied()));
        for name in names {
            assert!(seen.insert(name), "{name} is listed twice");
        }
    }

    #[test]
    fn values_of_options_without_effect_are_taken_with_them() {
        let argv = [
            "p",
            "--poll",
            "50",
            "--log-colors",
            "-m",
            "x",
            "--fit",
            "on",
            "-t",
            "2",
        ];
        let sorted = sort(argv.iter().map(|s| s.to_string()).collect()).unwrap();
        assert_eq!(sorted.argv, ["p", "-m", "x", "-t", "2"]);
        assert_eq!(sorted.no_effect.len(), 3);
    }
}
