//! Seeded dropout. candle cannot seed its CPU generator, so masks are drawn from our own
//! RNG: a training run is reproducible from its seed.

use std::cell::RefCell;

use candle_core::{Result, Tensor};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

pub struct Dropout {
    p: f32,
    rng: Option<RefCell<SmallRng>>,
}

impl Dropout {
    /// Inference: the identity.
    pub fn off() -> Self {
        Self { p: 0.0, rng: None }
    }

    pub fn new(p: f32, seed: u64) -> Self {
        if p == 0.0 {
            return Self::off();
        }
        Self {
            p,
            rng: Some(RefCell::new(SmallRng::seed_from_u64(seed))),
        }
    }

    /// Zeroes each element with probability `p` and rescales the rest by `1 / (1 - p)`.
    pub fn apply(&self, x: &Tensor) -> Result<Tensor> {
        let Some(rng) = &self.rng else {
            return Ok(x.clone());
        };
        let keep = 1.0 / (1.0 - self.p);
        let mut rng = rng.borrow_mut();
        let mask: Vec<f32> = (0..x.elem_count())
            .map(|_| if rng.gen::<f32>() < self.p { 0.0 } else { keep })
            .collect();
        x * Tensor::from_vec(mask, x.shape(), x.device())?
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn keeps_expectation_and_is_reproducible() {
        let x = Tensor::ones(10_000, candle_core::DType::F32, &Device::Cpu).unwrap();
        let a = Dropout::new(0.25, 7)
            .apply(&x)
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        let b = Dropout::new(0.25, 7)
            .apply(&x)
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        assert_eq!(a, b);
        let dropped = a.iter().filter(|&&v| v == 0.0).count() as f32 / a.len() as f32;
        assert!((dropped - 0.25).abs() < 0.02, "dropped {dropped}");
        let mean: f32 = a.iter().sum::<f32>() / a.len() as f32;
        assert!((mean - 1.0).abs() < 0.05, "mean {mean}");
        assert_eq!(
            Dropout::off().apply(&x).unwrap().to_vec1::<f32>().unwrap(),
            vec![1.0; 10_000]
        );
    }
}
