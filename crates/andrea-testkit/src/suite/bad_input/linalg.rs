//! Bad input for matmul, bias_backward, copy, linear_gelu, mlp_forward,
//! matmul_gelu_backward and the LayerNorm ops.

use andrea_core::{Backend, LinearParams, Matrix, View};

use super::{filled, Expect};
use crate::suite::{Case, Config};

/// A row-major `[rows, cols]` matrix at `offset`.
fn mat<M>(buf: &M, offset: usize, rows: usize, cols: usize) -> Matrix<'_, M> {
    Matrix {
        buf,
        offset,
        batch: 1,
        rows,
        cols,
        batch_stride: 0,
        row_stride: cols,
        col_stride: 1,
    }
}

/// matmul, bias_backward, copy, linear_gelu, matmul_gelu_backward.
pub fn bad_input_linalg<B: Backend>(be: &B, _cfg: &Config) -> Case {
    let mut x = Expect::new("bad_input_linalg");
    let (a, b, c, bias) = (
        filled(be, 40)?,
        filled(be, 40)?,
        filled(be, 40)?,
        filled(be, 8)?,
    );
    let op = &["matmul"];
    let bias4 = Some(View::new(&bias, 0, [4]));
    x.ok("matmul", || {
        be.matmul(mat(&a, 0, 2, 3), mat(&b, 0, 3, 4), bias4, mat(&c, 0, 2, 4))
    });
    x.ok("matmul, batched", || {
        be.matmul_add(
            mat(&a, 0, 2, 3).batched(3, 6),
            mat(&b, 0, 3, 4),
            None,
            mat(&c, 0, 2, 4).batched(3, 8),
        )
    });
    x.err(op, "matmul: inner dimension 3 vs 4", || {
        be.matmul(mat(&a, 0, 2, 3), mat(&b, 0, 4, 4), None, mat(&c, 0, 2, 4))
    });
    x.err(op, "matmul: c has 3 rows, a has 2", || {
        be.matmul(mat(&a, 0, 2, 3), mat(&b, 0, 3, 4), None, mat(&c, 0, 3, 4))
    });
    x.err(op, "matmul: c has 5 columns, b has 4", || {
        be.matmul(mat(&a, 0, 2, 3), mat(&b, 0, 3, 4), None, mat(&c, 0, 2, 5))
    });
    x.err(op, "matmul: zero rows", || {
        be.matmul(mat(&a, 0, 0, 3), mat(&b, 0, 3, 4), None, mat(&c, 0, 0, 4))
    });
    x.err(op, "matmul: zero inner dimension", || {
        be.matmul(mat(&a, 0, 2, 0), mat(&b, 0, 0, 4), None, mat(&c, 0, 2, 4))
    });
    x.err(op, "matmul: a past the buffer end", || {
        be.matmul(mat(&a, 36, 2, 3), mat(&b, 0, 3, 4), None, mat(&c, 0, 2, 4))
    });
    x.err(op, "matmul: b (transposed) past the buffer end", || {
        be.matmul(
            mat(&a, 0, 2, 3),
            mat(&b, 30, 4, 3).t(),
            None,
            mat(&c, 0, 2, 4),
        )
    });
    x.err(op, "matmul: c overlaps a", || {
        be.matmul(mat(&a, 0, 2, 3), mat(&b, 0, 3, 4), None, mat(&a, 4, 2, 4))
    });
    x.err(op, "matmul: c overlaps b", || {
        be.matmul(mat(&a, 0, 2, 3), mat(&b, 0, 3, 4), None, mat(&b, 0, 2, 4))
    });
    x.err(op, "matmul: c rows alias (row stride 0)", || {
        let c0 = Matrix {
            row_stride: 0,
            ..mat(&c, 0, 2, 4)
        };
        be.matmul(mat(&a, 0, 2, 3), mat(&b, 0, 3, 4), None, c0)
    });
    x.err(op, "matmul: bias of 3 for 4 columns", || {
        be.matmul(
            mat(&a, 0, 2, 3),
            mat(&b, 0, 3, 4),
            Some(View::new(&bias, 0, [3])),
            mat(&c, 0, 2, 4),
        )
    });
    x.err(op, "matmul: a batch 2, c batch 3", || {
        be.matmul(
            mat(&a, 0, 2, 3).batched(2, 6),
            mat(&b, 0, 3, 4),
            None,
            mat(&c, 0, 2, 4).batched(3, 8),
        )
    });
    x.err(op, "matmul: c overlaps bias", || {
        be.matmul(
            mat(&a, 0, 1, 3),
            mat(&b, 0, 3, 4),
            Some(View::new(&c, 0, [4])),
            mat(&c, 2, 1, 4),
        )
    });

    let op = &["bias_backward"];
    x.ok("bias_backward", || {
        be.bias_backward(View::new(&a, 0, [5, 4]), View::new(&bias, 0, [4]))
    });
    x.err(op, "bias_backward: dbias of 5 for 4 columns", || {
        be.bias_backward(View::new(&a, 0, [5, 4]), View::new(&bias, 0, [5]))
    });
    x.err(op, "bias_backward: dout past the buffer end", || {
        be.bias_backward(View::new(&a, 0, [11, 4]), View::new(&bias, 0, [4]))
    });
    x.err(op, "bias_backward: dbias overlaps dout", || {
        be.bias_backward(View::new(&a, 0, [5, 4]), View::new(&a, 16, [4]))
    });
    x.err(op, "bias_backward: zero-sized dout", || {
        be.bias_backward(View::new(&a, 0, [0, 4]), View::new(&bias, 0, [4]))
    });

    let op = &["copy"];
    x.ok("copy", || be.copy(mat(&a, 0, 2, 3), mat(&c, 0, 3, 2).t()));
    x.err(op, "copy: [2, 3] into [3, 2]", || {
        be.copy(mat(&a, 0, 2, 3), mat(&c, 0, 3, 2))
    });
    x.err(op, "copy: dst overlaps src", || {
        be.copy(mat(&a, 0, 2, 3), mat(&a, 3, 2, 3))
    });
    x.err(op, "copy: dst rows alias", || {
        be.copy(
            mat(&a, 0, 2, 3),
            Matrix {
                row_stride: 1,
                ..mat(&c, 0, 2, 3)
            },
        )
    });
    x.err(op, "copy: src past the buffer end", || {
        be.copy(mat(&a, 35, 2, 3), mat(&c, 0, 2, 3))
    });

    let ops = &["linear_gelu", "matmul", "gelu"];
    let (pre, out) = (View::new(&c, 0, [2, 4]), View::new(&c, 8, [2, 4]));
    x.ok("linear_gelu", || {
        be.linear_gelu(
            mat(&a, 0, 2, 3),
            mat(&b, 0, 3, 4),
            View::new(&bias, 0, [4]),
            pre,
            out,
        )
    });
    x.err(ops, "linear_gelu: pre [2, 5] for x·w [2, 4]", || {
        be.linear_gelu(
            mat(&a, 0, 2, 3),
            mat(&b, 0, 3, 4),
            View::new(&bias, 0, [4]),
            View::new(&c, 0, [2, 5]),
            out,
        )
    });
    x.err(ops, "linear_gelu: out [3, 4] for pre [2, 4]", || {
        be.linear_gelu(
            mat(&a, 0, 2, 3),
            mat(&b, 0, 3, 4),
            View::new(&bias, 0, [4]),
            pre,
            View::new(&c, 8, [3, 4]),
        )
    });

    // mlp_forward: x [2, 3] in a; fc [3, 4] in b at 0, its bias bias[0..4]; proj [4, 3]
    // in b at 12, its bias bias[4..7]; pre and act [2, 4] in c at 0 and 8; out [2, 3] in
    // c at 16.
    let ops = &["mlp_forward", "linear_gelu", "matmul"];
    let lin = |off: usize, rows: usize, cols: usize, boff: usize| LinearParams {
        weight: mat(&b, off, rows, cols),
        bias: View::new(&bias, boff, [cols]),
    };
    let (act, out3) = (View::new(&c, 8, [2, 4]), View::new(&c, 16, [2, 3]));
    let xv = View::new(&a, 0, [2, 3]);
    x.ok("mlp_forward", || {
        be.mlp_forward(xv, lin(0, 3, 4, 0), pre, act, lin(12, 4, 3, 4), out3)
    });
    x.err(
        ops,
        "mlp_forward: proj [5, 3] for a hidden width of 4",
        || be.mlp_forward(xv, lin(0, 3, 4, 0), pre, act, lin(12, 5, 3, 4), out3),
    );
    x.err(ops, "mlp_forward: out [2, 4] for x [2, 3]", || {
        be.mlp_forward(
            xv,
            lin(0, 3, 4, 0),
            pre,
            act,
            lin(12, 4, 4, 4),
            View::new(&c, 16, [2, 4]),
        )
    });
    x.err(ops, "mlp_forward: out overlapping act", || {
        be.mlp_forward(
            xv,
            lin(0, 3, 4, 0),
            pre,
            act,
            lin(12, 4, 3, 4),
            View::new(&c, 12, [2, 3]),
        )
    });

    // dy [2, 3] in a, w [3, 4] in b, pre in c at 0, dpre in c at 8.
    let ops = &["matmul_gelu_backward", "matmul"];
    let mgb = |dy: Matrix<'_, B::Buffer>, pre: View<'_, B::Buffer>, dpre: View<'_, B::Buffer>| {
        be.matmul_gelu_backward(dy, mat(&b, 0, 3, 4), pre, dpre)
    };
    x.ok("matmul_gelu_backward", || mgb(mat(&a, 0, 2, 3), pre, out));
    x.err(ops, "matmul_gelu_backward: inner dimension 2 vs 3", || {
        mgb(mat(&a, 0, 3, 2), pre, out)
    });
    x.err(
        ops,
        "matmul_gelu_backward: dpre [2, 5] for dy·w [2, 4]",
        || mgb(mat(&a, 0, 2, 3), pre, View::new(&c, 8, [2, 5])),
    );
    x.err(
        ops,
        "matmul_gelu_backward: pre [3, 4] for dpre [2, 4]",
        || mgb(mat(&a, 0, 2, 3), View::new(&c, 0, [3, 4]), out),
    );
    x.err(ops, "matmul_gelu_backward: dpre is pre", || {
        mgb(mat(&a, 0, 2, 3), pre, pre)
    });
    x.err(ops, "matmul_gelu_backward: dpre overlaps dy", || {
        mgb(mat(&a, 0, 2, 3), pre, View::new(&a, 2, [2, 4]))
    });
    x.err(ops, "matmul_gelu_backward: pre past the buffer end", || {
        mgb(mat(&a, 0, 2, 3), View::new(&c, 36, [2, 4]), out)
    });
    x.finish()
}

/// layernorm, layernorm_backward, residual_layernorm.
pub fn bad_input_layernorm<B: Backend>(be: &B, _cfg: &Config) -> Case {
    let mut x = Expect::new("bad_input_layernorm");
    let (xb, gb, ob, sb) = (
        filled(be, 24)?,
        filled(be, 16)?,
        filled(be, 24)?,
        filled(be, 8)?,
    );
    let v = |buf, off, d: &[usize]| View::new(buf, off, d);
    // x [3, 4]; gamma at 0, beta at 4 (of gb); mean at 0, rstd at 4 (of sb).
    let ln = |xv: View<'_, B::Buffer>, g: usize, o: View<'_, B::Buffer>, m: usize, eps: f32| {
        be.layernorm(
            xv,
            v(&gb, 0, &[g]),
            v(&gb, 4, &[4]),
            o,
            v(&sb, 0, &[m]),
            v(&sb, 4, &[3]),
            eps,
        )
    };
    let op = &["layernorm"];
    x.ok("layernorm", || {
        ln(v(&xb, 0, &[3, 4]), 4, v(&ob, 0, &[3, 4]), 3, 1e-5)
    });
    x.err(op, "layernorm: gamma of 5 for 4 channels", || {
        ln(v(&xb, 0, &[3, 4]), 5, v(&ob, 0, &[3, 4]), 3, 1e-5)
    });
    x.err(op, "layernorm: mean of 2 for 3 rows", || {
        ln(v(&xb, 0, &[3, 4]), 4, v(&ob, 0, &[3, 4]), 2, 1e-5)
    });
    x.err(op, "layernorm: out [4, 3] for x [3, 4]", || {
        ln(v(&xb, 0, &[3, 4]), 4, v(&ob, 0, &[4, 3]), 3, 1e-5)
    });
    x.err(op, "layernorm: eps = 0", || {
        ln(v(&xb, 0, &[3, 4]), 4, v(&ob, 0, &[3, 4]), 3, 0.0)
    });
    x.err(op, "layernorm: eps NaN", || {
        ln(v(&xb, 0, &[3, 4]), 4, v(&ob, 0, &[3, 4]), 3, f32::NAN)
    });
    x.err(op, "layernorm: out is x (not in place)", || {
        ln(v(&xb, 0, &[3, 4]), 4, v(&xb, 0, &[3, 4]), 3, 1e-5)
    });
    x.err(op, "layernorm: x past the buffer end", || {
        ln(v(&xb, 16, &[3, 4]), 4, v(&ob, 0, &[3, 4]), 3, 1e-5)
    });
    x.err(op, "layernorm: zero channels", || {
        ln(v(&xb, 0, &[3, 0]), 0, v(&ob, 0, &[3, 0]), 3, 1e-5)
    });
    x.err(op, "layernorm: rstd overlaps mean", || {
        be.layernorm(
            v(&xb, 0, &[3, 4]),
            v(&gb, 0, &[4]),
            v(&gb, 4, &[4]),
            v(&ob, 0, &[3, 4]),
            v(&sb, 0, &[3]),
            v(&sb, 2, &[3]),
            1e-5,
        )
    });

    let (dx, dp) = (filled(be, 24)?, filled(be, 8)?);
    let op = &["layernorm_backward"];
    let lnb = |dout: View<'_, B::Buffer>, dxv: View<'_, B::Buffer>, dgamma: View<'_, B::Buffer>| {
        be.layernorm_backward(
            v(&xb, 0, &[3, 4]),
            v(&gb, 0, &[4]),
            v(&sb, 0, &[3]),
            v(&sb, 4, &[3]),
            dout,
            dxv,
            dgamma,
            v(&dp, 4, &[4]),
        )
    };
    let (dout, dxv, dgamma) = (v(&ob, 0, &[3, 4]), v(&dx, 0, &[3, 4]), v(&dp, 0, &[4]));
    x.ok("layernorm_backward", || lnb(dout, dxv, dgamma));
    x.err(op, "layernorm_backward: dgamma of 3 for 4 channels", || {
        lnb(dout, dxv, v(&dp, 0, &[3]))
    });
    x.err(op, "layernorm_backward: dx overlaps dout", || {
        lnb(dout, v(&ob, 4, &[3, 4]), dgamma)
    });
    x.err(op, "layernorm_backward: dx is x", || {
        lnb(dout, v(&xb, 0, &[3, 4]), dgamma)
    });
    x.err(op, "layernorm_backward: dout [2, 4] for x [3, 4]", || {
        lnb(v(&ob, 0, &[2, 4]), dxv, dgamma)
    });
    x.err(op, "layernorm_backward: dgamma overlaps dbeta", || {
        lnb(dout, dxv, v(&dp, 2, &[4]))
    });

    let ops = &["residual_layernorm", "add", "layernorm"];
    let rln = |res: View<'_, B::Buffer>| {
        be.residual_layernorm(
            v(&xb, 0, &[3, 4]),
            v(&ob, 0, &[3, 4]),
            res,
            v(&gb, 0, &[4]),
            v(&gb, 4, &[4]),
            v(&dx, 0, &[3, 4]),
            v(&sb, 0, &[3]),
            v(&sb, 4, &[3]),
            1e-5,
        )
    };
    let res = filled(be, 12)?;
    x.ok("residual_layernorm", || rln(v(&res, 0, &[3, 4])));
    x.err(
        ops,
        "residual_layernorm: residual [2, 4] for [3, 4]",
        || rln(v(&res, 0, &[2, 4])),
    );
    x.err(
        ops,
        "residual_layernorm: residual past the buffer end",
        || rln(v(&res, 4, &[3, 4])),
    );
    x.finish()
}
