//! Default implementations of the coarse ops, written with the fine ops only.
//!
//! They are correct on any backend and are what a backend falls back to; a backend
//! overrides the trait method with a fused kernel when that is faster. They are free
//! functions so an override can still call them (for shapes it does not specialise),
//! and a test can compare a fused kernel with them. Each lives beside its op family
//! (`crate::ops::<family>::fused`); this module gathers them.

pub use crate::ops::attention::fused::*;
pub use crate::ops::decode::fused::*;
pub use crate::ops::layernorm::fused::*;
pub use crate::ops::linalg::fused::*;
