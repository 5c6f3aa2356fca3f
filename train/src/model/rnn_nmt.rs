//! The RNN-NMT baseline of Neishi & Yoshinaga (Luong et al. 2015): a stack of bi-LSTMs over
//! the source, a stack of LSTMs over the target with input feeding, and dot attention.
//!
//! At target step `t` the first decoder layer reads `[y_{t-1} ; h~_{t-1}]` (input feeding);
//! the top layer's `h_t` scores every source state `h_s` by `h_t . h_s` (Luong's "dot"),
//! the context `c_t` is the attention-weighted source, and `h~_t = tanh(W_c [c_t ; h_t])`
//! gives the logits through the tied embeddings. Decoder states start at zero, like every
//! recurrent state of the decoder-step contract, so the decoder learns its start from the
//! attention alone (no bridge from the encoder's final state).
//!
//! Embeddings are tied and scaled by `sqrt(d_model)` as in the Transformer, so both families
//! share the initialisation and the output projection.

use candle_core::{Module, Result, Tensor, D};
use candle_nn::{Linear, VarBuilder};
use model_package::{Architecture, ModelConfig};

use super::dropout::Dropout;
use super::layers::{additive_mask, embed_scaled, embedding_table, tied_logits};
use super::recurrent::{Cell, Rnn, State};
use super::seq2seq::Seq2Seq;

#[derive(Clone, Debug)]
pub struct RnnEncoder {
    /// Bi-LSTMs of `d_model / 2` units per direction.
    pub layers: Vec<Rnn>,
}

#[derive(Clone, Debug)]
pub struct RnnDecoder {
    /// LSTMs of `d_model` units; the first reads `[embedding ; input feed]`.
    pub layers: Vec<Rnn>,
    /// Luong's `W_c` `[d, 2d]` over `[c_t ; h_t]`.
    pub attn_out: Linear,
}

#[derive(Clone, Debug)]
pub struct RnnNmt {
    pub config: ModelConfig,
    pub embed: Tensor,
    pub encoder: RnnEncoder,
    pub decoder: RnnDecoder,
}

/// What one target step carries to the next: every layer's LSTM state and the input feed
/// `h~_{t-1}`.
#[derive(Clone, Debug)]
pub struct DecoderState {
    pub layers: Vec<State>,
    pub input_feed: Tensor,
}

impl RnnNmt {
    pub fn new(config: ModelConfig, vb: VarBuilder) -> Result<Self> {
        config
            .validate()
            .map_err(|e| candle_core::Error::Msg(e.to_string()))?;
        if config.architecture != Architecture::RnnNmt {
            candle_core::bail!("preset {}: not an rnn_nmt config", config.preset);
        }
        let d = config.d_model;
        let embed = embedding_table(&config, &vb)?;
        let vb_enc = vb.pp("encoder.layers");
        let encoder = RnnEncoder {
            layers: (0..config.encoder_layers)
                .map(|i| Rnn::new(Cell::Lstm, d, d / 2, true, vb_enc.pp(i)))
                .collect::<Result<_>>()?,
        };
        let vb_dec = vb.pp("decoder");
        let decoder = RnnDecoder {
            layers: (0..config.decoder_layers)
                .map(|i| {
                    let input = if i == 0 { 2 * d } else { d };
                    Rnn::new(Cell::Lstm, input, d, false, vb_dec.pp("layers").pp(i))
                })
                .collect::<Result<_>>()?,
            attn_out: candle_nn::linear_no_bias(2 * d, d, vb_dec.pp("attn_out"))?,
        };
        Ok(Self {
            config,
            embed,
            encoder,
            decoder,
        })
    }

    /// Zero state for `batch` rows: nothing decoded yet.
    pub fn initial_state(&self, batch: usize, like: &Tensor) -> Result<DecoderState> {
        let d = self.config.d_model;
        Ok(DecoderState {
            layers: (0..self.decoder.layers.len())
                .map(|_| State::zeros(Cell::Lstm, batch, d, like))
                .collect::<Result<_>>()?,
            input_feed: Tensor::zeros((batch, d), like.dtype(), like.device())?,
        })
    }

    /// One target step: `word` `[batch, d]` (the scaled embedding of the previous token),
    /// `memory` `[batch, src_len, d]`, `source_bias` `[batch, src_len]` (0 or
    /// [`super::layers::MASKED_SCORE`]) -> `h~_t` `[batch, d]` and the next state.
    pub fn step(
        &self,
        word: &Tensor,
        memory: &Tensor,
        source_bias: &Tensor,
        state: &DecoderState,
        dropout: &Dropout,
    ) -> Result<(Tensor, DecoderState)> {
        let mut input = Tensor::cat(&[word, &state.input_feed], D::Minus1)?;
        let mut layers = Vec::with_capacity(state.layers.len());
        for (layer, previous) in self.decoder.layers.iter().zip(&state.layers) {
            let next = layer.step(&input, previous)?;
            input = dropout.apply(&next.h)?;
            layers.push(next);
        }
        let h = input;
        // Luong's dot score h_t . h_s, no scaling.
        let scores = memory
            .matmul(&h.unsqueeze(2)?)?
            .squeeze(2)?
            .add(source_bias)?;
        let weights = candle_nn::ops::softmax(&scores, D::Minus1)?;
        let context = weights.unsqueeze(1)?.matmul(memory)?.squeeze(1)?;
        let attentional = self
            .decoder
            .attn_out
            .forward(&Tensor::cat(&[&context, &h], D::Minus1)?)?
            .tanh()?;
        let attentional = dropout.apply(&attentional)?;
        Ok((
            attentional.clone(),
            DecoderState {
                layers,
                input_feed: attentional,
            },
        ))
    }
}

/// Input feeding makes the decoder sequential, so training's teacher-forced pass runs it one
/// step at a time as well.
impl Seq2Seq for RnnNmt {
    fn config(&self) -> &ModelConfig {
        &self.config
    }

    fn encode(
        &self,
        source_ids: &Tensor,
        source_mask: &Tensor,
        dropout: &Dropout,
    ) -> Result<Tensor> {
        let mut x = dropout.apply(&embed_scaled(&self.embed, source_ids)?)?;
        for layer in &self.encoder.layers {
            x = dropout.apply(&layer.run(&x, Some(source_mask))?.0)?;
        }
        Ok(x)
    }

    fn decode(
        &self,
        target_ids: &Tensor,
        _target_lengths: Option<&Tensor>,
        memory: &Tensor,
        source_mask: &Tensor,
        dropout: &Dropout,
    ) -> Result<Tensor> {
        let (b, t) = target_ids.dims2()?;
        let words = dropout.apply(&embed_scaled(&self.embed, target_ids)?)?;
        let bias = additive_mask(source_mask)?;
        let mut state = self.initial_state(b, memory)?;
        let mut outputs = Vec::with_capacity(t);
        for i in 0..t {
            let word = words.narrow(1, i, 1)?.squeeze(1)?;
            let (out, next) = self.step(&word, memory, &bias, &state, dropout)?;
            outputs.push(out);
            state = next;
        }
        tied_logits(&Tensor::stack(&outputs, 1)?, &self.embed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::max_abs_diff;
    use candle_core::{DType, Device};
    use candle_nn::VarMap;

    fn tiny() -> RnnNmt {
        let varmap = VarMap::new();
        let config = ModelConfig::preset("rnn-nmt-tiny", 50).unwrap();
        RnnNmt::new(
            config,
            VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu),
        )
        .unwrap()
    }

    #[test]
    fn attention_follows_the_source_content() {
        // Two sources that differ in one token give different first-step logits: the decoder
        // starts from zero state, so only the attention can carry the source in.
        let model = tiny();
        let dev = Device::Cpu;
        let off = Dropout::off();
        let mask = Tensor::ones((1, 3), DType::F32, &dev).unwrap();
        let target = Tensor::new(&[[1u32]], &dev).unwrap();
        let run = |src: [u32; 3]| {
            model
                .forward(
                    &Tensor::new(&[src], &dev).unwrap(),
                    &mask,
                    &target,
                    None,
                    &off,
                )
                .unwrap()
        };
        assert!(max_abs_diff(&run([5, 6, 7]), &run([5, 6, 8])) > 1e-4);
    }
}
