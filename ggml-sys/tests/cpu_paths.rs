//! The CPU path chosen at start: the highest one this CPU runs unless `LLAMA_HDD_CPU` names
//! another it runs, and every call of ggml's CPU backend and of our kernels lands in that path.
//!
//! `cargo xtask ci` runs this crate's tests once under each path the machine runs (see
//! `xtask/src/main.rs`, `every_cpu_path`), so these checks and every kernel test run under each.

use ggml_sys::cpu::*;
use std::ffi::CStr;

/// The build's paths, lowest first.
fn paths() -> Vec<String> {
    // SAFETY: plain calls; names are static NUL-terminated strings for indices below the count.
    unsafe {
        (0..ggml_sys_cpu_paths())
            .map(|v| {
                let name = ggml_sys_cpu_path_name(v);
                assert!(!name.is_null(), "path {v} has no name");
                CStr::from_ptr(name)
                    .to_str()
                    .expect("ASCII name")
                    .to_owned()
            })
            .collect()
    }
}

/// Whether this CPU runs the x86-64 path `name`, by Rust's own detection (independent of the C
/// runtime's, which the dispatcher uses).
#[cfg(target_arch = "x86_64")]
fn rust_says_runnable(name: &str) -> Option<bool> {
    let avx2 = is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
        && is_x86_feature_detected!("bmi2");
    let avx512 = avx2
        && is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512dq")
        && is_x86_feature_detected!("avx512vl");
    Some(match name {
        "x86-64" => true,
        "avx2" => avx2,
        "avx-vnni" => avx2 && is_x86_feature_detected!("avxvnni"),
        "avx512" => avx512,
        "avx512-vnni" => avx512 && is_x86_feature_detected!("avx512vnni"),
        "amx" => avx512 && is_x86_feature_detected!("avx512vnni") && amx_enabled(),
        _ => return None,
    })
}

/// AMX-TILE and AMX-INT8 by cpuid (leaf 7, EDX bits 24 and 25), with the tile state enabled by
/// the operating system in XCR0 (bits 17 and 18, which Linux sets where it grants the tiles).
#[cfg(target_arch = "x86_64")]
fn amx_enabled() -> bool {
    use std::arch::x86_64::{__cpuid, __cpuid_count};
    if __cpuid(0).eax < 7 {
        return false;
    }
    let edx = __cpuid_count(7, 0).edx;
    let cpu = edx & (1 << 24) != 0 && edx & (1 << 25) != 0;
    // SAFETY: xgetbv runs only where cpuid says the OS enabled XSAVE (leaf 1, ECX bit 27).
    cpu && __cpuid(1).ecx & (1 << 27) != 0 && unsafe { xcr0() } & (3 << 17) == 3 << 17
}

/// XCR0, the state components the operating system enabled.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "xsave")]
unsafe fn xcr0() -> u64 {
    // SAFETY: the caller checked that XSAVE is enabled.
    unsafe { std::arch::x86_64::_xgetbv(0) }
}

#[cfg(not(target_arch = "x86_64"))]
fn rust_says_runnable(_name: &str) -> Option<bool> {
    None
}

#[test]
fn the_path_taken_is_the_highest_runnable_or_the_one_named() {
    let names = paths();
    assert!(!names.is_empty());
    // SAFETY: plain calls with indices within the count.
    let runnable: Vec<bool> = (0..names.len())
        .map(|v| unsafe { ggml_sys_cpu_path_supported(v as i32) } == 1)
        .collect();
    for (name, &runs) in names.iter().zip(&runnable) {
        if let Some(expected) = rust_says_runnable(name) {
            assert_eq!(runs, expected, "the dispatcher and Rust disagree on {name}");
        }
    }
    assert!(runnable[0], "the lowest path always runs");
    // The level taken by default: the highest runnable one but `amx`, which only a name takes.
    let highest = (0..names.len())
        .rev()
        .find(|&v| runnable[v] && names[v] != "amx")
        .unwrap();
    // SAFETY: plain calls.
    let (taken, request) = unsafe { (ggml_sys_cpu_path() as usize, ggml_sys_cpu_request()) };
    let wanted = std::env::var(PATH_ENV).ok().filter(|w| !w.is_empty());
    match wanted.as_deref() {
        None => {
            assert_eq!(request, 0);
            assert_eq!(
                taken, highest,
                "{} taken, {} runs",
                names[taken], names[highest]
            );
        }
        Some(w) => {
            let named = match w {
                "scalar" | "baseline" if names.len() > 1 => Some(0),
                _ => names.iter().position(|n| n == w),
            };
            match named {
                Some(v) if runnable[v] => {
                    assert_eq!(request, 1);
                    assert_eq!(names[taken], names[v], "{PATH_ENV}={w} not taken");
                }
                Some(_) => {
                    assert_eq!(request, REQUEST_NOT_RUNNABLE);
                    assert_eq!(taken, highest);
                }
                None => {
                    // A one-path build reports every other name as not runnable.
                    assert!(request == REQUEST_UNKNOWN || request == REQUEST_NOT_RUNNABLE);
                    assert_eq!(taken, highest);
                }
            }
        }
    }
}

#[test]
fn ggml_answers_for_the_path_taken() {
    let names = paths();
    if names.len() == 1 {
        // One build: ggml's answers are its compiler flags', nothing was chosen.
        return;
    }
    // SAFETY: plain calls.
    let name = &names[unsafe { ggml_sys_cpu_path() } as usize];
    // SAFETY: ggml's feature probes are plain calls that read nothing but constants.
    let (avx2, avx512, avx512_vnni, avx_vnni) = unsafe {
        (
            ggml_sys::ggml_cpu_has_avx2(),
            ggml_sys::ggml_cpu_has_avx512(),
            ggml_sys::ggml_cpu_has_avx512_vnni(),
            ggml_sys::ggml_cpu_has_avx_vnni(),
        )
    };
    // Each variant's probes report the instructions it was compiled with: they differ between
    // every pair of paths, so an answer from another variant than the one chosen fails here.
    let expected = match name.as_str() {
        "x86-64" => (0, 0, 0, 0),
        "avx2" => (1, 0, 0, 0),
        "avx-vnni" => (1, 0, 0, 1),
        "avx512" => (1, 1, 0, 0),
        "avx512-vnni" | "amx" => (1, 1, 1, 0),
        other => panic!("unknown path {other}"),
    };
    assert_eq!(
        (avx2, avx512, avx512_vnni, avx_vnni),
        expected,
        "on path {name}"
    );
    // The AMX level shares ggml's backend with `avx512-vnni`: our kernels tell them apart.
    // SAFETY: a plain call.
    let tiles = unsafe { ggml_sys::kernels::ggml_sys_mul_mat_amx() };
    assert_eq!(tiles, i32::from(name == "amx"), "on path {name}");
}
