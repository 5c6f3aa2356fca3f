//! Memory of the graphs that attend over a whole input at once (the encoder, the length
//! predictor). Their attention holds `rows x len²` scores per head, so a batch of them runs in
//! pieces of at most [`PAIRS_PER_RUN`] (query, key) pairs: a batch of maximal texts then
//! peaks where one maximal text does. What a large run freed is handed back to the system,
//! so that one long input does not leave the process at its peak.
//!
//! The C heap is tuned by [`configure_heap`]: it never returns memory by itself (that would
//! cost every decoder step page faults), so it is handed back here, at chosen moments.

use std::ops::Range;

use model_package::{Dim, Manifest, PredictorGraph};

use crate::limits::DEFAULT_MAX_INPUT_TOKENS;
use crate::slots::time_room;

/// (query, key) pairs one run of a whole-input graph covers at most, padding included: one
/// text at the default `--max-input-tokens`. A longer text (the limit raised) still runs,
/// alone.
pub const PAIRS_PER_RUN: usize = DEFAULT_MAX_INPUT_TOKENS * DEFAULT_MAX_INPUT_TOKENS;

/// Runs below this many pairs leave the heap alone: they free little, and the allocator's
/// reuse of it is what makes the next short run cheap.
const TRIM_FROM_PAIRS: usize = 1 << 16;

/// Consecutive pieces of `lengths`, in order, each of at least one item, whose rows times
/// the longest length squared stays within `max_pairs`.
pub fn pieces(lengths: &[usize], max_pairs: usize) -> Vec<Range<usize>> {
    let mut pieces = Vec::new();
    let mut start = 0;
    let mut longest = 0;
    for (i, &len) in lengths.iter().enumerate() {
        let longer = longest.max(len);
        let rows = i - start + 1;
        if rows > 1 && rows.saturating_mul(longer.saturating_mul(longer)) > max_pairs {
            pieces.push(start..i);
            start = i;
            longest = len;
        } else {
            longest = longer;
        }
    }
    if start < lengths.len() {
        pieces.push(start..lengths.len());
    }
    pieces
}

/// The C heap's arenas ([`configure_heap`]): one per busy thread of a two-worker server
/// (model workers, HTTP), each with its own lock. Until session 31 there was one arena for
/// every thread, because with glibc's default of one per thread what the HTTP threads and the
/// model workers freed sat in heaps that [`give_back_free_pages`] did not shrink (after a
/// 512-subword request RSS stayed 7-33% above idle; with three arenas the two workers' server
/// stayed 20% above idle 10 s after a maximal text, 166 against 138 MiB). That memory was
/// the encoder's tensors, which now come from ONNX Runtime's arena and go back with it after a
/// long input (`RunPattern::OncePerText`); with 2 or 4 arenas the server returns to idle after
/// a maximal text as with one (`tests/tests/memory.rs`, one and two workers). With 4 arenas
/// instead of one lock for every thread's larger allocations, two int8 workers under 64
/// clients made 14-16% more: 20,762 against 18,271 and 22,809 against 19,680 target
/// subwords/s (medians of 6 and 8 interleaved passes, ahead in every round), for 6-9 MiB more.
pub const HEAP_ARENAS: i32 = 4;

/// Sets up the C heap of a serving process; call it first thing in `main`, before any thread
/// starts.
///
/// - Freed memory stays in the heap (no `mmap` for large blocks, no automatic trimming):
///   every decoder step allocates its output tensors afresh, and glibc would otherwise map
///   and unmap large ones, page-faulting and zeroing them each step (the same change halved
///   `nmt-train`'s step).
/// - At most [`HEAP_ARENAS`] arenas, where glibc's default is eight per core.
pub fn configure_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator tuning parameters, before any thread starts.
    unsafe {
        libc::mallopt(libc::M_MMAP_MAX, 0);
        libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
        libc::mallopt(libc::M_ARENA_MAX, HEAP_ARENAS);
    }
}

/// (query, key) pairs of a run over `rows` inputs padded to `len`.
pub fn pairs(rows: usize, len: usize) -> usize {
    rows.saturating_mul(len.saturating_mul(len))
}

/// Whether a run over `pairs` (query, key) pairs is one whose memory is handed back when it
/// ends: its ONNX Runtime arena's free regions, then the C heap's free pages.
pub fn is_large_run(pairs: usize) -> bool {
    pairs >= TRIM_FROM_PAIRS
}

/// After a run over `pairs` (query, key) pairs whose tensors are dropped: gives the C heap's
/// free pages back to the system, so that the hundreds of MB one long input used do not
/// stay resident (docs/serving.md, "Memory").
pub fn after_run(pairs: usize) {
    if is_large_run(pairs) {
        give_back_free_pages();
    }
}

/// Hands the C heap's free pages back to the system: after a large run, and when a model
/// worker runs out of work after a long text (what its decoding allocated is free by then).
/// It walks the whole heap: not after every request.
pub fn give_back_free_pages() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks and trims the allocator's own free lists; it takes no
    // pointer and is thread-safe (it locks each arena).
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Attention-score-sized tensors one whole-input run holds at its peak (scores, scaled,
/// biased, probabilities, the relative terms' picks and sums, what the allocator has not
/// reused yet), with room: measured for one text of 1,024 subwords in models of 4 heads
/// (16 MiB of scores a layer), the peaks were 47 (sinusoidal), 52 (GRU positions), 121
/// (relative), 127 (the shipped relative + LDPE) and 153 MiB (GRU + relative), at most 9.6
/// of them (`nmt-bench memory`, docs/benchmarks/memory.md).
const SCORE_COPIES_AT_PEAK: u64 = 12;

/// Per-token tensors a lexical predictor run holds at its peak (ids and mask as i64, the mask
/// as f32, the looked-up and the masked lengths), with room.
const LEXICAL_COPIES_AT_PEAK: u64 = 8;

/// The heads of a length predictor whose package does not say (BERT-base's and MiniLM's).
pub const PREDICTOR_HEADS_UNSTATED: usize = 12;

/// The most memory serving can add to an idle server, in bytes, from the package and the
/// flags (docs/serving.md, "Memory"): each model worker holds at most one encoder run and
/// one running batch's caches; the length predictor, one run for the whole process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryBound {
    /// One encoder run: [`PAIRS_PER_RUN`] (or one longer text's) pairs per head.
    pub encoder_run: u64,
    /// The running batch's cross-attention memory and self-attention caches, every row
    /// padded to the longest source and the longest output's room.
    pub caches: u64,
    /// One length-predictor run (0 without one).
    pub predictor_run: u64,
    pub workers: u64,
}

/// What [`MemoryBound::new`] reads from the server's flags.
#[derive(Clone, Copy, Debug)]
pub struct ServingShape {
    pub max_input_tokens: usize,
    pub max_output_tokens: usize,
    pub max_batch_size: usize,
    pub workers: usize,
}

impl MemoryBound {
    pub fn new(manifest: &Manifest, shape: ServingShape) -> Self {
        let config = &manifest.config;
        let f32_bytes = 4u64;
        let run_pairs = pairs(1, shape.max_input_tokens).max(PAIRS_PER_RUN) as u64;
        let encoder_run = SCORE_COPIES_AT_PEAK * config.num_heads as u64 * run_pairs * f32_bytes;
        // Per row: every decoder layer's cross keys and values over the source, and every
        // state tensor at the output's room (fixed axes multiplied, time at its room).
        let source = config.decoder_layers as u64
            * 2
            * config.d_model as u64
            * shape.max_input_tokens as u64;
        let room = time_room(shape.max_output_tokens) as u64;
        let state: u64 = manifest
            .decoder_state
            .iter()
            .map(|spec| {
                spec.dims
                    .iter()
                    .map(|d| match d {
                        Dim::Batch => 1,
                        Dim::Time => room,
                        Dim::Fixed(n) => *n as u64,
                    })
                    .product::<u64>()
            })
            .sum();
        let caches = shape.max_batch_size as u64 * (source + state) * f32_bytes;
        let predictor_run = match manifest
            .length_prediction
            .as_ref()
            .and_then(|p| p.predictor.as_ref())
        {
            Some(spec) if spec.computes == PredictorGraph::Bert => {
                let heads = spec.training["bert"]["config"]["num_attention_heads"]
                    .as_u64()
                    .unwrap_or(PREDICTOR_HEADS_UNSTATED as u64);
                let pairs = pairs(1, spec.max_input_tokens) as u64;
                SCORE_COPIES_AT_PEAK * heads * pairs * f32_bytes
            }
            // The encoder's own run, for the head's output alone.
            Some(spec) if spec.computes == PredictorGraph::Encoder => encoder_run,
            // A table (per WordPiece or subword): ids, mask, lengths and their products, one
            // number per input token: at most a few MiB, no attention.
            Some(spec) => LEXICAL_COPIES_AT_PEAK * spec.max_input_tokens as u64 * 8,
            None => 0,
        };
        MemoryBound {
            encoder_run,
            caches,
            predictor_run,
            workers: shape.workers as u64,
        }
    }

    /// The whole bound: every worker's encoder run and caches, and one predictor run.
    pub fn above_idle(&self) -> u64 {
        self.workers * (self.encoder_run + self.caches) + self.predictor_run
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_keep_order_and_bound_pairs() {
        // 4 x 3² = 36 fits 40; a fifth row of 3 would make 45.
        assert_eq!(pieces(&[3, 1, 3, 2, 3, 1], 40), vec![0..4, 4..6]);
        // A text alone over the bound still runs, alone.
        assert_eq!(pieces(&[2, 10, 2], 40), vec![0..1, 1..2, 2..3]);
        assert_eq!(pieces(&[], 40), Vec::<Range<usize>>::new());
        assert_eq!(pieces(&[5; 8], usize::MAX), vec![0..8]);
    }

    #[test]
    fn the_bound_of_the_shipped_shape() {
        let shipped =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/en-es-rel-ldpe");
        let manifest = Manifest::load(&shipped).unwrap();
        let shape = ServingShape {
            max_input_tokens: 1024,
            max_output_tokens: 1024,
            max_batch_size: 32,
            workers: 2,
        };
        let bound = MemoryBound::new(&manifest, shape);
        let c = &manifest.config;
        let mib = 1u64 << 20;
        assert_eq!(bound.encoder_run, 12 * c.num_heads as u64 * 4 * mib);
        // Cross memory over 1,024 source positions and caches of 1,280 columns (a quarter of
        // room over 1,024), per layer keys and values of d_model floats, 32 rows.
        let per_position = c.decoder_layers as u64 * 2 * c.d_model as u64 * 4;
        assert_eq!(bound.caches, 32 * (1024 + 1280) * per_position);
        // Its predictor is lexical (a table lookup): a few numbers per WordPiece, not
        // MiniLM's 12 heads over 512 of them (144 MiB).
        assert_eq!(bound.predictor_run, 8 * 65_536 * 8);
        let mut bert = manifest.clone();
        let spec = bert.length_prediction.as_mut().unwrap();
        let spec = spec.predictor.as_mut().unwrap();
        spec.computes = PredictorGraph::Bert;
        spec.max_input_tokens = 512;
        let bert_run = MemoryBound::new(&bert, shape).predictor_run;
        let mut head = manifest.clone();
        head.length_prediction
            .as_mut()
            .and_then(|p| p.predictor.as_mut())
            .unwrap()
            .computes = PredictorGraph::Encoder;
        let head_bound = MemoryBound::new(&head, shape);
        assert_eq!(head_bound.predictor_run, head_bound.encoder_run);
        assert_eq!(bert_run, 12 * 12 * 512 * 512 * 4);
        assert_eq!(
            bound.above_idle(),
            2 * (bound.encoder_run + bound.caches) + bound.predictor_run
        );
        // A longer input limit runs a longer text alone: its own pairs.
        let long = MemoryBound::new(
            &manifest,
            ServingShape {
                max_input_tokens: 2048,
                ..shape
            },
        );
        assert_eq!(long.encoder_run, 4 * bound.encoder_run);
    }

    #[test]
    fn a_maximal_text_is_one_piece_and_two_are_two() {
        let max = DEFAULT_MAX_INPUT_TOKENS;
        assert_eq!(pieces(&[max], PAIRS_PER_RUN), vec![0..1]);
        assert_eq!(pieces(&[max, max], PAIRS_PER_RUN), vec![0..1, 1..2]);
        // Short texts share a run: 64 texts of 128 subwords are one run.
        assert_eq!(pieces(&[128; 64], PAIRS_PER_RUN), vec![0..64]);
    }
}
