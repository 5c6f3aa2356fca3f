//! The synchronous model interface the decode loop is written against.
//!
//! A backend owns the model (ONNX Runtime sessions, or a test double) and runs on one worker
//! thread; it is never shared between threads, so `&mut self` everywhere. The running batch in
//! [`crate::decode`] only sees this trait, and continuous batching needs nothing more than its
//! four operations: encode new rows, append them to the running rows, step all rows, drop
//! finished rows.

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

/// One model: an encoder run once per sentence and a decoder run once per output token.
pub trait Backend {
    /// Everything the decoder needs for a set of rows: the encoder memory and the decoder
    /// state. Opaque to the decode loop; row `r` is the `r`-th source passed to
    /// [`Backend::encode`] until [`Backend::retain_rows`] renumbers the rows.
    type Rows;

    /// Runs the encoder on `sources` (token ids, EOS included, no padding) and returns the
    /// rows ready for the first decoder step (empty or zero state).
    fn encode(&mut self, sources: &[&[i64]]) -> Result<Self::Rows, BackendError>;

    /// One decoder step: `target_ids[r]` is the previous token of row `r` (BOS at the first
    /// step) at position `positions[r]`. Updates the rows' state in place and returns the
    /// logits `[rows, vocab]` of the next token.
    fn step(
        &mut self,
        rows: &mut Self::Rows,
        target_ids: &[i64],
        positions: &[i64],
    ) -> Result<Array2<f32>, BackendError>;

    /// Appends `new` (fresh from [`Backend::encode`]) after the rows of `rows`, which may
    /// already have taken steps: the new rows' state must line up with the old rows' cache.
    fn append(&mut self, rows: &mut Self::Rows, new: Self::Rows) -> Result<(), BackendError>;

    /// Keeps only the rows at `keep` (ascending indices into the current rows), in that
    /// order, along axis 0 of every memory and state tensor.
    fn retain_rows(&mut self, rows: &mut Self::Rows, keep: &[usize]) -> Result<(), BackendError>;
}
