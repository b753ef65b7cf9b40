//! GGUF reader and writer: round trips, typed errors on corrupt or truncated input, and the real
//! model's header (skipped when the model file is absent).

mod common;

use engine::gguf::{GgmlType, Gguf, GgufWriter, MetaValue};
use engine::Error;

fn small_file() -> GgufWriter {
    let mut w = GgufWriter::new();
    w.add_str("general.architecture", "llama")
        .add_u32("llama.block_count", 2)
        .add_f32("llama.rope.freq_base", 10000.0)
        .add_bool("tokenizer.ggml.add_bos_token", true)
        .add_str_array("tokenizer.ggml.tokens", &["a", "b", "ü"])
        .add_f32_array("tokenizer.ggml.scores", &[0.5, -1.0, 2.0])
        .add_i32_array("tokenizer.ggml.token_type", &[1, 3, 6])
        .add("misc.i8", MetaValue::I8(-3))
        .add("misc.u64", MetaValue::U64(7))
        .add("misc.i64", MetaValue::I64(-9))
        .add("misc.f64", MetaValue::F64(0.25))
        .add("misc.u16", MetaValue::U16(65535));
    let f32_bytes: Vec<u8> = (0..6u32).flat_map(|i| (i as f32).to_le_bytes()).collect();
    w.add_tensor("a.weight", &[3, 2], GgmlType::F32, f32_bytes);
    w.add_tensor("b.weight", &[32, 1], GgmlType::Q8_0, (0..34u8).collect());
    w
}

/// Found by the `gguf_reader` fuzz target (its oracle compared values with `==`): float
/// metadata holding NaN and subnormals reads back bit for bit.
#[test]
fn nan_and_subnormal_floats_read_back_bit_for_bit() {
    let odd = [0.0, f32::NAN, f32::from_bits(0x7fc0_1234), 8.8606e-41, -0.0];
    let mut w = GgufWriter::new();
    w.add_f32_array("misc.floats", &odd)
        .add_f32("misc.nan", f32::NAN);
    let g = Gguf::from_bytes(w.to_bytes().unwrap()).unwrap();
    let Some(MetaValue::Array(a)) = g.get("misc.floats") else {
        panic!("the array is missing");
    };
    let bits = |v: &[f64]| v.iter().map(|x| (*x as f32).to_bits()).collect::<Vec<_>>();
    assert_eq!(
        bits(&a.to_f64s().unwrap()),
        odd.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
    );
    assert!(g.get_f32("misc.nan").unwrap().is_nan());
}

#[test]
fn round_trip_metadata_and_tensors() {
    let bytes = small_file().to_bytes().unwrap();
    let g = Gguf::from_bytes(bytes).unwrap();
    assert_eq!(g.version(), 3);
    assert_eq!(g.get_str("general.architecture").unwrap(), "llama");
    assert_eq!(g.get_u32("llama.block_count").unwrap(), 2);
    assert_eq!(g.get_u32("misc.u64").unwrap(), 7);
    assert_eq!(g.get_u32("misc.u16").unwrap(), 65535);
    assert_eq!(g.get_f32("llama.rope.freq_base").unwrap(), 10000.0);
    assert_eq!(g.get_f32("misc.f64").unwrap(), 0.25);
    assert!(g.get_bool("tokenizer.ggml.add_bos_token").unwrap());
    assert_eq!(g.get("misc.i8"), Some(&MetaValue::I8(-3)));
    assert_eq!(g.get("misc.i64").and_then(MetaValue::as_i64), Some(-9));
    let toks = g.get_strs("tokenizer.ggml.tokens").unwrap();
    assert_eq!(toks.get(2), Some("ü"));
    let types = g.get_array("tokenizer.ggml.token_type").unwrap();
    assert_eq!(types.to_i64s(), Some(vec![1, 3, 6]));
    assert_eq!(types.get(1), Some(MetaValue::I32(3)));
    let keys: Vec<&str> = g.metadata().map(|(k, _)| k).collect();
    assert_eq!(keys[0], "general.architecture");
    assert_eq!(keys.len(), 12);

    assert_eq!(g.tensors().len(), 2);
    let a = g.tensor("a.weight").unwrap();
    assert_eq!(a.shape, vec![3, 2]);
    assert_eq!(a.dtype, GgmlType::F32);
    assert_eq!(a.n_bytes, 24);
    assert_eq!(a.offset % 32, 0);
    let data = g.read_tensor(a).unwrap();
    assert_eq!(&data[4..8], &1.0f32.to_le_bytes());
    let b = g.tensor("b.weight").unwrap();
    assert_eq!(b.offset % 32, 0);
    assert_eq!(g.read_tensor(b).unwrap(), (0..34u8).collect::<Vec<_>>());
    assert!(g.tensor("missing").is_none());
}

#[test]
fn write_and_open_a_file_with_custom_alignment() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("x.gguf");
    let mut w = small_file();
    w.add_u32("general.alignment", 64);
    w.write(&path).unwrap();
    let g = Gguf::open(&path).unwrap();
    assert_eq!(g.alignment(), 64);
    for t in g.tensors() {
        assert_eq!(t.offset % 64, 0, "{}", t.name);
    }
    assert_eq!(
        g.read_tensor(g.tensor("b.weight").unwrap()).unwrap()[33],
        33
    );
    assert_eq!(g.len(), std::fs::metadata(&path).unwrap().len());
}

#[test]
fn typed_errors_for_missing_and_mistyped_keys() {
    let g = Gguf::from_bytes(small_file().to_bytes().unwrap()).unwrap();
    let e = g.get_str("nope").unwrap_err();
    assert!(
        matches!(&e, Error::MissingKey { key } if key == "nope"),
        "{e}"
    );
    let e = g.get_u32("general.architecture").unwrap_err();
    assert!(
        matches!(&e, Error::KeyType { key, .. } if key == "general.architecture"),
        "{e}"
    );
    assert!(e.to_string().contains("general.architecture"));
    assert!(
        matches!(g.get_u32("misc.i8"), Err(Error::KeyType { .. })),
        "negative"
    );
    assert!(matches!(
        g.get_f32("llama.block_count"),
        Err(Error::KeyType { .. })
    ));
    assert!(matches!(g.get_bool("misc.u64"), Err(Error::KeyType { .. })));
}

#[test]
fn every_truncation_is_an_error() {
    let bytes = small_file().to_bytes().unwrap();
    for len in 0..bytes.len() {
        match Gguf::from_bytes(bytes[..len].to_vec()) {
            Err(Error::GgufTruncated { .. } | Error::GgufCorrupt { .. }) => {}
            Err(e) => panic!("length {len}: unexpected error {e}"),
            Ok(_) => panic!("length {len}: truncated file accepted"),
        }
    }
    assert!(Gguf::from_bytes(bytes).is_ok());
}

#[test]
fn empty_file_on_disk_is_truncated() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("empty.gguf");
    std::fs::write(&path, b"").unwrap();
    assert!(matches!(
        Gguf::open(&path),
        Err(Error::GgufTruncated { .. })
    ));
    let missing = dir.path().join("missing.gguf");
    assert!(matches!(Gguf::open(&missing), Err(Error::Io { path, .. }) if path == missing));
}

#[test]
fn bad_magic_and_version() {
    let mut bytes = small_file().to_bytes().unwrap();
    bytes[0] = b'X';
    assert!(matches!(
        Gguf::from_bytes(bytes.clone()),
        Err(Error::GgufBadMagic { found, .. }) if &found == b"XGUF"
    ));
    bytes[0] = b'G';
    for v in [1u32, 4, 0x0300_0000] {
        bytes[4..8].copy_from_slice(&v.to_le_bytes());
        assert!(matches!(
            Gguf::from_bytes(bytes.clone()),
            Err(Error::GgufVersion { version, .. }) if version == v
        ));
    }
    bytes[4..8].copy_from_slice(&2u32.to_le_bytes());
    assert_eq!(Gguf::from_bytes(bytes).unwrap().version(), 2);
}

/// Header with no tensors and one metadata entry whose encoding is `kv`.
fn one_kv(kv: &[u8]) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(b"GGUF");
    b.extend_from_slice(&3u32.to_le_bytes());
    b.extend_from_slice(&0u64.to_le_bytes());
    b.extend_from_slice(&1u64.to_le_bytes());
    b.extend_from_slice(kv);
    b
}

fn key(b: &mut Vec<u8>, k: &str) {
    b.extend_from_slice(&(k.len() as u64).to_le_bytes());
    b.extend_from_slice(k.as_bytes());
}

#[test]
fn absurd_lengths_fail_without_allocating() {
    // A string value claiming u64::MAX bytes.
    let mut kv = Vec::new();
    key(&mut kv, "k");
    kv.extend_from_slice(&8u32.to_le_bytes());
    kv.extend_from_slice(&u64::MAX.to_le_bytes());
    kv.extend_from_slice(b"abc");
    assert!(matches!(
        Gguf::from_bytes(one_kv(&kv)),
        Err(Error::GgufTruncated { .. })
    ));

    // An array of 2^60 u32.
    let mut kv = Vec::new();
    key(&mut kv, "k");
    kv.extend_from_slice(&9u32.to_le_bytes());
    kv.extend_from_slice(&4u32.to_le_bytes());
    kv.extend_from_slice(&(1u64 << 60).to_le_bytes());
    kv.extend_from_slice(&[0; 16]);
    let e = Gguf::from_bytes(one_kv(&kv)).unwrap_err();
    assert!(matches!(e, Error::GgufCorrupt { .. }), "{e}");

    // An array of u64::MAX strings (the count times 8 overflows).
    let mut kv = Vec::new();
    key(&mut kv, "k");
    kv.extend_from_slice(&9u32.to_le_bytes());
    kv.extend_from_slice(&8u32.to_le_bytes());
    kv.extend_from_slice(&u64::MAX.to_le_bytes());
    assert!(matches!(
        Gguf::from_bytes(one_kv(&kv)),
        Err(Error::GgufCorrupt { .. })
    ));

    // A key claiming 2^40 bytes.
    let mut kv = Vec::new();
    kv.extend_from_slice(&(1u64 << 40).to_le_bytes());
    kv.extend_from_slice(&[0; 16]);
    assert!(matches!(
        Gguf::from_bytes(one_kv(&kv)),
        Err(Error::GgufTruncated { .. })
    ));

    // Billions of metadata entries in a tiny file.
    let mut b = one_kv(&[]);
    b[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(matches!(
        Gguf::from_bytes(b),
        Err(Error::GgufCorrupt { .. })
    ));

    // An unknown value type and a bool that is neither 0 nor 1.
    let mut kv = Vec::new();
    key(&mut kv, "k");
    kv.extend_from_slice(&99u32.to_le_bytes());
    kv.extend_from_slice(&[0; 8]);
    assert!(matches!(
        Gguf::from_bytes(one_kv(&kv)),
        Err(Error::GgufCorrupt { .. })
    ));
    let mut kv = Vec::new();
    key(&mut kv, "k");
    kv.extend_from_slice(&7u32.to_le_bytes());
    kv.push(2);
    assert!(matches!(
        Gguf::from_bytes(one_kv(&kv)),
        Err(Error::GgufCorrupt { .. })
    ));
}

#[test]
fn duplicate_keys_are_rejected() {
    let mut kv = Vec::new();
    for _ in 0..2 {
        key(&mut kv, "k");
        kv.extend_from_slice(&4u32.to_le_bytes());
        kv.extend_from_slice(&1u32.to_le_bytes());
    }
    let mut b = one_kv(&kv);
    b[16..24].copy_from_slice(&2u64.to_le_bytes());
    assert!(matches!(
        Gguf::from_bytes(b),
        Err(Error::GgufCorrupt { .. })
    ));
}

/// A file with one F32 tensor; returns the bytes and the offset of the tensor's type field.
fn one_tensor() -> (Vec<u8>, usize) {
    let mut w = GgufWriter::new();
    w.add_tensor("t", &[4], GgmlType::F32, vec![0; 16]);
    let bytes = w.to_bytes().unwrap();
    // header 24 + name (8 + 1) + n_dims 4 + dim 8
    (bytes, 24 + 9 + 4 + 8)
}

#[test]
fn unknown_tensor_type_names_the_tensor() {
    let (mut bytes, type_at) = one_tensor();
    assert!(Gguf::from_bytes(bytes.clone()).is_ok());
    bytes[type_at..type_at + 4].copy_from_slice(&4u32.to_le_bytes());
    let e = Gguf::from_bytes(bytes).unwrap_err();
    assert_eq!(e.to_string(), "unsupported tensor type 4 for tensor t");
}

#[test]
fn bad_tensor_offsets_and_shapes_are_rejected() {
    let (bytes, type_at) = one_tensor();
    let off_at = type_at + 4;
    // Misaligned.
    let mut b = bytes.clone();
    b[off_at..off_at + 8].copy_from_slice(&3u64.to_le_bytes());
    assert!(matches!(
        Gguf::from_bytes(b),
        Err(Error::GgufCorrupt { .. })
    ));
    // Past the end of the file.
    let mut b = bytes.clone();
    b[off_at..off_at + 8].copy_from_slice(&(1u64 << 20).to_le_bytes());
    assert!(matches!(
        Gguf::from_bytes(b),
        Err(Error::GgufTruncated { .. })
    ));
    // Overflowing.
    let mut b = bytes.clone();
    b[off_at..off_at + 8].copy_from_slice(&(u64::MAX - 31).to_le_bytes());
    assert!(Gguf::from_bytes(b).is_err());
    // A huge dimension.
    let mut b = bytes.clone();
    b[type_at - 8..type_at].copy_from_slice(&(u64::MAX / 2).to_le_bytes());
    assert!(Gguf::from_bytes(b).is_err());
    // A Q8_0 row that is not a whole number of blocks.
    let mut b = bytes;
    b[type_at..type_at + 4].copy_from_slice(&8u32.to_le_bytes());
    assert!(matches!(
        Gguf::from_bytes(b),
        Err(Error::GgufCorrupt { .. })
    ));
}

#[test]
fn type_sizes() {
    assert_eq!(GgmlType::Q4_1.row_bytes(576), 18 * 20);
    assert_eq!(GgmlType::Q8_0.row_bytes(64), 68);
    assert_eq!(GgmlType::Q6_K.row_bytes(512), 420);
    assert_eq!(GgmlType::F16.row_bytes(3), 6);
    assert_eq!(GgmlType::from_u32(30, "x").unwrap(), GgmlType::BF16);
    assert_eq!(GgmlType::BF16 as u32, 30);
    assert!(GgmlType::from_u32(5, "x").is_err());
}

#[test]
fn real_model_header() {
    let Some(path) = common::real_model_path() else {
        return;
    };
    let g = Gguf::open(&path).unwrap();
    assert_eq!(g.version(), 3);
    assert_eq!(g.get_str("general.architecture").unwrap(), "llama");
    assert_eq!(g.get_u32("llama.block_count").unwrap(), 30);
    assert_eq!(g.get_u32("llama.embedding_length").unwrap(), 576);
    assert_eq!(g.tensors().len(), 272);
    let emb = g.tensor("token_embd.weight").unwrap();
    assert_eq!(emb.shape, vec![576, 49152]);
    assert_eq!(g.read_tensor(emb).unwrap().len() as u64, emb.n_bytes);
    let last = g
        .tensors()
        .iter()
        .map(|t| t.offset + t.n_bytes)
        .max()
        .unwrap();
    assert!(last <= g.len());
}

/// A file is read as far as its header reaches, in pieces that grow: a header of about 1 MiB
/// (several reads) read from disk gives exactly what the same bytes in memory give, and every
/// cut of the file on disk is a typed error.
#[test]
fn a_large_header_read_from_disk_equals_the_same_bytes_in_memory() {
    let mut w = small_file();
    let many: Vec<String> = (0..60_000).map(|i| format!("piece-{i}")).collect();
    w.add_str_array("tokenizer.ggml.merges", &many)
        .add_f32("misc.after", 1.5);
    let bytes = w.to_bytes().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.gguf");
    std::fs::write(&path, &bytes).unwrap();
    let disk = Gguf::open(&path).unwrap();
    let mem = Gguf::from_bytes(bytes.clone()).unwrap();
    assert!(disk.data_offset() > 512 << 10, "{}", disk.data_offset());
    let meta = |g: &Gguf| -> Vec<String> { g.metadata().map(|kv| format!("{kv:?}")).collect() };
    assert_eq!(meta(&disk), meta(&mem));
    assert_eq!(disk.get_f32("misc.after").unwrap(), 1.5);
    assert_eq!(disk.tensors(), mem.tensors());
    assert_eq!(disk.len(), bytes.len() as u64);
    for t in disk.tensors() {
        assert_eq!(disk.read_tensor(t).unwrap(), mem.read_tensor(t).unwrap());
    }
    let end = disk.data_offset() as usize;
    for len in [0, 3, 24, 300 << 10, end - 1, bytes.len() - 1] {
        std::fs::write(&path, &bytes[..len]).unwrap();
        match Gguf::open(&path) {
            Err(Error::GgufTruncated { .. } | Error::GgufCorrupt { .. }) => {}
            Err(e) => panic!("length {len}: unexpected error {e}"),
            Ok(_) => panic!("length {len}: truncated file accepted"),
        }
    }
}

/// Tensor data is read with a copy that checks its range: past the end is a typed error, and
/// a file cut short after it was opened gives an I/O error, not a fault.
#[test]
fn reads_past_the_end_or_of_a_file_cut_short_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("x.gguf");
    small_file().write(&path).unwrap();
    let g = Gguf::open(&path).unwrap();
    let b = g.tensor("b.weight").unwrap().clone();
    assert_eq!(g.read_tensor(&b).unwrap(), (0..34u8).collect::<Vec<_>>());
    let mut four = [0u8; 4];
    assert!(matches!(
        g.read_at(g.len() - 2, &mut four),
        Err(Error::GgufTruncated { .. })
    ));
    assert!(matches!(
        g.read_at(u64::MAX - 1, &mut four),
        Err(Error::GgufTruncated { .. })
    ));
    std::fs::File::options()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(g.data_offset())
        .unwrap();
    let e = g.read_tensor(&b).unwrap_err();
    assert!(matches!(&e, Error::Io { path: p, .. } if *p == path), "{e}");
}
