//! ndarray interop: host arrays in and out of CPU backend memory, for inspecting
//! activations or feeding data from other Rust numeric code.

use andrea_core::{check, Error, MemoryOps, Result, Tensor, View};
use ndarray::{ArrayD, ArrayViewD, IxDyn};

use crate::{CpuBackend, CpuBuffer};

impl CpuBackend {
    /// A new buffer holding `a`'s elements in row-major order (any layout of `a`).
    pub fn upload_array(&self, a: ArrayViewD<'_, f32>) -> Result<CpuBuffer> {
        let buf = self.alloc(a.len())?;
        let host: Vec<f32> = a.iter().copied().collect();
        self.upload(&host, View::whole(&buf))?;
        Ok(buf)
    }

    /// The elements of `t` as an array of `t`'s shape.
    pub fn download_array(&self, t: Tensor<'_, Self>) -> Result<ArrayD<f32>> {
        check::view("download_array", "t", &t)?;
        let mut host = vec![0.0; t.numel()];
        self.download(t, &mut host)?;
        ArrayD::from_shape_vec(IxDyn(t.shape.dims()), host)
            .map_err(|e| Error::invalid("download_array", e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::Array2;

    #[test]
    fn arrays_round_trip_through_a_transposed_view() {
        let be = CpuBackend::new();
        let a = Array2::from_shape_fn((3, 5), |(i, j)| (i * 10 + j) as f32);
        // Upload the transpose: the buffer holds it row-major.
        let buf = be.upload_array(a.t().into_dyn()).unwrap();
        let back = be.download_array(View::new(&buf, 0, [5, 3])).unwrap();
        assert_eq!(back, a.t().into_dyn());
    }
}
