//! Activation arenas: one buffer per role, cut into aligned regions once, up front, so
//! that a step allocates nothing.

use andrea_core::{Backend, DeviceMemory, View};

use crate::block::LayerNormOut;
use crate::layout::ALIGN;

/// An activation of `width` floats per token, at `offset`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Act {
    offset: usize,
    width: usize,
}

impl Act {
    /// The first `n` tokens' rows, `[n, width]`.
    pub fn rows<'a, M: DeviceMemory>(&self, buf: &'a M, n: usize) -> View<'a, M> {
        View::new(buf, self.offset, [n, self.width])
    }

    /// `[b, t, width]`.
    pub fn btc<'a, M: DeviceMemory>(&self, buf: &'a M, b: usize, t: usize) -> View<'a, M> {
        View::new(buf, self.offset, [b, t, self.width])
    }

    /// `[n]` (per-token statistics, losses).
    pub fn flat<'a, M: DeviceMemory>(&self, buf: &'a M, n: usize) -> View<'a, M> {
        View::new(buf, self.offset, [n * self.width])
    }

    pub fn offset(&self) -> usize {
        self.offset
    }
}

/// Hands out aligned regions of one buffer.
#[derive(Debug, Default)]
pub(crate) struct Arena {
    pub len: usize,
}

impl Arena {
    /// `tokens` rows of `width` floats.
    pub fn take(&mut self, tokens: usize, width: usize) -> Act {
        let a = Act {
            offset: self.len,
            width,
        };
        self.len += (tokens * width).max(1).div_ceil(ALIGN) * ALIGN;
        a
    }
}

/// Where a LayerNorm over `width` channels writes: `out: [n, width]`, `mean` and
/// `rstd: [n]`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct NormSlots {
    out: Act,
    mean: Act,
    rstd: Act,
}

impl NormSlots {
    pub fn take(arena: &mut Arena, tokens: usize, width: usize) -> Self {
        NormSlots {
            out: arena.take(tokens, width),
            mean: arena.take(tokens, 1),
            rstd: arena.take(tokens, 1),
        }
    }

    /// The first `n` tokens'.
    pub fn on<'a, B: Backend>(&self, buf: &'a B::Buffer, n: usize) -> LayerNormOut<'a, B> {
        LayerNormOut {
            out: self.out.rows(buf, n),
            mean: self.mean.flat(buf, n),
            rstd: self.rstd.flat(buf, n),
        }
    }
}
