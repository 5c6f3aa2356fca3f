//! Adam with global-norm gradient clipping and the inverse-square-root warm-up schedule of
//! Vaswani et al. Written here rather than taken from candle-nn because its state (moments,
//! step) must be saved and restored for resumable training.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{backprop::GradStore, Device, Tensor, Var};

pub struct Adam {
    /// Sorted by name so the update order (and the saved file) is deterministic.
    params: Vec<(String, Var)>,
    first_moment: Vec<Tensor>,
    second_moment: Vec<Tensor>,
    pub step: usize,
    beta1: f64,
    beta2: f64,
    eps: f64,
}

impl Adam {
    pub fn new(mut params: Vec<(String, Var)>) -> candle_core::Result<Self> {
        params.sort_by(|a, b| a.0.cmp(&b.0));
        let zeros = params
            .iter()
            .map(|(_, v)| v.as_tensor().zeros_like())
            .collect::<candle_core::Result<Vec<_>>>()?;
        Ok(Self {
            first_moment: zeros.clone(),
            second_moment: zeros,
            params,
            step: 0,
            beta1: 0.9,
            beta2: 0.98,
            eps: 1e-9,
        })
    }

    /// Clips the gradients to `max_norm` (global L2 norm), applies one update at `lr`, and
    /// returns the norm before clipping.
    pub fn step(&mut self, grads: &GradStore, lr: f64, max_norm: f64) -> candle_core::Result<f64> {
        let mut sum_sq = 0f64;
        for (_, var) in &self.params {
            if let Some(g) = grads.get(var.as_tensor()) {
                sum_sq += g.sqr()?.sum_all()?.to_scalar::<f32>()? as f64;
            }
        }
        let norm = sum_sq.sqrt();
        let scale = if norm > max_norm {
            max_norm / norm
        } else {
            1.0
        };
        self.step += 1;
        let t = self.step as i32;
        let correction1 = 1.0 - self.beta1.powi(t);
        let correction2 = 1.0 - self.beta2.powi(t);
        for (i, (_, var)) in self.params.iter().enumerate() {
            let Some(g) = grads.get(var.as_tensor()) else {
                continue;
            };
            // A variable's gradient can carry candle's op graph (a loss term such as
            // `w.sqr()` differentiates into `w * grad`, which tracks `w`); kept in the moments,
            // it would chain every step's graph to the next and hold all of them in memory.
            let g = (g.detach() * scale)?;
            let m = ((&self.first_moment[i] * self.beta1)? + (&g * (1.0 - self.beta1))?)?;
            let v = ((&self.second_moment[i] * self.beta2)? + (g.sqr()? * (1.0 - self.beta2))?)?;
            let update = ((&m / correction1)? / ((&v / correction2)?.sqrt()? + self.eps)?)?;
            var.set(&(var.as_tensor() - (update * lr)?)?)?;
            self.first_moment[i] = m;
            self.second_moment[i] = v;
        }
        Ok(norm)
    }

    pub fn save(&self, path: &Path) -> candle_core::Result<()> {
        let mut tensors = HashMap::new();
        for (i, (name, _)) in self.params.iter().enumerate() {
            tensors.insert(format!("m.{name}"), self.first_moment[i].clone());
            tensors.insert(format!("v.{name}"), self.second_moment[i].clone());
        }
        candle_core::safetensors::save(&tensors, path)
    }

    pub fn load(&mut self, path: &Path, step: usize, device: &Device) -> candle_core::Result<()> {
        let mut tensors = candle_core::safetensors::load(path, device)?;
        for (i, (name, _)) in self.params.iter().enumerate() {
            let missing = || candle_core::Error::Msg(format!("optimizer state lacks {name}"));
            self.first_moment[i] = tensors.remove(&format!("m.{name}")).ok_or_else(missing)?;
            self.second_moment[i] = tensors.remove(&format!("v.{name}")).ok_or_else(missing)?;
        }
        self.step = step;
        Ok(())
    }
}

/// Linear warm-up to `peak` over `warmup` steps, then decay with `1/sqrt(step)`.
pub fn learning_rate(step: usize, peak: f64, warmup: usize) -> f64 {
    let step = step.max(1) as f64;
    let warmup = warmup.max(1) as f64;
    peak * (step / warmup).min((warmup / step).sqrt())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedule_peaks_at_warmup() {
        assert!((learning_rate(100, 1e-3, 100) - 1e-3).abs() < 1e-12);
        assert!(learning_rate(50, 1e-3, 100) < 1e-3);
        assert!((learning_rate(400, 1e-3, 100) - 5e-4).abs() < 1e-12);
    }

    #[test]
    fn adam_minimises_a_quadratic_and_clips() {
        let dev = Device::Cpu;
        let x = Var::new(&[3f32, -2.0], &dev).unwrap();
        let mut adam = Adam::new(vec![("x".into(), x.clone())]).unwrap();
        for _ in 0..300 {
            let loss = x.as_tensor().sqr().unwrap().sum_all().unwrap();
            let grads = loss.backward().unwrap();
            let norm = adam.step(&grads, 0.05, 1.0).unwrap();
            assert!(norm.is_finite());
        }
        let values = x.as_tensor().to_vec1::<f32>().unwrap();
        assert!(values.iter().all(|v| v.abs() < 0.05), "{values:?}");
    }
}
