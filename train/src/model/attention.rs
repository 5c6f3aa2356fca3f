//! Multi-head attention, with Shaw et al.'s relative position vectors in self-attention.

use candle_core::{Device, Result, Tensor};
use candle_nn::{Linear, VarBuilder};
use model_package::{ModelConfig, RelativeAttention};

use crate::ops;
pub use crate::ops::attention::Keys;

use super::layers::{project, sinusoid_of};

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
    pub(crate) fn new(config: &ModelConfig, vb: VarBuilder) -> Result<Option<Self>> {
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
    pub(crate) fn new(config: &ModelConfig, vb: VarBuilder, self_attention: bool) -> Result<Self> {
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

    /// Self-attention of `x` `[batch, len, d]`, each query seeing `keys`.
    pub fn self_attention(&self, x: &Tensor, keys: &Keys) -> Result<Tensor> {
        let qkv = fused_linear(x, &[&self.q_proj, &self.k_proj, &self.v_proj])?;
        let tables = match &self.relative {
            Some(t) => Some(match &t.values {
                Some(values) => Tensor::stack(&[&t.keys, values], 0)?,
                None => t.keys.unsqueeze(0)?,
            }),
            None => None,
        };
        let relative = self
            .relative
            .as_ref()
            .zip(tables.as_ref())
            .map(|(t, tables)| ops::attention::Relative {
                tables,
                clip: t.clip,
                values: t.values.is_some(),
            });
        let context = ops::attention::self_attention(&qkv, self.num_heads, keys.clone(), relative)?;
        project(&self.out_proj, &context)
    }

    /// Attention of `query` `[batch, tq, d]` over `memory` `[batch, tk, d]`.
    pub fn cross_attention(&self, query: &Tensor, memory: &Tensor, keys: &Keys) -> Result<Tensor> {
        let q = project(&self.q_proj, query)?;
        let kv = fused_linear(memory, &[&self.k_proj, &self.v_proj])?;
        let context = ops::attention::cross_attention(&q, &kv, self.num_heads, keys.clone())?;
        project(&self.out_proj, &context)
    }
}

/// Several projections of the same input as one matrix product, side by side:
/// `[batch, len, sum of outputs]`.
fn fused_linear(x: &Tensor, projections: &[&Linear]) -> Result<Tensor> {
    let weights: Vec<&Tensor> = projections.iter().map(|p| p.weight()).collect();
    let biases: Vec<&Tensor> = projections
        .iter()
        .map(|p| p.bias().expect("attention projections have biases"))
        .collect();
    crate::ops::linear::linear(
        x,
        &Tensor::cat(&weights, 0)?,
        Some(&Tensor::cat(&biases, 0)?),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::max_abs_diff;
    use candle_core::DType;
    use candle_core::Module;
    use candle_nn::VarMap;

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
        let varmap = VarMap::new();
        let config = ModelConfig::preset("rel-transformer-tiny", 50).unwrap();
        let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
        let attn = &Attention::new(&config, vb, true).unwrap();
        let tables = attn.relative.as_ref().unwrap();
        let dev = Device::Cpu;
        let (t, d, h, dh) = (5, 32, 2, 16);
        let x = Tensor::randn(0f32, 1.0, (1, t, d), &dev).unwrap();
        let got = attn.self_attention(&x, &Keys::Lengths(vec![t])).unwrap();

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
}
