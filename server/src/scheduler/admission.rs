//! Admission by expected wait: a request is refused at the door (429 with `Retry-After`) when
//! its model is expected to finish it later than `--max-queue-wait`, at the speed the model's
//! worker has been measured to work at. Refusing then costs the client one round trip;
//! accepting would cost it the request timeout and the server the work done until then.
//!
//! Work is counted in tokens: each text's source plus its expected output. The expected output
//! is its output budget times the fraction of budgets that finished texts have used (outputs
//! stop at EOS well before the budget of free decoding, and exactly at it for exact lengths).
//! Throughput is the same tokens (sources encoded, rows stepped) per second of the worker's
//! busy time, a moving average. Both start from priors and follow the measurements within
//! seconds. The expected finish comes from running the scheduler's own row policy
//! ([`RowPolicy::fill`]) forward on these sizes ([`Replay`]): when the new request's texts get
//! rows, and when they end.
//!
//! Two cases are never refused by the estimate. A request that can join the running batch at
//! once (nothing waits, and there are rows for all its texts) waits for nobody; admitting it is
//! also what fills the batch and lets throughput be measured at full batch. And a request that
//! finds its model idle is only as slow as its own size, which the request limits bound.
//! `--max-queued-requests` stays as a backstop on the number of waiting requests.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use super::policy::{Batching, JobId, RowPolicy, Rows, Tag, Turn};
use nmt_engine::decode::DecodeInput;

/// Throughput assumed before the worker has measured any, in tokens per second: below what
/// the shipped model does on one CPU core, so that a cold server errs toward refusing (the
/// measurements replace it within a couple of seconds of work).
pub const PRIOR_TOKENS_PER_SECOND: f64 = 500.0;
/// The prior counts as this much busy time of measurement.
const PRIOR_SECONDS: f64 = 0.5;
/// A measurement's weight falls by e every this many seconds of busy time after it: long
/// enough to average over batches of different sizes, short enough that a burst that fills
/// the batch is measured at full batch before many requests are decided on a stale rate.
const THROUGHPUT_MEMORY_SECONDS: f64 = 2.0;
/// The prior of the output fraction is 1 (outputs fill their budget), weighing as much as
/// this many budget tokens of finished texts.
const PRIOR_BUDGET_TOKENS: f64 = 256.0;
/// Each finished text fades the earlier ones by 1 / this.
const OUTPUT_MEMORY_TEXTS: f64 = 200.0;
/// The quantile of lateness (time to finish over the replay's estimate) that estimates are
/// scaled by: the door aims for all but this share of accepted requests to finish in time.
const LATENESS_QUANTILE: f64 = 0.98;
/// How far one late request moves the lateness factor, in log terms (an early one moves it
/// back by a 49th of that): some tens of late requests settle it.
const LATENESS_STEP: f64 = 0.05;
/// Requests expected to finish sooner than this do not count toward lateness: fixed costs
/// (a prediction, a reply) make their ratios noise.
const LATENESS_MIN_EXPECTED: Duration = Duration::from_secs(1);
/// The lateness factor stays within these bounds.
const LATENESS_RANGE: (f64, f64) = (0.5, 4.0);
/// `Retry-After` never says more than this.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(3600);

/// What the door checks requests against.
#[derive(Clone, Debug)]
pub struct AdmissionPolicy {
    /// How the worker gives rows, which the estimate replays.
    pub rows: RowPolicy,
    /// Most requests waiting for the batch (a backstop).
    pub max_queued_requests: usize,
    /// Longest expected time to finish that a request is accepted with.
    pub max_queue_wait: Duration,
}

/// Tokens per second of busy time, averaged with weights that fade with busy time.
#[derive(Clone, Debug)]
pub struct Throughput {
    tokens: f64,
    seconds: f64,
}

impl Throughput {
    pub fn with_prior(tokens_per_second: f64) -> Self {
        Throughput {
            tokens: tokens_per_second * PRIOR_SECONDS,
            seconds: PRIOR_SECONDS,
        }
    }

    /// `tokens` were processed in `busy`.
    pub fn record(&mut self, tokens: u64, busy: Duration) {
        let seconds = busy.as_secs_f64();
        let fade = (-seconds / THROUGHPUT_MEMORY_SECONDS).exp();
        self.tokens = self.tokens * fade + tokens as f64;
        self.seconds = self.seconds * fade + seconds;
    }

    pub fn tokens_per_second(&self) -> f64 {
        // A floor keeps a worker that measured nothing useful from dividing by zero.
        (self.tokens / self.seconds).max(1.0)
    }
}

/// The fraction of their output budget that finished texts used.
#[derive(Clone, Debug)]
pub struct OutputFraction {
    produced: f64,
    budget: f64,
}

impl Default for OutputFraction {
    fn default() -> Self {
        OutputFraction {
            produced: PRIOR_BUDGET_TOKENS,
            budget: PRIOR_BUDGET_TOKENS,
        }
    }
}

impl OutputFraction {
    pub fn record(&mut self, produced: usize, budget: usize) {
        if budget == 0 {
            return;
        }
        let keep = 1.0 - 1.0 / OUTPUT_MEMORY_TEXTS;
        self.produced = self.produced * keep + produced.min(budget) as f64;
        self.budget = self.budget * keep + budget as f64;
    }

    pub fn fraction(&self) -> f64 {
        (self.produced / self.budget).clamp(0.0, 1.0)
    }

    /// Expected output tokens of a text with this budget: at least 1 unless the budget is 0.
    pub fn expected(&self, budget: usize) -> usize {
        if budget == 0 {
            return 0;
        }
        ((self.fraction() * budget as f64).ceil() as usize).clamp(1, budget)
    }
}

/// How late accepted requests finish against the replay's estimate: a high quantile of the
/// ratio (time to finish over estimate), tracked online, that every estimate is scaled by.
///
/// The replay knows the scheduler's rules but not everything that slows a step: throughput
/// swings with the batch's lengths, the length predictor and the HTTP threads share the CPU,
/// outputs run longer or shorter than the average. Measured under a 10x overload, the
/// estimate was right at the median but 1.3x short at the 99th percentile. Tracking the
/// quantile the door aims for, as the throughput itself is tracked, corrects that on any
/// machine and model without a constant tuned on one.
#[derive(Clone, Debug)]
pub struct Lateness {
    factor: f64,
}

impl Default for Lateness {
    fn default() -> Self {
        Lateness { factor: 1.0 }
    }
}

impl Lateness {
    /// A request finished `ratio` times as late as its estimate. The factor moves up when
    /// the ratio is above it and down otherwise, in steps whose sizes balance where
    /// [`LATENESS_QUANTILE`] of the ratios are below it (a stochastic quantile estimate).
    pub fn record(&mut self, ratio: f64) {
        if !ratio.is_finite() {
            return;
        }
        let step = if ratio > self.factor {
            LATENESS_STEP * LATENESS_QUANTILE
        } else {
            -LATENESS_STEP * (1.0 - LATENESS_QUANTILE)
        };
        self.factor = (self.factor * step.exp()).clamp(LATENESS_RANGE.0, LATENESS_RANGE.1);
    }

    pub fn factor(&self) -> f64 {
        self.factor
    }
}

/// Why a request was refused at the door.
#[derive(Clone, Debug, PartialEq)]
pub enum Refusal {
    /// `--max-queued-requests` requests are waiting already.
    QueueFull {
        queued: usize,
        retry_after: Duration,
    },
    /// The work ahead and its own would take longer than `--max-queue-wait`. `expected` is a
    /// lower bound: the estimate stops counting once past the limit.
    TooLong {
        expected: Duration,
        limit: Duration,
        retry_after: Duration,
    },
}

/// A text of job `job` (its `text`-th) that finished, having produced `produced` of its
/// `budget` output tokens.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FinishedText {
    pub job: JobId,
    pub text: usize,
    pub produced: usize,
    pub budget: usize,
}

/// What the worker did in one turn of its loop, for [`Load::apply`], which applies it in
/// this order: texts join, the batch steps, texts finish, jobs leave. (Abandoned jobs leave at
/// the start of a turn; applied last they are gone all the same, since nothing else in the
/// turn names them.)
#[derive(Clone, Debug, Default)]
pub struct Progress {
    /// A job's next waiting text joined the batch (a job's texts join in order).
    pub joined: Vec<Tag>,
    /// Every row of the batch took a decoder step.
    pub stepped: bool,
    pub finished: Vec<FinishedText>,
    /// Jobs that left with texts unfinished: their client went away, or they failed.
    pub removed: Vec<JobId>,
    /// Tokens processed: sources encoded and rows stepped.
    pub processed: u64,
}

/// One accepted text, as the door counts it.
#[derive(Clone, Copy, Debug, PartialEq)]
struct TextLoad {
    /// Tokens encoded when it joins the batch.
    source: u64,
    /// Decoder steps expected in the batch: its expected output; once running, what is left of
    /// it, at least 1 until it finishes.
    steps: u64,
    /// What it counts against `max_batch_tokens`: source plus output budget.
    budget: usize,
}

/// An accepted request's unfinished texts.
#[derive(Clone, Debug, Default)]
struct JobLoad {
    /// Not in the batch yet, in the order they join.
    waiting: VecDeque<TextLoad>,
    /// In the batch, by text index.
    running: BTreeMap<usize, TextLoad>,
    /// When it was accepted and the replay's estimate of its finish then (before the
    /// lateness factor); `None` when the door took it without one.
    estimate: Option<(Instant, Duration)>,
}

impl JobLoad {
    fn work(&self) -> u64 {
        let waiting: u64 = self
            .waiting
            .iter()
            .map(|text| text.source + text.steps)
            .sum();
        waiting + self.running.values().map(|text| text.steps).sum::<u64>()
    }

    fn finished(&self) -> bool {
        self.waiting.is_empty() && self.running.is_empty()
    }
}

/// One model's accepted work and measured speed, shared by the door and the worker.
#[derive(Clone, Debug)]
pub struct Load {
    /// Accepted requests with texts unfinished, by acceptance.
    jobs: BTreeMap<JobId, JobLoad>,
    next_job: JobId,
    pub throughput: Throughput,
    pub output: OutputFraction,
    pub lateness: Lateness,
}

impl Default for Load {
    fn default() -> Self {
        Load {
            jobs: BTreeMap::new(),
            next_job: 0,
            throughput: Throughput::with_prior(PRIOR_TOKENS_PER_SECOND),
            output: OutputFraction::default(),
            lateness: Lateness::default(),
        }
    }
}

impl Load {
    /// Tokens of accepted work not done yet: sources not encoded, expected outputs not
    /// produced.
    pub fn work(&self) -> u64 {
        self.jobs.values().map(JobLoad::work).sum()
    }

    /// Accepted texts that have not joined the batch.
    pub fn waiting_texts(&self) -> usize {
        self.jobs.values().map(|job| job.waiting.len()).sum()
    }

    /// Accepted requests with texts that have not joined the batch.
    pub fn queued_requests(&self) -> usize {
        self.jobs
            .values()
            .filter(|job| !job.waiting.is_empty())
            .count()
    }

    /// Texts in the batch.
    pub fn batch_rows(&self) -> usize {
        self.jobs.values().map(|job| job.running.len()).sum()
    }

    /// How long the accepted work will take at the measured speed.
    pub fn expected_wait(&self) -> Duration {
        self.seconds(self.work()).mul_f64(self.lateness.factor())
    }

    /// `tokens` at the measured speed, without the lateness factor.
    fn seconds(&self, tokens: u64) -> Duration {
        Duration::try_from_secs_f64(tokens as f64 / self.throughput.tokens_per_second())
            .unwrap_or(MAX_RETRY_AFTER)
    }

    /// Accepts `inputs` and counts them in, or says why not.
    pub fn admit(
        &mut self,
        policy: &AdmissionPolicy,
        inputs: &[DecodeInput],
    ) -> Result<JobId, Refusal> {
        let job = self.assess(policy, inputs)?;
        let id = self.next_job;
        self.next_job += 1;
        if !job.finished() {
            self.jobs.insert(id, job);
        }
        Ok(id)
    }

    /// Whether `inputs` would be accepted now, counting nothing in: a request can be refused
    /// before work that only an accepted one needs (its length prediction).
    pub fn check(&self, policy: &AdmissionPolicy, inputs: &[DecodeInput]) -> Result<(), Refusal> {
        self.assess(policy, inputs).map(drop)
    }

    /// The load `inputs` would add, if the door accepts them now.
    fn assess(&self, policy: &AdmissionPolicy, inputs: &[DecodeInput]) -> Result<JobLoad, Refusal> {
        let mut job = JobLoad {
            waiting: inputs
                .iter()
                .map(|input| TextLoad {
                    source: input.source_ids.len() as u64,
                    steps: self.output.expected(input.max_output_tokens) as u64,
                    budget: input.token_budget(),
                })
                .collect(),
            ..JobLoad::default()
        };
        // When the work there is now will be done. Not when just enough of it is done for this
        // request to fit: under a steady overload that is always about now, and would send
        // every refused client back at once into the same full queue.
        let ahead = self.expected_wait().as_secs_f64();
        let retry_after =
            Duration::from_secs(ahead.ceil() as u64).clamp(Duration::from_secs(1), MAX_RETRY_AFTER);
        let queued = self.queued_requests();
        if queued >= policy.max_queued_requests.max(1) {
            return Err(Refusal::QueueFull {
                queued,
                retry_after,
            });
        }
        let rows = self.batch_rows();
        let room = match policy.rows.batching {
            Batching::Continuous => rows + inputs.len() <= policy.rows.max_batch_size,
            Batching::Off => rows == 0,
        };
        let joins_at_once = self.waiting_texts() == 0 && room;
        let idle = self.jobs.is_empty();
        if !joins_at_once && !idle {
            let factor = self.lateness.factor();
            let limit =
                policy.max_queue_wait.as_secs_f64() * self.throughput.tokens_per_second() / factor;
            let tokens = match policy.rows.batching {
                Batching::Continuous => Replay::new(policy, &self.jobs, &job).run(limit as u64),
                // One job at a time: everything accepted comes first.
                Batching::Off => self.work() + job.work(),
            };
            let estimate = self.seconds(tokens);
            job.estimate = Some((Instant::now(), estimate));
            let expected = estimate.mul_f64(factor);
            if expected > policy.max_queue_wait {
                return Err(Refusal::TooLong {
                    expected,
                    limit: policy.max_queue_wait,
                    retry_after,
                });
            }
        }
        Ok(job)
    }

    /// Takes back a request [`Load::admit`] accepted that never reached the worker.
    pub fn withdraw(&mut self, id: JobId) {
        self.jobs.remove(&id);
    }

    /// Counts what the worker did in a turn that kept it `busy`.
    pub fn apply(&mut self, progress: &Progress, busy: Duration) {
        for (id, index) in &progress.joined {
            let Some(job) = self.jobs.get_mut(id) else {
                continue;
            };
            if let Some(text) = job.waiting.pop_front() {
                job.running.insert(*index, text);
            }
        }
        if progress.stepped {
            for text in self
                .jobs
                .values_mut()
                .flat_map(|job| job.running.values_mut())
            {
                text.steps = text.steps.saturating_sub(1).max(1);
            }
        }
        for finished in &progress.finished {
            if let Some(job) = self.jobs.get_mut(&finished.job) {
                job.running.remove(&finished.text);
                if job.finished() {
                    if let Some((accepted, estimate)) = job.estimate {
                        if estimate >= LATENESS_MIN_EXPECTED {
                            let ratio = accepted.elapsed().as_secs_f64() / estimate.as_secs_f64();
                            self.lateness.record(ratio);
                        }
                    }
                    self.jobs.remove(&finished.job);
                }
            }
            self.output.record(finished.produced, finished.budget);
        }
        for id in &progress.removed {
            self.jobs.remove(id);
        }
        if progress.processed > 0 {
            self.throughput.record(progress.processed, busy);
        }
    }
}

/// One worker's door: the load it has accepted and the policy it checks new requests against.
/// The worker reports its progress to it once a turn ([`Progress`]); requests read it from
/// their own threads.
pub struct Door {
    load: Mutex<Load>,
    pub policy: AdmissionPolicy,
}

impl Door {
    pub fn new(policy: AdmissionPolicy) -> Self {
        Door {
            load: Mutex::new(Load::default()),
            policy,
        }
    }

    pub fn load(&self) -> MutexGuard<'_, Load> {
        // The load is plain numbers, consistent after any statement: a panic elsewhere while
        // it was held leaves nothing half-done.
        self.load.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The worker a new request goes to, and how long it would expect to wait there: the one
/// expected to finish its accepted work first (the first on a tie, so a lone client keeps to
/// one worker).
pub fn least_loaded(doors: &[Arc<Door>]) -> (usize, Duration) {
    doors
        .iter()
        .map(|door| door.load().expected_wait())
        .enumerate()
        .min_by_key(|&(_, wait)| wait)
        .unwrap_or_default()
}

/// The scheduler's row policy ([`RowPolicy::fill`]) run forward on the expected sizes, to
/// tell when a new job would finish: rows end after their expected steps, and free rows go to
/// waiting texts as the worker gives them. Time is counted in the tokens processed, as the
/// worker's throughput is: every row's step, every source encoded.
///
/// A closed formula got this wrong. Processor sharing (each job ahead delays a new one by
/// the lesser of their works) assumes every job is served at once; but a job cannot hold
/// more rows than it has texts, so one-text requests beyond the batch's rows wait in line,
/// and under a 10x overload the formula promised about 1.7x too little
/// (`docs/benchmarks/overload-by-wait.md`).
struct Replay<'a> {
    policy: RowPolicy,
    /// Running rows: the step each ends at, its job and its token budget.
    rows: BinaryHeap<Reverse<(u64, JobId, usize)>>,
    /// Each job's waiting texts and how many of them have joined.
    waiting: BTreeMap<JobId, (&'a VecDeque<TextLoad>, usize)>,
    /// Rows each job holds.
    held: BTreeMap<JobId, usize>,
    /// Jobs with texts waiting, in the order they take free rows.
    turn: BTreeSet<Turn>,
    batch_tokens: usize,
    step: u64,
    tokens: u64,
}

impl<'a> Replay<'a> {
    /// The new job's id: after every accepted one.
    const NEW: JobId = JobId::MAX;

    fn new(policy: &AdmissionPolicy, jobs: &'a BTreeMap<JobId, JobLoad>, new: &'a JobLoad) -> Self {
        let mut replay = Replay {
            policy: policy.rows,
            rows: BinaryHeap::new(),
            waiting: BTreeMap::new(),
            held: BTreeMap::new(),
            turn: BTreeSet::new(),
            batch_tokens: 0,
            step: 0,
            tokens: 0,
        };
        let all = jobs
            .iter()
            .map(|(&id, job)| (id, job))
            .chain([(Self::NEW, new)]);
        for (id, job) in all {
            for text in job.running.values() {
                replay
                    .rows
                    .push(Reverse((text.steps.max(1), id, text.budget)));
                replay.batch_tokens += text.budget;
            }
            let held = job.running.len();
            replay.held.insert(id, held);
            if !job.waiting.is_empty() {
                replay.waiting.insert(id, (&job.waiting, 0));
                replay.turn.insert(Turn { held, job: id });
            }
        }
        replay
    }

    /// Tokens processed until the new job's last text ends, or a little past `limit` where
    /// that comes first.
    fn run(mut self, limit: u64) -> u64 {
        let mut new_texts = self
            .waiting
            .get(&Self::NEW)
            .map_or(0, |(texts, _)| texts.len());
        loop {
            let policy = self.policy;
            policy.fill(&mut self);
            let Some(&Reverse((end, _, _))) = self.rows.peek() else {
                return self.tokens;
            };
            self.tokens += (end - self.step) * self.rows.len() as u64;
            self.step = end;
            while let Some(&Reverse((at, id, budget))) = self.rows.peek() {
                if at != end {
                    break;
                }
                self.rows.pop();
                self.batch_tokens -= budget;
                let held = self.held.get_mut(&id).expect("a job with rows");
                if self.turn.remove(&Turn {
                    held: *held,
                    job: id,
                }) {
                    self.turn.insert(Turn {
                        held: *held - 1,
                        job: id,
                    });
                }
                *held -= 1;
                if id == Self::NEW {
                    new_texts -= 1;
                    if new_texts == 0 {
                        return self.tokens;
                    }
                }
            }
            if self.tokens > limit {
                return self.tokens;
            }
        }
    }
}

impl Rows for Replay<'_> {
    fn batch(&self) -> (usize, usize) {
        (self.rows.len(), self.batch_tokens)
    }

    fn next_in_turn(&self) -> Option<(JobId, usize)> {
        let turn = self.turn.first()?;
        let (texts, joined) = &self.waiting[&turn.job];
        Some((turn.job, texts[*joined].budget))
    }

    fn take(&mut self, job: JobId) -> bool {
        let (texts, joined) = self.waiting.get_mut(&job).expect("a waiting job");
        let text = texts[*joined];
        *joined += 1;
        let more = *joined < texts.len();
        let held = self.held.get_mut(&job).expect("every job");
        self.turn.remove(&Turn { held: *held, job });
        *held += 1;
        if more {
            self.turn.insert(Turn { held: *held, job });
        }
        self.tokens += text.source;
        self.batch_tokens += text.budget;
        self.rows
            .push(Reverse((self.step + text.steps.max(1), job, text.budget)));
        more
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> AdmissionPolicy {
        AdmissionPolicy {
            rows: RowPolicy {
                batching: Batching::Continuous,
                max_batch_size: 4,
                max_batch_tokens: 10_000,
            },
            max_queued_requests: 100,
            max_queue_wait: Duration::from_secs(10),
        }
    }

    /// A text of `source` tokens (EOS included) with an output budget of `output`.
    fn text(source: usize, output: usize) -> DecodeInput {
        DecodeInput::new(vec![5; source], output)
    }

    /// A load measured at `tokens_per_second` (the prior forgotten) with nothing accepted.
    fn measured(tokens_per_second: f64) -> Load {
        let mut load = Load::default();
        for _ in 0..100 {
            load.throughput
                .record(tokens_per_second as u64, Duration::from_secs(1));
        }
        load
    }

    /// A job of `inputs`, none of them in the batch, its outputs expected to fill budgets.
    fn job(inputs: &[DecodeInput]) -> JobLoad {
        let mut load = Load::default();
        let id = load.admit(&policy(), inputs).unwrap();
        load.jobs.remove(&id).unwrap()
    }

    /// `count` accepted one-text requests in the batch, `steps` left each.
    fn running_jobs(load: &mut Load, count: usize, steps: u64) {
        for _ in 0..count {
            let mut job = JobLoad::default();
            job.running.insert(
                0,
                TextLoad {
                    source: 10,
                    steps,
                    budget: 100,
                },
            );
            load.jobs.insert(load.next_job, job);
            load.next_job += 1;
        }
    }

    /// `count` accepted one-text requests waiting.
    fn waiting_jobs(load: &mut Load, count: usize, source: usize, output: usize) {
        for _ in 0..count {
            load.jobs
                .insert(load.next_job, job(&[text(source, output)]));
            load.next_job += 1;
        }
    }

    #[test]
    fn throughput_follows_measurements_from_the_prior() {
        let mut throughput = Throughput::with_prior(PRIOR_TOKENS_PER_SECOND);
        assert_eq!(throughput.tokens_per_second(), PRIOR_TOKENS_PER_SECOND);
        // Work at 2000 tokens/s, in 20 ms steps: two seconds take it most of the way there,
        // ten all of it.
        for _ in 0..100 {
            throughput.record(40, Duration::from_millis(20));
        }
        let rate = throughput.tokens_per_second();
        assert!((1500.0..2000.0).contains(&rate), "{rate}");
        for _ in 0..400 {
            throughput.record(40, Duration::from_millis(20));
        }
        let rate = throughput.tokens_per_second();
        assert!((1990.0..=2000.0).contains(&rate), "{rate}");
        // An idle worker measures nothing: the estimate stays.
        throughput.record(0, Duration::ZERO);
        assert_eq!(throughput.tokens_per_second(), rate);
    }

    #[test]
    fn outputs_are_expected_to_use_the_fraction_of_their_budget_seen_so_far() {
        let mut output = OutputFraction::default();
        assert_eq!(
            output.expected(50),
            50,
            "before any text finished: the budget"
        );
        for _ in 0..1000 {
            output.record(10, 40);
        }
        assert!(
            (output.fraction() - 0.25).abs() < 0.01,
            "{}",
            output.fraction()
        );
        assert_eq!(output.expected(30), 8, "7.5 rounded up");
        assert_eq!(output.expected(1), 1);
        assert_eq!(output.expected(0), 0);
    }

    #[test]
    fn a_short_text_waits_in_line_behind_the_texts_beyond_the_batchs_rows() {
        let policy = policy();
        // 1000 tokens/s, four rows, a 10 s limit. Four one-text requests run, 90 steps left
        // each; 98 more wait, each of 10 source tokens and 90 expected output tokens.
        let mut load = measured(1000.0);
        running_jobs(&mut load, 4, 90);
        waiting_jobs(&mut load, 98, 10, 90);
        assert_eq!(
            (load.work(), load.waiting_texts(), load.queued_requests()),
            (10_160, 98, 98)
        );
        // One text of 10 output tokens: each row goes to the earliest of the requests that
        // hold none, so it joins with the last two of the 98. The first four end (360
        // tokens), 24 groups of four join and run (400 each), then it and the last two (30 +
        // 3 x 10): 10.02 s. Processor sharing (each of the 102 ahead delaying it by the lesser
        // of their work and its 20) would have said 2.06 s.
        let short = job(&[text(10, 10)]);
        assert_eq!(
            Replay::new(&policy, &load.jobs, &short).run(u64::MAX),
            10_020
        );
        let refused = load.admit(&policy, &[text(10, 10)]);
        let Err(Refusal::TooLong {
            expected,
            limit,
            retry_after,
        }) = refused
        else {
            panic!("{refused:?}")
        };
        assert_eq!(limit, policy.max_queue_wait);
        assert!(expected > limit, "{expected:?}");
        // Retry when the 10.16 s of work there is now are done.
        assert_eq!(retry_after, Duration::from_secs(11));
        // Refusals count nothing in, and checking tells the same without counting in either.
        assert_eq!(load.work(), 10_160);
        assert_eq!(load.check(&policy, &[text(10, 10)]), refused.map(drop));
        assert!(load.check(&policy, &[text(1, 1)]).is_ok());
        assert_eq!(load.work(), 10_160);
        // With one group fewer ahead the same text is taken.
        let mut shorter = measured(1000.0);
        running_jobs(&mut shorter, 4, 90);
        waiting_jobs(&mut shorter, 94, 10, 90);
        let id = shorter.admit(&policy, &[text(10, 10)]).unwrap();
        assert_eq!(
            shorter.jobs[&id].waiting[0],
            TextLoad {
                source: 10,
                steps: 10,
                budget: 20
            }
        );
    }

    #[test]
    fn the_lateness_factor_settles_at_the_98th_percentile_of_lateness() {
        let mut lateness = Lateness::default();
        // Ratios spread evenly over [0.5, 1.5): the 98th percentile is 1.48.
        let mut state = 12345u64;
        for _ in 0..50_000 {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let uniform = (state >> 11) as f64 / (1u64 << 53) as f64;
            lateness.record(0.5 + uniform);
        }
        let factor = lateness.factor();
        assert!((1.42..1.50).contains(&factor), "{factor}");
        // Estimates that are always early bring it down, to no less than its floor.
        for _ in 0..100_000 {
            lateness.record(0.1);
        }
        assert_eq!(lateness.factor(), LATENESS_RANGE.0);
    }

    #[test]
    fn estimates_are_scaled_by_lateness_and_finished_requests_measure_it() {
        let policy = policy();
        let mut load = measured(1000.0);
        running_jobs(&mut load, 4, 90);
        waiting_jobs(&mut load, 50, 10, 90);
        // 5.36 s of work now, 5.46 s with one more text: taken...
        let id = load.admit(&policy, &[text(10, 90)]).unwrap();
        assert_eq!(
            load.jobs[&id].estimate.unwrap().1,
            Duration::from_millis(5_460)
        );
        // ...unless requests have been finishing twice as late as estimated.
        load.lateness.factor = 2.0;
        assert!(matches!(
            load.admit(&policy, &[text(10, 90)]),
            Err(Refusal::TooLong { .. })
        ));
        assert_eq!(load.expected_wait(), Duration::from_millis(2 * 5_460));
        // A request that finishes later than the factor says moves it up.
        let mut job = JobLoad::default();
        job.running.insert(
            0,
            TextLoad {
                source: 10,
                steps: 1,
                budget: 20,
            },
        );
        job.estimate = Some((
            Instant::now() - Duration::from_secs(6),
            Duration::from_secs(2),
        ));
        load.jobs.insert(1_000, job);
        let finished = Progress {
            finished: vec![FinishedText {
                job: 1_000,
                text: 0,
                produced: 1,
                budget: 10,
            }],
            ..Progress::default()
        };
        load.apply(&finished, Duration::ZERO);
        assert!(load.lateness.factor() > 2.0, "{}", load.lateness.factor());
    }

    #[test]
    fn a_text_behind_a_big_request_takes_the_next_free_row() {
        let policy = policy();
        // One request of 60 texts: four run (90 steps left), 56 wait: 56 s of work.
        let mut load = measured(1000.0);
        let text_load = TextLoad {
            source: 10,
            steps: 90,
            budget: 100,
        };
        let mut big = JobLoad::default();
        for index in 0..4 {
            big.running.insert(index, text_load);
        }
        big.waiting = vec![text_load; 56].into();
        load.jobs.insert(0, big);
        load.next_job = 1;
        // A one-text request holds no row, so it takes one of the first that free: the four
        // rows end (360 tokens), it joins with three of the big one's (40) and runs 90 steps
        // beside them (360): 0.76 s.
        let one = job(&[text(10, 90)]);
        assert_eq!(Replay::new(&policy, &load.jobs, &one).run(u64::MAX), 760);
        assert!(load.admit(&policy, &[text(10, 90)]).is_ok());
        // Forty texts alternate with the big one for rows: one in the first round (beside
        // the one-text request), two in each of the next 20, 22 rounds in all (360 + 21 x
        // 400 tokens), where waiting for the big one to finish would take 57 s.
        let forty = job(&vec![text(10, 90); 40]);
        assert_eq!(
            Replay::new(&policy, &load.jobs, &forty).run(u64::MAX),
            8_760
        );
        assert!(load.admit(&policy, &vec![text(10, 90); 40]).is_ok());
    }

    #[test]
    fn the_batchs_token_limit_holds_texts_back_in_the_replay_too() {
        // Room for 4 rows but only 250 tokens: two texts of budget 100 at a time.
        let mut policy = policy();
        policy.rows.max_batch_tokens = 250;
        let mut load = measured(1000.0);
        waiting_jobs(&mut load, 3, 10, 90);
        // Two join and run 90 steps (200), then the third and the new one (200).
        let replayed = Replay::new(&policy, &load.jobs, &job(&[text(10, 90)])).run(u64::MAX);
        assert_eq!(replayed, 400);
        // A text over the limit runs alone rather than never.
        let huge = job(&[text(10, 500)]);
        let replayed = Replay::new(&policy, &load.jobs, &huge).run(u64::MAX);
        // The third runs alone (100), the text over the limit after it, alone (510).
        assert_eq!(replayed, 200 + 100 + 510);
    }

    #[test]
    fn a_request_that_joins_at_once_or_finds_the_model_idle_is_never_refused() {
        let policy = policy();
        // Two rows of the four run for 20 s each, and nothing waits.
        let mut load = measured(100.0);
        running_jobs(&mut load, 2, 1_000);
        let two = load
            .admit(&policy, &[text(10, 500), text(10, 500)])
            .unwrap();
        let joined = Progress {
            joined: vec![(two, 0), (two, 1)],
            ..Progress::default()
        };
        load.apply(&joined, Duration::ZERO);
        // The batch is full now: the next one would wait 20 s for a row.
        assert!(matches!(
            load.admit(&policy, &[text(10, 90)]),
            Err(Refusal::TooLong { .. })
        ));
        // A request larger than the limit alone is taken when nothing else is there.
        let mut idle = measured(100.0);
        assert!(idle.admit(&policy, &vec![text(10, 90); 64]).is_ok());
        // Without batching a request joins at once only into an empty batch, and a small
        // one waits for all of a big one.
        let mut off = policy.clone();
        off.rows.batching = Batching::Off;
        let mut load = measured(100.0);
        running_jobs(&mut load, 1, 1_000);
        assert!(load.admit(&off, &[text(10, 90)]).is_err());
        let mut load = measured(100.0);
        running_jobs(&mut load, 1, 10);
        assert!(load.admit(&off, &[text(10, 90)]).is_ok());
    }

    #[test]
    fn the_count_of_waiting_requests_stays_a_backstop_and_work_is_taken_off_as_done() {
        let policy = AdmissionPolicy {
            max_queued_requests: 2,
            ..policy()
        };
        let mut load = Load::default();
        let request = [text(10, 90)];
        let first = load.admit(&policy, &request).unwrap();
        let second = load.admit(&policy, &request).unwrap();
        let refused = load.admit(&policy, &request);
        assert!(
            matches!(refused, Err(Refusal::QueueFull { queued: 2, .. })),
            "{refused:?}"
        );
        load.withdraw(first);
        assert_eq!(
            (load.work(), load.waiting_texts(), load.queued_requests()),
            (100, 1, 1)
        );
        assert_eq!(load.jobs.keys().collect::<Vec<_>>(), vec![&second]);
        // The worker encodes the text's source and takes 30 steps in 10 ms...
        let joined = Progress {
            joined: vec![(second, 0)],
            stepped: true,
            processed: 11,
            ..Progress::default()
        };
        load.apply(&joined, Duration::from_millis(1));
        for _ in 0..29 {
            let step = Progress {
                stepped: true,
                processed: 1,
                ..Progress::default()
            };
            load.apply(&step, Duration::from_micros(300));
        }
        assert_eq!(
            (load.work(), load.waiting_texts(), load.batch_rows()),
            (60, 0, 1)
        );
        assert!(load.throughput.tokens_per_second() > PRIOR_TOKENS_PER_SECOND);
        // ...and it finishes at 40 of its 90 (the 60 expected tokens left go with it).
        let finished = Progress {
            finished: vec![FinishedText {
                job: second,
                text: 0,
                produced: 40,
                budget: 90,
            }],
            ..Progress::default()
        };
        load.apply(&finished, Duration::ZERO);
        assert_eq!(
            (load.work(), load.waiting_texts(), load.batch_rows()),
            (0, 0, 0)
        );
        assert!(load.jobs.is_empty());
        assert!(load.output.fraction() < 1.0);
        // A job that leaves takes all of its work with it.
        let third = load.admit(&policy, &vec![text(10, 90); 3]).unwrap();
        load.apply(
            &Progress {
                joined: vec![(third, 0)],
                removed: vec![third],
                ..Progress::default()
            },
            Duration::ZERO,
        );
        assert_eq!(load.work(), 0);
    }
}
