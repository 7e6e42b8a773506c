//! How work is cut for rayon: fixed-size pieces whose boundaries do not depend on the
//! number of threads, so every reduction adds in the same order on any thread count.

/// Elements a task should touch at least, so task overhead stays small.
pub(crate) const MIN_TASK_ELEMS: usize = 1 << 14;

/// Rows per task for rows of `row_len` elements.
pub(crate) fn rows_per_task(row_len: usize) -> usize {
    (MIN_TASK_ELEMS / row_len.max(1)).max(1)
}

/// Columns per task when a task walks all `rows` rows of a column band (reductions
/// over rows: bias and LayerNorm parameter gradients, embedding scatter-adds).
pub(crate) fn cols_per_task(rows: usize, cols: usize) -> usize {
    let band = (MIN_TASK_ELEMS / rows.max(1)).max(64).next_multiple_of(16);
    band.min(cols.max(1))
}
