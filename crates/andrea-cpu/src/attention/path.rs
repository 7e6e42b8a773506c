//! Which implementation runs attention.

use crate::simd;

/// Which implementation runs attention: the fused kernel (`attention::fused`) where it can
/// run, the blocked path below elsewhere. The product always takes [`AttentionPath::DEFAULT`];
/// the unit tests take the others to compare them with it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct AttentionPath {
    /// The fused kernel where the level has AVX2 + FMA and the head size is a multiple of
    /// 16 (else the blocked path everywhere).
    pub(crate) fused: bool,
    /// The fused kernel's 32-column tile where the level has AVX-512 and the head size is
    /// a multiple of 32 (else its 16-column tile; both give the same bits).
    pub(crate) wide: bool,
}

impl AttentionPath {
    pub(crate) const DEFAULT: AttentionPath = AttentionPath {
        fused: true,
        wide: true,
    };

    /// The fused kernel's tile for heads of `head_dim` at the kernels' level, or `None`
    /// where the blocked path runs.
    #[cfg(target_arch = "x86_64")]
    pub(crate) fn fused_width(self, head_dim: usize) -> Option<crate::attention::fused::Width> {
        self.fused
            .then(|| crate::attention::fused::width(head_dim, self.wide))
            .flatten()
    }

    /// The implementation that runs at the kernels' level for heads a multiple of 32.
    pub(crate) fn name(self) -> &'static str {
        if !(self.fused && simd::has_avx2_fma()) {
            "blocked"
        } else if self.wide && simd::has_avx512() {
            "fused-avx512"
        } else {
            "fused-avx2"
        }
    }
}
