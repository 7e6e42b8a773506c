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
