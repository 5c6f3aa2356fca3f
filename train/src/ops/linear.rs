//! `x . W^T + b` as one op over any number of leading dimensions.
//!
//! candle's `Linear` is a reshape, a transposed view of `W`, a matmul, a broadcast add and a
//! reshape back: five graph nodes, each of which costs a zero-filled gradient buffer and an
//! add in candle's backward pass, plus a strided column reduction for the bias gradient and a
//! transposed add for the weight gradient. Here the bias is the matmul's initial value and
//! the backward pass is two matrix products and one row-major column sum.

use candle_core::{CpuStorage, CustomOp2, CustomOp3, Layout, Result, Shape, Tensor};

use super::{contiguous_f32, with_f32};

/// `x` `[.., k]`, `weight` `[n, k]`, `bias` `[n]` -> `[.., n]`.
pub fn linear(x: &Tensor, weight: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
    let (x, weight) = (x.contiguous()?, weight.contiguous()?);
    match bias {
        Some(bias) => x.apply_op3(&weight, &bias.contiguous()?, Linear),
        None => x.apply_op2(&weight, Linear),
    }
}

struct Linear;

/// A row-major or transposed view of a matrix: element `(r, c)` is at
/// `r * row_stride + c * col_stride`.
#[derive(Clone, Copy)]
pub(crate) struct MatRef<'a> {
    pub data: &'a [f32],
    pub row_stride: usize,
    pub col_stride: usize,
}

impl<'a> MatRef<'a> {
    /// A row-major matrix of `cols` columns.
    pub fn rows(data: &'a [f32], cols: usize) -> Self {
        Self {
            data,
            row_stride: cols,
            col_stride: 1,
        }
    }

    /// The transpose of a row-major matrix of `cols` columns.
    pub fn transposed(data: &'a [f32], cols: usize) -> Self {
        Self {
            data,
            row_stride: 1,
            col_stride: cols,
        }
    }
}

/// `dst [m, n] (+)= lhs [m, k] . rhs [k, n]`, `dst` row-major, on the rayon pool's threads.
pub(crate) fn matmul(
    dst: &mut [f32],
    accumulate: bool,
    lhs: MatRef,
    rhs: MatRef,
    (m, n, k): (usize, usize, usize),
) {
    assert!(dst.len() >= m * n, "matmul destination too small");
    let last = |a: &MatRef, rows: usize, cols: usize| {
        if rows == 0 || cols == 0 {
            0
        } else {
            (rows - 1) * a.row_stride + (cols - 1) * a.col_stride
        }
    };
    assert!(last(&lhs, m, k) < lhs.data.len().max(1) && last(&rhs, k, n) < rhs.data.len().max(1));
    let threads = rayon::current_num_threads();
    let parallelism = if threads > 1 {
        gemm::Parallelism::Rayon(threads)
    } else {
        gemm::Parallelism::None
    };
    // SAFETY: the asserts above keep every index the strides reach inside the slices.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            n as isize,
            accumulate,
            lhs.data.as_ptr(),
            lhs.col_stride as isize,
            lhs.row_stride as isize,
            rhs.data.as_ptr(),
            rhs.col_stride as isize,
            rhs.row_stride as isize,
            1.0,
            1.0,
            false,
            false,
            false,
            parallelism,
        )
    }
}

impl Linear {
    fn forward(
        &self,
        x: &[f32],
        x_layout: &Layout,
        weight: &[f32],
        w_layout: &Layout,
        bias: Option<&[f32]>,
    ) -> Result<(CpuStorage, Shape)> {
        let (n, k) = w_layout.shape().dims2()?;
        let rows = x.len() / k;
        let mut out = match bias {
            Some(b) => b.repeat(rows),
            None => vec![0f32; rows * n],
        };
        matmul(
            &mut out,
            bias.is_some(),
            MatRef::rows(x, k),
            MatRef::transposed(weight, k),
            (rows, n, k),
        );
        let mut dims = x_layout.shape().dims().to_vec();
        *dims.last_mut().expect("linear input has a last dimension") = n;
        Ok((CpuStorage::F32(out), Shape::from(dims)))
    }

    /// Gradients of `x`, `weight` and the bias.
    fn backward(
        &self,
        x: &Tensor,
        weight: &Tensor,
        grad: &Tensor,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        let (n, k) = weight.dims2()?;
        let rows = x.elem_count() / k;
        let (gx, gw, gb) = with_f32(x, |x, _| {
            with_f32(weight, |w, _| {
                with_f32(grad, |g, _| {
                    let mut gx = vec![0f32; rows * k];
                    matmul(
                        &mut gx,
                        false,
                        MatRef::rows(g, n),
                        MatRef::rows(w, k),
                        (rows, k, n),
                    );
                    let mut gw = vec![0f32; n * k];
                    let g_t = MatRef::transposed(g, n);
                    matmul(&mut gw, false, g_t, MatRef::rows(x, k), (n, k, rows));
                    let mut gb = vec![0f32; n];
                    for row in g.chunks_exact(n) {
                        for (b, v) in gb.iter_mut().zip(row) {
                            *b += v;
                        }
                    }
                    Ok((gx, gw, gb))
                })
            })
        })?;
        let dev = x.device();
        Ok((
            Tensor::from_vec(gx, x.shape(), dev)?,
            Tensor::from_vec(gw, (n, k), dev)?,
            Tensor::from_vec(gb, n, dev)?,
        ))
    }
}

impl CustomOp2 for Linear {
    fn name(&self) -> &'static str {
        "linear"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        self.forward(
            contiguous_f32(s1, l1)?,
            l1,
            contiguous_f32(s2, l2)?,
            l2,
            None,
        )
    }

    fn bwd(
        &self,
        x: &Tensor,
        weight: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let (gx, gw, _) = self.backward(x, weight, grad)?;
        Ok((Some(gx), Some(gw)))
    }
}

impl CustomOp3 for Linear {
    fn name(&self) -> &'static str {
        "linear"
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
        let bias = contiguous_f32(s3, l3)?;
        self.forward(
            contiguous_f32(s1, l1)?,
            l1,
            contiguous_f32(s2, l2)?,
            l2,
            Some(bias),
        )
    }

    fn bwd(
        &self,
        x: &Tensor,
        weight: &Tensor,
        _bias: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let (gx, gw, gb) = self.backward(x, weight, grad)?;
        Ok((Some(gx), Some(gw), Some(gb)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::testing::assert_same;
    use candle_core::{Device, Module, Var};

    #[test]
    fn matches_candle_linear_in_value_and_gradient() {
        let dev = Device::Cpu;
        let x = Var::from_tensor(&Tensor::randn(0f32, 1.0, (3, 5, 7), &dev).unwrap()).unwrap();
        let w = Var::from_tensor(&Tensor::randn(0f32, 1.0, (4, 7), &dev).unwrap()).unwrap();
        let b = Var::from_tensor(&Tensor::randn(0f32, 1.0, 4, &dev).unwrap()).unwrap();
        for bias in [true, false] {
            let reference_layer =
                candle_nn::Linear::new(w.as_tensor().clone(), bias.then(|| b.as_tensor().clone()));
            let fused = linear(&x, &w, bias.then_some(b.as_tensor())).unwrap();
            let reference = reference_layer.forward(&x).unwrap();
            let vars: &[&Var] = if bias { &[&x, &w, &b] } else { &[&x, &w] };
            assert_same(&fused, &reference, vars);
        }
    }
}
