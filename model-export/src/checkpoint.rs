//! Package -> checkpoint, the inverse of the Transformer-family export: a shipped package
//! is then a starting point for more training (`nmt-train train --init-from`) even where
//! the run's own checkpoints are gone, as they are on any machine but the one that trained.
//!
//! Every weight the checkpoint needs is read back from the graphs' initializers, which the
//! export names after the checkpoint keys (plus a `_N` suffix that keeps graph names
//! unique). Recurrent layers are rewritten in ONNX's gate layout on export and are not
//! read back: packages with them are refused.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use candle_core::{DType, Device, Tensor};
use candle_nn::{VarBuilder, VarMap};
use model_package::{files, Architecture, Manifest, ModelConfig, RecurrentPosition};
use nmt_train::model::Model;
use nmt_train::train::checkpoint::{self, TrainerState};
use prost::Message;

use crate::proto::{data_type, ModelProto};
use crate::transformer;

#[derive(clap::Args, Clone, Debug)]
pub struct CheckpointArgs {
    /// Model package to read (a float32 Transformer-family package, e.g. models/en-es-rel-ldpe).
    #[arg(long)]
    pub package: PathBuf,
    /// Checkpoint directory to write (config.json, model.safetensors, trainer_state.json with
    /// the package's training provenance).
    #[arg(long)]
    pub out: PathBuf,
}

/// A float initializer with its shape.
struct Initializer {
    dims: Vec<usize>,
    values: Vec<f32>,
}

/// Writes the checkpoint and returns how many weights it holds.
pub fn checkpoint_from_package(args: &CheckpointArgs) -> anyhow::Result<usize> {
    let manifest = Manifest::load_any_format(&args.package)?;
    let config = manifest.config.clone();
    check_importable(&manifest, &config)?;
    let mut initializers = HashMap::new();
    for graph in [files::ENCODER, files::DECODER] {
        read_initializers(&args.package.join(graph), &mut initializers)?;
    }
    let weights = weights_for(&config, &initializers)?;
    let count = weights.len();
    // A package whose weights were trained elsewhere (PyTorch on a lent GPU, imported) may
    // record no trainer state: its checkpoint then holds the weights and config alone, which
    // is all that exporting and `--init-from` read; resuming it as a run is not possible.
    let state: Option<TrainerState> = match &manifest.training {
        serde_json::Value::Null => None,
        training => Some(
            serde_json::from_value(training.clone())
                .context("reading the trainer state the package's manifest records")?,
        ),
    };
    checkpoint::write_atomically(&args.out, |tmp| {
        candle_core::safetensors::save(&weights, tmp.join(checkpoint::WEIGHTS_FILE))?;
        std::fs::write(
            tmp.join(checkpoint::CONFIG_FILE),
            serde_json::to_string_pretty(&config)?,
        )?;
        if let Some(state) = &state {
            std::fs::write(
                tmp.join(checkpoint::STATE_FILE),
                serde_json::to_string_pretty(state)?,
            )?;
        }
        Ok(())
    })?;
    Ok(count)
}

fn check_importable(manifest: &Manifest, config: &ModelConfig) -> anyhow::Result<()> {
    if manifest.precision != model_package::Precision::Float32 {
        bail!("only float32 packages can be read back (int8 weights lost precision)");
    }
    if config.architecture != Architecture::Transformer
        || config.recurrent_position != RecurrentPosition::None
    {
        bail!(
            "preset {}: recurrent layers are exported in ONNX's gate layout and are not read back",
            config.preset
        );
    }
    Ok(())
}

/// Adds the float initializers of one graph, keyed by the checkpoint key they came from
/// (graph constants come along under their own names; no weight is named like them).
fn read_initializers(
    path: &Path,
    into: &mut HashMap<String, Vec<Initializer>>,
) -> anyhow::Result<()> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let model = ModelProto::decode(bytes.as_slice())
        .with_context(|| format!("parsing {}", path.display()))?;
    let graph = model.graph.unwrap_or_default();
    for tensor in graph.initializer {
        if tensor.data_type != data_type::FLOAT || tensor.raw_data.is_empty() {
            continue;
        }
        let key = checkpoint_key(&tensor.name);
        let initializer = Initializer {
            dims: tensor.dims.iter().map(|&d| d as usize).collect(),
            values: tensor
                .raw_data
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
        };
        into.entry(key).or_default().push(initializer);
    }
    Ok(())
}

/// A graph's float initializers by checkpoint key (the first where two share one), e.g. a
/// length predictor's head read back.
pub fn float_initializers(path: &Path) -> anyhow::Result<HashMap<String, Vec<f32>>> {
    let mut all = HashMap::new();
    read_initializers(path, &mut all)?;
    Ok(all
        .into_iter()
        .filter_map(|(key, mut found)| Some((key, found.drain(..).next()?.values)))
        .collect())
}

/// `encoder.layers.0.ffn.fc1.weight_85` -> `encoder.layers.0.ffn.fc1.weight`. Packages
/// exported before the export named norms by their checkpoint keys hold them inside the
/// sublayer's scope (`layers.0.ffn.ffn_norm.bias`, `encoder.final_norm.norm.bias`): those
/// names are read back too, the shipped default among them.
fn checkpoint_key(name: &str) -> String {
    let name = match name.rsplit_once('_') {
        Some((key, n)) if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => key,
        _ => name,
    };
    let segments: Vec<&str> = name.split('.').collect();
    let mut key: Vec<&str> = Vec::with_capacity(segments.len());
    for (i, segment) in segments.iter().enumerate() {
        let next = segments.get(i + 1).copied().unwrap_or_default();
        let in_own_scope = next == format!("{segment}_norm");
        let final_norm_scope = *segment == "norm" && key.last() == Some(&"final_norm");
        if !in_own_scope && !final_norm_scope {
            key.push(segment);
        }
    }
    key.join(".")
}

/// Whether the graphs hold this weight transposed: a linear layer's, as the export writes
/// it ([`transformer::LOOKUP_TABLES`] are held as they are).
fn stored_transposed(key: &str, dims: &[usize]) -> bool {
    let table = transformer::LOOKUP_TABLES.iter().any(|t| key.ends_with(t));
    dims.len() == 2 && key.ends_with(".weight") && !table
}

/// The checkpoint's weights: the keys and shapes a freshly built model asks for, the values
/// from the graphs.
fn weights_for(
    config: &ModelConfig,
    initializers: &HashMap<String, Vec<Initializer>>,
) -> anyhow::Result<HashMap<String, Tensor>> {
    let varmap = VarMap::new();
    Model::new(
        config.clone(),
        VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu),
    )?;
    let expected: Vec<(String, Vec<usize>)> = varmap
        .data()
        .lock()
        .expect("varmap lock")
        .iter()
        .map(|(key, var)| (key.clone(), var.dims().to_vec()))
        .collect();
    expected
        .into_iter()
        .map(|(key, dims)| {
            let found = match initializers.get(&key).map(Vec::as_slice) {
                Some([first, rest @ ..]) => {
                    // A weight both graphs hold (the shared embedding table) is one weight.
                    if rest
                        .iter()
                        .any(|other| other.dims != first.dims || other.values != first.values)
                    {
                        bail!("{key} differs between the encoder and the decoder");
                    }
                    first
                }
                _ => bail!("the package's graphs hold no weight for {key}"),
            };
            let tensor = if stored_transposed(&key, &dims) {
                let stored = [dims[1], dims[0]];
                check_dims(&key, &found.dims, &stored)?;
                Tensor::from_vec(found.values.clone(), &stored[..], &Device::Cpu)?
                    .t()?
                    .contiguous()?
            } else {
                check_dims(&key, &found.dims, &dims)?;
                Tensor::from_vec(found.values.clone(), &dims[..], &Device::Cpu)?
            };
            Ok((key, tensor))
        })
        .collect()
}

fn check_dims(key: &str, found: &[usize], expected: &[usize]) -> anyhow::Result<()> {
    if found != expected {
        bail!("{key}: the graph holds shape {found:?}, the model needs {expected:?}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn graph_names_map_back_to_checkpoint_keys() {
        for (name, key) in [
            (
                "encoder.layers.0.ffn.fc1.weight_85",
                "encoder.layers.0.ffn.fc1.weight",
            ),
            ("embed.weight", "embed.weight"),
            (
                "encoder.layers.0.ffn_norm.bias_7",
                "encoder.layers.0.ffn_norm.bias",
            ),
            ("encoder.final_norm.weight_9", "encoder.final_norm.weight"),
            (
                "decoder.layers.1.self_attn.relative_keys_157",
                "decoder.layers.1.self_attn.relative_keys",
            ),
            // The naming of packages exported before 2026-11-24.
            (
                "encoder.layers.0.ffn.ffn_norm.bias_83",
                "encoder.layers.0.ffn_norm.bias",
            ),
            (
                "decoder.layers.1.cross_attn.cross_attn_norm.weight_188",
                "decoder.layers.1.cross_attn_norm.weight",
            ),
            (
                "encoder.final_norm.norm.bias_234",
                "encoder.final_norm.bias",
            ),
        ] {
            assert_eq!(checkpoint_key(name), key, "{name}");
        }
    }
}
