//! The length predictor: a frozen BERT's `[CLS]` vector under a small MLP that corrects a
//! lexical estimate of the length.
//!
//! The lexical estimate `m` sums a learned table of target subwords per WordPiece over the
//! input's WordPieces (`[CLS]` and `[SEP]` left out). The MLP reads the `[CLS]` vector and
//! `ln m`, standardised, and gives a log-ratio `r`; the prediction is `m * exp(r)`.
//!
//! Why not the `[CLS]` vector alone: for English -> Spanish the source length is already a
//! strong predictor, and a head on `[CLS]` and the WordPiece count, trained on most books,
//! did worse than the source length on held-out books (error variance 62 against 34 on the
//! test books; `docs/model-package.md`). Training keeps the MLP's correction only when it
//! lowers the dev error; with its output layer at zero the prediction is `m`. A per-WordPiece table learns what each word costs in
//! the target (a name split into five WordPieces may be three Spanish subwords), and a sum
//! extends to inputs of any length as the text does. `m` needs only the ids and the mask, so
//! the exported graph reads nothing beyond the tokenizer's output.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{Device, Result, Tensor};

use super::bert::{Bert, Dense};

/// Weights file of a trained head.
pub const HEAD_WEIGHTS: &str = "head.safetensors";

/// Special tokens around every input (`[CLS]` first, `[SEP]` last), left out of `m`.
pub const SPECIAL_TOKENS: usize = 2;

/// `m` is taken as at least this (an empty input), so that `ln m` stays finite.
pub const MIN_LEXICAL_LENGTH: f64 = 1.0;

#[derive(Clone, Debug)]
pub struct LengthHead {
    /// `[vocab]` target subwords per WordPiece.
    pub wordpiece_lengths: Tensor,
    /// Per-feature mean and standard deviation of the training features (`[CLS]`, `ln m`).
    pub input_mean: Tensor,
    pub input_std: Tensor,
    pub fc1: Dense,
    pub fc2: Dense,
}

/// The names a head's tensors are saved under, in [`LengthHead::tensors`] order.
pub const HEAD_TENSORS: [&str; 7] = [
    "wordpiece_lengths",
    "input_mean",
    "input_std",
    "fc1.weight",
    "fc1.bias",
    "fc2.weight",
    "fc2.bias",
];

impl LengthHead {
    pub fn from_tensors(tensors: &HashMap<String, Tensor>) -> Result<Self> {
        let get = |name: &str| {
            tensors
                .get(name)
                .cloned()
                .ok_or_else(|| candle_core::Error::Msg(format!("length head lacks {name}")))
        };
        let head = Self {
            wordpiece_lengths: get("wordpiece_lengths")?,
            input_mean: get("input_mean")?,
            input_std: get("input_std")?,
            fc1: Dense {
                weight: get("fc1.weight")?,
                bias: get("fc1.bias")?,
            },
            fc2: Dense {
                weight: get("fc2.weight")?,
                bias: get("fc2.bias")?,
            },
        };
        let inputs = head.input_dim()?;
        let (hidden, fc1_inputs) = head.fc1.weight.dims2()?;
        let (outputs, fc2_inputs) = head.fc2.weight.dims2()?;
        if fc1_inputs != inputs || fc2_inputs != hidden || outputs != 1 {
            candle_core::bail!(
                "length head shapes: {inputs} features, fc1 {fc1_inputs}->{hidden}, \
                 fc2 {fc2_inputs}->{outputs}"
            );
        }
        head.wordpiece_lengths.dims1()?;
        Ok(head)
    }

    pub fn load(path: &Path, device: &Device) -> Result<Self> {
        Self::from_tensors(&candle_core::safetensors::load(path, device)?)
    }

    pub fn tensors(&self) -> Vec<(&'static str, &Tensor)> {
        let all = [
            &self.wordpiece_lengths,
            &self.input_mean,
            &self.input_std,
            &self.fc1.weight,
            &self.fc1.bias,
            &self.fc2.weight,
            &self.fc2.bias,
        ];
        HEAD_TENSORS.into_iter().zip(all).collect()
    }

    pub fn save(&self, path: &Path) -> Result<()> {
        let tensors: HashMap<String, Tensor> = self
            .tensors()
            .into_iter()
            .map(|(name, t)| (name.to_string(), t.clone()))
            .collect();
        candle_core::safetensors::save(&tensors, path)
    }

    /// BERT hidden size + 1 (`ln m`).
    pub fn input_dim(&self) -> Result<usize> {
        self.input_mean.dims1()
    }

    pub fn vocab_size(&self) -> Result<usize> {
        self.wordpiece_lengths.dims1()
    }

    /// `[batch]` lexical lengths `m` of `ids` `[batch, len]` (u32, `[CLS] .. [SEP]`) under
    /// `mask` `[batch, len]` (f32, padding trailing): the table summed over positions
    /// `1..len - 1` whose next position is real, i.e. every token but `[CLS]` and `[SEP]`.
    pub fn lexical_length(&self, ids: &Tensor, mask: &Tensor) -> Result<Tensor> {
        let (b, t) = ids.dims2()?;
        let inner = t.saturating_sub(SPECIAL_TOKENS);
        let ids = ids.narrow(1, 1, inner)?;
        let content = mask.narrow(1, SPECIAL_TOKENS, inner)?;
        let lengths = self
            .wordpiece_lengths
            .index_select(&ids.flatten_all()?, 0)?
            .reshape((b, inner))?;
        (lengths * content)?.sum(1)?.maximum(MIN_LEXICAL_LENGTH)
    }

    /// `[batch]` log-ratios `r` from `cls` `[batch, hidden]` and `m` `[batch]`.
    pub fn log_ratio(&self, cls: &Tensor, lexical: &Tensor) -> Result<Tensor> {
        let features = Tensor::cat(&[cls, &lexical.log()?.unsqueeze(1)?], 1)?;
        let standardised = features
            .broadcast_sub(&self.input_mean)?
            .broadcast_div(&self.input_std)?;
        let hidden = self.fc1.forward(&standardised)?.relu()?;
        self.fc2.forward(&hidden)?.squeeze(1)
    }

    /// `[batch]` predicted target lengths, `m * exp(r)`.
    pub fn forward(&self, ids: &Tensor, mask: &Tensor, cls: &Tensor) -> Result<Tensor> {
        let lexical = self.lexical_length(ids, mask)?;
        self.log_ratio(cls, &lexical)?.exp()? * lexical
    }
}

/// BERT and head together: what the exported graph computes.
#[derive(Clone, Debug)]
pub struct LengthPredictor {
    pub bert: Bert,
    pub head: LengthHead,
}

impl LengthPredictor {
    pub fn new(bert: Bert, head: LengthHead) -> Result<Self> {
        let expected = bert.config.hidden_size + 1;
        if head.input_dim()? != expected || head.vocab_size()? != bert.config.vocab_size {
            candle_core::bail!(
                "the head reads {} features of a {}-piece vocabulary, this BERT gives {expected} \
                 of {}",
                head.input_dim()?,
                head.vocab_size()?,
                bert.config.vocab_size
            );
        }
        Ok(Self { bert, head })
    }

    /// `[batch]` predicted target lengths of `ids` `[batch, len]` (u32, `[CLS] .. [SEP]`)
    /// under `mask` `[batch, len]` (f32, 1 = token, padding trailing).
    pub fn forward(&self, ids: &Tensor, mask: &Tensor) -> Result<Tensor> {
        let cls = self.bert.cls(ids, mask)?;
        self.head.forward(ids, mask, &cls)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lexical_length_skips_special_tokens_and_padding() {
        let dev = Device::Cpu;
        let table = Tensor::new(&[0f32, 10.0, 20.0, 1.0, 2.0, 4.0], &dev).unwrap();
        let head = LengthHead {
            wordpiece_lengths: table,
            input_mean: Tensor::zeros(1, candle_core::DType::F32, &dev).unwrap(),
            input_std: Tensor::ones(1, candle_core::DType::F32, &dev).unwrap(),
            fc1: Dense {
                weight: Tensor::zeros((1, 1), candle_core::DType::F32, &dev).unwrap(),
                bias: Tensor::zeros(1, candle_core::DType::F32, &dev).unwrap(),
            },
            fc2: Dense {
                weight: Tensor::zeros((1, 1), candle_core::DType::F32, &dev).unwrap(),
                bias: Tensor::zeros(1, candle_core::DType::F32, &dev).unwrap(),
            },
        };
        // [CLS] = 1, [SEP] = 2, padding 0: rows "3 4 5", "4", "" (floored at 1).
        let ids = Tensor::new(
            &[[1u32, 3, 4, 5, 2], [1, 4, 2, 0, 0], [1, 2, 0, 0, 0]],
            &dev,
        );
        let mask = Tensor::new(
            &[
                [1f32, 1.0, 1.0, 1.0, 1.0],
                [1.0, 1.0, 1.0, 0.0, 0.0],
                [1.0, 1.0, 0.0, 0.0, 0.0],
            ],
            &dev,
        );
        let m = head
            .lexical_length(&ids.unwrap(), &mask.unwrap())
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        assert_eq!(m, [7.0, 2.0, 1.0]);
    }
}
