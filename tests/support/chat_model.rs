//! The tiny chat model the chat's tests write: [`engine::testing::TinyChatModel`] with the letter
//! merges (so a reply sampled letter by letter tokenizes differently when encoded again).

use std::path::Path;

use engine::testing::TinyChatModel;

/// Writes the tiny model with `template` as its chat template (ChatML when `None`).
pub fn write_model(path: &Path, template: Option<&str>) {
    write_model_wide(path, template, 32);
}

/// The tiny model with `n_embd` (4 heads of `n_embd / 4`; 128 gives heads of whole q8_0 blocks).
pub fn write_model_wide(path: &Path, template: Option<&str>, n_embd: usize) {
    TinyChatModel {
        n_embd,
        letter_merges: true,
        template: template.map(str::to_owned),
        seed: 7,
        ..TinyChatModel::default()
    }
    .write(path)
    .unwrap();
}
