//! Seeded dropout. candle cannot seed its CPU generator, so masks come from our own
//! counter-based generator ([`crate::ops::dropout`]): a training run is reproducible from its
//! seed, and each call of a step draws a different mask.

use std::cell::Cell;

use candle_core::{Result, Tensor};

use crate::ops::dropout::{self as kernels, Mask};

pub struct Dropout {
    p: f32,
    seed: u64,
    /// Masks drawn so far: the next one is keyed by `(seed, calls)`.
    calls: Cell<u64>,
}

impl Dropout {
    /// Inference: the identity.
    pub fn off() -> Self {
        Self::new(0.0, 0)
    }

    pub fn new(p: f32, seed: u64) -> Self {
        Self {
            p,
            seed,
            calls: Cell::new(0),
        }
    }

    fn next_mask(&self) -> Option<Mask> {
        if self.p == 0.0 {
            return None;
        }
        let call = self.calls.get();
        self.calls.set(call + 1);
        let key = self
            .seed
            .wrapping_mul(0xD1B5_4A32_D192_ED03)
            .wrapping_add(call.wrapping_mul(0x8CB9_2BA7_2F3D_8DD7));
        Some(Mask::new(self.p, key))
    }

    /// Zeroes each element with probability `p` and rescales the rest by `1 / (1 - p)`.
    pub fn apply(&self, x: &Tensor) -> Result<Tensor> {
        match self.next_mask() {
            Some(mask) => kernels::dropout(x, mask),
            None => Ok(x.clone()),
        }
    }

    /// Dropout of `relu(x)`.
    pub fn relu(&self, x: &Tensor) -> Result<Tensor> {
        match self.next_mask() {
            Some(mask) => kernels::relu_dropout(x, mask),
            None => x.relu(),
        }
    }

    /// `x + dropout(y)`: the residual connection around a sublayer's output `y`.
    pub fn residual(&self, x: &Tensor, y: &Tensor) -> Result<Tensor> {
        match self.next_mask() {
            Some(mask) => kernels::residual_dropout(x, y, mask),
            None => x + y,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn keeps_expectation_and_is_reproducible() {
        let x = Tensor::ones(10_000, candle_core::DType::F32, &Device::Cpu).unwrap();
        let draw = |d: &Dropout| d.apply(&x).unwrap().to_vec1::<f32>().unwrap();
        let (first, second) = (Dropout::new(0.25, 7), Dropout::new(0.25, 7));
        let a = draw(&first);
        assert_eq!(a, draw(&second));
        assert_ne!(a, draw(&first), "a second call draws a new mask");
        let dropped = a.iter().filter(|&&v| v == 0.0).count() as f32 / a.len() as f32;
        assert!((dropped - 0.25).abs() < 0.02, "dropped {dropped}");
        let mean: f32 = a.iter().sum::<f32>() / a.len() as f32;
        assert!((mean - 1.0).abs() < 0.05, "mean {mean}");
        assert_eq!(draw(&Dropout::off()), vec![1.0; 10_000]);
    }
}
