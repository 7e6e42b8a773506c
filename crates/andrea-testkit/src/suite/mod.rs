//! The conformance suite: one generic function per op, `fn op<B: Backend>(&B, &Config)
//! -> Result<(), TestCaseError>`.
//!
//! Each function draws cases with proptest (shapes, layouts, flags and a
//! seed for the values, see [`crate::random`]), uploads the inputs with
//! `alloc`/`upload`, runs the op, downloads every buffer it may write and compares it,
//! *including the elements around the output view* (which must be untouched), with the
//! f64 reference under the op's tolerance from [`crate::tol`]. In-place variants and the
//! `accumulate` paths are drawn like any other flag. A failure reports the op, the
//! output, the worst element and the (shrunk) case.
//!
//! Besides the per-op functions: [`determinism`] (the same inputs twice give
//! bit-identical outputs), and `bad_input_*` groups: calls with a shape mismatch, a
//! zero-sized dimension, a view past its buffer, overlapping outputs and bad values,
//! each of which must return an error that names the op, never panic.
//!
//! The functions never rely on panics: a backend that panics is caught and reported as
//! an error. To add a function, define and export it here and add its name to the list
//! behind [`crate::conformance_suite!`]; a test fails until both agree.

mod attention;
mod bad_input;
mod decode;
mod determinism;
mod elementwise;
mod embedding;
mod layernorm;
mod linalg;
mod loss;
mod memory;
mod optim;
mod softmax;

pub use attention::{attention_backward, attention_forward, attention_generation};
pub use bad_input::{
    bad_input_attention, bad_input_elementwise, bad_input_embedding, bad_input_layernorm,
    bad_input_linalg, bad_input_loss, bad_input_memory, bad_input_optim, bad_input_softmax,
};
pub use decode::{decode_attention, decode_blocks, mlp_forward};
pub use determinism::determinism;
pub use elementwise::{add, gelu, gelu_backward, scale};
pub use embedding::{embedding, embedding_backward};
pub use layernorm::{layernorm, layernorm_backward, residual_layernorm};
pub use linalg::{bias_backward, copy, linear_gelu, matmul, matmul_gelu_backward};
pub use loss::softmax_cross_entropy;
pub use memory::{bf16_conversion, memory};
pub use optim::{adamw, adamw_scaled, clip_scale, sum_squares};
pub use softmax::{softmax, softmax_backward};

use std::fmt::Debug;

crate::__suite_functions!(__suite_names!());

use andrea_core::{Backend, Tensor, View};
use proptest::prelude::*;
use proptest::test_runner::{Config as ProptestConfig, TestError, TestRunner};

use crate::Tol;

/// How much of the suite to run, and what arithmetic to expect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Proptest cases per op.
    pub cases: u32,
    /// The operand format of the backend's attention products. Only the attention
    /// functions read it: with TF32 or BF16 operands they draw the head sizes tensor-core
    /// kernels take (32, 64, 128) and add the per-element bound of
    /// [`crate::tol::operands`] to the FP32 tolerances. Default [`Operands::Fp32`].
    pub operands: Operands,
}

/// The operand format a backend's attention products round to (accumulation is FP32):
/// `Fp32` keeps the suite's FP32 tolerances and every head size; `Tf32` and `Bf16` are
/// tensor-core formats (10- and 7-bit mantissas).
pub type Operands = andrea_core::MatmulPrecision;

impl Config {
    /// Cases per op unless `PROPTEST_CASES` says otherwise.
    pub const DEFAULT_CASES: u32 = 32;

    /// [`Config::DEFAULT_CASES`], or `PROPTEST_CASES` when it is set.
    pub fn from_env() -> Self {
        let cases = match std::env::var_os("PROPTEST_CASES") {
            // proptest's default config has already parsed (and warned about) it.
            Some(_) => ProptestConfig::default().cases,
            None => Self::DEFAULT_CASES,
        };
        Config {
            cases,
            operands: Operands::Fp32,
        }
    }

    /// A config with `cases` cases per op.
    pub fn with_cases(cases: u32) -> Self {
        Config {
            cases,
            operands: Operands::Fp32,
        }
    }

    /// This config for a backend whose attention products round operands to `operands`.
    pub fn with_operands(self, operands: Operands) -> Self {
        Config { operands, ..self }
    }

    fn proptest(&self) -> ProptestConfig {
        let base = ProptestConfig::default();
        let max_shrink_iters = match std::env::var_os("PROPTEST_MAX_SHRINK_ITERS") {
            Some(_) => base.max_shrink_iters,
            None => 256,
        };
        ProptestConfig {
            cases: self.cases,
            max_shrink_iters,
            // The suite runs from other crates' tests: no regression files there.
            failure_persistence: None,
            ..base
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Config::from_env()
    }
}

/// The result of one case, and of one suite function.
pub(crate) type Case = Result<(), TestCaseError>;

/// Runs `test` on `cfg.cases` cases drawn from `strategy`; on failure, the message holds
/// the reason and the shrunk case.
pub(crate) fn run<S>(cfg: &Config, name: &str, strategy: S, test: impl Fn(S::Value) -> Case) -> Case
where
    S: Strategy,
    S::Value: Debug,
{
    let mut runner = TestRunner::new(cfg.proptest());
    runner.run(&strategy, test).map_err(|e| match e {
        TestError::Fail(reason, case) => TestCaseError::fail(format!(
            "{}\n    minimal failing case of {name}: {case:?}",
            reason.message()
        )),
        TestError::Abort(reason) => TestCaseError::fail(format!("{name}: aborted: {reason}")),
    })
}

pub(crate) fn fail(msg: impl Into<String>) -> TestCaseError {
    TestCaseError::fail(msg.into())
}

/// Turns a backend error on valid input into a case failure naming the call.
pub(crate) trait OrFail<T> {
    fn or_fail(self, call: &str) -> Result<T, TestCaseError>;
}

impl<T> OrFail<T> for andrea_core::Result<T> {
    fn or_fail(self, call: &str) -> Result<T, TestCaseError> {
        self.map_err(|e| fail(format!("{call} failed on valid input: {e}")))
    }
}

/// A buffer holding `data`.
pub(crate) fn buffer<B: Backend>(be: &B, data: &[f32]) -> Result<B::Buffer, TestCaseError> {
    let buf = be.alloc(data.len()).or_fail("alloc")?;
    if !data.is_empty() {
        be.upload(data, View::whole(&buf)).or_fail("upload")?;
    }
    Ok(buf)
}

/// A token-id buffer holding `ids`.
pub(crate) fn id_buffer<B: Backend>(be: &B, ids: &[u32]) -> Result<B::IdBuffer, TestCaseError> {
    let buf = be.alloc_ids(ids.len()).or_fail("alloc_ids")?;
    be.upload_ids(ids, View::whole(&buf))
        .or_fail("upload_ids")?;
    Ok(buf)
}

/// The contents of a view.
pub(crate) fn read<B: Backend>(be: &B, t: Tensor<'_, B>) -> Result<Vec<f32>, TestCaseError> {
    let mut host = vec![0.0; t.numel()];
    be.download(t, &mut host).or_fail("download")?;
    Ok(host)
}

/// The whole contents of a buffer.
pub(crate) fn read_all<B: Backend>(be: &B, buf: &B::Buffer) -> Result<Vec<f32>, TestCaseError> {
    read(be, View::whole(buf))
}

/// Compares with the reference under `tol`.
pub(crate) fn close(tol: Tol, name: &str, got: &[f32], want: &[f64]) -> Case {
    tol.check(name, got, want).map_err(fail)
}

/// Compares with the reference under `tol` plus `extra[i]` for element i.
pub(crate) fn close_plus(tol: Tol, extra: &[f64], name: &str, got: &[f32], want: &[f64]) -> Case {
    tol.check_plus(name, got, want, extra).map_err(fail)
}

pub(crate) use crate::reference::to_f64;

/// A size for a dimension of at most `hi`: often 1 or small, often anything up to `hi`
/// (so rarely a multiple of a tile or vector width).
pub(crate) fn size(hi: usize) -> BoxedStrategy<usize> {
    prop_oneof![
        1 => Just(1usize),
        3 => 1..=hi.min(9),
        4 => 1..=hi,
    ]
    .boxed()
}

/// As [`size`], and one time in nine a size in `hi+1..=big` (past the block sizes and
/// parallel thresholds a backend may have).
pub(crate) fn size_or_big(hi: usize, big: usize) -> BoxedStrategy<usize> {
    prop_oneof![8 => size(hi), 1 => hi + 1..=big].boxed()
}

/// A random shape of rank 1 to 3 with at most `max_numel` elements, or (one time in
/// ten) a long 1-D one of up to `20·max_numel`, to reach a backend's parallel paths.
pub(crate) fn shape(max_numel: usize) -> BoxedStrategy<Vec<usize>> {
    let small = prop::collection::vec(size(40), 1..=3).prop_filter("too many elements", move |d| {
        d.iter().product::<usize>() <= max_numel
    });
    prop_oneof![9 => small, 1 => (max_numel..=20 * max_numel).prop_map(|n| vec![n])].boxed()
}

/// A view at `offset` of `dims` in `buf`.
pub(crate) fn view<'a, M: andrea_core::DeviceMemory>(
    buf: &'a M,
    offset: usize,
    dims: &[usize],
) -> View<'a, M> {
    View::new(buf, offset, dims)
}

#[cfg(test)]
mod list_tests {
    /// The names this module exports (its `pub use` lines), from its source.
    fn exported() -> Vec<String> {
        let src = include_str!("mod.rs");
        let mut names = Vec::new();
        for stmt in src.split("pub use ").skip(1) {
            let stmt = &stmt[..stmt.find(';').unwrap_or(stmt.len())];
            let Some((module, items)) = stmt.split_once("::") else {
                continue;
            };
            if module.contains(char::is_whitespace) || module.starts_with('"') {
                continue;
            }
            let items = items.trim().trim_start_matches('{').trim_end_matches('}');
            names.extend(
                items
                    .split(',')
                    .map(str::trim)
                    .filter(|n| !n.is_empty())
                    .map(String::from),
            );
        }
        names.sort();
        names
    }

    /// Every exported suite function is in the list the macro stamps out, and only they.
    #[test]
    fn the_macro_list_is_the_module_exports() {
        let mut listed: Vec<String> = super::NAMES.iter().map(|s| s.to_string()).collect();
        listed.sort();
        let exported = exported();
        assert!(exported.len() > 20, "parsed {exported:?}");
        assert_eq!(
            listed, exported,
            "the list in conformance_suite! and suite's exports differ"
        );
    }
}
