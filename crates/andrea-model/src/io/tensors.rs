//! safetensors files of named f32 tensors: writing, and reading with every name, shape
//! and dtype checked before anything is used.

use std::collections::HashMap;
use std::path::Path;

use safetensors::tensor::{Dtype, SafeTensors, TensorView};

use crate::error::{ModelError, Result};

/// A named host tensor: name, shape, row-major values.
pub(crate) type HostTensor = (String, Vec<usize>, Vec<f32>);

/// The bytes of a safetensors file holding `tensors` as F32, with `metadata` (transformers
/// needs `"format": "pt"`).
pub(crate) fn serialize(
    tensors: &[HostTensor],
    metadata: HashMap<String, String>,
) -> Result<Vec<u8>> {
    let bytes: Vec<Vec<u8>> = tensors
        .iter()
        .map(|(_, _, values)| values.iter().flat_map(|v| v.to_le_bytes()).collect())
        .collect();
    let views = tensors
        .iter()
        .zip(&bytes)
        .map(|((name, shape, _), data)| {
            TensorView::new(Dtype::F32, shape.clone(), data)
                .map(|view| (name.clone(), view))
                .map_err(|e| ModelError::State(format!("safetensors: tensor `{name}`: {e}")))
        })
        .collect::<Result<Vec<_>>>()?;
    safetensors::serialize(views, Some(metadata))
        .map_err(|e| ModelError::State(format!("safetensors: {e}")))
}

/// A parsed safetensors file: its tensors by name (borrowing the file's bytes).
pub(crate) struct TensorFile<'a> {
    pub path: &'a Path,
    pub tensors: SafeTensors<'a>,
    pub metadata: HashMap<String, String>,
}

impl<'a> TensorFile<'a> {
    pub fn parse(path: &'a Path, bytes: &'a [u8]) -> Result<Self> {
        let (_, meta) = SafeTensors::read_metadata(bytes)
            .map_err(|e| ModelError::format(path, format!("not a safetensors file: {e}")))?;
        let metadata = meta
            .metadata()
            .clone()
            .map(|m| m.into_iter().collect())
            .unwrap_or_default();
        let tensors = SafeTensors::deserialize(bytes)
            .map_err(|e| ModelError::format(path, format!("not a safetensors file: {e}")))?;
        Ok(TensorFile {
            path,
            tensors,
            metadata,
        })
    }

    /// Tensor names in the file, sorted (for reproducible error messages).
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.tensors.names().into_iter().map(String::from).collect();
        names.sort();
        names
    }

    pub fn shape(&self, name: &str) -> Result<Vec<usize>> {
        Ok(self.view(name)?.shape().to_vec())
    }

    fn view(&self, name: &str) -> Result<TensorView<'a>> {
        self.tensors
            .tensor(name)
            .map_err(|_| ModelError::MissingTensor {
                path: self.path.to_path_buf(),
                name: name.to_string(),
            })
    }

    /// Checks that `name` has a floating-point dtype andrea can read.
    pub fn check_dtype(&self, name: &str) -> Result<()> {
        let dtype = self.view(name)?.dtype();
        match dtype {
            Dtype::F32 | Dtype::F16 | Dtype::BF16 | Dtype::F64 => Ok(()),
            other => Err(ModelError::format(
                self.path,
                format!("tensor `{name}` has dtype {other:?}; andrea reads F32, F16, BF16 and F64"),
            )),
        }
    }

    /// The values of `name` as f32 (F16, BF16 and F64 converted).
    pub fn read_f32(&self, name: &str) -> Result<Vec<f32>> {
        self.check_dtype(name)?;
        let view = self.view(name)?;
        let data = view.data();
        let values = match view.dtype() {
            Dtype::F32 => data
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            Dtype::F64 => data
                .chunks_exact(8)
                .map(|b| f64::from_le_bytes(b.try_into().expect("8 bytes")) as f32)
                .collect(),
            Dtype::BF16 => data
                .chunks_exact(2)
                .map(|b| f32::from_bits((u16::from_le_bytes([b[0], b[1]]) as u32) << 16))
                .collect(),
            _ => data
                .chunks_exact(2)
                .map(|b| f16_to_f32(u16::from_le_bytes([b[0], b[1]])))
                .collect(),
        };
        Ok(values)
    }
}

/// IEEE half precision to single (exact: every half is a float).
fn f16_to_f32(h: u16) -> f32 {
    let sign = ((h >> 15) as u32) << 31;
    let exp = ((h >> 10) & 0x1f) as u32;
    let mant = (h & 0x3ff) as u32;
    let bits = match exp {
        0 => {
            // Zero or subnormal: mant · 2⁻²⁴.
            let v = mant as f32 / 16_777_216.0;
            return if sign != 0 { -v } else { v };
        }
        31 => sign | 0x7f80_0000 | (mant << 13),
        _ => sign | ((exp + 127 - 15) << 23) | (mant << 13),
    };
    f32::from_bits(bits)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_precision_converts_exactly() {
        assert_eq!(f16_to_f32(0x3c00), 1.0);
        assert_eq!(f16_to_f32(0xc000), -2.0);
        assert_eq!(f16_to_f32(0x7bff), 65504.0);
        assert_eq!(f16_to_f32(0x0001), 2f32.powi(-24));
        assert_eq!(f16_to_f32(0x8000), -0.0);
        assert!(f16_to_f32(0x7c00).is_infinite());
        assert!(f16_to_f32(0x7e00).is_nan());
    }

    #[test]
    fn round_trip_and_dtype_errors() {
        let t = vec![(
            "a.weight".to_string(),
            vec![2, 3],
            vec![1.0, -2.0, 3.5, 0.0, 1e-3, 7.0],
        )];
        let bytes = serialize(&t, HashMap::from([("format".into(), "pt".into())])).unwrap();
        let path = Path::new("x.safetensors");
        let f = TensorFile::parse(path, &bytes).unwrap();
        assert_eq!(f.names(), ["a.weight"]);
        assert_eq!(f.shape("a.weight").unwrap(), [2, 3]);
        assert_eq!(f.read_f32("a.weight").unwrap(), t[0].2);
        assert_eq!(f.metadata["format"], "pt");
        let e = f.read_f32("b").unwrap_err().to_string();
        assert!(e.contains("missing tensor `b`"), "{e}");
        assert!(TensorFile::parse(path, b"garbage").is_err());
    }
}
