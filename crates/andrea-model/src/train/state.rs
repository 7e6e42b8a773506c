//! The optimizer's state on disk (`optimizer.safetensors` of a checkpoint): AdamW's two
//! moments per parameter, named after it, and the step count, so that training resumes
//! exactly where it stopped.

use std::collections::HashMap;
use std::path::Path;

use andrea_core::Backend;

use super::Trainer;
use crate::error::{ModelError, Result};
use crate::io::tensors::{self, HostTensor, TensorFile};
use crate::io::write_atomic;

const MOMENTS: [&str; 2] = ["exp_avg", "exp_avg_sq"];

impl<B: Backend> Trainer<B> {
    /// Writes the AdamW moments (`exp_avg.{param}`, `exp_avg_sq.{param}`, as
    /// `torch.optim.AdamW` names them) and the step count (metadata `step`) atomically.
    pub fn save_optimizer_state(&self, path: impl AsRef<Path>) -> Result<()> {
        let be = self.model.backend();
        let mut out: Vec<HostTensor> = Vec::new();
        for (moment, buf) in MOMENTS.iter().zip([&self.m, &self.v]) {
            for p in self.model.params() {
                let mut host = vec![0.0; p.numel()];
                be.download(p.slot.on(buf), &mut host)?;
                out.push((format!("{moment}.{}", p.name()), p.shape().to_vec(), host));
            }
        }
        // One key only: safetensors writes the metadata in the map's (random) order, and
        // a single key keeps the file byte-identical from run to run. (transformers'
        // `"format": "pt"` matters to model files, not to this one.)
        let meta = HashMap::from([("step".to_string(), self.steps.to_string())]);
        write_atomic(path.as_ref(), &tensors::serialize(&out, meta)?)
    }

    /// Reads what [`Trainer::save_optimizer_state`] wrote; every tensor is checked
    /// before anything changes.
    pub fn load_optimizer_state(&mut self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let bytes = andrea_fs::read_regular(path, u64::MAX).map_err(|e| ModelError::io(path, e))?;
        let file = TensorFile::parse(path, &bytes)?;
        let step: u64 = file
            .metadata
            .get("step")
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| ModelError::format(path, "no integer `step` in the metadata"))?;
        let mut expected = HashMap::new();
        for moment in MOMENTS {
            for p in self.model.params() {
                expected.insert(format!("{moment}.{}", p.name()), p.shape().to_vec());
            }
        }
        let names = file.names();
        if let Some(name) = expected.keys().filter(|n| !names.contains(n)).min() {
            return Err(ModelError::MissingTensor {
                path: path.to_path_buf(),
                name: name.clone(),
            });
        }
        for name in names {
            let Some(shape) = expected.get(&name) else {
                return Err(ModelError::UnexpectedTensor {
                    path: path.to_path_buf(),
                    name,
                });
            };
            let got = file.shape(&name)?;
            if &got != shape {
                return Err(ModelError::TensorShape {
                    path: path.to_path_buf(),
                    name,
                    expected: shape.clone(),
                    got,
                });
            }
            file.check_dtype(&name)?;
        }
        // A NaN, an infinity or a negative second moment would make every later step
        // NaN, and the run would stop blaming its learning rate: refused here, by name,
        // before anything changes.
        for moment in MOMENTS {
            for p in self.model.params() {
                let name = format!("{moment}.{}", p.name());
                let values = file.read_f32(&name)?;
                let bad = |v: &f32| !v.is_finite() || (moment == "exp_avg_sq" && *v < 0.0);
                if let Some(i) = values.iter().position(bad) {
                    return Err(ModelError::format(
                        path,
                        format!(
                            "tensor `{name}` holds {} at index {i}, which AdamW never writes \
                             (moments are finite, second moments not negative): the file is \
                             damaged; resume from an earlier checkpoint",
                            values[i]
                        ),
                    ));
                }
            }
        }
        let be = self.model.backend();
        for (moment, buf) in MOMENTS.iter().zip([&self.m, &self.v]) {
            for p in self.model.params() {
                let values = file.read_f32(&format!("{moment}.{}", p.name()))?;
                be.upload(&values, p.slot.on(buf))?;
            }
        }
        self.steps = step;
        Ok(())
    }
}
