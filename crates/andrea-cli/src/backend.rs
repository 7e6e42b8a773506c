//! Choosing the backend and the thread count.

use andrea::DefaultBackend;
use anyhow::{bail, Result};

use crate::cli::{BackendKind, GlobalArgs};

/// The backend the flags ask for. `--threads` also sizes the pool the tokenizer runs on.
pub fn select(global: &GlobalArgs) -> Result<DefaultBackend> {
    if global.backend == BackendKind::Cuda {
        bail!(
            "--backend cuda: the CUDA backend is not built into andrea yet (it is issue 6, \
             crates/andrea-cuda); use --backend cpu"
        );
    }
    match global.threads {
        None => Ok(DefaultBackend::new()),
        Some(0) => bail!("--threads must be at least 1, got 0"),
        Some(n) => {
            // Only fails if a global pool exists already, which this process never makes.
            let _ = andrea_tokenizer::rayon::ThreadPoolBuilder::new()
                .num_threads(n)
                .build_global();
            Ok(DefaultBackend::new())
        }
    }
}
