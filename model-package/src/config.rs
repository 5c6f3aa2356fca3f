//! The model's shape and switches, as written in a checkpoint's `config.json` and copied
//! into the package manifest. Invalid combinations are rejected here, at load, rather than
//! deep inside a forward pass.

use serde::{Deserialize, Serialize};

/// Where layer normalisation sits in each residual block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NormPlacement {
    /// `x + f(norm(x))`, with a final norm after the stack. Trains without a long warm-up,
    /// which matters for small models on a CPU budget; the default.
    Pre,
    /// `norm(x + f(x))`, as in Vaswani et al.
    Post,
}

/// Absolute position information added to the (scaled) word embeddings.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AbsolutePosition {
    /// Vaswani et al.: `sin(pos / 10000^(2i/d))` on even dims, `cos` on odd dims.
    Sinusoidal,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelConfig {
    /// Named preset this config came from (e.g. `transformer`); informational.
    pub preset: String,
    /// Shared source/target vocabulary; embeddings and output projection are tied.
    pub vocab_size: usize,
    pub d_model: usize,
    pub num_heads: usize,
    pub ffn_dim: usize,
    pub encoder_layers: usize,
    pub decoder_layers: usize,
    pub dropout: f32,
    pub norm: NormPlacement,
    pub absolute_position: AbsolutePosition,
    pub layer_norm_eps: f64,
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ConfigError {
    #[error("d_model ({d_model}) must be divisible by num_heads ({num_heads})")]
    HeadsDoNotDivide { d_model: usize, num_heads: usize },
    #[error("d_model ({0}) must be even for sinusoidal position encodings")]
    OddModelDim(usize),
    #[error("{field} must be at least 1")]
    Zero { field: &'static str },
    #[error("vocab_size ({0}) must leave room for the 4 special tokens")]
    VocabTooSmall(usize),
    #[error("dropout ({0}) must be in [0, 1)")]
    Dropout(f32),
    #[error("unknown preset {0:?}; known presets: {known}", known = ModelConfig::PRESETS.join(", "))]
    UnknownPreset(String),
}

impl ModelConfig {
    pub const PRESETS: &'static [&'static str] = &["transformer", "transformer-tiny"];

    /// A named preset sized for `vocab_size`.
    ///
    /// `transformer` is the shipped size: d_model 256, 4 heads, FFN 1024, 3+3 layers (the
    /// shapes of the CTranslate2 speed anchor in DESIGN.md). `transformer-tiny` trains in
    /// seconds and exists for tests.
    pub fn preset(name: &str, vocab_size: usize) -> Result<Self, ConfigError> {
        let base = ModelConfig {
            preset: name.to_string(),
            vocab_size,
            d_model: 256,
            num_heads: 4,
            ffn_dim: 1024,
            encoder_layers: 3,
            decoder_layers: 3,
            dropout: 0.1,
            norm: NormPlacement::Pre,
            absolute_position: AbsolutePosition::Sinusoidal,
            layer_norm_eps: 1e-5,
        };
        let config = match name {
            "transformer" => base,
            "transformer-tiny" => ModelConfig {
                d_model: 32,
                num_heads: 2,
                ffn_dim: 64,
                encoder_layers: 2,
                decoder_layers: 2,
                dropout: 0.0,
                ..base
            },
            other => return Err(ConfigError::UnknownPreset(other.to_string())),
        };
        config.validate()?;
        Ok(config)
    }

    pub fn head_dim(&self) -> usize {
        self.d_model / self.num_heads
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        for (field, value) in [
            ("d_model", self.d_model),
            ("num_heads", self.num_heads),
            ("ffn_dim", self.ffn_dim),
            ("encoder_layers", self.encoder_layers),
            ("decoder_layers", self.decoder_layers),
        ] {
            if value == 0 {
                return Err(ConfigError::Zero { field });
            }
        }
        if !self.d_model.is_multiple_of(self.num_heads) {
            return Err(ConfigError::HeadsDoNotDivide {
                d_model: self.d_model,
                num_heads: self.num_heads,
            });
        }
        if self.absolute_position == AbsolutePosition::Sinusoidal && !self.d_model.is_multiple_of(2)
        {
            return Err(ConfigError::OddModelDim(self.d_model));
        }
        if self.vocab_size <= crate::special::TOKENS.len() {
            return Err(ConfigError::VocabTooSmall(self.vocab_size));
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return Err(ConfigError::Dropout(self.dropout));
        }
        Ok(())
    }

    /// Parses and validates a config from JSON.
    pub fn from_json(text: &str) -> Result<Self, crate::ManifestError> {
        let config: ModelConfig = serde_json::from_str(text)?;
        config.validate()?;
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_are_valid_and_unknown_names_are_listed() {
        for name in ModelConfig::PRESETS {
            ModelConfig::preset(name, 8000).unwrap();
        }
        let err = ModelConfig::preset("nope", 8000).unwrap_err();
        assert!(err.to_string().contains("transformer-tiny"), "{err}");
    }

    #[test]
    fn heads_must_divide_model_dim() {
        let mut config = ModelConfig::preset("transformer", 8000).unwrap();
        config.num_heads = 3;
        assert_eq!(
            config.validate(),
            Err(ConfigError::HeadsDoNotDivide {
                d_model: 256,
                num_heads: 3
            })
        );
    }

    #[test]
    fn json_round_trip_validates() {
        let config = ModelConfig::preset("transformer-tiny", 100).unwrap();
        let text = serde_json::to_string(&config).unwrap();
        assert_eq!(ModelConfig::from_json(&text).unwrap(), config);
        let bad = text.replace("\"vocab_size\":100", "\"vocab_size\":2");
        assert!(ModelConfig::from_json(&bad).is_err());
    }
}
