//! The few raw driver calls the backend makes itself, and the mapping of driver error
//! codes to [`andrea_core::Error`].
//!
//! They are declared here with `i32` results rather than through `cust::sys`, whose
//! bindings return a Rust enum: a code the enum does not list (a newer driver's) would
//! be undefined behaviour there and is just a number here. The symbols resolve against
//! the `libcuda` that cust links.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};

use andrea_core::Error;

pub(crate) type CuDevicePtr = u64;
pub(crate) type CuFunction = *mut c_void;
pub(crate) type CuModule = *mut c_void;
pub(crate) type CuStream = *mut c_void;
pub(crate) type CuContext = *mut c_void;

extern "C" {
    pub(crate) fn cuDriverGetVersion(version: *mut c_int) -> i32;
    pub(crate) fn cuCtxSetCurrent(ctx: CuContext) -> i32;
    pub(crate) fn cuModuleLoadDataEx(
        module: *mut CuModule,
        image: *const c_void,
        num_options: c_uint,
        options: *mut c_int,
        values: *mut *mut c_void,
    ) -> i32;
    pub(crate) fn cuModuleUnload(module: CuModule) -> i32;
    pub(crate) fn cuModuleGetFunction(
        f: *mut CuFunction,
        module: CuModule,
        name: *const c_char,
    ) -> i32;
    pub(crate) fn cuFuncSetAttribute(f: CuFunction, attrib: c_int, value: c_int) -> i32;
    pub(crate) fn cuFuncGetAttribute(value: *mut c_int, attrib: c_int, f: CuFunction) -> i32;
    pub(crate) fn cuDeviceGetAttribute(value: *mut c_int, attrib: c_int, device: c_int) -> i32;
    pub(crate) fn cuLaunchKernel(
        f: CuFunction,
        gx: c_uint,
        gy: c_uint,
        gz: c_uint,
        bx: c_uint,
        by: c_uint,
        bz: c_uint,
        smem: c_uint,
        stream: CuStream,
        params: *mut *mut c_void,
        extra: *mut *mut c_void,
    ) -> i32;
    pub(crate) fn cuMemcpyHtoDAsync_v2(
        dst: CuDevicePtr,
        src: *const c_void,
        bytes: usize,
        stream: CuStream,
    ) -> i32;
    pub(crate) fn cuMemcpyDtoHAsync_v2(
        dst: *mut c_void,
        src: CuDevicePtr,
        bytes: usize,
        stream: CuStream,
    ) -> i32;
    pub(crate) fn cuMemsetD32Async(
        dst: CuDevicePtr,
        value: c_uint,
        count: usize,
        stream: CuStream,
    ) -> i32;
    pub(crate) fn cuStreamSynchronize(stream: CuStream) -> i32;
    fn cuGetErrorName(code: i32, out: *mut *const c_char) -> i32;
    fn cuGetErrorString(code: i32, out: *mut *const c_char) -> i32;
}

pub(crate) const CUDA_SUCCESS: i32 = 0;
pub(crate) const CUDA_ERROR_OUT_OF_MEMORY: i32 = 2;
pub(crate) const CUDA_ERROR_NO_DEVICE: i32 = 100;
pub(crate) const CUDA_ERROR_NO_BINARY_FOR_GPU: i32 = 209;
pub(crate) const CUDA_ERROR_INVALID_PTX: i32 = 218;
pub(crate) const CUDA_ERROR_UNSUPPORTED_PTX_VERSION: i32 = 222;

/// The oldest driver API version (`cuDriverGetVersion`) that loads PTX ISA 9.0.
pub(crate) const MIN_DRIVER_VERSION: i32 = 13000;

fn c_text(f: unsafe extern "C" fn(i32, *mut *const c_char) -> i32, code: i32) -> Option<String> {
    let mut p: *const c_char = std::ptr::null();
    // SAFETY: the driver writes a pointer to a static NUL-terminated string, or fails.
    let r = unsafe { f(code, &mut p) };
    if r != CUDA_SUCCESS || p.is_null() {
        return None;
    }
    // SAFETY: checked non-null; static storage owned by the driver.
    Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

/// `CUDA_ERROR_X (n): description` for a driver code.
pub(crate) fn describe(code: i32) -> String {
    let name = c_text(cuGetErrorName, code).unwrap_or_else(|| "CUDA error".into());
    match c_text(cuGetErrorString, code) {
        Some(s) => format!("{name} ({code}): {s}"),
        None => format!("{name} ({code})"),
    }
}

/// What to do when the driver cannot load the kernels.
pub(crate) fn driver_too_old(version: i32) -> Error {
    Error::Device {
        context: "loading andrea's CUDA kernels".into(),
        message: format!(
            "the NVIDIA driver supports CUDA {}.{}, but the kernels are PTX ISA {} from nvcc 13.0, \
             which needs a CUDA 13.0 driver (version 580 or newer): update the driver",
            version / 1000,
            (version % 1000) / 10,
            crate::ptx::isa_version()
        ),
    }
}

/// No device: the error the conformance suite turns into SKIPPED.
pub(crate) fn no_device(detail: &str) -> Error {
    Error::NoDevice {
        kind: "CUDA",
        hint: format!(
            "{detail}; andrea-cuda needs an NVIDIA GPU of compute capability 8.0 or newer and \
             its driver (use the CPU backend otherwise)"
        ),
    }
}

/// Turns a driver result into a `Result`, `what` naming the call or kernel.
pub(crate) fn check(code: i32, what: impl FnOnce() -> String) -> andrea_core::Result<()> {
    match code {
        CUDA_SUCCESS => Ok(()),
        CUDA_ERROR_NO_DEVICE => Err(no_device(&format!("{}: {}", what(), describe(code)))),
        _ => Err(Error::Device {
            context: what(),
            message: describe(code),
        }),
    }
}

/// Maps cust's error type, `bytes` being the allocation size when it was one.
pub(crate) fn from_cust(
    e: cust::error::CudaError,
    what: &str,
    device: &str,
    bytes: Option<usize>,
) -> Error {
    use cust::error::CudaError as E;
    match (e, bytes) {
        (E::OutOfMemory | E::InvalidMemoryAllocation, Some(bytes)) => Error::OutOfMemory {
            device: device.to_string(),
            bytes,
        },
        (E::NoDevice, _) => no_device(&format!("{what}: {}", describe(CUDA_ERROR_NO_DEVICE))),
        (e, _) if (e as u32) > 999 => Error::Device {
            context: what.to_string(),
            message: e.to_string(),
        },
        (e, _) => Error::Device {
            context: what.to_string(),
            message: describe(e as i32),
        },
    }
}
