//! What the model's work costs, in cost units: the door's measure of work, so that a long
//! input is not priced like a short one.
//!
//! Counting tokens (a text's source plus its output) priced every decoder step of a row alike,
//! but a step's time grows with what its rows attend to: every row of the batch attends over
//! the longest source's memory and the longest output's cache, since the slots are padded to
//! them (`engine::onnx`). A row decoding beside a source of 1,024 subwords costs about five
//! times what it costs beside a verse, and encoding that source about 30 times what its
//! tokens' share of a verse's would. Since session 26 the shipped packages' attention is
//! fused (`engine::fused`): a row reads only its own source and cache, so a short row beside a
//! long one costs less than this prices it; the formula stays the padded worst case (it errs
//! toward refusing) until a refit per row's own lengths.
//!
//! One cost unit is one row of a decoder step with nothing to attend to. A step of `rows` rows
//! whose longest source has `s` tokens and whose longest output is at position `p` costs
//! [`STEP_FIXED`] `+ rows * (1 + (s + p) / CONTEXT_SCALE)`; encoding a source of `n` tokens
//! costs `n * (ENCODE_TOKEN + ENCODE_PAIR * n)`, plus [`ENCODE_FIXED`] per encoder run. The
//! worker counts what it did in these units (the door's `Load::apply`), its
//! throughput is units per busy second, and the door's replay counts the work ahead in the
//! same units, so the estimate holds for any mix of lengths as far as the formula does.
//!
//! The constants were fitted by `bench/examples/step_cost.rs` on the shipped package
//! (`models/en-es-rel-ldpe`, 3 + 3 layers, d_model 256, one intra-op thread, AMD EPYC, 2
//! cores, 2026-11-26): it times 2,866 decoder steps (1 to 32 rows, sources of 16 to 1,024
//! tokens, positions up to 1,024) and 111 encoder runs (1 to 32 texts of 16 to 1,024 tokens),
//! and fits `seconds = fixed + rows * (row + a * max_source + b * max_position)` and
//! `seconds = fixed + texts * (c * length + d * length^2)` by least squares on the relative
//! error. Three runs gave a step's fixed part 3.98-4.20 rows, 178-280 source tokens and
//! 177-207 positions per row, an encoder run's fixed part 1.07-1.72 rows, 0.29-0.35 rows per
//! source token and 1.5-2.2 thousandths per (query, key) pair; the median error of a step was
//! 5-10%, of an encoder run 5-7%, and every configuration's mean was within 17% (within 11% for
//! steps). One row of a step took 70-90 µs: 11,000-14,000 units per second. Another model or
//! machine changes the units' speed, which the worker measures, more than their proportions.

/// A decoder step's own cost beside its rows' (running the graph, the logits' rules).
pub const STEP_FIXED: f64 = 4.0;
/// Tokens of source memory, or positions of output cache, that one row attends to for the
/// cost of one more row.
pub const CONTEXT_SCALE: f64 = 200.0;
/// An encoder run's own cost beside its texts'.
pub const ENCODE_FIXED: f64 = 1.7;
/// Encoding one source token: its projections and feed-forward layers.
pub const ENCODE_TOKEN: f64 = 0.3;
/// One (query, key) pair of the encoder's self-attention.
pub const ENCODE_PAIR: f64 = 0.002;

/// Throughput assumed before the worker has measured any, in cost units per second of busy
/// time: a tenth of what the shipped model did alone on one core of the machine it was
/// calibrated on. Requests taken before anything is measured are promised their time at this
/// speed, and a storm of maximal requests, its refused clients keeping the HTTP threads busy,
/// left the worker there 2,000-3,500 (a release build, as the machine's other load varied) or
/// 1,300 (a debug build, whose own code in every step is slower): a cold server errs toward
/// refusing. Some seconds of work replace it.
pub const PRIOR_UNITS_PER_SECOND: f64 = 1_000.0;

/// What the shipped model did alone on one core of the machine it was calibrated on, about:
/// a cold server refuses a request as too costly to ever finish in time (413) only when it is
/// at this speed, not at the prior's, until its own measurements count.
pub const CALIBRATED_UNITS_PER_SECOND: f64 = 11_000.0;

/// Encoding one source of `tokens` tokens (its run's fixed part not included).
pub fn encode(tokens: u64) -> f64 {
    let n = tokens as f64;
    n * (ENCODE_TOKEN + ENCODE_PAIR * n)
}

/// One decoder step of `rows` rows whose longest source has `source` tokens and whose
/// furthest output is at `position` (0 at a row's first step).
pub fn step(rows: usize, source: u64, position: u64) -> f64 {
    if rows == 0 {
        return 0.0;
    }
    STEP_FIXED + rows as f64 * (1.0 + (source + position) as f64 / CONTEXT_SCALE)
}

/// `count` consecutive steps of the same `rows` rows, the first at `position`: the position
/// grows by one a step. The sum of [`step`] over them, in closed form.
pub fn steps(rows: usize, source: u64, position: u64, count: u64) -> f64 {
    if rows == 0 || count == 0 {
        return 0.0;
    }
    count as f64 * STEP_FIXED + rows as f64 * row_steps(source, position, count)
}

/// One row's share of `count` consecutive steps from `position` beside a source of `source`
/// tokens, the steps' fixed part not included.
pub fn row_steps(source: u64, position: u64, count: u64) -> f64 {
    let k = count as f64;
    let first = 1.0 + (source + position) as f64 / CONTEXT_SCALE;
    // The positions past the first add 0 + 1 + ... + (k - 1) over the scale.
    k * first + k * (k - 1.0) / 2.0 / CONTEXT_SCALE
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consecutive_steps_sum_the_single_ones() {
        let summed: f64 = (0..37).map(|i| step(5, 300, 12 + i)).sum();
        assert!((steps(5, 300, 12, 37) - summed).abs() < 1e-9);
        assert_eq!(steps(0, 300, 12, 37), 0.0);
        assert_eq!(steps(5, 300, 12, 0), 0.0);
    }

    #[test]
    fn long_inputs_cost_more_than_their_tokens() {
        // A row beside a source of 1,024 tokens costs several rows beside a verse.
        let verse = step(32, 30, 0) - STEP_FIXED;
        let long = step(32, 1024, 0) - STEP_FIXED;
        assert!(long > 4.0 * verse, "{long} vs {verse}");
        // Encoding grows faster than the tokens: attention meets every pair.
        assert!(encode(1024) > 16.0 * encode(64));
        assert!((encode(10) - 10.0 * (ENCODE_TOKEN + 10.0 * ENCODE_PAIR)).abs() < 1e-12);
    }
}
