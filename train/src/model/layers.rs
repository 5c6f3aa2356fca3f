//! The building blocks both families share: the one embedding table (source, target and
//! output projection), sinusoidal positions and length encodings, layer normalisation, the
//! feed-forward block,
//! residual connections and attention masks.

use candle_core::{DType, Module, Result, Tensor};
use candle_nn::{Linear, VarBuilder};
use model_package::{LengthEncoding, ModelConfig, NormPlacement};

use super::dropout::Dropout;

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
pub(crate) fn sinusoid_of(values: &Tensor, d_model: usize) -> Result<Tensor> {
    let n = values.dim(0)?;
    let inv = Tensor::new(sinusoid_inverse_frequencies(d_model), values.device())?;
    let angles = values
        .reshape((n, 1))?
        .broadcast_mul(&inv.reshape((1, d_model / 2))?)?;
    sin_cos(&angles)
}

/// Angles `[..., d/2]` -> `[..., d]`: the sine of angle `i` in dim `2i`, its cosine in
/// `2i + 1`.
fn sin_cos(angles: &Tensor) -> Result<Tensor> {
    let mut dims = angles.dims().to_vec();
    let last = dims.len() - 1;
    dims[last] *= 2;
    Tensor::stack(&[angles.sin()?, angles.cos()?], last + 1)?.reshape(dims)
}

/// Takase & Okazaki's length encodings of decoder positions `0..t` for rows asked for
/// `lengths` `[batch]` (target subwords without EOS): `[batch, t, d]`, sin on even dims and
/// cos on odd dims, of `len - pos` (LDPE) or of `pos * len^(-2i/d)` (LRPE).
pub fn length_encoding(
    kind: LengthEncoding,
    lengths: &Tensor,
    t: usize,
    d_model: usize,
) -> Result<Tensor> {
    let b = lengths.dim(0)?;
    let device = lengths.device();
    let lengths = lengths.to_dtype(DType::F32)?.reshape((b, 1))?;
    let positions = Tensor::arange(0u32, t as u32, device)?
        .to_dtype(DType::F32)?
        .reshape((1, t))?;
    match kind {
        LengthEncoding::None => candle_core::bail!("no length encoding to compute"),
        LengthEncoding::Ldpe => {
            let remaining = lengths.broadcast_sub(&positions)?.flatten_all()?;
            sinusoid_of(&remaining, d_model)?.reshape((b, t, d_model))
        }
        LengthEncoding::Lrpe => {
            // len^(-2i/d) as exp(ln(len) * -2i/d), the form the exported graph computes too.
            let exponents = Tensor::new(length_ratio_exponents(d_model), device)?;
            let inv = lengths
                .maximum(1f64)?
                .log()?
                .broadcast_mul(&exponents.reshape((1, d_model / 2))?)?
                .exp()?;
            let inv = inv.reshape((b, 1, d_model / 2))?;
            sin_cos(&positions.reshape((1, t, 1))?.broadcast_mul(&inv)?)
        }
    }
}

/// `-2i/d` for `i` in `0..d/2`: LRPE's exponents of the length, shared with the exporter.
pub fn length_ratio_exponents(d_model: usize) -> Vec<f32> {
    (0..d_model / 2)
        .map(|i| (-2.0 * i as f64 / d_model as f64) as f32)
        .collect()
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
    crate::ops::linear::linear(x, table, None)
}

/// `layer` applied to `x` `[.., in]` as one fused op ([`crate::ops::linear`]).
pub fn project(layer: &Linear, x: &Tensor) -> Result<Tensor> {
    crate::ops::linear::linear(x, layer.weight(), layer.bias())
}

/// Layer normalisation over the last dimension ([`crate::ops::layer_norm`]).
#[derive(Clone, Debug)]
pub struct LayerNorm {
    pub weight: Tensor,
    pub bias: Tensor,
    pub eps: f64,
}

impl LayerNorm {
    pub(crate) fn new(d: usize, eps: f64, vb: VarBuilder) -> Result<Self> {
        Ok(Self {
            weight: vb.get_with_hints(d, "weight", candle_nn::Init::Const(1.0))?,
            bias: vb.get_with_hints(d, "bias", candle_nn::Init::Const(0.0))?,
            eps,
        })
    }
}

impl Module for LayerNorm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        crate::ops::layer_norm::layer_norm(x, &self.weight, &self.bias, self.eps)
    }
}

#[derive(Clone, Debug)]
pub struct FeedForward {
    pub fc1: Linear,
    pub fc2: Linear,
}

impl FeedForward {
    pub(crate) fn new(config: &ModelConfig, vb: VarBuilder) -> Result<Self> {
        Ok(Self {
            fc1: candle_nn::linear(config.d_model, config.ffn_dim, vb.pp("fc1"))?,
            fc2: candle_nn::linear(config.ffn_dim, config.d_model, vb.pp("fc2"))?,
        })
    }

    pub fn forward(&self, x: &Tensor, dropout: &Dropout) -> Result<Tensor> {
        let hidden = dropout.relu(&project(&self.fc1, x)?)?;
        project(&self.fc2, &hidden)
    }
}

/// One residual block around `sublayer`, with the norm where the config puts it.
pub fn residual(
    x: &Tensor,
    norm: &LayerNorm,
    placement: NormPlacement,
    dropout: &Dropout,
    sublayer: impl FnOnce(&Tensor) -> Result<Tensor>,
) -> Result<Tensor> {
    match placement {
        NormPlacement::Pre => dropout.residual(x, &sublayer(&norm.forward(x)?)?),
        NormPlacement::Post => norm.forward(&dropout.residual(x, &sublayer(x)?)?),
    }
}

/// A 1/0 mask -> an additive bias of the same shape: 0, or [`MASKED_SCORE`] where 0.
pub fn additive_mask(mask: &Tensor) -> Result<Tensor> {
    (mask - 1.0)? * -MASKED_SCORE
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn length_encodings_follow_the_papers_formulas() {
        let lengths = Tensor::new(&[5u32, 9], &Device::Cpu).unwrap();
        let d = 8;
        let ldpe = length_encoding(LengthEncoding::Ldpe, &lengths, 7, d).unwrap();
        let lrpe = length_encoding(LengthEncoding::Lrpe, &lengths, 7, d).unwrap();
        assert_eq!(ldpe.dims(), &[2, 7, d]);
        let (ldpe, lrpe) = (
            ldpe.to_vec3::<f32>().unwrap(),
            lrpe.to_vec3::<f32>().unwrap(),
        );
        for (row, len) in [5f64, 9.0].into_iter().enumerate() {
            for pos in 0..7 {
                for i in 0..d / 2 {
                    let base = 10000f64.powf(2.0 * i as f64 / d as f64);
                    let diff = (len - pos as f64) / base;
                    assert!((ldpe[row][pos][2 * i] as f64 - diff.sin()).abs() < 1e-5);
                    assert!((ldpe[row][pos][2 * i + 1] as f64 - diff.cos()).abs() < 1e-5);
                    let ratio = pos as f64 / len.powf(2.0 * i as f64 / d as f64);
                    assert!((lrpe[row][pos][2 * i] as f64 - ratio.sin()).abs() < 1e-5);
                    assert!((lrpe[row][pos][2 * i + 1] as f64 - ratio.cos()).abs() < 1e-5);
                }
            }
        }
        // At pos == len nothing is left: LDPE is the encoding of 0 there.
        assert_eq!(ldpe[0][5][0], 0.0);
        assert_eq!(ldpe[0][5][1], 1.0);
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
}
