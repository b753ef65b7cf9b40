//! `ckptfmt`: the on-disk checkpoint format of llama-hdd.
#![deny(unsafe_code)]

pub mod block;
pub mod error;
pub mod export;
pub mod geometry;
pub mod ids;
pub mod layout;
pub mod manifest;
pub mod mmap;
pub mod quant;
pub mod store;
pub mod vfs;

pub use block::{encode_block, BlockView, EncodedBlock, Encoding};
pub use error::{FormatError, Result};
pub use export::{write_export, Export, ExportView};
pub use geometry::{ElemType, Geometry, LayerGeometry, LayerSpan};
pub use ids::{BlockId, Fingerprint};
pub use manifest::{Manifest, ManifestView, Metadata};
pub use store::{BlockInput, MappedBlock, OwnedBlock, SaveReport, Store};
pub use vfs::{CrashMode, FaultFs, FaultMode, StdFs, Vfs, VfsFile};
