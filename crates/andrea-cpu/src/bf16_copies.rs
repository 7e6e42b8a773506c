//! BF16 copies of weights, for products in BF16 precision that stream them at half the
//! bytes (`andrea_core::MemoryOps::keep_bf16_weights`).
//!
//! A copy is found by address: a product whose `B` lies inside a kept range of FP32
//! elements reads the copy's elements at the same offset. A copy holds exactly
//! `round_bf16` of its source (the rounding of `MemoryOps::to_bf16`), so reading it or
//! rounding the source on the fly gives the same operand, bit for bit: a copy that is
//! missing costs bytes, never a different result. A stale one would, so every op that
//! may write parameters (`upload`, `fill`, `copy`, `to_f32`, `adamw`, a host collective
//! through `with_host_elements`) drops the copies its output overlaps first; the
//! products, row ops and the rest of training's ops write activations and gradients.
//!
//! Copies are immutable once made and shared (`Arc`): a product holds its copy while it
//! runs, whatever another thread keeps or drops meanwhile.

use std::sync::{Arc, Mutex};

use andrea_core::bf16;

/// The kept copies, at most a few (one per model on this backend).
#[derive(Default)]
pub(crate) struct Bf16Copies(Mutex<Vec<Kept>>);

struct Kept {
    /// Address of the first FP32 element of the source.
    start: usize,
    /// Source elements.
    len: usize,
    data: Arc<[bf16]>,
}

/// A product's view of a copy: the copy and the element where its `B` starts.
pub(crate) struct Bf16Weights {
    data: Arc<[bf16]>,
    offset: usize,
}

impl Bf16Weights {
    /// The copy from `B`'s first element on.
    pub(crate) fn slice(&self) -> &[bf16] {
        &self.data[self.offset..]
    }
}

impl Bf16Copies {
    /// Keeps a copy of `src` (replacing any other copy it overlaps). A copy of exactly
    /// `src` that is still kept is current (writes drop copies) and stays.
    pub(crate) fn keep(&self, src: &[f32]) {
        let same = |k: &Kept| k.start == src.as_ptr() as usize && k.len == src.len();
        if self
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .any(same)
        {
            return;
        }
        let mut data: Arc<[bf16]> = Arc::from(vec![bf16::ZERO; src.len()]);
        let dst = Arc::get_mut(&mut data).expect("a new Arc has one owner");
        crate::elementwise::convert::to_bf16(src, dst);
        self.forget(src.as_ptr(), src.len());
        let start = src.as_ptr() as usize;
        let mut kept = self.0.lock().unwrap_or_else(|e| e.into_inner());
        kept.push(Kept {
            start,
            len: src.len(),
            data,
        });
    }

    /// Drops every copy whose source overlaps the `len` elements from `ptr`.
    pub(crate) fn forget(&self, ptr: *const f32, len: usize) {
        let mut kept = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if kept.is_empty() {
            return;
        }
        let (start, end) = (ptr as usize, ptr as usize + 4 * len);
        kept.retain(|k| end <= k.start || k.start + 4 * k.len <= start);
    }

    /// The copy of the `extent` elements from `ptr`, if one is kept whole.
    pub(crate) fn find(&self, ptr: *const f32, extent: usize) -> Option<Bf16Weights> {
        let kept = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let at = ptr as usize;
        kept.iter().find_map(|k| {
            let offset = at.checked_sub(k.start)? / 4;
            (at % 4 == k.start % 4 && offset + extent <= k.len).then(|| Bf16Weights {
                data: Arc::clone(&k.data),
                offset,
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A copy is found for any range inside its source, not past it, and is gone once an
    /// overlapping write forgets it.
    #[test]
    fn copies_are_found_inside_their_source_and_forgotten_on_overlap() {
        let src: Vec<f32> = (0..100).map(|i| i as f32 + 0.3).collect();
        let copies = Bf16Copies::default();
        copies.keep(&src[10..90]);
        let p = src.as_ptr();
        // SAFETY: offsets inside `src`.
        let at = |i: usize| unsafe { p.add(i) };
        let w = copies.find(at(20), 70).expect("inside");
        assert_eq!(w.slice()[0], bf16::from_f32(src[20]));
        assert!(copies.find(at(20), 71).is_none(), "past the end");
        assert!(copies.find(at(5), 10).is_none(), "before the start");
        copies.forget(at(0), 11);
        assert!(copies.find(at(20), 10).is_none(), "forgotten");
        // The product that held it keeps its elements.
        assert_eq!(w.slice()[1], bf16::from_f32(src[21]));
    }
}
