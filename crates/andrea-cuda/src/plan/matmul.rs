//! Matmul planning (kernels/matmul.cu): which kernel, the grid (split into launches of
//! at most 65 535 batch entries), how each operand's tiles are staged, and whether K is
//! split into slices summed by a second kernel (split-K).

use super::occupancy::{resident_blocks, KernelResources, SmLimits};
use super::{grid, int, Launch};
use crate::precision::MatmulPrecision;
use andrea_core::Result;

/// The tile of a `matmul_mma_*` kernel (kernels/matmul_mma.cu).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MmaTile {
    T128x128,
    T128x64,
    T64x64,
}

impl MmaTile {
    pub const ALL: [MmaTile; 3] = [MmaTile::T128x128, MmaTile::T128x64, MmaTile::T64x64];

    /// Output tile `(rows, columns)` of one block.
    pub fn dims(self) -> (usize, usize) {
        match self {
            MmaTile::T128x128 => (128, 128),
            MmaTile::T128x64 => (128, 64),
            MmaTile::T64x64 => (64, 64),
        }
    }

    /// Threads per block: 8 warps as 2 × 4 for 128x128, 4 warps as 2 × 2 otherwise.
    pub fn threads(self) -> u32 {
        match self {
            MmaTile::T128x128 => 256,
            _ => 128,
        }
    }

    /// Relative throughput per SM: the kernels are bound by shared-memory reads, which
    /// per FLOP scale with `(wm + wn) / (wm·wn)` of the warp tile: 64 × 32 for 128x128
    /// and 128x64, 32 × 32 (4/3 the bytes per FLOP) for 64x64.
    pub fn efficiency(self) -> f64 {
        match self {
            MmaTile::T64x64 => 0.75,
            _ => 1.0,
        }
    }

    /// The suffix of the kernel names and of `ANDREA_CUDA_MATMUL=mma<tile>`.
    pub fn label(self) -> &'static str {
        match self {
            MmaTile::T128x128 => "128x128",
            MmaTile::T128x64 => "128x64",
            MmaTile::T64x64 => "64x64",
        }
    }
}

/// Which tensor-core kernels products use in a TF32 or BF16 precision
/// (`ANDREA_CUDA_MATMUL`): the WMMA kernels of kernels/matmul.cu, the mma.sync
/// kernels of kernels/matmul_mma.cu with the tile the plan picks ([`mma_tile`]) or a
/// fixed one (to compare tiles on one GPU, and for tests), or (`Bf16`, the default) the
/// BF16-operand kernels of kernels/matmul_bf16.cu for BF16 products whose operands they
/// take ([`gemm_layout`]; the others, and TF32 products, run `Mma`). FP32 products use
/// matmul_simt either way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatmulImpl {
    Wmma,
    Mma,
    MmaFixed(MmaTile),
    Bf16,
}

impl MatmulImpl {
    /// `bf16` (the default), `wmma`, `mma` or `mma128x128` / `mma128x64` / `mma64x64`.
    pub fn parse(s: &str) -> Result<MatmulImpl> {
        match s.trim() {
            "wmma" => Ok(MatmulImpl::Wmma),
            "mma" => Ok(MatmulImpl::Mma),
            "bf16" | "" => Ok(MatmulImpl::Bf16),
            t => MmaTile::ALL
                .into_iter()
                .find(|x| t.strip_prefix("mma") == Some(x.label()))
                .map(MatmulImpl::MmaFixed)
                .ok_or_else(|| {
                    andrea_core::Error::invalid(
                        "ANDREA_CUDA_MATMUL",
                        format!(
                            "`{s}`: expected bf16, wmma, mma, mma128x128, mma128x64 or mma64x64"
                        ),
                    )
                }),
        }
    }
}

/// How a `matmul_mma_*` kernel writes its output tile (kernels/matmul_mma.cu,
/// `ANDREA_CUDA_MMA_STORE`): staged through the pipeline's shared memory and stored as
/// 16-byte row groups, the epilogue applied in that pass (the default), or each lane's
/// accumulator fragments stored element by element (`_direct`, the first version, kept
/// so one GPU run compares both). Both give the same bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MmaStore {
    Staged,
    Direct,
}

impl MmaStore {
    pub const ALL: [MmaStore; 2] = [MmaStore::Staged, MmaStore::Direct];

    /// `staged` (the default) or `direct`.
    pub fn parse(s: &str) -> Result<MmaStore> {
        match s.trim() {
            "staged" | "" => Ok(MmaStore::Staged),
            "direct" => Ok(MmaStore::Direct),
            _ => Err(andrea_core::Error::invalid(
                "ANDREA_CUDA_MMA_STORE",
                format!("`{s}`: expected staged or direct"),
            )),
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            MmaStore::Staged => "staged",
            MmaStore::Direct => "direct",
        }
    }
}

/// The kernel family of one product.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatmulKernel {
    Simt,
    TensorTf32,
    TensorBf16,
    MmaTf32(MmaTile),
    MmaBf16(MmaTile),
    /// kernels/matmul_bf16.cu: BF16 operands in memory, 128 × 128 tiles.
    Bf16(GemmLayout),
}

/// Which dimension of each operand is contiguous, for kernels/matmul_bf16.cu (one kernel
/// per pair): `a_k`: A `[M, K]` has `cs = 1` (else `rs = 1`); `b_k`: B `[K, N]` has
/// `rs = 1` (else `cs = 1`). The model's x·W is `a_k`, `!b_k`; x·Wᵀ (dX, lm_head) `a_k`,
/// `b_k`; Xᵀ·dY (dW) `!a_k`, `!b_k`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GemmLayout {
    pub a_k: bool,
    pub b_k: bool,
}

impl GemmLayout {
    pub const ALL: [GemmLayout; 4] = [
        GemmLayout {
            a_k: true,
            b_k: true,
        },
        GemmLayout {
            a_k: true,
            b_k: false,
        },
        GemmLayout {
            a_k: false,
            b_k: true,
        },
        GemmLayout {
            a_k: false,
            b_k: false,
        },
    ];
}

impl MatmulKernel {
    pub fn name(self) -> &'static str {
        use MmaTile::*;
        match self {
            MatmulKernel::Simt => "matmul_simt",
            MatmulKernel::TensorTf32 => "matmul_tc_tf32",
            MatmulKernel::TensorBf16 => "matmul_tc_bf16",
            MatmulKernel::MmaTf32(T128x128) => "matmul_mma_tf32_128x128",
            MatmulKernel::MmaTf32(T128x64) => "matmul_mma_tf32_128x64",
            MatmulKernel::MmaTf32(T64x64) => "matmul_mma_tf32_64x64",
            MatmulKernel::MmaBf16(T128x128) => "matmul_mma_bf16_128x128",
            MatmulKernel::MmaBf16(T128x64) => "matmul_mma_bf16_128x64",
            MatmulKernel::MmaBf16(T64x64) => "matmul_mma_bf16_64x64",
            MatmulKernel::Bf16(l) => match (l.a_k, l.b_k) {
                (true, true) => "matmul_bf16_128x128_ak_bk",
                (true, false) => "matmul_bf16_128x128_ak_bn",
                (false, true) => "matmul_bf16_128x128_am_bk",
                (false, false) => "matmul_bf16_128x128_am_bn",
            },
        }
    }

    /// The kernel that runs with output store `store`: the `_direct` twin of an mma
    /// kernel, [`MatmulKernel::name`] otherwise (the other kernels have one store).
    pub fn launch_name(self, store: MmaStore) -> &'static str {
        use MmaTile::*;
        match (self, store) {
            (_, MmaStore::Staged) => self.name(),
            (MatmulKernel::MmaTf32(T128x128), _) => "matmul_mma_tf32_128x128_direct",
            (MatmulKernel::MmaTf32(T128x64), _) => "matmul_mma_tf32_128x64_direct",
            (MatmulKernel::MmaTf32(T64x64), _) => "matmul_mma_tf32_64x64_direct",
            (MatmulKernel::MmaBf16(T128x128), _) => "matmul_mma_bf16_128x128_direct",
            (MatmulKernel::MmaBf16(T128x64), _) => "matmul_mma_bf16_128x64_direct",
            (MatmulKernel::MmaBf16(T64x64), _) => "matmul_mma_bf16_64x64_direct",
            _ => self.name(),
        }
    }

    /// Output tile `(rows, columns)` of one block, and the K step.
    pub fn tile(self) -> (usize, usize, usize) {
        match self {
            MatmulKernel::Simt => (64, 64, 16),
            MatmulKernel::TensorTf32 | MatmulKernel::TensorBf16 => (128, 128, 32),
            MatmulKernel::MmaTf32(t) | MatmulKernel::MmaBf16(t) => {
                let (bm, bn) = t.dims();
                (bm, bn, MMA_BK)
            }
            MatmulKernel::Bf16(_) => (128, 128, GEMM_BK),
        }
    }

    /// Threads per block.
    pub fn threads(self) -> u32 {
        match self {
            MatmulKernel::MmaTf32(t) | MatmulKernel::MmaBf16(t) => t.threads(),
            _ => 256,
        }
    }

    /// Dynamic shared memory per block, bytes.
    pub fn smem(self) -> u32 {
        match self {
            MatmulKernel::MmaTf32(t) | MatmulKernel::MmaBf16(t) => mma_smem(t),
            MatmulKernel::Bf16(_) => GEMM_SMEM,
            _ => 0,
        }
    }

    /// Every kernel [`choose`] can return.
    pub fn all() -> Vec<MatmulKernel> {
        let mut v = vec![
            MatmulKernel::Simt,
            MatmulKernel::TensorTf32,
            MatmulKernel::TensorBf16,
        ];
        for t in MmaTile::ALL {
            v.push(MatmulKernel::MmaTf32(t));
            v.push(MatmulKernel::MmaBf16(t));
        }
        v.extend(GemmLayout::ALL.map(MatmulKernel::Bf16));
        v
    }
}

/// The K step of kernels/matmul_bf16.cu.
pub const GEMM_BK: usize = 64;
/// Its dynamic shared memory: 3 stages of BF16 128 × 64 tiles of A and B (96 KiB),
/// which the staged output tile (128 × 136 floats) reuses.
pub const GEMM_SMEM: u32 = (3 * (128 + 128) * GEMM_BK * 2) as u32;

/// The layout kernels/matmul_bf16.cu takes `a: [batch, M, K]`, `b: [batch, K, N]` in
/// (its BF16 copies keep the strides and start at a 16-byte boundary), or `None`: each
/// operand has a contiguous dimension (stride 1), every other stride of it is a multiple
/// of 8 elements (so every 8-element chunk starts 16-byte aligned), and K is a multiple
/// of 8 when an operand is K-contiguous (the remainder tile is masked in whole chunks).
pub fn gemm_layout(a: &Operand, b: &Operand, batch: usize) -> Option<GemmLayout> {
    let aligned = |strides: &[(usize, usize)]| {
        strides
            .iter()
            .all(|&(size, stride)| size <= 1 || stride.is_multiple_of(8))
    };
    let batch_ok = |o: &Operand| batch <= 1 || o.bs.is_multiple_of(8);
    let a_k = if a.cs == 1 && aligned(&[(a.rows, a.rs)]) {
        true
    } else if a.rs == 1 && aligned(&[(a.cols, a.cs)]) {
        false
    } else {
        return None;
    };
    let b_k = if b.cs == 1 && aligned(&[(b.rows, b.rs)]) {
        false
    } else if b.rs == 1 && aligned(&[(b.cols, b.cs)]) {
        true
    } else {
        return None;
    };
    let k_ok = !(a_k || b_k) || a.cols.is_multiple_of(8);
    (batch_ok(a) && batch_ok(b) && k_ok).then_some(GemmLayout { a_k, b_k })
}

/// Elements from an operand's first to its last element, inclusive: what its BF16 copy
/// converts (the layout kept, the strides unchanged).
pub fn span(o: &Operand, batch: usize) -> usize {
    if o.rows == 0 || o.cols == 0 || batch == 0 {
        return 0;
    }
    (batch - 1) * o.bs + (o.rows - 1) * o.rs + (o.cols - 1) * o.cs + 1
}

/// Floats of scratch a BF16 copy of `elems` elements takes, rounded up to 16 bytes so the
/// next region stays aligned.
pub fn bf16_scratch(elems: usize) -> usize {
    elems.div_ceil(8) * 4
}

/// The K step of the mma kernels.
pub const MMA_BK: usize = 32;
/// Their cp.async pipeline depth.
pub const MMA_STAGES: usize = 3;

/// Dynamic shared memory of a `matmul_mma_*` kernel: `MMA_STAGES` FP32 tiles of A and B.
/// The staged store reuses it for the output tile, `BM × (BN + 8)` floats
/// ([`mma_staged_tile`]), which fits (a `static_assert` in the kernel says so too).
pub fn mma_smem(t: MmaTile) -> u32 {
    let (bm, bn) = t.dims();
    (MMA_STAGES * (bm + bn) * MMA_BK * 4) as u32
}

/// Bytes of the staged store's output tile: rows padded by 8 floats (bank-conflict-free
/// fragment writes, kernels/matmul_mma.cu).
pub fn mma_staged_tile(t: MmaTile) -> u32 {
    let (bm, bn) = t.dims();
    (bm * (bn + 8) * 4) as u32
}

/// The GPU products are planned for: its multiprocessors, and how many blocks of each
/// matmul kernel one of them holds at a time ([`resident_blocks`] of the device's limits
/// and the kernel's registers and shared memory).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MatmulGpu {
    pub sms: usize,
    blocks: Vec<(MatmulKernel, usize)>,
}

impl MatmulGpu {
    /// The plan's view of a GPU with limits `sm` whose kernels take `resources(name)`
    /// (looked up by [`MatmulKernel::name`]). A kernel that does not fit an SM counts as
    /// one block (its launch then fails and says why).
    pub fn new(sm: &SmLimits, resources: impl Fn(&str) -> KernelResources) -> Self {
        let blocks = MatmulKernel::all()
            .into_iter()
            .map(|k| {
                let b = resident_blocks(sm, k.threads(), resources(k.name()), k.smem());
                (k, b.max(1))
            })
            .collect();
        MatmulGpu {
            sms: sm.sms.max(1),
            blocks,
        }
    }

    /// The same GPU with `sms` multiprocessors (tests plan as on a large GPU this way).
    pub fn with_sms(mut self, sms: usize) -> Self {
        self.sms = sms.max(1);
        self
    }

    /// Blocks of `kernel` resident on one SM at a time.
    pub fn blocks_per_sm(&self, kernel: MatmulKernel) -> usize {
        self.blocks
            .iter()
            .find(|(k, _)| *k == kernel)
            .map_or(1, |&(_, b)| b)
    }
}

/// The mma tile of least estimated time for `batch` products of `[M, ·]·[·, N]` in
/// `precision` on `gpu`: `waves · blocks_per_sm · bm · bn / efficiency` (the time of a
/// wave is that of one SM running its resident blocks, all bound by shared-memory
/// bandwidth), the larger tile on a tie.
pub fn mma_tile(
    m: usize,
    n: usize,
    batch: usize,
    precision: MatmulPrecision,
    gpu: &MatmulGpu,
) -> MmaTile {
    let cost = |t: MmaTile| {
        let (bm, bn) = t.dims();
        let resident = gpu.blocks_per_sm(mma_kernel(precision, t));
        let blocks = m.div_ceil(bm) * n.div_ceil(bn) * batch.max(1);
        let waves = blocks.div_ceil(gpu.sms * resident);
        (waves * resident * bm * bn) as f64 / t.efficiency()
    };
    let mut best = MmaTile::T128x128;
    for t in MmaTile::ALL {
        if cost(t) < cost(best) {
            best = t;
        }
    }
    best
}

/// The mma kernel of tile `t` for `precision` (TF32 for FP32, which never runs one).
fn mma_kernel(precision: MatmulPrecision, t: MmaTile) -> MatmulKernel {
    match precision {
        MatmulPrecision::Bf16 => MatmulKernel::MmaBf16(t),
        _ => MatmulKernel::MmaTf32(t),
    }
}

/// Products below this many multiply-adds stay on the FP32 kernel even in a tensor-core
/// precision: a 128×128 tile would be mostly padding, and the gain is nil.
pub const TENSOR_CORE_MIN_MACS: usize = 1 << 22;

/// The kernel for `batch` `[M, K]·[K, N]` products in `precision` with the tensor-core
/// kernels `imp`, on `gpu`.
pub fn choose(
    m: usize,
    n: usize,
    k: usize,
    batch: usize,
    precision: MatmulPrecision,
    imp: MatmulImpl,
    gpu: &MatmulGpu,
) -> MatmulKernel {
    let big = m >= 64
        && n >= 64
        && k >= 32
        && m.saturating_mul(n).saturating_mul(k) >= TENSOR_CORE_MIN_MACS;
    let tile = || match imp {
        MatmulImpl::MmaFixed(t) => t,
        _ => mma_tile(m, n, batch, precision, gpu),
    };
    match (precision, imp) {
        (MatmulPrecision::Fp32, _) => MatmulKernel::Simt,
        _ if !big => MatmulKernel::Simt,
        (MatmulPrecision::Tf32, MatmulImpl::Wmma) => MatmulKernel::TensorTf32,
        (MatmulPrecision::Bf16, MatmulImpl::Wmma) => MatmulKernel::TensorBf16,
        (MatmulPrecision::Tf32, _) => MatmulKernel::MmaTf32(tile()),
        (MatmulPrecision::Bf16, MatmulImpl::Bf16) => MatmulKernel::Bf16(GemmLayout {
            a_k: true,
            b_k: false,
        }),
        (MatmulPrecision::Bf16, _) => MatmulKernel::MmaBf16(tile()),
    }
}

/// [`choose`] for the operands `a` and `b`: a `Bf16` kernel with their layout, or the mma
/// kernel where [`gemm_layout`] does not take them.
pub fn choose_for(
    a: &Operand,
    b: &Operand,
    batch: usize,
    precision: MatmulPrecision,
    imp: MatmulImpl,
    gpu: &MatmulGpu,
) -> MatmulKernel {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    match choose(m, n, k, batch, precision, imp, gpu) {
        MatmulKernel::Bf16(_) => match gemm_layout(a, b, batch) {
            Some(l) => MatmulKernel::Bf16(l),
            None => MatmulKernel::MmaBf16(mma_tile(m, n, batch, precision, gpu)),
        },
        kernel => kernel,
    }
}

/// A strided operand: element `(b, r, c)` at `offset + b·bs + r·rs + c·cs`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Operand {
    pub offset: usize,
    pub batch: usize,
    pub rows: usize,
    pub cols: usize,
    pub bs: usize,
    pub rs: usize,
    pub cs: usize,
}

/// How load_tile stages an operand's tiles: the kernels' `mode` argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoadMode {
    /// Scalar, neighbouring threads walk columns.
    ScalarCols = 0,
    /// Scalar, neighbouring threads walk rows.
    ScalarRows = 1,
    /// float4 along columns (`cs = 1`).
    Vec4Cols = 2,
    /// float4 along rows (`rs = 1`).
    Vec4Rows = 3,
}

/// The staging mode of `o`: float4 along its contiguous dimension when that dimension's
/// size, every other stride and the offset are multiples of 4 (so every tile origin and
/// every group of 4 is 16-byte aligned and inside the operand, tiles being multiples of 4
/// in both dimensions); scalar otherwise, walking the smaller stride.
pub fn load_mode(o: &Operand) -> LoadMode {
    let batch_ok = o.batch == 1 || o.bs.is_multiple_of(4);
    let base_ok = o.offset.is_multiple_of(4) && batch_ok;
    if o.cs == 1 && o.cols.is_multiple_of(4) && (o.rows == 1 || o.rs.is_multiple_of(4)) && base_ok {
        LoadMode::Vec4Cols
    } else if o.rs == 1
        && o.rows.is_multiple_of(4)
        && (o.cols == 1 || o.cs.is_multiple_of(4))
        && base_ok
    {
        LoadMode::Vec4Rows
    } else if o.cs <= o.rs {
        LoadMode::ScalarCols
    } else {
        LoadMode::ScalarRows
    }
}

/// Whether products may split K (`ANDREA_CUDA_SPLIT_K`): never, when the plan finds it
/// pays ([`split_count`]), or always into a fixed number of slices (for tests and for
/// comparing both paths on one GPU).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SplitK {
    Off,
    Auto,
    Fixed(usize),
}

impl SplitK {
    /// `0`, `auto` or a slice count `N >= 1` (1 is the same as `0`).
    pub fn parse(s: &str) -> Result<SplitK> {
        match s.trim() {
            "0" | "off" => Ok(SplitK::Off),
            "auto" | "" => Ok(SplitK::Auto),
            n => match n.parse::<usize>() {
                Ok(1) => Ok(SplitK::Off),
                Ok(n) if n <= MAX_SLICES_FIXED => Ok(SplitK::Fixed(n)),
                _ => Err(andrea_core::Error::invalid(
                    "ANDREA_CUDA_SPLIT_K",
                    format!("`{s}`: expected 0, auto or a slice count 1..={MAX_SLICES_FIXED}"),
                )),
            },
        }
    }
}

/// The most slices [`split_count`] picks: past 8 the reduce's traffic (8 partial tiles
/// read per output element) is no longer small against a product with K = 16384.
pub const MAX_SLICES: usize = 8;
/// The most slices `SplitK::Fixed` asks for.
pub const MAX_SLICES_FIXED: usize = 64;
/// A slice covers at least this much of K, so each block still runs 32+ K steps of the
/// tensor-core kernel and the reduce (8·slices bytes per output element, written and
/// read) stays small against the product (2·K FLOPs per output element).
pub const MIN_K_SLICE: usize = 1024;
/// The split-K workspace stays below this many floats (256 MiB).
pub const MAX_WORKSPACE: usize = 64 << 20;

/// The relative time of a product split into `s` slices, in units of one block's time
/// over the whole of K: `ceil(tiles·s / slots) / s` waves of blocks each doing 1/s of
/// the work, plus the reduce, `s·64/K` (its 8·s bytes per output element against the
/// product's 2·K FLOPs, at ~16 FLOP per byte: the kernels' achieved rate, 60-70
/// TFLOP/s, over 4.3 TB/s).
pub fn split_cost(tiles: usize, slots: usize, k: usize, s: usize) -> f64 {
    let waves = (tiles * s).div_ceil(slots.max(1));
    let reduce = if s > 1 {
        s as f64 * 64.0 / k as f64
    } else {
        0.0
    };
    waves as f64 / s as f64 + reduce
}

/// The number of K slices for an `[M, K]·[K, N]` product of `batch` entries on `gpu`:
/// the `s <= MAX_SLICES` of least [`split_cost`] (the smallest on
/// a tie) with slices of at least `MIN_K_SLICE` and a workspace under `MAX_WORKSPACE`,
/// taken only when it is at least 10% faster than the unsplit product. Batched products
/// (attention) never split: their grid already has a dimension per entry.
pub fn split_count(
    m: usize,
    n: usize,
    k: usize,
    batch: usize,
    kernel: MatmulKernel,
    gpu: &MatmulGpu,
) -> usize {
    if batch != 1 {
        return 1;
    }
    let (bm, bn, _) = kernel.tile();
    let tiles = m.div_ceil(bm) * n.div_ceil(bn);
    let slots = gpu.sms * gpu.blocks_per_sm(kernel);
    let most = (k / MIN_K_SLICE)
        .min(MAX_SLICES)
        .min(MAX_WORKSPACE / (m * n).max(1));
    let base = split_cost(tiles, slots, k, 1);
    let mut best = (1, base);
    for s in 2..=most {
        let c = split_cost(tiles, slots, k, s);
        if c < best.1 {
            best = (s, c);
        }
    }
    if best.1 <= 0.9 * base {
        best.0
    } else {
        1
    }
}

/// A split of K: `slices` launches' worth of blocks (grid z) each over `k_slice` of K
/// (the last over the rest), partial `[M, N]` tiles in a workspace of `workspace` floats,
/// then `reduce` (matmul_splitk_reduce) sums them in slice order into C.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Split {
    pub slices: usize,
    pub k_slice: i32,
    pub workspace: usize,
    pub reduce: Launch,
}

/// The split of `[M, K]·[K, N]` into about `want` slices: `k_slice` a multiple of the
/// kernel's K step; `None` when that leaves a single slice.
pub fn split(
    m: usize,
    n: usize,
    k: usize,
    kernel: MatmulKernel,
    want: usize,
) -> Result<Option<Split>> {
    const OP: &str = "matmul";
    let (_, _, bk) = kernel.tile();
    if want <= 1 || k == 0 {
        return Ok(None);
    }
    let k_slice = k.div_ceil(want).div_ceil(bk) * bk;
    let slices = k.div_ceil(k_slice);
    if slices <= 1 {
        return Ok(None);
    }
    let mn = m * n;
    Ok(Some(Split {
        slices,
        k_slice: int(OP, "K slice", k_slice)?,
        workspace: slices * mn,
        reduce: Launch {
            kernel: "matmul_splitk_reduce",
            grid: grid(OP, mn.div_ceil(256), 1, 1)?,
            block: [256, 1, 1],
            smem: 0,
        },
    }))
}

/// A planned product.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MatmulPlan {
    pub kernel: MatmulKernel,
    pub a_mode: LoadMode,
    pub b_mode: LoadMode,
    pub m: i32,
    pub n: i32,
    pub k: i32,
    /// `(first batch entry, launch)`: one launch per run of at most 65 535 entries; with a
    /// split, one launch whose grid z is the slice.
    pub launches: Vec<(usize, Launch)>,
    pub split: Option<Split>,
}

/// The split `plan` makes of a `[batch, M, K]·[batch, K, N]` product under `split_k`
/// (none for a batched product); its `workspace` is what the product takes of the
/// backend's scratch.
pub fn split_of(
    m: usize,
    n: usize,
    k: usize,
    batch: usize,
    kernel: MatmulKernel,
    split_k: SplitK,
    gpu: &MatmulGpu,
) -> Result<Option<Split>> {
    let want = match split_k {
        _ if batch != 1 => 1,
        SplitK::Off => 1,
        SplitK::Auto => split_count(m, n, k, batch, kernel, gpu),
        SplitK::Fixed(s) => s,
    };
    split(m, n, k, kernel, want)
}

/// Plans `c = a·b` for `a: [batch, M, K]`, `b: [batch, K, N]` on `gpu`, the mma kernels
/// storing their output by `store`.
#[allow(clippy::too_many_arguments)]
pub fn plan(
    a: &Operand,
    b: &Operand,
    batch: usize,
    precision: MatmulPrecision,
    imp: MatmulImpl,
    store: MmaStore,
    split_k: SplitK,
    gpu: &MatmulGpu,
) -> Result<MatmulPlan> {
    const OP: &str = "matmul";
    let (m, k, n) = (a.rows, a.cols, b.cols);
    let kernel = choose_for(a, b, batch, precision, imp, gpu);
    let (bm, bn, _) = kernel.tile();
    let split = split_of(m, n, k, batch, kernel, split_k, gpu)?;
    let mut launches = Vec::new();
    if let Some(s) = &split {
        launches.push((
            0,
            Launch {
                kernel: kernel.launch_name(store),
                grid: grid(OP, n.div_ceil(bn), m.div_ceil(bm), s.slices)?,
                block: [kernel.threads(), 1, 1],
                smem: kernel.smem(),
            },
        ));
    }
    let mut b0 = 0;
    while split.is_none() && b0 < batch {
        let count = (batch - b0).min(super::MAX_GRID_YZ);
        launches.push((
            b0,
            Launch {
                kernel: kernel.launch_name(store),
                grid: grid(OP, n.div_ceil(bn), m.div_ceil(bm), count)?,
                block: [kernel.threads(), 1, 1],
                smem: kernel.smem(),
            },
        ));
        b0 += count;
    }
    Ok(MatmulPlan {
        kernel,
        a_mode: load_mode(a),
        b_mode: load_mode(b),
        m: int(OP, "M", m)?,
        n: int(OP, "N", n)?,
        k: int(OP, "K", k)?,
        launches,
        split,
    })
}

/// The element offsets (relative to the buffer) that staging the `rows × cols` tile at
/// `(r0, c0)` of batch entry `bi` reads, in `mode`: a model of load_tile's index
/// arithmetic, including the float4 groups (returned as their first element).
pub fn tile_reads(
    o: &Operand,
    mode: LoadMode,
    bi: usize,
    r0: usize,
    c0: usize,
    rows: usize,
    cols: usize,
) -> Vec<(usize, bool)> {
    let base = o.offset + bi * o.bs + r0 * o.rs + c0 * o.cs;
    let (nr, nc) = (o.rows.saturating_sub(r0), o.cols.saturating_sub(c0));
    let mut out = Vec::new();
    match mode {
        LoadMode::Vec4Cols => {
            for r in 0..rows {
                for c in (0..cols).step_by(4) {
                    if r < nr && c < nc {
                        out.push((base + r * o.rs + c, true));
                    }
                }
            }
        }
        LoadMode::Vec4Rows => {
            for c in 0..cols {
                for r in (0..rows).step_by(4) {
                    if r < nr && c < nc {
                        out.push((base + c * o.cs + r, true));
                    }
                }
            }
        }
        _ => {
            for r in 0..rows.min(nr) {
                for c in 0..cols.min(nc) {
                    out.push((base + r * o.rs + c * o.cs, false));
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// An H200 with ptxas's sm_90 registers and static shared memory of each kernel
    /// (crates/andrea-cuda/ptx/resources.tsv, written by `cargo xtask build-kernels`).
    fn h200() -> MatmulGpu {
        let table = super::super::occupancy::ptxas_table(include_str!("../../ptx/resources.tsv"));
        MatmulGpu::new(&SmLimits::H200, |name| {
            *table
                .get(&(name.to_string(), "sm_90".to_string()))
                .unwrap_or_else(|| panic!("{name}: not in ptx/resources.tsv"))
        })
    }

    /// Blocks per SM of each matmul kernel on an H200 and on an A100, from their limits
    /// and ptxas's counts: the WMMA kernels (210-254 registers × 256 threads) one, the
    /// SIMT kernel four (by registers), the mma kernels by shared memory (96 / 72 / 48
    /// KiB per block: 2 / 3 / 4 of 228 KiB, 1 / 2 / 3 of an A100's 164 KiB).
    #[test]
    fn blocks_per_sm_from_the_device() {
        use MmaTile::*;
        let h = h200();
        assert_eq!(h.blocks_per_sm(MatmulKernel::Simt), 4);
        assert_eq!(h.blocks_per_sm(MatmulKernel::TensorTf32), 1);
        assert_eq!(h.blocks_per_sm(MatmulKernel::TensorBf16), 1);
        let table = super::super::occupancy::ptxas_table(include_str!("../../ptx/resources.tsv"));
        let a100 = MatmulGpu::new(&SmLimits::A100, |name| {
            table[&(name.to_string(), "sm_80".to_string())]
        });
        for (t, on_h200, on_a100) in [(T128x128, 2, 1), (T128x64, 3, 2), (T64x64, 4, 3)] {
            for k in [MatmulKernel::MmaTf32(t), MatmulKernel::MmaBf16(t)] {
                assert_eq!(h.blocks_per_sm(k), on_h200, "{k:?} on an H200");
                assert_eq!(a100.blocks_per_sm(k), on_a100, "{k:?} on an A100");
            }
        }
        // kernels/matmul_bf16.cu: 96 KiB and <= 128 registers, as the 128x128 mma tile.
        for l in GemmLayout::ALL {
            assert_eq!(
                h.blocks_per_sm(MatmulKernel::Bf16(l)),
                2,
                "{l:?} on an H200"
            );
            assert_eq!(
                a100.blocks_per_sm(MatmulKernel::Bf16(l)),
                1,
                "{l:?} on an A100"
            );
        }
        assert_eq!(a100.sms, 108);
        assert_eq!(h.clone().with_sms(1).blocks_per_sm(MatmulKernel::Simt), 4);
    }

    /// The layouts kernels/matmul_bf16.cu takes, the model's products among them, and what
    /// falls back to the mma kernels: a row stride or batch stride that is not a multiple of
    /// 8, K mod 8 ≠ 0 with a K-contiguous operand, an operand with no contiguous dimension;
    /// other precisions and kernel choices never run it.
    #[test]
    fn gemm_layouts_and_fallbacks() {
        let op = |rows, cols, rs, cs| Operand {
            offset: 3,
            batch: 1,
            rows,
            cols,
            bs: 0,
            rs,
            cs,
        };
        let l = |a_k, b_k| Some(GemmLayout { a_k, b_k });
        let x = op(260, 128, 128, 1);
        // x·W, x·Wᵀ (wte [323, 128] as Wᵀ), Xᵀ·dY (K = 260), Aᵀ·Bᵀ.
        assert_eq!(gemm_layout(&x, &op(128, 384, 384, 1), 1), l(true, false));
        assert_eq!(gemm_layout(&x, &op(128, 323, 1, 128), 1), l(true, true));
        let xt = op(128, 260, 1, 128);
        assert_eq!(gemm_layout(&xt, &op(260, 384, 384, 1), 1), l(false, false));
        let xt264 = op(128, 264, 1, 128);
        assert_eq!(
            gemm_layout(&xt264, &op(264, 194, 1, 264), 1),
            l(false, true)
        );
        // K = 260 with B K-contiguous: the first tile starts 60 elements early, not on a
        // 16-byte chunk.
        assert_eq!(gemm_layout(&xt, &op(260, 194, 1, 264), 1), None);
        // dlogits [260, 323] as Aᵀ: rows of 323; dlogits·wte: K = 323 with A K-contiguous.
        assert_eq!(
            gemm_layout(&op(323, 260, 1, 323), &op(260, 128, 128, 1), 1),
            None
        );
        assert_eq!(
            gemm_layout(&op(260, 323, 328, 1), &op(323, 128, 128, 1), 1),
            None
        );
        assert_eq!(
            gemm_layout(&op(260, 128, 256, 2), &op(128, 384, 384, 1), 1),
            None
        );
        let batched = Operand {
            batch: 2,
            bs: 260 * 128 + 4,
            ..x
        };
        assert_eq!(gemm_layout(&batched, &op(128, 384, 384, 1), 2), None);
        let gpu = h200();
        let w = op(128, 384, 384, 1);
        let pick = |p, imp| choose_for(&x, &w, 1, p, imp, &gpu);
        assert_eq!(
            pick(MatmulPrecision::Bf16, MatmulImpl::Bf16),
            MatmulKernel::Bf16(GemmLayout {
                a_k: true,
                b_k: false
            })
        );
        assert!(matches!(
            pick(MatmulPrecision::Bf16, MatmulImpl::Mma),
            MatmulKernel::MmaBf16(_)
        ));
        assert!(matches!(
            pick(MatmulPrecision::Tf32, MatmulImpl::Bf16),
            MatmulKernel::MmaTf32(_)
        ));
        assert_eq!(
            pick(MatmulPrecision::Fp32, MatmulImpl::Bf16),
            MatmulKernel::Simt
        );
        // A split of K = 16384 (dW) into slices of a multiple of the K step, 64.
        let s = split(768, 768, 16384, MatmulKernel::Bf16(GemmLayout::ALL[3]), 3)
            .unwrap()
            .unwrap();
        assert_eq!(s.k_slice % 64, 0);
        assert_eq!(MatmulImpl::parse("").unwrap(), MatmulImpl::Bf16);
        assert_eq!(MatmulImpl::parse("bf16").unwrap(), MatmulImpl::Bf16);
    }

    fn contiguous(offset: usize, rows: usize, cols: usize) -> Operand {
        Operand {
            offset,
            batch: 1,
            rows,
            cols,
            bs: 0,
            rs: cols,
            cs: 1,
        }
    }

    #[test]
    fn kernel_choice() {
        assert_eq!(
            choose(
                16384,
                2304,
                768,
                1,
                MatmulPrecision::Tf32,
                MatmulImpl::Wmma,
                &h200()
            ),
            MatmulKernel::TensorTf32
        );
        assert_eq!(
            choose(
                16384,
                2304,
                768,
                1,
                MatmulPrecision::Bf16,
                MatmulImpl::Wmma,
                &h200()
            ),
            MatmulKernel::TensorBf16
        );
        assert_eq!(
            choose(
                16384,
                2304,
                768,
                1,
                MatmulPrecision::Fp32,
                MatmulImpl::Wmma,
                &h200()
            ),
            MatmulKernel::Simt
        );
        // Generation: one row per sequence.
        assert_eq!(
            choose(
                1,
                8449,
                768,
                1,
                MatmulPrecision::Tf32,
                MatmulImpl::Wmma,
                &h200()
            ),
            MatmulKernel::Simt
        );
        assert_eq!(
            choose(
                64,
                64,
                64,
                1,
                MatmulPrecision::Tf32,
                MatmulImpl::Wmma,
                &h200()
            ),
            MatmulKernel::Simt
        );
    }

    #[test]
    fn load_modes() {
        assert_eq!(load_mode(&contiguous(0, 100, 768)), LoadMode::Vec4Cols);
        assert_eq!(load_mode(&contiguous(2, 100, 768)), LoadMode::ScalarCols);
        assert_eq!(load_mode(&contiguous(0, 100, 21)), LoadMode::ScalarCols);
        // A transposed weight [N, K] seen as [K, N]: rows are contiguous.
        let t = Operand {
            offset: 0,
            batch: 1,
            rows: 768,
            cols: 2304,
            bs: 0,
            rs: 1,
            cs: 768,
        };
        assert_eq!(load_mode(&t), LoadMode::Vec4Rows);
        let t_odd = Operand {
            rows: 21,
            cs: 21,
            ..t
        };
        assert_eq!(load_mode(&t_odd), LoadMode::ScalarRows);
    }

    #[test]
    fn huge_batches_are_split() {
        let a = Operand {
            offset: 0,
            batch: 100_000,
            rows: 2,
            cols: 3,
            bs: 6,
            rs: 3,
            cs: 1,
        };
        let b = Operand {
            offset: 0,
            batch: 1,
            rows: 3,
            cols: 2,
            bs: 0,
            rs: 2,
            cs: 1,
        };
        let p = plan(
            &a,
            &b,
            100_000,
            MatmulPrecision::Fp32,
            MatmulImpl::Mma,
            MmaStore::Staged,
            SplitK::Fixed(4),
            &h200(),
        )
        .unwrap();
        assert!(p.split.is_none(), "batched products never split");
        assert_eq!(p.launches.len(), 2);
        assert_eq!(p.launches[1].0, 65_535);
        assert_eq!(p.launches[1].1.grid[2] as usize, 100_000 - 65_535);
    }

    /// The 11 products of an ANDREA-120M step at 16 × 1024 tokens on an H200 (132 SMs):
    /// only the weight gradients (K = 16384, grids of 108-402 tensor-core tiles) split.
    #[test]
    fn step_products_on_an_h200() {
        let want = [
            ("fwd_qkv", 1),
            ("fwd_attn_proj", 1),
            ("fwd_fc", 1),
            ("fwd_fc_proj", 1),
            ("fwd_lm_head", 1),
            ("bwd_dx_qkv", 1),
            ("bwd_dw_qkv", 6),
            ("bwd_dx_fc_proj", 1),
            ("bwd_dw_fc_proj", 8),
            ("bwd_dx_lm_head", 1),
            ("bwd_dwte_lm_head", 8),
        ];
        let gemms = andrea_core::config::step_gemms(16 * 1024, 768, 3072, 8512);
        assert_eq!(gemms.len(), want.len());
        for precision in [MatmulPrecision::Tf32, MatmulPrecision::Bf16] {
            for (g, (name, slices)) in gemms.iter().zip(want) {
                assert_eq!(g.name, name);
                let kernel = choose(g.m, g.n, g.k, 1, precision, MatmulImpl::Wmma, &h200());
                let got = split_count(g.m, g.n, g.k, 1, kernel, &h200());
                assert_eq!(got, slices, "{name} in {precision:?}");
                let a = contiguous(0, g.m, g.k);
                let b = contiguous(0, g.k, g.n);
                let p = plan(
                    &a,
                    &b,
                    1,
                    precision,
                    MatmulImpl::Wmma,
                    MmaStore::Staged,
                    SplitK::Auto,
                    &h200(),
                )
                .unwrap();
                let s = p.split.map(|s| s.slices).unwrap_or(1);
                assert_eq!(s, slices, "{name}: the plan follows split_count");
                if let Some(s) = p.split {
                    assert_eq!(p.launches.len(), 1);
                    assert_eq!(p.launches[0].1.grid[2] as usize, s.slices);
                    assert_eq!(s.workspace, s.slices * g.m * g.n);
                    assert!(s.workspace <= MAX_WORKSPACE);
                }
            }
        }
        // The attention projection's dW (768 × 768, 36 tiles) splits the most finely.
        assert_eq!(
            split_count(768, 768, 16384, 1, MatmulKernel::TensorBf16, &h200()),
            7
        );
        // Workspaces at 16 × 1024: 6·768·2304, 8·3072·768, 8·8512·768 floats.
        let ws = |m, n| {
            split(m, n, 16384, MatmulKernel::TensorBf16, 8)
                .unwrap()
                .unwrap()
                .workspace
        };
        assert_eq!(ws(8512, 768), 8 * 8512 * 768);
        // Off and batched never split.
        let (a, b) = (contiguous(0, 768, 16384), contiguous(0, 16384, 768));
        let p = plan(
            &a,
            &b,
            1,
            MatmulPrecision::Bf16,
            MatmulImpl::Wmma,
            MmaStore::Staged,
            SplitK::Off,
            &h200(),
        )
        .unwrap();
        assert!(p.split.is_none());
        // One SM (the emulator): a single tile already fills it.
        assert_eq!(
            split_count(
                768,
                768,
                16384,
                1,
                MatmulKernel::TensorBf16,
                &h200().with_sms(1)
            ),
            1
        );
    }

    #[test]
    fn matmul_setting() {
        assert_eq!(MatmulImpl::parse("wmma").unwrap(), MatmulImpl::Wmma);
        assert_eq!(MatmulImpl::parse("mma").unwrap(), MatmulImpl::Mma);
        assert_eq!(
            MatmulImpl::parse("mma128x64").unwrap(),
            MatmulImpl::MmaFixed(MmaTile::T128x64)
        );
        let e = MatmulImpl::parse("cublas").unwrap_err().to_string();
        assert!(
            e.contains("ANDREA_CUDA_MATMUL") && e.contains("wmma"),
            "{e}"
        );
    }

    /// mma is the default for TF32 and BF16, FP32 stays SIMT, a fixed tile is obeyed, and
    /// launches carry the tile's threads and shared memory.
    #[test]
    fn mma_kernel_choice_and_launch() {
        use MatmulPrecision::*;
        let pick = |p, imp| choose(16384, 2304, 768, 1, p, imp, &h200());
        assert_eq!(pick(Fp32, MatmulImpl::Mma), MatmulKernel::Simt);
        assert_eq!(pick(Tf32, MatmulImpl::Wmma), MatmulKernel::TensorTf32);
        assert_eq!(
            pick(Tf32, MatmulImpl::Mma),
            MatmulKernel::MmaTf32(MmaTile::T128x128)
        );
        assert_eq!(
            pick(Bf16, MatmulImpl::MmaFixed(MmaTile::T64x64)),
            MatmulKernel::MmaBf16(MmaTile::T64x64)
        );
        // Small products stay SIMT whatever the setting.
        assert_eq!(
            choose(64, 64, 64, 1, Bf16, MatmulImpl::Mma, &h200()),
            MatmulKernel::Simt
        );
        let (a, b) = (contiguous(0, 1000, 768), contiguous(0, 768, 8512));
        for (t, store) in MmaTile::ALL
            .into_iter()
            .flat_map(|t| MmaStore::ALL.map(|s| (t, s)))
        {
            let imp = MatmulImpl::MmaFixed(t);
            let p = plan(&a, &b, 1, Bf16, imp, store, SplitK::Off, &h200()).unwrap();
            let (bm, bn) = t.dims();
            let l = &p.launches[0].1;
            let name = MatmulKernel::MmaBf16(t).name();
            match store {
                MmaStore::Staged => assert_eq!(l.kernel, name),
                MmaStore::Direct => assert_eq!(l.kernel, format!("{name}_direct")),
            }
            // The staged output tile fits in the pipeline's shared memory.
            assert!(mma_staged_tile(t) <= l.smem);
            assert_eq!(l.block, [t.threads(), 1, 1]);
            assert_eq!(l.smem, mma_smem(t));
            assert_eq!(
                l.grid,
                [8512u32.div_ceil(bn as u32), 1000u32.div_ceil(bm as u32), 1]
            );
            // 3 stages of FP32 A and B tiles, within sm_80's 163 KiB opt-in.
            assert_eq!(l.smem as usize, 3 * (bm + bn) * 32 * 4);
            assert!(l.smem <= 163 * 1024);
            // At least two blocks per SM on sm_90 by shared memory (228 KB, 1 KB each
            // reserved) and by ptxas's registers (the kernels' `__launch_bounds__`).
            let resident = h200().blocks_per_sm(MatmulKernel::MmaBf16(t));
            assert!(resident >= 2, "{t:?}: {resident}");
            assert!(resident * (l.smem as usize + 1024) <= 228 * 1024);
        }
    }

    /// The tile per product of an ANDREA-120M step at 16 × 1024 on an H200, and on one
    /// SM: 128x128 where the grid is many waves; smaller tiles where a 128x128 grid
    /// would leave a wave mostly empty.
    #[test]
    fn mma_tiles_per_product() {
        use MmaTile::*;
        let gemms = andrea_core::config::step_gemms(16 * 1024, 768, 3072, 8512);
        let got: Vec<(&str, MmaTile)> = gemms
            .iter()
            .map(|g| {
                (
                    g.name,
                    mma_tile(g.m, g.n, 1, MatmulPrecision::Bf16, &h200()),
                )
            })
            .collect();
        // E.g. the LM head (N = 8512): 128 × 67 tiles of 128x128 are 32.5 waves of 264
        // slots (33 · 2 · 128²), 128 × 133 of 128x64 are 43.0 waves of 396 (43 · 3 ·
        // 128·64): 2% less. dW of qkv (768 × 2304, 108 tiles of 128x128): one wave of
        // any tile, the least work per SM is 64x64's. Ties go to the larger tile.
        let want = [
            ("fwd_qkv", T128x128),
            ("fwd_attn_proj", T128x128),
            ("fwd_fc", T128x128),
            ("fwd_fc_proj", T128x128),
            ("fwd_lm_head", T128x64),
            ("bwd_dx_qkv", T128x128),
            ("bwd_dw_qkv", T64x64),
            ("bwd_dx_fc_proj", T128x128),
            ("bwd_dw_fc_proj", T128x64),
            ("bwd_dx_lm_head", T128x128),
            ("bwd_dwte_lm_head", T128x128),
        ];
        assert_eq!(got, want);
        let one_sm = h200().with_sms(1);
        // A single tile's worth of work: the smallest tile that covers it in one wave.
        assert_eq!(mma_tile(64, 64, 1, MatmulPrecision::Bf16, &one_sm), T64x64);
        assert_eq!(
            mma_tile(128, 128, 1, MatmulPrecision::Bf16, &one_sm),
            T64x64
        );
        assert_eq!(
            mma_tile(4096, 4096, 1, MatmulPrecision::Bf16, &h200()),
            T128x128
        );
    }

    #[test]
    fn mma_store_setting() {
        assert_eq!(MmaStore::parse("staged").unwrap(), MmaStore::Staged);
        assert_eq!(MmaStore::parse("direct").unwrap(), MmaStore::Direct);
        let e = MmaStore::parse("coalesced").unwrap_err().to_string();
        assert!(
            e.contains("ANDREA_CUDA_MMA_STORE") && e.contains("staged"),
            "{e}"
        );
        // The non-mma kernels have one store.
        assert_eq!(
            MatmulKernel::TensorBf16.launch_name(MmaStore::Direct),
            "matmul_tc_bf16"
        );
    }

    #[test]
    fn split_k_setting() {
        assert_eq!(SplitK::parse("0").unwrap(), SplitK::Off);
        assert_eq!(SplitK::parse("1").unwrap(), SplitK::Off);
        assert_eq!(SplitK::parse("auto").unwrap(), SplitK::Auto);
        assert_eq!(SplitK::parse("5").unwrap(), SplitK::Fixed(5));
        assert!(SplitK::parse("many").is_err());
        assert!(SplitK::parse("1000").is_err());
    }

    proptest! {
        /// Slices cover K exactly once, in K steps of the kernel, and the reduce's grid
        /// covers the output.
        #[test]
        fn slices_cover_k(m in 1usize..300, n in 1usize..300, k in 1usize..5000, want in 1usize..70, tc in any::<bool>()) {
            let kernel = if tc { MatmulKernel::TensorTf32 } else { MatmulKernel::Simt };
            let (_, _, bk) = kernel.tile();
            match split(m, n, k, kernel, want).unwrap() {
                None => prop_assert!(want <= 1 || k.div_ceil(k.div_ceil(want).div_ceil(bk) * bk) == 1),
                Some(s) => {
                    let ks = s.k_slice as usize;
                    prop_assert!(s.slices >= 2 && s.slices <= want);
                    prop_assert_eq!(ks % bk, 0);
                    prop_assert!((s.slices - 1) * ks < k && k <= s.slices * ks);
                    prop_assert_eq!(s.workspace, s.slices * m * n);
                    prop_assert!(s.reduce.threads() as usize >= m * n);
                }
            }
        }

        /// Small products never split: K under two minimum slices, or a grid that already
        /// fills the GPU's block slots in whole waves.
        #[test]
        fn small_products_never_split(m in 1usize..5000, n in 1usize..5000, k in 1usize..2048, sms in 1usize..200) {
            for kernel in [MatmulKernel::Simt, MatmulKernel::TensorBf16] {
                prop_assert_eq!(split_count(m, n, k, 1, kernel, &h200().with_sms(sms)), 1);
                prop_assert_eq!(split_count(m, n, 16384, 2, kernel, &h200().with_sms(sms)), 1);
            }
        }
    }

    fn operand() -> impl Strategy<Value = (Operand, bool)> {
        (
            0usize..9,
            1usize..3,
            1usize..70,
            1usize..70,
            0usize..3,
            any::<bool>(),
        )
            .prop_map(|(offset, batch, rows, cols, pad, transposed)| {
                // Row-major with padded rows, or column-major (a transposed view).
                let (rs, cs) = if transposed {
                    (1, rows + pad)
                } else {
                    (cols + pad, 1)
                };
                let span = if transposed {
                    (rows + pad) * cols
                } else {
                    (cols + pad) * rows
                };
                (
                    Operand {
                        offset,
                        batch,
                        rows,
                        cols,
                        bs: span + pad,
                        rs,
                        cs,
                    },
                    transposed,
                )
            })
    }

    proptest! {
        /// Every read of every tile lies inside the operand's extent, float4 reads are
        /// 16-byte aligned with all four elements inside the operand, and the tiles read
        /// every element of the operand.
        #[test]
        fn staged_tiles_stay_inside_the_operand((o, _) in operand(), tc in any::<bool>()) {
            let mode = load_mode(&o);
            let (tr, tcol) = if tc { (128, 32) } else { (64, 16) };
            let last = o.offset + (o.batch - 1) * o.bs + (o.rows - 1) * o.rs + (o.cols - 1) * o.cs;
            let mut seen = std::collections::HashSet::new();
            for bi in 0..o.batch {
                for r0 in (0..o.rows).step_by(tr) {
                    for c0 in (0..o.cols).step_by(tcol) {
                        for (at, vec) in tile_reads(&o, mode, bi, r0, c0, tr, tcol) {
                            prop_assert!(at >= o.offset);
                            if vec {
                                prop_assert_eq!(at % 4, 0);
                                prop_assert!(at + 3 <= last);
                                seen.extend(at..at + 4);
                            } else {
                                prop_assert!(at <= last);
                                seen.insert(at);
                            }
                        }
                    }
                }
            }
            let mut want = 0;
            for bi in 0..o.batch {
                for r in 0..o.rows {
                    for c in 0..o.cols {
                        want += 1;
                        prop_assert!(seen.contains(&(o.offset + bi * o.bs + r * o.rs + c * o.cs)));
                    }
                }
            }
            prop_assert!(seen.len() >= want);
        }
    }
}
