//! A band of columns of the few-rows product, as its per-ISA kernels take it.

/// One band of the column form: `m` rows `x[i·k..][..k]` of `A` against `cols` rows
/// `w[j·ws..][..k]` of `W`.
#[derive(Clone, Copy)]
pub(crate) struct Band<'a> {
    pub x: &'a [f32],
    pub w: &'a [f32],
    pub ws: usize,
    pub m: usize,
    pub k: usize,
    pub cols: usize,
}

/// Rows of `W` per pass of [`by_four`].
pub(crate) const ROWS: usize = 4;

/// `dots[i·cols + j] = x[i, :] · w[j]` for the band's `m` rows of `x` and `cols` rows of
/// `w`, four rows of `w` at a time through `four_dots` (an instruction set's kernel,
/// `avx2::four_dots` or `neon::four_dots`).
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
#[inline(always)]
pub(crate) fn by_four(
    dots: &mut [f32],
    band: Band<'_>,
    four_dots: impl Fn(&[f32], [&[f32]; ROWS]) -> [f32; ROWS],
) {
    let Band {
        x,
        w,
        ws,
        m,
        k,
        cols,
    } = band;
    assert!(cols > 0 && dots.len() >= m * cols && x.len() >= m * k);
    assert!(w.len() >= (cols - 1) * ws + k);
    for j0 in (0..cols).step_by(ROWS) {
        let rows = ROWS.min(cols - j0);
        // Row r of this block; a short last block repeats its last row, whose dots are
        // not stored.
        let row = |r: usize| &w[(j0 + r.min(rows - 1)) * ws..][..k];
        let block = [row(0), row(1), row(2), row(3)];
        for i in 0..m {
            let out = &mut dots[i * cols + j0..][..rows];
            let d = four_dots(&x[i * k..][..k], block);
            out.copy_from_slice(&d[..rows]);
        }
    }
}

/// The last products of each of four dots after their 16-lane bodies (`x[body..]` with
/// `w[r][body..]`), each a serial fused sum from 0: the tail of `gemv::dot`.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
#[inline(always)]
pub(crate) fn tails(x: &[f32], w: [&[f32]; ROWS], body: usize) -> [f32; ROWS] {
    std::array::from_fn(|r| {
        x[body..]
            .iter()
            .zip(&w[r][body..x.len()])
            .fold(0.0f32, |t, (&a, &b)| a.mul_add(b, t))
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::Band;
    use crate::simd::Fused;

    /// A column-form kernel (`unsafe` for its instruction set, which the caller checked)
    /// gives every dot the bits of `gemv::dot::<Fused>`, for `k` around the 16-lane body
    /// and its tail, band widths around the four-row blocks (a short last block), one
    /// and several rows of `x`, and `W`'s rows at a stride wider than `k`.
    pub(crate) fn check_kernel(kernel: unsafe fn(&mut [f32], Band<'_>)) {
        let mut r = andrea_testkit::random::Rand::new(3);
        for k in [1usize, 15, 16, 17, 33, 128, 131] {
            for cols in [1usize, 3, 4, 5, 8, 13] {
                for m in [1usize, 3] {
                    let ws = k + 5;
                    let x = r.vec(m * k, -1.0, 1.0);
                    let w = r.vec((cols - 1) * ws + k, -1.0, 1.0);
                    let mut dots = vec![f32::NAN; m * cols];
                    let band = Band {
                        x: &x,
                        w: &w,
                        ws,
                        m,
                        k,
                        cols,
                    };
                    // SAFETY: the caller checked the kernel's instruction set.
                    unsafe { kernel(&mut dots, band) };
                    for i in 0..m {
                        for j in 0..cols {
                            let want = crate::decode::gemv::dot::<Fused>(
                                &x[i * k..][..k],
                                &w[j * ws..][..k],
                            );
                            let got = dots[i * cols + j];
                            assert_eq!(
                                got.to_bits(),
                                want.to_bits(),
                                "k {k} cols {cols} ({i}, {j})"
                            );
                        }
                    }
                }
            }
        }
    }
}
