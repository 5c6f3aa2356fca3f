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
    /// The checkpoints whose weights were averaged into this one (`nmt-train average`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub averaged_from: Vec<String>,
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

fn with_suffix(dir: &Path, suffix: &str) -> PathBuf {
    PathBuf::from(format!("{}.{suffix}", dir.display()))
}

/// Writes into `dir.tmp`, moves the old `dir` to `dir.old`, renames the new one into place,
/// then deletes the old: a run killed at any point leaves a whole checkpoint at `dir` or at
/// `dir.old` ([`recover`] puts it back).
pub fn write_atomically(
    dir: &Path,
    write: impl FnOnce(&Path) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let (tmp, old) = (with_suffix(dir, "tmp"), with_suffix(dir, "old"));
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp)?;
    }
    std::fs::create_dir_all(&tmp)?;
    write(&tmp)?;
    recover(dir)?;
    if dir.exists() {
        std::fs::rename(dir, &old)?;
    }
    std::fs::rename(&tmp, dir)?;
    if old.exists() {
        std::fs::remove_dir_all(&old)?;
    }
    Ok(())
}

/// Puts back the previous checkpoint if a run was killed between moving it aside and
/// renaming its successor into place.
pub fn recover(dir: &Path) -> anyhow::Result<()> {
    let old = with_suffix(dir, "old");
    if !dir.exists() && old.exists() {
        std::fs::rename(&old, dir)?;
    }
    Ok(())
}

/// Writes the element-wise mean of the weights of `checkpoints` to `out`, with the config
/// and trainer state of the last one: averaging the last few checkpoints of a run is a
/// cheap ensemble that usually scores better than any one of them.
pub fn average(checkpoints: &[PathBuf], out: &Path) -> anyhow::Result<()> {
    let Some(last) = checkpoints.last() else {
        anyhow::bail!("nothing to average");
    };
    let config = load_config(last)?;
    let mut sum: Option<std::collections::HashMap<String, candle_core::Tensor>> = None;
    for dir in checkpoints {
        if load_config(dir)? != config {
            anyhow::bail!(
                "{} has another model config than {}",
                dir.display(),
                last.display()
            );
        }
        let path = dir.join(WEIGHTS_FILE);
        let weights = candle_core::safetensors::load(&path, &Device::Cpu)
            .with_context(|| format!("reading {}", path.display()))?;
        sum = Some(match sum {
            None => weights,
            Some(mut sum) => {
                for (name, total) in sum.iter_mut() {
                    let w = weights
                        .get(name)
                        .with_context(|| format!("{} lacks {name}", path.display()))?;
                    *total = (&*total + w)?;
                }
                sum
            }
        });
    }
    let n = checkpoints.len() as f64;
    let mean: std::collections::HashMap<String, candle_core::Tensor> = sum
        .expect("at least one checkpoint")
        .into_iter()
        .map(|(name, total)| Ok((name, (total / n)?)))
        .collect::<candle_core::Result<_>>()?;
    let mut state = load_state(last)?;
    state.averaged_from = checkpoints
        .iter()
        .map(|d| d.display().to_string())
        .collect();
    write_atomically(out, |tmp| {
        candle_core::safetensors::save(&mean, tmp.join(WEIGHTS_FILE))?;
        std::fs::write(
            tmp.join(CONFIG_FILE),
            serde_json::to_string_pretty(&config)?,
        )?;
        std::fs::write(tmp.join(STATE_FILE), serde_json::to_string_pretty(&state)?)?;
        Ok(())
    })
}

/// `nmt-train average`: the mean of several checkpoints' weights, exportable like any
/// checkpoint.
#[derive(clap::Args, Debug)]
pub struct AverageArgs {
    /// Checkpoint directories to average (e.g. a run's `snapshots/step-*`); the last one's
    /// config and trainer state are kept.
    #[arg(required = true)]
    pub checkpoints: Vec<PathBuf>,
    /// Output checkpoint directory.
    #[arg(long)]
    pub out: PathBuf,
}

pub fn run_average(args: AverageArgs) -> anyhow::Result<()> {
    average(&args.checkpoints, &args.out)?;
    eprintln!(
        "averaged {} checkpoints into {}",
        args.checkpoints.len(),
        args.out.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Tensor;
    use std::collections::HashMap;

    fn write_checkpoint(dir: &Path, config: &ModelConfig, value: f32) {
        let weights = HashMap::from([(
            "w".to_string(),
            Tensor::full(value, (2, 3), &Device::Cpu).unwrap(),
        )]);
        write_atomically(dir, |tmp| {
            candle_core::safetensors::save(&weights, tmp.join(WEIGHTS_FILE))?;
            std::fs::write(tmp.join(CONFIG_FILE), serde_json::to_string(config)?)?;
            let state = TrainerState {
                step: value as usize,
                ..Default::default()
            };
            std::fs::write(tmp.join(STATE_FILE), serde_json::to_string(&state)?)?;
            Ok(())
        })
        .unwrap();
    }

    #[test]
    fn averaging_takes_the_mean_and_the_last_state() {
        let work = tempfile::tempdir().unwrap();
        let config = ModelConfig::preset("transformer-tiny", 50).unwrap();
        let dirs: Vec<PathBuf> = [1.0f32, 2.0, 6.0]
            .iter()
            .map(|&v| {
                let dir = work.path().join(format!("step-{v}"));
                write_checkpoint(&dir, &config, v);
                dir
            })
            .collect();
        let out = work.path().join("avg");
        average(&dirs, &out).unwrap();
        let mean = candle_core::safetensors::load(out.join(WEIGHTS_FILE), &Device::Cpu).unwrap();
        let values = mean["w"].flatten_all().unwrap().to_vec1::<f32>().unwrap();
        assert_eq!(values, vec![3.0; 6]);
        let state = load_state(&out).unwrap();
        assert_eq!((state.step, state.averaged_from.len()), (6, 3));

        let mut other = config.clone();
        other.d_model = 64;
        write_checkpoint(&work.path().join("other"), &other, 1.0);
        let mixed = [dirs[0].clone(), work.path().join("other")];
        assert!(average(&mixed, &work.path().join("bad")).is_err());
    }

    #[test]
    fn a_write_killed_after_moving_the_old_checkpoint_aside_is_recovered() {
        let work = tempfile::tempdir().unwrap();
        let dir = work.path().join("last");
        let config = ModelConfig::preset("transformer-tiny", 50).unwrap();
        write_checkpoint(&dir, &config, 1.0);
        // The moment between the two renames.
        std::fs::rename(&dir, with_suffix(&dir, "old")).unwrap();
        recover(&dir).unwrap();
        assert_eq!(load_state(&dir).unwrap().step, 1);
        write_checkpoint(&dir, &config, 2.0);
        assert_eq!(load_state(&dir).unwrap().step, 2);
        assert!(!with_suffix(&dir, "old").exists());
    }
}
