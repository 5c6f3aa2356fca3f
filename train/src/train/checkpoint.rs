//! Checkpoints: a directory with the weights (safetensors, keys = the model's field paths),
//! the model config and the trainer's state. `model-export` reads the first two.

use std::path::{Path, PathBuf};

use anyhow::Context;
use candle_core::{DType, Device};
use candle_nn::VarBuilder;
use model_package::ModelConfig;
use serde::{Deserialize, Serialize};

use crate::model::Model;

pub const CONFIG_FILE: &str = "config.json";
pub const WEIGHTS_FILE: &str = "model.safetensors";
pub const OPTIMIZER_FILE: &str = "optimizer.safetensors";
pub const STATE_FILE: &str = "trainer_state.json";

/// Where training stands, and what it was trained on: enough to resume, and the provenance
/// a model package carries into its manifest.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct TrainerState {
    pub step: usize,
    pub epoch: usize,
    /// Batches of the current epoch already consumed (resume skips them).
    pub batch_in_epoch: usize,
    pub target_tokens_seen: u64,
    pub source_tokens_seen: u64,
    pub train_seconds: f64,
    pub best_dev_loss: Option<f64>,
    pub last_dev_loss: Option<f64>,
    pub seed: u64,
    pub corpus: String,
    pub tokenizer: String,
    pub train_pairs: usize,
    /// The command-line options of the run, as given.
    pub args: serde_json::Value,
}

/// Loads a checkpoint's config and weights for inference or export.
pub fn load_model(dir: &Path, device: &Device) -> anyhow::Result<Model> {
    let config = load_config(dir)?;
    let weights = dir.join(WEIGHTS_FILE);
    // SAFETY: the file is not modified while mapped (checkpoints are written to a temporary
    // directory and renamed into place).
    let vb = unsafe { VarBuilder::from_mmaped_safetensors(&[&weights], DType::F32, device)? };
    Model::new(config, vb).with_context(|| format!("loading {}", weights.display()))
}

pub fn load_config(dir: &Path) -> anyhow::Result<ModelConfig> {
    let path = dir.join(CONFIG_FILE);
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    Ok(ModelConfig::from_json(&text)?)
}

pub fn load_state(dir: &Path) -> anyhow::Result<TrainerState> {
    let path = dir.join(STATE_FILE);
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    Ok(serde_json::from_str(&text)?)
}

/// Writes into `dir.tmp` then renames over `dir`, so a run killed mid-write never leaves a
/// half checkpoint behind.
pub fn write_atomically(
    dir: &Path,
    write: impl FnOnce(&Path) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let tmp = PathBuf::from(format!("{}.tmp", dir.display()));
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp)?;
    }
    std::fs::create_dir_all(&tmp)?;
    write(&tmp)?;
    if dir.exists() {
        std::fs::remove_dir_all(dir)?;
    }
    std::fs::rename(&tmp, dir)?;
    Ok(())
}
