//! The synchronous model interface the decode loop is written against.
//!
//! A backend owns the model (ONNX Runtime sessions, or a test double) and runs on one worker
//! thread; it is never shared between threads, so `&mut self` everywhere. The running batch in
//! [`crate::decode`] only sees this trait. Its rows live in slots that stay put: a sentence
//! that joins is encoded and written into a free slot, a step runs every slot below the
//! batch's width, and one that leaves frees its slot, so continuous batching never copies the
//! rows that stay (a compaction moves a row only to close holes).

use ndarray::Array2;

#[derive(Clone, Debug, thiserror::Error)]
pub enum BackendError {
    /// The runtime failed while running a graph.
    #[error("inference failed: {0}")]
    Inference(String),
    /// A graph produced something the decoder-step contract does not allow.
    #[error("model broke the decoder contract: {0}")]
    Contract(String),
}

/// What a row of a decoder step attends over, for one of its contexts (the source memory, the
/// cache of its own output): what makes a step's cost grow.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ContextReads {
    /// Every row over the batch's padded slots: the longest source, the oldest row's cache
    /// (attention written in standard operators, which multiply the padding too).
    #[default]
    Padded,
    /// Each row over its own source or cache prefix (the engine's fused attention kernels,
    /// `crate::fused`).
    OwnRows,
}

/// What a backend's decoder step reads, for the source memory and for the cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AttentionReads {
    pub source: ContextReads,
    pub cache: ContextReads,
}

/// One model: an encoder run once per sentence and a decoder run once per output token.
pub trait Backend {
    /// The encoder memory and decoder state of a batch's slots. Opaque to the decode loop;
    /// the default is a batch of width 0.
    type Rows: Default;
    /// Freshly encoded sentences, not yet in a batch.
    type Encoded;

    /// Runs the encoder on `sources` (token ids, EOS included, no padding).
    fn encode(&mut self, sources: &[&[i64]]) -> Result<Self::Encoded, BackendError>;

    /// The sentences of `encoded`, in order, each one to be placed on its own (a worker
    /// encodes waiting texts ahead of their turn, several in one run, and places each when it
    /// gets a row).
    fn split(&self, encoded: Self::Encoded) -> Vec<Self::Encoded>;

    /// Writes the `i`-th sentence of `new` into slot `slots[i]`, ready for its first step
    /// (empty or zero state). A slot is either below the width (a freed one) or at or past
    /// it, in which case the width grows to cover it; the slots between the old width and
    /// the new one must all be in `slots`.
    fn place(
        &mut self,
        rows: &mut Self::Rows,
        new: Self::Encoded,
        slots: &[usize],
    ) -> Result<(), BackendError>;

    /// One decoder step for every slot below the width: `target_ids[r]` is the previous token
    /// of slot `r` (BOS at the first step) at position `positions[r]`, and `target_lengths[r]`
    /// the length the row is asked for (read by length-aware decoders only). Updates the
    /// state in place and returns the logits `[width, vocab]` of the next token. A freed
    /// slot is stepped like any other; its logits are ignored.
    fn step(
        &mut self,
        rows: &mut Self::Rows,
        target_ids: &[i64],
        positions: &[i64],
        target_lengths: &[i64],
    ) -> Result<Array2<f32>, BackendError>;

    /// Copies slot `from`'s memory and state over slot `to` (closing a hole).
    fn move_row(
        &mut self,
        rows: &mut Self::Rows,
        from: usize,
        to: usize,
    ) -> Result<(), BackendError>;

    /// Narrows the batch to its first `width` slots.
    fn truncate(&mut self, rows: &mut Self::Rows, width: usize) -> Result<(), BackendError>;

    /// What its decoder step's attention reads, which the scheduler prices a step by.
    fn attention_reads(&self) -> AttentionReads {
        AttentionReads::default()
    }

    /// Whether [`Backend::encode`] would wait now for another worker's turn at an encoder
    /// they share. A worker with rows running steps them instead and lets texts join later.
    fn encoder_busy(&self) -> bool {
        false
    }
}

/// The largest |difference| between the logits two rows get alone and the logits they get
/// sharing a running batch, which continuous batching relies on being float noise for every
/// model package (KV caches, recurrent state, whatever the graphs carry).
///
/// `long` runs 5 steps in slot 0; `short` joins slot 1 after `long`'s third (its cache is
/// empty where `long`'s has three columns, and its source memory is shorter), then `long`
/// leaves and `short` is moved into slot 0 and takes its third step alone. Both are fed
/// `fed` (BOS first); a length-aware model is asked for 6 tokens of `long` and 4 of `short`.
pub fn batching_deviation<B: Backend>(
    backend: &mut B,
    long: &[i64],
    short: &[i64],
    fed: [i64; 5],
) -> Result<f32, BackendError> {
    const LONG_LENGTH: i64 = 6;
    const SHORT_LENGTH: i64 = 4;
    let positions = |ps: &[usize]| ps.iter().map(|&p| p as i64).collect::<Vec<_>>();
    let mut alone =
        |source: &[i64], length: i64, steps: usize| -> Result<Vec<Array2<f32>>, BackendError> {
            let mut rows = B::Rows::default();
            let encoded = backend.encode(&[source])?;
            backend.place(&mut rows, encoded, &[0])?;
            (0..steps)
                .map(|p| backend.step(&mut rows, &[fed[p]], &positions(&[p]), &[length]))
                .collect()
        };
    let long_alone = alone(long, LONG_LENGTH, 5)?;
    let short_alone = alone(short, SHORT_LENGTH, 3)?;

    let mut worst = 0f32;
    let mut compare = |a: ndarray::ArrayView2<f32>, b: &Array2<f32>| -> Result<(), BackendError> {
        if a.shape() != b.shape() {
            return Err(BackendError::Contract(format!(
                "logits of shape {:?} in a batch, {:?} alone",
                a.shape(),
                b.shape()
            )));
        }
        worst = a
            .iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(worst, f32::max);
        Ok(())
    };
    let mut rows = B::Rows::default();
    let encoded = backend.encode(&[long])?;
    backend.place(&mut rows, encoded, &[0])?;
    for p in 0..3 {
        let logits = backend.step(&mut rows, &[fed[p]], &positions(&[p]), &[LONG_LENGTH])?;
        compare(logits.view(), &long_alone[p])?;
    }
    let joining = backend.encode(&[short])?;
    backend.place(&mut rows, joining, &[1])?;
    for p in 0..2 {
        let logits = backend.step(
            &mut rows,
            &[fed[3 + p], fed[p]],
            &positions(&[3 + p, p]),
            &[LONG_LENGTH, SHORT_LENGTH],
        )?;
        compare(logits.slice(ndarray::s![0..1, ..]), &long_alone[3 + p])?;
        compare(logits.slice(ndarray::s![1..2, ..]), &short_alone[p])?;
    }
    backend.move_row(&mut rows, 1, 0)?;
    backend.truncate(&mut rows, 1)?;
    let logits = backend.step(&mut rows, &[fed[2]], &positions(&[2]), &[SHORT_LENGTH])?;
    compare(logits.view(), &short_alone[2])?;
    Ok(worst)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{CopyBackend, CopyRows, SPECIAL};

    /// A copy backend whose logits shift when it runs more than one row: a model that
    /// leaks between rows.
    struct Leaky(CopyBackend);

    impl Backend for Leaky {
        type Rows = CopyRows;
        type Encoded = CopyRows;
        fn encode(&mut self, sources: &[&[i64]]) -> Result<CopyRows, BackendError> {
            self.0.encode(sources)
        }
        fn split(&self, encoded: CopyRows) -> Vec<CopyRows> {
            self.0.split(encoded)
        }
        fn place(
            &mut self,
            rows: &mut CopyRows,
            new: CopyRows,
            slots: &[usize],
        ) -> Result<(), BackendError> {
            self.0.place(rows, new, slots)
        }
        fn step(
            &mut self,
            rows: &mut CopyRows,
            target_ids: &[i64],
            positions: &[i64],
            target_lengths: &[i64],
        ) -> Result<Array2<f32>, BackendError> {
            let logits = self.0.step(rows, target_ids, positions, target_lengths)?;
            Ok(logits + 0.25 * (target_ids.len() - 1) as f32)
        }
        fn move_row(
            &mut self,
            rows: &mut CopyRows,
            from: usize,
            to: usize,
        ) -> Result<(), BackendError> {
            self.0.move_row(rows, from, to)
        }
        fn truncate(&mut self, rows: &mut CopyRows, width: usize) -> Result<(), BackendError> {
            self.0.truncate(rows, width)
        }
    }

    #[test]
    fn batching_deviation_is_zero_for_independent_rows_and_catches_leaks() {
        // The copy backend checks it is fed its own output, so the two share a prefix.
        let (long, short) = ([5i64, 6, 7, 8, 9, 10, 2], [5i64, 6, 2]);
        let fed = [i64::from(SPECIAL.bos), 5, 6, 7, 8];
        let exact = batching_deviation(&mut CopyBackend::default(), &long, &short, fed).unwrap();
        assert_eq!(exact, 0.0);
        let leaky = batching_deviation(&mut Leaky(CopyBackend::default()), &long, &short, fed);
        assert_eq!(leaky.unwrap(), 0.25);
    }
}
