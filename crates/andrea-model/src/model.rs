//! [`Model`]: a config, a backend and the one contiguous parameter buffer, with named
//! views of every tensor in transformers' names and layouts.

use andrea_core::{Backend, ModelConfig, Tensor};

use crate::error::{ModelError, Result};
use crate::layout::{Init, ParamInfo, ParamLayout};
use crate::rng::Rng;

/// A GPT-2 model on backend `B`: what inference needs. Training state (gradients,
/// optimizer moments, activations) lives in a [`crate::Trainer`], which owns a model.
pub struct Model<B: Backend> {
    backend: B,
    config: ModelConfig,
    layout: ParamLayout,
    params: B::Buffer,
}

impl<B: Backend> Model<B> {
    /// A model with GPT-2's initialisation from `seed`: linear and embedding weights
    /// `N(0, init_std)`, the two residual projections of each block
    /// `N(0, init_std / sqrt(2·n_layer))`, biases 0, LayerNorm gains 1 and shifts 0.
    /// The same seed gives the same weights on every backend and machine (the numbers
    /// are drawn on the host, tensor by tensor in transformers' order).
    pub fn new(backend: B, config: ModelConfig, seed: u64) -> Result<Self> {
        let model = Self::zeros(backend, config)?;
        let mut rng = Rng::new(seed);
        for p in model.layout.params() {
            let host: Vec<f32> = match p.init {
                Init::Normal(std) => (0..p.numel())
                    .map(|_| (rng.normal() * std as f64) as f32)
                    .collect(),
                Init::Zeros => continue,
                Init::Ones => vec![1.0; p.numel()],
            };
            model.backend.upload(&host, p.slot.on(&model.params))?;
        }
        Ok(model)
    }

    /// A model whose parameters are all zero (to be loaded or written).
    pub fn zeros(backend: B, config: ModelConfig) -> Result<Self> {
        config.validate()?;
        let layout = ParamLayout::new(&config);
        let params = backend.alloc(layout.len)?;
        Ok(Model {
            backend,
            config,
            layout,
            params,
        })
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// The exact parameter count (see [`ModelConfig::param_count`]).
    pub fn param_count(&self) -> usize {
        self.config.param_count()
    }

    /// Every parameter tensor, in transformers' order.
    pub fn params(&self) -> &[ParamInfo] {
        self.layout.params()
    }

    fn info(&self, name: &str) -> Result<&ParamInfo> {
        self.layout
            .get(name)
            .ok_or_else(|| ModelError::UnknownParam(name.to_string()))
    }

    /// The parameter `name` as a view in its transformers shape (for
    /// `transformer.wte.weight`, the real vocabulary's rows).
    pub fn param(&self, name: &str) -> Result<Tensor<'_, B>> {
        Ok(self.info(name)?.slot.on(&self.params))
    }

    /// A host copy of parameter `name`, row-major in its transformers shape.
    pub fn read_param(&self, name: &str) -> Result<Vec<f32>> {
        let view = self.param(name)?;
        let mut host = vec![0.0; view.numel()];
        self.backend.download(view, &mut host)?;
        Ok(host)
    }

    /// Overwrites parameter `name` with `values` (row-major, its transformers shape).
    pub fn write_param(&mut self, name: &str, values: &[f32]) -> Result<()> {
        let p = self.info(name)?;
        if values.len() != p.numel() {
            return Err(ModelError::ParamSize {
                name: name.to_string(),
                shape: p.slot.shape,
                expected: p.numel(),
                got: values.len(),
            });
        }
        self.backend.upload(values, p.slot.on(&self.params))?;
        Ok(())
    }

    pub(crate) fn layout(&self) -> &ParamLayout {
        &self.layout
    }

    pub(crate) fn buffer(&self) -> &B::Buffer {
        &self.params
    }
}

impl<B: Backend> std::fmt::Debug for Model<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model")
            .field("backend", &self.backend.name())
            .field("config", &self.config)
            .field("params", &self.param_count())
            .finish()
    }
}
