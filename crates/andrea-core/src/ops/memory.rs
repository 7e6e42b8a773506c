//! Memory: buffers, transfers between host and device, `fill` and the strided `copy`.

use super::{Bf16Tensor, Ids, Mat, Tensor};
use crate::error::Result;
use crate::tensor::DeviceMemory;

/// Where a view's elements are in device memory, for a library that reads and writes
/// device memory itself in the backend's stream order (NCCL's all-reduce): the address
/// of the first element, the element count, and the stream (the driver's `CUstream`,
/// as an address) the backend queues its ops on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceRegion {
    pub ptr: u64,
    pub len: usize,
    pub stream: usize,
}

/// A device's memory: the base every other op family builds on.
pub trait MemoryOps: Sized {
    /// Device memory holding `f32` elements.
    type Buffer: DeviceMemory + Send;
    /// Device memory holding `u32` token ids.
    type IdBuffer: DeviceMemory + Send;
    /// Device memory holding [`crate::bf16`] elements: what a backend stores in BF16 (a
    /// weight copy, activations); see [`crate::precision`].
    type Bf16Buffer: DeviceMemory + Send;

    /// A short human-readable description ("cpu (2 threads, avx512)", "cuda: NVIDIA H200").
    fn name(&self) -> String;

    /// A zero-filled buffer of `len` floats.
    fn alloc(&self, len: usize) -> Result<Self::Buffer>;
    /// A zero-filled buffer of `len` token ids.
    fn alloc_ids(&self, len: usize) -> Result<Self::IdBuffer>;
    /// A zero-filled buffer of `len` bfloat16 elements.
    fn alloc_bf16(&self, len: usize) -> Result<Self::Bf16Buffer>;
    /// Copies host floats into `dst` (`src.len()` must equal `dst.numel()`).
    fn upload(&self, src: &[f32], dst: Tensor<'_, Self>) -> Result<()>;
    /// Copies `src` to host memory (`dst.len()` must equal `src.numel()`).
    fn download(&self, src: Tensor<'_, Self>, dst: &mut [f32]) -> Result<()>;
    /// Copies host token ids into `dst`.
    fn upload_ids(&self, src: &[u32], dst: Ids<'_, Self>) -> Result<()>;
    /// Waits until every op issued so far has finished.
    fn synchronize(&self) -> Result<()> {
        Ok(())
    }
    /// The device address of `t`'s elements and the backend's stream (checked like a
    /// download), for a device-side collective (NCCL). `None`, the default, for a
    /// backend whose buffers are host memory: collectives then go through host copies.
    fn device_region(&self, t: Tensor<'_, Self>) -> Result<Option<DeviceRegion>> {
        check::download(&t, t.numel())?;
        Ok(None)
    }
    /// Runs `f` on `t`'s elements in place where the backend's buffers are host memory
    /// (the CPU backend), so that a host-side collective (MPI) reads and writes them with
    /// no staging copy; returns whether it ran. `false`, the default, for device memory:
    /// the caller downloads, works and uploads instead.
    fn with_host_elements(
        &self,
        t: Tensor<'_, Self>,
        f: &mut dyn FnMut(&mut [f32]),
    ) -> Result<bool> {
        let _ = f;
        check::download(&t, t.numel())?;
        Ok(false)
    }
    /// `dst[i] = value`.
    fn fill(&self, dst: Tensor<'_, Self>, value: f32) -> Result<()>;
    /// `dst[b,i,j] = src[b,i,j]` for matrices of equal sizes and any strides
    /// (appending keys and values to a KV cache, gathering a row of logits).
    fn copy(&self, src: Mat<'_, Self>, dst: Mat<'_, Self>) -> Result<()>;
    /// `dst[i] = src[i]` rounded to BF16, to nearest with ties to even
    /// ([`crate::round_bf16`]): values beyond BF16's largest become infinities, NaN stays
    /// NaN. Views of equal element counts.
    fn to_bf16(&self, src: Tensor<'_, Self>, dst: Bf16Tensor<'_, Self>) -> Result<()>;
    /// `dst[i] = src[i]` widened to FP32 (exact). Views of equal element counts.
    fn to_f32(&self, src: Bf16Tensor<'_, Self>, dst: Tensor<'_, Self>) -> Result<()>;
    /// Offers the backend `weights` (the model's parameters) to keep a BF16 copy of,
    /// rounded as [`MemoryOps::to_bf16`] rounds: a backend whose products in BF16
    /// precision read their weights from such a copy (the CPU backend's decoding, which
    /// then streams half the bytes) makes it here; the model calls this before it
    /// generates. The copy changes no result, only the bytes read: a product whose
    /// weights have no current copy rounds them as it reads them. A backend drops a copy
    /// when an op writes its weights (`upload`, `adamw`). Default: nothing to keep.
    fn keep_bf16_weights(&self, weights: Tensor<'_, Self>) -> Result<()> {
        check::download(&weights, weights.numel())?;
        Ok(())
    }
}

/// Argument checks of the memory ops.
pub mod check {
    use crate::check::{disjoint, matrix, output_matrix, view, Region};
    use crate::error::{Error, Result};
    use crate::tensor::{DeviceMemory, Matrix, View};

    /// Sizes of a validated op on `len` elements in a row.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct ElementwiseDims {
        pub len: usize,
    }

    /// Sizes of a validated strided copy: `batch × rows × cols`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct CopyDims {
        pub batch: usize,
        pub rows: usize,
        pub cols: usize,
    }

    /// A host transfer named `op`: `host_len == t.numel()`.
    pub fn transfer<M: DeviceMemory>(
        op: &'static str,
        t: &View<'_, M>,
        host_len: usize,
    ) -> Result<ElementwiseDims> {
        view(op, "device", t)?;
        if host_len != t.numel() {
            return Err(Error::SizeMismatch {
                op,
                what: "element count",
                a: "host",
                a_size: host_len,
                b: "device",
                b_size: t.numel(),
            });
        }
        Ok(ElementwiseDims { len: t.numel() })
    }

    /// [`super::MemoryOps::upload`].
    pub fn upload<M: DeviceMemory>(dst: &View<'_, M>, host_len: usize) -> Result<ElementwiseDims> {
        transfer("upload", dst, host_len)
    }

    /// [`super::MemoryOps::download`].
    pub fn download<M: DeviceMemory>(
        src: &View<'_, M>,
        host_len: usize,
    ) -> Result<ElementwiseDims> {
        transfer("download", src, host_len)
    }

    /// [`super::MemoryOps::upload_ids`].
    pub fn upload_ids<M: DeviceMemory>(
        dst: &View<'_, M>,
        host_len: usize,
    ) -> Result<ElementwiseDims> {
        transfer("upload_ids", dst, host_len)
    }

    /// [`super::MemoryOps::fill`].
    pub fn fill<M: DeviceMemory>(dst: &View<'_, M>) -> Result<ElementwiseDims> {
        view("fill", "dst", dst)?;
        Ok(ElementwiseDims { len: dst.numel() })
    }

    /// [`super::MemoryOps::to_bf16`] and [`super::MemoryOps::to_f32`] (named `op`):
    /// two views of one element count. They lie in buffers of different element types,
    /// so they cannot overlap.
    pub fn convert<S: DeviceMemory, D: DeviceMemory>(
        op: &'static str,
        src: &View<'_, S>,
        dst: &View<'_, D>,
    ) -> Result<ElementwiseDims> {
        view(op, "src", src)?;
        view(op, "dst", dst)?;
        if src.numel() != dst.numel() {
            return Err(Error::SizeMismatch {
                op,
                what: "element count",
                a: "src",
                a_size: src.numel(),
                b: "dst",
                b_size: dst.numel(),
            });
        }
        Ok(ElementwiseDims { len: src.numel() })
    }

    /// [`super::MemoryOps::copy`].
    pub fn copy<M: DeviceMemory>(src: &Matrix<'_, M>, dst: &Matrix<'_, M>) -> Result<CopyDims> {
        const OP: &str = "copy";
        matrix(OP, "src", src)?;
        output_matrix(OP, "dst", dst)?;
        if src.shape() != dst.shape() {
            return Err(Error::ShapeMismatch {
                op: OP,
                arg: "dst",
                expected: src.shape(),
                got: dst.shape(),
            });
        }
        disjoint(
            OP,
            &[Region::of_matrix("dst", dst)],
            &[Region::of_matrix("src", src)],
            false,
        )?;
        Ok(CopyDims {
            batch: src.batch,
            rows: src.rows,
            cols: src.cols,
        })
    }
}
