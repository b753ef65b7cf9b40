//! Long documents read through `engine::ingest` on a tiny model the test writes: an ingestion
//! stopped halfway (before or after context shifts) and run again in a fresh session and store
//! handle ends with the same KV bytes and logits, bit for bit, as one that was never stopped
//! (and as a plain prefill); a changed document resumes up to where it changed; bad input is a
//! typed error that changes nothing.

mod common;

use std::ops::ControlFlow;
use std::path::Path;

use common::*;
use engine::ingest::{ingest, IngestParams, ShiftPolicy};
use engine::store::{SessionStore, StoreConfig};
use engine::{Error, Model, Session};

const N_UBATCH: usize = 32;
const INTERVAL: usize = 64;

fn open(dir: &Path, model: &Model) -> SessionStore {
    SessionStore::open(dir, model, StoreConfig::default()).unwrap()
}

fn session(model: &std::sync::Arc<Model>) -> Session {
    let mut p = params(N_UBATCH);
    p.n_ctx = 256;
    Session::new(model.clone(), p).unwrap()
}

fn doc_params() -> IngestParams {
    IngestParams {
        name: "doc".to_owned(),
        interval: INTERVAL,
        shift: None,
    }
}

/// Every layer's K and V bytes of all positions held.
fn kv_bytes(s: &Session) -> Vec<u8> {
    s.kv_bytes().unwrap()
}

fn continue_all(_: &engine::Progress) -> ControlFlow<()> {
    ControlFlow::Continue(())
}

#[test]
fn a_stopped_ingestion_resumes_to_the_same_bits() {
    let c = cfg(Shape::Llama, false);
    let (dir, model, _) = build(&c, 5);
    let doc = tokens(240);

    // Uninterrupted, and a plain prefill of the same tokens for comparison.
    let whole_store = open(&dir.path().join("whole"), &model);
    let mut whole = session(&model);
    let report = ingest(&mut whole, &whole_store, &doc, &doc_params(), continue_all).unwrap();
    assert!(report.finished);
    assert_eq!((report.restored, report.computed), (0, 240));
    assert_eq!(report.checkpoints, 4, "at 64, 128, 192 and the end");
    let want_kv = kv_bytes(&whole);
    let want_logits = whole.logits().unwrap().to_vec();
    let mut plain = session(&model);
    plain.feed(&doc).unwrap();
    assert_eq!(kv_bytes(&plain), want_kv);
    assert_eq!(plain.logits().unwrap(), &want_logits[..]);

    // Stopped after 150 tokens: the micro-batch ending at 160 completes, and is saved.
    let store_dir = dir.path().join("stopped");
    let mut seen = Vec::new();
    {
        let store = open(&store_dir, &model);
        let mut s = session(&model);
        let report = ingest(&mut s, &store, &doc, &doc_params(), |p| {
            seen.push(p.done);
            if p.done >= 150 {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        })
        .unwrap();
        assert!(!report.finished);
        assert_eq!((report.computed, report.checkpoints), (160, 3));
        assert!(store.exists("doc").unwrap());
    }
    assert_eq!(seen, [0, 32, 64, 96, 128, 160]);

    // A fresh store handle and session, as after a restart: the stored blocks come back.
    let store = open(&store_dir, &model);
    let mut s = session(&model);
    let mut first = None;
    let report = ingest(&mut s, &store, &doc, &doc_params(), |p| {
        first.get_or_insert(p.clone());
        ControlFlow::Continue(())
    })
    .unwrap();
    assert!(report.finished);
    assert_eq!(
        report.restored, 128,
        "the full blocks of the 160 tokens kept"
    );
    assert_eq!(report.computed, 240 - 128);
    let first = first.unwrap();
    assert_eq!((first.done, first.restored, first.computed), (128, 128, 0));
    assert_eq!(s.tokens(), &doc[..]);
    assert!(kv_bytes(&s) == want_kv, "KV bytes differ after resuming");
    assert_eq!(s.logits().unwrap(), &want_logits[..]);

    // Run once more: everything but the partial last block is restored.
    let mut again = session(&model);
    let report = ingest(&mut again, &store, &doc, &doc_params(), continue_all).unwrap();
    assert_eq!((report.restored, report.computed), (192, 48));
    assert!(kv_bytes(&again) == want_kv);
    assert_eq!(again.logits().unwrap(), &want_logits[..]);
}

#[test]
fn a_changed_document_resumes_up_to_the_change() {
    let c = cfg(Shape::Qwen2, false);
    let (dir, model, _) = build(&c, 6);
    let doc = tokens(200);
    let store = open(&dir.path().join("store"), &model);
    let mut s = session(&model);
    ingest(&mut s, &store, &doc, &doc_params(), continue_all).unwrap();

    let mut edited = doc.clone();
    edited[100] = (edited[100] + 1) % 97;
    let mut t = session(&model);
    let report = ingest(&mut t, &store, &edited, &doc_params(), continue_all).unwrap();
    assert_eq!((report.restored, report.computed), (64, 136));
    let mut plain = session(&model);
    plain.feed(&edited).unwrap();
    assert!(kv_bytes(&t) == kv_bytes(&plain));
    assert_eq!(t.logits().unwrap(), plain.logits().unwrap());
}

#[test]
fn a_session_holding_a_prefix_continues_it() {
    let c = cfg(Shape::Llama, true);
    let (dir, model, _) = build(&c, 7);
    let doc = tokens(130);
    let store = open(&dir.path().join("store"), &model);
    let mut s = session(&model);
    s.feed(&doc[..64]).unwrap();
    let report = ingest(&mut s, &store, &doc, &doc_params(), continue_all).unwrap();
    assert_eq!((report.restored, report.computed), (64, 66));
    assert_eq!(s.tokens(), &doc[..]);
}

#[test]
fn bad_input_is_a_typed_error_that_changes_nothing() {
    let c = cfg(Shape::Llama, false);
    let (dir, model, _) = build(&c, 8);
    let store = open(&dir.path().join("store"), &model);
    let mut s = session(&model);
    s.feed(&[1, 2, 3]).unwrap();
    let before = kv_bytes(&s);

    let err = ingest(&mut s, &store, &[], &doc_params(), continue_all).unwrap_err();
    assert!(matches!(err, Error::EmptyDocument), "{err}");
    let err = ingest(&mut s, &store, &tokens(257), &doc_params(), continue_all).unwrap_err();
    assert!(
        matches!(
            err,
            Error::ContextFull {
                needed: 257,
                n_ctx: 256
            }
        ),
        "{err}"
    );
    let err = ingest(&mut s, &store, &tokens(10), &doc_params(), continue_all).unwrap_err();
    assert!(matches!(err, Error::NotAPrefix { held: 3, .. }), "{err}");
    let err = ingest(&mut s, &store, &[1, 2], &doc_params(), continue_all).unwrap_err();
    assert!(matches!(err, Error::NotAPrefix { held: 3, .. }), "{err}");

    assert_eq!(s.tokens(), &[1, 2, 3]);
    assert!(kv_bytes(&s) == before);
    assert!(!store.exists("doc").unwrap());
}

#[test]
fn a_document_longer_than_the_context_is_shifted_and_resumes_to_the_same_bits() {
    let c = cfg(Shape::Qwen2, false);
    let (dir, model, _) = build(&c, 9);
    let doc = tokens(600);
    let params = IngestParams {
        shift: Some(ShiftPolicy {
            n_keep: 8,
            n_discard: None,
        }),
        ..doc_params()
    };
    let without = ingest(
        &mut session(&model),
        &open(&dir.path().join("refused"), &model),
        &doc,
        &doc_params(),
        continue_all,
    )
    .unwrap_err();
    assert!(
        matches!(without, Error::ContextFull { needed: 600, .. }),
        "{without}"
    );

    let whole_store = open(&dir.path().join("whole"), &model);
    let mut whole = session(&model);
    let report = ingest(&mut whole, &whole_store, &doc, &params, continue_all).unwrap();
    assert!(report.finished);
    assert_eq!((report.restored, report.computed), (0, 600));
    assert!(report.shifts >= 2, "{report:?}");
    let held = whole.tokens().to_vec();
    assert!(held.len() <= 256);
    assert_eq!(&held[..8], &doc[..8]);
    assert_eq!(&held[8..], &doc[600 - (held.len() - 8)..]);
    let want_kv = kv_bytes(&whole);
    let want_logits = whole.logits().unwrap().to_vec();
    // Checkpoints go on across shifts: the last one holds what the session holds at the end.
    let cps = whole_store.checkpoints().unwrap();
    assert_eq!(cps.len(), 1);
    assert_eq!(cps[0].tokens, held.len());
    assert_eq!(report.checkpoints, 600 / INTERVAL + 1);

    // Stopped after a shift (at 416: the micro-batch ending there was read), then resumed by
    // a fresh session and store handle, as after a restart.
    let store_dir = dir.path().join("stopped");
    let stopped_shifts = {
        let store = open(&store_dir, &model);
        let mut s = session(&model);
        let report = ingest(&mut s, &store, &doc, &params, |p| {
            if p.shifts > 0 && p.done >= 400 {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        })
        .unwrap();
        assert!(!report.finished && report.shifts > 0);
        assert_eq!(report.computed, 416);
        report.shifts
    };
    let store = open(&store_dir, &model);
    let mut s = session(&model);
    let mut first = None;
    let resumed = ingest(&mut s, &store, &doc, &params, |p| {
        first.get_or_insert(p.clone());
        ControlFlow::Continue(())
    })
    .unwrap();
    assert!(resumed.finished);
    assert_eq!((resumed.restored, resumed.computed), (416, 600 - 416));
    let first = first.unwrap();
    assert_eq!((first.done, first.shifts), (416, stopped_shifts));
    assert_eq!(
        resumed.shifts, report.shifts,
        "shifts count from the document's start"
    );
    assert_eq!(s.tokens(), &held[..]);
    assert!(kv_bytes(&s) == want_kv, "KV bytes differ after resuming");
    assert_eq!(s.logits().unwrap(), &want_logits[..]);

    // Run once more: the finished checkpoint is restored whole, nothing is evaluated but the
    // last token's logits (again, in a scratch sequence).
    let mut again = session(&model);
    let report_again = ingest(&mut again, &store, &doc, &params, continue_all).unwrap();
    assert!(report_again.finished);
    assert_eq!((report_again.restored, report_again.computed), (600, 0));
    assert_eq!(report_again.shifts, report.shifts);
    assert!(kv_bytes(&again) == want_kv);
    assert_eq!(top1(again.logits().unwrap()), top1(&want_logits));

    // A changed document does not continue from the shifted checkpoint: it is read again
    // from what its unshifted prefix shares with the store.
    let mut edited = doc.clone();
    edited[300] = (edited[300] + 1) % 97;
    let mut t = session(&model);
    let report = ingest(&mut t, &store, &edited, &params, continue_all).unwrap();
    assert!(report.finished);
    assert_eq!(
        report.restored, 256,
        "the blocks saved before the first shift"
    );
    let mut fresh = session(&model);
    let fresh_report = ingest(
        &mut fresh,
        &open(&dir.path().join("edited"), &model),
        &edited,
        &params,
        continue_all,
    )
    .unwrap();
    assert_eq!(report.shifts, fresh_report.shifts);
    assert!(kv_bytes(&t) == kv_bytes(&fresh));
    assert_eq!(t.logits().unwrap(), fresh.logits().unwrap());
}

fn top1(logits: &[f32]) -> usize {
    (0..logits.len())
        .max_by(|&a, &b| logits[a].total_cmp(&logits[b]))
        .unwrap()
}
