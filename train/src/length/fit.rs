//! Training the length head on cached features, and its predictions.

use candle_core::{DType, Device, Tensor, Var};
use model_package::LinearFit;
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use super::features::{pad_batch, Features};
use crate::model::bert::Dense;
use crate::model::length_head::LengthHead;
use crate::train::optim::Adam;

/// What the head is trained to minimise.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Loss {
    /// Squared error of the predicted length: weighs long sources by their larger errors.
    Length,
    /// Squared error of its logarithm: every source alike, relative errors.
    LogLength,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FitOptions {
    /// Width of the MLP's hidden layer.
    pub hidden: usize,
    pub epochs: usize,
    /// Adam's learning rate for the MLP, decayed linearly to 0 over the epochs.
    pub lr: f64,
    /// The same for the WordPiece table.
    pub table_lr: f64,
    /// Pull of the table towards its starting value (the mean target subwords per
    /// WordPiece), summed over the table and divided by the rows: a WordPiece seen in a few
    /// sources moves little.
    pub table_l2: f64,
    /// L2 penalty (`l2 / 2 * |W|^2`) on the MLP's weight matrices.
    pub mlp_l2: f64,
    pub batch_size: usize,
    pub seed: u64,
}

/// Rows the head trains on: those whose source the BERT read.
fn trainable_rows(features: &Features, max_positions: usize) -> Vec<usize> {
    (0..features.len())
        .filter(|&i| features.fits(i, max_positions) && features.target_subwords[i] > 0)
        .collect()
}

/// Xavier-uniform from `rng` (candle's CPU generator cannot be seeded).
fn xavier(
    rng: &mut SmallRng,
    rows: usize,
    cols: usize,
    device: &Device,
) -> candle_core::Result<Var> {
    let bound = (6.0 / (rows + cols) as f64).sqrt();
    let values: Vec<f32> = (0..rows * cols)
        .map(|_| rng.gen_range(-bound..bound) as f32)
        .collect();
    Var::from_tensor(&Tensor::from_vec(values, (rows, cols), device)?)
}

/// One batch's inputs: padded ids and mask, `[CLS]` vectors, reference lengths.
struct Batch {
    ids: Tensor,
    mask: Tensor,
    cls: Tensor,
    targets: Tensor,
}

impl Batch {
    fn new(features: &Features, rows: &[usize]) -> candle_core::Result<Self> {
        let device = features.cls.device();
        let slices: Vec<&[u32]> = rows.iter().map(|&i| features.ids[i].as_slice()).collect();
        let (ids, mask) = pad_batch(&slices, device)?;
        let index: Vec<u32> = rows.iter().map(|&i| i as u32).collect();
        let targets: Vec<f32> = rows
            .iter()
            .map(|&i| features.target_subwords[i] as f32)
            .collect();
        Ok(Self {
            ids,
            mask,
            cls: features
                .cls
                .index_select(&Tensor::new(index.as_slice(), device)?, 0)?,
            targets: Tensor::new(targets.as_slice(), device)?,
        })
    }

    fn loss(&self, head: &LengthHead, loss: Loss) -> candle_core::Result<Tensor> {
        let predicted = head.forward(&self.ids, &self.mask, &self.cls)?;
        match loss {
            Loss::Length => (predicted - &self.targets)?.sqr()?.mean_all(),
            Loss::LogLength => (predicted.log()? - self.targets.log()?)?.sqr()?.mean_all(),
        }
    }
}

/// The mean target subwords per WordPiece over `rows`: every WordPiece's starting length.
fn mean_per_piece(features: &Features, rows: &[usize]) -> f32 {
    let target: f64 = rows
        .iter()
        .map(|&i| features.target_subwords[i] as f64)
        .sum();
    let pieces: f64 = rows.iter().map(|&i| features.wordpieces[i] as f64).sum();
    (target / pieces.max(1.0)) as f32
}

/// A head that predicts the lexical estimate alone: `table`, an MLP whose output layer is
/// zero (`r = 0`), and a standardisation to be replaced before the MLP trains.
fn lexical_head(
    table: Tensor,
    hidden: usize,
    inputs: usize,
    rng: &mut SmallRng,
) -> anyhow::Result<LengthHead> {
    let device = table.device().clone();
    Ok(LengthHead {
        wordpiece_lengths: table,
        input_mean: Tensor::zeros(inputs, DType::F32, &device)?,
        input_std: Tensor::ones(inputs, DType::F32, &device)?,
        fc1: Dense {
            weight: xavier(rng, hidden, inputs, &device)?.as_tensor().detach(),
            bias: Tensor::zeros(hidden, DType::F32, &device)?,
        },
        fc2: Dense {
            weight: Tensor::zeros((1, hidden), DType::F32, &device)?,
            bias: Tensor::zeros(1, DType::F32, &device)?,
        },
    })
}

/// Mean and standard deviation over `rows` of the MLP's inputs (`[CLS]`, `ln m`) under
/// `head`'s table.
fn standardisation(
    features: &Features,
    rows: &[usize],
    head: &LengthHead,
) -> anyhow::Result<(Tensor, Tensor)> {
    let mut parts = Vec::new();
    for chunk in rows.chunks(1024) {
        let batch = Batch::new(features, chunk)?;
        let lexical = head.lexical_length(&batch.ids, &batch.mask)?;
        parts.push(Tensor::cat(
            &[&batch.cls, &lexical.log()?.unsqueeze(1)?],
            1,
        )?);
    }
    let inputs = Tensor::cat(&parts, 0)?;
    let mean = inputs.mean(0)?;
    // A constant feature (never seen varying) is passed through centred, not blown up.
    let std = (inputs.broadcast_sub(&mean)?.sqr()?.mean(0)?.sqrt()? + 1e-6)?;
    Ok((mean, std))
}

/// Adam over `vars` for `options.epochs` passes over `rows`, minimising `loss` plus
/// `penalty`, with the learning rate `lr` decayed linearly to 0.
fn descend(
    features: &Features,
    rows: &[usize],
    head: &LengthHead,
    vars: Vec<(String, Var)>,
    (loss, lr): (Loss, f64),
    penalty: impl Fn() -> candle_core::Result<Tensor>,
    options: &FitOptions,
) -> anyhow::Result<()> {
    let mut rng = SmallRng::seed_from_u64(options.seed);
    let mut adam = Adam::new(vars)?;
    let steps = (rows.len().div_ceil(options.batch_size) * options.epochs).max(1);
    let mut order = rows.to_vec();
    for _ in 0..options.epochs {
        order.shuffle(&mut rng);
        for chunk in order.chunks(options.batch_size) {
            let total = (Batch::new(features, chunk)?.loss(head, loss)? + penalty()?)?;
            let decay = 1.0 - adam.step as f64 / steps as f64;
            // Adam normalises the step's size already; no clipping.
            adam.step(&total.backward()?, lr * decay, f64::INFINITY)?;
        }
    }
    Ok(())
}

/// The two stages of training, for a `vocab`-piece BERT on `features` (rows the BERT could
/// not read are left out): the WordPiece table alone (the head predicts `m`), then, with the
/// table fixed, the MLP's correction from `[CLS]`. Returns the head after each stage.
pub fn fit_head(
    features: &Features,
    max_positions: usize,
    vocab: usize,
    loss: Loss,
    options: &FitOptions,
) -> anyhow::Result<(LengthHead, LengthHead)> {
    let rows = trainable_rows(features, max_positions);
    anyhow::ensure!(!rows.is_empty(), "no training rows for the length head");
    let device = features.cls.device().clone();
    let mut rng = SmallRng::seed_from_u64(options.seed);
    let per_piece = mean_per_piece(features, &rows);
    let table = Var::from_tensor(&Tensor::full(per_piece, vocab, &device)?)?;
    let inputs = features.cls.dim(1)? + 1;
    let lexical = lexical_head(table.as_tensor().clone(), options.hidden, inputs, &mut rng)?;
    let prior = Tensor::full(per_piece, vocab, &device)?;
    let pull = options.table_l2 / rows.len() as f64;
    let table_penalty = || (table.as_tensor() - &prior)?.sqr()?.sum_all()? * pull;
    let vars = vec![("wordpiece_lengths".to_string(), table.clone())];
    descend(
        features,
        &rows,
        &lexical,
        vars,
        (loss, options.table_lr),
        table_penalty,
        options,
    )?;
    let lexical = LengthHead {
        wordpiece_lengths: table.as_tensor().detach(),
        ..lexical
    };
    let corrected = fit_correction(features, &rows, &lexical, loss, options)?;
    Ok((lexical, corrected))
}

/// The second stage: the MLP trained on top of `lexical`'s fixed table.
fn fit_correction(
    features: &Features,
    rows: &[usize],
    lexical: &LengthHead,
    loss: Loss,
    options: &FitOptions,
) -> anyhow::Result<LengthHead> {
    let (input_mean, input_std) = standardisation(features, rows, lexical)?;
    let mlp: Vec<Var> = [
        &lexical.fc1.weight,
        &lexical.fc1.bias,
        &lexical.fc2.weight,
        &lexical.fc2.bias,
    ]
    .into_iter()
    .map(Var::from_tensor)
    .collect::<candle_core::Result<_>>()?;
    let t = |i: usize| mlp[i].as_tensor().clone();
    let corrected = LengthHead {
        input_mean,
        input_std,
        fc1: Dense {
            weight: t(0),
            bias: t(1),
        },
        fc2: Dense {
            weight: t(2),
            bias: t(3),
        },
        ..lexical.clone()
    };
    let matrices = [t(0), t(2)];
    let weight_penalty = || {
        let squares = (matrices[0].sqr()?.sum_all()? + matrices[1].sqr()?.sum_all()?)?;
        squares * (options.mlp_l2 / 2.0)
    };
    let names = ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"];
    let vars = names
        .iter()
        .map(|n| n.to_string())
        .zip(mlp.clone())
        .collect();
    descend(
        features,
        rows,
        &corrected,
        vars,
        (loss, options.lr),
        weight_penalty,
        options,
    )?;
    let detach = |d: &Dense| Dense {
        weight: d.weight.detach(),
        bias: d.bias.detach(),
    };
    Ok(LengthHead {
        fc1: detach(&corrected.fc1),
        fc2: detach(&corrected.fc2),
        ..corrected
    })
}

/// Predictions for every row: the head's (`lexical_only`: its lexical estimate `m`, the
/// MLP left out), and `fallback` of the source length for rows too long for the BERT, as
/// the server would give them.
pub fn predict(
    head: &LengthHead,
    features: &Features,
    max_positions: usize,
    fallback: &LinearFit,
    lexical_only: bool,
) -> anyhow::Result<Vec<f64>> {
    let fits: Vec<usize> = (0..features.len())
        .filter(|&i| features.fits(i, max_positions))
        .collect();
    let mut predicted: Vec<f64> = features
        .source_subwords
        .iter()
        .map(|&s| fallback.predict(s as usize))
        .collect();
    for chunk in fits.chunks(512) {
        let batch = Batch::new(features, chunk)?;
        let values = if lexical_only {
            head.lexical_length(&batch.ids, &batch.mask)?
        } else {
            head.forward(&batch.ids, &batch.mask, &batch.cls)?
        };
        for (&i, v) in chunk.iter().zip(values.to_vec1::<f32>()?) {
            predicted[i] = v as f64;
        }
    }
    Ok(predicted)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sources whose target length is 2 per WordPiece 7 and 1 per other WordPiece.
    fn synthetic(rows: usize) -> Features {
        let ids: Vec<Vec<u32>> = (0..rows)
            .map(|i| {
                let body = (0..3 + i % 9).map(|j| {
                    if (i + j) % 3 == 0 {
                        7
                    } else {
                        4 + (j % 2) as u32
                    }
                });
                std::iter::once(1).chain(body).chain([2]).collect()
            })
            .collect();
        let target = |r: &Vec<u32>| {
            r[1..r.len() - 1]
                .iter()
                .map(|&t| if t == 7 { 2 } else { 1 })
                .sum()
        };
        Features {
            cls: Tensor::zeros((rows, 4), DType::F32, &Device::Cpu).unwrap(),
            wordpieces: ids.iter().map(|r| r.len() as u32 - 2).collect(),
            source_subwords: ids.iter().map(|r| r.len() as u32 - 2).collect(),
            target_subwords: ids.iter().map(target).collect(),
            bert_seconds: None,
            ids,
        }
    }

    #[test]
    fn the_table_learns_what_each_wordpiece_costs() {
        let features = synthetic(300);
        let options = FitOptions {
            hidden: 8,
            epochs: 40,
            lr: 1e-3,
            table_lr: 0.05,
            table_l2: 0.0,
            mlp_l2: 0.0,
            batch_size: 32,
            seed: 3,
        };
        let (lexical, _) = fit_head(&features, 64, 10, Loss::Length, &options).unwrap();
        let table = lexical.wordpiece_lengths.to_vec1::<f32>().unwrap();
        assert!((table[7] - 2.0).abs() < 0.05, "{table:?}");
        assert!(
            (table[4] - 1.0).abs() < 0.05 && (table[5] - 1.0).abs() < 0.05,
            "{table:?}"
        );
        let fallback = LinearFit {
            slope: 1.0,
            intercept: 0.0,
        };
        let predicted = predict(&lexical, &features, 64, &fallback, false).unwrap();
        for (p, &t) in predicted.iter().zip(&features.target_subwords) {
            assert!((p - t as f64).abs() < 0.3, "{p} for {t}");
        }
    }
}
