// The pinned ggml source: the one place its version is written.
// Included by `build.rs`, by the crate itself and by `xtask`, so it must stay plain constants.

/// Registry package whose published archive carries ggml's sources under `llama.cpp/ggml`.
pub const SOURCE_PACKAGE: &str = "llama-cpp-sys-2";
/// Exact version of [`SOURCE_PACKAGE`]; cargo verifies its checksum when it fetches it.
pub const SOURCE_PACKAGE_VERSION: &str = "0.1.161";
/// ggml version that this package carries and that the committed bindings were generated from.
pub const GGML_VERSION: &str = "0.26.0";
/// Path of ggml's tree inside the package.
pub const GGML_SUBDIR: &str = "llama.cpp/ggml";
/// Environment variable naming a ggml source tree to build instead of the pinned package.
pub const SOURCE_DIR_ENV: &str = "GGML_SYS_SOURCE_DIR";
