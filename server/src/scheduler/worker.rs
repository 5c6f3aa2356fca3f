//! A model worker: the thread that owns the backend and one running batch. Between two
//! decoder steps it drops the jobs whose client left, lets waiting texts join as the row
//! policy gives them rows (encoding waiting texts of like length in the same run, ahead of
//! their turn), steps every row, and answers a job once its last text is done.

use std::collections::{BTreeMap, HashMap};
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tracing::Span;

use super::admission::{least_loaded, Door, FinishedText, Progress};
use super::job::{Finished, Job, Reply, SequenceResult};
use super::policy::{JobId, Rows, Tag, Turn};
use crate::metrics::WorkerMetrics;
use nmt_engine::backend::{Backend, BackendError};
use nmt_engine::decode::{
    encode_each, DecodeInput, DecodeOutput, Joining, RunningBatch, SpecialIds,
};

/// Every worker's door of a model, by worker.
pub type Doors = Arc<[Arc<Door>]>;

/// Where one text of a job is.
enum Text {
    Waiting(DecodeInput),
    /// In the batch (or joining it) since `joined`.
    Running {
        joined: Instant,
        /// Source plus output budget: what it counts against `max_batch_tokens`.
        budget: usize,
        /// Its output budget, which the door compares what it produced with.
        max_output: usize,
    },
    Done(SequenceResult),
}

impl Text {
    /// A waiting text joins the batch at `now`: its input goes to the batch.
    fn join(&mut self, now: Instant) -> DecodeInput {
        let Text::Waiting(input) = self else {
            unreachable!("only a waiting text joins")
        };
        let running = Text::Running {
            joined: now,
            budget: input.token_budget(),
            max_output: input.max_output_tokens,
        };
        let Text::Waiting(input) = std::mem::replace(self, running) else {
            unreachable!("matched above")
        };
        input
    }
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

    /// The token budget of the next waiting text.
    fn next_budget(&self) -> usize {
        match &self.texts[self.next] {
            Text::Waiting(input) => input.token_budget(),
            _ => unreachable!("texts from `next` on are waiting"),
        }
    }
}

/// A worker's share of the model's summed gauges, as it last added it.
#[derive(Default)]
struct Published {
    in_flight: i64,
    /// Cost units per busy second.
    throughput: f64,
    /// Tokens per busy second.
    tokens: f64,
}

/// One model worker: its backend, its running batch, and the jobs it has received and not
/// answered.
///
/// Its door ([`Door`], at `doors[index]`) keeps its own account of the same jobs, in expected
/// sizes, behind a lock that the request threads share: the worker reports to it once a turn
/// ([`Progress`]) instead of holding that lock while it fills and steps the batch.
pub struct Worker<B: Backend> {
    backend: B,
    special: SpecialIds,
    metrics: WorkerMetrics,
    /// Every worker's door of the model, by worker: a worker reads the others' to publish the
    /// model's gauges.
    doors: Doors,
    /// This worker's place in `doors`.
    index: usize,
    /// What this worker last added to the model's summed gauges.
    published: Published,
    receiver: mpsc::UnboundedReceiver<Job>,
    /// By acceptance at the door.
    jobs: BTreeMap<JobId, ActiveJob>,
    batch: RunningBatch<B, Tag>,
    /// Sum of the token budgets of the texts in the batch.
    batch_tokens: usize,
    /// Waiting texts encoded ahead of their turn.
    ahead: Ahead<B::Encoded>,
    /// What this turn did, for the load.
    progress: Progress,
    /// Whether a text taken since the worker last ran out of work was long enough for its
    /// freed memory to be worth handing back ([`IDLE_TRIM_FROM_TOKENS`]).
    trim_when_idle: bool,
}

/// A text of this many tokens (source and output budget) makes the worker hand the C heap's
/// free pages back when it next runs out of work. Handing them back after every request cost
/// one client 8% of its throughput (`malloc_trim` walks the whole heap: 1,036-1,065 against
/// 1,124-1,149 target subwords/s, float32, two intra-op threads), while what a text below this
/// leaves in the heap is a few MiB (docs/benchmarks/memory.md: 3 to 12 MiB above idle at the
/// peak of 64 to 256 source subwords, 30 from 512).
const IDLE_TRIM_FROM_TOKENS: usize = 512;

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
    pub fn new(
        backend: B,
        special: SpecialIds,
        metrics: WorkerMetrics,
        doors: Doors,
        index: usize,
        receiver: mpsc::UnboundedReceiver<Job>,
    ) -> Self {
        Worker {
            backend,
            special,
            metrics,
            doors,
            index,
            published: Published::default(),
            receiver,
            jobs: BTreeMap::new(),
            batch: RunningBatch::default(),
            batch_tokens: 0,
            ahead: Ahead::default(),
            progress: Progress::default(),
            trim_when_idle: false,
        }
    }

    /// Serves jobs until every sender is dropped and the work already queued is done.
    pub fn run(mut self) {
        loop {
            if self.batch.is_empty() && !self.has_waiting() {
                if std::mem::take(&mut self.trim_when_idle) {
                    nmt_engine::memory::give_back_free_pages();
                }
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
        self.trim_when_idle |= job
            .inputs
            .iter()
            .any(|input| input.source_ids.len() + input.max_output_tokens >= IDLE_TRIM_FROM_TOKENS);
        let id = job.id;
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

    fn door(&self) -> &Door {
        &self.doors[self.index]
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
        let (throughput, tokens) = {
            let mut load = self.door().load();
            load.apply(&progress, busy);
            (load.throughput.per_second(), load.tokens.per_second())
        };
        self.metrics
            .throughput
            .add(throughput - self.published.throughput);
        self.published.throughput = throughput;
        self.metrics
            .token_throughput
            .add(tokens - self.published.tokens);
        self.published.tokens = tokens;
        self.metrics
            .expected_queue_wait
            .set(least_loaded(&self.doors).1.as_secs_f64());
        let lateness = self
            .doors
            .iter()
            .map(|door| door.load().lateness.factor())
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

    /// Moves waiting texts into the batch as the row policy gives them rows, and encodes them.
    /// Not while another worker holds the encoder they share and this one has rows to step:
    /// waiting for its turn (0.2 ms a run under 64 clients at 8 int8 rows a worker, a run
    /// every few steps) would idle the core the rows could use; the texts join after the step.
    fn admit(&mut self) {
        if !self.batch.is_empty() && self.backend.encoder_busy() {
            return;
        }
        let policy = self.door().policy.rows;
        let mut filling = Filling {
            worker: self,
            joining: Vec::new(),
            now: Instant::now(),
        };
        policy.fill(&mut filling);
        let joining = filling.joining;
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
        let result = guarded(|| {
            let joining = self.encodings(joining)?;
            self.batch.join_with(&mut self.backend, joining)
        });
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

    /// The joining texts with their encodings: a text encoded ahead of its turn takes its
    /// own; the others are encoded now, those of like length in one run, with the waiting
    /// texts of like length near the front of the line ([`Ahead::companions`]), which keep
    /// theirs until they join. Under 64 clients a row frees one at a time, so without them
    /// the encoder ran once a text and cost the server twice what a text costs in sorted
    /// batches of 8.
    fn encodings(
        &mut self,
        joining: Vec<(Tag, DecodeInput)>,
    ) -> Result<Vec<Joining<Tag, B::Encoded>>, BackendError> {
        let window = AHEAD_WINDOW_BATCHES * self.door().policy.rows.max_batch_size;
        let mut prepared: Vec<Joining<Tag, B::Encoded>> = joining
            .into_iter()
            .map(|(tag, input)| Joining {
                tag,
                encoded: self.ahead.take(tag),
                input,
            })
            .collect();
        let length = |joining: &Joining<Tag, B::Encoded>| joining.input.source_ids.len();
        // A text without an output budget finishes without the encoder.
        let mut fresh: Vec<usize> = (0..prepared.len())
            .filter(|&i| prepared[i].encoded.is_none() && prepared[i].input.max_output_tokens > 0)
            .collect();
        fresh.sort_by_key(|&i| length(&prepared[i]));
        while let Some(&first) = fresh.first() {
            let shortest = length(&prepared[first]);
            let together = fresh
                .iter()
                .take(AHEAD_RUN_TEXTS)
                .take_while(|&&i| alike(shortest, length(&prepared[i])))
                .count();
            let run: Vec<usize> = fresh.drain(..together).collect();
            let companions = self.ahead.companions(
                shortest,
                AHEAD_RUN_TEXTS - run.len(),
                waiting(&self.jobs, window),
            );
            let each = {
                let mut sources: Vec<&[i64]> = run
                    .iter()
                    .map(|&i| prepared[i].input.source_ids.as_slice())
                    .collect();
                sources.extend(companions.iter().map(|&(_, source)| source));
                self.metrics.encoder_run_texts.observe(sources.len() as f64);
                encode_each(&mut self.backend, &sources)?
            };
            let mut each = each.into_iter();
            for &i in &run {
                prepared[i].encoded = each.next();
            }
            for ((tag, source), encoded) in companions.into_iter().zip(each) {
                self.ahead.keep(tag, source.len(), encoded);
            }
        }
        Ok(prepared)
    }

    /// Takes job `id`'s next waiting text for the batch.
    fn take_text(&mut self, id: JobId, now: Instant) -> (Tag, DecodeInput) {
        let job = self.jobs.get_mut(&id).expect("a waiting job");
        let text = job.next;
        job.next += 1;
        job.rows += 1;
        let input = job.texts[text].join(now);
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
        self.batch_tokens += input.token_budget();
        // The source is encoded now.
        self.progress.joined.push((id, text));
        self.progress.processed += input.source_ids.len() as u64;
        if dequeued {
            self.dequeued();
        }
        ((id, text), input)
    }

    fn finish_sequence(&mut self, (id, text): Tag, output: DecodeOutput) {
        let Some(job) = self.jobs.get_mut(&id) else {
            return;
        };
        let Text::Running {
            joined,
            budget,
            max_output,
        } = job.texts[text]
        else {
            return;
        };
        self.batch_tokens = self.batch_tokens.saturating_sub(budget);
        self.progress.finished.push(FinishedText {
            job: id,
            text,
            produced: output.ids.len(),
            budget: max_output,
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
        self.ahead.forget(id);
        for text in &job.texts {
            if let Text::Running { budget, .. } = text {
                self.batch_tokens = self.batch_tokens.saturating_sub(*budget);
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

/// The first `limit` waiting texts in the order they will get rows (jobs by [`Turn`], each
/// job's texts in order), with their sources.
fn waiting(jobs: &BTreeMap<JobId, ActiveJob>, limit: usize) -> Vec<(Tag, &[i64])> {
    let mut jobs: Vec<(&JobId, &ActiveJob)> =
        jobs.iter().filter(|(_, job)| job.waiting()).collect();
    jobs.sort_by_key(|(&id, job)| Turn {
        held: job.rows,
        job: id,
    });
    jobs.into_iter()
        .flat_map(|(&id, job)| {
            job.texts[job.next..]
                .iter()
                .enumerate()
                .filter_map(move |(i, text)| match text {
                    Text::Waiting(input) => Some(((id, job.next + i), input.source_ids.as_slice())),
                    _ => None,
                })
        })
        .take(limit)
        .collect()
}

/// Waiting texts are encoded ahead among the first this many batches' worth of texts in line:
/// under 64 clients each of two workers of 8 rows holds some 24 waiting texts, and a simulation of
/// that line (session 32) found 4 to 5 texts of like length a run with the whole line in
/// view, 2.3 with one batch's worth.
const AHEAD_WINDOW_BATCHES: usize = 3;
/// Most texts one encoder run takes: beyond 8 sorted texts a run, an int8 encoder went no
/// faster a text (0.59 ms at 8, 0.69 at 16), and a server capped at 4 a run went as fast.
const AHEAD_RUN_TEXTS: usize = 8;
/// Texts share an encoder run when the longer is at most this many times the shorter.
const AHEAD_LENGTH_RATIO: f64 = 1.25;
/// Texts longer than this many source tokens are not encoded ahead: a long text's own length
/// spreads the run's fixed cost, and its memory would wait in the worker.
const AHEAD_MAX_SOURCE_TOKENS: usize = 128;
/// Most source tokens whose encoder memory waits in a worker: the cross-attention keys and
/// values, 6 KiB a token for the shipped 3-layer, 256-wide decoder (some 6 MiB, more with the
/// padding of the runs they came from), 24 KiB for a 6-layer, 512-wide one.
const AHEAD_MAX_TOKENS: usize = 1024;

/// Waiting texts encoded ahead of their turn, by tag, with the source tokens each holds.
struct Ahead<E> {
    encoded: HashMap<Tag, (usize, E)>,
    tokens: usize,
}

impl<E> Default for Ahead<E> {
    fn default() -> Self {
        Ahead {
            encoded: HashMap::new(),
            tokens: 0,
        }
    }
}

impl<E> Ahead<E> {
    fn take(&mut self, tag: Tag) -> Option<E> {
        let (tokens, encoded) = self.encoded.remove(&tag)?;
        self.tokens -= tokens;
        Some(encoded)
    }

    fn keep(&mut self, tag: Tag, tokens: usize, encoded: E) {
        self.tokens += tokens;
        if let Some((old, _)) = self.encoded.insert(tag, (tokens, encoded)) {
            self.tokens -= old;
        }
    }

    /// Drops what a removed job's texts held.
    fn forget(&mut self, job: JobId) {
        let tokens = &mut self.tokens;
        self.encoded.retain(|&(id, _), (held, _)| {
            if id == job {
                *tokens -= *held;
            }
            id != job
        });
    }

    /// At most `room` texts of `waiting` to encode in a run whose shortest text has `length`
    /// tokens: not yet encoded, short, alike in length ([`alike`]), nearest first, as many
    /// as the token budget takes.
    fn companions<'w>(
        &self,
        length: usize,
        room: usize,
        waiting: Vec<(Tag, &'w [i64])>,
    ) -> Vec<(Tag, &'w [i64])> {
        let mut candidates: Vec<(Tag, &[i64])> = waiting
            .into_iter()
            .filter(|(tag, source)| {
                !self.encoded.contains_key(tag)
                    && source.len() <= AHEAD_MAX_SOURCE_TOKENS
                    && alike(length, source.len())
            })
            .collect();
        candidates.sort_by_key(|(_, source)| source.len().abs_diff(length));
        let mut tokens = AHEAD_MAX_TOKENS.saturating_sub(self.tokens);
        candidates
            .into_iter()
            .take(room)
            .take_while(|(_, source)| {
                let fits = source.len() <= tokens;
                tokens = tokens.saturating_sub(source.len());
                fits
            })
            .collect()
    }
}

/// Whether texts of `a` and `b` tokens share an encoder run: a run is padded to its longest.
fn alike(a: usize, b: usize) -> bool {
    let (short, long) = (a.min(b) as f64, a.max(b) as f64);
    long <= short * AHEAD_LENGTH_RATIO
}

/// The worker's jobs as the row policy fills the batch from them: the texts it takes gather in
/// `joining`, to join together.
struct Filling<'w, B: Backend> {
    worker: &'w mut Worker<B>,
    joining: Vec<(Tag, DecodeInput)>,
    now: Instant,
}

impl<B: Backend> Rows for Filling<'_, B> {
    fn batch(&self) -> (usize, usize) {
        let worker = &self.worker;
        (worker.batch.len() + self.joining.len(), worker.batch_tokens)
    }

    fn next_in_turn(&self) -> Option<(JobId, usize)> {
        self.worker
            .jobs
            .iter()
            .filter(|(_, job)| job.waiting())
            .min_by_key(|(&id, job)| Turn {
                held: job.rows,
                job: id,
            })
            .map(|(&id, job)| (id, job.next_budget()))
    }

    fn take(&mut self, job: JobId) -> bool {
        let taken = self.worker.take_text(job, self.now);
        self.joining.push(taken);
        self.worker.jobs[&job].waiting()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::cost::StepCost;
    use crate::scheduler::tests::{config, long_text, metrics, text};
    use crate::scheduler::{Batching, SchedulerConfig};
    use nmt_engine::testing::{CopyBackend, SPECIAL};
    use tokio::sync::oneshot;

    type Answer = oneshot::Receiver<Result<Finished, BackendError>>;

    /// A worker that is not running, with `jobs` accepted at the door and received.
    fn worker_with(
        config: SchedulerConfig,
        jobs: &[Vec<DecodeInput>],
    ) -> (Worker<CopyBackend>, Vec<Answer>) {
        let (_sender, receiver) = mpsc::unbounded_channel();
        let doors: Doors = Arc::new([Arc::new(Door::new(config.admission(), StepCost::default()))]);
        let mut worker = Worker::new(
            CopyBackend::default(),
            SPECIAL,
            metrics(),
            doors,
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
        let door = worker.door();
        let id = door.load().admit(&door.policy, &inputs).unwrap();
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
        let load = worker.door().load().clone();
        assert_eq!(
            (
                load.work(),
                load.waiting_texts(),
                load.queued_requests(),
                load.batch_rows()
            ),
            (0.0, 0, 0, 0)
        );
        assert_eq!(worker.batch_tokens, 0);
        assert_eq!(worker.metrics.queue_depth.get(), 0);
        assert_eq!(worker.metrics.sequences_in_flight.get(), 0);
        assert!(worker.jobs.is_empty());
        assert_eq!((worker.ahead.encoded.len(), worker.ahead.tokens), (0, 0));
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
    fn texts_wait_for_a_busy_shared_encoder_only_while_rows_can_step() {
        let jobs = [vec![text(&[4, 5, 6])], vec![text(&[7])]];
        let (mut worker, mut answers) = worker_with(config(Batching::Continuous), &jobs[..1]);
        // Nothing runs: the worker takes its turn at the encoder, busy or not.
        worker.backend.encoder_busy = true;
        worker.admit();
        assert_eq!(worker.batch.len(), 1);
        // Rows run: the second job waits while the encoder is another worker's, and the
        // running row steps meanwhile.
        answers.push(accept(&mut worker, jobs[1].clone()));
        worker.turn();
        assert_eq!((worker.batch.len(), waiting_jobs(&worker)), (1, 1));
        assert_eq!(worker.backend.encoder_runs, vec![1]);
        assert_eq!(worker.backend.steps, 1);
        worker.backend.encoder_busy = false;
        run_to_the_end(&mut worker);
        assert_eq!(worker.backend.encoder_runs, vec![1, 1]);
        assert_eq!(ids(&mut answers[0]), vec![vec![4, 5, 6]]);
        assert_eq!(ids(&mut answers[1]), vec![vec![7]]);
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
    fn waiting_texts_of_like_length_are_encoded_in_the_run_of_a_text_that_joins() {
        // Two rows, five jobs: sources of 4, 4, 11, 4 and 5 tokens (EOS included).
        let jobs = vec![
            vec![text(&[4, 5, 6])],
            vec![text(&[7, 8, 9])],
            vec![long_text()],
            vec![text(&[10, 11, 12])],
            vec![text(&[13, 14, 15, 16])],
        ];
        let mut cfg = config(Batching::Continuous);
        cfg.max_batch_size = 2;
        cfg.max_queued_requests = 8;
        let (mut worker, mut answers) = worker_with(cfg, &jobs);
        worker.admit();
        // Jobs 0 and 1 join, and jobs 3 and 4 are encoded in their run; the long one is not.
        assert_eq!(worker.backend.encoder_runs, vec![4]);
        assert_eq!((worker.ahead.encoded.len(), worker.ahead.tokens), (2, 9));
        run_to_the_end(&mut worker);
        // The long one got its own run when it joined; jobs 3 and 4 none.
        assert_eq!(worker.backend.encoder_runs, vec![4, 1]);
        assert_eq!(ids(&mut answers[0]), vec![vec![4, 5, 6]]);
        assert_eq!(ids(&mut answers[1]), vec![vec![7, 8, 9]]);
        assert_eq!(ids(&mut answers[2]), vec![(4..=13).collect::<Vec<u32>>()]);
        assert_eq!(ids(&mut answers[3]), vec![vec![10, 11, 12]]);
        assert_eq!(ids(&mut answers[4]), vec![vec![13, 14, 15, 16]]);
        assert_drained(&worker);
    }

    #[test]
    fn a_text_encoded_ahead_goes_with_its_job_when_the_client_leaves() {
        let jobs = vec![
            vec![text(&[4, 5, 6])],
            vec![text(&[7, 8, 9])],
            vec![text(&[10, 11, 12])],
        ];
        let mut cfg = config(Batching::Continuous);
        cfg.max_batch_size = 1;
        let (mut worker, mut answers) = worker_with(cfg, &jobs);
        worker.admit();
        assert_eq!(worker.backend.encoder_runs, vec![3]);
        assert_eq!((worker.ahead.encoded.len(), worker.ahead.tokens), (2, 8));
        // Job 1's client leaves before its text has a row.
        drop(answers.remove(1));
        worker.drop_abandoned();
        assert_eq!((worker.ahead.encoded.len(), worker.ahead.tokens), (1, 4));
        run_to_the_end(&mut worker);
        assert_eq!(worker.backend.encoder_runs, vec![3]);
        assert_eq!(ids(&mut answers[0]), vec![vec![4, 5, 6]]);
        assert_eq!(ids(&mut answers[1]), vec![vec![10, 11, 12]]);
        assert_drained(&worker);
    }

    #[test]
    fn companions_are_short_alike_nearest_first_and_within_the_token_budget() {
        let lengths = [40, 50, 45, 51, 36, 30, 125, 129];
        let sources: Vec<Vec<i64>> = lengths.iter().map(|&n| vec![5; n]).collect();
        let waiting = || -> Vec<(Tag, &[i64])> {
            (0..)
                .zip(&sources)
                .map(|(job, source)| ((job, 0), source.as_slice()))
                .collect()
        };
        let picked = |ahead: &Ahead<()>, length, room| -> Vec<usize> {
            let companions = ahead.companions(length, room, waiting());
            companions.iter().map(|(_, source)| source.len()).collect()
        };
        let mut ahead = Ahead::default();
        // 51 and 30 are unlike 40 (1.25x); nearest first.
        assert_eq!(picked(&ahead, 40, 7), vec![40, 36, 45, 50]);
        assert_eq!(picked(&ahead, 40, 2), vec![40, 36]);
        // Texts over AHEAD_MAX_SOURCE_TOKENS wait unencoded.
        assert_eq!(picked(&ahead, 128, 7), vec![125]);
        // Encoded texts are not picked again, and the budget caps what waits.
        ahead.keep((0, 0), AHEAD_MAX_TOKENS - 80, ());
        assert_eq!(picked(&ahead, 40, 7), vec![36]);
        ahead.keep((1, 0), 50, ());
        assert_eq!(picked(&ahead, 40, 7), Vec::<usize>::new());
        ahead.forget(0);
        assert_eq!((ahead.encoded.len(), ahead.tokens), (1, 50));
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
}
