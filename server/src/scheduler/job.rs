//! A request's texts on their way to a worker, and the answer that comes back.

use std::time::{Duration, Instant};

use tokio::sync::oneshot;
use tracing::Span;

use super::policy::JobId;
use nmt_engine::backend::BackendError;
use nmt_engine::decode::{DecodeInput, DecodeOutput};

/// One text's result.
#[derive(Clone, Debug)]
pub struct SequenceResult {
    pub output: DecodeOutput,
    /// From joining the batch to its last token.
    pub decode_time: Duration,
}

/// A job's answer: one result per input, in input order, and where the time went.
#[derive(Clone, Debug)]
pub struct Finished {
    pub sequences: Vec<SequenceResult>,
    /// From `Translator::translate` to its first text joining the batch.
    pub queue_time: Duration,
    /// From its first text joining the batch to the last text's last token.
    pub inference_time: Duration,
}

pub type Reply = oneshot::Sender<Result<Finished, BackendError>>;

/// A request accepted at the door, sent down its worker's queue.
pub struct Job {
    pub inputs: Vec<DecodeInput>,
    /// Its number in the door's load.
    pub id: JobId,
    pub reply: Reply,
    /// The request's span: the worker's spans for this job are its children.
    pub span: Span,
    /// Open while the job waits; closing it logs the queue time.
    pub queue_span: Span,
    pub enqueued: Instant,
}
