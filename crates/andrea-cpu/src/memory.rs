//! The memory ops on host memory: allocation, upload, download, fill, copy (the
//! `andrea_core::MemoryOps` of [`CpuBackend`]), and the backend's name.

use andrea_core::{bf16, check, Bf16Tensor, Ids, Mat, MemoryOps, Result, Tensor};

use crate::buffer::{read, write, CpuBuffer, CpuIds, SendPtr};
use crate::CpuBackend;

impl MemoryOps for CpuBackend {
    type Buffer = CpuBuffer;
    type IdBuffer = CpuIds;
    type Bf16Buffer = CpuBuffer<bf16>;

    fn name(&self) -> String {
        let precision = match self.precision {
            andrea_core::MatmulPrecision::Bf16 => ", bf16 operands, decode from bf16 weights",
            _ => "",
        };
        format!(
            "cpu ({} threads, {}, gemm {}, attention {}{precision})",
            self.threads(),
            crate::simd::level().name(),
            self.kernel.effective().name(),
            self.attention.name()
        )
    }

    fn alloc(&self, len: usize) -> Result<CpuBuffer> {
        CpuBuffer::try_zeros(len).ok_or_else(|| host_out_of_memory(len, 4))
    }

    fn alloc_ids(&self, len: usize) -> Result<CpuIds> {
        CpuIds::try_zeros(len).ok_or_else(|| host_out_of_memory(len, 4))
    }

    fn alloc_bf16(&self, len: usize) -> Result<CpuBuffer<bf16>> {
        CpuBuffer::try_zeros(len).ok_or_else(|| host_out_of_memory(len, 2))
    }

    fn upload(&self, src: &[f32], dst: Tensor<'_, Self>) -> Result<()> {
        check::upload(&dst, src.len())?;
        // SAFETY: checked in bounds; `src` is host memory, not a backend buffer.
        let dst = unsafe { write(&dst) };
        self.bf16_copies.forget(dst.as_ptr(), dst.len());
        dst.copy_from_slice(src);
        Ok(())
    }

    fn download(&self, src: Tensor<'_, Self>, dst: &mut [f32]) -> Result<()> {
        check::download(&src, dst.len())?;
        // SAFETY: checked in bounds; no op is running on this thread's buffer.
        dst.copy_from_slice(unsafe { read(&src) });
        Ok(())
    }

    fn with_host_elements(
        &self,
        t: Tensor<'_, Self>,
        f: &mut dyn FnMut(&mut [f32]),
    ) -> Result<bool> {
        check::download(&t, t.numel())?;
        // SAFETY: checked in bounds; no op is running on this thread's buffer, and `f`
        // gets no other view of it.
        let t = unsafe { write(&t) };
        self.bf16_copies.forget(t.as_ptr(), t.len());
        f(t);
        Ok(true)
    }

    fn upload_ids(&self, src: &[u32], dst: Ids<'_, Self>) -> Result<()> {
        check::upload_ids(&dst, src.len())?;
        // SAFETY: as in `upload`.
        unsafe { write(&dst) }.copy_from_slice(src);
        Ok(())
    }

    fn fill(&self, dst: Tensor<'_, Self>, value: f32) -> Result<()> {
        check::fill(&dst)?;
        // SAFETY: checked in bounds; the only argument.
        let y = unsafe { write(&dst) };
        self.bf16_copies.forget(y.as_ptr(), y.len());
        self.run(|| crate::elementwise::fill(y, value));
        Ok(())
    }

    fn to_bf16(&self, src: Tensor<'_, Self>, dst: Bf16Tensor<'_, Self>) -> Result<()> {
        check::convert("to_bf16", &src, &dst)?;
        // SAFETY: checked in bounds; buffers of different element types are distinct.
        let (x, y) = unsafe { (read(&src), write(&dst)) };
        self.run(|| crate::elementwise::convert::to_bf16(x, y));
        Ok(())
    }

    fn to_f32(&self, src: Bf16Tensor<'_, Self>, dst: Tensor<'_, Self>) -> Result<()> {
        check::convert("to_f32", &src, &dst)?;
        // SAFETY: as in `to_bf16`.
        let (x, y) = unsafe { (read(&src), write(&dst)) };
        self.bf16_copies.forget(y.as_ptr(), y.len());
        self.run(|| crate::elementwise::convert::to_f32(x, y));
        Ok(())
    }

    /// In BF16 precision, a copy that the few-rows products (decoding) read at half the
    /// bytes; in FP32, nothing.
    fn keep_bf16_weights(&self, weights: Tensor<'_, Self>) -> Result<()> {
        check::download(&weights, weights.numel())?;
        if self.precision == andrea_core::MatmulPrecision::Bf16 {
            // SAFETY: checked in bounds; only read.
            let w = unsafe { read(&weights) };
            self.run(|| self.bf16_copies.keep(w));
        }
        Ok(())
    }

    fn copy(&self, src: Mat<'_, Self>, dst: Mat<'_, Self>) -> Result<()> {
        check::copy(&src, &dst)?;
        let (ps, pd) = (SendPtr::of(&src), SendPtr::of(&dst));
        let extent = dst.extent();
        self.bf16_copies.forget(pd.get(), extent.end - extent.start);
        for b in 0..src.batch {
            for i in 0..src.rows {
                for j in 0..src.cols {
                    // SAFETY: both matrices checked in bounds and disjoint.
                    unsafe {
                        *pd.0.add(dst.at(b, i, j) - dst.offset) =
                            *ps.0.add(src.at(b, i, j) - src.offset);
                    }
                }
            }
        }
        Ok(())
    }
}

/// The error of a host allocation of `len` elements of `size` bytes that failed.
fn host_out_of_memory(len: usize, size: usize) -> andrea_core::Error {
    andrea_core::Error::OutOfMemory {
        device: "the CPU (host memory)".into(),
        bytes: len.saturating_mul(size),
    }
}
