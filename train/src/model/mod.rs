//! The models in candle: the Transformer family with every position variant of the papers
//! ([`transformer`]) and the RNN-NMT baseline ([`rnn_nmt`]), behind one interface
//! ([`Seq2Seq`]), built from shared [`layers`], [`attention`] and [`recurrent`] encoders.
//! Beside them, the length predictor: a frozen [`bert`] encoder under a [`length_head`].

pub mod attention;
pub mod bert;
pub mod dropout;
pub mod layers;
pub mod length_head;
pub mod recurrent;
pub mod rnn_nmt;
pub mod seq2seq;
pub mod transformer;

use candle_core::{Result, Tensor};
use candle_nn::VarBuilder;
use model_package::{Architecture, ModelConfig};

pub use attention::{relative_indices, step_key_positions, Attention, RelativeTables};
pub use dropout::Dropout;
pub use layers::{
    additive_mask, length_encoding, length_ratio_exponents, residual, sinusoid,
    sinusoid_inverse_frequencies, FeedForward, LayerNorm, MASKED_SCORE,
};
pub use rnn_nmt::RnnNmt;
pub use seq2seq::Seq2Seq;
pub use transformer::{DecoderLayer, EncoderLayer, PositionEncoder, Stack, Transformer};

/// A model of either family, chosen by the config's `architecture`.
// One per process or test: the size difference between the variants costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
pub enum Model {
    Transformer(Transformer),
    RnnNmt(RnnNmt),
}

impl Model {
    pub fn new(config: ModelConfig, vb: VarBuilder) -> Result<Self> {
        Ok(match config.architecture {
            Architecture::Transformer => Self::Transformer(Transformer::new(config, vb)?),
            Architecture::RnnNmt => Self::RnnNmt(RnnNmt::new(config, vb)?),
            Architecture::Marian => candle_core::bail!(
                "architecture marian: an imported Hugging Face model, served from its graphs, \
                 not built or trained here"
            ),
        })
    }

    fn inner(&self) -> &dyn Seq2Seq {
        match self {
            Self::Transformer(m) => m,
            Self::RnnNmt(m) => m,
        }
    }
}

impl Seq2Seq for Model {
    fn config(&self) -> &ModelConfig {
        self.inner().config()
    }
    fn encode(&self, ids: &Tensor, mask: &Tensor, dropout: &Dropout) -> Result<Tensor> {
        self.inner().encode(ids, mask, dropout)
    }
    fn decode(
        &self,
        ids: &Tensor,
        lengths: Option<&Tensor>,
        memory: &Tensor,
        mask: &Tensor,
        dropout: &Dropout,
    ) -> Result<Tensor> {
        self.inner().decode(ids, lengths, memory, mask, dropout)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::max_abs_diff;
    use candle_core::{DType, Device};
    use candle_nn::VarMap;

    /// Every preset, tiny.
    fn every_tiny_model() -> impl Iterator<Item = Model> {
        ModelConfig::PRESETS.iter().map(|name| {
            let varmap = VarMap::new();
            let config = ModelConfig::preset(&format!("{name}-tiny"), 50).unwrap();
            Model::new(
                config,
                VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu),
            )
            .unwrap()
        })
    }

    #[test]
    fn every_preset_builds_its_family() {
        for (model, name) in every_tiny_model().zip(ModelConfig::PRESETS) {
            assert_eq!(model.config().preset, format!("{name}-tiny"));
            assert_eq!(
                *name == "rnn-nmt",
                matches!(model, Model::RnnNmt(_)),
                "{name}"
            );
        }
    }

    #[test]
    fn padding_never_changes_real_positions() {
        for model in every_tiny_model() {
            padding_never_changes_real_positions_of(&model);
        }
    }

    fn padding_never_changes_real_positions_of(model: &Model) {
        let dev = Device::Cpu;
        let off = Dropout::off();
        let ids = Tensor::new(&[[5u32, 6, 7]], &dev).unwrap();
        let mask = Tensor::new(&[[1f32, 1.0, 1.0]], &dev).unwrap();
        let padded_ids = Tensor::new(&[[5u32, 6, 7, 0, 0]], &dev).unwrap();
        let padded_mask = Tensor::new(&[[1f32, 1.0, 1.0, 0.0, 0.0]], &dev).unwrap();
        let target = Tensor::new(&[[1u32, 9, 10]], &dev).unwrap();
        let lengths = Tensor::new(&[2u32], &dev).unwrap();
        let a = model
            .forward(&ids, &mask, &target, Some(&lengths), &off)
            .unwrap();
        let b = model
            .forward(&padded_ids, &padded_mask, &target, Some(&lengths), &off)
            .unwrap();
        assert!(max_abs_diff(&a, &b) < 1e-5);
        let memory = model
            .encode(&padded_ids, &padded_mask, &off)
            .unwrap()
            .narrow(1, 0, 3)
            .unwrap();
        let unpadded = model.encode(&ids, &mask, &off).unwrap();
        assert!(max_abs_diff(&memory, &unpadded) < 1e-5);
    }

    #[test]
    fn decoder_never_looks_ahead() {
        for model in every_tiny_model() {
            decoder_never_looks_ahead_of(&model);
        }
    }

    fn decoder_never_looks_ahead_of(model: &Model) {
        let dev = Device::Cpu;
        let off = Dropout::off();
        let ids = Tensor::new(&[[5u32, 6, 7]], &dev).unwrap();
        let mask = Tensor::ones((1, 3), DType::F32, &dev).unwrap();
        let lengths = Tensor::new(&[2u32], &dev).unwrap();
        let run = |target: [u32; 3]| {
            model
                .forward(
                    &ids,
                    &mask,
                    &Tensor::new(&[target], &dev).unwrap(),
                    Some(&lengths),
                    &off,
                )
                .unwrap()
        };
        let (a, b) = (run([1, 9, 10]), run([1, 9, 33]));
        let prefix = |t: &Tensor| t.narrow(1, 0, 2).unwrap();
        assert!(max_abs_diff(&prefix(&a), &prefix(&b)) < 1e-6);
        assert!(max_abs_diff(&a, &b) > 1e-4);
    }
}
