//! `CudaBackend`: context, stream, kernels and memory. Each op family of
//! `andrea_core::ops` is implemented in its sibling module `ops_<family>`, each op
//! validating with `andrea_core::check`, planning with [`crate::plan`] and launching
//! through [`launch`].

mod buffer;
mod driver;
mod launch;
mod ops_attention;
mod ops_elementwise;
mod ops_embedding;
mod ops_layernorm;
mod ops_linalg;
mod ops_loss;
mod ops_memory;
mod ops_optim;
mod ops_softmax;

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::ffi::{c_int, c_uint, c_void, CString};

use andrea_core::{Error, Result, View};
use cust::context::Context;
use cust::device::{Device, DeviceAttribute};
use cust::memory::bytemuck::Zeroable;
use cust::memory::{DeviceBuffer, DeviceCopy};
use cust::stream::{Stream, StreamFlags};
use cust::CudaFlags;

pub use buffer::{CudaBuffer, CudaIds};
use driver::{CuFunction, CuModule, CuStream};
#[doc(hidden)]
pub use launch::RawArg;

use crate::plan::attention::AttentionKernels;
use crate::plan::decode::DecodeAttention;
use crate::plan::matmul::{MatmulGpu, MatmulImpl, MatmulKernel, MmaStore, SplitK};
use crate::plan::occupancy::{KernelResources, SmLimits};
use crate::plan::reduce::SQ_MAX_PARTIALS;
use crate::precision::Precision;
use crate::ptx;

/// A loaded PTX module, unloaded on drop.
struct LoadedModule(CuModule);

impl Drop for LoadedModule {
    fn drop(&mut self) {
        // SAFETY: loaded by `load_modules`, unloaded once.
        unsafe { driver::cuModuleUnload(self.0) };
    }
}

/// andrea's [`andrea_core::Backend`] on one NVIDIA GPU.
///
/// Ops are queued in order on one stream; [`andrea_core::MemoryOps::download`],
/// [`andrea_core::OptimOps::sum_squares`] and [`andrea_core::MemoryOps::synchronize`] wait
/// for it. Set `ANDREA_CUDA_SYNC=1` to synchronise after every launch, so that a fault
/// is reported by the kernel that caused it. `ANDREA_CUDA_SPLIT_K=0|auto|N` (default
/// `auto`) says whether products whose grid cannot fill the GPU split K into slices
/// summed in a fixed order (`plan::matmul::split_count`). `ANDREA_CUDA_FUSED_GELU_BACKWARD=0`
/// (default 1) runs `matmul_gelu_backward` as the product then the separate
/// `gelu_backward` pass, to compare with the fused epilogue on one GPU.
/// `ANDREA_CUDA_ATTENTION=auto|simt|mma` (default `auto`: tensor cores unless the precision
/// is FP32) picks the attention kernels ([`AttentionKernels`]); `ANDREA_CUDA_DECODE=split|off`
/// (default `split`) whether generation's few-row steps run the split-KV decode kernels
/// ([`DecodeAttention`]). `ANDREA_CUDA_MMA_STORE=staged|direct`
/// (default `staged`) says how the mma matmul kernels store their output tile
/// ([`MmaStore`]). The backend is used from one thread (it
/// holds driver handles); its buffers are `Send`.
pub struct CudaBackend {
    precision: Precision,
    device_name: String,
    compute_capability: (i32, i32),
    /// Multiprocessors, for the decode attention's split.
    sms: usize,
    /// The multiprocessors and each matmul kernel's resident blocks per SM, from the
    /// device's limits and the kernels' registers and shared memory: the products' tile
    /// and split-K decisions.
    matmul_gpu: MatmulGpu,
    /// `ANDREA_CUDA_SPLIT_K` (default `auto`), or [`CudaBackend::set_split_k`].
    split_k: SplitK,
    /// A planted fault for the split-K tests: the reduce skips the last slice.
    split_k_fault: bool,
    /// `matmul_gelu_backward` as product + separate `gelu_backward`
    /// (`ANDREA_CUDA_FUSED_GELU_BACKWARD=0`, [`CudaBackend::set_fused_gelu_backward`]).
    unfused_gelu_backward: bool,
    /// A planted fault for the fused GELU backward's tests: GELU' of the next element.
    gelu_backward_fault: bool,
    /// `ANDREA_CUDA_ATTENTION` (default `auto`), or [`CudaBackend::set_attention_kernels`].
    attention_kernels: AttentionKernels,
    /// A planted fault for the attention tests: the tensor-core forward's causal mask
    /// lets each query see one key too many.
    attention_fault: bool,
    /// `ANDREA_CUDA_DECODE` (default `split`), or [`CudaBackend::set_decode_attention`].
    decode: DecodeAttention,
    /// A planted fault for the decode tests (0: none; kernels/attention_decode.cu).
    decode_fault: u8,
    /// `ANDREA_CUDA_MATMUL` (default `bf16`), or [`CudaBackend::set_matmul_impl`].
    matmul_impl: MatmulImpl,
    /// `ANDREA_CUDA_MMA_STORE` (default `staged`), or [`CudaBackend::set_mma_store`].
    mma_store: MmaStore,
    /// A planted fault for the mma kernels' tests (0: none).
    mma_fault: u8,
    gemm_fault: u8,
    sync_each_launch: bool,
    functions: HashMap<&'static str, CuFunction>,
    /// How each kernel module was loaded.
    loads: Vec<ModuleLoad>,
    /// Column-sum partials; grows to the largest need, then is reused.
    scratch: RefCell<Option<DeviceBuffer<f32>>>,
    /// Sorted token positions for the embedding backward.
    id_scratch: RefCell<Option<DeviceBuffer<u32>>>,
    /// Their page-locked host staging, so the upload is asynchronous (as `upload_ids`'s),
    /// and the synchronisation count when its last copy was queued: it is rewritten only
    /// after a later wait.
    id_staging: RefCell<Option<cust::memory::LockedBuffer<u32>>>,
    id_staged_at: Cell<Option<u64>>,
    sq_partials: DeviceBuffer<f64>,
    sq_total: DeviceBuffer<f64>,
    /// Stream synchronisations so far: a pinned staging buffer whose copy was queued at
    /// an earlier count has been read by the device and may be rewritten.
    syncs: Cell<u64>,
    // Dropped in declaration order: modules and the stream before the context.
    _modules: Vec<LoadedModule>,
    stream: Stream,
    context: Context,
}

impl CudaBackend {
    /// The backend on GPU 0 in the default precision ([`Precision::FAST`]).
    pub fn new() -> Result<Self> {
        Self::with_precision(Precision::default())
    }

    /// The backend on GPU 0 in `precision`.
    pub fn with_precision(precision: Precision) -> Result<Self> {
        Self::on_device(0, precision)
    }

    /// The backend on GPU `ordinal`. Errors: [`Error::NoDevice`] when there is no GPU or
    /// driver, a driver too old for the PTX, a GPU older than compute capability 8.0.
    pub fn on_device(ordinal: u32, precision: Precision) -> Result<Self> {
        let name = "CUDA";
        cust::init(CudaFlags::empty()).map_err(|e| driver::from_cust(e, "cuInit", name, None))?;
        let mut version = 0;
        // SAFETY: writes one int.
        driver::check(unsafe { driver::cuDriverGetVersion(&mut version) }, || {
            "cuDriverGetVersion".into()
        })?;
        if version < driver::MIN_DRIVER_VERSION {
            return Err(driver::driver_too_old(version));
        }
        let count = Device::num_devices()
            .map_err(|e| driver::from_cust(e, "cuDeviceGetCount", name, None))?;
        if ordinal >= count {
            return Err(driver::no_device(&format!(
                "GPU {ordinal} requested, {count} present"
            )));
        }
        let device = Device::get_device(ordinal)
            .map_err(|e| driver::from_cust(e, "cuDeviceGet", name, None))?;
        let device_name = device.name().unwrap_or_else(|_| format!("GPU {ordinal}"));
        let attr = |a| {
            device
                .get_attribute(a)
                .map_err(|e| driver::from_cust(e, "cuDeviceGetAttribute", &device_name, None))
        };
        let cc = (
            attr(DeviceAttribute::ComputeCapabilityMajor)?,
            attr(DeviceAttribute::ComputeCapabilityMinor)?,
        );
        if cc.0 < 8 {
            return Err(Error::Device {
                context: format!("CUDA device {device_name}"),
                message: format!(
                    "compute capability {}.{}: andrea's kernels need 8.0 (Ampere) or newer",
                    cc.0, cc.1
                ),
            });
        }
        let sm = sm_limits(device.as_raw(), &device_name)?;
        let sms = sm.sms;
        let split_k = match std::env::var("ANDREA_CUDA_SPLIT_K") {
            Ok(v) => SplitK::parse(&v)?,
            Err(_) => SplitK::Auto,
        };
        let attention_kernels = match std::env::var("ANDREA_CUDA_ATTENTION") {
            Ok(v) => AttentionKernels::parse(&v)?,
            Err(_) => AttentionKernels::Auto,
        };
        let decode = match std::env::var("ANDREA_CUDA_DECODE") {
            Ok(v) => DecodeAttention::parse(&v)?,
            Err(_) => DecodeAttention::Split,
        };
        let matmul_impl = match std::env::var("ANDREA_CUDA_MATMUL") {
            Ok(v) => MatmulImpl::parse(&v)?,
            Err(_) => MatmulImpl::Bf16,
        };
        let mma_store = match std::env::var("ANDREA_CUDA_MMA_STORE") {
            Ok(v) => MmaStore::parse(&v)?,
            Err(_) => MmaStore::Staged,
        };
        let context = Context::new(device)
            .map_err(|e| driver::from_cust(e, "creating the CUDA context", &device_name, None))?;
        // cust 0.3 always makes a blocking stream (ordered with the legacy default stream),
        // which is what `alloc_zeroed`'s legacy-stream memset relies on.
        let stream = Stream::new(StreamFlags::DEFAULT, None)
            .map_err(|e| driver::from_cust(e, "creating the CUDA stream", &device_name, None))?;
        let (modules, functions, loads) = load_modules(version)?;
        opt_in_shared_memory(&functions)?;
        let matmul_gpu = matmul_gpu(&sm, &functions)?;
        let sq = |n| alloc_zeroed::<f64>(n, &device_name);
        Ok(CudaBackend {
            precision,
            compute_capability: cc,
            sms,
            matmul_gpu,
            split_k,
            split_k_fault: false,
            unfused_gelu_backward: std::env::var_os("ANDREA_CUDA_FUSED_GELU_BACKWARD")
                .is_some_and(|v| v == "0"),
            gelu_backward_fault: false,
            attention_kernels,
            attention_fault: false,
            decode,
            decode_fault: 0,
            matmul_impl,
            mma_store,
            mma_fault: 0,
            gemm_fault: 0,
            sync_each_launch: std::env::var_os("ANDREA_CUDA_SYNC").is_some_and(|v| v != "0"),
            functions,
            scratch: RefCell::new(None),
            id_scratch: RefCell::new(None),
            id_staging: RefCell::new(None),
            id_staged_at: Cell::new(None),
            sq_partials: sq(SQ_MAX_PARTIALS)?,
            sq_total: sq(1)?,
            syncs: Cell::new(0),
            _modules: modules,
            loads,
            stream,
            context,
            device_name,
        })
    }

    /// How each kernel module was loaded (embedded machine code or JIT-compiled PTX) and
    /// the driver's time for it.
    pub fn module_loads(&self) -> &[ModuleLoad] {
        &self.loads
    }

    /// The arithmetic in use.
    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// Whether products split K (see [`SplitK`]); the default comes from
    /// `ANDREA_CUDA_SPLIT_K=0|auto|N`.
    pub fn split_k(&self) -> SplitK {
        self.split_k
    }

    /// Sets the split-K policy, e.g. to compare split and unsplit products on one GPU.
    pub fn set_split_k(&mut self, split_k: SplitK) {
        self.split_k = split_k;
    }

    /// Whether `matmul_gelu_backward` applies GELU' in the product's epilogue (the
    /// default) or runs the product and then the separate `gelu_backward` pass; the
    /// default comes from `ANDREA_CUDA_FUSED_GELU_BACKWARD=0|1`.
    pub fn set_fused_gelu_backward(&mut self, fused: bool) {
        self.unfused_gelu_backward = !fused;
    }

    /// Whether `matmul_gelu_backward` is fused (see [`CudaBackend::set_fused_gelu_backward`]).
    pub fn fused_gelu_backward(&self) -> bool {
        !self.unfused_gelu_backward
    }

    /// Tests only: makes the fused GELU backward's epilogue read `pre` one element late
    /// (an indexing slip), to show that its tests catch it. `pre` needs one float of room
    /// after it.
    #[doc(hidden)]
    pub fn plant_gelu_backward_fault(&mut self, on: bool) {
        self.gelu_backward_fault = on;
    }

    /// Which attention kernels run ([`AttentionKernels`]); the default comes from
    /// `ANDREA_CUDA_ATTENTION=auto|simt|mma`.
    pub fn attention_kernels(&self) -> AttentionKernels {
        self.attention_kernels
    }

    /// Forces the SIMT or the tensor-core attention kernels (or `Auto`: by the
    /// precision), e.g. to compare both on one GPU.
    pub fn set_attention_kernels(&mut self, kernels: AttentionKernels) {
        self.attention_kernels = kernels;
    }

    /// Tests only: shifts the tensor-core forward's causal mask by one key (query t sees
    /// key t + 1), to show that the attention tests catch it.
    #[doc(hidden)]
    pub fn plant_attention_fault(&mut self, on: bool) {
        self.attention_fault = on;
    }

    /// Whether generation's few-row attention runs the split-KV kernels
    /// (kernels/attention_decode.cu); the default comes from `ANDREA_CUDA_DECODE=split|off`.
    pub fn decode_attention(&self) -> DecodeAttention {
        self.decode
    }

    /// Switches the split-KV decode kernels on or off, e.g. to compare both on one GPU.
    pub fn set_decode_attention(&mut self, decode: DecodeAttention) {
        self.decode = decode;
    }

    /// Tests only: plants a fault in the split-KV decode kernels (1: each chunk reads one
    /// key past its end; 2: the combine drops the last chunk; 0: none).
    #[doc(hidden)]
    pub fn plant_decode_fault(&mut self, fault: u8) {
        self.decode_fault = fault;
    }

    /// Tests only: makes the split-K reduce skip the last slice, to show that the split-K
    /// tests catch it.
    #[doc(hidden)]
    pub fn plant_split_k_fault(&mut self, on: bool) {
        self.split_k_fault = on;
    }

    /// Which tensor-core matmul kernels TF32 and BF16 products use; the default comes
    /// from `ANDREA_CUDA_MATMUL=bf16|wmma|mma|mma128x128|mma128x64|mma64x64` (default
    /// `bf16`).
    pub fn matmul_impl(&self) -> MatmulImpl {
        self.matmul_impl
    }

    /// Sets the tensor-core matmul kernels, e.g. to compare WMMA and mma on one GPU.
    pub fn set_matmul_impl(&mut self, imp: MatmulImpl) {
        self.matmul_impl = imp;
    }

    /// How the mma kernels store their output tile ([`MmaStore`]); the default comes from
    /// `ANDREA_CUDA_MMA_STORE=staged|direct` (default `staged`).
    pub fn mma_store(&self) -> MmaStore {
        self.mma_store
    }

    /// Sets how the mma kernels store their output tile, e.g. to compare both on one GPU.
    pub fn set_mma_store(&mut self, store: MmaStore) {
        self.mma_store = store;
    }

    /// Tests only: plants a fault in the mma kernels (1: the fragment reads ignore the
    /// shared-memory swizzle; 2: the pipeline reads a stage before its copies land; 3:
    /// the staged store reads each row from the row below; 4: no barrier before the
    /// staging writes reuse the pipeline's shared memory; 5: no barrier between the
    /// staging writes and the staged reads; 0: none), to show that the mma tests catch
    /// it (kernels/matmul_mma.cu).
    #[doc(hidden)]
    pub fn plant_mma_fault(&mut self, fault: u8) {
        self.mma_fault = fault;
    }

    /// Tests only: plants a fault in kernels/matmul_bf16.cu, compiled only into the
    /// emulator's build of it (1: the fragment reads ignore the shared-memory swizzle; 2:
    /// the pipeline reads a stage before its copies land; 3: the `.trans` fragment reads
    /// take the next row of each 8 × 8 block; 0: none), to show that the tests catch it.
    #[doc(hidden)]
    pub fn plant_gemm_fault(&mut self, fault: u8) {
        self.gemm_fault = fault;
    }

    /// Multiprocessors on the GPU.
    pub fn multiprocessors(&self) -> usize {
        self.sms
    }

    /// How products are planned here: the multiprocessors and how many blocks of each
    /// matmul kernel one holds ([`MatmulGpu`]).
    pub fn matmul_gpu(&self) -> &MatmulGpu {
        &self.matmul_gpu
    }

    /// Tests only: plans products (the tile and split-K decisions) and the decode split
    /// as on an H200-class GPU ([`SmLimits::H200`]) of `sms` multiprocessors running this
    /// device's kernels, e.g. an H200's 132 on the emulator's one.
    #[doc(hidden)]
    pub fn plan_for_multiprocessors(&mut self, sms: usize) {
        self.sms = sms.max(1);
        let limits = SmLimits {
            sms: self.sms,
            ..SmLimits::H200
        };
        self.matmul_gpu = match matmul_gpu(&limits, &self.functions) {
            Ok(g) => g,
            Err(_) => self.matmul_gpu.clone().with_sms(sms),
        };
    }

    /// The GPU's name, as the driver reports it.
    pub fn device_name(&self) -> &str {
        &self.device_name
    }

    /// `(major, minor)` compute capability.
    pub fn compute_capability(&self) -> (i32, i32) {
        self.compute_capability
    }

    /// Makes the backend's context current on the calling thread.
    fn bind(&self) -> Result<()> {
        // SAFETY: the context lives as long as `self`.
        let code = unsafe { driver::cuCtxSetCurrent(self.context.as_raw() as driver::CuContext) };
        driver::check(code, || "making the CUDA context current".into())
    }

    fn raw_stream(&self) -> CuStream {
        self.stream.as_inner() as CuStream
    }

    fn sync(&self, what: &str) -> Result<()> {
        self.bind()?;
        // SAFETY: the backend's own stream.
        let code = unsafe { driver::cuStreamSynchronize(self.raw_stream()) };
        self.syncs.set(self.syncs.get() + 1);
        driver::check(code, || {
            format!("{what} (waiting for the GPU; an earlier kernel may have failed, ANDREA_CUDA_SYNC=1 names it)")
        })
    }

    fn alloc_buffer<T: DeviceCopy + Zeroable>(&self, len: usize) -> Result<DeviceBuffer<T>> {
        self.bind()?;
        let b = alloc_zeroed::<T>(len, &self.device_name)?;
        Ok(b)
    }

    /// Queues `dst[..] = src` (host to device). The driver stages pageable host memory
    /// before returning, so `src` may be reused at once.
    fn copy_to_device<T: Copy>(
        &self,
        dst: driver::CuDevicePtr,
        src: &[T],
        what: &str,
    ) -> Result<()> {
        if src.is_empty() {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: `dst` has room for `src` (the caller checked the view).
        let code = unsafe {
            driver::cuMemcpyHtoDAsync_v2(
                dst,
                src.as_ptr() as *const c_void,
                std::mem::size_of_val(src),
                self.raw_stream(),
            )
        };
        driver::check(code, || what.to_string())
    }

    /// `dst = src` (device to host), after the queued work.
    fn copy_to_host<T: Copy>(
        &self,
        dst: &mut [T],
        src: driver::CuDevicePtr,
        what: &str,
    ) -> Result<()> {
        if dst.is_empty() {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: `src` holds `dst.len()` elements (the caller checked the view); the
        // stream is synchronised before `dst` is read.
        let code = unsafe {
            driver::cuMemcpyDtoHAsync_v2(
                dst.as_mut_ptr() as *mut c_void,
                src,
                std::mem::size_of_val(dst),
                self.raw_stream(),
            )
        };
        driver::check(code, || what.to_string())?;
        self.sync(what)
    }

    /// `n` 32-bit words at `dst` set to `bits`.
    fn memset32(&self, dst: driver::CuDevicePtr, bits: u32, n: usize, what: &str) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: `dst` holds `n` words (the caller checked the view).
        let code = unsafe { driver::cuMemsetD32Async(dst, bits, n, self.raw_stream()) };
        driver::check(code, || what.to_string())
    }

    /// The scratch buffer, at least `len` floats: `(base address)`.
    fn scratch(&self, len: usize) -> Result<driver::CuDevicePtr> {
        let mut s = self.scratch.borrow_mut();
        if s.as_ref().is_none_or(|b| b.len() < len) {
            *s = None;
            *s = Some(self.alloc_buffer::<f32>(len.max(1))?);
        }
        Ok(s.as_ref().map(|b| b.as_device_ptr().as_raw()).unwrap_or(0))
    }

    /// The id scratch buffer holding `data`, uploaded on the stream asynchronously from
    /// page-locked staging (allocated once, grown when too small). Like `upload_ids`, it
    /// waits for the device only when the staging's last copy was queued since the last
    /// wait; in a training step `upload_ids` has already waited by then.
    fn id_scratch_with(&self, data: &[u32]) -> Result<driver::CuDevicePtr> {
        const WHAT: &str = "embedding_backward: uploading the sorted token positions";
        if self.id_staged_at.get() == Some(self.syncs.get()) {
            // The last staged copy may still be reading the staging.
            self.sync(WHAT)?;
        }
        let mut s = self.id_scratch.borrow_mut();
        if s.as_ref().is_none_or(|b| b.len() < data.len()) {
            *s = None;
            *s = Some(self.alloc_buffer::<u32>(data.len().max(1))?);
        }
        let base = s.as_ref().map(|b| b.as_device_ptr().as_raw()).unwrap_or(0);
        let mut staging = self.id_staging.borrow_mut();
        if staging.as_ref().is_none_or(|b| b.len() < data.len()) {
            *staging = None;
            self.bind()?;
            let len = data.len().max(1);
            let b = cust::memory::LockedBuffer::new(&0u32, len).map_err(|e| {
                driver::from_cust(
                    e,
                    "allocating page-locked host memory for the embedding backward's positions",
                    &self.device_name,
                    Some(len * 4),
                )
            })?;
            *staging = Some(b);
        }
        let Some(staging) = staging.as_mut() else {
            return Ok(base);
        };
        let staged = &mut staging[..data.len()];
        staged.copy_from_slice(data);
        self.copy_to_device(base, staged, WHAT)?;
        self.id_staged_at.set(Some(self.syncs.get()));
        Ok(base)
    }

    fn view_ptr<M: buffer::DeviceBase>(v: &View<'_, M>) -> driver::CuDevicePtr {
        buffer::ptr(v)
    }
}

/// A zeroed device buffer of `len` elements (`cuMemAlloc` + a memset on the legacy
/// default stream, which the backend's blocking stream is ordered after).
fn alloc_zeroed<T: DeviceCopy + Zeroable>(len: usize, device: &str) -> Result<DeviceBuffer<T>> {
    let bytes = len.saturating_mul(std::mem::size_of::<T>());
    if len == 0 {
        // No allocation (a null pointer that no op dereferences: every view is empty).
        // SAFETY: zero elements; nothing is uninitialised.
        return unsafe { DeviceBuffer::uninitialized(0) }
            .map_err(|e| driver::from_cust(e, "allocating device memory", device, Some(0)));
    }
    DeviceBuffer::zeroed(len)
        .map_err(|e| driver::from_cust(e, "allocating device memory", device, Some(bytes)))
}

type Loaded = (
    Vec<LoadedModule>,
    HashMap<&'static str, CuFunction>,
    Vec<ModuleLoad>,
);

/// How one kernel module was loaded: from embedded machine code (no JIT) or from PTX
/// that the driver compiled for this GPU, and how long that took.
#[derive(Debug, Clone, PartialEq)]
pub struct ModuleLoad {
    pub module: &'static str,
    /// `"fatbin"` (embedded sm_80/sm_90 machine code, see [`ptx::fatbin`]) or `"ptx"`.
    pub image: &'static str,
    /// The driver's own wall time for the load (`CU_JIT_WALL_TIME`), in milliseconds.
    pub millis: f32,
}

// `CUjit_option` values (cuda.h).
const CU_JIT_WALL_TIME: c_int = 2;
const CU_JIT_INFO_LOG_BUFFER: c_int = 3;
const CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES: c_int = 4;
const CU_JIT_ERROR_LOG_BUFFER: c_int = 5;
const CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES: c_int = 6;
const JIT_LOG_BYTES: usize = 16 * 1024;

/// The text the driver wrote into a log buffer (NUL-terminated, possibly empty).
fn log_text(buf: &[u8]) -> String {
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).trim().to_string()
}

/// Lets the kernels that need more than 48 KiB of dynamic shared memory (the mma
/// matmuls, plan::matmul::mma_smem) have it (CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES).
/// The device's multiprocessor limits (`cuDeviceGetAttribute`), for [`MatmulGpu`].
fn sm_limits(device: c_int, device_name: &str) -> Result<SmLimits> {
    let attr = |attrib: c_int, what: &str| {
        driver_int(
            // SAFETY: writes one int; `device` is a device the driver handed out.
            |v| unsafe { driver::cuDeviceGetAttribute(v, attrib, device) },
            || format!("cuDeviceGetAttribute({what}) on {device_name}"),
        )
    };
    Ok(SmLimits {
        sms: attr(16, "multiprocessors")?.max(1),
        registers: attr(82, "registers per multiprocessor")?,
        shared_memory: attr(81, "shared memory per multiprocessor")?,
        reserved_shared_memory: attr(111, "shared memory reserved per block")?,
        threads: attr(39, "threads per multiprocessor")?,
        blocks: attr(106, "blocks per multiprocessor")?,
    })
}

/// How many blocks of each matmul kernel an SM holds: its registers per thread and
/// static shared memory as the driver loaded it (`cuFuncGetAttribute`) against `sm`.
fn matmul_gpu(sm: &SmLimits, functions: &HashMap<&'static str, CuFunction>) -> Result<MatmulGpu> {
    const SHARED_SIZE_BYTES: c_int = 1;
    const NUM_REGS: c_int = 4;
    let mut resources = HashMap::new();
    for kernel in MatmulKernel::all() {
        let name = kernel.name();
        let Some(&f) = functions.get(name) else {
            continue;
        };
        let attr = |attrib: c_int, what: &str| {
            driver_int(
                // SAFETY: writes one int; `f` is a kernel of a loaded module.
                |v| unsafe { driver::cuFuncGetAttribute(v, attrib, f) },
                || format!("cuFuncGetAttribute({what}) of kernel `{name}`"),
            )
        };
        let r = KernelResources {
            registers: attr(NUM_REGS, "registers")?,
            static_smem: attr(SHARED_SIZE_BYTES, "static shared memory")?,
        };
        resources.insert(name, r);
    }
    Ok(MatmulGpu::new(sm, |name| {
        resources.get(name).copied().unwrap_or_default()
    }))
}

/// The int a driver query writes through `call`'s pointer, checked (`what` names the
/// query in the error); a negative value reads as 0.
fn driver_int(
    call: impl FnOnce(*mut c_int) -> i32,
    what: impl FnOnce() -> String,
) -> Result<usize> {
    let mut v: c_int = 0;
    driver::check(call(&mut v), what)?;
    Ok(v.max(0) as usize)
}

fn opt_in_shared_memory(functions: &HashMap<&'static str, CuFunction>) -> Result<()> {
    const MAX_DYNAMIC_SHARED_SIZE_BYTES: c_int = 8;
    for kernel in MatmulKernel::all() {
        let bytes = kernel.smem();
        if bytes <= 48 * 1024 {
            continue;
        }
        for name in MmaStore::ALL.map(|s| kernel.launch_name(s)) {
            if let Some(&f) = functions.get(name) {
                // SAFETY: `f` is a kernel of a loaded module.
                let code = unsafe {
                    driver::cuFuncSetAttribute(f, MAX_DYNAMIC_SHARED_SIZE_BYTES, bytes as c_int)
                };
                driver::check(code, || {
                    format!("allowing kernel `{name}` {bytes} B of dynamic shared memory")
                })?;
            }
        }
    }
    Ok(())
}

/// Loads every kernel module and looks up its kernels: the embedded fatbin where this
/// build has one (the driver picks the machine code for this GPU, or JIT-compiles the
/// PTX inside it for a newer one), else the PTX text. The driver's error log is passed
/// back in the error, so a JIT failure says why.
fn load_modules(driver_version: i32) -> Result<Loaded> {
    let mut modules = Vec::new();
    let mut functions = HashMap::new();
    let mut loads = Vec::new();
    for m in ptx::MODULES {
        // The image, 8-byte aligned (a fatbin is read as a header struct); PTX text is
        // NUL-terminated.
        let (image_kind, bytes): (&'static str, Vec<u8>) =
            match ptx::fatbin(m.name).map_err(|message| Error::Device {
                context: format!("loading kernel module `{}`", m.name),
                message,
            })? {
                Some(fb) => ("fatbin", fb.to_vec()),
                None => {
                    let src = CString::new(m.source).map_err(|_| Error::Device {
                        context: format!("loading PTX module `{}`", m.name),
                        message: "the PTX text contains a NUL byte".into(),
                    })?;
                    ("ptx", src.into_bytes_with_nul())
                }
            };
        let mut image = vec![0u64; bytes.len().div_ceil(8)];
        // SAFETY: `image` holds at least `bytes.len()` bytes; u64 has no invalid bits.
        unsafe {
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                image.as_mut_ptr().cast::<u8>(),
                bytes.len(),
            )
        };
        let mut info_log = vec![0u8; JIT_LOG_BYTES];
        let mut error_log = vec![0u8; JIT_LOG_BYTES];
        let mut options = [
            CU_JIT_WALL_TIME,
            CU_JIT_INFO_LOG_BUFFER,
            CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
            CU_JIT_ERROR_LOG_BUFFER,
            CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
        ];
        // Option values travel in pointer-sized slots: sizes as integers, the wall time
        // comes back as an f32 in the low bytes of its slot.
        let mut values: [*mut c_void; 5] = [
            std::ptr::null_mut(),
            info_log.as_mut_ptr().cast(),
            JIT_LOG_BYTES as *mut c_void,
            error_log.as_mut_ptr().cast(),
            JIT_LOG_BYTES as *mut c_void,
        ];
        let mut module: CuModule = std::ptr::null_mut();
        // SAFETY: `image` is a fatbin or NUL-terminated PTX; the log buffers outlive the
        // call and their sizes are the ones passed.
        let code = unsafe {
            driver::cuModuleLoadDataEx(
                &mut module,
                image.as_ptr() as *const c_void,
                options.len() as c_uint,
                options.as_mut_ptr(),
                values.as_mut_ptr(),
            )
        };
        let why = || {
            let log = log_text(&error_log);
            if log.is_empty() {
                String::new()
            } else {
                format!("; the driver's JIT log: {log}")
            }
        };
        match code {
            driver::CUDA_SUCCESS => {}
            driver::CUDA_ERROR_UNSUPPORTED_PTX_VERSION
            | driver::CUDA_ERROR_INVALID_PTX
            | driver::CUDA_ERROR_NO_BINARY_FOR_GPU => {
                let mut e = driver::driver_too_old(driver_version);
                if let Error::Device { context, message } = &mut e {
                    context.push_str(&format!(" (module `{}`, {image_kind})", m.name));
                    message.push_str(&format!(" [{}]{}", driver::describe(code), why()));
                }
                return Err(e);
            }
            driver::CUDA_ERROR_OUT_OF_MEMORY => {
                return Err(Error::OutOfMemory {
                    device: "CUDA".into(),
                    bytes: bytes.len(),
                })
            }
            _ => {
                let extra = why();
                driver::check(code, || {
                    format!("loading kernel module `{}` ({image_kind}){extra}", m.name)
                })?
            }
        }
        // The wall time (f32) sits in the first 4 bytes of its slot.
        let millis = f32::from_bits(values[0] as usize as u32);
        loads.push(ModuleLoad {
            module: m.name,
            image: image_kind,
            millis: if millis.is_finite() { millis } else { 0.0 },
        });
        modules.push(LoadedModule(module));
        for entry in ptx::entries(m) {
            let cname = CString::new(entry).unwrap_or_default();
            let mut f: CuFunction = std::ptr::null_mut();
            // SAFETY: `module` was loaded above; `cname` is NUL-terminated.
            let code = unsafe { driver::cuModuleGetFunction(&mut f, module, cname.as_ptr()) };
            driver::check(code, || {
                format!("finding kernel `{entry}` in module `{}`", m.name)
            })?;
            functions.insert(entry, f);
        }
    }
    Ok((modules, functions, loads))
}
