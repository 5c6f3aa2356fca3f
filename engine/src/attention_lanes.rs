//! The attention kernels' arithmetic ([`crate::fused`]): a query's dot products with keys, the
//! softmax of the scores, and the weighted sum of value vectors, each in one fixed order of
//! operations.
//!
//! That order is the contract: every copy of a kernel ([`crate::by_cpu`]) gives the same bits,
//! so a CPU's choice or a batch's shape changes speed, never a translation. A dot product is
//! sixteen lanes of partial sums over the head dimension (one multiply, then one add, per
//! element), the lanes then added in order, lane 0 first; [`dots_into`] computes sixteen
//! keys' at once on AVX-512, their partial sums transposed so that each lane of one register
//! adds up one key's lanes in that same order. The softmax's `e^x` is this module's own
//! ([`exp`], plain float operations, sixteen at a time) rather than the C library's, a call a
//! value whose FMA and SSE2 copies need not agree. One key at a time with the library's
//! `expf`, a cross-attention step of 8 rows (3 layers, 45 source subwords) took 65-67 µs; with
//! both, 43 (`fused::tests::cross_attention_step_time`; `docs/benchmarks/ctranslate2-gap.md`,
//! session 33).

/// Lanes of partial sums of a dot product, and keys scored together by [`dots_into`].
const LANES: usize = 16;

/// Below this many keys left, [`dots_into`] scores them one at a time rather than in a block
/// of sixteen filled up with keys already scored: a block of up to 12 keys took 29-32 ns, one
/// key at a time 5.3 ns a key (head of 64, keys in L1; a timing probe, not kept).
const FEWEST_FOR_A_BLOCK: usize = 6;

/// `a . b` in the module's order: sixteen partial sums, then added in order.
#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut partial = [0.0f32; LANES];
    let (a_blocks, b_blocks) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let tail: f32 = a_blocks
        .remainder()
        .iter()
        .zip(b_blocks.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in a_blocks.zip(b_blocks) {
        for i in 0..LANES {
            partial[i] += x[i] * y[i];
        }
    }
    partial.iter().sum::<f32>() + tail
}

/// `out += w * v`.
#[inline(always)]
fn axpy(w: f32, v: &[f32], out: &mut [f32]) {
    for (o, x) in out.iter_mut().zip(v) {
        *o += w * x;
    }
}

/// Appends `dot(q, key)` of each of `keys` (each as long as `q`) to `out`, bit for bit as
/// [`dot`] gives them.
#[inline(always)]
pub(crate) fn dots_into<'k>(
    q: &[f32],
    keys: impl ExactSizeIterator<Item = &'k [f32]>,
    out: &mut Vec<f32>,
) {
    #[cfg(target_arch = "x86_64")]
    if q.len().is_multiple_of(LANES)
        && keys.len() >= FEWEST_FOR_A_BLOCK
        && crate::by_cpu::has_avx512()
    {
        let mut keys = keys;
        let mut block: [&[f32]; LANES] = [q; LANES];
        while keys.len() >= FEWEST_FOR_A_BLOCK {
            // Taken by count rather than through `zip(keys.by_ref())`, whose `next` is
            // compiled out of line.
            let taken = keys.len().min(LANES);
            for slot in block.iter_mut().take(taken) {
                let key = keys.next().expect("as many keys as their count");
                assert_eq!(key.len(), q.len(), "a key as long as the query");
                *slot = key;
            }
            // Slots past the last key keep the previous block's keys: scored, not kept.
            // Safety: the CPU has AVX-512 F (checked above); every key is as long as `q`, a
            // whole number of lanes.
            let scores = unsafe { avx512::dots16(q, &block) };
            out.extend_from_slice(&scores[..taken]);
        }
        one_at_a_time(q, keys, out);
        return;
    }
    one_at_a_time(q, keys, out);
}

/// [`dot`] of each key. A loop rather than `extend(map(..))`: the iterator's fold would be
/// compiled out of line, for the baseline CPU, whatever copy of a kernel calls it.
#[inline(always)]
fn one_at_a_time<'k>(q: &[f32], keys: impl Iterator<Item = &'k [f32]>, out: &mut Vec<f32>) {
    for key in keys {
        out.push(dot(q, key));
    }
}

/// Normalises `scores` in place (softmax) and writes into `context` the sum of each
/// column's vectors weighted by its probability: `exp(s - max)`, summed in column order, each
/// divided by the sum, then `context += p * v` column by column from zeros.
#[inline(always)]
pub(crate) fn softmax_weigh<'v, const N: usize>(
    scores: &mut [f32],
    context: &mut [f32],
    vectors: impl Iterator<Item = [&'v [f32]; N]>,
) {
    let max = max_of(scores);
    for w in scores.iter_mut() {
        *w = exp(*w - max);
    }
    let mut sum = 0.0;
    for w in scores.iter() {
        sum += w;
    }
    // Divided in a pass of their own (sixteen at a time) rather than as each column is
    // weighed: the same quotients, off the weighing loop's path.
    for w in scores.iter_mut() {
        *w /= sum;
    }
    weigh_into(scores, vectors, context);
}

/// `e^x` in plain float operations (Cephes' `expf`: `2^n e^r` with `|r| <= ln 2 / 2` and a
/// degree-7 polynomial), so that it runs sixteen lanes at a time where the C library's `expf`
/// is a call a value, and gives the same bits on every CPU where the library's copies for FMA
/// and SSE2 need not. Made for a softmax's scores less their maximum: from 0 down to the log
/// of the smallest normal float it is within an ulp of the correctly rounded value (tested),
/// below that 0 (a weight that small adds nothing); above 88 it stays at `e^88`.
#[inline(always)]
fn exp(x: f32) -> f32 {
    const LOWEST: f32 = -87.336_54;
    const HIGHEST: f32 = 88.0;
    const LOG2_E: f32 = std::f32::consts::LOG2_E;
    // ln 2 in two parts, the first exact in few bits, so that n ln 2 is taken off exactly.
    const LN2_HIGH: f32 = 0.693_359_4;
    const LN2_LOW: f32 = -2.121_944_4e-4;
    let clamped = x.clamp(LOWEST, HIGHEST);
    let n = (clamped * LOG2_E).round_ties_even();
    let r = clamped - n * LN2_HIGH - n * LN2_LOW;
    let p = (((((1.987_569_1e-4 * r + 1.398_199_9e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2)
        * r
        + 1.666_666_5e-1)
        * r
        + 0.5)
        * r
        * r
        + r
        + 1.0;
    let scale = f32::from_bits(((n as i32 + 127) as u32) << 23);
    if x < LOWEST {
        0.0
    } else {
        p * scale
    }
}

/// The largest of `scores` (`f32::max`, which passes over NaN), sixteen lanes at a time. The
/// order cannot change the value, only the sign of a zero maximum, and `s - max` is then the
/// same for every score but a zero one, whose `exp` is 1 either way.
#[inline(always)]
fn max_of(scores: &[f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let blocks = scores.chunks_exact(LANES);
    let mut max = blocks
        .remainder()
        .iter()
        .fold(f32::NEG_INFINITY, |m, &s| m.max(s));
    for block in blocks {
        for i in 0..LANES {
            lanes[i] = lanes[i].max(block[i]);
        }
    }
    for lane in lanes {
        max = max.max(lane);
    }
    max
}

/// `context = sum over columns of p_c * v_c` for each column's vectors in order, starting
/// from zeros, as `axpy` into `context` would, with a context of 64 (a common head size)
/// held in registers rather than stored and loaded again for every column.
#[inline(always)]
fn weigh_into<'v, const N: usize>(
    probabilities: &[f32],
    vectors: impl Iterator<Item = [&'v [f32]; N]>,
    context: &mut [f32],
) {
    const HELD: usize = 64;
    if context.len() == HELD {
        let mut held = [0.0f32; HELD];
        for (&p, column) in probabilities.iter().zip(vectors) {
            for v in column {
                let v: &[f32; HELD] = v.try_into().expect("a value as long as the context");
                for d in 0..HELD {
                    held[d] += p * v[d];
                }
            }
        }
        context.copy_from_slice(&held);
        return;
    }
    context.fill(0.0);
    for (&p, column) in probabilities.iter().zip(vectors) {
        for v in column {
            axpy(p, v, context);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use super::LANES;

    /// [`super::dot`] of `q` with each of sixteen keys.
    ///
    /// # Safety
    /// The CPU has AVX-512 F; every key is as long as `q`, a multiple of 16.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn dots16(q: &[f32], keys: &[&[f32]; LANES]) -> [f32; LANES] {
        let mut partial = [_mm512_setzero_ps(); LANES];
        for chunk in 0..q.len() / LANES {
            let at = chunk * LANES;
            let q = _mm512_loadu_ps(q.as_ptr().add(at));
            for (p, key) in partial.iter_mut().zip(keys) {
                *p = _mm512_add_ps(*p, _mm512_mul_ps(q, _mm512_loadu_ps(key.as_ptr().add(at))));
            }
        }
        // Lane k of by_lane[i]: key k's partial sum i.
        let by_lane = transpose(partial);
        // `Iterator::sum` of f32 starts from -0.0, and the empty tail adds -0.0.
        let mut sums = _mm512_set1_ps(-0.0);
        for lane in by_lane {
            sums = _mm512_add_ps(sums, lane);
        }
        sums = _mm512_add_ps(sums, _mm512_set1_ps(-0.0));
        let mut out = [0.0f32; LANES];
        _mm512_storeu_ps(out.as_mut_ptr(), sums);
        out
    }

    /// A 16 x 16 matrix of floats, one row a register, transposed.
    #[target_feature(enable = "avx512f")]
    pub(super) fn transpose(r: [__m512; LANES]) -> [__m512; LANES] {
        // Pairs of rows interleaved, then pairs of pairs, then 128-bit quarters twice.
        let mut t = [_mm512_setzero_ps(); LANES];
        for i in 0..LANES / 2 {
            t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
            t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
        }
        let mut u = [_mm512_setzero_ps(); LANES];
        for i in 0..LANES / 4 {
            let b = 4 * i;
            u[b] = _mm512_shuffle_ps::<0x44>(t[b], t[b + 2]);
            u[b + 1] = _mm512_shuffle_ps::<0xEE>(t[b], t[b + 2]);
            u[b + 2] = _mm512_shuffle_ps::<0x44>(t[b + 1], t[b + 3]);
            u[b + 3] = _mm512_shuffle_ps::<0xEE>(t[b + 1], t[b + 3]);
        }
        let mut v = [_mm512_setzero_ps(); LANES];
        for half in 0..2 {
            let b = 8 * half;
            for i in 0..4 {
                v[b + i] = _mm512_shuffle_f32x4::<0x88>(u[b + i], u[b + 4 + i]);
                v[b + 4 + i] = _mm512_shuffle_f32x4::<0xDD>(u[b + i], u[b + 4 + i]);
            }
        }
        let mut w = [_mm512_setzero_ps(); LANES];
        for i in 0..8 {
            w[i] = _mm512_shuffle_f32x4::<0x88>(v[i], v[8 + i]);
            w[8 + i] = _mm512_shuffle_f32x4::<0xDD>(v[i], v[8 + i]);
        }
        w
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values with every kind of float the kernels meet: ordinary, tiny, large, signed zeros.
    fn numbers(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| {
                let h = (i as u32)
                    .wrapping_mul(2654435761)
                    .wrapping_add(seed.wrapping_mul(40503));
                match h % 23 {
                    0 => 0.0,
                    1 => -0.0,
                    2 => 1e-30,
                    3 => -3e20,
                    _ => ((h >> 8) % 20_000) as f32 / 1000.0 - 10.0,
                }
            })
            .collect()
    }

    #[test]
    fn blocks_of_keys_score_as_one_key_at_a_time_bit_for_bit() {
        for (head_dim, count) in [
            (64, 37),
            (64, 16),
            (64, 5),
            (32, 20),
            (16, 3),
            (20, 18),
            (128, 33),
        ] {
            let q = numbers(head_dim, 7);
            let keys = numbers(head_dim * count, head_dim as u32 + count as u32);
            let keys: Vec<&[f32]> = keys.chunks_exact(head_dim).collect();
            let mut got = Vec::new();
            dots_into(&q, keys.iter().copied(), &mut got);
            let want: Vec<u32> = keys.iter().map(|k| dot(&q, k).to_bits()).collect();
            let got: Vec<u32> = got.iter().map(|v| v.to_bits()).collect();
            assert_eq!(got, want, "head_dim {head_dim}, {count} keys");
        }
    }

    #[test]
    fn a_zero_query_scores_zero_with_dots_sign() {
        // Sums of only zeros are where the order's -0.0 start and end would show.
        let q = vec![-0.0f32; 64];
        let keys = vec![0.0f32; 64 * 16];
        let keys: Vec<&[f32]> = keys.chunks_exact(64).collect();
        let mut got = Vec::new();
        dots_into(&q, keys.iter().copied(), &mut got);
        for (got, key) in got.iter().zip(&keys) {
            assert_eq!(got.to_bits(), dot(&q, key).to_bits());
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_transpose_puts_row_i_lane_k_at_row_k_lane_i() {
        use std::arch::x86_64::*;
        if !crate::by_cpu::has_avx512() {
            return;
        }
        let rows: Vec<Vec<f32>> = (0..LANES)
            .map(|i| (0..LANES).map(|k| (i * LANES + k) as f32).collect())
            .collect();
        // Safety: AVX-512 F checked above; each row holds 16 floats.
        let transposed = unsafe {
            let r = std::array::from_fn(|i| _mm512_loadu_ps(rows[i].as_ptr()));
            avx512::transpose(r).map(|v| {
                let mut out = [0.0f32; LANES];
                _mm512_storeu_ps(out.as_mut_ptr(), v);
                out
            })
        };
        for (k, row) in transposed.iter().enumerate() {
            for (i, &value) in row.iter().enumerate() {
                assert_eq!(value, rows[i][k], "row {k} lane {i}");
            }
        }
    }

    #[test]
    fn the_softmax_gives_the_bits_of_dividing_as_each_column_is_weighed() {
        for head_dim in [64, 48] {
            for columns in [9, 40] {
                let values = numbers(head_dim * columns, 3);
                let tables = numbers(head_dim * columns, 4);
                let scores: Vec<f32> = numbers(columns, 5)
                    .iter()
                    .map(|w| w.clamp(-8.0, 8.0))
                    .collect();
                let pairs = || {
                    values
                        .chunks_exact(head_dim)
                        .zip(tables.chunks_exact(head_dim))
                        .map(|(v, t)| [v, t])
                };
                let mut got = vec![f32::NAN; head_dim];
                softmax_weigh(&mut scores.clone(), &mut got, pairs());
                // The order of the kernels before: a left-to-right maximum, and the division
                // in every column's axpy.
                let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let exps: Vec<f32> = scores.iter().map(|s| exp(s - max)).collect();
                let mut sum = 0.0f32;
                for e in &exps {
                    sum += e;
                }
                let mut want = vec![0.0f32; head_dim];
                for (w, column) in exps.iter().zip(pairs()) {
                    for v in column {
                        axpy(w / sum, v, &mut want);
                    }
                }
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(&got),
                    bits(&want),
                    "head_dim {head_dim}, {columns} columns"
                );
            }
        }
    }

    #[test]
    fn exp_is_within_an_ulp_of_the_correctly_rounded_value() {
        // Every input a softmax gives it, from 0 down to the smallest normal result, where
        // it turns to 0; NaN stays NaN.
        let n = 200_000;
        for i in 0..=n {
            let x = -87.3f32 * i as f32 / n as f32;
            let truth = (x as f64).exp() as f32;
            let ulps = (exp(x).to_bits() as i64 - truth.to_bits() as i64).abs();
            assert!(
                ulps <= 1,
                "exp({x}) = {} where {truth} is correctly rounded",
                exp(x)
            );
        }
        assert_eq!(exp(0.0), 1.0);
        assert_eq!(exp(-0.0), 1.0);
        assert_eq!(exp(-100.0), 0.0);
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert!(exp(f32::NAN).is_nan());
    }
}
