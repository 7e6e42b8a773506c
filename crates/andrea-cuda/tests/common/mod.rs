//! Running one op on the CPU backend and the CUDA backend from the same host inputs.

#![allow(dead_code)]

pub mod matmul;

use andrea_core::{AttentionShape, Backend, Heads, View};
use andrea_cpu::CpuBackend;
use andrea_cuda::{CudaBackend, Precision};

/// The CUDA backend in `precision`, or `None` when there is no device (see
/// [`andrea_testkit::device::start_or_skip`]).
pub fn cuda(name: &str, precision: Precision) -> Option<CudaBackend> {
    andrea_testkit::device::start_or_skip(name, || CudaBackend::with_precision(precision))
}

/// A deterministic pseudo-random vector in `[lo, hi)`.
pub fn data(seed: u64, n: usize, lo: f32, hi: f32) -> Vec<f32> {
    andrea_testkit::random::Rand::new(seed).vec(n, lo, hi)
}

/// A buffer holding `host`.
pub fn buf<B: Backend>(be: &B, host: &[f32]) -> B::Buffer {
    let b = be.alloc(host.len()).expect("alloc");
    be.upload(host, View::whole(&b)).expect("upload");
    b
}

/// A token-id buffer holding `host`.
pub fn ids<B: Backend>(be: &B, host: &[u32]) -> B::IdBuffer {
    let b = be.alloc_ids(host.len()).expect("alloc_ids");
    be.upload_ids(host, View::whole(&b)).expect("upload_ids");
    b
}

/// The contents of a buffer.
pub fn read<B: Backend>(be: &B, b: &B::Buffer) -> Vec<f32> {
    let mut host = vec![0.0; andrea_core::DeviceMemory::len(b)];
    be.download(View::whole(b), &mut host).expect("download");
    host
}

/// The CPU backend the GPU is compared with.
pub fn cpu() -> CpuBackend {
    CpuBackend::new()
}

/// Compares element by element: `|gpu - cpu| <= bound(i)`; on failure names the worst.
pub fn compare(
    name: &str,
    gpu: &[f32],
    cpu: &[f32],
    bound: impl Fn(usize) -> f64,
) -> Result<(), String> {
    assert_eq!(gpu.len(), cpu.len(), "{name}: lengths");
    let mut worst: Option<(usize, f64)> = None;
    let mut failed = 0;
    for i in 0..gpu.len() {
        let (g, c) = (gpu[i] as f64, cpu[i] as f64);
        let r = if g == c {
            0.0
        } else {
            (g - c).abs() / bound(i)
        };
        let r = if r.is_nan() { f64::INFINITY } else { r };
        if r > 1.0 {
            failed += 1;
        }
        if worst.is_none_or(|(_, w)| r > w) {
            worst = Some((i, r));
        }
    }
    match worst {
        Some((i, r)) if failed > 0 => Err(format!(
            "{name}: {failed} of {} elements out of tolerance; worst at {i}: gpu {:e}, cpu {:e}, |diff| / bound = {r:.2}",
            gpu.len(),
            gpu[i],
            cpu[i]
        )),
        _ => Ok(()),
    }
}

/// Attention forward then backward on `be` through one `[B, T, 3C]` qkv buffer (the
/// strided q, k, v views the model uses): `[out, d(qkv)]`.
pub fn attention_pass<B: Backend>(
    be: &B,
    qkv: &[f32],
    dout: &[f32],
    b: usize,
    t: usize,
    h: usize,
    d: usize,
) -> Vec<Vec<f32>> {
    let c = h * d;
    let (x, dx) = (buf(be, qkv), buf(be, &vec![0.0; b * t * 3 * c]));
    let (o, g) = (buf(be, &vec![0.0; b * t * c]), buf(be, dout));
    let shape = AttentionShape {
        batch: b,
        heads: h,
        head_dim: d,
        q_len: t,
        k_len: t,
    };
    let ws = buf(be, &vec![0.0; be.attention_workspace_len(shape).max(1)]);
    let sc = buf(
        be,
        &vec![0.0; be.attention_backward_scratch_len(shape).max(1)],
    );
    let [q, k, v] = Heads::split_qkv(View::new(&x, 0, [b, t, 3 * c]), h).unwrap();
    let [dq, dk, dv] = Heads::split_qkv(View::new(&dx, 0, [b, t, 3 * c]), h).unwrap();
    let oh = Heads::from_tensor(View::new(&o, 0, [b, t, c]), h).unwrap();
    let gh = Heads::from_tensor(View::new(&g, 0, [b, t, c]), h).unwrap();
    be.attention_forward(q, k, v, oh, View::whole(&ws), 0)
        .expect("attention_forward");
    be.attention_backward(
        q,
        k,
        v,
        oh,
        gh,
        dq,
        dk,
        dv,
        View::whole(&ws),
        View::whole(&sc),
    )
    .expect("attention_backward");
    vec![read(be, &o), read(be, &dx)]
}

/// Sets the emulator's warp order for this thread's launches (`andrea_emu_set_warp_order`
/// in xtask/cuda-emu/emu_runtime.cpp: 0 lockstep, 1 serial); false on a real driver,
/// which has no such symbol.
pub fn set_warp_order(serial: bool) -> bool {
    use std::ffi::{c_char, c_int, c_void};
    extern "C" {
        fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void;
    }
    // SAFETY: dlsym with RTLD_DEFAULT (null on glibc) and a NUL-terminated name.
    let f = unsafe { dlsym(std::ptr::null_mut(), c"andrea_emu_set_warp_order".as_ptr()) };
    if f.is_null() {
        return false;
    }
    // SAFETY: the emulator defines it as `void (int)`.
    let f: extern "C" fn(c_int) = unsafe { std::mem::transmute(f) };
    f(c_int::from(serial));
    true
}
