//! The encoder-decoder Transformer in candle, with every position variant of the papers.
//!
//! Field names mirror checkpoint keys (`encoder.layers.0.self_attn.q_proj.weight`, ...) so that
//! `model-export` can walk this struct to write the ONNX graphs: the struct is the schema.
//! Embeddings are shared by the source, the target and the output projection (one
//! source/target vocabulary), scaled by `sqrt(d_model)` as in Vaswani et al.

use candle_core::{Module, Result, Tensor};
use candle_nn::VarBuilder;
use model_package::{
    AbsolutePosition, Architecture, ModelConfig, NormPlacement, RecurrentPosition,
};

use super::attention::{Attention, Keys};
use super::dropout::Dropout;
use super::layers::{
    embed_scaled, embedding_table, length_encoding, residual, sinusoid, tied_logits, FeedForward,
    LayerNorm,
};
use super::recurrent::{Cell, RecurrentEmbedding, Rnn};
use super::seq2seq::Seq2Seq;

#[derive(Clone, Debug)]
pub struct EncoderLayer {
    pub self_attn: Attention,
    pub self_attn_norm: LayerNorm,
    pub ffn: FeedForward,
    pub ffn_norm: LayerNorm,
}

#[derive(Clone, Debug)]
pub struct DecoderLayer {
    pub self_attn: Attention,
    pub self_attn_norm: LayerNorm,
    pub cross_attn: Attention,
    pub cross_attn_norm: LayerNorm,
    pub ffn: FeedForward,
    pub ffn_norm: LayerNorm,
}

/// Order information computed from the words themselves, in front of a stack's layers.
#[derive(Clone, Debug)]
pub enum PositionEncoder {
    /// Replaces the position-encoding layer: a GRU (Neishi & Yoshinaga's RNN-Transformer) or
    /// an LSTM (Rosendahl et al.; bidirectional in the encoder) over the scaled embeddings.
    Rnn(Rnn),
    /// Chen et al.: the first `d_model - d_r` dims carry the word and its sinusoidal
    /// position, the last `d_r` dims the recurrent positional embedding. `head_split`
    /// (MPRHead) gives every head a share of both parts instead of whole heads to each.
    RecurrentEmbedding {
        embedding: RecurrentEmbedding,
        head_split: bool,
    },
}

impl PositionEncoder {
    /// The encoder's (`bidirectional`) or the decoder's encoder for `config`, if any.
    fn new(config: &ModelConfig, bidirectional: bool, vb: VarBuilder) -> Result<Option<Self>> {
        let d = config.d_model;
        Ok(Some(match config.recurrent_position {
            RecurrentPosition::None => return Ok(None),
            RecurrentPosition::Gru => Self::Rnn(Rnn::new(Cell::Gru, d, d, false, vb)?),
            RecurrentPosition::Lstm if bidirectional => {
                Self::Rnn(Rnn::new(Cell::Lstm, d, d / 2, true, vb)?)
            }
            RecurrentPosition::Lstm => Self::Rnn(Rnn::new(Cell::Lstm, d, d, false, vb)?),
            RecurrentPosition::RpeHead | RecurrentPosition::MprHead => Self::RecurrentEmbedding {
                embedding: RecurrentEmbedding::new(config.recurrent_dim, bidirectional, vb)?,
                head_split: config.recurrent_position == RecurrentPosition::MprHead,
            },
        }))
    }
}

/// MPRHead's mixing of `word` `[b, t, d_p]` and `recurrent` `[b, t, d_r]`: head `h` gets
/// `[word_h : recurrent_h]`.
pub fn interleave_heads(word: &Tensor, recurrent: &Tensor, heads: usize) -> Result<Tensor> {
    let (b, t, dp) = word.dims3()?;
    let dr = recurrent.dim(2)?;
    Tensor::cat(
        &[
            &word.reshape((b, t, heads, dp / heads))?,
            &recurrent.reshape((b, t, heads, dr / heads))?,
        ],
        3,
    )?
    .reshape((b, t, dp + dr))
}

#[derive(Clone, Debug)]
pub struct Stack<L> {
    /// A recurrent position encoder in front of the layers (`recurrent_position`).
    pub position: Option<PositionEncoder>,
    pub layers: Vec<L>,
    /// Present with pre-norm only: the last block's output is otherwise unnormalised.
    pub final_norm: Option<LayerNorm>,
}

#[derive(Clone, Debug)]
pub struct Transformer {
    pub config: ModelConfig,
    pub embed: Tensor,
    /// `[max_positions, d]` (`absolute_position: learned` only).
    pub pos_embed: Option<Tensor>,
    pub encoder: Stack<EncoderLayer>,
    pub decoder: Stack<DecoderLayer>,
}

impl Transformer {
    pub fn new(config: ModelConfig, vb: VarBuilder) -> Result<Self> {
        config
            .validate()
            .map_err(|e| candle_core::Error::Msg(e.to_string()))?;
        if config.architecture != Architecture::Transformer {
            candle_core::bail!(
                "preset {}: architecture {:?} is not a Transformer; Model::new builds either",
                config.preset,
                config.architecture
            );
        }
        let d = config.d_model;
        let pos_embed = match config.absolute_position {
            AbsolutePosition::Learned => Some(vb.get_with_hints(
                (config.max_positions, d),
                "pos_embed.weight",
                candle_nn::Init::Randn {
                    mean: 0.0,
                    stdev: (d as f64).powf(-0.5),
                },
            )?),
            _ => None,
        };
        let embed = embedding_table(&config, &vb)?;
        let final_norm = |vb: VarBuilder| match config.norm {
            NormPlacement::Pre => {
                LayerNorm::new(d, config.layer_norm_eps, vb.pp("final_norm")).map(Some)
            }
            NormPlacement::Post => Ok(None),
        };
        let eps = config.layer_norm_eps;
        let vb_enc = vb.pp("encoder");
        let encoder = Stack {
            position: PositionEncoder::new(&config, true, vb_enc.pp("position"))?,
            layers: (0..config.encoder_layers)
                .map(|i| {
                    let vb = vb_enc.pp(format!("layers.{i}"));
                    Ok(EncoderLayer {
                        self_attn: Attention::new(&config, vb.pp("self_attn"), true)?,
                        self_attn_norm: LayerNorm::new(d, eps, vb.pp("self_attn_norm"))?,
                        ffn: FeedForward::new(&config, vb.pp("ffn"))?,
                        ffn_norm: LayerNorm::new(d, eps, vb.pp("ffn_norm"))?,
                    })
                })
                .collect::<Result<_>>()?,
            final_norm: final_norm(vb_enc.clone())?,
        };
        let vb_dec = vb.pp("decoder");
        let decoder = Stack {
            position: PositionEncoder::new(&config, false, vb_dec.pp("position"))?,
            layers: (0..config.decoder_layers)
                .map(|i| {
                    let vb = vb_dec.pp(format!("layers.{i}"));
                    Ok(DecoderLayer {
                        self_attn: Attention::new(&config, vb.pp("self_attn"), true)?,
                        self_attn_norm: LayerNorm::new(d, eps, vb.pp("self_attn_norm"))?,
                        cross_attn: Attention::new(&config, vb.pp("cross_attn"), false)?,
                        cross_attn_norm: LayerNorm::new(d, eps, vb.pp("cross_attn_norm"))?,
                        ffn: FeedForward::new(&config, vb.pp("ffn"))?,
                        ffn_norm: LayerNorm::new(d, eps, vb.pp("ffn_norm"))?,
                    })
                })
                .collect::<Result<_>>()?,
            final_norm: final_norm(vb_dec.clone())?,
        };
        Ok(Self {
            config,
            embed,
            pos_embed,
            encoder,
            decoder,
        })
    }

    /// Scaled word embeddings plus the order information of `position` (the stack's
    /// recurrent encoder) and of absolute positions `0..len`, for `[batch, len]` ids; or,
    /// given the asked `lengths` (a length-aware decoder), the length encoding in place of
    /// the absolute positions. `mask` marks trailing padding (a bidirectional encoder must
    /// not read it).
    fn embed_with_positions(
        &self,
        ids: &Tensor,
        mask: Option<&Tensor>,
        position: &Option<PositionEncoder>,
        lengths: Option<&Tensor>,
        dropout: &Dropout,
    ) -> Result<Tensor> {
        let t = ids.dim(1)?;
        let d = self.config.d_model;
        let words = embed_scaled(&self.embed, ids)?;
        let positions = Tensor::arange(0u32, t as u32, ids.device())?;
        let (words, recurrent) = match position {
            Some(PositionEncoder::Rnn(rnn)) => (rnn.run(&words, mask)?.0, None),
            Some(PositionEncoder::RecurrentEmbedding {
                embedding,
                head_split,
            }) => {
                let d_r = self.config.recurrent_dim;
                let (r, _) = embedding.run(&words.narrow(2, d - d_r, d_r)?, mask)?;
                (words.narrow(2, 0, d - d_r)?, Some((r, *head_split)))
            }
            None => (words, None),
        };
        let x = match (lengths, self.config.absolute_position, &self.pos_embed) {
            (Some(lengths), _, _) => {
                let width = words.dim(2)?;
                let encoding = length_encoding(self.config.length_encoding, lengths, t, width)?;
                words.add(&encoding)?
            }
            (None, AbsolutePosition::Sinusoidal, _) => {
                let width = words.dim(2)?;
                words.broadcast_add(&sinusoid(&positions, width)?.unsqueeze(0)?)?
            }
            (None, AbsolutePosition::Learned, Some(table)) => {
                if t > self.config.max_positions {
                    candle_core::bail!(
                        "{t} positions but the learned position table has {}",
                        self.config.max_positions
                    );
                }
                words.broadcast_add(&table.narrow(0, 0, t)?.unsqueeze(0)?)?
            }
            _ => words,
        };
        let x = match recurrent {
            Some((r, false)) => Tensor::cat(&[&x, &r], 2)?,
            Some((r, true)) => interleave_heads(&x, &r, self.config.num_heads)?,
            None => x,
        };
        dropout.apply(&x)
    }
}

impl Seq2Seq for Transformer {
    fn config(&self) -> &ModelConfig {
        &self.config
    }

    fn encode(
        &self,
        source_ids: &Tensor,
        source_mask: &Tensor,
        dropout: &Dropout,
    ) -> Result<Tensor> {
        let keys = Keys::from_mask(source_mask)?;
        let norm = self.config.norm;
        let mut x = self.embed_with_positions(
            source_ids,
            Some(source_mask),
            &self.encoder.position,
            None,
            dropout,
        )?;
        for layer in &self.encoder.layers {
            x = residual(&x, &layer.self_attn_norm, norm, dropout, |h| {
                layer.self_attn.self_attention(h, &keys)
            })?;
            x = residual(&x, &layer.ffn_norm, norm, dropout, |h| {
                layer.ffn.forward(h, dropout)
            })?;
        }
        match &self.encoder.final_norm {
            Some(n) => n.forward(&x),
            None => Ok(x),
        }
    }

    fn decode(
        &self,
        target_ids: &Tensor,
        target_lengths: Option<&Tensor>,
        memory: &Tensor,
        source_mask: &Tensor,
        dropout: &Dropout,
    ) -> Result<Tensor> {
        let memory_keys = Keys::from_mask(source_mask)?;
        let norm = self.config.norm;
        let lengths = match (self.config.is_length_aware(), target_lengths) {
            (true, None) => candle_core::bail!(
                "preset {}: a length-aware decoder needs the target lengths",
                self.config.preset
            ),
            (true, lengths) => lengths,
            (false, _) => None,
        };
        // Target padding is trailing and the decoder's encoders run forward only.
        let mut x =
            self.embed_with_positions(target_ids, None, &self.decoder.position, lengths, dropout)?;
        for layer in &self.decoder.layers {
            x = residual(&x, &layer.self_attn_norm, norm, dropout, |h| {
                layer.self_attn.self_attention(h, &Keys::Causal)
            })?;
            x = residual(&x, &layer.cross_attn_norm, norm, dropout, |h| {
                layer.cross_attn.cross_attention(h, memory, &memory_keys)
            })?;
            x = residual(&x, &layer.ffn_norm, norm, dropout, |h| {
                layer.ffn.forward(h, dropout)
            })?;
        }
        if let Some(n) = &self.decoder.final_norm {
            x = n.forward(&x)?;
        }
        tied_logits(&x, &self.embed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};
    use candle_nn::VarMap;

    #[test]
    fn a_length_aware_decoder_needs_lengths_and_follows_them() {
        let varmap = VarMap::new();
        let config = ModelConfig::preset("rel-ldpe-tiny", 50).unwrap();
        let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
        let model = Transformer::new(config, vb).unwrap();
        let dev = Device::Cpu;
        let source = Tensor::new(&[[5u32, 6, 7, 2]], &dev).unwrap();
        let mask = Tensor::ones((1, 4), DType::F32, &dev).unwrap();
        let target = Tensor::new(&[[1u32, 8, 9]], &dev).unwrap();
        let off = Dropout::off();
        let err = model
            .forward(&source, &mask, &target, None, &off)
            .unwrap_err()
            .to_string();
        assert!(err.contains("needs the target lengths"), "{err}");
        let logits = |len: u32| {
            let lengths = Tensor::new(&[len], &dev).unwrap();
            model
                .forward(&source, &mask, &target, Some(&lengths), &off)
                .unwrap()
        };
        assert!(crate::max_abs_diff(&logits(3), &logits(3)) == 0.0);
        assert!(crate::max_abs_diff(&logits(3), &logits(12)) > 1e-3);
    }

    #[test]
    fn mpr_head_gives_every_head_its_share_of_both_parts() {
        let dev = Device::Cpu;
        // Two heads; word part [0 1 2 3], recurrent part [10 11].
        let word = Tensor::new(&[[[0f32, 1.0, 2.0, 3.0]]], &dev).unwrap();
        let recurrent = Tensor::new(&[[[10f32, 11.0]]], &dev).unwrap();
        let mixed = interleave_heads(&word, &recurrent, 2).unwrap();
        assert_eq!(
            mixed.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            vec![0.0, 1.0, 10.0, 2.0, 3.0, 11.0]
        );
    }
}
