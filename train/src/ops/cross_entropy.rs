//! Label-smoothed cross-entropy as one fused candle op.
//!
//! Composed from candle ops (log-softmax, gather, mean) the loss makes about twenty passes
//! over the `[tokens, vocab]` logits between forward and backward, each with a fresh
//! allocation; on the shipped model that was a quarter of a training step. Fused, the forward
//! is one pass per row (log-sum-exp, target logit, row mean) and the backward one more:
//! `d loss / d logits = softmax - ((1 - eps) * onehot(target) + eps / vocab)`.

use candle_core::{CpuStorage, CustomOp1, CustomOp2, Layout, Result, Shape, Tensor, D};

/// Per-row loss terms: `[rows, 2]` with the smoothed loss in column 0 (the one that carries
/// gradient) and the plain negative log-likelihood in column 1 (for reporting).
struct SmoothedCrossEntropy {
    targets: Vec<u32>,
    epsilon: f32,
}

fn contiguous<'a>(storage: &'a CpuStorage, layout: &Layout) -> Result<&'a [f32]> {
    let (start, end) = layout.contiguous_offsets().ok_or_else(|| {
        candle_core::Error::Msg("smoothed cross-entropy needs contiguous logits".into())
    })?;
    Ok(&storage.as_slice::<f32>()?[start..end])
}

/// `(max, log-sum-exp)` of one row.
fn log_sum_exp(row: &[f32]) -> f32 {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f32 = row.iter().map(|&x| (x - max).exp()).sum();
    max + sum.ln()
}

impl CustomOp1 for SmoothedCrossEntropy {
    fn name(&self) -> &'static str {
        "smoothed-cross-entropy"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let (rows, vocab) = layout.shape().dims2()?;
        let logits = contiguous(storage, layout)?;
        let mut out = Vec::with_capacity(rows * 2);
        for (r, row) in logits.chunks_exact(vocab).enumerate() {
            let lse = log_sum_exp(row);
            let nll = lse - row[self.targets[r] as usize];
            let mean: f32 = row.iter().sum::<f32>() / vocab as f32;
            let smooth = lse - mean;
            out.push((1.0 - self.epsilon) * nll + self.epsilon * smooth);
            out.push(nll);
        }
        Ok((CpuStorage::F32(out), Shape::from((rows, 2))))
    }

    fn bwd(&self, logits: &Tensor, _res: &Tensor, grad_res: &Tensor) -> Result<Option<Tensor>> {
        let grad_loss = grad_res.narrow(1, 0, 1)?.squeeze(1)?.contiguous()?;
        let grad = logits.contiguous()?.apply_op2_no_bwd(
            &grad_loss,
            &SmoothedCrossEntropyGrad {
                targets: self.targets.clone(),
                epsilon: self.epsilon,
            },
        )?;
        Ok(Some(grad))
    }
}

/// `(logits [rows, vocab], upstream gradient [rows]) -> gradient of the logits`.
struct SmoothedCrossEntropyGrad {
    targets: Vec<u32>,
    epsilon: f32,
}

impl CustomOp2 for SmoothedCrossEntropyGrad {
    fn name(&self) -> &'static str {
        "smoothed-cross-entropy-grad"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (rows, vocab) = l1.shape().dims2()?;
        let logits = contiguous(s1, l1)?;
        let upstream = contiguous(s2, l2)?;
        let uniform = self.epsilon / vocab as f32;
        let mut grad = vec![0f32; rows * vocab];
        for (r, (row, out)) in logits
            .chunks_exact(vocab)
            .zip(grad.chunks_exact_mut(vocab))
            .enumerate()
        {
            let g = upstream[r];
            if g == 0.0 {
                continue;
            }
            let lse = log_sum_exp(row);
            for (o, &x) in out.iter_mut().zip(row) {
                *o = g * ((x - lse).exp() - uniform);
            }
            out[self.targets[r] as usize] -= g * (1.0 - self.epsilon);
        }
        Ok((CpuStorage::F32(grad), Shape::from((rows, vocab))))
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
