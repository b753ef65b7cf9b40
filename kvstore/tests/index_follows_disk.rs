//! The in-memory index follows the disk: blocks another process's gc removed are noticed at
//! the next lookup, written again when put, and a checkpoint of them saves.

mod common;

use common::*;
use kvstore::{KvStore, StoreError};

#[test]
fn blocks_removed_by_another_process_are_written_again() {
    let dir = tempfile::tempdir().unwrap();
    // A small RAM tier: the blocks leave RAM once written, so the index knows them as files.
    let server = KvStore::open(dir.path(), inline_config(1)).unwrap();
    let model = server.model(fp(), geometry()).unwrap();
    let tokens: Vec<u32> = (0..16).collect();
    let ids = put_tokens(&model, &tokens).unwrap();
    model.save(&manifest("chat", &tokens)).unwrap();
    server.flush().unwrap();
    assert!(ids.iter().all(|id| model.contains(id)));

    // Another process deletes the checkpoint and collects its blocks.
    {
        let tool = KvStore::open(dir.path(), inline_config(1)).unwrap();
        let m = tool.model(fp(), geometry()).unwrap();
        m.delete("chat").unwrap();
        let report = tool.gc().unwrap();
        assert!(report.blocks as usize + 1 >= ids.len(), "{report:?}");
    }

    // Blocks whose files are gone are not reported as held (those still in RAM are).
    let held = ids.iter().filter(|id| model.contains(id)).count();
    assert!(
        held <= 1,
        "{held} of {} blocks still reported held",
        ids.len()
    );
    // Put again (what the server's writer does with the blocks the store lacks), they save.
    let again = put_tokens(&model, &tokens).unwrap();
    assert_eq!(again, ids);
    match model.save(&manifest("chat", &tokens)) {
        Ok(_) => {}
        Err(e @ StoreError::MissingBlock { .. }) => {
            let which: Vec<_> = ids.iter().map(|i| i.to_hex()[..8].to_string()).collect();
            panic!("stale index: {e} among {which:?}")
        }
        Err(e) => panic!("{e}"),
    }
    server.flush().unwrap();
    let back = model.load("chat").unwrap();
    assert_eq!(back.blocks.len(), ids.len());
    for (id, b) in ids.iter().zip(&back.blocks) {
        assert_eq!(&b[..], &kv_of(id)[..]);
    }
}
