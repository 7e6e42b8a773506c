//! Bad input: every call here is invalid in exactly one way (a shape mismatch, a
//! zero-sized dimension, a view past its buffer, overlapping outputs, a bad value) and
//! must return an error whose message names the op, without panicking. Each group first
//! makes the valid call it perturbs, so an error is known to come from the one bad
//! argument. A group reports every failure at once.

mod attention;
mod linalg;
mod sequence;

pub use attention::bad_input_attention;
pub use linalg::{bad_input_layernorm, bad_input_linalg};
pub use sequence::{bad_input_embedding, bad_input_loss, bad_input_softmax};

use std::panic::{catch_unwind, AssertUnwindSafe};

use andrea_core::{AdamWStep, Backend, View};
use proptest::test_runner::TestCaseError;

use super::{buffer, fail, id_buffer, Case, Config};

/// Collects the outcome of bad calls.
pub(crate) struct Expect {
    group: &'static str,
    failures: Vec<String>,
}

impl Expect {
    pub fn new(group: &'static str) -> Self {
        Expect {
            group,
            failures: Vec::new(),
        }
    }

    /// `call` must return an error naming one of `ops` (a fused op's error may come
    /// from the op it is built from).
    pub fn err(
        &mut self,
        ops: &[&str],
        what: &str,
        call: impl FnOnce() -> andrea_core::Result<()>,
    ) {
        match catch_unwind(AssertUnwindSafe(call)) {
            Ok(Ok(())) => self
                .failures
                .push(format!("{what}: accepted; expected an error")),
            Ok(Err(e)) => {
                let msg = e.to_string();
                if !ops.iter().any(|op| names(&msg, op)) {
                    self.failures
                        .push(format!("{what}: the error does not name {ops:?}: {msg}"));
                }
            }
            Err(panic) => self.failures.push(format!(
                "{what}: panicked ({}); expected an error",
                panic_message(&panic)
            )),
        }
    }

    /// `call` is valid and must succeed.
    pub fn ok(&mut self, what: &str, call: impl FnOnce() -> andrea_core::Result<()>) {
        match catch_unwind(AssertUnwindSafe(call)) {
            Ok(Ok(())) => {}
            Ok(Err(e)) => self
                .failures
                .push(format!("{what} (valid): returned an error: {e}")),
            Err(panic) => self.failures.push(format!(
                "{what} (valid): panicked ({})",
                panic_message(&panic)
            )),
        }
    }

    pub fn finish(self) -> Case {
        if self.failures.is_empty() {
            return Ok(());
        }
        Err(fail(format!(
            "{}: {} bad-input checks failed:\n    {}",
            self.group,
            self.failures.len(),
            self.failures.join("\n    ")
        )))
    }
}

/// Whether `msg` contains `op` as a whole word (`softmax` is not named by
/// `softmax_backward: ...`).
fn names(msg: &str, op: &str) -> bool {
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    msg.match_indices(op).any(|(i, _)| {
        let before = msg[..i].chars().next_back().is_none_or(|c| !ident(c));
        let after = msg[i + op.len()..].chars().next().is_none_or(|c| !ident(c));
        before && after
    })
}

fn panic_message(p: &Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "non-string panic".into())
}

/// A buffer of `len` elements `0.5` (valid values for any op here).
pub(crate) fn filled<B: Backend>(be: &B, len: usize) -> Result<B::Buffer, TestCaseError> {
    buffer(be, &vec![0.5; len])
}

/// alloc, upload, download, upload_ids, fill.
pub fn bad_input_memory<B: Backend>(be: &B, _cfg: &Config) -> Case {
    let mut x = Expect::new("bad_input_memory");
    let buf = filled(be, 8)?;
    let ids = id_buffer(be, &[0; 8])?;
    let up = &["upload"];
    x.ok("upload", || be.upload(&[1.0; 4], View::new(&buf, 4, [4])));
    x.err(up, "upload: 3 host values into a view of 4", || {
        be.upload(&[1.0; 3], View::new(&buf, 0, [4]))
    });
    x.err(up, "upload: view past the buffer end", || {
        be.upload(&[1.0; 4], View::new(&buf, 5, [4]))
    });
    x.err(up, "upload: zero-sized view", || {
        be.upload(&[], View::new(&buf, 0, [0]))
    });
    let down = &["download"];
    x.err(down, "download: host slice of 3 for a view of 4", || {
        be.download(View::new(&buf, 0, [4]), &mut [0.0; 3])
    });
    x.err(down, "download: view past the buffer end", || {
        be.download(View::new(&buf, 6, [4]), &mut [0.0; 4])
    });
    x.err(down, "download: offset overflow", || {
        be.download(View::new(&buf, usize::MAX, [2]), &mut [0.0; 2])
    });
    let up_ids = &["upload_ids"];
    x.err(up_ids, "upload_ids: 2 ids into a view of 3", || {
        be.upload_ids(&[1, 2], View::new(&ids, 0, [3]))
    });
    x.err(up_ids, "upload_ids: view past the buffer end", || {
        be.upload_ids(&[1; 4], View::new(&ids, 6, [4]))
    });
    x.err(&["fill"], "fill: view past the buffer end", || {
        be.fill(View::new(&buf, 1, [8]), 1.0)
    });
    x.err(&["fill"], "fill: zero-sized view", || {
        be.fill(View::new(&buf, 0, [2, 0]), 1.0)
    });
    x.finish()
}

/// add, scale, gelu, gelu_backward.
pub fn bad_input_elementwise<B: Backend>(be: &B, _cfg: &Config) -> Case {
    let mut x = Expect::new("bad_input_elementwise");
    let (a, b, o) = (filled(be, 12)?, filled(be, 12)?, filled(be, 12)?);
    let v = |buf, off, d: &[usize]| super::view(buf, off, d);
    x.ok("add", || {
        be.add(v(&a, 0, &[2, 3]), v(&b, 0, &[2, 3]), v(&o, 0, &[2, 3]))
    });
    x.ok("add in place", || {
        be.add(v(&a, 0, &[2, 3]), v(&b, 0, &[2, 3]), v(&a, 0, &[2, 3]))
    });
    x.err(&["add"], "add: b [3, 2] for a [2, 3]", || {
        be.add(v(&a, 0, &[2, 3]), v(&b, 0, &[3, 2]), v(&o, 0, &[2, 3]))
    });
    x.err(&["add"], "add: out [6] for a [2, 3]", || {
        be.add(v(&a, 0, &[2, 3]), v(&b, 0, &[2, 3]), v(&o, 0, &[6]))
    });
    x.err(&["add"], "add: zero-sized", || {
        be.add(v(&a, 0, &[0, 3]), v(&b, 0, &[0, 3]), v(&o, 0, &[0, 3]))
    });
    x.err(&["add"], "add: b past the buffer end", || {
        be.add(v(&a, 0, &[2, 3]), v(&b, 7, &[2, 3]), v(&o, 0, &[2, 3]))
    });
    x.err(&["add"], "add: out overlaps a by all but one", || {
        be.add(v(&a, 0, &[2, 3]), v(&b, 0, &[2, 3]), v(&a, 1, &[2, 3]))
    });
    x.err(&["scale"], "scale: zero-sized", || {
        be.scale(v(&a, 0, &[0]), 2.0)
    });
    x.err(&["scale"], "scale: past the buffer end", || {
        be.scale(v(&a, 10, &[3]), 2.0)
    });
    x.ok("gelu", || be.gelu(v(&a, 0, &[4]), v(&o, 0, &[4])));
    x.err(&["gelu"], "gelu: out [5] for x [4]", || {
        be.gelu(v(&a, 0, &[4]), v(&o, 0, &[5]))
    });
    x.err(&["gelu"], "gelu: out overlaps x", || {
        be.gelu(v(&a, 0, &[4]), v(&a, 2, &[4]))
    });
    x.err(&["gelu"], "gelu: x past the buffer end", || {
        be.gelu(v(&a, 9, &[4]), v(&o, 0, &[4]))
    });
    let gb = &["gelu_backward"];
    x.ok("gelu_backward", || {
        be.gelu_backward(v(&a, 0, &[4]), v(&b, 0, &[4]), v(&o, 0, &[4]))
    });
    x.err(gb, "gelu_backward: dout [3] for x [4]", || {
        be.gelu_backward(v(&a, 0, &[4]), v(&b, 0, &[3]), v(&o, 0, &[4]))
    });
    x.err(gb, "gelu_backward: dx overlaps dout", || {
        be.gelu_backward(v(&a, 0, &[4]), v(&b, 0, &[4]), v(&b, 1, &[4]))
    });
    x.finish()
}

/// sum_squares, adamw, clip_scale, adamw_scaled.
pub fn bad_input_optim<B: Backend>(be: &B, _cfg: &Config) -> Case {
    let mut x = Expect::new("bad_input_optim");
    let (p, g, mv) = (filled(be, 8)?, filled(be, 8)?, filled(be, 16)?);
    let v = |buf, off, n: usize| View::new(buf, off, [n]);
    x.err(&["sum_squares"], "sum_squares: zero-sized", || {
        be.sum_squares(v(&p, 0, 0)).map(drop)
    });
    x.err(&["sum_squares"], "sum_squares: past the buffer end", || {
        be.sum_squares(v(&p, 4, 5)).map(drop)
    });
    let step = AdamWStep {
        lr: 1e-3,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.1,
        step: 1,
        grad_scale: 1.0,
    };
    let adam = |s: AdamWStep, g_len: usize, m_at: usize, v_at: usize| {
        be.adamw(
            v(&p, 0, 8),
            v(&g, 0, g_len),
            v(&mv, m_at, 8),
            v(&mv, v_at, 8),
            &s,
        )
    };
    let op = &["adamw"];
    x.ok("adamw", || adam(step, 8, 0, 8));
    x.err(op, "adamw: step 0", || {
        adam(AdamWStep { step: 0, ..step }, 8, 0, 8)
    });
    x.err(op, "adamw: beta1 = 1", || {
        adam(AdamWStep { beta1: 1.0, ..step }, 8, 0, 8)
    });
    x.err(op, "adamw: beta2 < 0", || {
        adam(
            AdamWStep {
                beta2: -0.1,
                ..step
            },
            8,
            0,
            8,
        )
    });
    x.err(op, "adamw: eps = 0", || {
        adam(AdamWStep { eps: 0.0, ..step }, 8, 0, 8)
    });
    x.err(op, "adamw: lr NaN", || {
        adam(
            AdamWStep {
                lr: f32::NAN,
                ..step
            },
            8,
            0,
            8,
        )
    });
    x.err(op, "adamw: grad of 7 for 8 parameters", || {
        adam(step, 7, 0, 8)
    });
    x.err(op, "adamw: m overlaps v", || adam(step, 8, 0, 4));
    x.err(op, "adamw: v past the buffer end", || adam(step, 8, 0, 9));
    x.err(op, "adamw: param is grad", || {
        be.adamw(v(&p, 0, 8), v(&p, 0, 8), v(&mv, 0, 8), v(&mv, 8, 8), &step)
    });
    let out = filled(be, 4)?;
    let clip = |max: Option<f32>, mean: f64, o_at: usize, o_len: usize| {
        be.clip_scale(
            v(&g, 0, 8),
            mean,
            max,
            Some(v(&p, 0, 8)),
            v(&out, o_at, o_len),
        )
    };
    let op = &["clip_scale"];
    x.ok("clip_scale", || clip(Some(1.0), 0.5, 0, 3));
    x.err(op, "clip_scale: out of 2", || clip(None, 1.0, 0, 2));
    x.err(op, "clip_scale: out past the end", || clip(None, 1.0, 2, 3));
    x.err(op, "clip_scale: mean 0", || clip(None, 0.0, 0, 3));
    x.err(op, "clip_scale: max_norm NaN", || {
        clip(Some(f32::NAN), 1.0, 0, 3)
    });
    x.err(op, "clip_scale: max_norm 0", || clip(Some(0.0), 1.0, 0, 3));
    x.err(op, "clip_scale: out is the gradient", || {
        be.clip_scale(v(&g, 0, 8), 1.0, None, None, v(&g, 0, 3))
    });
    x.err(op, "clip_scale: out overlaps the guard", || {
        be.clip_scale(v(&g, 0, 8), 1.0, None, Some(v(&out, 0, 2)), v(&out, 1, 3))
    });
    let scaled = |s: AdamWStep, s_buf, s_at: usize| {
        be.adamw_scaled(
            v(&p, 0, 8),
            v(&g, 0, 8),
            v(&mv, 0, 8),
            v(&mv, 8, 8),
            &s,
            v(s_buf, s_at, 1),
        )
    };
    x.ok("adamw_scaled", || scaled(step, &out, 0));
    x.err(&["adamw_scaled"], "adamw_scaled: grad_scale 0.5", || {
        scaled(
            AdamWStep {
                grad_scale: 0.5,
                ..step
            },
            &out,
            0,
        )
    });
    x.err(
        &["adamw_scaled"],
        "adamw_scaled: scale past the end",
        || scaled(step, &out, 4),
    );
    x.err(&["adamw_scaled"], "adamw_scaled: scale inside m", || {
        scaled(step, &mv, 3)
    });
    x.err(&["adamw"], "adamw_scaled: step 0", || {
        scaled(AdamWStep { step: 0, ..step }, &out, 0)
    });
    x.finish()
}
