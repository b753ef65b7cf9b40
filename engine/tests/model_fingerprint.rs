//! The model fingerprint is an explicit, versioned encoding: pinned for a tiny model written by
//! the test (so an accidental change of the encoding, the writer or the hyperparameters fails
//! here), and different when any one hyperparameter differs.

mod common;

use common::{cfg, write_edited, Shape};
use engine::gguf::GgufWriter;
use engine::{Model, FINGERPRINT_VERSION};

fn hex(fp: [u8; 32]) -> String {
    fp.iter().map(|b| format!("{b:02x}")).collect()
}

fn fingerprint(edit: impl FnOnce(&mut GgufWriter)) -> String {
    let dir = tempfile::tempdir().unwrap();
    let path = write_edited(&cfg(Shape::Llama, false), dir.path(), "m.gguf", edit);
    hex(Model::load(&path).unwrap().fingerprint())
}

/// The tiny llama model's fingerprint under encoding version 3. If this changes on purpose, bump
/// `FINGERPRINT_VERSION` (stored checkpoints of every model are orphaned either way).
const PINNED: &str = "dea8d5724ca2af6e0009b651546f6df8144ac21444ac47635afd79fc315d88c4";

/// The same model's fingerprint under version 2 (tensors sampled at both ends), which
/// [`Model::legacy_fingerprint`] must reproduce to recognise the stores it named.
const PINNED_V2: &str = "7268c9c9b1c98c5a42e7a19dc804674e64aa204de187ce199bff30eb24b7e66a";

#[test]
fn the_fingerprint_of_a_tiny_model_is_pinned() {
    assert_eq!(FINGERPRINT_VERSION, 3);
    assert_eq!(fingerprint(|_| {}), PINNED);
    let dir = tempfile::tempdir().unwrap();
    let path = write_edited(&cfg(Shape::Llama, false), dir.path(), "m.gguf", |_| {});
    assert_eq!(
        hex(Model::load(&path).unwrap().legacy_fingerprint()),
        PINNED_V2
    );
}

/// A change to the tiny model's file.
type Edit = Box<dyn FnOnce(&mut GgufWriter)>;

#[test]
fn each_hyperparameter_changes_the_fingerprint() {
    let base = fingerprint(|_| {});
    let edits: Vec<(&str, Edit)> = vec![
        (
            "rms epsilon",
            Box::new(|w| {
                w.add_f32("llama.attention.layer_norm_rms_epsilon", 2e-5);
            }),
        ),
        (
            "rope base",
            Box::new(|w| {
                w.add_f32("llama.rope.freq_base", 20_000.0);
            }),
        ),
        (
            "rope dimensions",
            Box::new(|w| {
                w.add_u32("llama.rope.dimension_count", 4);
            }),
        ),
        (
            "training context",
            Box::new(|w| {
                w.add_u32("llama.context_length", 512);
            }),
        ),
        (
            "rope scaling",
            Box::new(|w| {
                w.add_str("llama.rope.scaling.type", "linear")
                    .add_f32("llama.rope.scaling.factor", 2.0);
            }),
        ),
    ];
    let mut seen = vec![base.clone()];
    for (what, edit) in edits {
        let fp = fingerprint(edit);
        assert!(!seen.contains(&fp), "{what} did not change the fingerprint");
        seen.push(fp);
    }
    // Metadata that does not change the computation leaves it alone.
    assert_eq!(
        fingerprint(|w| {
            w.add_str("general.name", "renamed");
        }),
        base
    );
}
