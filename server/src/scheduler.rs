//! The model's own thread and the queue in front of it: continuous batching.
//!
//! Handlers never hold a session. They send a [`Job`] down a channel with a oneshot for the
//! answer (text-embeddings-inference's `backends/src/lib.rs` pattern) and the tracing span of
//! their request. The worker thread owns the backend and one [`RunningBatch`]: between two
//! decoder steps it admits waiting texts while the batch stays within `max_batch_size` rows and
//! `max_batch_tokens` tokens, steps every row, and answers a job once its last text is done.
//! Unlike CTranslate2's static batches, a new request joins the batch that is already running
//! instead of waiting for it to drain.
//!
//! Texts, not whole jobs, join the batch: a request larger than the free rows does not wait
//! for the batch to drain, and does not hold the rows of everyone behind it. Each free row goes
//! to the waiting job that holds the fewest rows, the earliest of those on a tie (a job's own
//! texts join in order). So a request behind a big one gets the next free row, since the big
//! one holds rows and it holds none; the big one keeps the rows it has and takes more as they
//! free up, and when it holds none it is the earliest of those that hold none, so it always
//! advances. With FIFO by arrival instead, a small request waited for every text of the
//! requests ahead of it. Without batching a job joins whole, alone.
//!
//! At the door, [`crate::admission`] refuses requests whose expected finish is past
//! `--max-queue-wait`; the worker keeps the numbers it decides on (work left, speed) current.
//!
//! A job whose client went away (timeout, disconnect) leaves the queue and the batch at the
//! next step, waiting texts and running rows alike; nobody else's rows are touched.

use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use prometheus::{Gauge, Histogram, IntGauge};
use tokio::sync::{mpsc, oneshot};
use tracing::Span;

use crate::admission::{AdmissionPolicy, FinishedText, JobId, Load, Progress, Refusal};
use nmt_engine::backend::{Backend, BackendError};
use nmt_engine::decode::{DecodeInput, DecodeOutput, RunningBatch, SpecialIds};

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
    /// Requests expected to finish later than this are refused (429); see
    /// [`crate::admission`].
    pub max_queue_wait: Duration,
}

impl SchedulerConfig {
    fn admission(&self) -> AdmissionPolicy {
        AdmissionPolicy {
            batching: self.batching,
            max_batch_size: self.max_batch_size,
            max_batch_tokens: self.max_batch_tokens,
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
    /// From [`Translator::translate`] to its first text joining the batch.
    pub queue_time: Duration,
    /// From its first text joining the batch to the last text's last token.
    pub inference_time: Duration,
}

type Reply = oneshot::Sender<Result<Finished, BackendError>>;

struct Job {
    inputs: Vec<DecodeInput>,
    /// Its number in the door's load.
    id: JobId,
    reply: Reply,
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
    pub expected_queue_wait: Gauge,
    pub throughput: Gauge,
    pub admission_lateness: Gauge,
}

/// What the door and the worker share.
struct Shared {
    load: Mutex<Load>,
    policy: AdmissionPolicy,
}

impl Shared {
    fn load(&self) -> MutexGuard<'_, Load> {
        // The load is plain numbers, consistent after any statement: a panic elsewhere while
        // it was held leaves nothing half-done.
        self.load.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Every worker's door, by worker: a worker reads the others' to publish the model's gauges.
type Peers = Arc<[Arc<Shared>]>;

/// The worker a new request goes to, and how long it would expect to wait there: the one
/// expected to finish its accepted work first (the first on a tie, so a lone client keeps to
/// one worker).
fn least_loaded(peers: &[Arc<Shared>]) -> (usize, Duration) {
    peers
        .iter()
        .map(|peer| peer.load().expected_wait())
        .enumerate()
        .min_by_key(|&(_, wait)| wait)
        .unwrap_or_default()
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
    peers: Peers,
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
        let peers: Peers = backends
            .iter()
            .map(|_| {
                Arc::new(Shared {
                    load: Mutex::new(Load::default()),
                    policy: config.admission(),
                })
            })
            .collect();
        let mut senders = Vec::with_capacity(backends.len());
        let mut handles = Vec::with_capacity(backends.len());
        for (index, backend) in backends.into_iter().enumerate() {
            let (sender, receiver) = mpsc::unbounded_channel();
            senders.push(sender);
            let (config, metrics, peers) = (config.clone(), metrics.clone(), peers.clone());
            // The batch is created on the worker thread: the backend's rows need not be `Send`.
            let start =
                move || Worker::new(backend, special, config, metrics, peers, index, receiver);
            handles.push(
                std::thread::Builder::new()
                    .name(format!("model-worker-{index}"))
                    .spawn(move || start().run())?,
            );
        }
        Ok((
            Translator {
                senders: senders.into(),
                peers,
                metrics,
            },
            handles,
        ))
    }

    /// Whether the door would take `inputs` now (see [`Load::check`]).
    pub fn check(&self, inputs: &[DecodeInput]) -> Result<(), TranslateError> {
        let shared = &self.peers[least_loaded(&self.peers).0];
        Ok(shared.load().check(&shared.policy, inputs)?)
    }

    /// Decodes `inputs` (in a running batch, with whoever else is there); results come
    /// back in input order. Refused at once when the model would not finish it within
    /// `--max-queue-wait`, or too many requests wait. Dropping the future withdraws the job.
    pub async fn translate(&self, inputs: Vec<DecodeInput>) -> Result<Finished, TranslateError> {
        let (worker, _) = least_loaded(&self.peers);
        let shared = &self.peers[worker];
        let id = {
            let admitted = shared.load().admit(&shared.policy, &inputs);
            self.metrics
                .expected_queue_wait
                .set(least_loaded(&self.peers).1.as_secs_f64());
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
            shared.load().withdraw(job.id);
            self.metrics.queue_depth.dec();
            return Err(TranslateError::Stopped);
        }
        // A dropped reply means the worker died mid-request.
        Ok(answer.await.map_err(|_| TranslateError::Stopped)??)
    }
}

/// Where one text of a job is.
enum Text {
    Waiting(DecodeInput),
    /// In the batch (or joining it) since `joined`.
    Running {
        joined: Instant,
    },
    Done(SequenceResult),
}

/// Sizes of one text, for the batch's token count and the load.
#[derive(Clone, Copy)]
struct TextSize {
    /// Source plus output budget: what it counts against `max_batch_tokens`.
    budget: usize,
    source: usize,
    max_output: usize,
}

/// A job the worker has received and not yet answered.
struct ActiveJob {
    reply: Reply,
    span: Span,
    /// Open until the first text joins.
    queue_span: Option<Span>,
    /// Open from the first text joining until the job is answered.
    decode_span: Option<Span>,
    enqueued: Instant,
    /// When the first text joined.
    admitted: Option<Instant>,
    texts: Vec<Text>,
    sizes: Vec<TextSize>,
    /// Texts join in order: those from this index on are waiting.
    next: usize,
    /// Texts in the batch.
    rows: usize,
    /// Texts not done.
    remaining: usize,
}

impl ActiveJob {
    fn waiting(&self) -> bool {
        self.next < self.texts.len()
    }
}

/// A worker's share of the model's summed gauges, as it last added it.
#[derive(Default)]
struct Published {
    in_flight: i64,
    throughput: f64,
}

/// Rows are tagged with (job, text index).
type Tag = (JobId, usize);

struct Worker<B: Backend> {
    backend: B,
    special: SpecialIds,
    config: SchedulerConfig,
    metrics: WorkerMetrics,
    peers: Peers,
    /// This worker's place in `peers`.
    index: usize,
    /// What this worker last added to the model's summed gauges.
    published: Published,
    receiver: mpsc::UnboundedReceiver<Job>,
    /// By acceptance at the door.
    jobs: BTreeMap<JobId, ActiveJob>,
    batch: RunningBatch<B, Tag>,
    /// Sum of the token budgets of the texts in the batch.
    batch_tokens: usize,
    /// What this turn did, for the load.
    progress: Progress,
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
    fn new(
        backend: B,
        special: SpecialIds,
        config: SchedulerConfig,
        metrics: WorkerMetrics,
        peers: Peers,
        index: usize,
        receiver: mpsc::UnboundedReceiver<Job>,
    ) -> Self {
        Worker {
            backend,
            special,
            config,
            metrics,
            peers,
            index,
            published: Published::default(),
            receiver,
            jobs: BTreeMap::new(),
            batch: RunningBatch::default(),
            batch_tokens: 0,
            progress: Progress::default(),
        }
    }

    fn run(mut self) {
        loop {
            if self.batch.is_empty() && !self.has_waiting() {
                match self.receiver.blocking_recv() {
                    Some(job) => self.receive(job),
                    None => break,
                }
            }
            while let Ok(job) = self.receiver.try_recv() {
                self.receive(job);
            }
            self.turn();
        }
        tracing::debug!("model worker stopped");
    }

    fn has_waiting(&self) -> bool {
        self.jobs.values().any(ActiveJob::waiting)
    }

    fn receive(&mut self, job: Job) {
        let id = job.id;
        let sizes = job
            .inputs
            .iter()
            .map(|input| TextSize {
                budget: input.token_budget(),
                source: input.source_ids.len(),
                max_output: input.max_output_tokens,
            })
            .collect();
        let texts = job.inputs.len();
        self.jobs.insert(
            id,
            ActiveJob {
                reply: job.reply,
                span: job.span,
                queue_span: Some(job.queue_span),
                decode_span: None,
                enqueued: job.enqueued,
                admitted: None,
                texts: job.inputs.into_iter().map(Text::Waiting).collect(),
                sizes,
                next: 0,
                rows: 0,
                remaining: texts,
            },
        );
    }

    /// One turn of the loop: the queue and the batch lose abandoned jobs, waiting texts join,
    /// and every row takes one step.
    fn turn(&mut self) {
        let started = Instant::now();
        self.drop_abandoned();
        self.admit();
        if !self.batch.is_empty() {
            self.metrics.batch_size.observe(self.batch.rows() as f64);
            self.publish_in_flight();
            self.progress.stepped = true;
            self.progress.processed += self.batch.len() as u64;
            let special = self.special;
            let (backend, batch) = (&mut self.backend, &mut self.batch);
            match guarded(|| batch.step(backend, special)) {
                Ok(finished) => {
                    // Before the replies: a client holding its answer must not still count
                    // itself in flight.
                    self.publish_in_flight();
                    for (tag, output) in finished {
                        self.finish_sequence(tag, output);
                    }
                }
                Err(error) => self.fail_batch(error),
            }
        }
        // Also when every row left before the step: the gauge must not keep the last count.
        self.publish_in_flight();
        self.publish(started.elapsed());
    }

    fn shared(&self) -> &Shared {
        &self.peers[self.index]
    }

    /// The model's rows in flight are every worker's: each adds what changed in its own.
    fn publish_in_flight(&mut self) {
        let rows = self.batch.len() as i64;
        self.metrics
            .sequences_in_flight
            .add(rows - self.published.in_flight);
        self.published.in_flight = rows;
    }

    /// Hands the turn's progress to the door's estimate, and publishes the model's gauges: its
    /// throughput is the workers' summed, its lateness the worst worker's, its expected wait
    /// the least loaded worker's (where a new request goes).
    fn publish(&mut self, busy: Duration) {
        let progress = std::mem::take(&mut self.progress);
        let throughput = {
            let mut load = self.shared().load();
            load.apply(&progress, busy);
            load.throughput.tokens_per_second()
        };
        self.metrics
            .throughput
            .add(throughput - self.published.throughput);
        self.published.throughput = throughput;
        self.metrics
            .expected_queue_wait
            .set(least_loaded(&self.peers).1.as_secs_f64());
        let lateness = self
            .peers
            .iter()
            .map(|peer| peer.load().lateness.factor())
            .fold(f64::MIN, f64::max);
        self.metrics.admission_lateness.set(lateness);
    }

    /// A request left the queue: it has no text waiting any more.
    fn dequeued(&mut self) {
        self.metrics.queue_depth.dec();
    }

    /// Jobs whose client left: their waiting texts out of the queue, their rows out of the
    /// batch.
    fn drop_abandoned(&mut self) {
        let gone: Vec<JobId> = self
            .jobs
            .iter()
            .filter(|(_, job)| job.reply.is_closed())
            .map(|(&id, _)| id)
            .collect();
        if !gone.is_empty() {
            self.remove_jobs(&gone, None);
        }
    }

    /// The waiting job whose turn it is: the one holding the fewest rows, then the earliest.
    fn next_in_turn(&self) -> Option<JobId> {
        self.jobs
            .iter()
            .filter(|(_, job)| job.waiting())
            .min_by_key(|(&id, job)| (job.rows, id))
            .map(|(&id, _)| id)
    }

    /// Moves waiting texts into the batch while they fit, one row at a time to the job whose
    /// turn it is (see the module's documentation).
    fn admit(&mut self) {
        let mut joining: Vec<(Tag, DecodeInput)> = Vec::new();
        let now = Instant::now();
        match self.config.batching {
            Batching::Off => {
                let first = self.jobs.iter().find(|(_, job)| job.waiting());
                if let (true, Some((&id, _))) = (self.batch.is_empty(), first) {
                    while self.jobs[&id].waiting() {
                        self.take_text(id, now, &mut joining);
                    }
                }
            }
            Batching::Continuous => {
                while let Some(id) = self.next_in_turn() {
                    let job = &self.jobs[&id];
                    let tokens = job.sizes[job.next].budget;
                    let rows = self.batch.len() + joining.len();
                    // Alone, any text runs: one larger than the token limit must not starve.
                    let fits = rows == 0
                        || (rows < self.config.max_batch_size
                            && self.batch_tokens + tokens <= self.config.max_batch_tokens);
                    if !fits {
                        break;
                    }
                    self.take_text(id, now, &mut joining);
                }
            }
        }
        if joining.is_empty() {
            return;
        }
        let mut ids: Vec<JobId> = joining.iter().map(|&((id, _), _)| id).collect();
        ids.sort_unstable();
        ids.dedup();
        let encode_spans: Vec<Span> = ids
            .iter()
            .filter_map(|id| self.jobs[id].decode_span.as_ref())
            .map(|parent| tracing::info_span!(parent: parent, "encode", joining = joining.len()))
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
            // The running rows are intact (a failed join stores nothing); only the jobs that
            // tried to join fail, with their rows already running.
            Err(error) => self.remove_jobs(&ids, Some(&error)),
        }
    }

    /// Takes job `id`'s next waiting text for the batch.
    fn take_text(&mut self, id: JobId, now: Instant, joining: &mut Vec<(Tag, DecodeInput)>) {
        let job = self.jobs.get_mut(&id).expect("a waiting job");
        let text = job.next;
        job.next += 1;
        job.rows += 1;
        let size = job.sizes[text];
        let running = Text::Running { joined: now };
        let Text::Waiting(input) = std::mem::replace(&mut job.texts[text], running) else {
            unreachable!("texts from `next` on are waiting")
        };
        if job.admitted.is_none() {
            job.admitted = Some(now);
            job.queue_span = None;
            job.decode_span = Some(tracing::info_span!(
                parent: &job.span,
                "decode",
                texts = job.texts.len()
            ));
        }
        let dequeued = !job.waiting();
        self.batch_tokens += size.budget;
        // The source is encoded now.
        self.progress.joined.push(id);
        self.progress.processed += size.source as u64;
        if dequeued {
            self.dequeued();
        }
        joining.push(((id, text), input));
    }

    fn finish_sequence(&mut self, (id, text): Tag, output: DecodeOutput) {
        let Some(job) = self.jobs.get_mut(&id) else {
            return;
        };
        let size = job.sizes[text];
        let Text::Running { joined } = job.texts[text] else {
            return;
        };
        self.batch_tokens = self.batch_tokens.saturating_sub(size.budget);
        self.progress.finished.push(FinishedText {
            job: id,
            text,
            produced: output.ids.len(),
            budget: size.max_output,
        });
        job.rows -= 1;
        job.texts[text] = Text::Done(SequenceResult {
            output,
            decode_time: joined.elapsed(),
        });
        job.remaining -= 1;
        if job.remaining > 0 {
            return;
        }
        let job = self.jobs.remove(&id).expect("present");
        let admitted = job.admitted.expect("its texts joined");
        let finished = Finished {
            sequences: job
                .texts
                .into_iter()
                .map(|text| match text {
                    Text::Done(result) => result,
                    _ => unreachable!("every text finished"),
                })
                .collect(),
            queue_time: admitted - job.enqueued,
            inference_time: admitted.elapsed(),
        };
        // The client may have gone between the last check and now: nothing to do then.
        let _ = job.reply.send(Ok(finished));
    }

    /// Takes jobs out of the queue and the batch, answering `error` (nothing when their
    /// client left).
    fn remove_jobs(&mut self, ids: &[JobId], error: Option<&BackendError>) {
        let with_rows: Vec<JobId> = ids
            .iter()
            .copied()
            .filter(|id| self.jobs.get(id).is_some_and(|job| job.rows > 0))
            .collect();
        if !with_rows.is_empty() {
            let (backend, batch) = (&mut self.backend, &mut self.batch);
            if let Err(cancel_error) =
                guarded(|| batch.cancel(backend, |(job, _)| with_rows.contains(job)))
            {
                // Removes these jobs too (they had rows), answering the cancel's error.
                self.fail_batch(cancel_error);
            }
        }
        for id in ids {
            let Some(job) = self.jobs.remove(id) else {
                continue;
            };
            self.forget(*id, &job);
            let span = job.decode_span.as_ref().unwrap_or(&job.span);
            match error {
                Some(error) => {
                    span.in_scope(|| tracing::error!("{error}"));
                    let _ = job.reply.send(Err(error.clone()));
                }
                None => span.in_scope(|| {
                    tracing::info!("client went away; its texts left the queue and the batch")
                }),
            }
        }
    }

    /// Takes a removed job's unfinished texts off the queue, the batch's tokens and the load.
    fn forget(&mut self, id: JobId, job: &ActiveJob) {
        self.progress.removed.push(id);
        for (text, size) in job.texts.iter().zip(&job.sizes) {
            if let Text::Running { .. } = text {
                self.batch_tokens = self.batch_tokens.saturating_sub(size.budget);
            }
        }
        if job.waiting() {
            self.dequeued();
        }
    }

    /// A decoder step failed: the rows cannot be told apart any more, so every job with a row
    /// in the batch fails (its waiting texts with it) and the batch starts afresh. Jobs without
    /// rows are untouched.
    fn fail_batch(&mut self, error: BackendError) {
        let tags = self.batch.clear();
        let mut ids: Vec<JobId> = tags.into_iter().map(|(id, _)| id).collect();
        ids.sort_unstable();
        ids.dedup();
        for id in &ids {
            // Their rows are gone with the batch: nothing to cancel.
            if let Some(job) = self.jobs.get_mut(id) {
                job.rows = 0;
            }
        }
        self.remove_jobs(&ids, Some(&error));
        self.batch_tokens = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Metrics;
    use crate::testing::{CopyBackend, SPECIAL};

    fn metrics() -> WorkerMetrics {
        Metrics::new().worker("test")
    }

    fn config(batching: Batching) -> SchedulerConfig {
        SchedulerConfig {
            batching,
            max_batch_size: 8,
            max_batch_tokens: 1000,
            max_queued_requests: 4,
            max_queue_wait: Duration::from_secs(60),
        }
    }

    fn text(words: &[i64]) -> DecodeInput {
        let mut ids = words.to_vec();
        ids.push(SPECIAL.eos.into());
        DecodeInput::new(ids, 20)
    }

    /// Ten words: 11 decoder steps.
    fn long_text() -> DecodeInput {
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

    type Answer = oneshot::Receiver<Result<Finished, BackendError>>;

    /// A worker that is not running, with `jobs` accepted at the door and received.
    fn worker_with(
        config: SchedulerConfig,
        jobs: &[Vec<DecodeInput>],
    ) -> (Worker<CopyBackend>, Vec<Answer>) {
        let (_sender, receiver) = mpsc::unbounded_channel();
        let peers: Peers = Arc::new([Arc::new(Shared {
            load: Mutex::new(Load::default()),
            policy: config.admission(),
        })]);
        let mut worker = Worker::new(
            CopyBackend::default(),
            SPECIAL,
            config,
            metrics(),
            peers,
            0,
            receiver,
        );
        let answers = jobs
            .iter()
            .map(|inputs| accept(&mut worker, inputs.clone()))
            .collect();
        (worker, answers)
    }

    /// `inputs` through the door and into the worker, as `Translator::translate` sends them.
    fn accept(worker: &mut Worker<CopyBackend>, inputs: Vec<DecodeInput>) -> Answer {
        let shared = worker.shared();
        let id = shared.load().admit(&shared.policy, &inputs).unwrap();
        worker.metrics.queue_depth.inc();
        let (reply, answer) = oneshot::channel();
        worker.receive(Job {
            inputs,
            id,
            reply,
            span: Span::none(),
            queue_span: Span::none(),
            enqueued: Instant::now(),
        });
        answer
    }

    /// Turns until nothing is left; how many.
    fn run_to_the_end(worker: &mut Worker<CopyBackend>) -> usize {
        let mut turns = 0;
        while !worker.batch.is_empty() || worker.has_waiting() {
            worker.turn();
            turns += 1;
        }
        turns
    }

    fn waiting_jobs(worker: &Worker<CopyBackend>) -> usize {
        worker.jobs.values().filter(|job| job.waiting()).count()
    }

    /// Nothing is counted as queued, running or in the batch's tokens any more.
    fn assert_drained(worker: &Worker<CopyBackend>) {
        let load = worker.shared().load().clone();
        assert_eq!(
            (
                load.work(),
                load.waiting_texts(),
                load.queued_requests(),
                load.batch_rows()
            ),
            (0, 0, 0, 0)
        );
        assert_eq!(worker.batch_tokens, 0);
        assert_eq!(worker.metrics.queue_depth.get(), 0);
        assert_eq!(worker.metrics.sequences_in_flight.get(), 0);
        assert!(worker.jobs.is_empty());
    }

    fn ids(answer: &mut Answer) -> Vec<Vec<u32>> {
        let finished: Finished = answer.try_recv().unwrap().unwrap();
        finished
            .sequences
            .into_iter()
            .map(|s| s.output.ids)
            .collect()
    }

    #[test]
    fn waiting_texts_join_the_running_batch_within_the_limits() {
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
        // One row each for jobs 0, 1 and 2; job 1's second text and job 3 wait.
        assert_eq!(worker.batch.len(), 3);
        assert_eq!(waiting_jobs(&worker), 2);
        assert_eq!(worker.metrics.queue_depth.get(), 2);
        // A text of n words takes n + 1 steps (the last one gives EOS). Job 1's first text
        // leaves after step 2 and its second takes the row (job 1 holds none, like job 3,
        // and came first); job 2 leaves after step 4 and job 3 takes its row; all are done
        // when job 0 is, after 6 steps, where one request at a time would take 6 + 3 + 4 + 2.
        assert_eq!(run_to_the_end(&mut worker), 6);
        assert_eq!(worker.backend.step_sizes, vec![3, 3, 3, 3, 3, 2]);
        assert_eq!(ids(&mut answers[0]), vec![vec![4, 5, 6, 7, 8]]);
        assert_eq!(ids(&mut answers[1]), vec![vec![9], vec![10, 11]]);
        assert_eq!(ids(&mut answers[2]), vec![vec![12, 13, 14]]);
        assert_eq!(ids(&mut answers[3]), vec![vec![15]]);
        assert_drained(&worker);
    }

    #[test]
    fn a_small_job_behind_a_big_one_gets_a_row_at_once() {
        // Eight texts of ten words (11 steps each) do not fit the 4 rows; one text of one word
        // (2 steps) arrives right behind them.
        let jobs = vec![vec![long_text(); 8], vec![text(&[15])]];
        let mut cfg = config(Batching::Continuous);
        cfg.max_batch_size = 4;
        let (mut worker, mut answers) = worker_with(cfg, &jobs);
        let mut done_at = [None, None];
        for step in 1..=40 {
            worker.turn();
            for (job, answer) in answers.iter_mut().enumerate() {
                if done_at[job].is_none() && answer.try_recv().is_ok() {
                    done_at[job] = Some(step);
                }
            }
        }
        // Admitting whole jobs ran the big one alone (8 rows, over the limit) and the small one
        // after it, at step 13. Texts take turns: the small one shares the first step.
        assert_eq!(done_at[1], Some(2));
        assert!(
            worker.backend.step_sizes.iter().all(|&rows| rows <= 4),
            "{:?}",
            worker.backend.step_sizes
        );
        // The big one kept three rows meanwhile, and all four after: 2 waves of 11 steps, the
        // late joiners 2 steps behind.
        assert_eq!(done_at[0], Some(24));
        assert_drained(&worker);
    }

    #[test]
    fn rows_go_to_the_job_holding_the_fewest() {
        let mut cfg = config(Batching::Continuous);
        cfg.max_batch_size = 3;
        // Job 0 fills the batch with texts of 1, 2 and 3 words (leaving after steps 2, 3, 4).
        let first = vec![text(&[4]), text(&[4, 5]), text(&[4, 5, 6])];
        let (mut worker, _answers) = worker_with(cfg, &[first]);
        worker.turn();
        // Then jobs 1 and 2 come, with two long texts each.
        let _later: Vec<Answer> = (0..2)
            .map(|_| accept(&mut worker, vec![long_text(); 2]))
            .collect();
        let held = |worker: &Worker<CopyBackend>| -> Vec<usize> {
            worker.jobs.values().map(|job| job.rows).collect()
        };
        worker.turn();
        assert_eq!(held(&worker), vec![2, 0, 0]);
        // The freed rows go to job 1, then job 2 (which holds none while job 1 holds one),
        // then job 1 again; by arrival, job 1 would have taken two before job 2 had one.
        worker.turn();
        assert_eq!(held(&worker), vec![1, 1, 0]);
        worker.turn();
        assert_eq!(held(&worker), vec![1, 1], "job 0 is done");
        worker.turn();
        assert_eq!(held(&worker), vec![2, 1]);
        run_to_the_end(&mut worker);
        assert_drained(&worker);
    }

    #[test]
    fn without_batching_one_request_runs_at_a_time() {
        let jobs = vec![vec![text(&[4, 5]), text(&[7])], vec![text(&[6])]];
        let (mut worker, _answers) = worker_with(config(Batching::Off), &jobs);
        worker.admit();
        assert_eq!(worker.batch.len(), 2);
        assert_eq!(waiting_jobs(&worker), 1);
        run_to_the_end(&mut worker);
        assert_eq!(worker.backend.step_sizes, vec![2, 2, 1, 1, 1]);
        assert_drained(&worker);
    }

    #[test]
    fn abandoned_jobs_leave_the_queue_and_the_batch() {
        let jobs = vec![
            vec![text(&[4, 5, 6])],
            vec![text(&[7, 8, 9]), text(&[7, 8, 9])],
            vec![text(&[10])],
        ];
        let mut cfg = config(Batching::Continuous);
        cfg.max_batch_size = 2;
        let (mut worker, mut answers) = worker_with(cfg, &jobs);
        worker.turn();
        // The clients of job 1 (one text running, one waiting) and job 2 (waiting) give up.
        answers.truncate(1);
        worker.drop_abandoned();
        assert_eq!(worker.batch.len(), 1);
        assert_eq!(waiting_jobs(&worker), 0);
        assert_eq!(worker.metrics.queue_depth.get(), 0);
        run_to_the_end(&mut worker);
        let finished = answers[0].try_recv().unwrap().unwrap();
        assert_eq!(finished.sequences[0].output.ids, vec![4, 5, 6]);
        assert_drained(&worker);
    }

    #[test]
    fn the_in_flight_gauge_falls_to_zero_when_every_client_leaves() {
        let jobs = vec![vec![text(&[4, 5, 6, 7])], vec![text(&[8, 9, 10])]];
        let (mut worker, answers) = worker_with(config(Batching::Continuous), &jobs);
        worker.turn();
        assert_eq!(worker.metrics.sequences_in_flight.get(), 2);
        drop(answers);
        worker.turn();
        assert_eq!(worker.batch.len(), 0);
        assert_eq!(worker.metrics.sequences_in_flight.get(), 0);
        assert_drained(&worker);
    }

    #[test]
    fn a_failed_step_fails_the_jobs_with_rows_and_spares_the_others() {
        let jobs = vec![
            vec![text(&[4, 5]), text(&[4, 5])],
            vec![text(&[6])],
            vec![text(&[7, 8])],
        ];
        let mut cfg = config(Batching::Continuous);
        cfg.max_batch_size = 2;
        let (mut worker, mut answers) = worker_with(cfg, &jobs);
        worker.backend.fail = true;
        worker.turn();
        // Jobs 0 and 1 had the rows (job 0 with a text still waiting): both fail whole.
        for answer in &mut answers[..2] {
            let failed = answer.try_recv().unwrap();
            assert!(failed.is_err(), "{failed:?}");
        }
        worker.backend.fail = false;
        run_to_the_end(&mut worker);
        assert_eq!(ids(&mut answers[2]), vec![vec![7, 8]]);
        assert_drained(&worker);
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
            translator.peers.iter().any(|peer| {
                let load = peer.load();
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
        for peer in translator.peers.iter() {
            assert_eq!(peer.load().batch_rows(), 3);
        }
        assert_eq!(worker_metrics.sequences_in_flight.get(), 6);
        for request in requests {
            let out = request.await.unwrap().unwrap();
            assert!(out.sequences.iter().all(|s| s.output.ids.len() == 10));
        }
        until_drained(&translator).await;
        let summed: f64 = translator
            .peers
            .iter()
            .map(|peer| peer.load().throughput.tokens_per_second())
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
            let shared = &translator.peers[0];
            let mut load = shared.load();
            for _ in 0..4 {
                load.admit(&shared.policy, &[text(&[4])]).unwrap();
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
