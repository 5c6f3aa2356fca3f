//! Layer normalisation over the last dimension, forward and backward in one pass each.
//!
//! candle's fused `layer_norm` has no backward pass, and written with differentiable ops it
//! is nine passes forward and about twenty backward, each allocating a tensor the size of the
//! activations. The backward pass recomputes each row's mean and deviation rather than
//! storing them: one more read of `x`, no extra buffers.

use candle_core::{CpuStorage, CustomOp3, Layout, Result, Shape, Tensor};
use rayon::prelude::*;

use multiversion::multiversion;

use super::{contiguous_f32, dot, rows_per_task, sum, LANES};

/// `(x - mean) / sqrt(var + eps) * weight + bias` over the last dimension of `x`.
pub fn layer_norm(x: &Tensor, weight: &Tensor, bias: &Tensor, eps: f64) -> Result<Tensor> {
    x.contiguous()?.apply_op3(
        &weight.contiguous()?,
        &bias.contiguous()?,
        LayerNorm { eps: eps as f32 },
    )
}

struct LayerNorm {
    eps: f32,
}

/// Mean and `1 / sqrt(var + eps)` of one row.
#[inline(always)]
fn moments(row: &[f32], eps: f32) -> (f32, f32) {
    let n = row.len() as f32;
    let mean = sum(row) / n;
    // Two passes: the deviations, not E[x^2] - mean^2, keep precision on rows far from 0.
    let mut acc = [0f32; LANES];
    let chunks = row.chunks_exact(LANES);
    let tail: f32 = chunks
        .remainder()
        .iter()
        .map(|&v| (v - mean) * (v - mean))
        .sum();
    for c in chunks {
        for l in 0..LANES {
            acc[l] += (c[l] - mean) * (c[l] - mean);
        }
    }
    let var = (acc.iter().sum::<f32>() + tail) / n;
    (mean, 1.0 / (var + eps).sqrt())
}

/// Normalised rows of `x` into `out`.
#[multiversion(targets("x86_64+avx2+fma"))]
fn normalize_rows(x: &[f32], weight: &[f32], bias: &[f32], eps: f32, out: &mut [f32]) {
    let d = weight.len();
    for (o, row) in out.chunks_exact_mut(d).zip(x.chunks_exact(d)) {
        let (mean, rstd) = moments(row, eps);
        for (((o, &v), &w), &b) in o.iter_mut().zip(row).zip(weight).zip(bias) {
            *o = (v - mean) * rstd * w + b;
        }
    }
}

impl CustomOp3 for LayerNorm {
    fn name(&self) -> &'static str {
        "layer-norm"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (x, weight, bias) = (
            contiguous_f32(s1, l1)?,
            contiguous_f32(s2, l2)?,
            contiguous_f32(s3, l3)?,
        );
        let d = weight.len();
        let mut out = vec![0f32; x.len()];
        let chunk = rows_per_task(x.len() / d) * d;
        out.par_chunks_mut(chunk)
            .zip(x.par_chunks(chunk))
            .for_each(|(out, x)| normalize_rows(x, weight, bias, self.eps, out));
        Ok((CpuStorage::F32(out), l1.shape().clone()))
    }

    fn bwd(
        &self,
        x: &Tensor,
        weight: &Tensor,
        _bias: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let d = weight.elem_count();
        let rows = x.elem_count() / d;
        // One tensor holds the three gradients: `rows` rows of dx, then dweight, then dbias.
        let all = x.apply_op3_no_bwd(
            weight,
            &grad.contiguous()?,
            &LayerNormGrad { eps: self.eps },
        )?;
        let grad_x = all.narrow(0, 0, rows)?.reshape(x.shape())?;
        let grad_weight = all.narrow(0, rows, 1)?.reshape(weight.shape())?;
        let grad_bias = all.narrow(0, rows + 1, 1)?.reshape(weight.shape())?;
        Ok((Some(grad_x), Some(grad_weight), Some(grad_bias)))
    }
}

/// `(x, weight, upstream gradient) -> [rows + 2, d]`: dx rows, then dweight, then dbias.
struct LayerNormGrad {
    eps: f32,
}

impl CustomOp3 for LayerNormGrad {
    fn name(&self) -> &'static str {
        "layer-norm-grad"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (x, weight, grad) = (
            contiguous_f32(s1, l1)?,
            contiguous_f32(s2, l2)?,
            contiguous_f32(s3, l3)?,
        );
        let d = weight.len();
        let rows = x.len() / d;
        let mut out = vec![0f32; (rows + 2) * d];
        let (grad_x, params) = out.split_at_mut(rows * d);
        let chunk = rows_per_task(rows) * d;
        // Each task returns its partial sums of dweight and dbias; they are added after.
        let partials: Vec<Vec<f32>> = grad_x
            .par_chunks_mut(chunk)
            .zip(x.par_chunks(chunk).zip(grad.par_chunks(chunk)))
            .map(|(grad_x, (x, grad))| {
                let mut sums = vec![0f32; 2 * d];
                let (grad_weight, grad_bias) = sums.split_at_mut(d);
                grad_rows(x, grad, weight, self.eps, grad_x, grad_weight, grad_bias);
                sums
            })
            .collect();
        for sums in partials {
            for (p, s) in params.iter_mut().zip(sums) {
                *p += s;
            }
        }
        Ok((CpuStorage::F32(out), Shape::from((rows + 2, d))))
    }
}

/// `dx = rstd * (g*w - mean(g*w) - x_hat * mean(g*w * x_hat))` for each row, adding the
/// rows' share of dweight (`g * x_hat`) and dbias (`g`).
#[multiversion(targets("x86_64+avx2+fma"))]
fn grad_rows(
    x: &[f32],
    grad: &[f32],
    weight: &[f32],
    eps: f32,
    grad_x: &mut [f32],
    grad_weight: &mut [f32],
    grad_bias: &mut [f32],
) {
    let d = weight.len();
    let n = d as f32;
    let mut gw = vec![0f32; d];
    for ((gx, x), g) in grad_x
        .chunks_exact_mut(d)
        .zip(x.chunks_exact(d))
        .zip(grad.chunks_exact(d))
    {
        let (mean, rstd) = moments(x, eps);
        for i in 0..d {
            gw[i] = g[i] * weight[i];
            grad_weight[i] += g[i] * (x[i] - mean) * rstd;
            grad_bias[i] += g[i];
        }
        let mean_gw = sum(&gw) / n;
        // mean(g*w * x_hat) = rstd * (mean(g*w * x) - mean * mean(g*w)).
        let mean_gw_xhat = rstd * (dot(&gw, x) / n - mean * mean_gw);
        for i in 0..d {
            let x_hat = (x[i] - mean) * rstd;
            gx[i] = rstd * (gw[i] - mean_gw - x_hat * mean_gw_xhat);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::testing::assert_same;
    use candle_core::{Device, Var, D};

    /// Layer normalisation from candle's differentiable ops.
    fn composed(x: &Tensor, weight: &Tensor, bias: &Tensor, eps: f64) -> Result<Tensor> {
        let mean = x.mean_keepdim(D::Minus1)?;
        let centered = x.broadcast_sub(&mean)?;
        let var = centered.sqr()?.mean_keepdim(D::Minus1)?;
        centered
            .broadcast_div(&(var + eps)?.sqrt()?)?
            .broadcast_mul(weight)?
            .broadcast_add(bias)
    }

    #[test]
    fn matches_the_composed_ops_in_value_and_gradient() {
        let dev = Device::Cpu;
        let x = Var::from_tensor(&Tensor::randn(0.5f32, 2.0, (3, 37, 24), &dev).unwrap()).unwrap();
        let w = Var::from_tensor(&Tensor::randn(1f32, 0.3, 24, &dev).unwrap()).unwrap();
        let b = Var::from_tensor(&Tensor::randn(0f32, 0.3, 24, &dev).unwrap()).unwrap();
        let fused = layer_norm(&x, &w, &b, 1e-5).unwrap();
        let reference = composed(&x, &w, &b, 1e-5).unwrap();
        assert_same(&fused, &reference, &[&x, &w, &b]);
    }
}
