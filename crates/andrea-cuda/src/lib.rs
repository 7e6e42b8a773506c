//! # andrea-cuda
//!
//! andrea's CUDA backend. Kernels are CUDA C++ in `kernels/*.cu` (one file per op
//! family, each opening with its launch shape and math), compiled to PTX by
//! `cargo xtask build-kernels` and committed under `ptx/`, so this crate never needs nvcc.
//!
//! * Without the `cuda` feature the crate is the launch planning ([`plan`]): grid and
//!   block sizes, shared memory, tile and vector-width choices and the element ranges each
//!   kernel touches, as plain functions with unit tests, plus the PTX table ([`ptx`]) and
//!   the [`Precision`] modes. It builds and tests on any machine.
//! * With `cuda`, `CudaBackend` implements [`andrea_core::Backend`] through `cust` 0.3
//!   (the driver API): one context and one stream, `DeviceBuffer`s as memory, every
//!   launch checked and its error turned into a [`andrea_core::Error`] that names the
//!   kernel. On a machine without CUDA, build against the link stub from
//!   `cargo xtask cuda-stub`; the constructor then returns [`andrea_core::Error::NoDevice`]
//!   and the tests report SKIPPED. `cargo xtask cuda-emu` builds a libcuda that runs the
//!   kernels on the CPU instead, so the same tests exercise the backend and its kernels
//!   without a GPU (`kernels/README.md`).
//!
//! Arguments are validated by `andrea_core::check` before any launch, with the same
//! errors as the CPU backend. Results are deterministic: no float atomics anywhere;
//! every reduction adds in an order fixed by the sizes.

pub mod plan;
pub mod precision;
pub mod ptx;

pub use plan::attention::AttentionKernels;
pub use plan::decode::DecodeAttention;
pub use plan::matmul::{MatmulImpl, MmaStore, MmaTile, SplitK};
pub use precision::{MatmulPrecision, Precision};

#[cfg(feature = "cuda")]
mod device;

#[cfg(feature = "cuda")]
#[doc(hidden)]
pub use device::RawArg;
#[cfg(feature = "cuda")]
pub use device::{CudaBackend, CudaBuffer, CudaIds, ModuleLoad};
