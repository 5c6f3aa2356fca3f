//! The encoder-decoder Transformer in candle.
//!
//! Field names mirror checkpoint keys (`encoder.layers.0.self_attn.q_proj.weight`, ...) so that
//! `model-export` can walk this struct to write the ONNX graphs: the struct is the schema.
//! Embeddings are shared by the source, the target and the output projection (one
//! source/target vocabulary), scaled by `sqrt(d_model)` as in Vaswani et al.

use candle_core::{DType, Device, Module, Result, Tensor, D};
use candle_nn::{Linear, VarBuilder};
use model_package::{
    AbsolutePosition, Architecture, ModelConfig, NormPlacement, RecurrentPosition,
    RelativeAttention,
};

use crate::dropout::Dropout;
use crate::recurrent::{Cell, RecurrentEmbedding, Rnn};
use crate::rnn_nmt::RnnNmt;

/// Added to attention scores at masked keys. Large and finite so that a fully padded row
/// still gives a defined softmax; the ONNX graphs use the same value.
pub const MASKED_SCORE: f64 = -1e9;

/// `10000^(-2i/d)` for `i` in `0..d/2`: the angle of position `p` in dims `2i` and `2i+1` is
/// `p * inverse_frequencies[i]`. Computed in f64 once and shared with the exporter so both
/// sides start from identical f32 constants.
pub fn sinusoid_inverse_frequencies(d_model: usize) -> Vec<f32> {
    (0..d_model / 2)
        .map(|i| 10000f64.powf(-2.0 * i as f64 / d_model as f64) as f32)
        .collect()
}

/// Vaswani et al.'s encoding for the given positions: `[n, d]`, `sin` on even dims, `cos` on
/// odd dims.
pub fn sinusoid(positions: &Tensor, d_model: usize) -> Result<Tensor> {
    sinusoid_of(&positions.to_dtype(DType::F32)?, d_model)
}

/// [`sinusoid`] of f32 values (which may be negative: relative distances).
fn sinusoid_of(values: &Tensor, d_model: usize) -> Result<Tensor> {
    let n = values.dim(0)?;
    let inv = Tensor::new(sinusoid_inverse_frequencies(d_model), values.device())?;
    let angles = values
        .reshape((n, 1))?
        .broadcast_mul(&inv.reshape((1, d_model / 2))?)?;
    Tensor::stack(&[angles.sin()?, angles.cos()?], 2)?.reshape((n, d_model))
}

/// Shaw et al.'s table index of each (query, key) pair: `clip(key - query, -k, k) + k`, in
/// `0..=2k`. Row `i` is query `query_positions[i]`, column `j` key `key_positions[j]`.
pub fn relative_indices(query_positions: &[i64], key_positions: &[i64], clip: usize) -> Vec<u32> {
    let k = clip as i64;
    query_positions
        .iter()
        .flat_map(|&q| {
            key_positions
                .iter()
                .map(move |&key| ((key - q).clamp(-k, k) + k) as u32)
        })
        .collect()
}

/// The key positions of a decoder step's cache of `cache_len` columns for a row at
/// `position`: the row's own keys are the last `position + 1` columns (earlier columns are
/// padding a batcher inserted, masked), so column `j` holds position
/// `position - (cache_len - 1 - j)`, and the distance to the query is `j - (cache_len - 1)`
/// whatever the row's position.
pub fn step_key_positions(position: i64, cache_len: usize) -> Vec<i64> {
    (0..cache_len as i64)
        .map(|j| position - (cache_len as i64 - 1 - j))
        .collect()
}

/// The fixed table of `relative_attention: sinusoidal`: row `d + k` is Vaswani et al.'s
/// encoding of the signed distance `d` in `-k..=k`, `[2k+1, dim]`.
pub fn relative_sinusoid_table(clip: usize, dim: usize, device: &Device) -> Result<Tensor> {
    let k = clip as i64;
    let distances: Vec<f32> = (-k..=k).map(|d| d as f32).collect();
    sinusoid_of(&Tensor::new(distances, device)?, dim)
}

/// The learned (or fixed) vectors of one attention layer's relative distances.
#[derive(Clone, Debug)]
pub struct RelativeTables {
    /// `[2k+1, head_dim]`, added to the keys.
    pub keys: Tensor,
    /// `[2k+1, head_dim]`, added to the values (`None` for keys-only).
    pub values: Option<Tensor>,
    pub clip: usize,
}

impl RelativeTables {
    fn new(config: &ModelConfig, vb: VarBuilder) -> Result<Option<Self>> {
        let (rows, dim, clip) = (
            2 * config.relative_clip + 1,
            config.head_dim(),
            config.relative_clip,
        );
        let init = candle_nn::Init::Randn {
            mean: 0.0,
            stdev: (dim as f64).powf(-0.5),
        };
        Ok(match config.relative_attention {
            RelativeAttention::None => None,
            RelativeAttention::KeysValues => Some(Self {
                keys: vb.get_with_hints((rows, dim), "relative_keys", init)?,
                values: Some(vb.get_with_hints((rows, dim), "relative_values", init)?),
                clip,
            }),
            RelativeAttention::Keys => Some(Self {
                keys: vb.get_with_hints((rows, dim), "relative_keys", init)?,
                values: None,
                clip,
            }),
            RelativeAttention::Sinusoidal => {
                let table = relative_sinusoid_table(clip, dim, vb.device())?;
                Some(Self {
                    keys: table.clone(),
                    values: Some(table),
                    clip,
                })
            }
        })
    }

    /// `[lq, lk, head_dim]` vectors of `table` for the pairs' indices.
    fn gather(table: &Tensor, indices: &Tensor, lq: usize, lk: usize) -> Result<Tensor> {
        table
            .index_select(indices, 0)?
            .reshape((lq, lk, table.dim(1)?))
    }
}

/// The embedding table `[vocab, d]` shared by the source, the target and the output
/// projection (one vocabulary for both languages), drawn from N(0, d^-1/2).
pub fn embedding_table(config: &ModelConfig, vb: &VarBuilder) -> Result<Tensor> {
    vb.get_with_hints(
        (config.vocab_size, config.d_model),
        "embed.weight",
        candle_nn::Init::Randn {
            mean: 0.0,
            stdev: (config.d_model as f64).powf(-0.5),
        },
    )
}

/// Embeddings of `[batch, len]` ids scaled by `sqrt(d)`: `[batch, len, d]`.
pub fn embed_scaled(table: &Tensor, ids: &Tensor) -> Result<Tensor> {
    let (b, t) = ids.dims2()?;
    let d = table.dim(1)?;
    let words = table
        .index_select(&ids.flatten_all()?, 0)?
        .reshape((b, t, d))?;
    words * (d as f64).sqrt()
}

/// Logits `[batch, len, vocab]` of decoder outputs `x` `[batch, len, d]` through the tied
/// embedding `table`.
pub fn tied_logits(x: &Tensor, table: &Tensor) -> Result<Tensor> {
    // One [rows*len, d] x [d, vocab] product: broadcast_matmul would materialise a copy of
    // the embedding table per row (and sum them again in the backward pass).
    let (b, t, d) = x.dims3()?;
    x.reshape((b * t, d))?
        .matmul(&table.t()?)?
        .reshape((b, t, ()))
}

/// Layer normalisation written with differentiable ops: candle's fused kernel has no
/// backward pass.
#[derive(Clone, Debug)]
pub struct LayerNorm {
    pub weight: Tensor,
    pub bias: Tensor,
    pub eps: f64,
}

impl LayerNorm {
    fn new(d: usize, eps: f64, vb: VarBuilder) -> Result<Self> {
        Ok(Self {
            weight: vb.get_with_hints(d, "weight", candle_nn::Init::Const(1.0))?,
            bias: vb.get_with_hints(d, "bias", candle_nn::Init::Const(0.0))?,
            eps,
        })
    }
}

impl Module for LayerNorm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mean = x.mean_keepdim(D::Minus1)?;
        let centered = x.broadcast_sub(&mean)?;
        let var = centered.sqr()?.mean_keepdim(D::Minus1)?;
        centered
            .broadcast_div(&(var + self.eps)?.sqrt()?)?
            .broadcast_mul(&self.weight)?
            .broadcast_add(&self.bias)
    }
}

#[derive(Clone, Debug)]
pub struct Attention {
    pub q_proj: Linear,
    pub k_proj: Linear,
    pub v_proj: Linear,
    pub out_proj: Linear,
    /// Shaw et al.'s distance vectors (self-attention of relative models only).
    pub relative: Option<RelativeTables>,
    pub num_heads: usize,
    pub head_dim: usize,
}

impl Attention {
    fn new(config: &ModelConfig, vb: VarBuilder, self_attention: bool) -> Result<Self> {
        let d = config.d_model;
        let relative = if self_attention {
            RelativeTables::new(config, vb.clone())?
        } else {
            None
        };
        Ok(Self {
            q_proj: candle_nn::linear(d, d, vb.pp("q_proj"))?,
            k_proj: candle_nn::linear(d, d, vb.pp("k_proj"))?,
            v_proj: candle_nn::linear(d, d, vb.pp("v_proj"))?,
            out_proj: candle_nn::linear(d, d, vb.pp("out_proj"))?,
            relative,
            num_heads: config.num_heads,
            head_dim: config.head_dim(),
        })
    }

    /// `[batch, len, d]` -> `[batch, heads, len, head_dim]`
    fn split_heads(&self, x: &Tensor) -> Result<Tensor> {
        let (b, t, _) = x.dims3()?;
        x.reshape((b, t, self.num_heads, self.head_dim))?
            .transpose(1, 2)?
            .contiguous()
    }

    /// `bias` broadcasts to `[batch, heads, query_len, key_len]` and holds 0 or
    /// [`MASKED_SCORE`].
    pub fn forward(&self, query: &Tensor, key_value: &Tensor, bias: &Tensor) -> Result<Tensor> {
        let (b, tq, d) = query.dims3()?;
        let tk = key_value.dim(1)?;
        let q = self.split_heads(&self.q_proj.forward(query)?)?;
        let k = self.split_heads(&self.k_proj.forward(key_value)?)?;
        let v = self.split_heads(&self.v_proj.forward(key_value)?)?;
        let scale = 1.0 / (self.head_dim as f64).sqrt();
        let mut scores = q.matmul(&k.t()?)?;
        // Queries and keys of self-attention sit at positions 0..len (padding at the end).
        let relative = match &self.relative {
            Some(tables) => {
                let positions: Vec<i64> = (0..tq.max(tk) as i64).collect();
                let indices = relative_indices(&positions[..tq], &positions[..tk], tables.clip);
                Some((tables, Tensor::from_vec(indices, tq * tk, query.device())?))
            }
            None => None,
        };
        if let Some((tables, indices)) = &relative {
            // q . a_ij for every pair: per query i, [b*h, dh] x [dh, tk].
            let a_k = RelativeTables::gather(&tables.keys, indices, tq, tk)?;
            let q_by_query = q
                .reshape((b * self.num_heads, tq, self.head_dim))?
                .transpose(0, 1)?;
            let rel = q_by_query
                .contiguous()?
                .matmul(&a_k.transpose(1, 2)?.contiguous()?)?
                .transpose(0, 1)?
                .reshape((b, self.num_heads, tq, tk))?;
            scores = (scores + rel)?;
        }
        let scores = (scores * scale)?.broadcast_add(bias)?;
        let probs = candle_nn::ops::softmax(&scores, D::Minus1)?;
        let mut context = probs.matmul(&v)?;
        if let Some((tables, indices)) = &relative {
            if let Some(values) = &tables.values {
                let a_v = RelativeTables::gather(values, indices, tq, tk)?;
                let p_by_query = probs
                    .reshape((b * self.num_heads, tq, tk))?
                    .transpose(0, 1)?
                    .contiguous()?;
                let rel = p_by_query.matmul(&a_v)?.transpose(0, 1)?.reshape((
                    b,
                    self.num_heads,
                    tq,
                    self.head_dim,
                ))?;
                context = (context + rel)?;
            }
        }
        let context = context.transpose(1, 2)?.reshape((b, tq, d))?;
        self.out_proj.forward(&context)
    }
}

#[derive(Clone, Debug)]
pub struct FeedForward {
    pub fc1: Linear,
    pub fc2: Linear,
}

impl FeedForward {
    fn new(config: &ModelConfig, vb: VarBuilder) -> Result<Self> {
        Ok(Self {
            fc1: candle_nn::linear(config.d_model, config.ffn_dim, vb.pp("fc1"))?,
            fc2: candle_nn::linear(config.ffn_dim, config.d_model, vb.pp("fc2"))?,
        })
    }

    fn forward(&self, x: &Tensor, dropout: &Dropout) -> Result<Tensor> {
        let hidden = dropout.apply(&self.fc1.forward(x)?.relu()?)?;
        self.fc2.forward(&hidden)
    }
}

/// One residual block around `sublayer`, with the norm where the config puts it.
fn residual(
    x: &Tensor,
    norm: &LayerNorm,
    placement: NormPlacement,
    dropout: &Dropout,
    sublayer: impl FnOnce(&Tensor) -> Result<Tensor>,
) -> Result<Tensor> {
    match placement {
        NormPlacement::Pre => x + dropout.apply(&sublayer(&norm.forward(x)?)?)?,
        NormPlacement::Post => norm.forward(&(x + dropout.apply(&sublayer(x)?)?)?),
    }
}

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

/// `[batch, len]` mask of 1/0 -> additive `[batch, 1, 1, len]` bias.
pub fn padding_bias(mask: &Tensor) -> Result<Tensor> {
    let (b, t) = mask.dims2()?;
    additive_mask(mask)?.reshape((b, 1, 1, t))
}

/// A 1/0 mask -> an additive bias of the same shape: 0, or [`MASKED_SCORE`] where 0.
pub fn additive_mask(mask: &Tensor) -> Result<Tensor> {
    (mask - 1.0)? * -MASKED_SCORE
}

/// `[len, len]` bias that hides future positions.
pub fn causal_bias(len: usize, device: &Device) -> Result<Tensor> {
    let values: Vec<f32> = (0..len)
        .flat_map(|q| (0..len).map(move |k| if k > q { MASKED_SCORE as f32 } else { 0.0 }))
        .collect();
    Tensor::from_vec(values, (len, len), device)
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
        if config.length_encoding != model_package::LengthEncoding::None {
            candle_core::bail!(
                "preset {}: length encodings (LDPE/LRPE) are not implemented in training yet",
                config.preset
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
    /// recurrent encoder) and of absolute positions `0..len`, for `[batch, len]` ids.
    /// `mask` marks trailing padding (a bidirectional encoder must not read it).
    fn embed_with_positions(
        &self,
        ids: &Tensor,
        mask: Option<&Tensor>,
        position: &Option<PositionEncoder>,
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
        let x = match (self.config.absolute_position, &self.pos_embed) {
            (AbsolutePosition::Sinusoidal, _) => {
                let width = words.dim(2)?;
                words.broadcast_add(&sinusoid(&positions, width)?.unsqueeze(0)?)?
            }
            (AbsolutePosition::Learned, Some(table)) => {
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
        let bias = padding_bias(source_mask)?;
        let norm = self.config.norm;
        let mut x = self.embed_with_positions(
            source_ids,
            Some(source_mask),
            &self.encoder.position,
            dropout,
        )?;
        for layer in &self.encoder.layers {
            x = residual(&x, &layer.self_attn_norm, norm, dropout, |h| {
                layer.self_attn.forward(h, h, &bias)
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
        memory: &Tensor,
        source_mask: &Tensor,
        dropout: &Dropout,
    ) -> Result<Tensor> {
        let (_, t) = target_ids.dims2()?;
        let cross_bias = padding_bias(source_mask)?;
        let self_bias = causal_bias(t, target_ids.device())?;
        let norm = self.config.norm;
        // Target padding is trailing and the decoder's encoders run forward only.
        let mut x = self.embed_with_positions(target_ids, None, &self.decoder.position, dropout)?;
        for layer in &self.decoder.layers {
            x = residual(&x, &layer.self_attn_norm, norm, dropout, |h| {
                layer.self_attn.forward(h, h, &self_bias)
            })?;
            x = residual(&x, &layer.cross_attn_norm, norm, dropout, |h| {
                layer.cross_attn.forward(h, memory, &cross_bias)
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

/// An encoder-decoder as training, evaluation and export see it: the Transformer family and
/// the RNN-NMT baseline.
pub trait Seq2Seq {
    fn config(&self) -> &ModelConfig;

    /// `source_ids` `[batch, src_len]` u32, `source_mask` `[batch, src_len]` f32 ->
    /// memory `[batch, src_len, d]`.
    fn encode(
        &self,
        source_ids: &Tensor,
        source_mask: &Tensor,
        dropout: &Dropout,
    ) -> Result<Tensor>;

    /// Teacher-forced decoder: `target_ids` `[batch, tgt_len]` (BOS first) -> logits
    /// `[batch, tgt_len, vocab]`.
    fn decode(
        &self,
        target_ids: &Tensor,
        memory: &Tensor,
        source_mask: &Tensor,
        dropout: &Dropout,
    ) -> Result<Tensor>;

    fn forward(
        &self,
        source_ids: &Tensor,
        source_mask: &Tensor,
        target_ids: &Tensor,
        dropout: &Dropout,
    ) -> Result<Tensor> {
        let memory = self.encode(source_ids, source_mask, dropout)?;
        self.decode(target_ids, &memory, source_mask, dropout)
    }

    /// Greedy decoding of one batch, recomputing the whole prefix every step. Slow, but it
    /// is the reference the exported graphs (which carry a cache) are checked against.
    fn greedy(
        &self,
        source_ids: &Tensor,
        source_mask: &Tensor,
        max_len: usize,
    ) -> Result<Vec<Vec<u32>>> {
        use model_package::special::{BOS, EOS};
        let off = Dropout::off();
        let b = source_ids.dim(0)?;
        let memory = self.encode(source_ids, source_mask, &off)?;
        let mut prefix: Vec<Vec<u32>> = vec![vec![BOS]; b];
        let mut done = vec![false; b];
        for _ in 0..max_len {
            let flat: Vec<u32> = prefix.iter().flatten().copied().collect();
            let t = prefix[0].len();
            let ids = Tensor::from_vec(flat, (b, t), source_ids.device())?;
            let logits = self.decode(&ids, &memory, source_mask, &off)?;
            let next = logits
                .narrow(1, t - 1, 1)?
                .squeeze(1)?
                .argmax(D::Minus1)?
                .to_vec1::<u32>()?;
            for (row, &tok) in next.iter().enumerate() {
                // Finished rows keep emitting EOS so the batch stays rectangular.
                prefix[row].push(if done[row] { EOS } else { tok });
                done[row] |= tok == EOS;
            }
            if done.iter().all(|&d| d) {
                break;
            }
        }
        Ok(prefix
            .into_iter()
            .map(|p| p[1..].iter().copied().take_while(|&t| t != EOS).collect())
            .collect())
    }
}

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
        memory: &Tensor,
        mask: &Tensor,
        dropout: &Dropout,
    ) -> Result<Tensor> {
        self.inner().decode(ids, memory, mask, dropout)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::max_abs_diff;
    use candle_nn::VarMap;

    fn tiny_preset(name: &str) -> Transformer {
        let varmap = VarMap::new();
        let config = ModelConfig::preset(name, 50).unwrap();
        Transformer::new(
            config,
            VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu),
        )
        .unwrap()
    }

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
    fn relative_distances_are_clipped_in_both_directions() {
        let indices = relative_indices(&[0, 5], &[0, 1, 2, 3, 4, 5, 6, 7, 8, 9], 2);
        // Query 0: distances 0..9 -> 0, 1, then clipped at +2.
        assert_eq!(&indices[..10], &[2, 3, 4, 4, 4, 4, 4, 4, 4, 4]);
        // Query 5: distances -5..4 -> clipped at -2 below, +2 above.
        assert_eq!(&indices[10..], &[0, 0, 0, 0, 1, 2, 3, 4, 4, 4]);
    }

    #[test]
    fn step_distances_match_the_full_sequence_whatever_the_cache_padding() {
        let clip = 3;
        for p in 0..8i64 {
            let full: Vec<i64> = (0..=p).collect();
            let teacher_forced = relative_indices(&full, &full, clip);
            let last_row = &teacher_forced[(p as usize) * full.len()..];
            // A row that joined late has `pad` masked columns before its own keys.
            for pad in [0usize, 1, 5] {
                let keys = step_key_positions(p, p as usize + 1 + pad);
                let step = relative_indices(&[p], &keys, clip);
                assert_eq!(&step[pad..], last_row, "position {p}, padding {pad}");
                // The distance depends on the column only: key - query = j - (len - 1).
                let len = keys.len() as i64;
                for (j, &key) in keys.iter().enumerate() {
                    assert_eq!(key - p, j as i64 - (len - 1));
                }
            }
        }
    }

    #[test]
    fn relative_attention_equals_the_per_pair_formula() {
        let model = tiny_preset("rel-transformer-tiny");
        let attn = &model.encoder.layers[0].self_attn;
        let tables = attn.relative.as_ref().unwrap();
        let dev = Device::Cpu;
        let (t, d, h, dh) = (5, 32, 2, 16);
        let x = Tensor::randn(0f32, 1.0, (1, t, d), &dev).unwrap();
        let bias = Tensor::zeros((1, 1, 1, t), DType::F32, &dev).unwrap();
        let got = attn.forward(&x, &x, &bias).unwrap();

        let heads = |lin: &Linear| -> Vec<Vec<Vec<f32>>> {
            // [h][t][dh]
            let y = lin
                .forward(&x)
                .unwrap()
                .squeeze(0)
                .unwrap()
                .to_vec2::<f32>()
                .unwrap();
            (0..h)
                .map(|hh| {
                    y.iter()
                        .map(|row| row[hh * dh..(hh + 1) * dh].to_vec())
                        .collect()
                })
                .collect()
        };
        let (q, k, v) = (
            heads(&attn.q_proj),
            heads(&attn.k_proj),
            heads(&attn.v_proj),
        );
        let a_k = tables.keys.to_vec2::<f32>().unwrap();
        let a_v = tables.values.as_ref().unwrap().to_vec2::<f32>().unwrap();
        let idx = |i: usize, j: usize| ((j as i64 - i as i64).clamp(-16, 16) + 16) as usize;
        let dot = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>();
        let mut context = vec![vec![0f32; d]; t];
        for hh in 0..h {
            for i in 0..t {
                let scores: Vec<f32> = (0..t)
                    .map(|j| {
                        let key: Vec<f32> = k[hh][j]
                            .iter()
                            .zip(&a_k[idx(i, j)])
                            .map(|(a, b)| a + b)
                            .collect();
                        dot(&q[hh][i], &key) / (dh as f32).sqrt()
                    })
                    .collect();
                let max = scores.iter().cloned().fold(f32::MIN, f32::max);
                let exp: Vec<f32> = scores.iter().map(|s| (s - max).exp()).collect();
                let total: f32 = exp.iter().sum();
                for j in 0..t {
                    for c in 0..dh {
                        context[i][hh * dh + c] +=
                            exp[j] / total * (v[hh][j][c] + a_v[idx(i, j)][c]);
                    }
                }
            }
        }
        let context = Tensor::new(context, &dev).unwrap().unsqueeze(0).unwrap();
        let expected = attn.out_proj.forward(&context).unwrap();
        assert!(max_abs_diff(&got, &expected) < 1e-4);
    }

    #[test]
    fn length_encodings_say_they_are_not_implemented_at_construction() {
        let varmap = VarMap::new();
        let mut config = ModelConfig::preset("transformer-tiny", 50).unwrap();
        config.length_encoding = model_package::LengthEncoding::Ldpe;
        let err = Model::new(
            config,
            VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("not implemented in training yet"), "{err}");
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

    #[test]
    fn sinusoid_interleaves_sin_and_cos() {
        let pe = sinusoid(&Tensor::new(&[0u32, 3], &Device::Cpu).unwrap(), 4).unwrap();
        let pe = pe.to_vec2::<f32>().unwrap();
        assert_eq!(pe[0], vec![0.0, 1.0, 0.0, 1.0]);
        let inv = sinusoid_inverse_frequencies(4);
        assert!((pe[1][0] - (3.0 * inv[0]).sin()).abs() < 1e-6);
        assert!((pe[1][3] - (3.0 * inv[1]).cos()).abs() < 1e-6);
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
        let a = model.forward(&ids, &mask, &target, &off).unwrap();
        let b = model
            .forward(&padded_ids, &padded_mask, &target, &off)
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
        let a = model
            .forward(
                &ids,
                &mask,
                &Tensor::new(&[[1u32, 9, 10]], &dev).unwrap(),
                &off,
            )
            .unwrap();
        let b = model
            .forward(
                &ids,
                &mask,
                &Tensor::new(&[[1u32, 9, 33]], &dev).unwrap(),
                &off,
            )
            .unwrap();
        let prefix = |t: &Tensor| t.narrow(1, 0, 2).unwrap();
        assert!(max_abs_diff(&prefix(&a), &prefix(&b)) < 1e-6);
        assert!(max_abs_diff(&a, &b) > 1e-4);
    }
}
