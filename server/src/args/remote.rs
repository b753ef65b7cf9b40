//! The prompt cache's remote tier options (`--cache-remote`, `--cache-remote-namespace`,
//! `--cache-remote-timeout`, `--cache-remote-ca`): kvstore's [`RemoteArgs`], checked into a
//! server error.

use engine::store::RemoteConfig;
pub use kvstore::remote::RemoteArgs;

use crate::error::ServerError;

/// The remote tier `args` ask for, if any; refused with `--no-cache` (no store to put it
/// under) rather than ignored.
pub fn remote_config(
    args: &RemoteArgs,
    no_cache: bool,
) -> Result<Option<RemoteConfig>, ServerError> {
    let config = args
        .config()
        .map_err(|(option, reason)| ServerError::BadOption { option, reason })?;
    if config.is_some() && no_cache {
        return Err(ServerError::BadOption {
            option: "--cache-remote",
            reason: "it is a tier of the prompt cache, which --no-cache turns off".into(),
        });
    }
    Ok(config)
}
