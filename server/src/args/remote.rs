//! The prompt cache's remote tier options (`--cache-remote`, `--cache-remote-namespace`,
//! `--cache-remote-timeout`): kvstore's [`RemoteArgs`], checked into a server error.

use engine::store::RemoteConfig;
pub use kvstore::remote::RemoteArgs;

use crate::error::ServerError;

/// The remote tier `args` ask for, if any.
pub fn remote_config(args: &RemoteArgs) -> Result<Option<RemoteConfig>, ServerError> {
    args.config()
        .map_err(|(option, reason)| ServerError::BadOption { option, reason })
}
