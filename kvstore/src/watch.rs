//! Changes to a model store's two directories, as the kernel reports them (inotify on Linux):
//! the files any process created, renamed, deleted or touched since the last look. The kernel
//! queues an event within the call that makes the change, so once a process's rename has
//! returned, its event is there to be read.

use std::collections::BTreeSet;
use std::path::Path;

/// What changed since the last [`Watch::drain`].
#[derive(Debug)]
pub(crate) enum Changes {
    /// The names of the files (in `blocks/` and `manifests/`) that changed in any way.
    Named {
        blocks: BTreeSet<String>,
        manifests: BTreeSet<String>,
    },
    /// The events may be incomplete (the queue overflowed, a directory went away): look at
    /// everything.
    Unknown,
}

#[cfg(target_os = "linux")]
pub(crate) use linux::Watch;

#[cfg(target_os = "linux")]
mod linux {
    use std::mem::MaybeUninit;
    use std::os::fd::OwnedFd;

    use rustix::fs::inotify::{self, CreateFlags, ReadFlags, WatchFlags};
    use rustix::io::Errno;

    use super::{BTreeSet, Changes, Path};

    /// An inotify instance watching a store's `blocks/` and `manifests/`.
    pub(crate) struct Watch {
        fd: OwnedFd,
        blocks: i32,
        manifests: i32,
        buf: Vec<MaybeUninit<u8>>,
    }

    impl std::fmt::Debug for Watch {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("Watch").finish_non_exhaustive()
        }
    }

    impl Watch {
        /// Watches the store at `root`; `None` when the kernel refuses (no inotify, the limit
        /// of instances or watches reached, directories it cannot see).
        pub(crate) fn new(root: &Path) -> Option<Watch> {
            let fd = inotify::init(CreateFlags::CLOEXEC | CreateFlags::NONBLOCK).ok()?;
            let flags = WatchFlags::CREATE
                | WatchFlags::MOVED_TO
                | WatchFlags::MOVED_FROM
                | WatchFlags::DELETE
                | WatchFlags::ATTRIB
                | WatchFlags::CLOSE_WRITE
                | WatchFlags::DELETE_SELF
                | WatchFlags::MOVE_SELF
                | WatchFlags::ONLYDIR;
            let watch = |dir: &str| inotify::add_watch(&fd, root.join(dir), flags).ok();
            let blocks = watch(ckptfmt::store::BLOCKS_DIR)?;
            let manifests = watch(ckptfmt::store::MANIFESTS_DIR)?;
            Some(Watch {
                fd,
                blocks,
                manifests,
                buf: vec![MaybeUninit::uninit(); 64 << 10],
            })
        }

        /// Every change queued since the last call.
        pub(crate) fn drain(&mut self) -> Changes {
            let mut blocks = BTreeSet::new();
            let mut manifests = BTreeSet::new();
            let mut reader = inotify::Reader::new(&self.fd, &mut self.buf);
            loop {
                let event = match reader.next() {
                    Ok(e) => e,
                    Err(Errno::AGAIN) => break,
                    Err(Errno::INTR) => continue,
                    Err(_) => return Changes::Unknown,
                };
                let gone = ReadFlags::QUEUE_OVERFLOW
                    | ReadFlags::IGNORED
                    | ReadFlags::DELETE_SELF
                    | ReadFlags::MOVE_SELF
                    | ReadFlags::UNMOUNT;
                if event.events().intersects(gone) {
                    return Changes::Unknown;
                }
                let Some(name) = event.file_name().and_then(|n| n.to_str().ok()) else {
                    continue;
                };
                if name.ends_with(ckptfmt::store::TMP_SUFFIX) {
                    continue;
                }
                if event.wd() == self.blocks {
                    blocks.insert(name.to_owned());
                } else if event.wd() == self.manifests {
                    manifests.insert(name.to_owned());
                }
            }
            Changes::Named { blocks, manifests }
        }
    }
}

#[cfg(not(target_os = "linux"))]
pub(crate) use other::Watch;

#[cfg(not(target_os = "linux"))]
mod other {
    use super::{Changes, Path};

    /// No change notifications here: every collection lists the directories.
    #[derive(Debug)]
    pub(crate) struct Watch;

    impl Watch {
        pub(crate) fn new(_root: &Path) -> Option<Watch> {
            None
        }

        pub(crate) fn drain(&mut self) -> Changes {
            Changes::Unknown
        }
    }
}
