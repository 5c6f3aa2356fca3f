//! The model's own threads and the queue in front of them: continuous batching.
//!
//! Handlers never hold a session. They send a [`Job`] down a channel with a oneshot for the
//! answer (text-embeddings-inference's `backends/src/lib.rs` pattern) and the tracing span of
//! their request. The worker thread ([`worker`]) owns the backend and one running batch:
//! between two decoder steps it admits waiting texts while the batch stays within
//! `max_batch_size` rows and `max_batch_tokens` tokens, steps every row, and answers a job once
//! its last text is done. Unlike CTranslate2's static batches, a new request joins the batch
//! that is already running instead of waiting for it to drain.
//!
//! Which waiting text gets the next row is one rule, [`policy`]: texts, not whole jobs, join,
//! each free row going to the waiting job that holds the fewest rows.
//!
//! At the door, [`admission`] refuses requests whose expected finish is past
//! `--max-queue-wait`, by replaying that rule forward; the worker keeps the numbers it decides
//! on (work left, speed) current.
//!
//! A job whose client went away (timeout, disconnect) leaves the queue and the batch at the
//! next step, waiting texts and running rows alike; nobody else's rows are touched.

pub mod admission;
pub mod job;
pub mod policy;
pub mod worker;

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};
use tracing::Span;

use crate::metrics::WorkerMetrics;
use admission::{least_loaded, AdmissionPolicy, Door, Refusal};
use job::Job;
use nmt_engine::backend::{Backend, BackendError};
use nmt_engine::decode::{DecodeInput, SpecialIds};
use worker::{Doors, Worker};

pub use job::{Finished, SequenceResult};
pub use policy::{Batching, RowPolicy};

/// Limits of the queue and the running batch.
#[derive(Clone, Debug)]
pub struct SchedulerConfig {
    pub batching: Batching,
    /// Most rows (texts) in the decoder batch.
    pub max_batch_size: usize,
    /// Most tokens the rows of the batch may reach: source plus output budget, summed.
    pub max_batch_tokens: usize,
    /// Most requests waiting to join the batch; more are refused (429).
    pub max_queued_requests: usize,
    /// Requests expected to finish later than this are refused (429); see [`admission`].
    pub max_queue_wait: Duration,
}

impl SchedulerConfig {
    fn admission(&self) -> AdmissionPolicy {
        AdmissionPolicy {
            rows: RowPolicy {
                batching: self.batching,
                max_batch_size: self.max_batch_size,
                max_batch_tokens: self.max_batch_tokens,
            },
            max_queued_requests: self.max_queued_requests.max(1),
            max_queue_wait: self.max_queue_wait,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TranslateError {
    #[error(
        "the model queue is full ({queued} requests waiting); retry in {} s",
        retry_after.as_secs()
    )]
    QueueFull {
        queued: usize,
        retry_after: Duration,
    },
    #[error(
        "the model would take at least {:.1} s to finish the work it has and this request, more \
         than the {:.1} s allowed (--max-queue-wait); retry in {} s, when the work it has now \
         should be done",
        expected.as_secs_f64(),
        limit.as_secs_f64(),
        retry_after.as_secs()
    )]
    Busy {
        expected: Duration,
        limit: Duration,
        retry_after: Duration,
    },
    #[error("the model worker is not running")]
    Stopped,
    #[error("translation failed: {0}")]
    Backend(#[from] BackendError),
}

impl TranslateError {
    /// When a refused request may expect to be accepted.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            TranslateError::QueueFull { retry_after, .. }
            | TranslateError::Busy { retry_after, .. } => Some(*retry_after),
            TranslateError::Stopped | TranslateError::Backend(_) => None,
        }
    }
}

impl From<Refusal> for TranslateError {
    fn from(refusal: Refusal) -> Self {
        match refusal {
            Refusal::QueueFull {
                queued,
                retry_after,
            } => TranslateError::QueueFull {
                queued,
                retry_after,
            },
            Refusal::TooLong {
                expected,
                limit,
                retry_after,
            } => TranslateError::Busy {
                expected,
                limit,
                retry_after,
            },
        }
    }
}

/// Cheap to clone handle to a model's workers. A worker thread ends when the last handle is
/// dropped and the work already queued on it is done.
///
/// With more than one worker (`--model-workers`), each owns a backend (its own ONNX Runtime
/// sessions) and its own running batch, like CTranslate2's `inter_threads`: a request goes
/// whole to the worker expected to finish its accepted work first, so concurrent requests
/// spread over the workers and each batch runs on its own core.
#[derive(Clone)]
pub struct Translator {
    /// Each worker's queue, by worker.
    senders: Arc<[mpsc::UnboundedSender<Job>]>,
    doors: Doors,
    metrics: WorkerMetrics,
}

impl Translator {
    /// Moves `backend` onto a new thread named `model-worker`.
    pub fn spawn<B>(
        backend: B,
        special: SpecialIds,
        config: SchedulerConfig,
        metrics: WorkerMetrics,
    ) -> std::io::Result<(Self, JoinHandle<()>)>
    where
        B: Backend + Send + 'static,
    {
        let (translator, mut handles) =
            Self::spawn_workers(vec![backend], special, config, metrics)?;
        Ok((translator, handles.remove(0)))
    }

    /// One worker thread per backend, named `model-worker-<i>`.
    pub fn spawn_workers<B>(
        backends: Vec<B>,
        special: SpecialIds,
        config: SchedulerConfig,
        metrics: WorkerMetrics,
    ) -> std::io::Result<(Self, Vec<JoinHandle<()>>)>
    where
        B: Backend + Send + 'static,
    {
        if backends.is_empty() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "a model needs at least one worker",
            ));
        }
        let doors: Doors = backends
            .iter()
            .map(|_| Arc::new(Door::new(config.admission())))
            .collect();
        let mut senders = Vec::with_capacity(backends.len());
        let mut handles = Vec::with_capacity(backends.len());
        for (index, backend) in backends.into_iter().enumerate() {
            let (sender, receiver) = mpsc::unbounded_channel();
            senders.push(sender);
            let (metrics, doors) = (metrics.clone(), doors.clone());
            // The batch is created on the worker thread: the backend's rows need not be `Send`.
            let start = move || Worker::new(backend, special, metrics, doors, index, receiver);
            handles.push(
                std::thread::Builder::new()
                    .name(format!("model-worker-{index}"))
                    .spawn(move || start().run())?,
            );
        }
        Ok((
            Translator {
                senders: senders.into(),
                doors,
                metrics,
            },
            handles,
        ))
    }

    /// Whether the door would take `inputs` now (see [`admission::Load::check`]).
    pub fn check(&self, inputs: &[DecodeInput]) -> Result<(), TranslateError> {
        let door = &self.doors[least_loaded(&self.doors).0];
        Ok(door.load().check(&door.policy, inputs)?)
    }

    /// Decodes `inputs` (in a running batch, with whoever else is there); results come
    /// back in input order. Refused at once when the model would not finish it within
    /// `--max-queue-wait`, or too many requests wait. Dropping the future withdraws the job.
    pub async fn translate(&self, inputs: Vec<DecodeInput>) -> Result<Finished, TranslateError> {
        let (worker, _) = least_loaded(&self.doors);
        let door = &self.doors[worker];
        let id = {
            let admitted = door.load().admit(&door.policy, &inputs);
            self.metrics
                .expected_queue_wait
                .set(least_loaded(&self.doors).1.as_secs_f64());
            admitted?
        };
        self.metrics.queue_depth.inc();
        let (reply, answer) = oneshot::channel();
        let span = Span::current();
        let job = Job {
            inputs,
            id,
            reply,
            queue_span: tracing::info_span!(parent: &span, "queue"),
            span,
            enqueued: Instant::now(),
        };
        if let Err(mpsc::error::SendError(job)) = self.senders[worker].send(job) {
            door.load().withdraw(job.id);
            self.metrics.queue_depth.dec();
            return Err(TranslateError::Stopped);
        }
        // A dropped reply means the worker died mid-request.
        Ok(answer.await.map_err(|_| TranslateError::Stopped)??)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Metrics;
    use nmt_engine::testing::{CopyBackend, SPECIAL};
    use std::sync::Mutex;

    pub(in crate::scheduler) fn metrics() -> WorkerMetrics {
        Metrics::new().worker("test")
    }

    pub(in crate::scheduler) fn config(batching: Batching) -> SchedulerConfig {
        SchedulerConfig {
            batching,
            max_batch_size: 8,
            max_batch_tokens: 1000,
            max_queued_requests: 4,
            max_queue_wait: Duration::from_secs(60),
        }
    }

    pub(in crate::scheduler) fn text(words: &[i64]) -> DecodeInput {
        let mut ids = words.to_vec();
        ids.push(SPECIAL.eos.into());
        DecodeInput::new(ids, 20)
    }

    /// Ten words: 11 decoder steps.
    pub(in crate::scheduler) fn long_text() -> DecodeInput {
        text(&[4, 5, 6, 7, 8, 9, 10, 11, 12, 13])
    }

    #[tokio::test]
    async fn decodes_on_the_worker_and_stops_when_handles_drop() {
        let (translator, handle) = Translator::spawn(
            CopyBackend::default(),
            SPECIAL,
            config(Batching::Continuous),
            metrics(),
        )
        .unwrap();
        let out = translator
            .translate(vec![text(&[4, 5]), text(&[6])])
            .await
            .unwrap();
        assert_eq!(out.sequences[0].output.ids, vec![4, 5]);
        assert_eq!(out.sequences[1].output.ids, vec![6]);
        drop(translator);
        tokio::task::spawn_blocking(move || handle.join().unwrap())
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn small_requests_beside_a_large_one_are_answered_first() {
        let backend = CopyBackend {
            step_delay: Duration::from_millis(5),
            ..Default::default()
        };
        let mut cfg = config(Batching::Continuous);
        cfg.max_batch_size = 4;
        cfg.max_queued_requests = 16;
        let (translator, _handle) = Translator::spawn(backend, SPECIAL, cfg, metrics()).unwrap();
        let done = Arc::new(Mutex::new(Vec::new()));
        let send = |name: &'static str, inputs: Vec<DecodeInput>| {
            let (translator, done) = (translator.clone(), done.clone());
            tokio::spawn(async move {
                let finished = translator.translate(inputs).await.unwrap();
                done.lock().unwrap().push(name);
                finished
            })
        };
        // 16 texts over 4 rows: about 44 steps. The small ones need 2 to 3 steps each once
        // they hold a row.
        let large = send("large", vec![long_text(); 16]);
        tokio::time::sleep(Duration::from_millis(20)).await;
        let small: Vec<_> = (0..6).map(|_| send("small", vec![text(&[4, 5])])).collect();
        for request in small {
            assert_eq!(request.await.unwrap().sequences[0].output.ids, vec![4, 5]);
        }
        let large = large.await.unwrap();
        assert_eq!(large.sequences.len(), 16);
        assert!(large
            .sequences
            .iter()
            .all(|s| s.output.ids == vec![4, 5, 6, 7, 8, 9, 10, 11, 12, 13]));
        let done = done.lock().unwrap().clone();
        assert_eq!(done.last(), Some(&"large"), "{done:?}");
    }

    /// Waits until the door's load is empty: a job leaves it at the end of the worker's turn,
    /// after its reply went out.
    async fn until_drained(translator: &Translator) {
        let busy = || {
            translator.doors.iter().any(|door| {
                let load = door.load();
                load.queued_requests() + load.batch_rows() > 0
            })
        };
        while busy() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    #[tokio::test]
    async fn concurrent_requests_spread_over_the_workers_and_the_gauges_sum_them() {
        let backend = || CopyBackend {
            step_delay: Duration::from_millis(5),
            ..Default::default()
        };
        let worker_metrics = metrics();
        let (translator, handles) = Translator::spawn_workers(
            vec![backend(), backend()],
            SPECIAL,
            config(Batching::Continuous),
            worker_metrics.clone(),
        )
        .unwrap();
        let requests: Vec<_> = (0..2)
            .map(|_| {
                let translator = translator.clone();
                tokio::spawn(async move { translator.translate(vec![long_text(); 3]).await })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(20)).await;
        // The second request found the first worker busy and went to the idle one.
        for door in translator.doors.iter() {
            assert_eq!(door.load().batch_rows(), 3);
        }
        assert_eq!(worker_metrics.sequences_in_flight.get(), 6);
        for request in requests {
            let out = request.await.unwrap().unwrap();
            assert!(out.sequences.iter().all(|s| s.output.ids.len() == 10));
        }
        until_drained(&translator).await;
        let summed: f64 = translator
            .doors
            .iter()
            .map(|door| door.load().throughput.tokens_per_second())
            .sum();
        assert!((worker_metrics.throughput.get() - summed).abs() < 1e-6);
        assert_eq!(worker_metrics.sequences_in_flight.get(), 0);
        drop(translator);
        for handle in handles {
            tokio::task::spawn_blocking(move || handle.join().unwrap())
                .await
                .unwrap();
        }
    }

    #[tokio::test]
    async fn a_full_queue_refuses_and_backend_failures_surface() {
        let (translator, _handle) = Translator::spawn(
            CopyBackend {
                fail: true,
                ..Default::default()
            },
            SPECIAL,
            config(Batching::Continuous),
            metrics(),
        )
        .unwrap();
        let err = translator.translate(vec![text(&[4])]).await.unwrap_err();
        assert!(matches!(err, TranslateError::Backend(_)), "{err}");

        until_drained(&translator).await;
        // Four requests the worker never hears of fill the queue; the fifth is refused.
        {
            let door = &translator.doors[0];
            let mut load = door.load();
            for _ in 0..4 {
                load.admit(&door.policy, &[text(&[4])]).unwrap();
            }
        }
        let err = translator.translate(vec![text(&[4])]).await.unwrap_err();
        assert!(
            matches!(err, TranslateError::QueueFull { queued: 4, .. }),
            "{err}"
        );
        assert!(err.retry_after().unwrap() >= Duration::from_secs(1));
    }

    #[tokio::test]
    async fn a_request_expected_to_finish_too_late_is_refused_at_the_door() {
        let backend = CopyBackend {
            step_delay: Duration::from_millis(10),
            ..Default::default()
        };
        let mut cfg = config(Batching::Continuous);
        cfg.max_batch_size = 2;
        cfg.max_queue_wait = Duration::from_millis(100);
        let (translator, _handle) = Translator::spawn(backend, SPECIAL, cfg, metrics()).unwrap();
        // The model is idle: taken, though it alone is expected to take longer than the limit
        // (8 texts of 11 + 20 tokens at the prior 500 tokens/s: 0.5 s).
        let first = {
            let translator = translator.clone();
            tokio::spawn(async move { translator.translate(vec![long_text(); 8]).await })
        };
        tokio::time::sleep(Duration::from_millis(5)).await;
        // The same again shares the rows with it: about twice that.
        let err = translator
            .translate(vec![long_text(); 8])
            .await
            .unwrap_err();
        let TranslateError::Busy {
            expected, limit, ..
        } = &err
        else {
            panic!("{err}")
        };
        assert_eq!(*limit, Duration::from_millis(100));
        assert!(expected > limit, "{expected:?}");
        assert!(err.to_string().contains("--max-queue-wait"), "{err}");
        assert!(first.await.unwrap().is_ok());
        until_drained(&translator).await;
        // Once the work is done, the same request is taken.
        assert!(translator.translate(vec![long_text(); 8]).await.is_ok());
    }
}
