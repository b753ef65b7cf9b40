//! The remote tier's command-line options (feature `cli`), one definition for every program
//! that opens a store: the server, the chat and the ingest example flatten [`RemoteArgs`].

use std::path::PathBuf;
use std::time::Duration;

use super::RemoteConfig;

/// `--cache-remote`, `--cache-remote-namespace`, `--cache-remote-timeout`, `--cache-remote-ca`.
#[derive(Clone, Debug, clap::Args)]
pub struct RemoteArgs {
    /// A Redis shared by several machines as a tier below the cache directory:
    /// `redis://[:PASSWORD@]HOST:PORT[/DB]`, or `rediss://…` for TLS. KV one machine computed
    /// is read by the others instead of computed again; nothing fails when Redis is down.
    #[arg(
        long = "cache-remote",
        value_name = "URL",
        env = "LLAMA_HDD_CACHE_REMOTE"
    )]
    pub cache_remote: Option<String>,
    /// Prefix of the remote tier's keys, so several deployments can share one Redis.
    #[arg(
        long = "cache-remote-namespace",
        value_name = "NAME",
        default_value = "llama-hdd",
        requires = "cache_remote"
    )]
    pub cache_remote_namespace: String,
    /// The longest a call to the remote tier may wait, in milliseconds (connecting, and each
    /// read and write).
    #[arg(
        long = "cache-remote-timeout",
        value_name = "MS",
        default_value_t = 100,
        requires = "cache_remote"
    )]
    pub cache_remote_timeout: u64,
    /// For a `rediss://` URL: a PEM file of the CA certificates that sign the server's, trusted
    /// instead of the system's (a private CA).
    #[arg(
        long = "cache-remote-ca",
        value_name = "FILE",
        env = "LLAMA_HDD_CACHE_REMOTE_CA",
        requires = "cache_remote"
    )]
    pub cache_remote_ca: Option<PathBuf>,
}

impl RemoteArgs {
    /// The remote tier asked for, if any; `Err((option, reason))` for a value that cannot be
    /// used.
    pub fn config(&self) -> Result<Option<RemoteConfig>, (&'static str, String)> {
        let Some(url) = self.cache_remote.as_deref().map(str::trim) else {
            return Ok(None);
        };
        let tls = url.starts_with("rediss://");
        if !(tls || url.starts_with("redis://") || url.starts_with("redis+unix://")) {
            return Err((
                "--cache-remote",
                format!(
                    "{url:?} is not a Redis URL (redis://HOST:PORT[/DB], or rediss:// for TLS)"
                ),
            ));
        }
        if self.cache_remote_ca.is_some() && !tls {
            return Err((
                "--cache-remote-ca",
                format!("{url:?} is not encrypted: a CA is for a rediss:// (TLS) URL"),
            ));
        }
        if self.cache_remote_timeout == 0 {
            return Err((
                "--cache-remote-timeout",
                "0 ms leaves no time for any call".into(),
            ));
        }
        let namespace = self.cache_remote_namespace.trim();
        if namespace.is_empty() || namespace.contains(|c: char| c.is_whitespace() || c == ':') {
            return Err((
                "--cache-remote-namespace",
                format!("{namespace:?}: a name without spaces or ':' is needed"),
            ));
        }
        Ok(Some(RemoteConfig {
            url: url.to_owned(),
            namespace: namespace.to_owned(),
            timeout: Duration::from_millis(self.cache_remote_timeout),
            ca: self.cache_remote_ca.clone(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::RemoteArgs;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        remote: RemoteArgs,
    }

    fn config(args: &[&str]) -> Result<Option<super::RemoteConfig>, &'static str> {
        let cli = Cli::try_parse_from(std::iter::once("x").chain(args.iter().copied()))
            .map_err(|_| "parse")?;
        cli.remote.config().map_err(|(option, _)| option)
    }

    #[test]
    fn a_ca_goes_with_a_rediss_url_only() {
        let c = config(&[
            "--cache-remote",
            "rediss://h:6380",
            "--cache-remote-ca",
            "ca.pem",
        ])
        .unwrap()
        .unwrap();
        assert_eq!(c.ca.as_deref(), Some(std::path::Path::new("ca.pem")));
        assert!(config(&["--cache-remote", "rediss://h:6380"])
            .unwrap()
            .unwrap()
            .ca
            .is_none());
        // Not encrypted: the CA would be ignored.
        assert_eq!(
            config(&[
                "--cache-remote",
                "redis://h:6379",
                "--cache-remote-ca",
                "ca.pem"
            ])
            .unwrap_err(),
            "--cache-remote-ca"
        );
        // Without a tier, nothing to use it for.
        assert_eq!(
            config(&["--cache-remote-ca", "ca.pem"]).unwrap_err(),
            "parse"
        );
        assert_eq!(
            config(&["--cache-remote", "http://h"]).unwrap_err(),
            "--cache-remote"
        );
    }
}
