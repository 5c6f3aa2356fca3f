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
//! `--max-queue-wait`, or that would make an accepted request miss its promise, by replaying
//! that rule forward with what each step costs ([`cost`]); the worker keeps the numbers it
//! decides on (work left, speed) current. A request too costly to finish within the request
//! timeout even alone is refused outright.
//!
//! A job whose client went away (timeout, disconnect) leaves the queue and the batch at the
//! next step, waiting texts and running rows alike; nobody else's rows are touched.

pub mod admission;
pub mod cost;
pub mod job;
pub mod policy;
mod replay;
pub mod worker;

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};
use tracing::Span;

use crate::metrics::WorkerMetrics;
use admission::{least_loaded, AdmissionPolicy, Door, Refusal, MAX_REQUEST_COST_SHARE};
use cost::StepCost;
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
    /// The request timeout: a request whose own work is expected to take longer than
    /// [`MAX_REQUEST_COST_SHARE`] of it, even on an idle model, is refused (413).
    pub request_timeout: Duration,
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
            max_request_cost: self.request_timeout.mul_f64(MAX_REQUEST_COST_SHARE),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TranslateError {
    #[error(
        "this request would take the model about {:.1} s even with nothing else to do, more \
         than the {:.1} s a request may take ({}% of --request-timeout, the rest left for \
         tokenizing, length prediction and the answer); send fewer texts per request, or \
         split long texts into shorter ones",
        expected.as_secs_f64(),
        limit.as_secs_f64(),
        (MAX_REQUEST_COST_SHARE * 100.0).round()
    )]
    TooCostly { expected: Duration, limit: Duration },
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
    #[error(
        "taking this request would make requests the model has already accepted finish later \
         than it expected them to (--max-queue-wait); retry in {} s, when the work it has now \
         should be done",
        retry_after.as_secs()
    )]
    Crowded { retry_after: Duration },
    #[error(
        "at the speed the model was measured at under the load it just had, this request \
         alone would take about {:.1} s, more than the {:.1} s a request may take ({}% of \
         --request-timeout); retry in {} s",
        expected.as_secs_f64(),
        limit.as_secs_f64(),
        (MAX_REQUEST_COST_SHARE * 100.0).round(),
        retry_after.as_secs()
    )]
    SlowNow {
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
            | TranslateError::Busy { retry_after, .. }
            | TranslateError::Crowded { retry_after }
            | TranslateError::SlowNow { retry_after, .. } => Some(*retry_after),
            TranslateError::TooCostly { .. }
            | TranslateError::Stopped
            | TranslateError::Backend(_) => None,
        }
    }
}

impl From<Refusal> for TranslateError {
    fn from(refusal: Refusal) -> Self {
        match refusal {
            Refusal::TooCostly { expected, limit } => TranslateError::TooCostly { expected, limit },
            Refusal::Crowded { retry_after } => TranslateError::Crowded { retry_after },
            Refusal::SlowNow {
                expected,
                limit,
                retry_after,
            } => TranslateError::SlowNow {
                expected,
                limit,
                retry_after,
            },
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
            .map(|backend| {
                let cost = StepCost::new(backend.attention_reads());
                Arc::new(Door::new(config.admission(), cost))
            })
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

    /// Counts `inputs` in at the door of the worker expected to finish its work first, or
    /// says why the door refuses them (see [`admission`]). The request keeps its place in line
    /// while its lengths are predicted; [`Translator::decode`] then sends it, with its real
    /// figures. Dropping the reservation takes it back.
    pub fn reserve(&self, inputs: &[DecodeInput]) -> Result<Reservation, TranslateError> {
        let (worker, _) = least_loaded(&self.doors);
        let door = &self.doors[worker];
        let admitted = door.load().admit(&door.policy, inputs);
        self.metrics
            .expected_queue_wait
            .set(least_loaded(&self.doors).1.as_secs_f64());
        Ok(Reservation {
            door: Arc::clone(door),
            worker,
            id: admitted?,
            sent: false,
        })
    }

    /// Decodes `inputs` (in a running batch, with whoever else is there); results come
    /// back in input order. Refused at once when the door refuses them
    /// ([`Translator::reserve`]). Dropping the future withdraws the job.
    pub async fn translate(&self, inputs: Vec<DecodeInput>) -> Result<Finished, TranslateError> {
        let reservation = self.reserve(&inputs)?;
        self.decode(reservation, inputs).await
    }

    /// Sends a reserved request to its worker with `inputs`, its texts as they are to be
    /// decoded (the reservation may have counted other lengths), and waits for the answer.
    /// Dropping the future withdraws the job.
    pub async fn decode(
        &self,
        mut reservation: Reservation,
        inputs: Vec<DecodeInput>,
    ) -> Result<Finished, TranslateError> {
        reservation.door.load().replace(reservation.id, &inputs);
        self.metrics.queue_depth.inc();
        let (reply, answer) = oneshot::channel();
        let span = Span::current();
        let job = Job {
            inputs,
            id: reservation.id,
            reply,
            queue_span: tracing::info_span!(parent: &span, "queue"),
            span,
            enqueued: Instant::now(),
        };
        if self.senders[reservation.worker].send(job).is_err() {
            // Dropping the reservation takes the job back.
            self.metrics.queue_depth.dec();
            return Err(TranslateError::Stopped);
        }
        // The worker has it: it takes it off the door's load when it is done or abandoned.
        reservation.sent = true;
        // A dropped reply means the worker died mid-request.
        Ok(answer.await.map_err(|_| TranslateError::Stopped)??)
    }
}

/// A request counted in at a worker's door and not yet sent to the worker
/// ([`Translator::reserve`]): dropped before it is sent (its client left while its lengths
/// were predicted, or it timed out), it is taken back.
pub struct Reservation {
    door: Arc<Door>,
    worker: usize,
    id: policy::JobId,
    sent: bool,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if !self.sent {
            self.door.load().withdraw(self.id);
        }
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
            request_timeout: Duration::from_secs(60),
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
        let summed = |rate: fn(&admission::Load) -> f64| -> f64 {
            translator.doors.iter().map(|door| rate(&door.load())).sum()
        };
        let units = summed(|load| load.throughput.per_second());
        assert!((worker_metrics.throughput.get() - units).abs() < 1e-6);
        let tokens = summed(|load| load.tokens.per_second());
        assert!((worker_metrics.token_throughput.get() - tokens).abs() < 1e-6);
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
        cfg.max_queue_wait = Duration::from_millis(30);
        let (translator, _handle) = Translator::spawn(backend, SPECIAL, cfg, metrics()).unwrap();
        // The model is idle: taken, though it alone is expected to take longer than the limit
        // (8 texts of 11 + 20 tokens on 2 rows, about 530 cost units at the prior 1,000 a
        // second: 0.5 s).
        let first = {
            let translator = translator.clone();
            tokio::spawn(async move { translator.translate(vec![long_text(); 8]).await })
        };
        tokio::time::sleep(Duration::from_millis(5)).await;
        // The same again shares the rows with it: about twice that, past the limit, and the
        // first would then miss what it was promised.
        let err = translator
            .translate(vec![long_text(); 8])
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                TranslateError::Busy { .. } | TranslateError::Crowded { .. }
            ),
            "{err}"
        );
        assert!(err.retry_after().unwrap() >= Duration::from_secs(1));
        assert!(err.to_string().contains("--max-queue-wait"), "{err}");
        assert!(first.await.unwrap().is_ok());
        until_drained(&translator).await;
        // Once the work is done, the same request is taken.
        assert!(translator.translate(vec![long_text(); 8]).await.is_ok());
    }

    #[tokio::test]
    async fn a_request_too_costly_even_alone_is_refused_and_reservations_hold_a_place() {
        let mut cfg = config(Batching::Continuous);
        cfg.max_batch_size = 2;
        cfg.max_batch_tokens = 10_000;
        cfg.max_queued_requests = 100;
        cfg.request_timeout = Duration::from_millis(200);
        let (translator, _handle) =
            Translator::spawn(CopyBackend::default(), SPECIAL, cfg, metrics()).unwrap();
        // 64 texts on 2 rows: about 4,200 cost units, 0.4 s even at the speed the model was
        // calibrated at (a cold server judges this at no less), more than 90% of the 0.2 s
        // timeout: refused on the idle model, with why and what to do.
        let err = translator
            .translate(vec![long_text(); 64])
            .await
            .unwrap_err();
        let TranslateError::TooCostly { expected, limit } = &err else {
            panic!("{err}")
        };
        assert_eq!(*limit, Duration::from_millis(180));
        assert!(expected > limit, "{expected:?}");
        assert!(err.retry_after().is_none());
        let message = err.to_string();
        assert!(message.contains("fewer texts"), "{message}");
        // A reservation counts the request in before it is sent: a second request is judged
        // with it there. Dropped unsent, it is taken back.
        let reservation = translator.reserve(&vec![long_text(); 8]).unwrap();
        let door = &translator.doors[0];
        assert_eq!(door.load().queued_requests(), 1);
        drop(reservation);
        assert_eq!(door.load().queued_requests(), 0);
        // Sent with other lengths than it was reserved with, it decodes those.
        let reservation = translator.reserve(&[text(&[4, 5, 6, 7])]).unwrap();
        let finished = translator
            .decode(reservation, vec![text(&[4, 5])])
            .await
            .unwrap();
        assert_eq!(finished.sequences[0].output.ids, vec![4, 5]);
        until_drained(&translator).await;
    }
}
