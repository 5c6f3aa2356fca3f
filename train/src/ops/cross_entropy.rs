//! Label-smoothed cross-entropy as one fused candle op.
//!
//! Composed from candle ops (log-softmax, gather, mean) the loss makes about twenty passes
//! over the `[tokens, vocab]` logits between forward and backward, each with a fresh
//! allocation; on the shipped model that was a quarter of a training step. Fused, the forward
//! is one pass per row (log-sum-exp, target logit, row mean) and the backward one more, from
//! the log-sum-exps the forward pass kept. Rows are spread over the rayon pool's threads.

use std::sync::Mutex;

use candle_core::{CpuStorage, CustomOp1, Layout, Result, Shape, Tensor, D};
use multiversion::multiversion;
use rayon::prelude::*;

use super::{contiguous_f32, rows_per_task, sum, with_f32};

/// Per-row loss terms: `[rows, 2]` with the smoothed loss in column 0 (the one that carries
/// gradient) and the plain negative log-likelihood in column 1 (for reporting).
struct SmoothedCrossEntropy {
    targets: Vec<u32>,
    epsilon: f32,
    /// Each row's log-sum-exp, kept by the forward pass for the backward pass.
    log_sum_exps: Mutex<Vec<f32>>,
}

/// `log(sum(exp(row)))`, shifted by the row's maximum so that no term overflows.
#[inline(always)]
fn log_sum_exp(row: &[f32]) -> f32 {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let total: f32 = row.iter().map(|&x| (x - max).exp()).sum();
    max + total.ln()
}

/// `(smoothed loss, nll, log-sum-exp)` of one row of logits.
#[multiversion(targets("x86_64+avx2+fma"))]
fn row_terms(row: &[f32], target: usize, epsilon: f32) -> (f32, f32, f32) {
    let lse = log_sum_exp(row);
    let nll = lse - row[target];
    let mean = sum(row) / row.len() as f32;
    ((1.0 - epsilon) * nll + epsilon * (lse - mean), nll, lse)
}

/// One row's gradient: `g * (exp(x - lse) - uniform)`, less `g * (1 - eps)` at the target.
#[multiversion(targets("x86_64+avx2+fma"))]
fn row_grad(row: &[f32], lse: f32, g: f32, uniform: f32, out: &mut [f32]) {
    for (o, &x) in out.iter_mut().zip(row) {
        *o = g * ((x - lse).exp() - uniform);
    }
}

impl CustomOp1 for SmoothedCrossEntropy {
    fn name(&self) -> &'static str {
        "smoothed-cross-entropy"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let (rows, vocab) = layout.shape().dims2()?;
        let logits = contiguous_f32(storage, layout)?;
        let mut out = vec![0f32; rows * 2];
        let mut lses = vec![0f32; rows];
        let chunk = rows_per_task(rows);
        out.par_chunks_mut(2 * chunk)
            .zip(lses.par_chunks_mut(chunk))
            .enumerate()
            .for_each(|(task, (out, lses))| {
                for (k, (terms, lse_out)) in out.chunks_exact_mut(2).zip(lses).enumerate() {
                    let r = task * chunk + k;
                    let row = &logits[r * vocab..(r + 1) * vocab];
                    let (smoothed, nll, lse) =
                        row_terms(row, self.targets[r] as usize, self.epsilon);
                    terms[0] = smoothed;
                    terms[1] = nll;
                    *lse_out = lse;
                }
            });
        *self.log_sum_exps.lock().expect("log-sum-exps") = lses;
        Ok((CpuStorage::F32(out), Shape::from((rows, 2))))
    }

    /// `d loss / d logits = upstream * (softmax - (1 - eps) * onehot(target) - eps / vocab)`.
    fn bwd(&self, logits: &Tensor, _res: &Tensor, grad_res: &Tensor) -> Result<Option<Tensor>> {
        let (rows, vocab) = logits.dims2()?;
        let upstream = grad_res.narrow(1, 0, 1)?.squeeze(1)?.contiguous()?;
        let upstream = upstream.to_vec1::<f32>()?;
        let lses = std::mem::take(&mut *self.log_sum_exps.lock().expect("log-sum-exps"));
        let uniform = self.epsilon / vocab as f32;
        let grad = with_f32(logits, |logits, _| {
            let mut grad = vec![0f32; rows * vocab];
            let chunk = rows_per_task(rows);
            grad.par_chunks_mut(chunk * vocab)
                .enumerate()
                .for_each(|(task, out)| {
                    for (k, out) in out.chunks_exact_mut(vocab).enumerate() {
                        let r = task * chunk + k;
                        let g = upstream[r];
                        if g == 0.0 {
                            continue;
                        }
                        let row = &logits[r * vocab..(r + 1) * vocab];
                        row_grad(row, lses[r], g, uniform, out);
                        out[self.targets[r] as usize] -= g * (1.0 - self.epsilon);
                    }
                });
            Ok(grad)
        })?;
        Ok(Some(Tensor::from_vec(
            grad,
            (rows, vocab),
            logits.device(),
        )?))
    }
}

/// Label-smoothed cross-entropy, averaged over non-padding target tokens. Returns the loss to
/// back-propagate and the summed plain NLL (for reporting).
pub fn label_smoothed_loss(
    logits: &Tensor,
    targets: &Tensor,
    mask: &Tensor,
    epsilon: f64,
) -> Result<(Tensor, f64)> {
    let vocab = logits.dim(D::Minus1)?;
    let logits = logits.reshape(((), vocab))?.contiguous()?;
    let targets = targets.flatten_all()?.to_vec1::<u32>()?;
    let mask = mask.flatten_all()?;
    let terms = logits.apply_op1(SmoothedCrossEntropy {
        targets,
        epsilon: epsilon as f32,
        log_sum_exps: Mutex::new(Vec::new()),
    })?;
    let loss = (terms.narrow(1, 0, 1)?.squeeze(1)? * &mask)?
        .sum_all()?
        .div(&mask.sum_all()?)?;
    let nll_sum = (terms.narrow(1, 1, 1)?.squeeze(1)? * &mask)?
        .sum_all()?
        .to_scalar::<f32>()? as f64;
    Ok((loss, nll_sum))
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    /// The same loss from candle's differentiable ops: the fused op must match its value
    /// and its gradient.
    fn composed(logits: &Tensor, targets: &Tensor, mask: &Tensor, epsilon: f64) -> Result<Tensor> {
        let logp = candle_nn::ops::log_softmax(logits, D::Minus1)?;
        let nll = logp.gather(&targets.unsqueeze(1)?, 1)?.squeeze(1)?.neg()?;
        let smooth = logp.mean(D::Minus1)?.neg()?;
        let per_token = ((nll * (1.0 - epsilon))? + (smooth * epsilon)?)?;
        (per_token * mask)?.sum_all()?.div(&mask.sum_all()?)
    }

    #[test]
    fn matches_the_composed_loss_and_gradient() {
        let dev = Device::Cpu;
        let logits = Var::from_tensor(&(Tensor::randn(0f32, 3.0, (7, 11), &dev).unwrap())).unwrap();
        let targets = Tensor::new(&[0u32, 3, 10, 5, 5, 1, 2], &dev).unwrap();
        let mask = Tensor::new(&[1f32, 1.0, 1.0, 0.0, 1.0, 1.0, 0.0], &dev).unwrap();

        let (fused, nll_sum) =
            label_smoothed_loss(logits.as_tensor(), &targets, &mask, 0.1).unwrap();
        let reference = composed(logits.as_tensor(), &targets, &mask, 0.1).unwrap();
        let (a, b) = (
            fused.to_scalar::<f32>().unwrap(),
            reference.to_scalar::<f32>().unwrap(),
        );
        assert!((a - b).abs() < 1e-5, "{a} vs {b}");
        let plain = composed(logits.as_tensor(), &targets, &mask, 0.0)
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        assert!((nll_sum as f32 / 5.0 - plain).abs() < 1e-5);

        let g_fused = fused
            .backward()
            .unwrap()
            .get(logits.as_tensor())
            .unwrap()
            .clone();
        let g_ref = reference
            .backward()
            .unwrap()
            .get(logits.as_tensor())
            .unwrap()
            .clone();
        let diff = crate::max_abs_diff(&g_fused, &g_ref);
        assert!(diff < 1e-6, "gradient differs by {diff}");
    }
}
