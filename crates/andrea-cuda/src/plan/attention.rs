//! Fused attention planning (kernels/attention.cu): rows per warp, dynamic shared
//! memory and grids. The workspace is one log-sum-exp per query row
//! ([`andrea_core::AttentionShape::lse_len`]).

use super::{grid, int, Launch, DEFAULT_SMEM_LIMIT};
use andrea_core::check::AttentionDims;
use andrea_core::{Error, Result};

/// Warps per block of the forward and dq kernels.
pub const WARPS: usize = 4;
/// Keys per tile.
pub const KEY_TILE: usize = 32;
/// The largest head size: the kernels spread an output row over 32 lanes × 4 registers.
pub const MAX_HEAD_DIM: usize = 128;

/// Dynamic shared memory of attention_forward_r<R>: Q [4R][D], K [32][D+1], V [32][D].
pub fn forward_smem(rows_per_warp: usize, d: usize) -> usize {
    4 * (WARPS * rows_per_warp * d + KEY_TILE * (d + 1) + KEY_TILE * d)
}

/// Dynamic shared memory of attention_backward_dq_r<R>: Q, dO [4R][D], K, V [32][D+1].
pub fn dq_smem(rows_per_warp: usize, d: usize) -> usize {
    4 * (2 * WARPS * rows_per_warp * d + 2 * KEY_TILE * (d + 1))
}

/// Dynamic shared memory of attention_backward_dkdv: K, V [32][D+1], q_t, dO_t [D].
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

fn rows_kernel(base: &'static str, r: usize) -> &'static str {
    match (base, r) {
        ("forward", 4) => "attention_forward_r4",
        ("forward", _) => "attention_forward_r2",
        (_, 4) => "attention_backward_dq_r4",
        _ => "attention_backward_dq_r2",
    }
}

/// The forward launch.
pub fn forward(d: &AttentionDims) -> Result<Launch> {
    const OP: &str = "attention_forward";
    check_head_dim(OP, d.head_dim)?;
    int(OP, "query positions", d.q_len)?;
    int(OP, "key positions", d.k_len)?;
    let r = rows_per_warp(|r| forward_smem(r, d.head_dim));
    Ok(Launch {
        kernel: rows_kernel("forward", r),
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
        kernel: rows_kernel("dq", r),
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
    fn workspace_is_one_float_per_query_row() {
        use andrea_core::AttentionShape;
        let s = AttentionShape {
            batch: 2,
            heads: 3,
            q_len: 5,
            k_len: 9,
        };
        assert_eq!(s.lse_len(), 30);
    }
}
