//! ggml's GGUF reader on a file that this test writes byte by byte from the format's definition.

use ggml_sys::*;
use std::ffi::{CStr, CString};

const ALIGN: usize = 32;

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// GGUF v3: header, key/values, tensor infos, padding, tensor data.
fn write_gguf(path: &std::path::Path) -> Vec<f32> {
    let mut out = b"GGUF".to_vec();
    out.extend_from_slice(&3u32.to_le_bytes());
    out.extend_from_slice(&2u64.to_le_bytes()); // tensors
    out.extend_from_slice(&4u64.to_le_bytes()); // key/values

    put_str(&mut out, "general.architecture");
    out.extend_from_slice(&8u32.to_le_bytes()); // string
    put_str(&mut out, "llama");
    put_str(&mut out, "llama.block_count");
    out.extend_from_slice(&4u32.to_le_bytes()); // u32
    out.extend_from_slice(&30u32.to_le_bytes());
    put_str(&mut out, "llama.rope.freq_base");
    out.extend_from_slice(&6u32.to_le_bytes()); // f32
    out.extend_from_slice(&10000.5f32.to_le_bytes());
    put_str(&mut out, "tokenizer.ggml.tokens");
    out.extend_from_slice(&9u32.to_le_bytes()); // array
    out.extend_from_slice(&8u32.to_le_bytes()); // of strings
    out.extend_from_slice(&3u64.to_le_bytes());
    for t in ["<s>", "hello", "wörld"] {
        put_str(&mut out, t);
    }

    // Tensor "a": f32 [4, 3] at offset 0 (48 bytes); "b": f32 [5] at the next aligned offset, 64.
    put_str(&mut out, "a");
    out.extend_from_slice(&2u32.to_le_bytes());
    out.extend_from_slice(&4u64.to_le_bytes());
    out.extend_from_slice(&3u64.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes()); // GGML_TYPE_F32
    out.extend_from_slice(&0u64.to_le_bytes());
    put_str(&mut out, "b");
    out.extend_from_slice(&1u32.to_le_bytes());
    out.extend_from_slice(&5u64.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&64u64.to_le_bytes());

    while !out.len().is_multiple_of(ALIGN) {
        out.push(0);
    }
    let values: Vec<f32> = (0..12)
        .map(|i| i as f32 * 0.5)
        .chain((0..5).map(|i| -(i as f32)))
        .collect();
    for v in &values[..12] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out.resize(out.len() + 16, 0); // pad 48 -> 64
    for v in &values[12..] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    while !out.len().is_multiple_of(ALIGN) {
        out.push(0); // the data section ends padded, like every tensor in it
    }
    std::fs::write(path, out).unwrap();
    values
}

#[test]
fn reads_metadata_and_tensor_infos() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    let values = write_gguf(&path);
    let cpath = CString::new(path.to_str().unwrap()).unwrap();
    let mut data_ctx: *mut ggml_context = std::ptr::null_mut();
    // SAFETY: valid C string and out-pointer; the contexts are freed at the end; every index
    // passed below comes from a successful lookup.
    unsafe {
        let g = gguf_init_from_file(
            cpath.as_ptr(),
            gguf_init_params {
                no_alloc: false,
                ctx: &mut data_ctx,
            },
        );
        assert!(!g.is_null(), "ggml refused a well-formed file");
        assert_eq!(gguf_get_version(g), 3);
        assert_eq!(gguf_get_n_kv(g), 4);
        assert_eq!(gguf_get_alignment(g), ALIGN);

        let key = |k: &str| gguf_find_key(g, CString::new(k).unwrap().as_ptr());
        let arch = key("general.architecture");
        assert_eq!(
            CStr::from_ptr(gguf_get_val_str(g, arch)).to_str().unwrap(),
            "llama"
        );
        assert_eq!(gguf_get_val_u32(g, key("llama.block_count")), 30);
        assert_eq!(gguf_get_val_f32(g, key("llama.rope.freq_base")), 10000.5);
        let toks = key("tokenizer.ggml.tokens");
        assert_eq!(gguf_get_arr_n(g, toks), 3);
        assert_eq!(
            CStr::from_ptr(gguf_get_arr_str(g, toks, 2))
                .to_str()
                .unwrap(),
            "wörld"
        );
        assert_eq!(key("no.such.key"), -1);

        assert_eq!(gguf_get_n_tensors(g), 2);
        let b = gguf_find_tensor(g, c"b".as_ptr());
        assert_eq!(
            CStr::from_ptr(gguf_get_tensor_name(g, b)).to_str().unwrap(),
            "b"
        );
        assert_eq!(gguf_get_tensor_type(g, b), GGML_TYPE_F32);
        assert_eq!(gguf_get_tensor_offset(g, b), 64);
        assert_eq!(gguf_get_tensor_size(g, b), 20);

        // The tensors were loaded into data_ctx with the right shapes and contents.
        let a = ggml_get_tensor(data_ctx, c"a".as_ptr());
        assert!(!a.is_null());
        assert_eq!(((*a).ne[0], (*a).ne[1]), (4, 3));
        let got = std::slice::from_raw_parts((*a).data as *const f32, 12);
        assert_eq!(got, &values[..12]);
        let tb = ggml_get_tensor(data_ctx, c"b".as_ptr());
        assert_eq!(
            std::slice::from_raw_parts((*tb).data as *const f32, 5),
            &values[12..]
        );

        gguf_free(g);
        ggml_free(data_ctx);
    }
}

#[test]
fn refuses_a_truncated_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    write_gguf(&path);
    let full = std::fs::read(&path).unwrap();
    for cut in [3, 20, 60, full.len() - 1] {
        std::fs::write(&path, &full[..cut]).unwrap();
        let cpath = CString::new(path.to_str().unwrap()).unwrap();
        let mut data_ctx: *mut ggml_context = std::ptr::null_mut();
        // SAFETY: as above; a null result is the expected refusal.
        let g = unsafe {
            gguf_init_from_file(
                cpath.as_ptr(),
                gguf_init_params {
                    no_alloc: false,
                    ctx: &mut data_ctx,
                },
            )
        };
        assert!(
            g.is_null(),
            "a file cut at {cut} of {} bytes was accepted",
            full.len()
        );
    }
}
