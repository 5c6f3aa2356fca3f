//! Kernels of the fused operators a package's graphs may hold
//! ([`model_package::names::FUSED_DOMAIN`]), registered with ONNX Runtime's CPU sessions.
//!
//! Each operator is also a model-local ONNX function, so that a runtime without these
//! kernels (Python's ONNX Runtime, the CUDA path, where a CPU kernel would copy every step's
//! tensors to the host) runs its body of standard operators instead. What a kernel adds is
//! what the body cannot express: [`names::ATTENTION_STEP`]'s body multiplies every row's
//! query with every column of the batch's memory, padding included, where the kernel reads
//! only the columns the row's bias leaves visible, i.e. the row's own source rather than
//! the longest in a running batch; [`names::CACHED_ATTENTION_STEP`] and
//! [`names::RELATIVE_CACHED_ATTENTION_STEP`] likewise read a row's own cache prefix rather
//! than the columns of the batch's oldest row. Rows are computed independently of one
//! another, so a translation does not depend on its batch-mates.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use model_package::names;
use ort::operator::{ComputeContext, Kernel, KernelContext, Operator, OperatorDomain};
use ort::operator::{OperatorInput, OperatorOutput};
use ort::value::TensorElementType;

use crate::attention_lanes::{dots_into, softmax_weigh};
use crate::backend::{AttentionReads, ContextReads};

/// The domain holding every kernel of this module, for `SessionBuilder::with_operators`
/// (every CPU session of the engine has it); `taken` counts the kernels the session creates.
pub fn domain(taken: &Arc<KernelsTaken>) -> ort::Result<OperatorDomain> {
    let cached = |relative| CachedAttentionStepOp {
        kernel: CachedAttentionStep { relative },
        taken: Arc::clone(taken),
    };
    let domain = OperatorDomain::new(names::FUSED_DOMAIN)?
        .add(AttentionStepOp {
            taken: Arc::clone(taken),
        })?
        .add(cached(true))?
        .add(cached(false))?;
    // Without VNNI the operator's body (ONNX Runtime's u8s8 product) runs instead.
    match crate::row_int8::available() {
        true => domain.add(crate::row_int8::RowQuantizedMatMulOp {
            taken: Arc::clone(taken),
        }),
        false => Ok(domain),
    }
}

/// Creates a session (`commit`) whose builder may hold [`domain`]. ONNX Runtime adds a custom
/// domain to ONNX's process-wide table of domain versions as it creates a session with it
/// (`CreateCustomRegistry`), checking whether it is there and then adding it without a lock,
/// so two such sessions created at once in a fresh process can both add it and the second
/// fails ("Trying to add a domain to DomainToVersion map, but the domain is already exist":
/// seen in tests that open packages on parallel threads). Sessions are created one at a time
/// until one has succeeded; after that the domain is in the table and they go in parallel.
pub fn commit_session<T, E>(commit: impl FnOnce() -> Result<T, E>) -> Result<T, E> {
    static DOMAIN_ADDED: UntilFirstSuccess = UntilFirstSuccess::new();
    DOMAIN_ADDED.run(commit)
}

/// Runs calls one at a time until one has succeeded, then lets them run at once.
struct UntilFirstSuccess(Mutex<bool>);

impl UntilFirstSuccess {
    const fn new() -> Self {
        UntilFirstSuccess(Mutex::new(false))
    }

    fn run<T, E>(&self, call: impl FnOnce() -> Result<T, E>) -> Result<T, E> {
        let mut succeeded = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if *succeeded {
            drop(succeeded);
            return call();
        }
        let result = call();
        *succeeded = result.is_ok();
        result
    }
}

/// How many nodes of a session got this module's kernels: ONNX Runtime creates a kernel per
/// node when it builds the session, so once built this says whether its attention reads each
/// row's own context, which is what a step costs (the scheduler's cost model). A graph
/// without fused nodes, or a session without these kernels (the CUDA path), reads the
/// batch's padded slots.
#[derive(Debug, Default)]
pub struct KernelsTaken {
    cross: AtomicUsize,
    cached: AtomicUsize,
    /// Int8 products run by [`crate::row_int8`]'s kernel.
    pub(crate) int8: AtomicUsize,
}

impl KernelsTaken {
    /// How many of the session's int8 products run on the VNNI kernel (the rest, if any, on
    /// the operator's body).
    pub fn int8_kernels(&self) -> usize {
        self.int8.load(Ordering::Relaxed)
    }

    /// What the session's decoder-step attention reads, by the kernels it took.
    pub fn reads(&self) -> AttentionReads {
        let reads = |count: &AtomicUsize| match count.load(Ordering::Relaxed) {
            0 => ContextReads::Padded,
            _ => ContextReads::OwnRows,
        };
        AttentionReads {
            source: reads(&self.cross),
            cache: reads(&self.cached),
        }
    }
}

/// The value of a scalar input (the scores' scale).
fn scalar(value: &ort::value::ValueRef<'_>) -> ort::Result<f32> {
    let (_, values) = value.try_extract_tensor::<f32>()?;
    values
        .first()
        .copied()
        .ok_or_else(|| ort::Error::new("an empty scalar"))
}

/// An input of a kernel's call, or an error naming the operator.
fn input<'a>(ctx: &'a ComputeContext, op: &str, i: usize) -> ort::Result<ort::value::ValueRef<'a>> {
    ctx.input(i)?
        .ok_or_else(|| ort::Error::new(format!("{op}: input {i} missing")))
}

/// Operator of [`names::ATTENTION_STEP`].
struct AttentionStepOp {
    taken: Arc<KernelsTaken>,
}

/// Kernel of [`names::ATTENTION_STEP`] (it holds no state).
struct AttentionStep;

impl Operator for AttentionStepOp {
    type Kernel<'attr> = AttentionStep;

    fn name(&self) -> &str {
        names::ATTENTION_STEP
    }

    fn inputs(&self) -> impl IntoIterator<Item = OperatorInput> {
        (0..5).map(|_| OperatorInput::required(TensorElementType::Float32))
    }

    fn outputs(&self) -> impl IntoIterator<Item = OperatorOutput> {
        [OperatorOutput::required(TensorElementType::Float32)]
    }

    fn create_kernel<'attr>(&self, _: &KernelContext<'attr>) -> ort::Result<Self::Kernel<'attr>> {
        self.taken.cross.fetch_add(1, Ordering::Relaxed);
        Ok(AttentionStep)
    }
}

impl Kernel for AttentionStep {
    fn compute(&mut self, ctx: &ComputeContext) -> ort::Result<()> {
        let input = |i: usize| input(ctx, names::ATTENTION_STEP, i);
        let (q, keys, values, bias, scale) =
            (input(0)?, input(1)?, input(2)?, input(3)?, input(4)?);
        let (q_shape, q) = q.try_extract_tensor::<f32>()?;
        let (key_shape, keys) = keys.try_extract_tensor::<f32>()?;
        let (_, values) = values.try_extract_tensor::<f32>()?;
        let (_, bias) = bias.try_extract_tensor::<f32>()?;
        let counts = [keys.len(), values.len(), bias.len()];
        let shape = StepShape::new(&q_shape[..], &key_shape[..], counts)
            .map_err(|e| ort::Error::new(format!("{}: {e}", names::ATTENTION_STEP)))?;
        let out_shape = q_shape.to_vec();
        let mut out = ctx
            .output(0, out_shape)?
            .ok_or_else(|| ort::Error::new(format!("{}: no output", names::ATTENTION_STEP)))?;
        let (_, out) = out.try_extract_tensor_mut::<f32>()?;
        let inputs = StepInputs {
            shape,
            q,
            keys,
            values,
            bias,
            scale: scalar(&scale)?,
        };
        attention_step(&inputs, out);
        Ok(())
    }
}

/// `[batch, heads, len, head_dim]` of an [`names::ATTENTION_STEP`]'s keys, checked against
/// its query `[batch, heads, 1, head_dim]` and bias `[batch, 1, 1, len]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct StepShape {
    batch: usize,
    heads: usize,
    len: usize,
    head_dim: usize,
}

impl StepShape {
    /// `counts`: how many values the keys, values and bias hold.
    fn new(q: &[i64], keys: &[i64], counts: [usize; 3]) -> Result<Self, String> {
        let [key_count, value_count, bias_count] = counts;
        let [batch, heads, len, head_dim] = <[i64; 4]>::try_from(keys)
            .map_err(|_| format!("keys of rank {} where 4 is expected", keys.len()))?
            .map(|d| d as usize);
        if q != [batch as i64, heads as i64, 1, head_dim as i64] {
            return Err(format!("query {q:?} for keys {keys:?}"));
        }
        let cells = batch * heads * len * head_dim;
        if key_count != cells || value_count != cells || bias_count != batch * len {
            return Err(format!(
                "{value_count} values and {bias_count} biases for keys {keys:?}"
            ));
        }
        Ok(Self {
            batch,
            heads,
            len,
            head_dim,
        })
    }
}

struct StepInputs<'a> {
    shape: StepShape,
    q: &'a [f32],
    keys: &'a [f32],
    values: &'a [f32],
    bias: &'a [f32],
    scale: f32,
}

crate::by_cpu::by_cpu! {
    /// `softmax(q k^T * scale + bias) v` per row and head, over the row's [`visible_columns`].
    fn attention_step(x: &StepInputs<'_>, out: &mut [f32]) => attention_step_lanes
}

#[inline(always)]
fn attention_step_lanes(x: &StepInputs<'_>, out: &mut [f32]) {
    let StepShape {
        batch,
        heads,
        len,
        head_dim,
    } = x.shape;
    let mut visible = Vec::with_capacity(len);
    let mut weights = Vec::with_capacity(len);
    for row in 0..batch {
        let bias = &x.bias[row * len..(row + 1) * len];
        visible_columns(bias, &mut visible);
        for head in 0..heads {
            let at = row * heads + head;
            let q = &x.q[at * head_dim..(at + 1) * head_dim];
            let keys = &x.keys[at * len * head_dim..(at + 1) * len * head_dim];
            let values = &x.values[at * len * head_dim..(at + 1) * len * head_dim];
            weights.clear();
            let key = |j: usize| &keys[j * head_dim..(j + 1) * head_dim];
            dots_into(q, visible.iter().map(|&j| key(j)), &mut weights);
            for (w, &j) in weights.iter_mut().zip(&visible) {
                *w = *w * x.scale + bias[j];
            }
            let context = &mut out[at * head_dim..(at + 1) * head_dim];
            softmax_weigh(
                &mut weights,
                context,
                visible
                    .iter()
                    .map(|&j| [&values[j * head_dim..(j + 1) * head_dim]]),
            );
        }
    }
}

/// Operator and kernel of a decoder step's self-attention over its cache:
/// [`names::RELATIVE_CACHED_ATTENTION_STEP`] with relative tables,
/// [`names::CACHED_ATTENTION_STEP`] without.
#[derive(Clone, Copy)]
struct CachedAttentionStep {
    relative: bool,
}

/// Operator of [`CachedAttentionStep`]: the kernel it creates, counted in `taken`.
struct CachedAttentionStepOp {
    kernel: CachedAttentionStep,
    taken: Arc<KernelsTaken>,
}

impl CachedAttentionStep {
    fn op(&self) -> &'static str {
        match self.relative {
            true => names::RELATIVE_CACHED_ATTENTION_STEP,
            false => names::CACHED_ATTENTION_STEP,
        }
    }
}

impl Operator for CachedAttentionStepOp {
    type Kernel<'attr> = CachedAttentionStep;

    fn name(&self) -> &str {
        self.kernel.op()
    }

    fn inputs(&self) -> impl IntoIterator<Item = OperatorInput> {
        use TensorElementType::{Float32, Int64};
        // q, past keys and values, new key and value, bias, split; with relative tables
        // their keys and values, rows and zeros; the scale.
        let cache = [Float32, Float32, Float32, Float32, Float32, Float32, Int64];
        let tables = [Float32, Float32, Int64, Float32];
        let tables = if self.kernel.relative {
            &tables[..]
        } else {
            &[]
        };
        cache
            .into_iter()
            .chain(tables.iter().copied())
            .chain([Float32])
            .map(OperatorInput::required)
            .collect::<Vec<_>>()
    }

    fn outputs(&self) -> impl IntoIterator<Item = OperatorOutput> {
        [OperatorOutput::required(TensorElementType::Float32)]
    }

    fn create_kernel<'attr>(&self, _: &KernelContext<'attr>) -> ort::Result<Self::Kernel<'attr>> {
        self.taken.cached.fetch_add(1, Ordering::Relaxed);
        Ok(self.kernel)
    }
}

impl Kernel for CachedAttentionStep {
    fn compute(&mut self, ctx: &ComputeContext) -> ort::Result<()> {
        let op = self.op();
        let fail = |e: String| ort::Error::new(format!("{op}: {e}"));
        let input = |i: usize| input(ctx, op, i);
        let (q, past_keys, past_values) = (input(0)?, input(1)?, input(2)?);
        let (new_key, new_value, bias) = (input(3)?, input(4)?, input(5)?);
        let scale = input(if self.relative { 11 } else { 7 })?;
        let (q_shape, q) = q.try_extract_tensor::<f32>()?;
        let (past_shape, past_keys) = past_keys.try_extract_tensor::<f32>()?;
        let shape = CachedShape::new(&q_shape[..], &past_shape[..]).map_err(fail)?;
        let tables = match self.relative {
            true => Some((input(7)?, input(8)?, input(9)?)),
            false => None,
        };
        let relative = match &tables {
            Some((keys, values, rows)) => {
                let (table_shape, keys) = keys.try_extract_tensor::<f32>()?;
                let tables = RelativeTables::new(
                    &table_shape[..],
                    keys,
                    values.try_extract_tensor::<f32>()?.1,
                    rows.try_extract_tensor::<i64>()?.1,
                    shape,
                );
                Some(tables.map_err(fail)?)
            }
            None => None,
        };
        let x = CachedInputs {
            shape,
            q,
            past_keys,
            past_values: past_values.try_extract_tensor::<f32>()?.1,
            new_key: new_key.try_extract_tensor::<f32>()?.1,
            new_value: new_value.try_extract_tensor::<f32>()?.1,
            bias: bias.try_extract_tensor::<f32>()?.1,
            relative,
            scale: scalar(&scale)?,
        };
        x.check().map_err(fail)?;
        let mut out = ctx
            .output(0, q_shape.to_vec())?
            .ok_or_else(|| fail("no output".into()))?;
        let (_, out) = out.try_extract_tensor_mut::<f32>()?;
        cached_attention_step(&x, out);
        Ok(())
    }
}

/// A cached step's sizes: `past` cache columns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct CachedShape {
    batch: usize,
    heads: usize,
    past: usize,
    head_dim: usize,
}

impl CachedShape {
    fn new(q: &[i64], past: &[i64]) -> Result<Self, String> {
        let [batch, heads, past_len, head_dim] = <[i64; 4]>::try_from(past)
            .map_err(|_| format!("a cache of rank {} where 4 is expected", past.len()))?;
        if q != [batch, heads, 1, head_dim] {
            return Err(format!("query {q:?} for a cache {past:?}"));
        }
        Ok(Self {
            batch: batch as usize,
            heads: heads as usize,
            past: past_len as usize,
            head_dim: head_dim as usize,
        })
    }
}

/// Shaw et al.'s tables of a cached step: `table` rows (2k + 1) of keys and values, and the
/// row of each (row, head, column), all checked to be in range.
#[derive(Clone, Copy)]
struct RelativeTables<'a> {
    keys: &'a [f32],
    values: &'a [f32],
    rows: &'a [i64],
}

impl<'a> RelativeTables<'a> {
    fn new(
        key_shape: &[i64],
        keys: &'a [f32],
        values: &'a [f32],
        rows: &'a [i64],
        shape: CachedShape,
    ) -> Result<Self, String> {
        let CachedShape {
            batch,
            heads,
            past,
            head_dim,
        } = shape;
        if key_shape.len() != 2 || key_shape[1] != head_dim as i64 {
            return Err(format!(
                "relative tables {key_shape:?} for heads of {head_dim}"
            ));
        }
        let table = key_shape[0] as usize;
        if values.len() != table * head_dim || rows.len() != batch * heads * (past + 1) {
            return Err(format!(
                "{} relative values and {} rows for tables {key_shape:?}",
                values.len(),
                rows.len()
            ));
        }
        match rows.iter().find(|&&r| r < 0 || r as usize >= table) {
            Some(r) => Err(format!("table row {r} outside 0..{table}")),
            None => Ok(Self { keys, values, rows }),
        }
    }
}

struct CachedInputs<'a> {
    shape: CachedShape,
    q: &'a [f32],
    past_keys: &'a [f32],
    past_values: &'a [f32],
    new_key: &'a [f32],
    new_value: &'a [f32],
    bias: &'a [f32],
    relative: Option<RelativeTables<'a>>,
    scale: f32,
}

impl CachedInputs<'_> {
    /// Every input's size against the shape: the kernel then indexes without failing.
    fn check(&self) -> Result<(), String> {
        let CachedShape {
            batch,
            heads,
            past,
            head_dim,
        } = self.shape;
        let sizes = [
            (
                "past values",
                self.past_values.len(),
                batch * heads * past * head_dim,
            ),
            ("new key", self.new_key.len(), batch * heads * head_dim),
            ("new value", self.new_value.len(), batch * heads * head_dim),
            ("bias", self.bias.len(), batch * (past + 1)),
        ];
        for (what, got, want) in sizes {
            if got != want {
                return Err(format!("{what}: {got} values where {want} are expected"));
            }
        }
        Ok(())
    }
}

crate::by_cpu::by_cpu! {
    /// A cached step's self-attention per row and head over the row's visible cache columns
    /// and its new one: `softmax((q k_j [+ q a_j]) * scale + bias_j)` weighs `v_j [+ b_j]`,
    /// `a_j`/`b_j` the relative tables' rows of column `j` where there are tables.
    fn cached_attention_step(x: &CachedInputs<'_>, out: &mut [f32]) => cached_attention_step_lanes
}

#[inline(always)]
fn cached_attention_step_lanes(x: &CachedInputs<'_>, out: &mut [f32]) {
    let CachedShape {
        batch,
        heads,
        past,
        head_dim: dh,
    } = x.shape;
    let width = past + 1;
    let mut visible = Vec::with_capacity(width);
    let mut weights = Vec::with_capacity(width);
    // The relative tables' share of each visible column's score.
    let mut relative = Vec::with_capacity(width);
    for row in 0..batch {
        let bias = &x.bias[row * width..(row + 1) * width];
        visible_columns(bias, &mut visible);
        for head in 0..heads {
            let at = row * heads + head;
            let q = &x.q[at * dh..(at + 1) * dh];
            let key = |j: usize| match j < past {
                true => &x.past_keys[(at * past + j) * dh..(at * past + j + 1) * dh],
                false => &x.new_key[at * dh..(at + 1) * dh],
            };
            let value = |j: usize| match j < past {
                true => &x.past_values[(at * past + j) * dh..(at * past + j + 1) * dh],
                false => &x.new_value[at * dh..(at + 1) * dh],
            };
            let context = &mut out[at * dh..(at + 1) * dh];
            weights.clear();
            match &x.relative {
                Some(tables) => {
                    let rows = &tables.rows[at * width..(at + 1) * width];
                    let table_row = |j: usize| rows[j] as usize * dh..(rows[j] as usize + 1) * dh;
                    dots_into(q, visible.iter().map(|&j| key(j)), &mut weights);
                    relative.clear();
                    let table_key = |j: usize| &tables.keys[table_row(j)];
                    dots_into(q, visible.iter().map(|&j| table_key(j)), &mut relative);
                    for ((w, r), &j) in weights.iter_mut().zip(&relative).zip(&visible) {
                        *w = (*w + r) * x.scale + bias[j];
                    }
                    let vectors = visible
                        .iter()
                        .map(|&j| [value(j), &tables.values[table_row(j)]]);
                    softmax_weigh(&mut weights, context, vectors);
                }
                None => {
                    dots_into(q, visible.iter().map(|&j| key(j)), &mut weights);
                    for (w, &j) in weights.iter_mut().zip(&visible) {
                        *w = *w * x.scale + bias[j];
                    }
                    softmax_weigh(&mut weights, context, visible.iter().map(|&j| [value(j)]));
                }
            }
        }
    }
}

/// Into `visible`, the columns of a row whose bias is above [`names::SKIPPED_BIAS`]; all of
/// them where none is (the body's softmax is then uniform over them all).
fn visible_columns(bias: &[f32], visible: &mut Vec<usize>) {
    visible.clear();
    visible.extend((0..bias.len()).filter(|&j| bias[j] > names::SKIPPED_BIAS));
    if visible.is_empty() {
        visible.extend(0..bias.len());
    }
}

#[cfg(test)]
// The references index as the formulas do.
#[allow(clippy::needless_range_loop)]
mod tests {
    use super::*;

    /// The body of the ONNX function, computed plainly: every column, masked ones included.
    fn reference(x: &StepInputs<'_>) -> Vec<f32> {
        let StepShape {
            batch,
            heads,
            len,
            head_dim,
        } = x.shape;
        let mut out = vec![0.0; batch * heads * head_dim];
        for row in 0..batch {
            for head in 0..heads {
                let at = row * heads + head;
                let scores: Vec<f64> = (0..len)
                    .map(|j| {
                        let k = &x.keys[(at * len + j) * head_dim..][..head_dim];
                        let q = &x.q[at * head_dim..][..head_dim];
                        let s: f64 = q.iter().zip(k).map(|(a, b)| (a * b) as f64).sum();
                        // Added in float32, as the graph adds: -1e9 swallows the score.
                        ((s as f32) * x.scale + x.bias[row * len + j]) as f64
                    })
                    .collect();
                let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let sum: f64 = e.iter().sum();
                for (j, w) in e.iter().enumerate() {
                    for d in 0..head_dim {
                        out[at * head_dim + d] +=
                            (w / sum * x.values[(at * len + j) * head_dim + d] as f64) as f32;
                    }
                }
            }
        }
        out
    }

    fn numbers(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| {
                (((i as u32).wrapping_mul(2654435761).wrapping_add(seed) >> 8) % 2000) as f32
                    / 1000.0
                    - 1.0
            })
            .collect()
    }

    #[test]
    fn skipping_masked_columns_gives_the_bodys_result() {
        // A head of 20 scores one key at a time; one of 64 with 23 columns, in blocks of
        // sixteen keys and the rest one at a time.
        for (head_dim, len) in [(20, 7), (64, 23)] {
            let shape = StepShape {
                batch: 3,
                heads: 2,
                len,
                head_dim,
            };
            let size = shape.batch * shape.heads * shape.len * shape.head_dim;
            let (q, keys, values) = (
                numbers(shape.batch * shape.heads * shape.head_dim, 1),
                numbers(size, 2),
                numbers(size, 3),
            );
            // Row 0 sees 3 columns, row 1 all, row 2 none (uniform over all, as the body).
            let mut bias = vec![0.0; shape.batch * len];
            for j in 3..len {
                bias[j] = -1e9;
            }
            for j in 0..len {
                bias[2 * len + j] = -1e9;
            }
            bias[len + 1] = -0.5; // an ordinary additive bias stays
            let inputs = StepInputs {
                shape,
                q: &q,
                keys: &keys,
                values: &values,
                bias: &bias,
                scale: 0.125,
            };
            let mut out = vec![f32::NAN; q.len()];
            attention_step(&inputs, &mut out);
            for (got, want) in out.iter().zip(reference(&inputs)) {
                assert!((got - want).abs() < 1e-5, "{got} against {want}");
            }
            // The copy this CPU picked gives the baseline copy's bits.
            let mut baseline = vec![f32::NAN; q.len()];
            attention_step_lanes(&inputs, &mut baseline);
            assert_eq!(bits(&out), bits(&baseline));
        }
    }

    fn bits(values: &[f32]) -> Vec<u32> {
        values.iter().map(|v| v.to_bits()).collect()
    }

    /// A cached step's function body computed plainly: every column; with tables, the
    /// relative terms gathered for the scores and scattered into per-row masses for the
    /// values.
    fn cached_reference(x: &CachedInputs<'_>, table: usize) -> Vec<f32> {
        let CachedShape {
            batch,
            heads,
            past,
            head_dim: dh,
        } = x.shape;
        let width = past + 1;
        let dot64 = |a: &[f32], b: &[f32]| -> f32 {
            a.iter().zip(b).map(|(x, y)| (x * y) as f64).sum::<f64>() as f32
        };
        let mut out = vec![0.0; batch * heads * dh];
        for row in 0..batch {
            for head in 0..heads {
                let at = row * heads + head;
                let q = &x.q[at * dh..][..dh];
                let key = |j: usize| match j < past {
                    true => &x.past_keys[(at * past + j) * dh..][..dh],
                    false => &x.new_key[at * dh..][..dh],
                };
                let value = |j: usize| match j < past {
                    true => &x.past_values[(at * past + j) * dh..][..dh],
                    false => &x.new_value[at * dh..][..dh],
                };
                let relative_score = |j: usize| match &x.relative {
                    Some(t) => dot64(q, &t.keys[t.rows[at * width + j] as usize * dh..][..dh]),
                    None => 0.0,
                };
                let scores: Vec<f64> = (0..width)
                    .map(|j| {
                        let s = dot64(q, key(j)) + relative_score(j);
                        (s * x.scale + x.bias[row * width + j]) as f64
                    })
                    .collect();
                let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let sum: f64 = e.iter().sum();
                let mut mass = vec![0.0f64; table];
                let mut context = vec![0.0f64; dh];
                for j in 0..width {
                    let p = e[j] / sum;
                    if let Some(t) = &x.relative {
                        mass[t.rows[at * width + j] as usize] += p;
                    }
                    for d in 0..dh {
                        context[d] += p * value(j)[d] as f64;
                    }
                }
                if let Some(t) = &x.relative {
                    for (r, m) in mass.iter().enumerate() {
                        for d in 0..dh {
                            context[d] += m * t.values[r * dh + d] as f64;
                        }
                    }
                }
                for d in 0..dh {
                    out[at * dh + d] = context[d] as f32;
                }
            }
        }
        out
    }

    #[test]
    fn the_cached_step_reads_each_rows_own_cache_and_gives_the_bodys_result() {
        let shape = CachedShape {
            batch: 3,
            heads: 2,
            past: 6,
            head_dim: 16,
        };
        let (b, h, p, dh, table) = (shape.batch, shape.heads, shape.past, shape.head_dim, 5);
        let cache = b * h * p * dh;
        let (q, past_keys, past_values) =
            (numbers(b * h * dh, 4), numbers(cache, 5), numbers(cache, 6));
        let (new_key, new_value) = (numbers(b * h * dh, 7), numbers(b * h * dh, 8));
        let (relative_keys, relative_values) = (numbers(table * dh, 9), numbers(table * dh, 10));
        // Rows at positions 2, 6 and 0: each owns a prefix of the cache and its new column;
        // a column's table row is its distance to the row's position, clipped to +-2.
        let positions = [2usize, 6, 0];
        let mut bias = vec![0.0; b * (p + 1)];
        let mut rows = vec![0i64; b * h * (p + 1)];
        for (row, &at) in positions.iter().enumerate() {
            for j in 0..=p {
                let owned = j == p || j < at;
                bias[row * (p + 1) + j] = if owned { 0.0 } else { -1e9 };
                let distance = if j == p { 0 } else { j as i64 - at as i64 };
                for head in 0..h {
                    rows[(row * h + head) * (p + 1) + j] = distance.clamp(-2, 2) + 2;
                }
            }
        }
        let key_shape = [table as i64, dh as i64];
        let tables =
            RelativeTables::new(&key_shape, &relative_keys, &relative_values, &rows, shape)
                .unwrap();
        for relative in [Some(tables), None] {
            let x = CachedInputs {
                shape,
                q: &q,
                past_keys: &past_keys,
                past_values: &past_values,
                new_key: &new_key,
                new_value: &new_value,
                bias: &bias,
                relative,
                scale: 0.25,
            };
            x.check().unwrap();
            let mut out = vec![f32::NAN; q.len()];
            cached_attention_step(&x, &mut out);
            for (got, want) in out.iter().zip(cached_reference(&x, table)) {
                assert!((got - want).abs() < 1e-5, "{got} against {want}");
            }
            let mut baseline = vec![f32::NAN; q.len()];
            cached_attention_step_lanes(&x, &mut baseline);
            assert_eq!(bits(&out), bits(&baseline));
        }
        // A table row out of range, or tables of another width, is an error, not a panic.
        let mut bad = rows.clone();
        bad[3] = 5;
        assert!(
            RelativeTables::new(&key_shape, &relative_keys, &relative_values, &bad, shape).is_err()
        );
        let narrow = [table as i64, 8];
        assert!(
            RelativeTables::new(&narrow, &relative_keys, &relative_values, &rows, shape).is_err()
        );
    }

    #[test]
    fn shapes_that_do_not_fit_are_refused() {
        assert!(StepShape::new(&[2, 4, 1, 8], &[2, 4, 5, 8], [320, 320, 10]).is_ok());
        assert!(StepShape::new(&[2, 4, 1, 8], &[2, 4, 5, 8], [320, 320, 12]).is_err());
        assert!(StepShape::new(&[2, 4, 1, 8], &[2, 4, 5, 8], [320, 300, 10]).is_err());
        assert!(StepShape::new(&[2, 4, 2, 8], &[2, 4, 5, 8], [320, 320, 10]).is_err());
        assert!(StepShape::new(&[2, 4, 1, 8], &[2, 4, 5], [40, 40, 10]).is_err());
        assert!(CachedShape::new(&[2, 4, 1, 8], &[2, 4, 5, 8]).is_ok());
        assert!(CachedShape::new(&[2, 3, 1, 8], &[2, 4, 5, 8]).is_err());
        assert!(CachedShape::new(&[2, 4, 1, 8], &[2, 4, 5]).is_err());
    }

    #[test]
    fn sessions_are_created_one_at_a_time_until_one_has_succeeded() {
        use std::sync::Barrier;
        use std::time::Duration;
        let guard = UntilFirstSuccess::new();
        let inside = AtomicUsize::new(0);
        let most = AtomicUsize::new(0);
        let start = Barrier::new(4);
        // Four calls at once, every one failing: none succeeds, so none overlaps another.
        std::thread::scope(|scope| {
            for _ in 0..4 {
                scope.spawn(|| {
                    start.wait();
                    let _ = guard.run(|| {
                        let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(now, Ordering::SeqCst);
                        std::thread::sleep(Duration::from_millis(20));
                        inside.fetch_sub(1, Ordering::SeqCst);
                        Err::<(), ()>(())
                    });
                });
            }
        });
        assert_eq!(most.load(Ordering::SeqCst), 1);
        // Once one has succeeded, calls overlap.
        guard.run(|| Ok::<(), ()>(())).unwrap();
        inside.store(0, Ordering::SeqCst);
        most.store(0, Ordering::SeqCst);
        let start = Barrier::new(2);
        std::thread::scope(|scope| {
            for _ in 0..2 {
                scope.spawn(|| {
                    start.wait();
                    guard.run(|| {
                        let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(now, Ordering::SeqCst);
                        // Waits (a while, not for ever) for the other to come in too.
                        for _ in 0..200 {
                            if most.load(Ordering::SeqCst) == 2 {
                                break;
                            }
                            std::thread::sleep(Duration::from_millis(10));
                        }
                        inside.fetch_sub(1, Ordering::SeqCst);
                        Ok::<(), ()>(())
                    })
                });
            }
        });
        assert_eq!(most.load(Ordering::SeqCst), 2);
    }

    /// A cross-attention step's time as a decoder of the shipped shape spends it: 8 rows, 4
    /// heads of 64, 45 source subwords, 3 layers. Not a check (timings belong in benchmarks):
    /// `cargo test --release -p nmt-engine --lib cross_attention_step_time -- --ignored
    /// --nocapture`.
    #[test]
    #[ignore]
    fn cross_attention_step_time() {
        let shape = StepShape {
            batch: 8,
            heads: 4,
            len: 45,
            head_dim: 64,
        };
        let size = shape.batch * shape.heads * shape.len * shape.head_dim;
        let layers: Vec<(Vec<f32>, Vec<f32>)> = (0..3)
            .map(|layer| (numbers(size, 2 * layer), numbers(size, 2 * layer + 1)))
            .collect();
        let q = numbers(shape.batch * shape.heads * shape.head_dim, 7);
        let bias = vec![0.0; shape.batch * shape.len];
        let mut out = vec![0.0; q.len()];
        let steps = 20_000;
        let start = std::time::Instant::now();
        for _ in 0..steps {
            for (keys, values) in &layers {
                let inputs = StepInputs {
                    shape,
                    q: &q,
                    keys,
                    values,
                    bias: &bias,
                    scale: 0.125,
                };
                attention_step(&inputs, &mut out);
            }
        }
        let step = start.elapsed().as_secs_f64() / steps as f64;
        println!(
            "cross attention, 3 layers of 8 rows: {:.1} µs a step",
            step * 1e6
        );
    }
}
