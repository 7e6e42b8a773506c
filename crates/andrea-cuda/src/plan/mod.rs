//! Launch planning: everything that decides how a kernel runs (grid and block sizes,
//! shared memory, tile and vector-width choices, scratch sizes, the element ranges each
//! kernel touches), as plain functions tested without a GPU. The `cuda` feature's
//! backend only turns a [`Launch`] and its arguments into a driver call.
//!
//! Every plan is computed after `andrea_core::check` has validated the call, so it may
//! assume valid views; what it checks itself is what the *kernels* need: sizes that fit
//! their 32-bit fields and the CUDA grid limits. Such a failure is an error naming the
//! op, never a truncated launch.

pub mod attention;
pub mod decode;
pub mod elementwise;
pub mod embedding;
pub mod matmul;
pub mod occupancy;
pub mod reduce;
pub mod rows;

use andrea_core::{Error, Result};

/// The CUDA limit on `gridDim.x`.
pub const MAX_GRID_X: usize = (1 << 31) - 1;
/// The CUDA limit on `gridDim.y` and `gridDim.z`.
pub const MAX_GRID_YZ: usize = 65_535;
/// Shared memory a block may use without opting in (every kernel here stays below it).
pub const DEFAULT_SMEM_LIMIT: usize = 48 * 1024;

/// One kernel launch: which kernel, grid, block and dynamic shared memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Launch {
    pub kernel: &'static str,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    /// Dynamic shared memory in bytes.
    pub smem: u32,
}

impl Launch {
    /// Threads in the whole grid.
    pub fn threads(&self) -> u64 {
        self.grid
            .iter()
            .chain(&self.block)
            .map(|&d| d as u64)
            .product()
    }
}

/// A grid, checked against the CUDA limits.
pub fn grid(op: &'static str, x: usize, y: usize, z: usize) -> Result<[u32; 3]> {
    if x == 0 || y == 0 || z == 0 {
        return Err(Error::invalid(op, "internal: empty CUDA grid"));
    }
    if x > MAX_GRID_X || y > MAX_GRID_YZ || z > MAX_GRID_YZ {
        return Err(Error::invalid(
            op,
            format!(
                "the problem needs a CUDA grid of {x}×{y}×{z} blocks, over the limits \
                 ({MAX_GRID_X}×{MAX_GRID_YZ}×{MAX_GRID_YZ}); split the call"
            ),
        ));
    }
    Ok([x as u32, y as u32, z as u32])
}

/// `v` as a kernel's 32-bit `int` field.
pub fn int(op: &'static str, what: &str, v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| {
        Error::invalid(
            op,
            format!(
                "{what} = {v} exceeds the CUDA kernels' 32-bit size fields (at most {})",
                i32::MAX
            ),
        )
    })
}

/// `v` as a kernel's 64-bit `long long` field.
pub fn long(v: usize) -> i64 {
    // Buffer lengths are bounded by device memory, far below 2^63 elements.
    v as i64
}

/// Whether every offset (in elements) is a multiple of 4: device allocations are
/// 256-byte aligned, so the views are then 16-byte aligned for float4 accesses.
pub fn aligned4(offsets: &[usize]) -> bool {
    offsets.iter().all(|o| o % 4 == 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grid_limits_are_errors() {
        assert_eq!(grid("op", 3, 2, 1).unwrap(), [3, 2, 1]);
        assert!(grid("op", 1, MAX_GRID_YZ + 1, 1).is_err());
        assert!(grid("op", MAX_GRID_X + 1, 1, 1).is_err());
        let e = grid("matmul", 1, 1, 70_000).unwrap_err().to_string();
        assert!(e.starts_with("matmul:"), "{e}");
    }

    #[test]
    fn int_fields() {
        assert_eq!(int("op", "rows", 5).unwrap(), 5);
        assert!(int("op", "rows", 1 << 31).is_err());
    }
}
