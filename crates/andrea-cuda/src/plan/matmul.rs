//! Matmul planning (kernels/matmul.cu): which kernel, the grid (split into launches of
//! at most 65 535 batch entries), and how each operand's tiles are staged.

use super::{grid, int, Launch};
use crate::precision::MatmulPrecision;
use andrea_core::Result;

/// The kernel family of one product.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatmulKernel {
    Simt,
    TensorTf32,
    TensorBf16,
}

impl MatmulKernel {
    pub fn name(self) -> &'static str {
        match self {
            MatmulKernel::Simt => "matmul_simt",
            MatmulKernel::TensorTf32 => "matmul_tc_tf32",
            MatmulKernel::TensorBf16 => "matmul_tc_bf16",
        }
    }

    /// Output tile `(rows, columns)` of one block, and the K step.
    pub fn tile(self) -> (usize, usize, usize) {
        match self {
            MatmulKernel::Simt => (64, 64, 16),
            _ => (128, 128, 32),
        }
    }
}

/// Products below this many multiply-adds stay on the FP32 kernel even in a tensor-core
/// precision: a 128×128 tile would be mostly padding, and the gain is nil.
pub const TENSOR_CORE_MIN_MACS: usize = 1 << 22;

/// The kernel for an `[M, K]·[K, N]` product (per batch entry) in `precision`.
pub fn choose(m: usize, n: usize, k: usize, precision: MatmulPrecision) -> MatmulKernel {
    let big = m >= 64
        && n >= 64
        && k >= 32
        && m.saturating_mul(n).saturating_mul(k) >= TENSOR_CORE_MIN_MACS;
    match precision {
        MatmulPrecision::Fp32 => MatmulKernel::Simt,
        _ if !big => MatmulKernel::Simt,
        MatmulPrecision::Tf32 => MatmulKernel::TensorTf32,
        MatmulPrecision::Bf16 => MatmulKernel::TensorBf16,
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

/// A planned product.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MatmulPlan {
    pub kernel: MatmulKernel,
    pub a_mode: LoadMode,
    pub b_mode: LoadMode,
    pub m: i32,
    pub n: i32,
    pub k: i32,
    /// `(first batch entry, launch)`: one launch per run of at most 65 535 entries.
    pub launches: Vec<(usize, Launch)>,
}

/// Plans `c = a·b` for `a: [batch, M, K]`, `b: [batch, K, N]`.
pub fn plan(
    a: &Operand,
    b: &Operand,
    batch: usize,
    precision: MatmulPrecision,
) -> Result<MatmulPlan> {
    const OP: &str = "matmul";
    let (m, k, n) = (a.rows, a.cols, b.cols);
    let kernel = choose(m, n, k, precision);
    let (bm, bn, _) = kernel.tile();
    let mut launches = Vec::new();
    let mut b0 = 0;
    while b0 < batch {
        let count = (batch - b0).min(super::MAX_GRID_YZ);
        launches.push((
            b0,
            Launch {
                kernel: kernel.name(),
                grid: grid(OP, n.div_ceil(bn), m.div_ceil(bm), count)?,
                block: [256, 1, 1],
                smem: 0,
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
            choose(16384, 2304, 768, MatmulPrecision::Tf32),
            MatmulKernel::TensorTf32
        );
        assert_eq!(
            choose(16384, 2304, 768, MatmulPrecision::Bf16),
            MatmulKernel::TensorBf16
        );
        assert_eq!(
            choose(16384, 2304, 768, MatmulPrecision::Fp32),
            MatmulKernel::Simt
        );
        // Generation: one row per sequence.
        assert_eq!(
            choose(1, 8449, 768, MatmulPrecision::Tf32),
            MatmulKernel::Simt
        );
        assert_eq!(
            choose(64, 64, 64, MatmulPrecision::Tf32),
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
        let p = plan(&a, &b, 100_000, MatmulPrecision::Fp32).unwrap();
        assert_eq!(p.launches.len(), 2);
        assert_eq!(p.launches[1].0, 65_535);
        assert_eq!(p.launches[1].1.grid[2] as usize, 100_000 - 65_535);
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
