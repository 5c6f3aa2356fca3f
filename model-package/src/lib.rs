//! The one place where training, export and serving agree.
//!
//! A *model package* is a directory holding [`files::MANIFEST`], [`files::TOKENIZER`],
//! [`files::ENCODER`] and [`files::DECODER`]. The server knows nothing about a model beyond
//! what this crate describes: it feeds tensors by the names in [`names`] and carries the
//! decoder state that the manifest lists in [`Manifest::decoder_state`].

pub mod config;
pub mod int8;
pub mod lines;
pub mod manifest;
pub mod names;
pub mod placeholders;
pub mod special;

pub use config::{
    AbsolutePosition, Architecture, ConfigError, LengthEncoding, ModelConfig, NormPlacement,
    RecurrentPosition, RelativeAttention,
};
pub use manifest::{
    Dim, ExternalFile, LengthPrediction, LengthPredictorSpec, Limits, LinearFit, Manifest,
    ManifestError, Precision, PredictorGraph, StateSpec,
};

/// File names inside a model package.
pub mod files {
    pub const MANIFEST: &str = "manifest.json";
    pub const TOKENIZER: &str = "tokenizer.json";
    pub const ENCODER: &str = "encoder.onnx";
    pub const DECODER: &str = "decoder.onnx";
}
