//! `ckpt`: see, manage, verify and benchmark checkpoint stores.
//!
//! A store directory (`DIR`) is a `kvstore` directory: one `ckptfmt` store per
//! model fingerprint under `DIR/models/`.
//!
//! - `ckpt ls DIR`: one line per checkpoint (model, name, tokens, bytes it
//!   alone holds, last use in UTC) under a header line.
//! - `ckpt rm DIR NAME [--model FP_PREFIX]`: deletes a checkpoint (its blocks
//!   go at the next `gc`); a name several models use needs `--model`.
//! - `ckpt gc DIR [--max-bytes SIZE]`: deletes block files no checkpoint
//!   needs, least recently used first, down to SIZE (`50MB`, `1GiB`; all of
//!   them without it), and prints what was freed.
//! - `ckpt migrate LEGACY_DIR DIR`: imports a bare `ckptfmt` store (the
//!   layout of the chat's `sessions/` directory before `kvstore`); the legacy
//!   directory is only read.
//! - `ckpt verify PATH`: on a directory, checks every file read-only and
//!   reports every bad one by name, then a summary; on a single block,
//!   manifest or export file, checks it. Exit status 1 when anything is bad.
//! - `ckpt inspect PATH [--json]`: describes a store directory or one file.
//! - `ckpt bench-shared --dir DIR --processes N`: several processes saving into one store
//!   at once, against raw writes of the same bytes.
//! - `ckpt bench --dir DIR --tokens N [...]`: the format's write and read
//!   figures against raw I/O, as JSON.
//!
//! Output to a closed pipe (`ckpt inspect DIR | head -1`) ends the command
//! quietly.

mod bench;
mod files;
mod manage;
#[cfg(feature = "redis")]
mod remote;
mod shared;
mod verify;

use std::io::{self, BufWriter, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use ckptfmt::FormatError;
use clap::{Parser, Subcommand};
use kvstore::StoreError;

#[derive(Parser)]
#[command(
    name = "ckpt",
    about = "See, manage, verify and benchmark checkpoint stores"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// List every checkpoint of a store directory.
    Ls {
        /// Store directory.
        dir: PathBuf,
    },
    /// Delete a checkpoint (its blocks are freed by `ckpt gc`).
    Rm {
        /// Store directory.
        dir: PathBuf,
        /// Checkpoint name.
        name: String,
        /// The model's fingerprint, or its first hex digits (needed when
        /// several models have a checkpoint of that name).
        #[arg(long, value_name = "FP_PREFIX")]
        model: Option<String>,
    },
    /// Delete block files no checkpoint needs, least recently used first.
    Gc {
        /// Store directory.
        dir: PathBuf,
        /// Collect until block files take at most this much (`50MB`, `1GiB`,
        /// `4096`); without it, everything collectable.
        #[arg(long, value_name = "SIZE", value_parser = parse_size_arg)]
        max_bytes: Option<u64>,
    },
    /// Import a bare ckptfmt store (an old `sessions/` directory); it is only read.
    Migrate {
        /// The bare ckptfmt store to import.
        legacy_dir: PathBuf,
        /// Store directory to import into (created when absent).
        dir: PathBuf,
    },
    /// Verify every file read-only; report each bad one; exit 1 if any.
    Verify {
        /// Store directory, bare ckptfmt store, or one block, manifest or export file.
        path: PathBuf,
    },
    /// Describe a store directory, a bare ckptfmt store, or one file.
    Inspect {
        /// Store directory, bare ckptfmt store, or one block, manifest or export file.
        path: PathBuf,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Write and read a synthetic checkpoint; print throughput as JSON.
    Bench {
        /// Directory to write in (a fresh subdirectory is used and removed).
        #[arg(long)]
        dir: PathBuf,
        /// Tokens in the checkpoint.
        #[arg(long)]
        tokens: u64,
        /// Layers.
        #[arg(long, default_value_t = 30)]
        layers: usize,
        /// Bytes per token per layer, for K and for V each (SmolLM2-135M f16: 384).
        #[arg(long, default_value_t = 384)]
        bytes_per_token: u32,
        /// Tokens per block.
        #[arg(long, default_value_t = ckptfmt::DEFAULT_TOKENS_PER_BLOCK)]
        tokens_per_block: u32,
        /// Store blocks as q8_0 instead of raw.
        #[arg(long)]
        q8: bool,
        /// Repetitions of each measurement (the best is reported).
        #[arg(long, default_value_t = 3)]
        iters: u32,
    },
    /// Several processes saving into one store at once, against raw writes of the same bytes;
    /// prints JSON.
    BenchShared {
        /// Directory to work in (a fresh subdirectory is used and removed); with `--worker`,
        /// the store itself.
        #[arg(long)]
        dir: PathBuf,
        /// Processes saving at once (the run with 1 process is measured too).
        #[arg(long, default_value_t = 2)]
        processes: usize,
        /// Checkpoints each process saves.
        #[arg(long, default_value_t = 8)]
        checkpoints: usize,
        /// Tokens of each checkpoint.
        #[arg(long, default_value_t = 512)]
        tokens: u32,
        /// Layers.
        #[arg(long, default_value_t = 30)]
        layers: usize,
        /// Bytes per token per layer, for K and for V each.
        #[arg(long, default_value_t = 384)]
        bytes_per_token: u32,
        /// Repetitions (alternating store and raw runs; medians are reported).
        #[arg(long, default_value_t = 3)]
        reps: usize,
        /// Internal: run as worker N of a measurement.
        #[arg(long, hide = true)]
        worker: Option<usize>,
    },
    /// The remote tier's read throughput on a Redis (one prompt's blocks in one call, raw and
    /// verified into RAM); prints JSON.
    #[cfg(feature = "redis")]
    BenchRemote {
        /// The Redis (`redis://HOST:PORT`; `rediss://HOST:PORT#insecure` for TLS to a test
        /// server whose certificate is not verified).
        #[arg(long)]
        url: String,
        /// Blocks of the prompt (31: 2,000 tokens).
        #[arg(long, default_value_t = 31)]
        blocks: usize,
        /// Layers.
        #[arg(long, default_value_t = 30)]
        layers: usize,
        /// Bytes per token per layer, for K and for V each.
        #[arg(long, default_value_t = 384)]
        bytes_per_token: u32,
        /// Repetitions (medians are reported).
        #[arg(long, default_value_t = 5)]
        reps: usize,
    },
}

/// Why a command failed.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// A store operation failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A file of the format could not be read or is bad.
    #[error(transparent)]
    Format(#[from] FormatError),
    /// The arguments do not fit the directory (with what to do instead).
    #[error("{0}")]
    Usage(String),
    /// Writing the output failed (a closed pipe ends the command quietly).
    #[error("writing the output: {0}")]
    Output(#[from] io::Error),
}

fn parse_size_arg(s: &str) -> Result<u64, String> {
    kvstore::parse_size(s).map_err(|e| e.to_string())
}

fn run(cmd: Cmd, out: &mut dyn Write) -> Result<ExitCode, CliError> {
    match cmd {
        Cmd::Ls { dir } => manage::ls(&dir, out),
        Cmd::Rm { dir, name, model } => manage::rm(&dir, &name, model.as_deref(), out),
        Cmd::Gc { dir, max_bytes } => manage::gc(&dir, max_bytes, out),
        Cmd::Migrate { legacy_dir, dir } => manage::migrate(&legacy_dir, &dir, out),
        Cmd::Verify { path } => {
            if path.is_dir() {
                verify::verify_dir(&path, out)
            } else {
                files::verify_file(&path, out)
            }
        }
        Cmd::Inspect { path, json } => files::inspect(&path, json, out).map(|()| ExitCode::SUCCESS),
        Cmd::Bench {
            dir,
            tokens,
            layers,
            bytes_per_token,
            tokens_per_block,
            q8,
            iters,
        } => {
            let args = bench::BenchArgs {
                tokens,
                layers,
                bytes_per_token,
                tokens_per_block,
                q8,
                iters,
            };
            bench::run(&dir, &args, out).map(|()| ExitCode::SUCCESS)
        }
        Cmd::BenchShared {
            dir,
            processes,
            checkpoints,
            tokens,
            layers,
            bytes_per_token,
            reps,
            worker,
        } => {
            let args = shared::SharedArgs {
                checkpoints,
                tokens,
                layers,
                bytes_per_token,
            };
            match worker {
                Some(id) => shared::worker(&dir, id, &args),
                None => shared::run(&dir, processes, reps, &args, out),
            }
            .map(|()| ExitCode::SUCCESS)
        }
        #[cfg(feature = "redis")]
        Cmd::BenchRemote {
            url,
            blocks,
            layers,
            bytes_per_token,
            reps,
        } => {
            let args = remote::RemoteArgs {
                url,
                blocks,
                layers,
                bytes_per_token,
                reps,
            };
            remote::run(&args, out).map(|()| ExitCode::SUCCESS)
        }
    }
}

/// Whether `e` is the reader of our output having gone away.
pub fn is_broken_pipe(e: &CliError) -> bool {
    matches!(e, CliError::Output(e) if e.kind() == io::ErrorKind::BrokenPipe)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let mut out = BufWriter::new(io::stdout().lock());
    match run(cli.cmd, &mut out) {
        // A closed pipe after the work is done keeps the work's status.
        Ok(code) => match out.flush() {
            Ok(()) => code,
            Err(e) if e.kind() == io::ErrorKind::BrokenPipe => code,
            Err(e) => {
                let _ = writeln!(io::stderr(), "error: writing the output: {e}");
                ExitCode::FAILURE
            }
        },
        Err(e) if is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            // What was printed before the failure goes first (unless the
            // pipe is closed too), then the error; neither may panic.
            let _ = out.flush();
            let _ = writeln!(io::stderr(), "error: {e}");
            ExitCode::FAILURE
        }
    }
}
