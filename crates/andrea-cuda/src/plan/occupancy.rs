//! How many blocks of a kernel one multiprocessor holds at a time, from what the device
//! has (`cuDeviceGetAttribute`) and what one block of the kernel takes
//! (`cuFuncGetAttribute`: ptxas's registers and static shared memory, plus the launch's
//! dynamic shared memory): the rule of NVIDIA's occupancy calculator for sm_80 and sm_90.
//! The plans read it instead of a table for one GPU, so an A100 (164 KiB of shared memory
//! per SM) and an H200 (228 KiB) each get their own count.

use std::collections::HashMap;

/// A multiprocessor's limits and how many there are, as the driver reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SmLimits {
    /// Multiprocessors (`CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT`).
    pub sms: usize,
    /// 32-bit registers per SM (`..._MAX_REGISTERS_PER_MULTIPROCESSOR`).
    pub registers: usize,
    /// Shared memory per SM, bytes (`..._MAX_SHARED_MEMORY_PER_MULTIPROCESSOR`).
    pub shared_memory: usize,
    /// Shared memory the driver reserves per resident block, bytes
    /// (`..._RESERVED_SHARED_MEMORY_PER_BLOCK`).
    pub reserved_shared_memory: usize,
    /// Threads per SM (`..._MAX_THREADS_PER_MULTIPROCESSOR`).
    pub threads: usize,
    /// Resident blocks per SM (`..._MAX_BLOCKS_PER_MULTIPROCESSOR`).
    pub blocks: usize,
}

impl SmLimits {
    /// An H200 (and H100 SXM): sm_90, 132 SMs, as its driver reports them. For the plans'
    /// tests and for tests that plan as on an H200 elsewhere.
    pub const H200: SmLimits = SmLimits {
        sms: 132,
        registers: 65_536,
        shared_memory: 233_472,
        reserved_shared_memory: 1024,
        threads: 2048,
        blocks: 32,
    };

    /// An A100: sm_80, 108 SMs, 164 KiB of shared memory per SM.
    pub const A100: SmLimits = SmLimits {
        sms: 108,
        registers: 65_536,
        shared_memory: 167_936,
        reserved_shared_memory: 1024,
        threads: 2048,
        blocks: 32,
    };
}

/// What one thread and one block of a kernel take, as ptxas compiled it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct KernelResources {
    /// Registers per thread (`CU_FUNC_ATTRIBUTE_NUM_REGS`).
    pub registers: usize,
    /// Static shared memory per block, bytes (`CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES`).
    pub static_smem: usize,
}

/// ptxas's resources per `(kernel, arch)` from the table `cargo xtask build-kernels`
/// writes next to the PTX (`crates/andrea-cuda/ptx/resources.tsv`: one kernel and
/// architecture per line, `kernel arch registers static_smem_bytes`, `#` comments). The
/// backend asks the driver instead; this is for planning as on a GPU that is not here.
pub fn ptxas_table(text: &str) -> HashMap<(String, String), KernelResources> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let [kernel, arch, registers, static_smem] = f[..] else {
                return None;
            };
            Some((
                (kernel.to_string(), arch.to_string()),
                KernelResources {
                    registers: registers.parse().ok()?,
                    static_smem: static_smem.parse().ok()?,
                },
            ))
        })
        .collect()
}

/// Registers are allocated to a warp in units of this many (sm_80, sm_90).
pub const REGISTER_UNIT: usize = 256;
/// Shared memory is allocated to a block in units of this many bytes (sm_80, sm_90).
pub const SMEM_UNIT: usize = 128;

/// Blocks of `threads` threads, each thread taking `k.registers` registers and each block
/// `k.static_smem + dynamic_smem` bytes of shared memory (plus the driver's reserve),
/// resident on one SM of `sm` at a time: the least of what the registers, the shared
/// memory, the threads and the block slots allow. 0 when one block does not fit.
pub fn resident_blocks(
    sm: &SmLimits,
    threads: u32,
    k: KernelResources,
    dynamic_smem: u32,
) -> usize {
    let threads = (threads as usize).max(1);
    let warps = threads.div_ceil(32);
    let per_warp = (k.registers.max(1) * 32).div_ceil(REGISTER_UNIT) * REGISTER_UNIT;
    let by_registers = sm.registers / per_warp / warps;
    let smem = (k.static_smem + dynamic_smem as usize + sm.reserved_shared_memory)
        .div_ceil(SMEM_UNIT)
        * SMEM_UNIT;
    let by_smem = sm.shared_memory.checked_div(smem).unwrap_or(usize::MAX);
    let by_threads = sm.threads / threads;
    by_registers.min(by_smem).min(by_threads).min(sm.blocks)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn res(registers: usize, static_smem: usize) -> KernelResources {
        KernelResources {
            registers,
            static_smem,
        }
    }

    /// Each limit binds where it should (numbers as NVIDIA's occupancy calculator gives
    /// them for sm_90).
    #[test]
    fn each_limit_binds() {
        let h = SmLimits::H200;
        // Registers: 64 × 256 threads = 16 384 of 65 536 -> 4 blocks.
        assert_eq!(resident_blocks(&h, 256, res(64, 0), 0), 4);
        // 65 registers round up to 72 per thread (2 304 per warp): 28 warps, 3 blocks of 8.
        assert_eq!(resident_blocks(&h, 256, res(65, 0), 0), 3);
        // 232 registers x 256 threads: one block (the WMMA kernels).
        assert_eq!(resident_blocks(&h, 256, res(232, 0), 0), 1);
        // Shared memory: 96 KiB + 1 KiB reserved -> 2 of 228 KiB; 164 KiB on an A100 -> 1.
        assert_eq!(resident_blocks(&h, 256, res(128, 0), 96 * 1024), 2);
        assert_eq!(
            resident_blocks(&SmLimits::A100, 256, res(128, 0), 96 * 1024),
            1
        );
        // Static and dynamic shared memory add up.
        assert_eq!(resident_blocks(&h, 128, res(32, 40 * 1024), 40 * 1024), 2);
        // Threads: 2048 per SM -> 2 blocks of 1024.
        assert_eq!(resident_blocks(&h, 1024, res(16, 0), 0), 2);
        // Block slots: 32 blocks of 32 threads at most.
        assert_eq!(resident_blocks(&h, 32, res(16, 0), 0), 32);
        // Too big for an SM: none.
        assert_eq!(resident_blocks(&h, 256, res(32, 0), 240 * 1024), 0);
    }

    #[test]
    fn reads_the_ptxas_table() {
        let t = ptxas_table(
            "# kernel arch registers static_smem\nmatmul_simt sm_90 64 16640\nbad line\n",
        );
        assert_eq!(t.len(), 1);
        assert_eq!(
            t[&("matmul_simt".to_string(), "sm_90".to_string())],
            res(64, 16640)
        );
    }
}
