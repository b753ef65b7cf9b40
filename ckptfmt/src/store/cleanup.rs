//! Removing what dead writers left behind: temporary files and owner files.

use std::time::Duration;

use super::{Store, TMP_SUFFIX};
use crate::error::{FormatError, Result};
use crate::sharing;
use crate::vfs::{LockMode, Vfs};

impl<V: Vfs> Store<V> {
    /// Removes temporary files whose writer is gone (a save that did not
    /// commit, in a process that died) and the owner files of dead writers.
    /// Runs only when the exclusive lock is free right now (otherwise the
    /// next open does it). Returns how many temporary files were removed.
    /// Called by `open`.
    pub fn recover(&self) -> Result<usize> {
        self.owner("recover")?;
        let Some(_excl) = sharing::acquire(
            &self.vfs,
            &self.root,
            LockMode::Exclusive,
            Duration::ZERO,
            true,
        )
        .ok()
        .flatten() else {
            return Ok(0);
        };
        self.remove_dead_tmps()
    }

    /// The cleanup of [`Store::recover`]; the caller holds the exclusive lock.
    pub(super) fn remove_dead_tmps(&self) -> Result<usize> {
        let mut n = 0;
        let mut verdicts: std::collections::HashMap<String, bool> = Default::default();
        for dir in [&self.root, &self.blocks_dir, &self.manifests_dir] {
            for name in self
                .vfs
                .list(dir)
                .map_err(|e| FormatError::io("list", dir, e))?
            {
                if !name.ends_with(TMP_SUFFIX) {
                    continue;
                }
                // A name without an owner token is a legacy writer's: under
                // the exclusive lock no save of ours runs, so it is stale.
                let alive = match sharing::tmp_owner(&name) {
                    Some(token) => match verdicts.get(token) {
                        Some(v) => *v,
                        None => {
                            let v = sharing::is_alive(&self.vfs, &self.root, token)?;
                            verdicts.insert(token.to_string(), v);
                            v
                        }
                    },
                    None => false,
                };
                if !alive {
                    let p = dir.join(&name);
                    match self.vfs.remove(&p) {
                        Ok(()) => n += 1,
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                        Err(e) => return Err(FormatError::io("remove", &p, e)),
                    }
                }
            }
        }
        let owners_dir = self.root.join(sharing::OWNERS_DIR);
        for token in sharing::owners(&self.vfs, &self.root) {
            if !sharing::is_alive(&self.vfs, &self.root, &token)? {
                let p = owners_dir.join(format!("{token}{}", sharing::OWNER_SUFFIX));
                let _ = self.vfs.remove(&p);
            }
        }
        Ok(n)
    }
}
