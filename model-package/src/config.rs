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
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AbsolutePosition {
    /// Vaswani et al.: `sin(pos / 10000^(2i/d))` on even dims, `cos` on odd dims.
    #[default]
    Sinusoidal,
    /// Gehring et al.: a learned vector per position, up to `max_positions`.
    Learned,
    /// No absolute positions (relative or recurrent models).
    None,
}

/// Shaw et al. (2018) relative self-attention: a learned vector per clipped distance
/// `clip(key - query, -k, k)`, shared across heads, one table per layer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RelativeAttention {
    #[default]
    None,
    /// Learned vectors added to the keys and to the values (Shaw et al.'s full model).
    KeysValues,
    /// Learned vectors added to the keys only.
    Keys,
    /// Fixed sinusoidal vectors of the clipped distance, added to keys and values.
    Sinusoidal,
}

/// A recurrent network that supplies position information.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RecurrentPosition {
    #[default]
    None,
    /// Neishi & Yoshinaga: a unidirectional GRU replaces the position-encoding layer of the
    /// encoder and the decoder.
    Gru,
    /// Rosendahl et al.: a BiLSTM before the encoder, an LSTM before the decoder.
    Lstm,
    /// Chen et al.: a recurrent positional embedding on part of the word vector, RPEHead.
    RpeHead,
    /// Chen et al.: the multi-layer variant, MPRHead.
    MprHead,
}

/// Takase & Okazaki's length encodings in the decoder, in place of its absolute positions
/// (the encoder keeps its own). `len` is the length the decoder is asked for, in target
/// subwords without EOS, and `pos` the decoder input's position (0 for BOS), so that at
/// `pos == len` the next token should be EOS.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LengthEncoding {
    #[default]
    None,
    /// Length-difference: `sin((len - pos) / 10000^(2i/d))` (cos on odd dims): the tokens
    /// still to come.
    Ldpe,
    /// Length-ratio: `sin(pos / len^(2i/d))` (cos on odd dims).
    Lrpe,
}

/// The network family.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Architecture {
    #[default]
    Transformer,
    /// Luong et al.: bi-LSTM encoder, LSTM decoder, dot attention, input feeding.
    RnnNmt,
    /// A Hugging Face Marian (OPUS-MT) model imported by `nmt-export import-marian`:
    /// post-norm, sinusoids `[sin | cos]` from a table of `max_positions` rows, its own
    /// activation and output bias (in the graphs). Served, never trained or read back here.
    Marian,
}

fn default_relative_clip() -> usize {
    16
}

fn default_max_positions() -> usize {
    512
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelConfig {
    /// Named preset this config came from (e.g. `transformer`); informational.
    pub preset: String,
    #[serde(default)]
    pub architecture: Architecture,
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
    /// Rows of the learned position table (`absolute_position: learned`).
    #[serde(default = "default_max_positions")]
    pub max_positions: usize,
    #[serde(default)]
    pub relative_attention: RelativeAttention,
    /// Shaw et al.'s clipping distance `k`: distances beyond ±k share a vector.
    #[serde(default = "default_relative_clip")]
    pub relative_clip: usize,
    #[serde(default)]
    pub recurrent_position: RecurrentPosition,
    /// Chen et al.'s `d_r`: the dims of the word vector that carry the recurrent positional
    /// embedding (`rpe_head`, `mpr_head`; 0 otherwise). The other `d_model - d_r` dims carry
    /// the word and its sinusoidal position.
    #[serde(default)]
    pub recurrent_dim: usize,
    #[serde(default)]
    pub length_encoding: LengthEncoding,
    /// Oka et al.'s training noise: each training pair's `len` is its reference length plus
    /// an integer drawn uniformly from `-length_noise..=length_noise` (0: exact lengths).
    #[serde(default)]
    pub length_noise: usize,
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
    #[error("unknown preset {0:?}; known presets: {known} (each also as `<name>-small` and `<name>-tiny`)", known = ModelConfig::PRESETS.join(", "))]
    UnknownPreset(String),
    #[error("invalid combination: {0}")]
    Combination(String),
}

/// The width a preset's name asks for: `<variant>`, `<variant>-small` or `<variant>-tiny`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PresetSize {
    Full,
    Small,
    Tiny,
}

impl PresetSize {
    fn split(name: &str) -> (&str, PresetSize) {
        if let Some(variant) = name.strip_suffix("-tiny") {
            (variant, PresetSize::Tiny)
        } else if let Some(variant) = name.strip_suffix("-small") {
            (variant, PresetSize::Small)
        } else {
            (name, PresetSize::Full)
        }
    }
}

impl ModelConfig {
    /// The papers' systems. Every one also exists as `<name>-small` (d_model 128, 4 heads,
    /// FFN 512, the variant's own layer counts: about a third of the parameters, for studies
    /// that train many models on this CPU) and as `<name>-tiny` (d_model 32, 2 heads, 2+2
    /// layers, no dropout), which trains in seconds for tests.
    pub const PRESETS: &'static [&'static str] = &[
        "transformer",
        "transformer-learned",
        "rel-transformer",
        "rel-keys",
        "rel-sinusoidal",
        "rel-absolute",
        "rnn-transformer",
        "rr-transformer",
        "lstm-pe",
        "rpe-head",
        "mpr-head",
        "rnn-nmt",
        "ldpe",
        "ldpe-noise2",
        "ldpe-noise4",
        "lrpe",
        "lrpe-noise2",
        "lrpe-noise4",
        "rel-ldpe",
    ];

    /// A named preset sized for `vocab_size`.
    ///
    /// `transformer` is the shipped size: d_model 256, 4 heads, FFN 1024, 3+3 layers (the
    /// shapes of the CTranslate2 comparison in docs/benchmarks). Relative presets use Shaw et
    /// al.'s clip distance k = 16.
    pub fn preset(name: &str, vocab_size: usize) -> Result<Self, ConfigError> {
        let (variant, size) = PresetSize::split(name);
        let mut config = ModelConfig {
            preset: name.to_string(),
            architecture: Architecture::Transformer,
            vocab_size,
            d_model: 256,
            num_heads: 4,
            ffn_dim: 1024,
            encoder_layers: 3,
            decoder_layers: 3,
            dropout: 0.1,
            norm: NormPlacement::Pre,
            absolute_position: AbsolutePosition::Sinusoidal,
            max_positions: default_max_positions(),
            relative_attention: RelativeAttention::None,
            relative_clip: default_relative_clip(),
            recurrent_position: RecurrentPosition::None,
            recurrent_dim: 0,
            length_encoding: LengthEncoding::None,
            length_noise: 0,
            layer_norm_eps: 1e-5,
        };
        let relative = |config: &mut ModelConfig, kind| {
            config.relative_attention = kind;
            config.absolute_position = AbsolutePosition::None;
        };
        match variant {
            "transformer" => {}
            "transformer-learned" => config.absolute_position = AbsolutePosition::Learned,
            "rel-transformer" => relative(&mut config, RelativeAttention::KeysValues),
            "rel-keys" => relative(&mut config, RelativeAttention::Keys),
            "rel-sinusoidal" => relative(&mut config, RelativeAttention::Sinusoidal),
            "rel-absolute" => config.relative_attention = RelativeAttention::KeysValues,
            // Neishi & Yoshinaga pay for the two GRUs with one decoder layer (6+5 layers
            // against the Transformer's 6+6), which keeps the parameter counts close.
            "rnn-transformer" => {
                config.recurrent_position = RecurrentPosition::Gru;
                config.absolute_position = AbsolutePosition::None;
                config.decoder_layers -= 1;
            }
            "rr-transformer" => {
                config.recurrent_position = RecurrentPosition::Gru;
                relative(&mut config, RelativeAttention::KeysValues);
                config.decoder_layers -= 1;
            }
            "lstm-pe" => {
                config.recurrent_position = RecurrentPosition::Lstm;
                config.absolute_position = AbsolutePosition::None;
            }
            // Chen et al.'s best d_r were 320 (RPEHead) and 256 (MPRHead) of 512; RPEHead
            // needs whole heads, so both take half the width here.
            "rpe-head" => config.recurrent_position = RecurrentPosition::RpeHead,
            "mpr-head" => config.recurrent_position = RecurrentPosition::MprHead,
            // Neishi & Yoshinaga's baseline: 4 bi-LSTM encoder layers, 3 LSTM decoder layers.
            "rnn-nmt" => {
                config.architecture = Architecture::RnnNmt;
                config.absolute_position = AbsolutePosition::None;
                config.encoder_layers = 4;
                config.decoder_layers = 3;
            }
            // Takase & Okazaki's and Oka et al.'s table: the Transformer with its decoder's
            // positions replaced, without noise and with [-2, 2] and [-4, 4].
            "ldpe" | "ldpe-noise2" | "ldpe-noise4" | "lrpe" | "lrpe-noise2" | "lrpe-noise4" => {
                let (encoding, noise) = variant.split_once("-noise").unwrap_or((variant, "0"));
                config.length_encoding = match encoding {
                    "ldpe" => LengthEncoding::Ldpe,
                    _ => LengthEncoding::Lrpe,
                };
                config.length_noise = noise.parse().expect("the preset names a number");
            }
            // A decoder that plans the asked length, on a model with no input limit.
            "rel-ldpe" => {
                relative(&mut config, RelativeAttention::KeysValues);
                config.length_encoding = LengthEncoding::Ldpe;
                config.length_noise = 2;
            }
            _ => return Err(ConfigError::UnknownPreset(name.to_string())),
        }
        match size {
            PresetSize::Full => {}
            PresetSize::Small => {
                config.d_model = 128;
                config.ffn_dim = 512;
            }
            PresetSize::Tiny => {
                config.d_model = 32;
                config.num_heads = 2;
                config.ffn_dim = 64;
                config.encoder_layers = 2;
                config.decoder_layers = 2;
                config.dropout = 0.0;
            }
        }
        if matches!(
            config.recurrent_position,
            RecurrentPosition::RpeHead | RecurrentPosition::MprHead
        ) {
            config.recurrent_dim = config.d_model / 2;
        }
        config.validate()?;
        Ok(config)
    }

    pub fn head_dim(&self) -> usize {
        self.d_model / self.num_heads
    }

    /// Whether the model has a longest input it can take: learned absolute positions end
    /// at `max_positions`, and sinusoidal ones are unreliable beyond the training lengths.
    pub fn has_absolute_positions(&self) -> bool {
        self.absolute_position != AbsolutePosition::None
    }

    /// The positions a learned table holds, when the model has one: no sequence on either
    /// side may be longer (the graph's lookup would fail mid-decoding).
    pub fn position_table(&self) -> Option<usize> {
        (self.absolute_position == AbsolutePosition::Learned
            || self.architecture == Architecture::Marian)
            .then_some(self.max_positions)
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
        let combination = |message: &str| Err(ConfigError::Combination(message.to_string()));
        if self.absolute_position == AbsolutePosition::Learned && self.max_positions == 0 {
            return Err(ConfigError::Zero {
                field: "max_positions",
            });
        }
        if self.relative_attention != RelativeAttention::None {
            if self.relative_clip == 0 {
                return Err(ConfigError::Zero {
                    field: "relative_clip",
                });
            }
            if self.relative_attention == RelativeAttention::Sinusoidal
                && !self.head_dim().is_multiple_of(2)
            {
                return combination(
                    "relative_attention: sinusoidal needs an even head dimension (d_model / num_heads)",
                );
            }
        }
        if matches!(
            self.recurrent_position,
            RecurrentPosition::Gru | RecurrentPosition::Lstm
        ) && self.absolute_position != AbsolutePosition::None
        {
            return combination(
                "recurrent_position gru or lstm replaces the position-encoding layer; \
                 set absolute_position to none",
            );
        }
        if self.recurrent_position == RecurrentPosition::Lstm && !self.d_model.is_multiple_of(2) {
            return combination(
                "recurrent_position lstm runs a BiLSTM of d_model / 2 units per direction \
                 in the encoder; d_model must be even",
            );
        }
        self.validate_recurrent_embedding()?;
        self.validate_length_encoding()?;
        if self.architecture == Architecture::RnnNmt && !self.d_model.is_multiple_of(2) {
            return combination(
                "architecture rnn_nmt runs bi-LSTMs of d_model / 2 units per direction; \
                 d_model must be even",
            );
        }
        if self.architecture == Architecture::RnnNmt
            && (self.absolute_position != AbsolutePosition::None
                || self.relative_attention != RelativeAttention::None
                || self.recurrent_position != RecurrentPosition::None
                || self.length_encoding != LengthEncoding::None)
        {
            return combination(
                "architecture rnn_nmt is recurrent by construction: absolute_position, \
                 relative_attention, recurrent_position and length_encoding must all be none",
            );
        }
        if self.architecture == Architecture::Marian
            && (self.absolute_position != AbsolutePosition::Sinusoidal
                || self.norm != NormPlacement::Post
                || self.relative_attention != RelativeAttention::None
                || self.recurrent_position != RecurrentPosition::None
                || self.length_encoding != LengthEncoding::None)
        {
            return combination(
                "architecture marian is a post-norm Transformer with sinusoidal positions: \
                 norm must be post, absolute_position sinusoidal, and relative_attention, \
                 recurrent_position and length_encoding none",
            );
        }
        if self.architecture == Architecture::Marian && self.max_positions == 0 {
            return Err(ConfigError::Zero {
                field: "max_positions",
            });
        }
        Ok(())
    }

    /// Whether the decoder takes the asked target length as an input.
    pub fn is_length_aware(&self) -> bool {
        self.length_encoding != LengthEncoding::None
    }

    fn validate_length_encoding(&self) -> Result<(), ConfigError> {
        let combination = |message: &str| Err(ConfigError::Combination(message.to_string()));
        if !self.is_length_aware() {
            if self.length_noise != 0 {
                return combination("length_noise only applies to a length_encoding");
            }
            return Ok(());
        }
        if self.recurrent_position != RecurrentPosition::None {
            return combination(
                "a length_encoding replaces the decoder's positions; recurrent_position must \
                 be none",
            );
        }
        if !self.d_model.is_multiple_of(2) {
            return Err(ConfigError::OddModelDim(self.d_model));
        }
        Ok(())
    }

    /// Chen et al.'s split of the word vector into `d_model - d_r` word-and-position dims and
    /// `d_r` recurrent dims.
    fn validate_recurrent_embedding(&self) -> Result<(), ConfigError> {
        let combination = |message: String| Err(ConfigError::Combination(message));
        let (d, d_r, heads) = (self.d_model, self.recurrent_dim, self.num_heads);
        let head_split = match self.recurrent_position {
            RecurrentPosition::RpeHead => false,
            RecurrentPosition::MprHead => true,
            _ if d_r != 0 => {
                return combination(format!(
                    "recurrent_dim ({d_r}) only applies to recurrent_position rpe_head or mpr_head"
                ))
            }
            _ => return Ok(()),
        };
        if d_r == 0 || d_r >= d || !d_r.is_multiple_of(2) {
            return combination(format!(
                "recurrent_dim ({d_r}) must be even and in 1..d_model ({d}): the encoder's \
                 bidirectional RNN gives each direction half of it"
            ));
        }
        if self.absolute_position == AbsolutePosition::Learned {
            return combination(
                "rpe_head and mpr_head add sinusoidal positions to the word part of the vector; \
                 absolute_position must be sinusoidal or none"
                    .into(),
            );
        }
        if !(d - d_r).is_multiple_of(2) {
            return combination(format!(
                "d_model - recurrent_dim ({}) must be even for its sinusoidal positions",
                d - d_r
            ));
        }
        if head_split {
            if !d_r.is_multiple_of(heads) || !(d - d_r).is_multiple_of(heads) {
                return combination(format!(
                    "mpr_head gives every head a share of the recurrent dims: recurrent_dim \
                     ({d_r}) and d_model - recurrent_dim must be multiples of num_heads ({heads})"
                ));
            }
        } else if !d_r.is_multiple_of(self.head_dim()) {
            return combination(format!(
                "rpe_head gives the recurrent dims heads of their own: recurrent_dim ({d_r}) \
                 must be a multiple of the head dimension ({})",
                self.head_dim()
            ));
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
    fn an_imported_marian_model_is_post_norm_sinusoidal_with_a_table() {
        let mut config = ModelConfig::preset("transformer-tiny", 50).unwrap();
        config.preset = "marian".into();
        config.architecture = Architecture::Marian;
        config.max_positions = 64;
        let err = config.validate().unwrap_err().to_string();
        assert!(err.contains("architecture marian"), "{err}");
        config.norm = NormPlacement::Post;
        config.validate().unwrap();
        // Its sinusoids are a table the graphs gather from: limits must fit it.
        assert_eq!(config.position_table(), Some(64));
        config.relative_attention = RelativeAttention::Keys;
        assert!(config.validate().is_err());
    }

    #[test]
    fn presets_are_valid_and_unknown_names_are_listed() {
        for name in ModelConfig::PRESETS {
            ModelConfig::preset(name, 8000).unwrap();
        }
        let err = ModelConfig::preset("nope", 8000).unwrap_err();
        assert!(err.to_string().contains("rel-transformer"), "{err}");
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
    fn every_preset_has_small_and_tiny_twins_with_the_switches_of_its_paper() {
        let switches = |c: &ModelConfig| {
            (
                c.relative_attention,
                c.recurrent_position,
                c.absolute_position,
                c.length_encoding,
                c.architecture,
            )
        };
        for name in ModelConfig::PRESETS {
            let full = ModelConfig::preset(name, 8000).unwrap();
            let small = ModelConfig::preset(&format!("{name}-small"), 8000).unwrap();
            let tiny = ModelConfig::preset(&format!("{name}-tiny"), 8000).unwrap();
            assert_eq!(switches(&full), switches(&tiny), "{name}");
            assert_eq!(switches(&full), switches(&small), "{name}");
            assert_eq!(tiny.d_model, 32);
            assert_eq!((small.d_model, small.ffn_dim), (128, 512));
            assert_eq!(
                (small.encoder_layers, small.decoder_layers),
                (full.encoder_layers, full.decoder_layers),
                "{name}: the small twin keeps the variant's depth"
            );
        }
        let rel = ModelConfig::preset("rel-transformer", 8000).unwrap();
        assert_eq!(rel.relative_attention, RelativeAttention::KeysValues);
        assert_eq!(rel.absolute_position, AbsolutePosition::None);
        assert_eq!(rel.relative_clip, 16);
        let rr = ModelConfig::preset("rr-transformer", 8000).unwrap();
        assert_eq!(rr.recurrent_position, RecurrentPosition::Gru);
        assert_eq!(rr.relative_attention, RelativeAttention::KeysValues);
    }

    #[test]
    fn invalid_combinations_are_refused_with_a_reason() {
        let mut gru_with_pe = ModelConfig::preset("rnn-transformer", 8000).unwrap();
        gru_with_pe.absolute_position = AbsolutePosition::Sinusoidal;
        let err = gru_with_pe.validate().unwrap_err().to_string();
        assert!(err.contains("set absolute_position to none"), "{err}");

        let mut rnn_with_shaw = ModelConfig::preset("rnn-nmt", 8000).unwrap();
        rnn_with_shaw.relative_attention = RelativeAttention::Keys;
        let err = rnn_with_shaw.validate().unwrap_err().to_string();
        assert!(err.contains("rnn_nmt"), "{err}");

        let mut rpe_split = ModelConfig::preset("rpe-head", 8000).unwrap();
        rpe_split.recurrent_dim = 96;
        let err = rpe_split.validate().unwrap_err().to_string();
        assert!(err.contains("multiple of the head dimension (64)"), "{err}");

        let mut stray_dim = ModelConfig::preset("transformer", 8000).unwrap();
        stray_dim.recurrent_dim = 64;
        let err = stray_dim.validate().unwrap_err().to_string();
        assert!(err.contains("only applies to"), "{err}");

        let mut unclipped = ModelConfig::preset("rel-transformer", 8000).unwrap();
        unclipped.relative_clip = 0;
        assert_eq!(
            unclipped.validate(),
            Err(ConfigError::Zero {
                field: "relative_clip"
            })
        );
    }

    #[test]
    fn length_encodings_take_the_decoders_positions_only() {
        let ldpe = ModelConfig::preset("ldpe-noise4", 8000).unwrap();
        assert_eq!(
            (ldpe.length_encoding, ldpe.length_noise),
            (LengthEncoding::Ldpe, 4)
        );
        assert_eq!(ldpe.absolute_position, AbsolutePosition::Sinusoidal);
        let lrpe = ModelConfig::preset("lrpe", 8000).unwrap();
        assert_eq!(
            (lrpe.length_encoding, lrpe.length_noise),
            (LengthEncoding::Lrpe, 0)
        );
        let rel = ModelConfig::preset("rel-ldpe", 8000).unwrap();
        assert!(rel.is_length_aware() && !rel.has_absolute_positions());

        let mut recurrent = ModelConfig::preset("rnn-transformer", 8000).unwrap();
        recurrent.length_encoding = LengthEncoding::Ldpe;
        let err = recurrent.validate().unwrap_err().to_string();
        assert!(err.contains("recurrent_position must be none"), "{err}");
        let mut stray_noise = ModelConfig::preset("transformer", 8000).unwrap();
        stray_noise.length_noise = 2;
        let err = stray_noise.validate().unwrap_err().to_string();
        assert!(err.contains("only applies to a length_encoding"), "{err}");
    }

    #[test]
    fn manifests_written_before_the_switches_still_load() {
        let mut old =
            serde_json::to_value(ModelConfig::preset("transformer", 8000).unwrap()).unwrap();
        for field in [
            "architecture",
            "max_positions",
            "relative_attention",
            "relative_clip",
            "recurrent_position",
            "recurrent_dim",
            "length_encoding",
            "length_noise",
        ] {
            old.as_object_mut().unwrap().remove(field);
        }
        let config = ModelConfig::from_json(&old.to_string()).unwrap();
        assert_eq!(config, ModelConfig::preset("transformer", 8000).unwrap());
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
