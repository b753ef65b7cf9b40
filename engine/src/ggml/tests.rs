//! The checks the owners make before calling into ggml, and the paths that read and write
//! tensor data: weights in place over a file they keep alive, KV bytes and KV cells written by a
//! graph.

use std::sync::Arc;

use super::*;
use crate::gguf::{GgmlType, Gguf, GgufWriter};
use crate::kv::KvType;

fn spec<'a>(ggml_type: u32, shape: &'a [u64], n_bytes: usize) -> WeightSpec<'a> {
    WeightSpec {
        name: "t",
        ggml_type,
        shape,
        offset: 0,
        n_bytes,
        on_device: false,
        matmul_only: false,
    }
}

fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// A GGUF file with one f32 tensor `w` of shape `[4, 2]`, opened (memory-mapped) from disk.
fn one_tensor_file(dir: &std::path::Path, values: &[f32; 8]) -> Arc<Gguf> {
    let path = dir.join("w.gguf");
    GgufWriter::new()
        .add_tensor("w", &[4, 2], GgmlType::F32, f32_bytes(values))
        .write(&path)
        .expect("write the file");
    Arc::new(Gguf::open(&path).expect("open the file"))
}

fn weight_spec(gguf: &Gguf) -> WeightSpec<'_> {
    let info = gguf.tensor("w").expect("tensor w");
    WeightSpec {
        name: &info.name,
        ggml_type: info.dtype as u32,
        shape: &info.shape,
        offset: info.offset as usize,
        n_bytes: info.n_bytes as usize,
        on_device: false,
        matmul_only: false,
    }
}

#[test]
fn weight_specs_must_agree_with_their_type_before_ggml_sees_them() {
    let f32_code = GgmlType::F32 as u32;
    let q4_0 = GgmlType::Q4_0 as u32;
    assert_eq!(
        spec(f32_code, &[4, 2], 32).checked_ne().ok(),
        Some(vec![4, 2])
    );
    assert_eq!(
        spec(q4_0, &[64, 3], 2 * 18 * 3).checked_ne().ok(),
        Some(vec![64, 3])
    );
    let refused = [
        spec(f32_code, &[4, 2], 31),         // one byte short
        spec(q4_0, &[48, 1], 27),            // rows not whole blocks
        spec(f32_code, &[], 0),              // no dimension
        spec(f32_code, &[1, 1, 1, 1, 1], 4), // five
        spec(9_999, &[4], 16),               // a type ggml does not know
        spec(f32_code, &[u64::MAX, 2], 0),   // a size that overflows
        spec(f32_code, &[1 << 62, 2, 2], 0), // the same, in the outer dimensions
        spec(f32_code, &[1 << 63], 0),       // a dimension past i64
    ];
    for s in &refused {
        assert!(
            matches!(s.checked_ne(), Err(Error::BadTensor { .. })),
            "{:?} accepted",
            s.shape
        );
    }
}

#[test]
fn weights_point_into_the_file_and_keep_it_alive() {
    let dir = tempfile::tempdir().expect("temp dir");
    let values = [1.0, -2.0, 3.5, 0.25, 8.0, -0.5, 6.0, 7.0];
    let gguf = one_tensor_file(dir.path(), &values);
    let spec = weight_spec(&gguf);
    let (offset, n_bytes) = (spec.offset, spec.n_bytes);

    let past_the_end = WeightSpec {
        offset: gguf.len() as usize - n_bytes + 1,
        ..weight_spec(&gguf)
    };
    assert!(matches!(
        Weights::map(Arc::clone(&gguf), &[past_the_end], None, false),
        Err(Error::BadTensor { .. })
    ));

    let weights = Weights::map(Arc::clone(&gguf), &[spec], None, false).expect("map");
    let file_start = gguf.raw_memory().0 as usize;
    // SAFETY: a live tensor of `weights`; reads its data pointer.
    let data = unsafe { (*weights.get(0).ptr.as_ptr()).data } as usize;
    assert_eq!(
        data,
        file_start + offset,
        "not copied: the tensor is in the file"
    );
    assert_eq!(Arc::strong_count(&gguf), 2, "the weights hold the file");
    drop(gguf);

    // The file's only owner is now the weights; a graph still reads the values.
    let mut compute = Compute::cpu(1).expect("compute");
    let out = compute
        .run(|g| {
            let w = g.lift(weights.get(0));
            Ok(g.cont(w))
        })
        .expect("run");
    assert_eq!(out, values);
}

#[test]
fn a_lifted_tensor_cannot_be_the_output() {
    let dir = tempfile::tempdir().expect("temp dir");
    let gguf = one_tensor_file(dir.path(), &[0.0; 8]);
    let spec = weight_spec(&gguf);
    let weights = Weights::map(Arc::clone(&gguf), &[spec], None, false).expect("map");
    let mut compute = Compute::cpu(1).expect("compute");
    let result = compute.run(|g| Ok(g.lift(weights.get(0))));
    assert!(matches!(result, Err(Error::Ggml { .. })), "{result:?}");
}

#[test]
fn kv_bytes_are_written_copied_and_read_back_in_range_only() {
    let mut kv = KvTensors::new(&[4, 2], &[4, 2], KvType::F16, KvType::F16, 8).expect("pool");
    // Layer 0's K: 8 rows of 4 f16 = 64 bytes.
    let row: Vec<u8> = (1..=8).collect();
    kv.write(0, false, 8, &row);
    kv.copy_within(0, false, 8, 40, 8);
    let mut all = vec![0xff; 64];
    kv.read(0, false, 0, &mut all);
    assert_eq!(&all[8..16], &row[..]);
    assert_eq!(&all[40..48], &row[..]);
    assert!(all[..8].iter().chain(&all[16..40]).all(|&b| b == 0));
    // Layer 0's V is another tensor, untouched.
    kv.read(0, true, 0, &mut all);
    assert!(all.iter().all(|&b| b == 0));

    let panics = |f: &mut dyn FnMut(&mut KvTensors)| {
        let mut kv = KvTensors::new(&[4], &[4], KvType::F16, KvType::F16, 8).expect("pool");
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&mut kv))).is_err()
    };
    assert!(panics(&mut |kv| kv.read(0, false, 60, &mut [0; 8])));
    assert!(panics(&mut |kv| kv.read(0, false, usize::MAX, &mut [0; 2])));
    assert!(panics(&mut |kv| kv.write(0, true, 57, &[0; 8])));
    assert!(
        panics(&mut |kv| kv.copy_within(0, false, 0, 4, 8)),
        "overlap"
    );
    assert!(panics(&mut |kv| kv.copy_within(0, false, usize::MAX, 0, 2)));
    assert!(!panics(&mut |kv| kv.read(0, false, 56, &mut [0; 8])));
}

#[test]
fn a_batch_of_kv_copies_with_one_bad_range_copies_nothing() {
    let mut kv = KvTensors::new(&[4], &[4], KvType::F16, KvType::F16, 8).expect("pool");
    let ones = [1u8; 8];
    // Layer 0's K and V are 64 bytes each: the second range ends past V.
    let write = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        kv.write_many(&[(0, false, 0, &ones), (0, true, 60, &ones)])
    }));
    assert!(write.is_err());
    let mut all = vec![0xff; 64];
    kv.read(0, false, 0, &mut all);
    assert!(
        all.iter().all(|&b| b == 0),
        "the good range was written first"
    );
    kv.write(0, false, 0, &ones);
    let (mut a, mut b) = (vec![0u8; 8], vec![0u8; 8]);
    let read = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        kv.read_many(&mut [(0, false, 0, &mut a[..]), (1, false, 0, &mut b[..])])
    }));
    assert!(read.is_err(), "a layer the pool lacks");
    assert_eq!(a, vec![0u8; 8], "the good range was read first");
}

#[test]
fn a_graph_writes_kv_cells_through_the_exclusive_handles() {
    let dir = tempfile::tempdir().expect("temp dir");
    let values = [1.0, -2.0, 3.5, 0.25, 8.0, -0.5, 6.0, 7.0];
    let gguf = one_tensor_file(dir.path(), &values);
    let weights = Weights::map(Arc::clone(&gguf), &[weight_spec(&gguf)], None, false).expect("map");
    let mut kv = KvTensors::new(&[4], &[4], KvType::F16, KvType::F16, 4).expect("pool");
    let mut compute = Compute::cpu(1).expect("compute");
    let kv_mut = kv.tensors_mut();
    compute
        .run(|g| {
            // Rows 0 and 1 of `w` into cells 3 and 1 of layer 0's V.
            let w = g.lift(weights.get(0));
            let cells = g.input(
                DType::I64,
                &[2],
                [3i64, 1].iter().flat_map(|c| c.to_le_bytes()).collect(),
            );
            let dst = g.lift_mut(kv_mut.v(0));
            let store = g.set_rows(dst, w, cells);
            g.expand(store);
            Ok(g.cont(w))
        })
        .expect("run");
    let f16_row = |r: &[f32]| -> Vec<u8> {
        r.iter()
            .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
            .collect()
    };
    let mut cells = vec![0xff; 32];
    kv.read(0, true, 0, &mut cells);
    assert_eq!(&cells[24..32], &f16_row(&values[..4])[..]);
    assert_eq!(&cells[8..16], &f16_row(&values[4..])[..]);
    assert!(cells[..8].iter().chain(&cells[16..24]).all(|&b| b == 0));
    kv.read(0, false, 0, &mut cells);
    assert!(cells.iter().all(|&b| b == 0), "K is another tensor");
}

#[test]
fn a_view_cannot_reach_past_its_source() {
    let mut compute = Compute::cpu(1).expect("compute");
    let mut view = |offset: usize, nb1: usize| {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            compute.run(|g| {
                // 8 f16 values: 16 bytes.
                let x = g.input(DType::F16, &[8], (0u8..16).collect());
                let v = g.view_3d(x, [2, 2, 1], [nb1, 16], offset);
                // An f16 output: `run` reports it as an error after computing, which is fine.
                Ok(g.cont(v))
            })
        }))
        .is_ok()
    };
    assert!(view(0, 4), "rows 0..2 and 2..4 (8 bytes)");
    assert!(view(8, 4), "the last 8 bytes");
    assert!(!view(10, 4), "two bytes past the end");
    assert!(!view(0, 14), "a stride that reaches past the end");
    assert!(!view(usize::MAX, 4), "an offset that overflows");
}

/// `w` (`ggml_type`, `[k, m]`, random values quantized by ggml) times the `n` columns `x`
/// (f32, random) with `lead` leading integer-sum rows allowed, computed by [`Graph::mul_mat`]
/// with 2 threads: the `m * n` results, column by column.
fn routed_product(ggml_type: GgmlType, k: usize, m: usize, n: usize, lead: usize) -> Vec<f32> {
    let mut rng = crate::testing::SplitMix64(k as u64 * 31 + m as u64);
    let values = rng.f32_vec(k * m, 0.5);
    let block_bytes = match ggml_type {
        GgmlType::Q4_0 => 18,
        GgmlType::Q5_0 => 22,
        _ => 34,
    };
    let mut bytes = vec![0u8; k * m / 32 * block_bytes];
    // SAFETY: `values` holds m rows of k floats and `bytes` their m * k / 32 blocks.
    let written = unsafe {
        sys::ggml_quantize_chunk(
            ggml_type as u32,
            values.as_ptr(),
            bytes.as_mut_ptr().cast(),
            0,
            m as i64,
            k as i64,
            std::ptr::null(),
        )
    };
    assert_eq!(written, bytes.len());
    let x = f32_bytes(&rng.f32_vec(k * n, 2.0));
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("w.gguf");
    GgufWriter::new()
        .add_tensor("w", &[k as u64, m as u64], ggml_type, bytes)
        .add_tensor("x", &[k as u64, n as u64], GgmlType::F32, x)
        .write(&path)
        .expect("write the file");
    let gguf = Arc::new(Gguf::open(&path).expect("open the file"));
    let specs: Vec<WeightSpec<'_>> = ["w", "x"]
        .iter()
        .map(|name| {
            let info = gguf.tensor(name).expect("tensor");
            WeightSpec {
                name: &info.name,
                ggml_type: info.dtype as u32,
                shape: &info.shape,
                offset: info.offset as usize,
                n_bytes: info.n_bytes as usize,
                on_device: false,
                matmul_only: false,
            }
        })
        .collect();
    let weights = Weights::map(Arc::clone(&gguf), &specs, None, false).expect("map");
    let mut compute = Compute::cpu(2).expect("compute");
    compute
        .run(|g| {
            g.allow_integer_sums(crate::ggml::IntegerSums::Leading(n, lead));
            let w = g.lift(weights.get(0));
            let x = g.lift(weights.get(1));
            Ok(g.mul_mat(w, x))
        })
        .expect("run")
}

#[test]
fn integer_sum_products_take_the_leading_rows_and_ggml_the_others() {
    // SAFETY: plain queries.
    let vectorized = unsafe {
        [
            sys::kernels::ggml_sys_mul_mat_q4_0_isum(),
            sys::kernels::ggml_sys_mul_mat_q5_0_isum(),
            sys::kernels::ggml_sys_mul_mat_q8_0_isum(),
        ]
    };
    let types = [GgmlType::Q4_0, GgmlType::Q5_0, GgmlType::Q8_0];
    for (ty, vectorized) in types.into_iter().zip(vectorized) {
        let (k, m, n) = (576, 37, 150);
        let ggml = routed_product(ty, k, m, n, 0);
        for lead in [64, 100, n] {
            let got = routed_product(ty, k, m, n, lead);
            let what = format!("{ty:?}, {lead} of {n} rows");
            // The other rows: ggml's bits.
            assert!(
                got[lead * m..]
                    .iter()
                    .zip(&ggml[lead * m..])
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{what}: the other rows are not ggml's"
            );
            // The leading rows: ggml's result up to rounding, and (when the kernel runs) other
            // bits somewhere: the kernel ran.
            let head = (&got[..lead * m], &ggml[..lead * m]);
            let scale = head.1.iter().fold(0f32, |s, v| s.max(v.abs()));
            assert!(
                head.0
                    .iter()
                    .zip(head.1)
                    .all(|(a, b)| (a - b).abs() <= 1e-5 * scale),
                "{what}: the leading rows are not ggml's product"
            );
            let differing = head.0.iter().zip(head.1).filter(|(a, b)| a != b).count();
            assert_eq!(
                differing > 0,
                vectorized == 1,
                "{what}: {differing} leading results differ from ggml's"
            );
        }
        // Fewer than 64 leading rows: all ggml's.
        let few = routed_product(ty, k, m, n, 63);
        assert!(
            few.iter()
                .zip(&ggml)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{ty:?}: 63 leading rows"
        );
    }
}
