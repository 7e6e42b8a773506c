//! Activation arenas: one buffer per role, cut into aligned regions once, up front, so
//! that a step allocates nothing.

use andrea_core::{DeviceMemory, View};

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
