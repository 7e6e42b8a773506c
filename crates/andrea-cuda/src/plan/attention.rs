//! Fused attention planning: which kernels run, rows per warp, tiles, dynamic shared
//! memory and grids. The workspace is one log-sum-exp per query row
//! ([`andrea_core::AttentionShape::lse_len`]), the same for both kernel families, and the
//! backward's scratch one float per query row too (the tensor-core backward's
//! `D_t = dO_t·O_t`; the SIMT backward needs none, but asks for it all the same so that
//! switching kernels never changes buffer sizes).
//!
//! Two kernel families:
//!
//! * SIMT (kernels/attention.cu): FP32 FMA, any head size up to 128; the exact path
//!   ([`crate::Precision::FP32`]) and the reference the tensor-core kernels are tested
//!   against.
//! * Tensor cores (kernels/attention_mma.cu): TF32 or BF16 operands, FP32 accumulation,
//!   for head sizes 32, 64 and 128 (the backward not for TF32 with 128: see
//!   [`mma_supported`]); what [`crate::Precision::FAST`] and [`crate::Precision::BF16`]
//!   use. [`AttentionKernels`] (`ANDREA_CUDA_ATTENTION=auto|simt|mma`) forces either.
//!
//! Generation's steps of a few query rows over a long KV cache take neither where
//! [`super::decode`] splits the keys (kernels/attention_decode.cu); its partials follow the
//! lse in the workspace.

use super::{grid, int, Launch, DEFAULT_SMEM_LIMIT};
use crate::precision::MatmulPrecision;
use andrea_core::check::AttentionDims;
use andrea_core::{Error, Result};

/// Which attention kernels the backend runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum AttentionKernels {
    /// By the precision: SIMT for [`MatmulPrecision::Fp32`], tensor cores otherwise.
    #[default]
    Auto,
    /// The FP32 SIMT kernels whatever the precision.
    Simt,
    /// The tensor-core kernels whatever the precision (TF32 operands under FP32), where
    /// the shape has them ([`mma_supported`]); SIMT elsewhere.
    Mma,
}

impl AttentionKernels {
    /// `auto`, `simt` or `mma` (the values of `ANDREA_CUDA_ATTENTION`).
    pub fn parse(s: &str) -> Result<Self> {
        match s.trim() {
            "auto" | "" => Ok(Self::Auto),
            "simt" => Ok(Self::Simt),
            "mma" => Ok(Self::Mma),
            other => Err(Error::invalid(
                "ANDREA_CUDA_ATTENTION",
                format!("`{other}` is not one of auto, simt, mma"),
            )),
        }
    }

    /// The tensor-core operand precision to use, or `None` for the SIMT kernels.
    pub fn operands(self, precision: MatmulPrecision) -> Option<MmaOperands> {
        match (self, precision) {
            (Self::Simt, _) | (Self::Auto, MatmulPrecision::Fp32) => None,
            (_, MatmulPrecision::Bf16) => Some(MmaOperands::Bf16),
            (_, _) => Some(MmaOperands::Tf32),
        }
    }
}

/// Operand precision of the tensor-core attention kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MmaOperands {
    /// mma.m16n8k8 with TF32 operands (10-bit mantissa).
    Tf32,
    /// mma.m16n8k16 with BF16 operands (7-bit mantissa).
    Bf16,
}

impl MmaOperands {
    /// Unit roundoff of the operands: 2^-11 (TF32), 2^-8 (BF16).
    pub fn unit_roundoff(self) -> f64 {
        match self {
            Self::Tf32 => 2f64.powi(-11),
            Self::Bf16 => 2f64.powi(-8),
        }
    }
}

/// The three tensor-core kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MmaKernel {
    Forward,
    BackwardDkDv,
    BackwardDq,
}

/// Rows (queries, or keys for dK/dV) per block of the tensor-core kernels: 4 warps × 16.
pub const MMA_ROWS: usize = 64;
/// Head sizes the tensor-core kernels are instantiated for.
pub const MMA_HEAD_DIMS: [usize; 3] = [32, 64, 128];

/// Dynamic shared memory of a tensor-core kernel with streamed tiles of `tile` rows:
/// the 64 resident rows are staged first (padded rows of D + 8), then two buffers of
/// tiles take the space (kernels/attention_mma.cu).
pub fn mma_smem(kernel: MmaKernel, tile: usize, d: usize) -> usize {
    let resident = MMA_ROWS * (d + 8);
    let stage = match kernel {
        MmaKernel::Forward => tile * ((d + 8) + (d + 4)),
        MmaKernel::BackwardDkDv => 2 * tile * (d + 8) + 2 * tile,
        MmaKernel::BackwardDq => 2 * tile * (d + 8),
    };
    4 * resident.max(2 * stage)
}

/// Whether the tensor-core kernel exists for these operands and head size. Not for
/// TF32 with D = 128 backward: its K, V fragments and dK, dV accumulators alone would
/// take 256 registers a thread.
pub fn mma_supported(kernel: MmaKernel, ops: MmaOperands, d: usize) -> bool {
    MMA_HEAD_DIMS.contains(&d)
        && !(ops == MmaOperands::Tf32 && d == 128 && kernel != MmaKernel::Forward)
}

/// Rows per streamed tile: the largest of 64, 32, 16 whose two buffers fit in the
/// default 48 KiB, except TF32 with D = 64 backward, kept at 16 so that its fragments
/// fit in registers without spills (`cargo xtask build-kernels` reports them).
pub fn mma_tile(kernel: MmaKernel, ops: MmaOperands, d: usize) -> usize {
    if ops == MmaOperands::Tf32 && d == 64 && kernel != MmaKernel::Forward {
        return 16;
    }
    [64, 32, 16]
        .into_iter()
        .find(|&t| mma_smem(kernel, t, d) <= DEFAULT_SMEM_LIMIT)
        .unwrap_or(16)
}

/// The kernel's name in kernels/attention_mma.cu.
pub fn mma_kernel_name(kernel: MmaKernel, ops: MmaOperands, d: usize) -> &'static str {
    macro_rules! names {
        ($($k:ident $o:ident $d:literal => $n:literal,)*) => {
            match (kernel, ops, d) {
                $((MmaKernel::$k, MmaOperands::$o, $d) => $n,)*
                _ => "attention_mma_unsupported",
            }
        };
    }
    names! {
        Forward Tf32 32 => "attention_mma_fwd_tf32_d32",
        Forward Tf32 64 => "attention_mma_fwd_tf32_d64",
        Forward Tf32 128 => "attention_mma_fwd_tf32_d128",
        Forward Bf16 32 => "attention_mma_fwd_bf16_d32",
        Forward Bf16 64 => "attention_mma_fwd_bf16_d64",
        Forward Bf16 128 => "attention_mma_fwd_bf16_d128",
        BackwardDkDv Tf32 32 => "attention_mma_bwd_dkdv_tf32_d32",
        BackwardDkDv Tf32 64 => "attention_mma_bwd_dkdv_tf32_d64",
        BackwardDkDv Bf16 32 => "attention_mma_bwd_dkdv_bf16_d32",
        BackwardDkDv Bf16 64 => "attention_mma_bwd_dkdv_bf16_d64",
        BackwardDkDv Bf16 128 => "attention_mma_bwd_dkdv_bf16_d128",
        BackwardDq Tf32 32 => "attention_mma_bwd_dq_tf32_d32",
        BackwardDq Tf32 64 => "attention_mma_bwd_dq_tf32_d64",
        BackwardDq Bf16 32 => "attention_mma_bwd_dq_bf16_d32",
        BackwardDq Bf16 64 => "attention_mma_bwd_dq_bf16_d64",
        BackwardDq Bf16 128 => "attention_mma_bwd_dq_bf16_d128",
    }
}

fn mma_launch(
    op: &'static str,
    k: MmaKernel,
    ops: MmaOperands,
    d: &AttentionDims,
    rows: usize,
) -> Result<Launch> {
    let tile = mma_tile(k, ops, d.head_dim);
    Ok(Launch {
        kernel: mma_kernel_name(k, ops, d.head_dim),
        grid: grid(op, rows.div_ceil(MMA_ROWS), d.heads, d.batch)?,
        block: [128, 1, 1],
        smem: mma_smem(k, tile, d.head_dim) as u32,
    })
}

/// The tensor-core forward, or `None` where there is none for this head size.
pub fn mma_forward(d: &AttentionDims, ops: MmaOperands) -> Result<Option<Launch>> {
    const OP: &str = "attention_forward";
    if !mma_supported(MmaKernel::Forward, ops, d.head_dim) {
        return Ok(None);
    }
    int(OP, "query positions", d.q_len)?;
    int(OP, "key positions", d.k_len)?;
    Ok(Some(mma_launch(OP, MmaKernel::Forward, ops, d, d.q_len)?))
}

/// The tensor-core backward's launches in their order, `(dot, dk and dv, dq)`, or `None`
/// where there is none for this head size.
pub fn mma_backward(d: &AttentionDims, ops: MmaOperands) -> Result<Option<[Launch; 3]>> {
    const OP: &str = "attention_backward";
    if !mma_supported(MmaKernel::BackwardDkDv, ops, d.head_dim) {
        return Ok(None);
    }
    int(OP, "positions", d.q_len)?;
    let dot = Launch {
        kernel: "attention_mma_bwd_dot",
        grid: grid(OP, d.q_len.div_ceil(4), d.heads, d.batch)?,
        block: [128, 1, 1],
        smem: 0,
    };
    let dkdv = mma_launch(OP, MmaKernel::BackwardDkDv, ops, d, d.k_len)?;
    let dq = mma_launch(OP, MmaKernel::BackwardDq, ops, d, d.q_len)?;
    Ok(Some([dot, dkdv, dq]))
}

/// Whether the 16-byte cp.async path applies: every row start of every view (element
/// offsets and strides; D is a multiple of 4) is 16-byte aligned.
pub fn mma_vectorized(offsets_and_strides: &[usize]) -> bool {
    super::aligned4(offsets_and_strides)
}

/// Warps per block of the forward and dq kernels.
pub const WARPS: usize = 4;
/// Keys per tile.
pub const KEY_TILE: usize = 32;
/// The largest head size: the kernels spread an output row over 32 lanes × 4 registers.
pub const MAX_HEAD_DIM: usize = 128;

/// Dynamic shared memory of `attention_forward_r<R>`: Q `[4R][D]`, K `[32][D+1]`, V `[32][D]`.
pub fn forward_smem(rows_per_warp: usize, d: usize) -> usize {
    4 * (WARPS * rows_per_warp * d + KEY_TILE * (d + 1) + KEY_TILE * d)
}

/// Dynamic shared memory of `attention_backward_dq_r<R>`: Q, dO `[4R][D]`, K, V `[32][D+1]`.
pub fn dq_smem(rows_per_warp: usize, d: usize) -> usize {
    4 * (2 * WARPS * rows_per_warp * d + 2 * KEY_TILE * (d + 1))
}

/// Dynamic shared memory of `attention_backward_dkdv`: K, V `[32][D+1]`, q_t, dO_t `[D]`.
pub fn dkdv_smem(d: usize) -> usize {
    4 * (2 * KEY_TILE * (d + 1) + 2 * d)
}

fn check_head_dim(op: &'static str, d: usize) -> Result<()> {
    if d > MAX_HEAD_DIM {
        return Err(Error::invalid(
            op,
            format!("head_dim {d} is not supported by the CUDA attention kernels (at most {MAX_HEAD_DIM})"),
        ));
    }
    Ok(())
}

/// 4 query rows per warp when their shared memory fits, else 2.
fn rows_per_warp(smem: impl Fn(usize) -> usize) -> usize {
    if smem(4) <= DEFAULT_SMEM_LIMIT {
        4
    } else {
        2
    }
}

fn dq_kernel(r: usize) -> &'static str {
    if r == 4 {
        "attention_backward_dq_r4"
    } else {
        "attention_backward_dq_r2"
    }
}

/// The forward launch.
pub fn forward(d: &AttentionDims) -> Result<Launch> {
    const OP: &str = "attention_forward";
    check_head_dim(OP, d.head_dim)?;
    int(OP, "query positions", d.q_len)?;
    int(OP, "key positions", d.k_len)?;
    // 4 rows per warp always fit (23.5 KiB at D = 128): no 2-rows forward.
    let r = 4;
    Ok(Launch {
        kernel: "attention_forward_r4",
        grid: grid(OP, d.q_len.div_ceil(WARPS * r), d.heads, d.batch)?,
        block: [32 * WARPS as u32, 1, 1],
        smem: forward_smem(r, d.head_dim) as u32,
    })
}

/// The two backward launches: `(dq, dk and dv)`.
pub fn backward(d: &AttentionDims) -> Result<(Launch, Launch)> {
    const OP: &str = "attention_backward";
    check_head_dim(OP, d.head_dim)?;
    int(OP, "positions", d.q_len)?;
    let r = rows_per_warp(|r| dq_smem(r, d.head_dim));
    let dq = Launch {
        kernel: dq_kernel(r),
        grid: grid(OP, d.q_len.div_ceil(WARPS * r), d.heads, d.batch)?,
        block: [32 * WARPS as u32, 1, 1],
        smem: dq_smem(r, d.head_dim) as u32,
    };
    let slices = d.head_dim.div_ceil(32);
    let dkdv = Launch {
        kernel: "attention_backward_dkdv",
        grid: grid(OP, d.k_len.div_ceil(KEY_TILE), d.heads * slices, d.batch)?,
        block: [32, 1, 1],
        smem: dkdv_smem(d.head_dim) as u32,
    };
    Ok((dq, dkdv))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dims(b: usize, h: usize, t: usize, d: usize) -> AttentionDims {
        AttentionDims {
            batch: b,
            heads: h,
            head_dim: d,
            q_len: t,
            k_len: t,
        }
    }

    #[test]
    fn every_supported_head_size_fits_in_default_shared_memory() {
        for d in 1..=MAX_HEAD_DIM {
            let f = forward(&dims(2, 3, 100, d)).unwrap();
            let (dq, dkdv) = backward(&dims(2, 3, 100, d)).unwrap();
            for l in [f, dq, dkdv] {
                assert!(
                    l.smem as usize <= DEFAULT_SMEM_LIMIT,
                    "{} d={d}: {}",
                    l.kernel,
                    l.smem
                );
            }
        }
        assert!(forward(&dims(1, 1, 1, MAX_HEAD_DIM + 1)).is_err());
        assert!(forward_smem(4, MAX_HEAD_DIM) <= DEFAULT_SMEM_LIMIT);
    }

    #[test]
    fn gpt2_shapes() {
        let f = forward(&dims(16, 12, 1024, 64)).unwrap();
        assert_eq!(f.kernel, "attention_forward_r4");
        assert_eq!(f.grid, [64, 12, 16]);
        let (dq, dkdv) = backward(&dims(16, 12, 1024, 64)).unwrap();
        assert_eq!(dq.kernel, "attention_backward_dq_r4");
        assert_eq!(dkdv.grid, [32, 24, 16]);
        // Head size 128: dq needs the 2-rows variant to stay under 48 KiB.
        assert_eq!(
            backward(&dims(1, 1, 8, 128)).unwrap().0.kernel,
            "attention_backward_dq_r2"
        );
    }

    #[test]
    fn mma_tiles_fit_and_name_compiled_kernels() {
        use crate::ptx;
        let kinds = [
            MmaKernel::Forward,
            MmaKernel::BackwardDkDv,
            MmaKernel::BackwardDq,
        ];
        for ops in [MmaOperands::Tf32, MmaOperands::Bf16] {
            for d in MMA_HEAD_DIMS {
                for k in kinds {
                    let name = mma_kernel_name(k, ops, d);
                    if !mma_supported(k, ops, d) {
                        assert!(ptx::module_of(name).is_none(), "{name}");
                        continue;
                    }
                    let tile = mma_tile(k, ops, d);
                    assert!(mma_smem(k, tile, d) <= DEFAULT_SMEM_LIMIT, "{name}");
                    let m = ptx::module_of(name).unwrap_or_else(|| panic!("{name} not compiled"));
                    assert_eq!(m.name, "attention_mma");
                    // The kernels' compile-time tile (kernels/attention_mma.cu entries).
                    let expect = match (ops, d, k) {
                        (_, 32, _) => 64,
                        (MmaOperands::Tf32, 64, MmaKernel::Forward) => 32,
                        (MmaOperands::Tf32, 64, _) => 16,
                        (_, 64, _) => 32,
                        _ => 16,
                    };
                    assert_eq!(tile, expect, "{name}");
                }
            }
        }
        assert!(ptx::module_of("attention_mma_bwd_dot").is_some());
    }

    #[test]
    fn mma_selection() {
        use crate::precision::MatmulPrecision as M;
        let a = AttentionKernels::Auto;
        assert_eq!(a.operands(M::Fp32), None);
        assert_eq!(a.operands(M::Tf32), Some(MmaOperands::Tf32));
        assert_eq!(a.operands(M::Bf16), Some(MmaOperands::Bf16));
        assert_eq!(AttentionKernels::Simt.operands(M::Bf16), None);
        assert_eq!(
            AttentionKernels::Mma.operands(M::Fp32),
            Some(MmaOperands::Tf32)
        );
        assert_eq!(
            AttentionKernels::parse("mma").unwrap(),
            AttentionKernels::Mma
        );
        assert!(AttentionKernels::parse("fast").is_err());
        // GPT-2 small: every launch on tensor cores; head size 24 falls back to SIMT.
        let g = dims(16, 12, 1024, 64);
        let f = mma_forward(&g, MmaOperands::Bf16).unwrap().unwrap();
        assert_eq!(f.kernel, "attention_mma_fwd_bf16_d64");
        assert_eq!(f.grid, [16, 12, 16]);
        let [dot, dkdv, dq] = mma_backward(&g, MmaOperands::Bf16).unwrap().unwrap();
        assert_eq!(dot.grid, [256, 12, 16]);
        assert_eq!(dkdv.kernel, "attention_mma_bwd_dkdv_bf16_d64");
        assert_eq!(dq.grid, [16, 12, 16]);
        assert!(mma_forward(&dims(1, 1, 8, 24), MmaOperands::Tf32)
            .unwrap()
            .is_none());
        assert!(mma_backward(&dims(1, 1, 8, 128), MmaOperands::Tf32)
            .unwrap()
            .is_none());
        assert!(mma_backward(&dims(1, 1, 8, 128), MmaOperands::Bf16)
            .unwrap()
            .is_some());
    }

    #[test]
    fn workspace_is_one_float_per_query_row() {
        use andrea_core::AttentionShape;
        let s = AttentionShape {
            batch: 2,
            heads: 3,
            head_dim: 4,
            q_len: 5,
            k_len: 9,
        };
        assert_eq!(s.lse_len(), 30);
    }
}
