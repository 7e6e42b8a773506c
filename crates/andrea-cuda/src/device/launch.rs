//! Checked kernel launches: arguments packed as the driver wants them, every launch's
//! error turned into a `Result` naming the kernel and its configuration.

use std::ffi::c_void;

use andrea_core::{Error, Result};

use super::driver::{self, CuDevicePtr};
use super::CudaBackend;
use crate::plan::Launch;

/// Kernel arguments, one 8-byte slot each (the driver reads `sizeof(param)` bytes from
/// each slot's address; all targets are little-endian, so a 4-byte value sits in the low
/// half of its slot).
#[derive(Debug, Default)]
pub(crate) struct Args {
    slots: Vec<u64>,
}

impl Args {
    pub(crate) fn new() -> Self {
        Args::default()
    }
    /// A device pointer (`float*`, `const unsigned*`, ...); 0 is `nullptr`.
    pub(crate) fn ptr(mut self, p: CuDevicePtr) -> Self {
        self.slots.push(p);
        self
    }
    /// An `int`.
    pub(crate) fn int(mut self, v: i32) -> Self {
        self.slots.push(v as u32 as u64);
        self
    }
    /// A `long long`.
    pub(crate) fn long(mut self, v: i64) -> Self {
        self.slots.push(v as u64);
        self
    }
    /// A `float`.
    pub(crate) fn float(mut self, v: f32) -> Self {
        self.slots.push(v.to_bits() as u64);
        self
    }
    /// A `double`.
    pub(crate) fn double(mut self, v: f64) -> Self {
        self.slots.push(v.to_bits());
        self
    }
    #[cfg(test)]
    pub(crate) fn slots(&self) -> &[u64] {
        &self.slots
    }
}

impl CudaBackend {
    /// Launches `l` with `args` on the backend's stream.
    pub(crate) fn launch(&self, l: &Launch, args: Args) -> Result<()> {
        let f = *self.functions.get(l.kernel).ok_or_else(|| Error::Device {
            context: format!("launching kernel `{}`", l.kernel),
            message:
                "the kernel is not in the loaded PTX (rebuild with `cargo xtask build-kernels`)"
                    .into(),
        })?;
        let mut params: Vec<*mut c_void> = args
            .slots
            .iter()
            .map(|s| s as *const u64 as *mut c_void)
            .collect();
        self.bind()?;
        // SAFETY: `f` is a kernel of a loaded module; `params` holds one valid slot per
        // kernel parameter (the op built them in the kernel's order) and outlives the
        // call, which copies them; the pointers were validated by `andrea_core::check`.
        let code = unsafe {
            driver::cuLaunchKernel(
                f,
                l.grid[0],
                l.grid[1],
                l.grid[2],
                l.block[0],
                l.block[1],
                l.block[2],
                l.smem,
                self.stream.as_inner() as driver::CuStream,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        };
        let describe = || {
            format!(
                "launching kernel `{}` (grid {:?}, block {:?}, {} B dynamic shared memory)",
                l.kernel, l.grid, l.block, l.smem
            )
        };
        driver::check(code, describe)?;
        if self.sync_each_launch {
            // ANDREA_CUDA_SYNC=1: attribute asynchronous faults to the kernel.
            // SAFETY: the backend's own stream.
            let code =
                unsafe { driver::cuStreamSynchronize(self.stream.as_inner() as driver::CuStream) };
            driver::check(code, || format!("running kernel `{}`", l.kernel))?;
        }
        Ok(())
    }
}

/// One argument of [`CudaBackend::launch_raw`].
#[doc(hidden)]
#[derive(Clone, Copy)]
#[allow(missing_debug_implementations)]
pub enum RawArg<'a> {
    /// A pointer to element `.1` of a buffer.
    Buf(&'a super::CudaBuffer, usize),
    /// An `int`.
    Int(i32),
}

impl CudaBackend {
    /// Tests only: launches any loaded kernel by name with the given arguments (the
    /// self-test kernels of `kernels/tc_selftest.cu`, which no op uses). The caller
    /// answers for the argument list matching the kernel's and for every access staying
    /// inside the buffers.
    #[doc(hidden)]
    pub fn launch_raw(
        &self,
        kernel: &'static str,
        grid: [u32; 3],
        block: [u32; 3],
        args: &[RawArg<'_>],
    ) -> Result<()> {
        let mut a = Args::new();
        for x in args {
            a = match *x {
                RawArg::Buf(b, off) => a.ptr(super::buffer::addr(b, off)),
                RawArg::Int(v) => a.int(v),
            };
        }
        let l = Launch {
            kernel,
            grid,
            block,
            smem: 0,
        };
        self.launch(&l, a)?;
        self.sync(&format!("running kernel `{kernel}`"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_hold_values_little_endian() {
        let a = Args::new()
            .ptr(0xdead_beef_0000)
            .int(-1)
            .long(-2)
            .float(1.5);
        assert_eq!(a.slots()[0], 0xdead_beef_0000);
        assert_eq!(a.slots()[1] as u32 as i32, -1);
        assert_eq!(a.slots()[1] >> 32, 0);
        assert_eq!(a.slots()[2] as i64, -2);
        assert_eq!(f32::from_bits(a.slots()[3] as u32), 1.5);
    }
}
