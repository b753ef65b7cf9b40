//! Router mode's options (`--models-dir`, `--models-preset`, `--models-max`,
//! `--no-models-autoload`), as llama-server spells them.

use std::path::PathBuf;

use clap::ArgAction;

/// The router's options, flattened into [`super::Args`]; they mean something only without
/// `-m`.
#[derive(Clone, Debug, clap::Args)]
pub struct RouterArgs {
    /// A folder of models: each `.gguf` file in it, and each subfolder holding one, is a model
    /// named after the file (less `.gguf`) or the subfolder.
    #[arg(long = "models-dir", value_name = "PATH", env = "LLAMA_ARG_MODELS_DIR")]
    pub models_dir: Option<PathBuf>,
    /// An INI file of models: each `[name]` section's keys are a model process's options
    /// (`model = PATH`, `hf-repo = REPO:TAG` from the hub cache, `ctx-size = N`, ...); a `[*]`
    /// section's apply to every model.
    #[arg(
        long = "models-preset",
        value_name = "PATH",
        env = "LLAMA_ARG_MODELS_PRESET"
    )]
    pub models_preset: Option<PathBuf>,
    /// Most models running at once; a request for another one waits for the least recently
    /// used idle model to be unloaded (0: no limit).
    #[arg(
        long = "models-max",
        value_name = "N",
        default_value_t = 4,
        env = "LLAMA_ARG_MODELS_MAX"
    )]
    pub models_max: usize,
    /// Load a model when a request names it (the default).
    #[arg(long = "models-autoload", action = ArgAction::SetTrue, overrides_with = "no_models_autoload")]
    pub models_autoload: bool,
    /// Only `POST /models/load` loads a model; a request for an unloaded one is refused.
    #[arg(long = "no-models-autoload", action = ArgAction::SetTrue, overrides_with = "models_autoload", env = "LLAMA_ARG_NO_MODELS_AUTOLOAD")]
    pub no_models_autoload: bool,
}

impl RouterArgs {
    /// Refuses the router's folders alongside `-m` (`with_model`), and in router mode the
    /// options of `naming` that are given (a model's names: router mode names each model after
    /// its file or preset section).
    pub(super) fn check(
        &self,
        with_model: bool,
        naming: [(&'static str, bool); 2],
    ) -> crate::error::Result<()> {
        let bad = |option: &'static str, reason: &str| crate::error::ServerError::BadOption {
            option,
            reason: reason.into(),
        };
        let without_m = "router mode is without -m";
        if with_model && self.models_dir.is_some() {
            return Err(bad("--models-dir", without_m));
        }
        if with_model && self.models_preset.is_some() {
            return Err(bad("--models-preset", without_m));
        }
        if let Some((option, _)) = naming.iter().find(|(_, given)| !with_model && *given) {
            return Err(bad(
                option,
                "router mode names each model after its file or preset section",
            ));
        }
        Ok(())
    }

    /// Whether a request loads the model it names.
    pub fn autoload(&self) -> bool {
        !self.no_models_autoload
    }

    /// The options that only the router reads: they are not passed on to the model processes.
    /// Each with whether it takes a value.
    pub const OWN: &'static [(&'static str, bool)] = &[
        ("--models-dir", true),
        ("--models-preset", true),
        ("--models-max", true),
        ("--models-autoload", false),
        ("--no-models-autoload", false),
        ("--host", true),
        ("--port", true),
        ("-a", true),
        ("--alias", true),
        ("--tags", true),
        // The router serves `/tools` itself: its model processes start no tools.
        ("--tools", true),
        ("--tools-runtime", true),
        ("--tools-root", true),
        ("--mcp-servers-config", true),
        ("--mcp-servers-json", true),
        ("-ag", false),
        ("--agent", false),
        ("-no-ag", false),
        ("--no-agent", false),
    ];
}
