//! Kernel of [`names::ROW_QUANTIZED_MATMUL`]: an int8 matrix product whose rows are quantized
//! one at a time, with the integer sums done by AVX-512 VNNI (`vpdpbusd`, uint8 x int8 into
//! int32).
//!
//! The operator's body (six small nodes that quantize each row, ONNX Runtime's
//! `MatMulIntegerToFloat` and the bias `Add`) is what a runtime without this kernel runs; the
//! kernel gives the same bits. What it adds: one node instead of eight, weights packed once
//! (and shared by the sessions of a model's workers) in the order the instruction reads them,
//! a matrix-vector loop that streams them where ONNX Runtime's u8s8 GEMM packs its one row
//! first, and columns split over the session's intra-op threads when the product is large
//! (the output projection). Registered only where the CPU has AVX-512 with VNNI
//! ([`available`]); elsewhere the body runs.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, LazyLock, Mutex, PoisonError, Weak};

use model_package::names;
use ort::operator::{ComputeContext, Kernel, KernelContext, Operator};
use ort::operator::{OperatorInput, OperatorOutput};
use ort::value::{DynTensorValueType, TensorElementType};

use crate::fused::KernelsTaken;

/// Columns a `vpdpbusd` fills (one 512-bit register of int32 sums).
const LANES: usize = 16;
/// Columns of a panel: four registers of sums per row, each weight load reused by every row
/// of a tile.
const PANEL: usize = 4 * LANES;
/// Inputs summed per int32 lane by one `vpdpbusd`.
const GROUP: usize = 4;
/// Rows of a tile: 4 rows x 4 registers = 16 sums held in registers.
const TILE_ROWS: usize = 4;
/// The activations' zero point: a row quantizes to `round(x / scale) + 128` as uint8.
const ZERO_POINT: i32 = 128;
/// `1/127` as the body's float constant: a row's scale is its absolute maximum times this.
const INVERSE_QMAX: f32 = 1.0 / 127.0;
/// The absolute maximum a row of zeros gets, so that its scale is not 0.
const TINY: f32 = 1e-30;
/// Products of at least this many multiply-adds are split over the intra-op threads (about
/// 10 µs of one core: below it, waking a thread costs more than it saves).
const PARALLEL_WORK: usize = 1 << 20;
/// Largest inner dimension whose int32 sums cannot overflow (255 x 127 x K < 2^31).
const MAX_INNER: usize = 65_536;

/// Whether this CPU runs the kernel (AVX-512 F, BW and VL for the loads and stores, VNNI for
/// the products).
pub fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        crate::by_cpu::has_avx512() && std::arch::is_x86_feature_detected!("avx512vnni")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Int8 weights `[K, N]` in the order the kernel reads them, with what the output needs per
/// column.
#[derive(Debug)]
pub struct PackedWeights {
    inner: usize,
    columns: usize,
    /// `ceil(K / 4)`: the inner dimension in groups of four (the last padded with zeros).
    groups: usize,
    /// Panel-major: panel `p`, group `g`, column `c` of the panel, input `j` of the group at
    /// `((p * groups + g) * 64 + c) * 4 + j`, i.e. one 256-byte run of four registers per
    /// group; columns past N are zeros.
    values: Vec<i8>,
    /// `-128 * sum_k W[k, n]`: what the zero point adds to each column's sum, taken back.
    zero_point_sums: Vec<i32>,
    /// One scale per column, zeros past N.
    scales: Vec<f32>,
    /// One bias per column, zeros past N.
    bias: Vec<f32>,
}

impl PackedWeights {
    /// Packs `weights` (row-major `[inner, columns]`), their column `scales` and `bias`.
    /// Refused on a CPU without the kernel's instructions, so that a packing in hand can
    /// always be multiplied with.
    pub fn new(
        weights: &[i8],
        scales: &[f32],
        bias: &[f32],
        inner: usize,
        columns: usize,
    ) -> Result<Self, String> {
        if weights.len() != inner * columns || scales.len() != columns || bias.len() != columns {
            return Err(format!(
                "weights of {} values, {} scales and {} biases for [{inner}, {columns}]",
                weights.len(),
                scales.len(),
                bias.len()
            ));
        }
        if inner == 0 || inner > MAX_INNER {
            return Err(format!("inner dimension {inner} outside 1..={MAX_INNER}"));
        }
        if !available() {
            return Err("this CPU has no AVX-512 VNNI".into());
        }
        let groups = inner.div_ceil(GROUP);
        let panels = columns.div_ceil(PANEL);
        let mut values = vec![0i8; panels * groups * PANEL * GROUP];
        let mut zero_point_sums = vec![0i32; panels * PANEL];
        for k in 0..inner {
            let (g, j) = (k / GROUP, k % GROUP);
            for (n, &w) in weights[k * columns..(k + 1) * columns].iter().enumerate() {
                let (p, c) = (n / PANEL, n % PANEL);
                values[((p * groups + g) * PANEL + c) * GROUP + j] = w;
                zero_point_sums[n] -= ZERO_POINT * i32::from(w);
            }
        }
        let padded = |v: &[f32]| {
            let mut v = v.to_vec();
            v.resize(panels * PANEL, 0.0);
            v
        };
        Ok(PackedWeights {
            inner,
            columns,
            groups,
            values,
            zero_point_sums,
            scales: padded(scales),
            bias: padded(bias),
        })
    }

    fn panels(&self) -> usize {
        self.zero_point_sums.len() / PANEL
    }

    /// `x W` for `x` of `rows` rows of K values, into `out` (`rows` rows of N); `scratch`
    /// holds the quantized rows between calls. `split` runs `chunks` calls of a closure on
    /// the caller's threads (ONNX Runtime's intra-op pool); products too small to be worth it
    /// run on this thread.
    pub fn multiply(
        &self,
        x: &[f32],
        out: &mut [f32],
        scratch: &mut Quantized,
        split: impl FnOnce(usize, &(dyn Fn(usize) + Sync)),
    ) {
        let rows = x.len() / self.inner;
        debug_assert_eq!(x.len(), rows * self.inner);
        debug_assert_eq!(out.len(), rows * self.columns);
        scratch.quantize(x, self.inner, self.groups);
        let scratch: &Quantized = scratch;
        let panels = self.panels();
        let out_at = OutPointer(out.as_mut_ptr());
        let chunks = match rows * self.inner * self.columns >= PARALLEL_WORK {
            true => panels.min(8),
            false => 1,
        };
        let run = |chunk: usize| {
            let first = panels * chunk / chunks;
            let last = panels * (chunk + 1) / chunks;
            // Safety: the chunks write disjoint panels (column ranges) of `out`, which
            // outlives the calls; a packing exists only where `available()` (`new`).
            unsafe { self.panels_into(first..last, scratch, rows, out_at) };
        };
        match chunks {
            1 => run(0),
            _ => split(chunks, &run),
        }
    }

    /// Panels `panels` of every row.
    ///
    /// # Safety
    /// `out` points at `rows * N` floats that no one else writes in these panels' columns,
    /// and the CPU has AVX-512 F, BW, VL and VNNI.
    unsafe fn panels_into(
        &self,
        panels: std::ops::Range<usize>,
        rows_q: &Quantized,
        rows: usize,
        out: OutPointer,
    ) {
        #[cfg(target_arch = "x86_64")]
        for panel in panels {
            let mut row = 0;
            while row < rows {
                let tile = (rows - row).min(TILE_ROWS);
                let at = Tile {
                    weights: self,
                    panel,
                    rows: rows_q,
                    first_row: row,
                    out,
                };
                match tile {
                    4 => vnni::tile::<4>(&at),
                    3 => vnni::tile::<3>(&at),
                    2 => vnni::tile::<2>(&at),
                    _ => vnni::tile::<1>(&at),
                }
                row += tile;
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (panels, rows_q, rows, out);
    }
}

/// Rows quantized to uint8 around 128, each on its own scale, padded to whole groups.
#[derive(Debug, Default)]
pub struct Quantized {
    values: Vec<u8>,
    scales: Vec<f32>,
    /// Bytes per row (`groups * 4`).
    stride: usize,
}

impl Quantized {
    fn quantize(&mut self, x: &[f32], inner: usize, groups: usize) {
        let rows = x.len() / inner;
        self.stride = groups * GROUP;
        self.values.clear();
        self.values.resize(rows * self.stride, ZERO_POINT as u8);
        self.scales.clear();
        for (row, q) in x
            .chunks_exact(inner)
            .zip(self.values.chunks_exact_mut(self.stride))
        {
            #[cfg(target_arch = "x86_64")]
            // Safety: called by `multiply`, whose packing exists only where `available()`.
            let scale = unsafe { vnni::quantize_row(row, &mut q[..inner]) };
            #[cfg(not(target_arch = "x86_64"))]
            let scale = quantize_row(row, &mut q[..inner]);
            self.scales.push(scale);
        }
    }
}

/// Quantizes one row as the operator's body does (`Abs`, `ReduceMax`, `Max` with 1e-30, `Mul`
/// by 1/127, `Div`, `QuantizeLinear` with scale 1 and zero point 128) and returns its scale.
pub fn quantize_row(x: &[f32], q: &mut [u8]) -> f32 {
    let peak = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let scale = peak.max(TINY) * INVERSE_QMAX;
    for (q, v) in q.iter_mut().zip(x) {
        *q = ((v / scale).round_ties_even() + ZERO_POINT as f32).clamp(0.0, 255.0) as u8;
    }
    scale
}

/// The operator's arithmetic on unpacked weights, one multiply-add at a time: what the kernel
/// is checked against.
pub fn reference(
    x: &[f32],
    weights: &[i8],
    scales: &[f32],
    bias: &[f32],
    inner: usize,
) -> Vec<f32> {
    let columns = scales.len();
    let mut q = vec![0u8; inner];
    let mut out = Vec::with_capacity(x.len() / inner * columns);
    for row in x.chunks_exact(inner) {
        let scale = quantize_row(row, &mut q);
        for n in 0..columns {
            let sum: i32 = (0..inner)
                .map(|k| (i32::from(q[k]) - ZERO_POINT) * i32::from(weights[k * columns + n]))
                .sum();
            // In the body's order: ONNX Runtime scales by the column, then by the row; the
            // bias is the Add after it.
            out.push(sum as f32 * scales[n] * scale + bias[n]);
        }
    }
    out
}

/// The output's base pointer, shared by the chunks that write its disjoint columns.
#[derive(Clone, Copy)]
struct OutPointer(*mut f32);
// Safety: each chunk writes only its own panels' columns (see `PackedWeights::multiply`).
unsafe impl Send for OutPointer {}
unsafe impl Sync for OutPointer {}

/// Up to four rows of one panel.
struct Tile<'a> {
    weights: &'a PackedWeights,
    panel: usize,
    rows: &'a Quantized,
    first_row: usize,
    out: OutPointer,
}

#[cfg(target_arch = "x86_64")]
mod vnni {
    use std::arch::x86_64::*;

    use super::{Tile, GROUP, INVERSE_QMAX, LANES, PANEL, TINY, ZERO_POINT};

    /// [`super::quantize_row`] sixteen values at a time, to the same bytes: the maximum is
    /// exact in any order, the division is the same, and the conversion rounds half to even
    /// (the default rounding mode).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    pub(super) unsafe fn quantize_row(x: &[f32], q: &mut [u8]) -> f32 {
        let n = x.len().min(q.len());
        let mask = |at: usize| -> __mmask16 {
            let left = (n - at).min(LANES);
            if left == LANES {
                !0
            } else {
                (1u16 << left) - 1
            }
        };
        let mut peak = _mm512_setzero_ps();
        for at in (0..n).step_by(LANES) {
            let v = _mm512_maskz_loadu_ps(mask(at), x.as_ptr().add(at));
            peak = _mm512_max_ps(peak, _mm512_abs_ps(v));
        }
        let scale = _mm512_reduce_max_ps(peak).max(TINY) * INVERSE_QMAX;
        let scales = _mm512_set1_ps(scale);
        let (zero_point, zero, top) = (
            _mm512_set1_epi32(ZERO_POINT),
            _mm512_setzero_si512(),
            _mm512_set1_epi32(255),
        );
        for at in (0..n).step_by(LANES) {
            let m = mask(at);
            let steps = _mm512_div_ps(_mm512_maskz_loadu_ps(m, x.as_ptr().add(at)), scales);
            let values = _mm512_add_epi32(_mm512_cvtps_epi32(steps), zero_point);
            let values = _mm512_min_epi32(_mm512_max_epi32(values, zero), top);
            _mm_mask_storeu_epi8(
                q.as_mut_ptr().add(at).cast(),
                m,
                _mm512_cvtepi32_epi8(values),
            );
        }
        scale
    }

    /// `R` rows of one panel: 4R sums of 16 columns in registers over the inner dimension,
    /// each 256-byte group of weights loaded once for all rows.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    pub(super) unsafe fn tile<const R: usize>(t: &Tile<'_>) {
        let w = t.weights;
        let q = &t.rows.values[t.first_row * t.rows.stride..];
        let panel = w.values.as_ptr().add(t.panel * w.groups * PANEL * GROUP);
        let mut sums = [[_mm512_setzero_si512(); 4]; R];
        for g in 0..w.groups {
            let at = panel.add(g * PANEL * GROUP);
            let w0 = _mm512_loadu_si512(at.cast());
            let w1 = _mm512_loadu_si512(at.add(64).cast());
            let w2 = _mm512_loadu_si512(at.add(128).cast());
            let w3 = _mm512_loadu_si512(at.add(192).cast());
            for (r, sums) in sums.iter_mut().enumerate() {
                let four = q.as_ptr().add(r * t.rows.stride + g * GROUP);
                let a = _mm512_set1_epi32(four.cast::<i32>().read_unaligned());
                sums[0] = _mm512_dpbusd_epi32(sums[0], a, w0);
                sums[1] = _mm512_dpbusd_epi32(sums[1], a, w1);
                sums[2] = _mm512_dpbusd_epi32(sums[2], a, w2);
                sums[3] = _mm512_dpbusd_epi32(sums[3], a, w3);
            }
        }
        let first_column = t.panel * PANEL;
        for (r, sums) in sums.iter().enumerate() {
            let row = t.first_row + r;
            let row_scale = _mm512_set1_ps(t.rows.scales[row]);
            let out = t.out.0.add(row * w.columns);
            for (i, &sum) in sums.iter().enumerate() {
                let column = first_column + i * LANES;
                if column >= w.columns {
                    break;
                }
                let zero_point = _mm512_loadu_si512(w.zero_point_sums.as_ptr().add(column).cast());
                let sum = _mm512_cvtepi32_ps(_mm512_add_epi32(sum, zero_point));
                let by_column = _mm512_mul_ps(sum, _mm512_loadu_ps(w.scales.as_ptr().add(column)));
                let value = _mm512_add_ps(
                    _mm512_mul_ps(by_column, row_scale),
                    _mm512_loadu_ps(w.bias.as_ptr().add(column)),
                );
                let left = (w.columns - column).min(LANES);
                let mask: __mmask16 = if left == LANES {
                    !0
                } else {
                    (1u16 << left) - 1
                };
                _mm512_mask_storeu_ps(out.add(column), mask, value);
            }
        }
    }
}

/// Operator of [`names::ROW_QUANTIZED_MATMUL`], counted in `taken` as it creates kernels.
pub struct RowQuantizedMatMulOp {
    pub taken: Arc<KernelsTaken>,
}

/// A node's packed weights.
pub struct RowQuantizedMatMul {
    weights: Arc<PackedWeights>,
}

/// The packing of `weights`, `scales` and `bias`, shared with every session that packed the
/// same ones: each model worker has a decoder session of its own, with its own copy of the
/// graph's weights, and one packing serves them all.
fn shared_packing(
    weights: &[i8],
    scales: &[f32],
    bias: &[f32],
    inner: usize,
    columns: usize,
) -> Result<Arc<PackedWeights>, String> {
    use sha2::{Digest, Sha256};
    static PACKINGS: LazyLock<Mutex<HashMap<[u8; 32], Weak<PackedWeights>>>> =
        LazyLock::new(Mutex::default);
    let mut key = Sha256::new();
    key.update((inner as u64).to_le_bytes());
    key.update((columns as u64).to_le_bytes());
    // Safety: an i8 and a u8 have the same size and every bit pattern is valid for both.
    key.update(unsafe { std::slice::from_raw_parts(weights.as_ptr().cast::<u8>(), weights.len()) });
    for value in scales.iter().chain(bias) {
        key.update(value.to_le_bytes());
    }
    let key: [u8; 32] = key.finalize().into();
    let mut packings = PACKINGS.lock().unwrap_or_else(PoisonError::into_inner);
    packings.retain(|_, packed| packed.strong_count() > 0);
    if let Some(packed) = packings.get(&key).and_then(Weak::upgrade) {
        return Ok(packed);
    }
    let packed = Arc::new(PackedWeights::new(weights, scales, bias, inner, columns)?);
    packings.insert(key, Arc::downgrade(&packed));
    Ok(packed)
}

/// A buffer of quantized rows larger than this (a long input's encoder rows) is freed after
/// its call rather than kept for the next.
const KEPT_SCRATCH: usize = 256 * 1024;

thread_local! {
    /// The quantized rows of the products run on this thread, one buffer for all nodes (a
    /// buffer per node kept the largest input each node had seen: 50 MB more at the peak of
    /// 64 clients on two workers).
    static SCRATCH: RefCell<Quantized> = RefCell::default();
}

impl Operator for RowQuantizedMatMulOp {
    type Kernel<'attr> = RowQuantizedMatMul;

    fn name(&self) -> &str {
        names::ROW_QUANTIZED_MATMUL
    }

    fn inputs(&self) -> impl IntoIterator<Item = OperatorInput> {
        use TensorElementType::{Float32, Int8};
        [Float32, Int8, Float32, Float32].map(OperatorInput::required)
    }

    fn outputs(&self) -> impl IntoIterator<Item = OperatorOutput> {
        [OperatorOutput::required(TensorElementType::Float32)]
    }

    fn create_kernel<'attr>(&self, ctx: &KernelContext<'attr>) -> ort::Result<Self::Kernel<'attr>> {
        let op = names::ROW_QUANTIZED_MATMUL;
        let fail = |e: String| ort::Error::new(format!("{op}: {e}"));
        let weights = ctx
            .constant_input::<DynTensorValueType>(1)
            .map_err(|e| fail(format!("the weights must be stored in the graph ({e})")))?;
        let scales = ctx
            .constant_input::<DynTensorValueType>(2)
            .map_err(|e| fail(format!("the scales must be stored in the graph ({e})")))?;
        let bias = ctx
            .constant_input::<DynTensorValueType>(3)
            .map_err(|e| fail(format!("the bias must be stored in the graph ({e})")))?;
        let (shape, weights) = weights.try_extract_tensor::<i8>()?;
        let (_, scales) = scales.try_extract_tensor::<f32>()?;
        let (_, bias) = bias.try_extract_tensor::<f32>()?;
        let [inner, columns] = shape[..] else {
            return Err(fail(format!("weights of shape {shape:?}, not [K, N]")));
        };
        let packed = shared_packing(weights, scales, bias, inner as usize, columns as usize)
            .map_err(fail)?;
        self.taken.int8.fetch_add(1, Ordering::Relaxed);
        Ok(RowQuantizedMatMul { weights: packed })
    }
}

impl Kernel for RowQuantizedMatMul {
    fn compute(&mut self, ctx: &ComputeContext) -> ort::Result<()> {
        let op = names::ROW_QUANTIZED_MATMUL;
        let fail = |e: String| ort::Error::new(format!("{op}: {e}"));
        let x = ctx
            .input(0)?
            .ok_or_else(|| fail("input 0 missing".into()))?;
        let (shape, x) = x.try_extract_tensor::<f32>()?;
        let inner = self.weights.inner;
        if shape.last().map(|&k| k as usize) != Some(inner) {
            return Err(fail(format!(
                "input of shape {shape:?} against weights of {inner} rows"
            )));
        }
        let mut out_shape = shape.to_vec();
        *out_shape.last_mut().expect("checked above") = self.weights.columns as i64;
        let mut out = ctx
            .output(0, out_shape)?
            .ok_or_else(|| fail("no output".into()))?;
        let (_, out) = out.try_extract_tensor_mut::<f32>()?;
        let mut split_failed = None;
        SCRATCH.with_borrow_mut(|scratch| {
            self.weights.multiply(x, out, scratch, |chunks, run| {
                if let Err(e) = ctx.par_for(chunks, 0, run) {
                    split_failed = Some(e);
                }
            });
            if scratch.values.capacity() > KEPT_SCRATCH {
                *scratch = Quantized::default();
            }
        });
        split_failed.map_or(Ok(()), Err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic values in [-1, 1) without a random-number crate.
    fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut state = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (0..n)
            .map(|_| {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    fn int8_weights(n: usize, seed: u64) -> Vec<i8> {
        values(n, seed)
            .iter()
            .map(|v| (v * 127.0).round() as i8)
            .collect()
    }

    /// Whether this CPU runs the kernel; says so when a test is skipped for it.
    fn kernel_runs_here() -> bool {
        if !available() {
            eprintln!("skipped: this CPU has no AVX-512 VNNI");
        }
        available()
    }

    fn run_sequential(w: &PackedWeights, x: &[f32]) -> Vec<f32> {
        let mut out = vec![f32::NAN; x.len() / w.inner * w.columns];
        let mut scratch = Quantized::default();
        w.multiply(x, &mut out, &mut scratch, |chunks, run| {
            (0..chunks).for_each(run)
        });
        out
    }

    #[test]
    fn quantizes_a_row_as_the_body_does() {
        let x = [0.5f32, -1.0, 0.25, 0.0, 1.0 / 254.0];
        let mut q = [0u8; 5];
        let scale = quantize_row(&x, &mut q);
        assert_eq!(scale, 1.0f32 * INVERSE_QMAX);
        // 0.5 * 127 = 63.5 rounds to even (64); 0.25 * 127 = 31.75 to 32; 0.5 step to 0.
        assert_eq!(q, [192, 1, 160, 128, 128]);
        let mut zeros = [7u8; 3];
        assert!(quantize_row(&[0.0; 3], &mut zeros) > 0.0);
        assert_eq!(zeros, [128; 3]);
    }

    #[test]
    fn the_kernel_gives_the_reference_bit_for_bit() {
        if !kernel_runs_here() {
            return;
        }
        // Inner dimensions off the group of four, columns off the panel and the register,
        // row counts off the tile, and a product large enough to be split in chunks.
        for (rows, inner, columns) in [
            (1, 256, 256),
            (1, 5, 3),
            (3, 7, 70),
            (5, 256, 1_030),
            (9, 33, 17),
            (2, 1_024, 600),
            (1, 256, 12_016),
        ] {
            let x = values(rows * inner, 1 + rows as u64);
            let w = int8_weights(inner * columns, 2 + inner as u64);
            let scales: Vec<f32> = values(columns, 3).iter().map(|v| v.abs() / 100.0).collect();
            let bias = values(columns, 4);
            let packed = PackedWeights::new(&w, &scales, &bias, inner, columns).unwrap();
            let got = run_sequential(&packed, &x);
            let want = reference(&x, &w, &scales, &bias, inner);
            assert_eq!(got, want, "{rows} x ({inner} -> {columns})");
        }
    }

    #[test]
    fn the_vector_quantization_gives_the_scalar_bytes() {
        if !kernel_runs_here() {
            return;
        }
        for (len, seed) in [(1, 1), (15, 2), (16, 3), (17, 4), (256, 5), (1_000, 6)] {
            let mut x = values(len, seed);
            // Exact halves between steps, zeros and a negative peak.
            x[0] = -1.0;
            if len > 3 {
                (x[1], x[2], x[3]) = (0.5 / 127.0 * 3.0, 0.0, -2.5 / 127.0);
            }
            let (mut scalar, mut vector) = (vec![0u8; len], vec![0u8; len]);
            let scale = quantize_row(&x, &mut scalar);
            // Safety: available() said so.
            assert_eq!(unsafe { vnni::quantize_row(&x, &mut vector) }, scale);
            assert_eq!(scalar, vector, "{len} values");
        }
    }

    #[test]
    fn a_row_gives_the_same_result_alone_and_among_others() {
        if !kernel_runs_here() {
            return;
        }
        let (inner, columns) = (64, 80);
        let w = int8_weights(inner * columns, 9);
        let packed = PackedWeights::new(
            &w,
            &vec![0.01; columns],
            &vec![0.5; columns],
            inner,
            columns,
        )
        .unwrap();
        let mut batch = values(6 * inner, 4);
        // A batch-mate of much larger values would change a per-batch scale.
        batch[..inner].iter_mut().for_each(|v| *v *= 1_000.0);
        let together = run_sequential(&packed, &batch);
        let alone = run_sequential(&packed, &batch[5 * inner..]);
        assert_eq!(&together[5 * columns..], &alone[..]);
    }

    #[test]
    fn sessions_share_a_packing_of_the_same_weights_while_one_holds_it() {
        if !kernel_runs_here() {
            return;
        }
        let w = int8_weights(8 * 20, 11);
        let (scales, bias) = (vec![0.5; 20], vec![0.0; 20]);
        let first = shared_packing(&w, &scales, &bias, 8, 20).unwrap();
        let second = shared_packing(&w, &scales, &bias, 8, 20).unwrap();
        assert!(Arc::ptr_eq(&first, &second));
        let other_bias = shared_packing(&w, &scales, &[1.0; 20], 8, 20).unwrap();
        assert!(!Arc::ptr_eq(&first, &other_bias));
        let other_shape = shared_packing(&w, &scales[..16], &bias[..16], 10, 16).unwrap();
        assert!(!Arc::ptr_eq(&first, &other_shape));
        let weak = Arc::downgrade(&first);
        drop((first, second));
        assert!(weak.upgrade().is_none(), "a packing outlived its sessions");
    }

    #[test]
    fn rejects_weights_that_do_not_match_their_shape() {
        let ones = [1.0; 3];
        assert_eq!(
            PackedWeights::new(&[0; 6], &ones, &ones, 2, 3).is_ok(),
            available()
        );
        assert!(PackedWeights::new(&[0; 5], &ones, &ones, 2, 3).is_err());
        assert!(PackedWeights::new(&[0; 6], &ones[..2], &ones, 2, 3).is_err());
        assert!(PackedWeights::new(&[0; 6], &ones, &ones[..2], 2, 3).is_err());
        assert!(PackedWeights::new(&[], &[], &[], 0, 0).is_err());
    }
}
