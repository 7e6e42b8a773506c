//! Matrix products on strided host data, the bias gradient, and strided copies.

use andrea_core::Matrix;

/// Where element `(b, i, j)` of a batch of matrices lives in a flat slice: exactly the
/// addressing of [`andrea_core::Matrix`], for host data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    pub offset: usize,
    pub batch: usize,
    pub rows: usize,
    pub cols: usize,
    pub batch_stride: usize,
    pub row_stride: usize,
    pub col_stride: usize,
}

impl Layout {
    /// A dense row-major `[batch, rows, cols]` array at offset 0.
    pub fn dense(batch: usize, rows: usize, cols: usize) -> Self {
        Layout {
            offset: 0,
            batch,
            rows,
            cols,
            batch_stride: rows * cols,
            row_stride: cols,
            col_stride: 1,
        }
    }

    /// The layout of a device matrix.
    pub fn of<M>(m: &Matrix<'_, M>) -> Self {
        Layout {
            offset: m.offset,
            batch: m.batch,
            rows: m.rows,
            cols: m.cols,
            batch_stride: m.batch_stride,
            row_stride: m.row_stride,
            col_stride: m.col_stride,
        }
    }

    /// The same layout as a matrix in `buf`.
    pub fn on<'a, M>(&self, buf: &'a M) -> Matrix<'a, M> {
        Matrix {
            buf,
            offset: self.offset,
            batch: self.batch,
            rows: self.rows,
            cols: self.cols,
            batch_stride: self.batch_stride,
            row_stride: self.row_stride,
            col_stride: self.col_stride,
        }
    }

    /// The transpose (strides swapped).
    pub fn t(&self) -> Self {
        Layout {
            rows: self.cols,
            cols: self.rows,
            row_stride: self.col_stride,
            col_stride: self.row_stride,
            ..*self
        }
    }

    /// Index of element `(b, i, j)`.
    pub fn at(&self, b: usize, i: usize, j: usize) -> usize {
        self.offset + b * self.batch_stride + i * self.row_stride + j * self.col_stride
    }

    /// One past the largest index the layout touches (a slice must be this long).
    pub fn span(&self) -> usize {
        if self.batch == 0 || self.rows == 0 || self.cols == 0 {
            return self.offset;
        }
        self.at(self.batch - 1, self.rows - 1, self.cols - 1) + 1
    }
}

/// `c[b] (+)= a[b]·b[b] (+ bias)` for `a[b]: [M, K]`, `b[b]: [K, N]`, `c[b]: [M, N]`,
/// `bias: [N]`, addressed through their layouts; `a` or `b` with batch 1 is used for
/// every batch entry of `c`. Without `accumulate`, `c`'s old values are ignored.
/// Elements of `c`'s slice outside its layout are left alone.
pub fn matmul(
    a: &[f64],
    la: Layout,
    b: &[f64],
    lb: Layout,
    bias: Option<&[f64]>,
    c: &mut [f64],
    lc: Layout,
    accumulate: bool,
) {
    let (m, k, n) = (lc.rows, la.cols, lc.cols);
    for bt in 0..lc.batch {
        let ba = if la.batch == 1 { 0 } else { bt };
        let bb = if lb.batch == 1 { 0 } else { bt };
        for i in 0..m {
            for j in 0..n {
                let mut sum = bias.map_or(0.0, |bias| bias[j]);
                for p in 0..k {
                    sum += a[la.at(ba, i, p)] * b[lb.at(bb, p, j)];
                }
                let cij = &mut c[lc.at(bt, i, j)];
                *cij = if accumulate { *cij + sum } else { sum };
            }
        }
    }
}

/// `dpre = (dy·w) ⊙ GELU'(pre)` for `dy: [N, K]`, `w: [K, M]` (through their layouts),
/// `pre, dpre: [N, M]` dense: the MLP's gradient from its output through the second
/// linear (`w` its weight transposed) and the GELU.
pub fn matmul_gelu_backward(
    dy: &[f64],
    ldy: Layout,
    w: &[f64],
    lw: Layout,
    pre: &[f64],
    dpre: &mut [f64],
) {
    let (n, m) = (ldy.rows, lw.cols);
    let mut g = vec![0.0; n * m];
    matmul(dy, ldy, w, lw, None, &mut g, Layout::dense(1, n, m), false);
    super::gelu_backward(dpre, pre, &g);
}

/// `dbias[j] += Σ_i dout[i, j]` for `dout: [N, M]`, `dbias: [M]`.
pub fn bias_backward(dbias: &mut [f64], dout: &[f64], n: usize, m: usize) {
    for i in 0..n {
        for j in 0..m {
            dbias[j] += dout[i * m + j];
        }
    }
}

/// `dst[b, i, j] = src[b, i, j]` through two layouts of equal sizes.
pub fn copy(src: &[f64], ls: Layout, dst: &mut [f64], ld: Layout) {
    for b in 0..ls.batch {
        for i in 0..ls.rows {
            for j in 0..ls.cols {
                dst[ld.at(b, i, j)] = src[ls.at(b, i, j)];
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::random::Rand;
    use crate::reference::fd;

    /// The backward pass of `C = A·B + bias` is three calls of the same op:
    /// `dA = dC·Bᵀ`, `dB = Aᵀ·dC` (transposes by layout) and `dbias = colsum(dC)`.
    /// Checked against central differences of `L = Σ dC∘C`.
    #[test]
    fn matmul_gradients_by_transposed_layouts_match_finite_differences() {
        let mut r = Rand::new(1);
        let (m, k, n) = (3, 5, 4);
        let (la, lb, lc) = (
            Layout::dense(1, m, k),
            Layout::dense(1, k, n),
            Layout::dense(1, m, n),
        );
        let a = fd::values(&mut r, m * k, -1.0, 1.0);
        let b = fd::values(&mut r, k * n, -1.0, 1.0);
        let bias = fd::values(&mut r, n, -1.0, 1.0);
        let dc = fd::values(&mut r, m * n, -1.0, 1.0);
        let loss = |a: &[f64], b: &[f64], bias: &[f64]| {
            let mut c = vec![0.0; m * n];
            matmul(a, la, b, lb, Some(bias), &mut c, lc, false);
            fd::dot(&dc, &c)
        };

        let mut da = vec![0.0; m * k];
        matmul(&dc, lc, &b, lb.t(), None, &mut da, la, false);
        fd::assert_grad("dA", &da, &fd::grad(&a, |a| loss(a, &b, &bias)));

        let mut db = vec![0.0; k * n];
        matmul(&a, la.t(), &dc, lc, None, &mut db, lb, false);
        fd::assert_grad("dB", &db, &fd::grad(&b, |b| loss(&a, b, &bias)));

        let mut dbias = vec![0.0; n];
        bias_backward(&mut dbias, &dc, m, n);
        fd::assert_grad("dbias", &dbias, &fd::grad(&bias, |bias| loss(&a, &b, bias)));
    }

    /// `y = GELU(pre)·w2`: `∂(Σ dy∘y)/∂pre = (dy·w2ᵀ) ⊙ GELU'(pre)`.
    #[test]
    fn matmul_gelu_backward_matches_finite_differences() {
        let mut r = Rand::new(2);
        let (n, m, k) = (3, 4, 5);
        let (lh, lw2, ly) = (
            Layout::dense(1, n, m),
            Layout::dense(1, m, k),
            Layout::dense(1, n, k),
        );
        let pre = fd::values(&mut r, n * m, -4.0, 4.0);
        let w2 = fd::values(&mut r, m * k, -1.0, 1.0);
        let dy = fd::values(&mut r, n * k, -1.0, 1.0);
        let loss = |pre: &[f64]| {
            let mut h = vec![0.0; n * m];
            crate::reference::gelu(&mut h, pre);
            let mut y = vec![0.0; n * k];
            matmul(&h, lh, &w2, lw2, None, &mut y, ly, false);
            fd::dot(&dy, &y)
        };
        let mut dpre = vec![0.0; n * m];
        matmul_gelu_backward(&dy, ly, &w2, lw2.t(), &pre, &mut dpre);
        fd::assert_grad("dpre", &dpre, &fd::grad(&pre, loss));
    }

    #[test]
    fn matmul_small_example_and_broadcast() {
        // [[1, 2], [3, 4]] · [[5], [6]] + 1 = [[18], [40]], for two batch entries of c
        // sharing a and b.
        let a = [1.0, 2.0, 3.0, 4.0];
        let b = [5.0, 6.0];
        let mut c = [100.0; 4];
        let lc = Layout::dense(2, 2, 1);
        matmul(
            &a,
            Layout::dense(1, 2, 2),
            &b,
            Layout::dense(1, 2, 1),
            Some(&[1.0]),
            &mut c,
            lc,
            false,
        );
        assert_eq!(c, [18.0, 40.0, 18.0, 40.0]);
        matmul(
            &a,
            Layout::dense(1, 2, 2),
            &b,
            Layout::dense(1, 2, 1),
            None,
            &mut c,
            lc,
            true,
        );
        assert_eq!(c, [35.0, 79.0, 35.0, 79.0]);
    }
}
