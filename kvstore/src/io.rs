//! The I/O seam: every file operation of the store goes through [`BlockIo`],
//! which is `ckptfmt`'s [`Vfs`] (create, write, sync, read, rename, remove,
//! list, directory sync, advisory locks) for any cloneable file system.
//! [`StdFs`] is the real file system; `FaultIo` (feature `test-util`) is an
//! in-memory one for tests that injects ENOSPC, EIO, fsync failures and
//! crashes.

#[allow(unused_imports)]
use ckptfmt::StdFs;
use ckptfmt::Vfs;

/// The file operations of a store: any cloneable [`Vfs`].
pub trait BlockIo: Vfs + Clone + 'static {}

impl<T: Vfs + Clone + 'static> BlockIo for T {}
