//! The model's own thread and the queue in front of it: continuous batching.
//!
//! Handlers never hold a session. They send a [`Job`] down a channel with a oneshot for the
//! answer (text-embeddings-inference's `backends/src/lib.rs` pattern) and the tracing span of
//! their request. The worker thread owns the backend and one [`RunningBatch`]: between two
//! decoder steps it admits waiting jobs (first come, first served) while the batch stays
//! within `max_batch_size` rows and `max_batch_tokens` tokens, steps every row, and answers
//! a job once its last text is done. Unlike CTranslate2's static batches, a new request joins
//! the batch that is already running instead of waiting for it to drain.
//!
//! A job whose client went away (timeout, disconnect) leaves the queue or the batch at the
//! next step; nobody else's rows are touched.

use std::collections::{HashMap, VecDeque};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use prometheus::{Histogram, IntGauge};
use tokio::sync::{mpsc, oneshot};
use tracing::Span;

use crate::backend::{Backend, BackendError};
use crate::decode::{DecodeInput, DecodeOutput, RunningBatch, SpecialIds};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Batching {
    /// Requests join the running decoder batch between steps.
    Continuous,
    /// One request at a time (its own texts still decode together): the baseline the
    /// benchmark compares against.
    Off,
}

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
}

#[derive(Debug, thiserror::Error)]
pub enum TranslateError {
    #[error("the model queue is full ({0} requests waiting); retry later")]
    Overloaded(usize),
    #[error("the model worker is not running")]
    Stopped,
    #[error("translation failed: {0}")]
    Backend(#[from] BackendError),
}

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
    /// From [`Translator::translate`] to joining the batch.
    pub queue_time: Duration,
    /// From joining the batch to the last text's last token.
    pub inference_time: Duration,
}

struct Job {
    inputs: Vec<DecodeInput>,
    reply: oneshot::Sender<Result<Finished, BackendError>>,
    /// The request's span: the worker's spans for this job are its children.
    span: Span,
    /// Open while the job waits; closing it logs the queue time.
    queue_span: Span,
    enqueued: Instant,
}

/// Metric handles bound to one model's labels.
#[derive(Clone)]
pub struct WorkerMetrics {
    pub batch_size: Histogram,
    pub queue_depth: IntGauge,
    pub sequences_in_flight: IntGauge,
}

/// Cheap to clone handle to the model worker. The worker thread ends when the last handle
/// is dropped and the work already queued is done.
#[derive(Clone)]
pub struct Translator {
    sender: mpsc::UnboundedSender<Job>,
    queued: Arc<AtomicUsize>,
    max_queued: usize,
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
        let (sender, receiver) = mpsc::unbounded_channel();
        let queued = Arc::new(AtomicUsize::new(0));
        let translator = Translator {
            sender,
            queued: queued.clone(),
            max_queued: config.max_queued_requests.max(1),
            metrics: metrics.clone(),
        };
        // The batch is created on the worker thread: the backend's rows need not be `Send`.
        let start = move || Worker {
            backend,
            special,
            config,
            metrics,
            queued,
            receiver,
            waiting: VecDeque::new(),
            active: HashMap::new(),
            next_job: 0,
            batch: RunningBatch::default(),
            batch_tokens: 0,
        };
        let handle = std::thread::Builder::new()
            .name("model-worker".into())
            .spawn(move || start().run())?;
        Ok((translator, handle))
    }

    /// Decodes `inputs` (in the running batch, with whoever else is there); results come
    /// back in input order. Dropping the future withdraws the job.
    pub async fn translate(&self, inputs: Vec<DecodeInput>) -> Result<Finished, TranslateError> {
        let max = self.max_queued;
        self.queued
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .map_err(|_| TranslateError::Overloaded(max))?;
        self.metrics.queue_depth.inc();
        let (reply, answer) = oneshot::channel();
        let span = Span::current();
        let job = Job {
            inputs,
            reply,
            queue_span: tracing::info_span!(parent: &span, "queue"),
            span,
            enqueued: Instant::now(),
        };
        if self.sender.send(job).is_err() {
            self.queued.fetch_sub(1, Ordering::AcqRel);
            self.metrics.queue_depth.dec();
            return Err(TranslateError::Stopped);
        }
        // A dropped reply means the worker died mid-request.
        Ok(answer.await.map_err(|_| TranslateError::Stopped)??)
    }
}

/// A job in the batch.
struct ActiveJob {
    reply: oneshot::Sender<Result<Finished, BackendError>>,
    results: Vec<Option<SequenceResult>>,
    budgets: Vec<usize>,
    remaining: usize,
    queue_time: Duration,
    admitted: Instant,
    /// Open while the job's texts decode.
    decode_span: Span,
}

/// Rows are tagged with (job, text index).
type Tag = (u64, usize);

struct Worker<B: Backend> {
    backend: B,
    special: SpecialIds,
    config: SchedulerConfig,
    metrics: WorkerMetrics,
    queued: Arc<AtomicUsize>,
    receiver: mpsc::UnboundedReceiver<Job>,
    waiting: VecDeque<Job>,
    active: HashMap<u64, ActiveJob>,
    next_job: u64,
    batch: RunningBatch<B, Tag>,
    /// Sum of the token budgets of the rows in the batch.
    batch_tokens: usize,
}

/// Runs `f`, turning a panic into a backend error: a bug in the loop fails the jobs at
/// hand, not the worker.
fn guarded<T>(f: impl FnOnce() -> Result<T, BackendError>) -> Result<T, BackendError> {
    std::panic::catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|panic| {
        let message = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".into());
        Err(BackendError::Inference(format!(
            "decode loop panicked: {message}"
        )))
    })
}

impl<B: Backend> Worker<B> {
    fn run(mut self) {
        loop {
            if self.batch.is_empty() && self.waiting.is_empty() {
                match self.receiver.blocking_recv() {
                    Some(job) => self.waiting.push_back(job),
                    None => break,
                }
            }
            while let Ok(job) = self.receiver.try_recv() {
                self.waiting.push_back(job);
            }
            self.turn();
        }
        tracing::debug!("model worker stopped");
    }

    /// One turn of the loop: the queue and the batch lose abandoned jobs, waiting jobs join,
    /// and every row takes one step.
    fn turn(&mut self) {
        self.drop_abandoned();
        self.admit();
        if self.batch.is_empty() {
            return;
        }
        self.metrics.batch_size.observe(self.batch.rows() as f64);
        self.metrics
            .sequences_in_flight
            .set(self.batch.len() as i64);
        let special = self.special;
        let (backend, batch) = (&mut self.backend, &mut self.batch);
        match guarded(|| batch.step(backend, special)) {
            Ok(finished) => {
                // Before the replies: a client holding its answer must not still count
                // itself in flight.
                self.metrics
                    .sequences_in_flight
                    .set(self.batch.len() as i64);
                for (tag, output) in finished {
                    self.finish_sequence(tag, output);
                }
            }
            Err(error) => self.fail_batch(error),
        }
        self.metrics
            .sequences_in_flight
            .set(self.batch.len() as i64);
    }

    fn dequeue(&self, count: usize) {
        self.queued.fetch_sub(count, Ordering::AcqRel);
        self.metrics.queue_depth.sub(count as i64);
    }

    /// Jobs whose client left: out of the queue, and their rows out of the batch.
    fn drop_abandoned(&mut self) {
        let before = self.waiting.len();
        self.waiting.retain(|job| !job.reply.is_closed());
        self.dequeue(before - self.waiting.len());

        let gone: Vec<u64> = self
            .active
            .iter()
            .filter(|(_, job)| job.reply.is_closed())
            .map(|(&id, _)| id)
            .collect();
        if gone.is_empty() {
            return;
        }
        let (backend, batch) = (&mut self.backend, &mut self.batch);
        match guarded(|| batch.cancel(backend, |(job, _)| gone.contains(job))) {
            Ok(removed) => {
                for (job, text) in removed {
                    self.batch_tokens -= self.active[&job].budgets[text];
                }
                for id in gone {
                    let job = self.active.remove(&id).expect("gone jobs are active");
                    job.decode_span
                        .in_scope(|| tracing::info!("client went away; its texts left the batch"));
                }
            }
            Err(error) => self.fail_batch(error),
        }
    }

    /// Moves waiting jobs into the batch, first come first served, while they fit.
    fn admit(&mut self) {
        let mut joining: Vec<(Tag, DecodeInput)> = Vec::new();
        let mut admitted = Vec::new();
        while let Some(job) = self.waiting.front() {
            let rows = job.inputs.len();
            let tokens: usize = job.inputs.iter().map(DecodeInput::token_budget).sum();
            let rows_before = self.batch.len() + joining.len();
            // Alone, any job runs: one larger than the limits must not starve.
            let fits = rows_before == 0
                || (self.config.batching == Batching::Continuous
                    && rows_before + rows <= self.config.max_batch_size
                    && self.batch_tokens + tokens <= self.config.max_batch_tokens);
            if !fits {
                break;
            }
            let job = self.waiting.pop_front().expect("front exists");
            let id = self.next_job;
            self.next_job += 1;
            self.batch_tokens += tokens;
            let now = Instant::now();
            let budgets: Vec<usize> = job.inputs.iter().map(DecodeInput::token_budget).collect();
            joining.extend(
                job.inputs
                    .into_iter()
                    .enumerate()
                    .map(|(text, input)| ((id, text), input)),
            );
            drop(job.queue_span);
            let decode_span = tracing::info_span!(parent: &job.span, "decode", texts = rows);
            admitted.push(id);
            self.active.insert(
                id,
                ActiveJob {
                    reply: job.reply,
                    results: vec![None; rows],
                    budgets,
                    remaining: rows,
                    queue_time: now - job.enqueued,
                    admitted: now,
                    decode_span,
                },
            );
        }
        if admitted.is_empty() {
            return;
        }
        self.dequeue(admitted.len());
        let encode_spans: Vec<Span> = admitted
            .iter()
            .map(|id| {
                let parent = &self.active[id].decode_span;
                tracing::info_span!(parent: parent, "encode", joining = joining.len())
            })
            .collect();
        let (backend, batch) = (&mut self.backend, &mut self.batch);
        let result = guarded(|| batch.join(backend, joining));
        drop(encode_spans);
        match result {
            Ok(finished) => {
                for (tag, output) in finished {
                    self.finish_sequence(tag, output);
                }
            }
            Err(error) => {
                // The running rows are intact (a failed join stores nothing); only the
                // jobs that tried to join fail.
                for id in admitted {
                    self.fail_job(id, &error);
                }
            }
        }
    }

    fn finish_sequence(&mut self, (id, text): Tag, output: DecodeOutput) {
        let Some(job) = self.active.get_mut(&id) else {
            return;
        };
        self.batch_tokens -= job.budgets[text];
        job.results[text] = Some(SequenceResult {
            output,
            decode_time: job.admitted.elapsed(),
        });
        job.remaining -= 1;
        if job.remaining > 0 {
            return;
        }
        let job = self.active.remove(&id).expect("present");
        let finished = Finished {
            sequences: job
                .results
                .into_iter()
                .map(|r| r.expect("every text finished"))
                .collect(),
            queue_time: job.queue_time,
            inference_time: job.admitted.elapsed(),
        };
        // The client may have gone between the last check and now: nothing to do then.
        let _ = job.reply.send(Ok(finished));
    }

    fn fail_job(&mut self, id: u64, error: &BackendError) {
        if let Some(job) = self.active.remove(&id) {
            job.decode_span.in_scope(|| tracing::error!("{error}"));
            let budget: usize = job
                .results
                .iter()
                .zip(&job.budgets)
                .filter(|(r, _)| r.is_none())
                .map(|(_, b)| b)
                .sum();
            self.batch_tokens = self.batch_tokens.saturating_sub(budget);
            let _ = job.reply.send(Err(error.clone()));
        }
    }

    /// A decoder step failed: the rows cannot be told apart any more, so every job in the
    /// batch fails and the batch starts afresh. Queued jobs are untouched.
    fn fail_batch(&mut self, error: BackendError) {
        let tags = self.batch.clear();
        let mut jobs: Vec<u64> = tags.into_iter().map(|(id, _)| id).collect();
        jobs.sort_unstable();
        jobs.dedup();
        for id in jobs {
            self.fail_job(id, &error);
        }
        self.batch_tokens = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::testing::{CopyBackend, SPECIAL};
    use crate::metrics::Metrics;

    fn metrics() -> WorkerMetrics {
        Metrics::new().worker("test")
    }

    fn config(batching: Batching) -> SchedulerConfig {
        SchedulerConfig {
            batching,
            max_batch_size: 8,
            max_batch_tokens: 1000,
            max_queued_requests: 4,
        }
    }

    fn text(words: &[i64]) -> DecodeInput {
        let mut ids = words.to_vec();
        ids.push(SPECIAL.eos.into());
        DecodeInput::new(ids, 20)
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

    type Answer = oneshot::Receiver<Result<Finished, BackendError>>;

    /// A worker that is not running, with `jobs` waiting.
    fn worker_with(
        config: SchedulerConfig,
        jobs: &[Vec<DecodeInput>],
    ) -> (Worker<CopyBackend>, Vec<Answer>) {
        let (_sender, receiver) = mpsc::unbounded_channel();
        let mut worker = Worker {
            backend: CopyBackend::default(),
            special: SPECIAL,
            config,
            metrics: metrics(),
            queued: Arc::new(AtomicUsize::new(jobs.len())),
            receiver,
            waiting: VecDeque::new(),
            active: HashMap::new(),
            next_job: 0,
            batch: RunningBatch::default(),
            batch_tokens: 0,
        };
        let mut answers = Vec::new();
        for inputs in jobs {
            let (reply, answer) = oneshot::channel();
            answers.push(answer);
            worker.waiting.push_back(Job {
                inputs: inputs.clone(),
                reply,
                span: Span::none(),
                queue_span: Span::none(),
                enqueued: Instant::now(),
            });
        }
        (worker, answers)
    }

    #[test]
    fn waiting_jobs_join_the_running_batch_within_the_limits() {
        let jobs = vec![
            vec![text(&[4, 5, 6, 7, 8])],
            vec![text(&[9]), text(&[10, 11])],
            vec![text(&[12, 13, 14])],
            vec![text(&[15])],
        ];
        let mut cfg = config(Batching::Continuous);
        cfg.max_batch_size = 3;
        let (mut worker, mut answers) = worker_with(cfg, &jobs);
        worker.admit();
        // Jobs 0 and 1 fill the three rows; job 2 waits.
        assert_eq!(worker.batch.len(), 3);
        assert_eq!(worker.waiting.len(), 2);
        assert_eq!(worker.queued.load(Ordering::SeqCst), 2);
        let mut steps = 0;
        while !worker.batch.is_empty() || !worker.waiting.is_empty() {
            worker.turn();
            steps += 1;
        }
        // A text of n words takes n + 1 steps (the last one gives EOS). Job 1's texts leave
        // after steps 2 and 3, and jobs 2 and 3 take their rows while job 0 still runs: 6
        // steps in all, where one request at a time would take 6 + 3 + 4 + 2.
        assert_eq!(steps, 6);
        assert_eq!(worker.backend.step_sizes, vec![3, 3, 3, 3, 3, 2]);
        let ids = |answer: &mut Answer| -> Vec<Vec<u32>> {
            let finished: Finished = answer.try_recv().unwrap().unwrap();
            finished
                .sequences
                .into_iter()
                .map(|s| s.output.ids)
                .collect()
        };
        assert_eq!(ids(&mut answers[0]), vec![vec![4, 5, 6, 7, 8]]);
        assert_eq!(ids(&mut answers[1]), vec![vec![9], vec![10, 11]]);
        assert_eq!(ids(&mut answers[2]), vec![vec![12, 13, 14]]);
        assert_eq!(ids(&mut answers[3]), vec![vec![15]]);
        assert_eq!(worker.batch_tokens, 0);
    }

    #[test]
    fn without_batching_one_request_runs_at_a_time() {
        let jobs = vec![vec![text(&[4, 5])], vec![text(&[6])]];
        let (mut worker, _answers) = worker_with(config(Batching::Off), &jobs);
        worker.admit();
        assert_eq!(worker.batch.len(), 1);
        assert_eq!(worker.waiting.len(), 1);
    }

    #[test]
    fn abandoned_jobs_leave_the_queue_and_the_batch() {
        let jobs = vec![
            vec![text(&[4, 5, 6])],
            vec![text(&[7, 8, 9])],
            vec![text(&[10])],
        ];
        let mut cfg = config(Batching::Continuous);
        cfg.max_batch_size = 2;
        let (mut worker, mut answers) = worker_with(cfg, &jobs);
        worker.turn();
        // The clients of job 1 (running) and job 2 (waiting) give up.
        answers.truncate(1);
        worker.drop_abandoned();
        assert_eq!(worker.batch.len(), 1);
        assert!(worker.waiting.is_empty());
        assert_eq!(worker.queued.load(Ordering::SeqCst), 0);
        while !worker.batch.is_empty() {
            worker.turn();
        }
        let finished = answers[0].try_recv().unwrap().unwrap();
        assert_eq!(finished.sequences[0].output.ids, vec![4, 5, 6]);
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

        // Fill the queue's four slots by hand; the fifth request is refused.
        translator.queued.store(4, Ordering::SeqCst);
        let err = translator.translate(vec![text(&[4])]).await.unwrap_err();
        assert!(matches!(err, TranslateError::Overloaded(4)), "{err}");
    }
}
