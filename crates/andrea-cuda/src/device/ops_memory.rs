//! Memory: buffers, host transfers, `fill` and the strided `copy`.

use andrea_core::{check, Bf16Tensor, DeviceRegion, Ids, Mat, MemoryOps, Result, Tensor};

use super::buffer::{addr, ptr, CudaBf16, CudaBuffer, CudaIds};
use super::driver::CuDevicePtr;
use super::launch::Args;
use super::{driver, CudaBackend};
use crate::plan::{elementwise, int, long};

impl MemoryOps for CudaBackend {
    type Buffer = CudaBuffer;
    type IdBuffer = CudaIds;
    type Bf16Buffer = CudaBf16;

    fn name(&self) -> String {
        let (major, minor) = self.compute_capability;
        format!(
            "cuda: {} (sm_{major}{minor}, matmul {:?}, {} tanh)",
            self.device_name,
            self.precision.matmul,
            if self.precision.approx_tanh {
                "approx"
            } else {
                "exact"
            }
        )
    }

    fn alloc(&self, len: usize) -> Result<CudaBuffer> {
        Ok(CudaBuffer {
            buf: self.alloc_buffer(len)?,
        })
    }

    fn alloc_ids(&self, len: usize) -> Result<CudaIds> {
        let buf = self.alloc_buffer(len)?;
        self.bind()?;
        let bytes = len * std::mem::size_of::<u32>();
        let staging = cust::memory::LockedBuffer::new(&0u32, len).map_err(|e| {
            driver::from_cust(
                e,
                "allocating page-locked host memory for ids",
                &self.device_name,
                Some(bytes),
            )
        })?;
        Ok(CudaIds {
            buf,
            host: std::cell::RefCell::new(vec![0; len]),
            staging: std::cell::RefCell::new(staging),
            staged_at: std::cell::Cell::new(None),
        })
    }

    fn alloc_bf16(&self, len: usize) -> Result<CudaBf16> {
        Ok(CudaBf16 {
            buf: self.alloc_buffer(len)?,
        })
    }

    fn upload(&self, src: &[f32], dst: Tensor<'_, Self>) -> Result<()> {
        check::upload(&dst, src.len())?;
        self.copy_to_device(Self::view_ptr(&dst), src, "upload")
    }

    fn download(&self, src: Tensor<'_, Self>, dst: &mut [f32]) -> Result<()> {
        check::download(&src, dst.len())?;
        self.copy_to_host(dst, Self::view_ptr(&src), "download")
    }

    fn upload_ids(&self, src: &[u32], dst: Ids<'_, Self>) -> Result<()> {
        check::upload_ids(&dst, src.len())?;
        if dst.buf.staged_at.get() == Some(self.syncs.get()) {
            // The last staged copy may still be reading `staging`.
            self.sync("upload_ids")?;
        }
        let mut staging = dst.buf.staging.borrow_mut();
        let staged = &mut staging[dst.range()];
        staged.copy_from_slice(src);
        self.copy_to_device(Self::view_ptr(&dst), staged, "upload_ids")?;
        dst.buf.staged_at.set(Some(self.syncs.get()));
        dst.buf.host.borrow_mut()[dst.range()].copy_from_slice(src);
        Ok(())
    }

    fn synchronize(&self) -> Result<()> {
        self.sync("synchronize")
    }

    /// The view's address and the backend's stream; the backend's context is made
    /// current on this thread, as NCCL (which follows the current context) needs.
    fn device_region(&self, t: Tensor<'_, Self>) -> Result<Option<DeviceRegion>> {
        check::download(&t, t.numel())?;
        self.bind()?;
        Ok(Some(DeviceRegion {
            ptr: Self::view_ptr(&t),
            len: t.numel(),
            stream: self.raw_stream() as usize,
        }))
    }

    fn fill(&self, dst: Tensor<'_, Self>, value: f32) -> Result<()> {
        let d = check::fill(&dst)?;
        self.memset32(Self::view_ptr(&dst), value.to_bits(), d.len, "fill")
    }

    fn copy(&self, src: Mat<'_, Self>, dst: Mat<'_, Self>) -> Result<()> {
        const OP: &str = "copy";
        let d = check::copy(&src, &dst)?;
        let n = d.batch * d.rows * d.cols;
        let l = elementwise::launch(OP, "copy_strided", "copy_strided", n, &[1])?;
        let s = |m: &Mat<'_, Self>| [m.batch_stride, m.row_stride, m.col_stride].map(long);
        let (ss, ds) = (s(&src), s(&dst));
        self.launch(
            &l,
            Args::new()
                .ptr(addr(src.buf, src.offset))
                .ptr(addr(dst.buf, dst.offset))
                .int(int(OP, "batch", d.batch)?)
                .int(int(OP, "rows", d.rows)?)
                .int(int(OP, "cols", d.cols)?)
                .long(ss[0])
                .long(ss[1])
                .long(ss[2])
                .long(ds[0])
                .long(ds[1])
                .long(ds[2]),
        )
    }

    fn to_bf16(&self, src: Tensor<'_, Self>, dst: Bf16Tensor<'_, Self>) -> Result<()> {
        let n = check::convert("to_bf16", &src, &dst)?.len;
        self.convert("to_bf16", "f32_to_bf16", ptr(&src), ptr(&dst), n)
    }

    fn to_f32(&self, src: Bf16Tensor<'_, Self>, dst: Tensor<'_, Self>) -> Result<()> {
        let n = check::convert("to_f32", &src, &dst)?.len;
        self.convert("to_f32", "bf16_to_f32", ptr(&src), ptr(&dst), n)
    }
}

impl CudaBackend {
    /// Launches the conversion `kernel` over `n` elements (one element a thread).
    pub(super) fn convert(
        &self,
        op: &'static str,
        kernel: &'static str,
        src: CuDevicePtr,
        dst: CuDevicePtr,
        n: usize,
    ) -> Result<()> {
        let l = elementwise::launch(op, kernel, kernel, n, &[1])?;
        self.launch(&l, Args::new().ptr(src).ptr(dst).long(long(n)))
    }
}
