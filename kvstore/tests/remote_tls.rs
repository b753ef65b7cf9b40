//! The remote tier over TLS (`rediss://`) on a real `redis-server` with a TLS port, its
//! certificates made here (a private CA, and servers' certificates it signs): blocks travel
//! between two hosts; a certificate from an unknown CA or for another name, or a server that
//! does not finish its handshake, is a typed error and a tier that is down, never a failed
//! lookup; the URL's password and database are used.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ckptfmt::store::BlockInput;
use ckptfmt::{ElemType, Fingerprint, Geometry};
use kvstore::remote::testing::RedisServer;
use kvstore::{BlockId, Config, KvStore, ModelStore, Remote, RemoteConfig, StoreError};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

const TPB: u32 = 16;

/// Blocks of 128 KiB: each value spans several TLS records and more than the connection's read
/// buffer.
fn geometry() -> Geometry {
    Geometry::uniform(2, 2048, 2048, ElemType::F16, TPB).unwrap()
}

/// A certificate authority of the test's own.
struct Ca {
    pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl Ca {
    fn new(name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate().unwrap();
        let pem = params.self_signed(&key).unwrap().pem();
        Ca {
            pem,
            issuer: Issuer::new(params, key),
        }
    }

    /// A server certificate for `names` signed by this CA, and its key, both PEM.
    fn server(&self, names: &[&str]) -> (String, String) {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut params = CertificateParams::new(names).unwrap();
        params
            .distinguished_name
            .push(DnType::CommonName, "redis test server");
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    /// Its certificate in a file of `dir`.
    fn file(&self, dir: &Path, name: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, &self.pem).unwrap();
        path
    }
}

/// A store in `dir` whose remote tier is `url`, trusting `ca`.
fn host(dir: &Path, url: &str, ca: Option<&Path>, fp: &Fingerprint) -> (KvStore, ModelStore) {
    let mut config = RemoteConfig::new(url);
    config.ca = ca.map(Path::to_path_buf);
    common::remote_host(dir, config, 64 << 20, fp, geometry())
}

/// Block `i`'s bytes, different for every block and seed.
fn kv(seed: u8, i: usize) -> Vec<u8> {
    common::seeded_kv(&geometry(), seed, i)
}

/// Puts the blocks of `tokens` locally and pushes them to the tier; their ids.
fn compute(model: &ModelStore, tokens: &[u32], seed: u8) -> Vec<BlockId> {
    let ids = BlockId::chain_all(&model.fingerprint(), tokens, TPB);
    let kvs: Vec<Vec<u8>> = (0..ids.len()).map(|i| kv(seed, i)).collect();
    let tpb = TPB as usize;
    let inputs: Vec<BlockInput<'_>> = (0..ids.len())
        .map(|i| BlockInput {
            prev: i.checked_sub(1).map(|p| &ids[p]),
            tokens: &tokens[i * tpb..(i + 1) * tpb],
            kv: &kvs[i],
        })
        .collect();
    model.put_sequence(tokens, |i| kvs[i].clone()).unwrap();
    assert_eq!(model.push_remote(&inputs).unwrap(), ids.len());
    ids
}

/// What one `get` of the tier says when it cannot be used: the error, checked to be a TLS
/// one, and the tier then down (the next call not even made).
fn refused_tls(model: &ModelStore) -> String {
    let remote = model.remote().unwrap();
    let key = ["test:k".to_owned()];
    let detail = match remote.tier().get_many(&key) {
        Err(StoreError::RemoteTls { op, detail }) => {
            assert_eq!(op, "get");
            detail
        }
        other => panic!("a TLS error expected: {other:?}"),
    };
    let skipped = remote.metrics().figures().skipped;
    assert!(matches!(
        remote.tier().get_many(&key),
        Err(StoreError::Remote { .. })
    ));
    let f = remote.metrics().figures();
    assert!(f.errors >= 1 && !f.up && f.skipped == skipped + 1, "{f:?}");
    detail
}

#[test]
fn blocks_travel_between_hosts_over_tls_with_a_private_ca() {
    let tmp = tempfile::tempdir().unwrap();
    let ca = Ca::new("llama-hdd test CA");
    let (cert, key) = ca.server(&["localhost", "127.0.0.1"]);
    let redis = RedisServer::start_tls(&cert, &key);
    let port = redis.tls_port().unwrap();
    let ca_file = ca.file(tmp.path(), "ca.pem");
    let fp = Fingerprint::of(b"model");
    // One host names the server, the other its address: the certificate carries both.
    let by_name = format!("rediss://localhost:{port}");
    let by_ip = format!("rediss://127.0.0.1:{port}");
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    let (_sa, ma) = host(&a, &by_name, Some(&ca_file), &fp);
    let (_sb, mb) = host(&b, &by_ip, Some(&ca_file), &fp);
    let tokens: Vec<u32> = (0..TPB * 6).collect();
    let ids = compute(&ma, &tokens, 7);
    // The values are in this server (read through its plain port).
    assert_eq!(redis.cli(&["DBSIZE"]).unwrap(), ids.len().to_string());

    let got = mb.fetch_remote(&ids);
    assert!(got.answered);
    assert_eq!(got.blocks, ids.len());
    for (i, id) in ids.iter().enumerate() {
        assert_eq!(&mb.get(id).unwrap().unwrap()[..], &kv(7, i)[..]);
    }
    let f = mb.remote().unwrap().metrics().figures();
    assert_eq!((f.hits, f.rejected, f.errors), (ids.len() as u64, 0, 0));
    assert!(f.up);

    // The TLS port speaks nothing else: the same server without TLS is down.
    let (_sc, mc) = host(
        &tmp.path().join("c"),
        &format!("redis://127.0.0.1:{port}"),
        None,
        &fp,
    );
    assert!(!mc.fetch_remote(&ids).answered);

    // A server stuck on its TLS port answers nothing within the timeout.
    let sleeper = {
        let plain = redis.port();
        std::thread::spawn(move || {
            let _ = std::process::Command::new("redis-cli")
                .args(["-p", &plain.to_string(), "DEBUG", "SLEEP", "1"])
                .output();
        })
    };
    std::thread::sleep(Duration::from_millis(100));
    let start = Instant::now();
    let got = ma.fetch_remote(&ids);
    let took = start.elapsed();
    assert!(!got.answered, "answered in {took:?}");
    assert!(took < Duration::from_millis(400), "waited {took:?}");
    sleeper.join().unwrap();
}

#[test]
fn a_certificate_from_an_unknown_ca_is_refused_unless_the_url_says_insecure() {
    let tmp = tempfile::tempdir().unwrap();
    let (ca, other) = (Ca::new("the server's CA"), Ca::new("another CA"));
    let (cert, key) = ca.server(&["localhost", "127.0.0.1"]);
    let redis = RedisServer::start_tls(&cert, &key);
    let url = format!("rediss://localhost:{}", redis.tls_port().unwrap());
    let fp = Fingerprint::of(b"model");
    let ids = BlockId::chain_all(&fp, &(0..TPB * 2).collect::<Vec<_>>(), TPB);

    // Another CA given: refused, said once, a miss.
    let other_file = other.file(tmp.path(), "other.pem");
    let (_sa, ma) = host(&tmp.path().join("a"), &url, Some(&other_file), &fp);
    let lines = common::log_of(&ma);
    let detail = refused_tls(&ma);
    assert!(detail.contains("UnknownIssuer"), "{detail}");
    assert!(detail.contains("--cache-remote-ca"), "{detail}");
    let got = ma.fetch_remote(&ids);
    assert_eq!((got.blocks, got.answered), (0, false));
    let said = lines.lock().unwrap().clone();
    assert_eq!(said.len(), 1, "{said:?}");
    assert!(
        said[0].contains("unavailable") && said[0].contains("TLS"),
        "{said:?}"
    );

    // No CA given: the system's roots do not know this one either (or there are none, which
    // opening the tier says).
    let mut config = RemoteConfig::new(url.clone());
    config.namespace = "test".into();
    match Remote::open(&config) {
        Ok(remote) => {
            let store = KvStore::open(
                tmp.path().join("b"),
                Config {
                    remote: Some(remote),
                    ..Config::default()
                },
            )
            .unwrap();
            let model = store.model(fp, geometry()).unwrap();
            assert!(refused_tls(&model).contains("UnknownIssuer"));
        }
        Err(StoreError::Invalid { detail, .. }) => {
            assert!(detail.contains("no system CA certificates"), "{detail}")
        }
        Err(e) => panic!("{e}"),
    }

    // `#insecure`: the same server is used, its certificate unverified.
    let (_sc, mc) = host(&tmp.path().join("c"), &format!("{url}#insecure"), None, &fp);
    let tokens: Vec<u32> = (0..TPB * 2).collect();
    assert_eq!(compute(&mc, &tokens, 3), ids);
    assert_eq!(redis.cli(&["DBSIZE"]).unwrap(), "2");
}

#[test]
fn a_certificate_for_another_name_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let ca = Ca::new("llama-hdd test CA");
    // Signed by the trusted CA, for a name that is not the one connected to.
    let (cert, key) = ca.server(&["redis.example"]);
    let redis = RedisServer::start_tls(&cert, &key);
    let ca_file = ca.file(tmp.path(), "ca.pem");
    let fp = Fingerprint::of(b"model");
    for (i, host_name) in ["localhost", "127.0.0.1"].into_iter().enumerate() {
        let url = format!("rediss://{host_name}:{}", redis.tls_port().unwrap());
        let (_s, model) = host(&tmp.path().join(i.to_string()), &url, Some(&ca_file), &fp);
        let detail = refused_tls(&model);
        assert!(
            detail.contains("not valid for name") && detail.contains(host_name),
            "{detail}"
        );
    }
}

#[test]
fn a_password_and_a_database_in_a_rediss_url_are_used() {
    let tmp = tempfile::tempdir().unwrap();
    let ca = Ca::new("llama-hdd test CA");
    let (cert, key) = ca.server(&["localhost"]);
    let redis = RedisServer::start_tls(&cert, &key);
    redis.cli(&["CONFIG", "SET", "requirepass", "s3cret"]);
    let ca_file = ca.file(tmp.path(), "ca.pem");
    let port = redis.tls_port().unwrap();
    let fp = Fingerprint::of(b"model");
    let url = format!("rediss://:s3cret@localhost:{port}/2");
    let (_sa, ma) = host(&tmp.path().join("a"), &url, Some(&ca_file), &fp);
    let ids = compute(&ma, &(0..TPB * 3).collect::<Vec<_>>(), 4);
    let count = |db: &str| {
        std::process::Command::new("redis-cli")
            .args(["-p", &redis.port().to_string(), "-a", "s3cret"])
            .args(["--no-auth-warning", "-n", db, "DBSIZE"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
            .unwrap()
    };
    assert_eq!(count("2"), ids.len().to_string());
    assert_eq!(count("0"), "0");

    // A wrong password: TLS is fine, the login is refused; a miss, not a TLS error.
    let wrong = format!("rediss://:nope@localhost:{port}/2");
    let (_sb, mb) = host(&tmp.path().join("b"), &wrong, Some(&ca_file), &fp);
    let lines = common::log_of(&mb);
    match mb.remote().unwrap().tier().get_many(&["test:k".to_owned()]) {
        Err(StoreError::Remote { detail, .. }) => assert!(detail.contains("WRONGPASS"), "{detail}"),
        other => panic!("a refused login expected: {other:?}"),
    }
    assert!(!mb.fetch_remote(&ids).answered);
    let said = lines.lock().unwrap().join("\n");
    assert!(said.contains("WRONGPASS"), "{said}");
}

#[test]
fn a_server_that_never_finishes_the_handshake_costs_one_timeout() {
    // Accepts connections and says nothing.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let held = std::thread::spawn(move || {
        let held = listener.accept();
        std::thread::sleep(Duration::from_millis(500));
        drop(held);
    });
    let tmp = tempfile::tempdir().unwrap();
    let fp = Fingerprint::of(b"model");
    let url = format!("rediss://localhost:{port}#insecure");
    let (_s, model) = host(tmp.path(), &url, None, &fp);
    let start = Instant::now();
    let err = model
        .remote()
        .unwrap()
        .tier()
        .get_many(&["test:k".to_owned()])
        .unwrap_err();
    let took = start.elapsed();
    assert!(matches!(err, StoreError::Remote { .. }), "{err:?}");
    assert!(took < Duration::from_millis(400), "waited {took:?}");
    assert!(!model.remote().unwrap().metrics().figures().up);
    held.join().unwrap();
}
