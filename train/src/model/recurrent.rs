//! GRU and LSTM layers for the recurrent position encoders and the RNN-NMT baseline.
//!
//! Weights use PyTorch's layout and names (`weight_ih`, `weight_hh`, `bias_ih`, `bias_hh`,
//! gates stacked as `r, z, n` for the GRU and `i, f, g, o` for the LSTM; `_reverse` for the
//! backward direction), so the formulas below are PyTorch's and `model-export` only has to
//! reorder gates for ONNX's `GRU`/`LSTM` ops.
//!
//! Padding sits at the end of a row. The forward direction never sees it before a real
//! position; the backward direction would, so the state is held at zero through padding
//! (`mask`), which is what ONNX's `sequence_lens` does. Outputs at padding are zero, as in
//! ONNX.

use candle_core::{Module, Result, Tensor, D};
use candle_nn::{Linear, VarBuilder};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cell {
    Gru,
    Lstm,
}

impl Cell {
    /// Gate blocks stacked in the weight matrices.
    pub fn gates(self) -> usize {
        match self {
            Cell::Gru => 3,
            Cell::Lstm => 4,
        }
    }
}

/// The state of one direction: `h` (and `c` for the LSTM), each `[batch, hidden]`.
#[derive(Clone, Debug)]
pub struct State {
    pub h: Tensor,
    pub c: Option<Tensor>,
}

impl State {
    /// All zeros: nothing seen yet (the decoder-step contract's meaning of zero state).
    pub fn zeros(cell: Cell, batch: usize, hidden: usize, like: &Tensor) -> Result<Self> {
        let h = Tensor::zeros((batch, hidden), like.dtype(), like.device())?;
        Ok(Self {
            c: (cell == Cell::Lstm).then(|| h.clone()),
            h,
        })
    }

    /// `keep` `[batch, 1]` of 1/0: rows with 0 keep `old`.
    fn select(new: Self, old: &Self, keep: &Tensor) -> Result<Self> {
        let blend = |n: &Tensor, o: &Tensor| -> Result<Tensor> {
            let n = n.broadcast_mul(keep)?;
            o.broadcast_mul(&(1.0 - keep)?)? + n
        };
        Ok(Self {
            h: blend(&new.h, &old.h)?,
            c: match (&new.c, &old.c) {
                (Some(n), Some(o)) => Some(blend(n, o)?),
                _ => None,
            },
        })
    }
}

/// `sigmoid` through `tanh`, which candle differentiates (its fused sigmoid may not).
fn sigmoid(x: &Tensor) -> Result<Tensor> {
    ((x * 0.5)?.tanh()? + 1.0)? * 0.5
}

/// One direction of a recurrent layer.
#[derive(Clone, Debug)]
pub struct Direction {
    /// `[gates * hidden, input]`
    pub weight_ih: Tensor,
    /// `[gates * hidden, hidden]`
    pub weight_hh: Tensor,
    pub bias_ih: Tensor,
    pub bias_hh: Tensor,
}

impl Direction {
    fn new(cell: Cell, input: usize, hidden: usize, suffix: &str, vb: &VarBuilder) -> Result<Self> {
        let rows = cell.gates() * hidden;
        let bound = (hidden as f64).powf(-0.5);
        let uniform = candle_nn::Init::Uniform {
            lo: -bound,
            up: bound,
        };
        Ok(Self {
            weight_ih: vb.get_with_hints((rows, input), &format!("weight_ih{suffix}"), uniform)?,
            weight_hh: vb.get_with_hints((rows, hidden), &format!("weight_hh{suffix}"), uniform)?,
            bias_ih: vb.get_with_hints(rows, &format!("bias_ih{suffix}"), uniform)?,
            bias_hh: vb.get_with_hints(rows, &format!("bias_hh{suffix}"), uniform)?,
        })
    }

    /// `x @ W_ih^T + b_ih` for every position at once: `[batch, len, in]` ->
    /// `[batch, len, gates * hidden]`.
    fn project_inputs(&self, x: &Tensor) -> Result<Tensor> {
        let (b, t, i) = x.dims3()?;
        x.reshape((b * t, i))?
            .matmul(&self.weight_ih.t()?)?
            .broadcast_add(&self.bias_ih)?
            .reshape((b, t, ()))
    }

    /// One step from the projected input `gx` `[batch, gates * hidden]`.
    fn step_projected(&self, cell: Cell, gx: &Tensor, state: &State) -> Result<State> {
        let gh = state
            .h
            .matmul(&self.weight_hh.t()?)?
            .broadcast_add(&self.bias_hh)?;
        let hidden = self.weight_hh.dim(1)?;
        let chunk = |t: &Tensor, i: usize| t.narrow(D::Minus1, i * hidden, hidden);
        match cell {
            Cell::Gru => {
                let r = sigmoid(&(chunk(gx, 0)? + chunk(&gh, 0)?)?)?;
                let z = sigmoid(&(chunk(gx, 1)? + chunk(&gh, 1)?)?)?;
                let n = (chunk(gx, 2)? + (r * chunk(&gh, 2)?)?)?.tanh()?;
                // h' = (1 - z) * n + z * h = n + z * (h - n)
                let h = (&n + (z * (&state.h - &n)?)?)?;
                Ok(State { h, c: None })
            }
            Cell::Lstm => {
                let gates = (gx + gh)?;
                let i = sigmoid(&chunk(&gates, 0)?)?;
                let f = sigmoid(&chunk(&gates, 1)?)?;
                let g = chunk(&gates, 2)?.tanh()?;
                let o = sigmoid(&chunk(&gates, 3)?)?;
                let c_prev = state.c.as_ref().expect("LSTM state has a cell");
                let c = ((f * c_prev)? + (i * g)?)?;
                let h = (o * c.tanh()?)?;
                Ok(State { h, c: Some(c) })
            }
        }
    }
}

/// A single-layer GRU or LSTM, one or two directions.
#[derive(Clone, Debug)]
pub struct Rnn {
    pub cell: Cell,
    pub forward: Direction,
    /// The right-to-left direction of a bidirectional layer.
    pub backward: Option<Direction>,
    pub hidden: usize,
}

impl Rnn {
    pub fn new(
        cell: Cell,
        input: usize,
        hidden: usize,
        bidirectional: bool,
        vb: VarBuilder,
    ) -> Result<Self> {
        Ok(Self {
            cell,
            forward: Direction::new(cell, input, hidden, "", &vb)?,
            backward: if bidirectional {
                Some(Direction::new(cell, input, hidden, "_reverse", &vb)?)
            } else {
                None
            },
            hidden,
        })
    }

    /// Width of the output: `hidden`, twice that when bidirectional.
    pub fn output_dim(&self) -> usize {
        self.hidden * if self.backward.is_some() { 2 } else { 1 }
    }

    /// One step of the forward direction: `x` `[batch, in]`.
    pub fn step(&self, x: &Tensor, state: &State) -> Result<State> {
        let gx = self.forward.project_inputs(&x.unsqueeze(1)?)?.squeeze(1)?;
        self.forward.step_projected(self.cell, &gx, state)
    }

    /// Runs over `x` `[batch, len, in]` from zero state. `mask` `[batch, len]` (1 = real)
    /// marks trailing padding. Returns the outputs `[batch, len, output_dim]` (forward and
    /// backward halves concatenated) and the forward direction's final state.
    pub fn run(&self, x: &Tensor, mask: Option<&Tensor>) -> Result<(Tensor, State)> {
        let (b, t, _) = x.dims3()?;
        let keep: Option<Vec<Tensor>> = match mask {
            Some(m) => Some(
                (0..t)
                    .map(|i| m.narrow(1, i, 1))
                    .collect::<Result<Vec<_>>>()?,
            ),
            None => None,
        };
        let run_direction = |direction: &Direction, reverse: bool| -> Result<(Tensor, State)> {
            let gx = direction.project_inputs(x)?;
            let mut state = State::zeros(self.cell, b, self.hidden, x)?;
            let mut outputs = vec![None; t];
            let order: Vec<usize> = if reverse {
                (0..t).rev().collect()
            } else {
                (0..t).collect()
            };
            for i in order {
                let new = direction.step_projected(
                    self.cell,
                    &gx.narrow(1, i, 1)?.squeeze(1)?,
                    &state,
                )?;
                let (new, out) = match &keep {
                    Some(keep) => {
                        let out = new.h.broadcast_mul(&keep[i])?;
                        (State::select(new, &state, &keep[i])?, out)
                    }
                    None => (new.clone(), new.h),
                };
                state = new;
                outputs[i] = Some(out);
            }
            let outputs: Vec<Tensor> = outputs
                .into_iter()
                .map(|o| o.expect("every step ran"))
                .collect();
            Ok((Tensor::stack(&outputs, 1)?, state))
        };
        let (forward, state) = run_direction(&self.forward, false)?;
        let output = match &self.backward {
            Some(backward) => {
                let (backward, _) = run_direction(backward, true)?;
                Tensor::cat(&[&forward, &backward], D::Minus1)?
            }
            None => forward,
        };
        Ok((output, state))
    }
}

/// Chen et al.'s recurrent positional embedding: `r_j = tanh(RNN(x^r)_j W_r + b_r)` over the
/// last `recurrent_dim` dims of the word vector.
#[derive(Clone, Debug)]
pub struct RecurrentEmbedding {
    pub rnn: Rnn,
    pub proj: Linear,
}

impl RecurrentEmbedding {
    /// Bidirectional (half the width per direction) in the encoder, forward in the decoder.
    pub fn new(dim: usize, bidirectional: bool, vb: VarBuilder) -> Result<Self> {
        let hidden = if bidirectional { dim / 2 } else { dim };
        Ok(Self {
            rnn: Rnn::new(Cell::Gru, dim, hidden, bidirectional, vb.pp("rnn"))?,
            proj: candle_nn::linear(dim, dim, vb.pp("proj"))?,
        })
    }

    pub fn run(&self, x: &Tensor, mask: Option<&Tensor>) -> Result<(Tensor, State)> {
        let (out, state) = self.rnn.run(x, mask)?;
        Ok((self.proj.forward(&out)?.tanh()?, state))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::max_abs_diff;
    use candle_core::{DType, Device};
    use candle_nn::VarMap;

    fn rnn(cell: Cell, bidirectional: bool) -> Rnn {
        let varmap = VarMap::new();
        let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
        Rnn::new(cell, 6, 5, bidirectional, vb).unwrap()
    }

    #[test]
    fn a_whole_sequence_equals_the_same_run_step_by_step() {
        let dev = Device::Cpu;
        for cell in [Cell::Gru, Cell::Lstm] {
            let rnn = rnn(cell, false);
            let x = Tensor::randn(0f32, 1.0, (3, 7, 6), &dev).unwrap();
            let (whole, last) = rnn.run(&x, None).unwrap();
            let mut state = State::zeros(cell, 3, 5, &x).unwrap();
            for i in 0..7 {
                state = rnn
                    .step(&x.narrow(1, i, 1).unwrap().squeeze(1).unwrap(), &state)
                    .unwrap();
                let out = whole.narrow(1, i, 1).unwrap().squeeze(1).unwrap();
                assert!(max_abs_diff(&out, &state.h) < 1e-6, "{cell:?} step {i}");
            }
            assert!(max_abs_diff(&last.h, &state.h) < 1e-6);
            if cell == Cell::Lstm {
                assert!(max_abs_diff(last.c.as_ref().unwrap(), state.c.as_ref().unwrap()) < 1e-6);
            }
        }
    }

    #[test]
    fn the_gru_follows_the_pytorch_formula() {
        // One unit, one input, hand-set weights: r, z, n gates in that order.
        let dev = Device::Cpu;
        let t = |v: &[f32], shape: (usize, usize)| Tensor::from_slice(v, shape, &dev).unwrap();
        let direction = Direction {
            weight_ih: t(&[0.5, -0.25, 1.0], (3, 1)),
            weight_hh: t(&[0.1, 0.2, -0.3], (3, 1)),
            bias_ih: Tensor::new(&[0.0f32, 0.1, 0.0], &dev).unwrap(),
            bias_hh: Tensor::new(&[0.05f32, 0.0, 0.2], &dev).unwrap(),
        };
        let rnn = Rnn {
            cell: Cell::Gru,
            forward: direction,
            backward: None,
            hidden: 1,
        };
        let (x, h) = (0.7f32, -0.4f32);
        let s = |v: f32| 1.0 / (1.0 + (-v).exp());
        let r = s(0.5 * x + 0.1 * h + 0.05);
        let z = s(-0.25 * x + 0.1 + 0.2 * h);
        let n = (x + r * (-0.3 * h + 0.2)).tanh();
        let expected = (1.0 - z) * n + z * h;
        let state = State {
            h: t(&[h], (1, 1)),
            c: None,
        };
        let got = rnn.step(&t(&[x], (1, 1)), &state).unwrap().h;
        let got = got.flatten_all().unwrap().to_vec1::<f32>().unwrap()[0];
        assert!((got - expected).abs() < 1e-6, "{got} vs {expected}");
    }

    #[test]
    fn padding_never_changes_real_positions_in_either_direction() {
        let dev = Device::Cpu;
        for cell in [Cell::Gru, Cell::Lstm] {
            let rnn = rnn(cell, true);
            let x = Tensor::randn(0f32, 1.0, (1, 4, 6), &dev).unwrap();
            let (alone, _) = rnn
                .run(&x, Some(&Tensor::ones((1, 4), DType::F32, &dev).unwrap()))
                .unwrap();
            let noise = Tensor::randn(0f32, 1.0, (1, 3, 6), &dev).unwrap();
            let padded = Tensor::cat(&[&x, &noise], 1).unwrap();
            let mask = Tensor::new(&[[1f32, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0]], &dev).unwrap();
            let (out, _) = rnn.run(&padded, Some(&mask)).unwrap();
            assert!(
                max_abs_diff(&out.narrow(1, 0, 4).unwrap(), &alone) < 1e-6,
                "{cell:?}"
            );
            let tail = out
                .narrow(1, 4, 3)
                .unwrap()
                .abs()
                .unwrap()
                .max_all()
                .unwrap();
            assert_eq!(
                tail.to_scalar::<f32>().unwrap(),
                0.0,
                "outputs at padding are zero"
            );
        }
    }
}
