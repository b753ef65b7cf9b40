//! A conversation saved on one machine and resumed on another through the remote tier (a real
//! `redis-server`): two stores in directories of their own, the second holding nothing.

mod common;

use common::*;
use engine::store::{CheckpointMeta, RemoteConfig, SessionStore, StoreConfig};
use engine::Session;
use kvstore::remote::testing::RedisServer;

fn open(dir: &std::path::Path, model: &engine::Model, url: &str) -> SessionStore {
    let config = StoreConfig {
        remote: Some(RemoteConfig::new(url)),
        ..StoreConfig::default()
    };
    SessionStore::open(dir, model, config).unwrap()
}

#[test]
fn a_conversation_saved_on_one_host_resumes_on_another() {
    let redis = RedisServer::start();
    let c = cfg(Shape::Llama, false);
    let (dir, model, _) = build(&c, 41);
    let toks = tokens(200);
    let n = 150;
    let mut p = params(512);
    p.n_ctx = 256;
    let mut a = Session::new(model.clone(), p.clone()).unwrap();
    a.feed(&toks[..n]).unwrap();
    let here = open(&dir.path().join("host-a"), &model, &redis.url());
    let meta = CheckpointMeta {
        turns: vec![n],
        ..CheckpointMeta::default()
    };
    here.save(&a, "talk", &meta).unwrap();
    let f = here.remote_figures().unwrap();
    assert_eq!((f.blocks_written, f.manifests_written), (2, 1));

    let there = open(&dir.path().join("host-b"), &model, &redis.url());
    assert!(!there.exists("talk").unwrap());
    let mut b = Session::new(model.clone(), p.clone()).unwrap();
    let back = there.restore(&mut b, "talk").unwrap();
    assert_eq!(back.turns, vec![n]);
    assert_eq!(b.tokens(), &toks[..n]);
    // Held locally from now on, and it continues exactly as the original.
    assert!(there.exists("talk").unwrap());
    let want = a.feed(&toks[n..]).unwrap().to_vec();
    let got = b.feed(&toks[n..]).unwrap().to_vec();
    assert_eq!(got, want);
    assert!(there.remote_figures().unwrap().hits >= 3);

    // A name the tier does not hold is the usual error.
    let mut c2 = Session::new(model.clone(), p.clone()).unwrap();
    assert!(there.restore(&mut c2, "absent").is_err());
}
