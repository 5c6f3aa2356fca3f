//! Fused CPU kernels with hand-written backward passes, as candle custom ops.
//!
//! Composed from candle's elementwise ops, each of these allocates and walks its tensors a
//! dozen times forward and again backward; fused, it makes one or two passes. Each kernel is
//! tested against the composed ops it replaces, value and gradient.

pub mod attention;
pub mod cross_entropy;
pub mod dropout;
pub mod layer_norm;
pub mod linear;

use candle_core::{CpuStorage, Layout, Result, Storage, Tensor};

/// The f32 values of a contiguous operand.
fn contiguous_f32<'a>(storage: &'a CpuStorage, layout: &Layout) -> Result<&'a [f32]> {
    let (start, end) = layout
        .contiguous_offsets()
        .ok_or_else(|| candle_core::Error::Msg("fused ops take contiguous tensors".into()))?;
    Ok(&storage.as_slice::<f32>()?[start..end])
}

/// Runs `f` on the f32 values of a CPU tensor (made contiguous first if need be): backward
/// passes read their operands without an op of their own.
fn with_f32<R>(tensor: &Tensor, f: impl FnOnce(&[f32], &Layout) -> Result<R>) -> Result<R> {
    let tensor = tensor.contiguous()?;
    let (storage, layout) = tensor.storage_and_layout();
    match &*storage {
        Storage::Cpu(cpu) => f(contiguous_f32(cpu, layout)?, layout),
        _ => candle_core::bail!("fused ops run on the CPU"),
    }
}

/// Rows per parallel task: a few tasks per thread, so that one slow thread does not hold up
/// the rest.
fn rows_per_task(rows: usize) -> usize {
    rows.div_ceil(4 * rayon::current_num_threads()).max(1)
}

/// Lanes of the partial sums in [`dot`] and [`sum`]: independent accumulators are what lets
/// the compiler vectorise a float reduction (it may not reorder one sum).
pub(crate) const LANES: usize = 16;

/// `sum(a[i] * b[i])`.
#[inline(always)]
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; LANES];
    let (xs, ys) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let tail: f32 = xs
        .remainder()
        .iter()
        .zip(ys.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in xs.zip(ys) {
        for l in 0..LANES {
            acc[l] += x[l] * y[l];
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// `sum(a[i])`.
#[inline(always)]
pub(crate) fn sum(a: &[f32]) -> f32 {
    let mut acc = [0f32; LANES];
    let xs = a.chunks_exact(LANES);
    let tail: f32 = xs.remainder().iter().sum();
    for x in xs {
        for l in 0..LANES {
            acc[l] += x[l];
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// The check every kernel's test makes against the candle ops it replaces.
#[cfg(test)]
pub(crate) mod testing {
    use crate::max_abs_diff;
    use candle_core::{Tensor, Var};

    /// `fused` equals `reference` within 1e-5, and so does the gradient of every one of
    /// `vars` within 1e-4, under a random (non-uniform) upstream gradient so that every term
    /// of the backward pass counts.
    pub fn assert_same(fused: &Tensor, reference: &Tensor, vars: &[&Var]) {
        assert!(max_abs_diff(fused, reference) < 1e-5, "values differ");
        let probe = Tensor::randn(0f32, 1.0, fused.shape(), fused.device()).unwrap();
        let grads = |y: &Tensor| (y * &probe).unwrap().sum_all().unwrap().backward().unwrap();
        let (a, b) = (grads(fused), grads(reference));
        for (n, var) in vars.iter().enumerate() {
            let diff = max_abs_diff(
                a.get(var.as_tensor()).unwrap(),
                b.get(var.as_tensor()).unwrap(),
            );
            assert!(diff < 1e-4, "gradient of input {n} differs by {diff}");
        }
    }
}
