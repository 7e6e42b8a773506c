//! Device memory as the backend's buffer types.

use std::cell::{Cell, RefCell};

use andrea_core::{DeviceMemory, View};
use cust::memory::{DeviceBuffer, DeviceCopy, LockedBuffer};

use super::driver::CuDevicePtr;

/// `f32` elements in device memory (a cust `DeviceBuffer`, freed on drop).
pub struct CudaBuffer {
    pub(crate) buf: DeviceBuffer<f32>,
}

/// `u32` token ids in device memory, with a host copy.
///
/// No kernel writes ids, so the copy made by `upload_ids` is always exact: ops check id
/// values and sort positions for the deterministic embedding backward on the host,
/// without reading the device back.
///
/// `upload_ids` copies through `staging`, page-locked host memory allocated once, so the
/// host-to-device copy is truly asynchronous on the backend's stream (from pageable
/// memory the driver may wait). `staged_at` is the backend's synchronisation count when
/// the last such copy was queued: `staging` is rewritten only after a later wait (the
/// one that reads a step's loss, in training), else `upload_ids` waits first.
pub struct CudaIds {
    pub(crate) buf: DeviceBuffer<u32>,
    pub(crate) host: RefCell<Vec<u32>>,
    pub(crate) staging: RefCell<LockedBuffer<u32>>,
    pub(crate) staged_at: Cell<Option<u64>>,
}

/// `bf16` elements in device memory, as their 16 bits.
pub struct CudaBf16 {
    pub(crate) buf: DeviceBuffer<u16>,
}

impl DeviceMemory for CudaBf16 {
    fn len(&self) -> usize {
        self.buf.len()
    }
}

impl DeviceMemory for CudaBuffer {
    fn len(&self) -> usize {
        self.buf.len()
    }
}

impl DeviceMemory for CudaIds {
    fn len(&self) -> usize {
        self.buf.len()
    }
}

fn base<T: DeviceCopy>(b: &DeviceBuffer<T>) -> CuDevicePtr {
    b.as_device_ptr().as_raw()
}

/// Device address of a buffer's element 0, and the size of its elements.
pub(crate) trait DeviceBase {
    /// Bytes per element.
    const ELEMENT_BYTES: u64 = 4;
    fn base(&self) -> CuDevicePtr;
}

impl DeviceBase for CudaBuffer {
    fn base(&self) -> CuDevicePtr {
        base(&self.buf)
    }
}

impl DeviceBase for CudaIds {
    fn base(&self) -> CuDevicePtr {
        base(&self.buf)
    }
}

impl DeviceBase for CudaBf16 {
    const ELEMENT_BYTES: u64 = 2;
    fn base(&self) -> CuDevicePtr {
        base(&self.buf)
    }
}

/// Device address of element `offset` of `buf`.
pub(crate) fn addr<M: DeviceBase>(buf: &M, offset: usize) -> CuDevicePtr {
    buf.base() + M::ELEMENT_BYTES * offset as u64
}

/// Device address of a view's first element.
pub(crate) fn ptr<M: DeviceBase>(v: &View<'_, M>) -> CuDevicePtr {
    addr(v.buf, v.offset)
}
