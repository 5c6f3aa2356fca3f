//! The core of multi-head attention, `softmax(scale * (q.k + q.a_k)) . (v + a_v)`, forward and
//! backward as one kernel each, with Shaw et al.'s relative vectors `a` as an option.
//!
//! Composed from candle ops this is a dozen tensors per layer (heads split and merged by
//! copies, scores, scaled, masked, five softmax passes, the relative terms gathered per pair)
//! and as many again backward. Here each (row, head) pair is one task that reads the
//! projections where they lie (`[batch, len, heads * head_dim]`, several projections side by
//! side), and keys past a row's end (padding, or the future for a decoder) are never touched:
//! they get probability exactly 0, as the additive mask of the ONNX graphs gives them.

use std::sync::Mutex;

use candle_core::{CpuStorage, CustomOp1, CustomOp2, Layout, Result, Shape, Tensor};
use multiversion::multiversion;
use rayon::prelude::*;

use super::{contiguous_f32, dot, with_f32};

/// Which keys each query sees.
#[derive(Clone, Debug)]
pub enum Keys {
    /// Keys `0..=i` for query `i` (a decoder's self-attention).
    Causal,
    /// Keys `0..lengths[row]` for every query of a row (trailing padding).
    Lengths(Vec<usize>),
}

impl Keys {
    /// The lengths of a `[batch, len]` 1/0 mask whose padding is trailing.
    pub fn from_mask(mask: &Tensor) -> Result<Self> {
        let rows = mask.to_vec2::<f32>()?;
        let mut lengths = Vec::with_capacity(rows.len());
        for row in rows {
            let length = row.iter().take_while(|&&m| m != 0.0).count();
            if row[length..].iter().any(|&m| m != 0.0) {
                candle_core::bail!("attention masks must pad at the end: {row:?}");
            }
            lengths.push(length);
        }
        Ok(Self::Lengths(lengths))
    }

    fn limit(&self, row: usize, query: usize) -> usize {
        match self {
            Self::Causal => query + 1,
            Self::Lengths(lengths) => lengths[row],
        }
    }
}

/// Shaw et al.'s distance vectors: `tables` `[1 or 2, 2 * clip + 1, head_dim]` holds the key
/// vectors and, when `values`, the value vectors.
pub struct Relative<'a> {
    pub tables: &'a Tensor,
    pub clip: usize,
    pub values: bool,
}

/// Self-attention over `qkv` `[batch, len, 3 * d]` (queries, keys and values side by side):
/// the context `[batch, len, d]`, heads side by side.
pub fn self_attention(
    qkv: &Tensor,
    heads: usize,
    keys: Keys,
    relative: Option<Relative>,
) -> Result<Tensor> {
    let d = qkv.dim(2)? / 3;
    let core = Core::new(heads, d / heads, keys, Packing::SelfAttention);
    match relative {
        None => qkv.contiguous()?.apply_op1(core),
        Some(r) => qkv.contiguous()?.apply_op2(
            &r.tables.contiguous()?,
            Core {
                relative: Some((r.clip, r.values)),
                ..core
            },
        ),
    }
}

/// Attention of `query` `[batch, tq, d]` over `key_value` `[batch, tk, 2 * d]` (keys, then
/// values): `[batch, tq, d]`.
pub fn cross_attention(
    query: &Tensor,
    key_value: &Tensor,
    heads: usize,
    keys: Keys,
) -> Result<Tensor> {
    let d = query.dim(2)?;
    let core = Core::new(heads, d / heads, keys, Packing::Cross);
    query
        .contiguous()?
        .apply_op2(&key_value.contiguous()?, core)
}

/// Where queries, keys and values sit among the op's inputs.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Packing {
    /// One input `[b, t, 3d]`.
    SelfAttention,
    /// `[b, tq, d]` and `[b, tk, 2d]`.
    Cross,
}

struct Core {
    heads: usize,
    head_dim: usize,
    keys: Keys,
    packing: Packing,
    /// `(clip, has value vectors)`; the tables are the second input.
    relative: Option<(usize, bool)>,
    /// `[b, heads, tq, tk]` probabilities, kept by the forward pass for the backward pass.
    probs: Mutex<Vec<f32>>,
}

/// One projection inside a `[b, t, width]` buffer: the vector of (row, position, head) is
/// `head_dim` floats at `((row * t + position) * width + offset + head * head_dim)`.
#[derive(Clone, Copy)]
struct Operand<'a> {
    data: &'a [f32],
    t: usize,
    width: usize,
    offset: usize,
    head_dim: usize,
}

impl<'a> Operand<'a> {
    fn at(&self, row: usize, position: usize, head: usize) -> usize {
        (row * self.t + position) * self.width + self.offset + head * self.head_dim
    }

    fn vector(&self, row: usize, position: usize, head: usize) -> &'a [f32] {
        let start = self.at(row, position, head);
        &self.data[start..start + self.head_dim]
    }
}

/// Queries, keys, values and relative tables of one call.
struct Operands<'a> {
    q: Operand<'a>,
    k: Operand<'a>,
    v: Operand<'a>,
    batch: usize,
    /// `(key table, value table)`, each `[2 * clip + 1, head_dim]`.
    tables: Option<(&'a [f32], Option<&'a [f32]>)>,
}

#[inline(always)]
fn axpy(alpha: f32, x: &[f32], y: &mut [f32]) {
    for (y, x) in y.iter_mut().zip(x) {
        *y += alpha * x;
    }
}

impl Core {
    fn new(heads: usize, head_dim: usize, keys: Keys, packing: Packing) -> Self {
        Self {
            heads,
            head_dim,
            keys,
            packing,
            relative: None,
            probs: Mutex::new(Vec::new()),
        }
    }

    fn scale(&self) -> f32 {
        1.0 / (self.head_dim as f32).sqrt()
    }

    /// The operands in `first` (and `second`) laid out as `packing` says.
    fn operands<'a>(
        &self,
        first: (&'a [f32], &Layout),
        second: Option<(&'a [f32], &Layout)>,
    ) -> Result<Operands<'a>> {
        let (b, t1, w1) = first.1.shape().dims3()?;
        let dh = self.head_dim;
        let d = self.heads * dh;
        let operand = |data, t, width, offset| Operand {
            data,
            t,
            width,
            offset,
            head_dim: dh,
        };
        Ok(match self.packing {
            Packing::SelfAttention => {
                let data = first.0;
                let tables = match (self.relative, second) {
                    (Some((clip, values)), Some((tables, _))) => {
                        let n = (2 * clip + 1) * dh;
                        Some((&tables[..n], values.then(|| &tables[n..2 * n])))
                    }
                    _ => None,
                };
                debug_assert_eq!(w1, 3 * d);
                Operands {
                    q: operand(data, t1, w1, 0),
                    k: operand(data, t1, w1, d),
                    v: operand(data, t1, w1, 2 * d),
                    batch: b,
                    tables,
                }
            }
            Packing::Cross => {
                let (kv, layout) = second.expect("cross-attention has two inputs");
                let (_, t2, w2) = layout.shape().dims3()?;
                Operands {
                    q: operand(first.0, t1, w1, 0),
                    k: operand(kv, t2, w2, 0),
                    v: operand(kv, t2, w2, d),
                    batch: b,
                    tables: None,
                }
            }
        })
    }

    /// Index of the relative vector of query `i` and key `j`.
    fn distance(&self, i: usize, j: usize) -> usize {
        let clip = self.relative.map_or(0, |(c, _)| c) as i64;
        ((j as i64 - i as i64).clamp(-clip, clip) + clip) as usize
    }

    /// Context `[b, tq, d]` and probabilities `[b, heads, tq, tk]`.
    fn forward(&self, ops: &Operands) -> (Vec<f32>, Vec<f32>) {
        let (tq, tk, dh, heads) = (ops.q.t, ops.k.t, self.head_dim, self.heads);
        let mut probs = vec![0f32; ops.batch * heads * tq * tk];
        // Head-major context, merged into [b, tq, d] below.
        let mut context = vec![0f32; ops.batch * heads * tq * dh];
        probs
            .par_chunks_mut(tq * tk)
            .zip(context.par_chunks_mut(tq * dh))
            .enumerate()
            .for_each(|(task, (probs, context))| {
                forward_task(self, ops, task / heads, task % heads, probs, context)
            });
        (merge_heads(&context, ops.batch, heads, tq, dh), probs)
    }
}

/// Probabilities `[tq, tk]` and head-major context `[tq, dh]` of one (row, head) pair.
#[multiversion(targets("x86_64+avx2+fma"))]
fn forward_task(
    core: &Core,
    ops: &Operands,
    row: usize,
    head: usize,
    probs: &mut [f32],
    context: &mut [f32],
) {
    let (tq, tk, dh) = (ops.q.t, ops.k.t, core.head_dim);
    let scale = core.scale();
    for i in 0..tq {
        let q = ops.q.vector(row, i, head);
        let limit = core.keys.limit(row, i).min(tk);
        let p = &mut probs[i * tk..i * tk + limit];
        for (j, p) in p.iter_mut().enumerate() {
            let mut s = dot(q, ops.k.vector(row, j, head));
            if let Some((table, _)) = ops.tables {
                let r = core.distance(i, j) * dh;
                s += dot(q, &table[r..r + dh]);
            }
            *p = s * scale;
        }
        let max = p.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0f32;
        for p in p.iter_mut() {
            *p = (*p - max).exp();
            sum += *p;
        }
        let out = &mut context[i * dh..(i + 1) * dh];
        for (j, p) in p.iter_mut().enumerate() {
            *p /= sum;
            axpy(*p, ops.v.vector(row, j, head), out);
            if let Some((_, Some(table))) = ops.tables {
                let r = core.distance(i, j) * dh;
                axpy(*p, &table[r..r + dh], out);
            }
        }
    }
}

/// `[b, heads, t, dh]` -> `[b, t, heads * dh]`.
fn merge_heads(x: &[f32], batch: usize, heads: usize, t: usize, dh: usize) -> Vec<f32> {
    let mut out = vec![0f32; x.len()];
    for (task, block) in x.chunks_exact(t * dh).enumerate() {
        let (row, head) = (task / heads, task % heads);
        for (i, v) in block.chunks_exact(dh).enumerate() {
            let start = (row * t + i) * heads * dh + head * dh;
            out[start..start + dh].copy_from_slice(v);
        }
    }
    debug_assert_eq!(out.len(), batch * heads * t * dh);
    out
}

/// Gradients of one (row, head) task: queries `[tq, dh]`, keys and values `[tk, dh]`, and
/// the relative key and value tables `[2 * (2c+1) * dh]`.
struct TaskGrads {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    tables: Vec<f32>,
}

/// Gradients of one (row, head) pair from its probabilities `[tq, tk]`.
#[multiversion(targets("x86_64+avx2+fma"))]
fn backward_task(
    core: &Core,
    ops: &Operands,
    grad: Operand,
    probs: &[f32],
    row: usize,
    head: usize,
) -> TaskGrads {
    let (tq, tk, dh) = (ops.q.t, ops.k.t, core.head_dim);
    let table_len = core.relative.map_or(0, |(c, _)| (2 * c + 1) * dh);
    let scale = core.scale();
    let mut g = TaskGrads {
        q: vec![0f32; tq * dh],
        k: vec![0f32; tk * dh],
        v: vec![0f32; tk * dh],
        tables: vec![0f32; 2 * table_len],
    };
    let mut dp = vec![0f32; tk];
    for i in 0..tq {
        let go = grad.vector(row, i, head);
        let q = ops.q.vector(row, i, head);
        let limit = core.keys.limit(row, i).min(tk);
        let p = &probs[i * tk..i * tk + limit];
        let mut weighted = 0f32;
        for j in 0..limit {
            let r = core.distance(i, j) * dh;
            let mut d = dot(go, ops.v.vector(row, j, head));
            axpy(p[j], go, &mut g.v[j * dh..(j + 1) * dh]);
            if let Some((_, Some(table))) = ops.tables {
                d += dot(go, &table[r..r + dh]);
                axpy(p[j], go, &mut g.tables[table_len + r..table_len + r + dh]);
            }
            dp[j] = d;
            weighted += p[j] * d;
        }
        let gq = &mut g.q[i * dh..(i + 1) * dh];
        for j in 0..limit {
            let ds = p[j] * (dp[j] - weighted) * scale;
            axpy(ds, ops.k.vector(row, j, head), gq);
            axpy(ds, q, &mut g.k[j * dh..(j + 1) * dh]);
            if let Some((table, _)) = ops.tables {
                let r = core.distance(i, j) * dh;
                axpy(ds, &table[r..r + dh], gq);
                axpy(ds, q, &mut g.tables[r..r + dh]);
            }
        }
    }
    g
}

impl Core {
    /// Gradients of the first input (and the second) in their own layouts.
    fn backward(&self, ops: &Operands, grad: &[f32]) -> (Vec<f32>, Option<Vec<f32>>) {
        let (tq, tk, heads, dh) = (ops.q.t, ops.k.t, self.heads, self.head_dim);
        let probs = std::mem::take(&mut *self.probs.lock().expect("attention probabilities"));
        let grad = Operand {
            data: grad,
            t: tq,
            width: heads * dh,
            offset: 0,
            head_dim: dh,
        };
        let tasks: Vec<TaskGrads> = probs
            .par_chunks(tq * tk)
            .enumerate()
            .map(|(task, p)| backward_task(self, ops, grad, p, task / heads, task % heads))
            .collect();
        let mut first = vec![0f32; ops.q.data.len()];
        let mut second = match self.packing {
            Packing::SelfAttention => vec![0f32; tasks.first().map_or(0, |t| t.tables.len())],
            Packing::Cross => vec![0f32; ops.k.data.len()],
        };
        for (task, g) in tasks.iter().enumerate() {
            let (row, head) = (task / heads, task % heads);
            let scatter = |dest: &mut [f32], op: &Operand, values: &[f32], t: usize| {
                for (i, v) in values.chunks_exact(dh).take(t).enumerate() {
                    let at = op.at(row, i, head);
                    dest[at..at + dh].copy_from_slice(v);
                }
            };
            scatter(&mut first, &ops.q, &g.q, tq);
            match self.packing {
                Packing::SelfAttention => {
                    scatter(&mut first, &ops.k, &g.k, tk);
                    scatter(&mut first, &ops.v, &g.v, tk);
                    for (s, t) in second.iter_mut().zip(&g.tables) {
                        *s += t;
                    }
                }
                Packing::Cross => {
                    scatter(&mut second, &ops.k, &g.k, tk);
                    scatter(&mut second, &ops.v, &g.v, tk);
                }
            }
        }
        let second = match (self.packing, self.relative) {
            (Packing::SelfAttention, None) => None,
            (Packing::SelfAttention, Some((_, values))) => {
                let n = second.len() / 2;
                second.truncate(if values { 2 * n } else { n });
                Some(second)
            }
            (Packing::Cross, _) => Some(second),
        };
        (first, second)
    }

    fn run_forward(&self, ops: &Operands) -> Result<(CpuStorage, Shape)> {
        let (context, probs) = self.forward(ops);
        *self.probs.lock().expect("attention probabilities") = probs;
        let shape = Shape::from((ops.batch, ops.q.t, self.heads * self.head_dim));
        Ok((CpuStorage::F32(context), shape))
    }
}

impl CustomOp1 for Core {
    fn name(&self) -> &'static str {
        "attention"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let ops = self.operands((contiguous_f32(storage, layout)?, layout), None)?;
        self.run_forward(&ops)
    }

    fn bwd(&self, arg: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        let grad = grad.contiguous()?;
        let first = with_f32(arg, |a, la| {
            with_f32(&grad, |g, _| {
                let ops = self.operands((a, la), None)?;
                Ok(self.backward(&ops, g).0)
            })
        })?;
        Ok(Some(Tensor::from_vec(first, arg.shape(), arg.device())?))
    }
}

impl CustomOp2 for Core {
    fn name(&self) -> &'static str {
        "attention"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let ops = self.operands(
            (contiguous_f32(s1, l1)?, l1),
            Some((contiguous_f32(s2, l2)?, l2)),
        )?;
        self.run_forward(&ops)
    }

    fn bwd(
        &self,
        arg1: &Tensor,
        arg2: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let grad = grad.contiguous()?;
        let (first, second) = with_f32(arg1, |a1, l1| {
            with_f32(arg2, |a2, l2| {
                with_f32(&grad, |g, _| {
                    let ops = self.operands((a1, l1), Some((a2, l2)))?;
                    Ok(self.backward(&ops, g))
                })
            })
        })?;
        let first = Tensor::from_vec(first, arg1.shape(), arg1.device())?;
        let second = second
            .map(|s| Tensor::from_vec(s, arg2.shape(), arg2.device()))
            .transpose()?;
        Ok((Some(first), second))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::testing::assert_same;
    use candle_core::{DType, Device, Var, D};

    const MASKED: f64 = -1e9;

    /// The same attention from candle's differentiable ops, with an additive mask.
    fn composed(
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        heads: usize,
        bias: &Tensor,
        relative: Option<(&Tensor, &Tensor, usize)>,
    ) -> Result<Tensor> {
        let (b, tq, d) = q.dims3()?;
        let tk = k.dim(1)?;
        let dh = d / heads;
        let split = |x: &Tensor, t| x.reshape((b, t, heads, dh))?.transpose(1, 2)?.contiguous();
        let (qh, kh, vh) = (split(q, tq)?, split(k, tk)?, split(v, tk)?);
        let mut scores = qh.matmul(&kh.t()?)?;
        let mut gathered = None;
        if let Some((rk, rv, clip)) = relative {
            let idx: Vec<u32> = (0..tq)
                .flat_map(|i| {
                    (0..tk).map(move |j| {
                        ((j as i64 - i as i64).clamp(-(clip as i64), clip as i64) + clip as i64)
                            as u32
                    })
                })
                .collect();
            let idx = Tensor::from_vec(idx, tq * tk, q.device())?;
            let ak = rk.index_select(&idx, 0)?.reshape((tq, tk, dh))?;
            let av = rv.index_select(&idx, 0)?.reshape((tq, tk, dh))?;
            // q_i . a_ij for every pair: [b, h, tq, 1, dh] * [1, 1, tq, tk, dh], summed.
            let rel = qh
                .unsqueeze(3)?
                .broadcast_mul(&ak.unsqueeze(0)?.unsqueeze(0)?)?
                .sum(4)?;
            scores = (scores + rel)?;
            gathered = Some(av);
        }
        let scores = (scores / (dh as f64).sqrt())?.broadcast_add(bias)?;
        let probs = candle_nn::ops::softmax(&scores, D::Minus1)?;
        let mut context = probs.matmul(&vh)?;
        if let Some(av) = gathered {
            let rel = probs
                .unsqueeze(4)?
                .broadcast_mul(&av.unsqueeze(0)?.unsqueeze(0)?)?
                .sum(3)?;
            context = (context + rel)?;
        }
        context.transpose(1, 2)?.reshape((b, tq, d))
    }

    fn var(shape: (usize, usize, usize), dev: &Device) -> Var {
        Var::from_tensor(&Tensor::randn(0f32, 1.0, shape, dev).unwrap()).unwrap()
    }

    #[test]
    fn self_attention_with_padding_matches_the_composed_ops() {
        let dev = Device::Cpu;
        let (b, t, d, heads) = (3, 7, 8, 2);
        let qkv = var((b, t, 3 * d), &dev);
        let lengths = vec![7, 4, 1];
        let fused = self_attention(&qkv, heads, Keys::Lengths(lengths.clone()), None).unwrap();
        let mask: Vec<f32> = lengths
            .iter()
            .flat_map(|&l| (0..t).map(move |j| if j < l { 0.0 } else { MASKED as f32 }))
            .collect();
        let bias = Tensor::from_vec(mask, (b, 1, 1, t), &dev).unwrap();
        let part = |i: usize| qkv.as_tensor().narrow(2, i * d, d).unwrap();
        let reference = composed(&part(0), &part(1), &part(2), heads, &bias, None).unwrap();
        assert_same(&fused, &reference, &[&qkv]);
    }

    #[test]
    fn causal_relative_self_attention_matches_the_composed_ops() {
        let dev = Device::Cpu;
        let (b, t, d, heads, clip) = (2, 9, 8, 2, 3);
        let qkv = var((b, t, 3 * d), &dev);
        let tables = var((2, 2 * clip + 1, d / heads), &dev);
        let relative = Relative {
            tables: tables.as_tensor(),
            clip,
            values: true,
        };
        let fused = self_attention(&qkv, heads, Keys::Causal, Some(relative)).unwrap();
        let causal: Vec<f32> = (0..t)
            .flat_map(|i| (0..t).map(move |j| if j > i { MASKED as f32 } else { 0.0 }))
            .collect();
        let bias = Tensor::from_vec(causal, (t, t), &dev).unwrap();
        let part = |i: usize| qkv.as_tensor().narrow(2, i * d, d).unwrap();
        let table = |i: usize| tables.as_tensor().get(i).unwrap();
        let reference = composed(
            &part(0),
            &part(1),
            &part(2),
            heads,
            &bias,
            Some((&table(0), &table(1), clip)),
        )
        .unwrap();
        assert_same(&fused, &reference, &[&qkv, &tables]);
    }

    #[test]
    fn relative_keys_only_take_no_value_vectors() {
        let dev = Device::Cpu;
        let (b, t, d, heads, clip) = (2, 5, 8, 2, 2);
        let qkv = var((b, t, 3 * d), &dev);
        let tables = var((1, 2 * clip + 1, d / heads), &dev);
        let relative = Relative {
            tables: tables.as_tensor(),
            clip,
            values: false,
        };
        let fused = self_attention(&qkv, heads, Keys::Lengths(vec![5, 3]), Some(relative)).unwrap();
        let bias = Tensor::from_vec(
            vec![
                0f32,
                0.,
                0.,
                0.,
                0.,
                0.,
                0.,
                0.,
                MASKED as f32,
                MASKED as f32,
            ],
            (b, 1, 1, t),
            &dev,
        )
        .unwrap();
        let part = |i: usize| qkv.as_tensor().narrow(2, i * d, d).unwrap();
        let zeros = Tensor::zeros((2 * clip + 1, d / heads), DType::F32, &dev).unwrap();
        let keys = tables.as_tensor().get(0).unwrap();
        let reference = composed(
            &part(0),
            &part(1),
            &part(2),
            heads,
            &bias,
            Some((&keys, &zeros, clip)),
        )
        .unwrap();
        assert_same(&fused, &reference, &[&qkv, &tables]);
    }

    #[test]
    fn cross_attention_matches_the_composed_ops() {
        let dev = Device::Cpu;
        let (b, tq, tk, d, heads) = (2, 4, 6, 8, 2);
        let q = var((b, tq, d), &dev);
        let kv = var((b, tk, 2 * d), &dev);
        let fused = cross_attention(&q, &kv, heads, Keys::Lengths(vec![6, 2])).unwrap();
        let mut mask = vec![0f32; b * tk];
        mask[tk + 2..].fill(MASKED as f32);
        let bias = Tensor::from_vec(mask, (b, 1, 1, tk), &dev).unwrap();
        let k = kv.as_tensor().narrow(2, 0, d).unwrap();
        let v = kv.as_tensor().narrow(2, d, d).unwrap();
        let reference = composed(&q, &k, &v, heads, &bias, None).unwrap();
        assert_same(&fused, &reference, &[&q, &kv]);
    }

    #[test]
    fn masks_must_pad_at_the_end() {
        let dev = Device::Cpu;
        let ok = Tensor::new(&[[1f32, 1.0, 0.0], [1.0, 1.0, 1.0]], &dev).unwrap();
        assert!(matches!(Keys::from_mask(&ok).unwrap(), Keys::Lengths(l) if l == [2, 3]));
        let holes = Tensor::new(&[[1f32, 0.0, 1.0]], &dev).unwrap();
        assert!(Keys::from_mask(&holes).is_err());
    }
}
