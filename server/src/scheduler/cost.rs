//! What the model's work costs, in cost units: the door's measure of work, so that a long
//! input is not priced like a short one.
//!
//! Counting tokens (a text's source plus its output) priced every decoder step of a row alike,
//! but a step's time grows with what its rows attend to. Where the attention is written in
//! standard operators (the CUDA path, graphs without fused nodes), every row of the batch
//! attends over the longest source's memory and the longest output's cache, since the slots
//! are padded to them (`engine::onnx`): a row decoding beside a source of 1,024 subwords
//! costs about five times what it costs beside a verse. The engine's fused attention kernels
//! (`engine::fused`, the shipped packages on the CPU) read only a row's own source and cache
//! prefix, so there a row costs by its own lengths, plus a little for the padding the slots
//! still carry. The backend says which its decoder does ([`AttentionReads`], by the kernels
//! its session took) and the worker's door prices steps with it ([`StepCost`]). Encoding a
//! source of 1,024 tokens costs about 30 times what its tokens' share of a verse's would.
//!
//! One cost unit is one row of a decoder step with nothing to attend to. A step costs
//! [`STEP_FIXED`] `+ rows +` what its rows attend to: for a context read over padded slots,
//! `rows * longest / PADDED_SCALE`; for one each row reads its own of,
//! `sum / OWN_*_SCALE + rows * longest / RESIDUAL_*_SCALE`. Encoding a source of `n` tokens
//! costs `n * (ENCODE_TOKEN + ENCODE_PAIR * n)`, plus [`ENCODE_FIXED`] per encoder run. The
//! worker counts what it did in these units (the door's `Load::apply`), its throughput is
//! units per busy second, and the door's replay counts the work ahead in the same units, so
//! the estimate holds for any mix of lengths as far as the formula does.
//!
//! The constants were fitted by `bench/examples/step_cost.rs`, which times real decoder steps
//! (uniform batches of 1 to 32 rows, sources of 16 to 1,024 tokens, positions up to 1,024, and
//! mixed ones: a long source among verses, rows joining a batch whose cache is long) and
//! encoder runs, and fits them by least squares on the relative error. Padded: the shipped
//! package before its attention was fused (`models/en-es-rel-ldpe`, 3 + 3 layers, d_model
//! 256, one intra-op thread, AMD EPYC, 2 cores, 2026-11-26): three runs gave a step's fixed
//! part 3.98-4.20 rows, 178-280 source tokens and 177-207 positions per row, an encoder
//! run's fixed part 1.07-1.72 rows, 0.29-0.35 rows per source token and 1.5-2.2 thousandths
//! per (query, key) pair; the median error of a step was 5-10%, of an encoder run 5-7%. One
//! row of a step took 70-90 µs: 11,000-14,000 units per second. Own rows: the default
//! package with fused attention (`models/en-es-l10n`, same shape; AMD EPYC Zen 5, AVX-512
//! VNNI/BF16, 2 cores, 2026-11-27; 3,928 steps, 21 runs): fixed part 4.40 rows, 312 own
//! source tokens and 165 own positions per row, and 5,053 and 7,209 for the padding; median
//! error 6%, 90th percentile 18%, every run's mean within 9%. Priced as padded, the same steps
//! were off by a median 12% and a 90th percentile 30%, a long source beside verses 1.19x
//! over and 16 rows of 1,024 tokens 0.47x under. Another model or machine changes the units'
//! speed, which the worker measures, more than their proportions.

pub use nmt_engine::backend::{AttentionReads, ContextReads};

/// A decoder step's own cost beside its rows' (running the graph, the logits' rules).
pub const STEP_FIXED: f64 = 4.0;
/// Tokens of source memory, or positions of output cache, over padded slots that one row
/// attends to for the cost of one more row.
pub const PADDED_SCALE: f64 = 200.0;
/// Tokens of its own source a row attends to, in a fused kernel, for the cost of one row.
pub const OWN_SOURCE_SCALE: f64 = 300.0;
/// Positions of its own cache a row attends to, in a fused kernel, for the cost of one row.
pub const OWN_POSITION_SCALE: f64 = 165.0;
/// What the padding of the source memory's slots still costs a row that reads its own: copies
/// and the layers around the kernel, per token of the longest source.
pub const RESIDUAL_SOURCE_SCALE: f64 = 5_000.0;
/// The same for the cache's slots, per position of the furthest row.
pub const RESIDUAL_POSITION_SCALE: f64 = 7_200.0;
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

/// The rows of a decoder step, as its cost reads them: how many, their sources and
/// positions (0 at a row's first step) summed, and the longest of each.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StepRows {
    pub rows: u64,
    pub sources: u64,
    pub positions: u64,
    pub longest_source: u64,
    pub furthest_position: u64,
}

impl StepRows {
    /// `rows` rows of one source length at one position.
    pub fn uniform(rows: u64, source: u64, position: u64) -> Self {
        StepRows {
            rows,
            sources: rows * source,
            positions: rows * position,
            longest_source: source,
            furthest_position: position,
        }
    }

    /// Adds a row.
    pub fn add(&mut self, source: u64, position: u64) {
        self.rows += 1;
        self.sources += source;
        self.positions += position;
        self.longest_source = self.longest_source.max(source);
        self.furthest_position = self.furthest_position.max(position);
    }
}

/// What one token of a context costs a row, read as `reads`: (per token of its own, per
/// token of the batch's longest).
fn per_token(reads: ContextReads, own_scale: f64, residual_scale: f64) -> (f64, f64) {
    match reads {
        ContextReads::Padded => (0.0, 1.0 / PADDED_SCALE),
        ContextReads::OwnRows => (1.0 / own_scale, 1.0 / residual_scale),
    }
}

/// How a decoder step costs, by what its attention reads (the backend's
/// `attention_reads`); the default prices padded slots, the worst case.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StepCost {
    pub reads: AttentionReads,
}

impl StepCost {
    pub fn new(reads: AttentionReads) -> Self {
        StepCost { reads }
    }

    fn source(&self) -> (f64, f64) {
        per_token(self.reads.source, OWN_SOURCE_SCALE, RESIDUAL_SOURCE_SCALE)
    }

    fn position(&self) -> (f64, f64) {
        per_token(
            self.reads.cache,
            OWN_POSITION_SCALE,
            RESIDUAL_POSITION_SCALE,
        )
    }

    /// One decoder step of `batch`.
    pub fn step(&self, batch: &StepRows) -> f64 {
        if batch.rows == 0 {
            return 0.0;
        }
        let ((s_own, s_pad), (p_own, p_pad)) = (self.source(), self.position());
        let rows = batch.rows as f64;
        STEP_FIXED
            + rows
            + s_own * batch.sources as f64
            + p_own * batch.positions as f64
            + rows * (s_pad * batch.longest_source as f64 + p_pad * batch.furthest_position as f64)
    }

    /// `count` consecutive steps of the same rows from `batch`, every position growing by one
    /// a step: the sum of [`StepCost::step`] over them, in closed form.
    pub fn steps(&self, batch: &StepRows, count: u64) -> f64 {
        if batch.rows == 0 || count == 0 {
            return 0.0;
        }
        let (p_own, p_pad) = self.position();
        let k = count as f64;
        // The positions past the first add 0 + 1 + ... + (k - 1) to every row.
        let growth = k * (k - 1.0) / 2.0 * batch.rows as f64 * (p_own + p_pad);
        k * self.step(batch) + growth
    }

    /// One row's share of `count` consecutive steps from `position` beside a source of
    /// `source` tokens: the steps' fixed part and padding to longer rows not included.
    pub fn row_steps(&self, source: u64, position: u64, count: u64) -> f64 {
        if count == 0 {
            return 0.0;
        }
        self.steps(&StepRows::uniform(1, source, position), count) - count as f64 * STEP_FIXED
    }
}

/// `count` steps of `rows` rows of one source length from one position, priced over padded
/// slots: the scheduler's tests' expectations.
#[cfg(test)]
pub(super) fn padded_steps(rows: usize, source: u64, position: u64, count: u64) -> f64 {
    StepCost::default().steps(&StepRows::uniform(rows as u64, source, position), count)
}

#[cfg(test)]
mod tests {
    use super::*;

    const OWN: StepCost = StepCost {
        reads: AttentionReads {
            source: ContextReads::OwnRows,
            cache: ContextReads::OwnRows,
        },
    };

    #[test]
    fn consecutive_steps_sum_the_single_ones() {
        for cost in [StepCost::default(), OWN] {
            let mut batch = StepRows::default();
            batch.add(300, 12);
            batch.add(20, 3);
            batch.add(45, 0);
            let summed: f64 = (0..37)
                .map(|i| {
                    let mut later = batch;
                    later.positions += 3 * i;
                    later.furthest_position += i;
                    cost.step(&later)
                })
                .sum();
            assert!((cost.steps(&batch, 37) - summed).abs() < 1e-9, "{cost:?}");
            assert_eq!(cost.steps(&StepRows::default(), 37), 0.0);
            assert_eq!(cost.steps(&batch, 0), 0.0);
            let alone = cost.steps(&StepRows::uniform(1, 300, 12), 37);
            assert!((cost.row_steps(300, 12, 37) + 37.0 * STEP_FIXED - alone).abs() < 1e-9);
        }
    }

    #[test]
    fn long_inputs_cost_more_than_their_tokens() {
        // A row beside a source of 1,024 tokens costs several rows beside a verse.
        let cost = StepCost::default();
        let verse = cost.step(&StepRows::uniform(32, 30, 0)) - STEP_FIXED;
        let long = cost.step(&StepRows::uniform(32, 1024, 0)) - STEP_FIXED;
        assert!(long > 4.0 * verse, "{long} vs {verse}");
        // Encoding grows faster than the tokens: attention meets every pair.
        assert!(encode(1024) > 16.0 * encode(64));
        assert!((encode(10) - 10.0 * (ENCODE_TOKEN + 10.0 * ENCODE_PAIR)).abs() < 1e-12);
    }

    #[test]
    fn rows_that_read_their_own_context_cost_by_their_own_lengths() {
        // One source of 1,024 tokens among 15 verses: over padded slots every verse pays
        // for it; read row by row, mostly the long row does.
        let mut mixed = StepRows::uniform(15, 16, 0);
        mixed.add(1024, 0);
        let verses = StepRows::uniform(16, 16, 0);
        let padded = StepCost::default();
        assert!(padded.step(&mixed) > 3.0 * padded.step(&verses));
        let own = OWN.step(&mixed) / OWN.step(&verses);
        assert!((1.1..1.6).contains(&own), "{own}");
        // Uniform batches cost alike either way, within the fits' spread.
        let ratio = OWN.step(&StepRows::uniform(32, 256, 40))
            / padded.step(&StepRows::uniform(32, 256, 40));
        assert!((0.8..1.25).contains(&ratio), "{ratio}");
        // A package whose cross-attention alone is fused (relative keys in the cache's)
        // reads its source row by row and its cache padded.
        let source_only = StepCost::new(AttentionReads {
            source: ContextReads::OwnRows,
            cache: ContextReads::Padded,
        });
        let mut late = StepRows::uniform(15, 16, 0);
        late.add(16, 400);
        assert!(source_only.step(&late) > 2.0 * source_only.step(&verses));
        assert!(OWN.step(&late) < 1.5 * OWN.step(&verses));
    }
}
