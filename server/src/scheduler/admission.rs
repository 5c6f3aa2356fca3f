//! Admission by expected wait: a request is refused at the door when its model is expected to
//! finish it later than `--max-queue-wait` (429 with `Retry-After`), when taking it would make
//! a request already accepted finish later than it was promised (429), or when even an idle
//! model would not finish it within the request timeout (413). Refusing costs the client one
//! round trip; accepting would cost it the request timeout and the server the work done until
//! then.
//!
//! Work is counted in cost units ([`cost`]): encoding a source grows with its tokens and their
//! pairs, a decoder step with its rows and with what they attend to, so a long input is priced
//! as what it takes. Each text's output is expected to use the fraction of its budget that
//! finished texts used. Throughput is units per second of the worker's busy time, a moving
//! average starting from a prior. The expected finish comes from running the scheduler's own
//! row policy ([`RowPolicy::fill`]) forward on these sizes ([`Replay`]): when each request's
//! texts get rows, and when they end.
//!
//! Every accepted request holds a promise: the time by which the door expected it to be done
//! when it took it (`--max-queue-wait` after acceptance, or its own expected time when it found
//! the model idle and needs longer). A new request joins the line ahead of requests that hold
//! rows, and its rows slow every step, so the door replays the line with it and refuses it
//! when any accepted request would then miss its promise, not only when the new one would.
//!
//! A request is counted in ([`Load::admit`]) before its lengths are predicted, on the linear
//! fit's lengths, and its figures are replaced by the predicted ones afterwards
//! ([`Load::replace`]): requests arriving together are judged one after the other, each with
//! the others counted, instead of all passing the check on the same load. A request whose
//! client leaves before it reaches the worker is taken back ([`Load::withdraw`]).
//!
//! The idle model still takes a request that needs longer than `--max-queue-wait`, since it
//! waits for nobody, unless its own work is expected to take longer than the request timeout
//! allows ([`AdmissionPolicy::max_request_cost`]): at the fastest the worker has gone lately,
//! it could only time out, and is refused for good (413); at the speed measured under a load
//! that left a moment ago, it is refused for now (429, until that measurement is stale).
//! `--max-queued-requests` stays as a backstop on the number of waiting requests.
//!
//! Before anything is measured the door assumes a tenth of the speed the costs were
//! calibrated at ([`cost::PRIOR_UNITS_PER_SECOND`]): the requests it takes then are promised
//! their time at that speed, and a storm slows the worker far below its quiet speed.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use super::cost::{self, StepCost, StepRows};
use super::policy::{JobId, RowPolicy, Tag};
use super::replay::{JobLoad, Replay, TextLoad, Verdict};
use nmt_engine::decode::DecodeInput;

/// The prior counts as this much busy time of measurement: long enough that the first turns,
/// whose speed says little (a turn that only encodes goes at another speed than the steps
/// that follow), do not replace it; short enough that some seconds of work do.
const PRIOR_SECONDS: f64 = 2.0;
/// A measurement's weight falls by e every this many seconds of busy time after it: long
/// enough to average over batches of different sizes, short enough that a burst that fills
/// the batch is measured at full batch before many requests are decided on a stale rate.
const THROUGHPUT_MEMORY_SECONDS: f64 = 2.0;
/// The peak speed falls by e every this many seconds of busy time: a storm of some minutes
/// does not lower it much, a machine that got slower for good is followed within the hour.
const PEAK_MEMORY_SECONDS: f64 = 600.0;
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
/// How long after its load left the worker's measured speed still says how fast it goes: a
/// request that finds it idle is judged at that speed until then, and at its best after.
const MEASUREMENT_STALE_AFTER: Duration = Duration::from_secs(10);
/// `Retry-After` never says more than this.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(3600);
/// The share of `--request-timeout` that a request's own work, on an idle model, may be
/// expected to take: the rest is left for tokenizing, predicting lengths and answering.
pub const MAX_REQUEST_COST_SHARE: f64 = 0.9;

/// What the door checks requests against.
#[derive(Clone, Debug)]
pub struct AdmissionPolicy {
    /// How the worker gives rows, which the estimate replays.
    pub rows: RowPolicy,
    /// Most requests waiting for the batch (a backstop).
    pub max_queued_requests: usize,
    /// Longest expected time to finish that a request is accepted with, and what it is
    /// promised.
    pub max_queue_wait: Duration,
    /// Longest that a request's own work may be expected to take on an idle model: beyond it
    /// the request could only time out ([`MAX_REQUEST_COST_SHARE`] of the request timeout).
    pub max_request_cost: Duration,
}

/// Work per second of busy time (cost units, or tokens), averaged with weights that fade with
/// busy time, and the fastest such average of the last minutes.
#[derive(Clone, Debug)]
pub struct Throughput {
    work: f64,
    seconds: f64,
    /// The busy seconds measured, faded like the rest: how much of the average is not prior.
    measured: f64,
    /// The fastest the average has been since it outweighed the prior, fading toward it.
    peak: f64,
}

impl Throughput {
    /// Nothing measured yet: 1 a second until something is.
    pub fn unmeasured() -> Self {
        Throughput::with_prior(0.0, 0.0)
    }

    /// Starting from `per_second` (weighing [`PRIOR_SECONDS`]), and from `peak` as the fastest
    /// it goes.
    pub fn with_prior(per_second: f64, peak: f64) -> Self {
        Throughput {
            work: per_second * PRIOR_SECONDS,
            seconds: PRIOR_SECONDS,
            measured: 0.0,
            peak,
        }
    }

    /// `work` was done in `busy`.
    pub fn record(&mut self, work: f64, busy: Duration) {
        let seconds = busy.as_secs_f64();
        let fade = (-seconds / THROUGHPUT_MEMORY_SECONDS).exp();
        self.work = self.work * fade + work;
        self.seconds = self.seconds * fade + seconds;
        self.measured = self.measured * fade + seconds;
        self.peak *= (-seconds / PEAK_MEMORY_SECONDS).exp();
        if self.settled() {
            self.peak = self.peak.max(self.per_second());
        }
    }

    /// Whether the measurements outweigh the prior.
    pub fn settled(&self) -> bool {
        self.measured >= PRIOR_SECONDS
    }

    /// The speed now: what the work ahead is expected to go at.
    pub fn per_second(&self) -> f64 {
        // A floor keeps a worker that measured nothing useful from dividing by zero.
        (self.work / self.seconds.max(f64::MIN_POSITIVE)).max(1.0)
    }

    /// The fastest the worker has gone lately: what a request's own work is judged at to
    /// refuse it for good (413). A storm slows the worker, its refused clients taking the
    /// CPU, but what it could not finish then it could finish alone once the storm is over.
    pub fn peak_per_second(&self) -> f64 {
        self.peak.max(self.per_second())
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
/// The replay knows the scheduler's rules and what a step costs, but not everything that
/// slows one: the length predictor and the HTTP threads share the CPU, outputs run longer or
/// shorter than the average, the cost formula is a fit. Tracking the quantile the door aims
/// for, as the throughput itself is tracked, corrects that on any machine and model without a
/// constant tuned on one.
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
    /// Its own work, on an idle model, is expected to take longer than
    /// [`AdmissionPolicy::max_request_cost`]: it would time out however long it waited.
    TooCostly { expected: Duration, limit: Duration },
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
    /// Taking it would make a request already accepted finish later than it was promised.
    Crowded { retry_after: Duration },
    /// The model is idle but was measured a moment ago, under the load that just left, too
    /// slow to finish it within [`AdmissionPolicy::max_request_cost`].
    SlowNow {
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
/// this order: jobs leave (abandoned jobs leave at the start of a turn, failed ones took no
/// step worth counting), texts join, the batch steps, texts finish.
#[derive(Clone, Debug, Default)]
pub struct Progress {
    /// A job's next waiting text joined the batch (a job's texts join in order).
    pub joined: Vec<Tag>,
    /// Every row of the batch took a decoder step.
    pub stepped: bool,
    pub finished: Vec<FinishedText>,
    /// Jobs that left with texts unfinished: their client went away, or they failed.
    pub removed: Vec<JobId>,
    /// Tokens processed: sources encoded and rows stepped (for the tokens/s gauge only).
    pub processed: u64,
}

/// One model's accepted work and measured speed, shared by the door and the worker.
#[derive(Clone, Debug)]
pub struct Load {
    /// Accepted requests with texts unfinished, by acceptance.
    pub(super) jobs: BTreeMap<JobId, JobLoad>,
    pub(super) next_job: JobId,
    /// Cost units per second of busy time: the speed the door assumes.
    pub throughput: Throughput,
    /// Tokens (sources encoded, rows stepped) per second of busy time, for the gauge.
    pub tokens: Throughput,
    pub output: OutputFraction,
    pub lateness: Lateness,
    /// What a decoder step costs on this worker's backend.
    pub(super) cost: StepCost,
    /// Since when nothing has been accepted and unfinished (`None` while something is).
    idle_since: Option<Instant>,
}

impl Default for Load {
    fn default() -> Self {
        Load {
            jobs: BTreeMap::new(),
            next_job: 0,
            throughput: Throughput::with_prior(
                cost::PRIOR_UNITS_PER_SECOND,
                cost::CALIBRATED_UNITS_PER_SECOND,
            ),
            tokens: Throughput::unmeasured(),
            output: OutputFraction::default(),
            lateness: Lateness::default(),
            cost: StepCost::default(),
            idle_since: None,
        }
    }
}

impl Load {
    /// Cost units of accepted work not done yet: sources not encoded, expected outputs not
    /// produced.
    pub fn work(&self) -> f64 {
        self.jobs.values().map(|job| job.work(&self.cost)).sum()
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

    /// `units` at the measured speed, without the lateness factor.
    fn seconds(&self, units: f64) -> Duration {
        Duration::try_from_secs_f64(units / self.throughput.per_second()).unwrap_or(MAX_RETRY_AFTER)
    }

    /// Cost units the model is expected to get through in `time`, the lateness factor
    /// taken into account: what a request may be given to finish within `time`.
    fn units_within(&self, time: Duration) -> f64 {
        time.as_secs_f64() * self.throughput.per_second() / self.lateness.factor()
    }

    /// Accepts `inputs` and counts them in, or says why not.
    pub fn admit(
        &mut self,
        policy: &AdmissionPolicy,
        inputs: &[DecodeInput],
    ) -> Result<JobId, Refusal> {
        self.admit_at(policy, inputs, Instant::now())
    }

    /// [`Load::admit`] at `now`.
    pub(super) fn admit_at(
        &mut self,
        policy: &AdmissionPolicy,
        inputs: &[DecodeInput],
        now: Instant,
    ) -> Result<JobId, Refusal> {
        let job = self.assess(policy, inputs, now)?;
        let id = self.next_job;
        self.next_job += 1;
        // With the finish's event below: how each request's estimate fares, by its size and
        // by whether texts were waiting for rows when it came (RUST_LOG=nmt_server=debug).
        tracing::debug!(
            job = id,
            texts = inputs.len(),
            source_tokens = inputs.iter().map(|i| i.source_ids.len()).sum::<usize>(),
            waiting_texts = self.waiting_texts(),
            batch_rows = self.batch_rows(),
            estimate_s = job.estimate.map(|(_, e)| e.as_secs_f64()),
            lateness_factor = self.lateness.factor(),
            "accepted"
        );
        if !job.finished() {
            self.jobs.insert(id, job);
        }
        self.note_idle();
        Ok(id)
    }

    /// Replaces the figures of accepted job `id`, none of whose texts has joined the batch
    /// yet, by those of `inputs` (its predicted lengths, where it was accepted on the linear
    /// fit's). It keeps its place in line, its promise and its estimate.
    pub fn replace(&mut self, id: JobId, inputs: &[DecodeInput]) {
        let texts = self.text_loads(inputs);
        if let Some(job) = self.jobs.get_mut(&id) {
            if job.running.is_empty() {
                job.waiting = texts;
            }
        }
    }

    /// The door's figures of `inputs`, none of them in the batch.
    fn text_loads(&self, inputs: &[DecodeInput]) -> VecDeque<TextLoad> {
        inputs
            .iter()
            .map(|input| TextLoad {
                source: input.source_ids.len() as u64,
                steps: self.expected_steps(input) as u64,
                position: 0,
                budget: input.token_budget(),
            })
            .collect()
    }

    /// The steps `input` is expected to take: the length planned for it and its EOS where it
    /// has one (a length-aware model's outputs end within a few subwords of the plan: 1.00 of
    /// it on average for verses and for inputs of ~630 subwords alike), else the share of its
    /// budget that finished texts used. The budget share alone priced a long input's output
    /// at the verses' share of a budget its own output fills more of (0.46 against 0.65-0.80
    /// under the 1,024-token cap).
    fn expected_steps(&self, input: &DecodeInput) -> usize {
        match input.target_length {
            Some(planned) if input.max_output_tokens > 0 => {
                (planned + 1).clamp(1, input.max_output_tokens)
            }
            _ => self.output.expected(input.max_output_tokens),
        }
    }

    /// Whether the speed now was measured under a load that has not been gone long: a worker
    /// left idle measures nothing, and what it measured under a storm says little about how
    /// it goes once the storm is over.
    fn measured_lately(&self, now: Instant) -> bool {
        let idle_for = self
            .idle_since
            .map_or(Duration::MAX, |since| now.saturating_duration_since(since));
        self.throughput.settled() && idle_for < MEASUREMENT_STALE_AFTER
    }

    /// Whole seconds (at least 1) until the speed measured under the last load is stale.
    fn until_stale(&self, now: Instant) -> Duration {
        let since = self.idle_since.unwrap_or(now);
        let left = MEASUREMENT_STALE_AFTER.saturating_sub(now.saturating_duration_since(since));
        Duration::from_secs(left.as_secs_f64().ceil() as u64).max(Duration::from_secs(1))
    }

    /// Notes when the door's load became empty (or that it is not).
    fn note_idle(&mut self) {
        if self.jobs.is_empty() {
            self.idle_since.get_or_insert_with(Instant::now);
        } else {
            self.idle_since = None;
        }
    }

    /// When the work there is now will be done, in whole seconds (at least 1). Not when just
    /// enough of it is done for a request to fit: under a steady overload that is always
    /// about now, and would send every refused client back at once into the same full queue.
    fn retry_after(&self) -> Duration {
        let ahead = self.expected_wait().as_secs_f64();
        Duration::from_secs(ahead.ceil() as u64).clamp(Duration::from_secs(1), MAX_RETRY_AFTER)
    }

    /// The load `inputs` would add, with its promise, if the door accepts them at `now`.
    fn assess(
        &self,
        policy: &AdmissionPolicy,
        inputs: &[DecodeInput],
        now: Instant,
    ) -> Result<JobLoad, Refusal> {
        let mut job = JobLoad {
            waiting: self.text_loads(inputs),
            ..JobLoad::default()
        };
        let factor = self.lateness.factor();
        let alone = Replay::new(policy.rows, self.cost, &BTreeMap::new(), &job)
            .run(&[])
            .finish();
        // Judged at the fastest the worker has gone lately, without the lateness that a load
        // adds: a refusal for good must not depend on who else is asking.
        let at_best = alone / self.throughput.peak_per_second();
        if at_best > policy.max_request_cost.as_secs_f64() {
            return Err(Refusal::TooCostly {
                expected: Duration::try_from_secs_f64(at_best).unwrap_or(Duration::MAX),
                limit: policy.max_request_cost,
            });
        }
        let alone = self.seconds(alone);
        let queued = self.queued_requests();
        if queued >= policy.max_queued_requests.max(1) {
            return Err(Refusal::QueueFull {
                queued,
                retry_after: self.retry_after(),
            });
        }
        // An idle model makes nobody wait for this request, and it waits for nobody: it is
        // promised its own time, however long, within the request cost, unless the worker
        // was measured a moment ago too slow to finish it in time (its load just left).
        if self.jobs.is_empty() {
            let expected = alone.mul_f64(factor);
            if expected > policy.max_request_cost && self.measured_lately(now) {
                return Err(Refusal::SlowNow {
                    expected,
                    limit: policy.max_request_cost,
                    retry_after: self.until_stale(now),
                });
            }
            job.estimate = Some((now, alone));
            job.deadline = Some(now + expected.max(policy.max_queue_wait));
            return Ok(job);
        }
        let estimate = self.replay_with(policy, &job, now)?;
        job.estimate = Some((now, estimate));
        job.deadline = Some(now + policy.max_queue_wait);
        Ok(job)
    }

    /// Replays the accepted jobs with `new` among them (promised `--max-queue-wait`): its
    /// estimate (without the lateness factor) when every job keeps its promise, else why not.
    fn replay_with(
        &self,
        policy: &AdmissionPolicy,
        new: &JobLoad,
        now: Instant,
    ) -> Result<Duration, Refusal> {
        let mut allowances: Vec<(f64, JobId)> = self
            .jobs
            .iter()
            .filter_map(|(&id, job)| {
                let deadline = job.deadline?;
                Some((
                    self.units_within(deadline.saturating_duration_since(now)),
                    id,
                ))
            })
            .collect();
        allowances.push((self.units_within(policy.max_queue_wait), Replay::NEW));
        allowances.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        match Replay::new(policy.rows, self.cost, &self.jobs, new).run(&allowances) {
            Verdict::OnTime { new_finish } => Ok(self.seconds(new_finish)),
            Verdict::Late { job, at } if job == Replay::NEW => Err(Refusal::TooLong {
                expected: self.seconds(at).mul_f64(self.lateness.factor()),
                limit: policy.max_queue_wait,
                retry_after: self.retry_after(),
            }),
            Verdict::Late { .. } => Err(Refusal::Crowded {
                retry_after: self.retry_after(),
            }),
        }
    }

    /// Takes back a request [`Load::admit`] accepted that never reached the worker.
    pub fn withdraw(&mut self, id: JobId) {
        self.remove(id);
        self.note_idle();
    }

    /// Takes job `id` out. One that leaves unfinished later than its estimate (timed out, or
    /// withdrawn while its lengths were predicted) tells the lateness factor that requests
    /// run at least that late: counting only those that finish would hide the worst.
    fn remove(&mut self, id: JobId) {
        let Some(job) = self.jobs.remove(&id) else {
            return;
        };
        if let Some(ratio) = lateness_ratio(&job) {
            // A lower bound: it only says something when it is above the factor.
            if ratio > self.lateness.factor() {
                self.lateness.record(ratio);
            }
        }
    }

    /// Counts what the worker did in a turn that kept it `busy`.
    pub fn apply(&mut self, progress: &Progress, busy: Duration) {
        for &id in &progress.removed {
            self.remove(id);
        }
        let mut units = 0.0;
        for (id, index) in &progress.joined {
            let Some(job) = self.jobs.get_mut(id) else {
                continue;
            };
            if let Some(text) = job.waiting.pop_front() {
                units += cost::encode(text.source);
                job.running.insert(*index, text);
            }
        }
        if !progress.joined.is_empty() {
            units += cost::ENCODE_FIXED;
        }
        if progress.stepped {
            units += self.step();
        }
        for finished in &progress.finished {
            self.finish(finished);
        }
        if units > 0.0 {
            self.throughput.record(units, busy);
        }
        if progress.processed > 0 {
            self.tokens.record(progress.processed as f64, busy);
        }
        self.note_idle();
    }

    /// Every running text took a step: its cost, and what is left of each.
    fn step(&mut self) -> f64 {
        let mut batch = StepRows::default();
        for text in self.jobs.values().flat_map(|job| job.running.values()) {
            batch.add(text.source, text.position);
        }
        for text in self
            .jobs
            .values_mut()
            .flat_map(|job| job.running.values_mut())
        {
            text.steps = text.steps.saturating_sub(1).max(1);
            text.position += 1;
        }
        self.cost.step(&batch)
    }

    /// A text finished: its job leaves when it was the last, measuring its lateness.
    fn finish(&mut self, finished: &FinishedText) {
        if let Some(job) = self.jobs.get_mut(&finished.job) {
            job.running.remove(&finished.text);
            if job.finished() {
                if let Some((accepted, _)) = job.estimate {
                    tracing::debug!(
                        job = finished.job,
                        took_s = accepted.elapsed().as_secs_f64(),
                        "finished"
                    );
                }
                if let Some(ratio) = lateness_ratio(job) {
                    self.lateness.record(ratio);
                }
                self.jobs.remove(&finished.job);
            }
        }
        self.output.record(finished.produced, finished.budget);
    }
}

/// How late `job` is against its estimate so far: time since acceptance over the estimate,
/// for estimates long enough to say something ([`LATENESS_MIN_EXPECTED`]).
fn lateness_ratio(job: &JobLoad) -> Option<f64> {
    let (accepted, estimate) = job.estimate?;
    (estimate >= LATENESS_MIN_EXPECTED)
        .then(|| accepted.elapsed().as_secs_f64() / estimate.as_secs_f64())
}

/// One worker's door: the load it has accepted and the policy it checks new requests against.
/// The worker reports its progress to it once a turn ([`Progress`]); requests read it from
/// their own threads.
pub struct Door {
    load: Mutex<Load>,
    pub policy: AdmissionPolicy,
}

impl Door {
    /// The door of a worker whose backend's steps cost as `cost` says.
    pub fn new(policy: AdmissionPolicy, cost: StepCost) -> Self {
        Door {
            load: Mutex::new(Load {
                cost,
                ..Load::default()
            }),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::policy::Batching;

    fn policy() -> AdmissionPolicy {
        AdmissionPolicy {
            rows: RowPolicy {
                batching: Batching::Continuous,
                max_batch_size: 4,
                max_batch_tokens: 10_000,
            },
            max_queued_requests: 100,
            max_queue_wait: Duration::from_secs(10),
            max_request_cost: Duration::from_secs(3600),
        }
    }

    /// A text of `source` tokens (EOS included) with an output budget of `output`.
    fn text(source: usize, output: usize) -> DecodeInput {
        DecodeInput::new(vec![5; source], output)
    }

    /// A load measured at `units_per_second` (the prior forgotten, and no faster lately) with
    /// nothing accepted.
    fn measured(units_per_second: f64) -> Load {
        let mut load = Load {
            throughput: Throughput::with_prior(units_per_second, units_per_second),
            ..Load::default()
        };
        for _ in 0..100 {
            load.throughput
                .record(units_per_second, Duration::from_secs(1));
        }
        load
    }

    /// A job of `inputs`, none of them in the batch, its outputs expected to fill budgets,
    /// with no promise.
    fn job(inputs: &[DecodeInput]) -> JobLoad {
        let mut load = Load::default();
        let id = load.admit(&policy(), inputs).unwrap();
        let mut job = load.jobs.remove(&id).unwrap();
        job.deadline = None;
        job
    }

    /// A text of 10 source tokens in the batch with `steps` left, at position 0.
    fn running_text(steps: u64) -> TextLoad {
        TextLoad {
            source: 10,
            steps,
            position: 0,
            budget: 100,
        }
    }

    /// `count` accepted one-text requests in the batch, `steps` left each, no promise.
    fn running_jobs(load: &mut Load, count: usize, steps: u64) {
        for _ in 0..count {
            let mut job = JobLoad::default();
            job.running.insert(0, running_text(steps));
            load.jobs.insert(load.next_job, job);
            load.next_job += 1;
        }
    }

    /// `count` accepted one-text requests waiting, no promise.
    fn waiting_jobs(load: &mut Load, count: usize, source: usize, output: usize) {
        for _ in 0..count {
            load.jobs
                .insert(load.next_job, job(&[text(source, output)]));
            load.next_job += 1;
        }
    }

    /// `rows` texts of 10 source tokens joining together and running `steps` steps side by
    /// side: their encoding and their steps.
    fn group(rows: usize, steps: u64) -> f64 {
        rows as f64 * cost::encode(10) + cost::ENCODE_FIXED + cost::padded_steps(rows, 10, 0, steps)
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-6 * b.abs().max(1.0)
    }

    #[test]
    fn throughput_follows_measurements_from_the_prior() {
        let prior = cost::PRIOR_UNITS_PER_SECOND;
        let mut throughput = Throughput::with_prior(prior, 0.0);
        assert_eq!(throughput.per_second(), prior);
        // Work at 3000 units/s, in 20 ms steps: two seconds take it most of the way there,
        // twenty all of it.
        for _ in 0..100 {
            throughput.record(60.0, Duration::from_millis(20));
        }
        let rate = throughput.per_second();
        assert!((2000.0..3000.0).contains(&rate), "{rate}");
        for _ in 0..900 {
            throughput.record(60.0, Duration::from_millis(20));
        }
        let rate = throughput.per_second();
        assert!((2990.0..=3000.0).contains(&rate), "{rate}");
        // An idle worker measures nothing: the estimate stays.
        throughput.record(0.0, Duration::ZERO);
        assert_eq!(throughput.per_second(), rate);
        assert_eq!(Throughput::unmeasured().per_second(), 1.0);
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
    fn a_planned_length_is_the_expected_output() {
        let load = Load::default();
        // Nothing finished yet: an output is expected to fill its budget...
        let free = text(10, 100);
        assert_eq!(load.expected_steps(&free), 100);
        // ...unless a length was planned for it: that and its EOS, within the budget.
        let planned = DecodeInput {
            target_length: Some(30),
            ..text(10, 100)
        };
        assert_eq!(load.expected_steps(&planned), 31);
        let over = DecodeInput {
            target_length: Some(300),
            ..text(10, 100)
        };
        assert_eq!(load.expected_steps(&over), 100);
        let nothing = DecodeInput {
            target_length: Some(30),
            ..text(10, 0)
        };
        assert_eq!(load.expected_steps(&nothing), 0);
        let job = load.text_loads(&[planned]);
        assert_eq!(job[0].steps, 31);
    }

    #[test]
    fn a_short_text_waits_in_line_behind_the_texts_beyond_the_batchs_rows() {
        let policy = policy();
        // Four one-text requests run, 90 steps left each; 50 more wait, each of 10 source
        // tokens and 90 expected output tokens.
        let mut load = measured(1000.0);
        running_jobs(&mut load, 4, 90);
        waiting_jobs(&mut load, 50, 10, 90);
        assert_eq!((load.waiting_texts(), load.queued_requests()), (50, 50));
        // One text of 10 output tokens: each row goes to the earliest of the requests that
        // hold none, so it joins with the last two of the 50: the four running end, 12
        // groups of four join and run, then it and the last two, and it ends after 10 steps.
        let short = job(&[text(10, 10)]);
        // The last three rows' steps are priced as the four the batch has now (one refilled).
        let refilled = 10.0 * (1.0 + 10.0 / cost::PADDED_SCALE);
        let expected =
            cost::padded_steps(4, 10, 0, 90) + 12.0 * group(4, 90) + group(3, 10) + refilled;
        let replayed = Replay::new(policy.rows, StepCost::default(), &load.jobs, &short).run(&[]);
        assert!(
            close(replayed.finish(), expected),
            "{replayed:?}, {expected}"
        );
        // Past the 10 s limit at 1000 units a second: refused at once.
        assert!(expected > 10_000.0, "{expected}");
        let refused = load.admit(&policy, &[text(10, 10)]);
        let Err(Refusal::TooLong {
            expected: at_least,
            limit,
            retry_after,
        }) = refused
        else {
            panic!("{refused:?}")
        };
        assert_eq!(limit, policy.max_queue_wait);
        assert!(at_least > limit, "{at_least:?}");
        // Retry when the work there is now is done.
        assert_eq!(
            retry_after,
            Duration::from_secs((load.work() / 1000.0).ceil() as u64)
        );
        // Refusals count nothing in.
        assert_eq!(load.waiting_texts(), 50);
        // With two groups fewer ahead the same text is taken, and promised the limit.
        let mut shorter = measured(1000.0);
        running_jobs(&mut shorter, 4, 90);
        waiting_jobs(&mut shorter, 42, 10, 90);
        let id = shorter.admit(&policy, &[text(10, 10)]).unwrap();
        let accepted = &shorter.jobs[&id];
        assert_eq!(accepted.waiting[0].steps, 10);
        let (at, estimate) = accepted.estimate.unwrap();
        assert_eq!(accepted.deadline, Some(at + policy.max_queue_wait));
        assert!(estimate < policy.max_queue_wait, "{estimate:?}");
    }

    #[test]
    fn a_request_that_would_make_an_accepted_one_late_is_refused() {
        let policy = policy();
        let now = Instant::now();
        // An accepted request of 8 texts, alone in line: two groups of four on the four
        // rows. It was promised a little more than that.
        let mut load = measured(1000.0);
        let mut first = job(&vec![text(10, 90); 8]);
        let alone = 2.0 * group(4, 90);
        first.deadline = Some(now + Duration::from_secs_f64(alone * 1.2 / 1000.0));
        load.jobs.insert(0, first);
        load.next_job = 1;
        // A request of four texts would be done well within its own limit, but it holds no
        // row, so it takes every other row from the first: that one would end late.
        let four = [text(10, 90), text(10, 90), text(10, 90), text(10, 90)];
        let refused = load.admit_at(&policy, &four, now);
        assert!(
            matches!(refused, Err(Refusal::Crowded { .. })),
            "{refused:?}"
        );
        assert_eq!(load.jobs.len(), 1, "nothing counted in");
        // Had the first been promised the limit, both fit.
        load.jobs.get_mut(&0).unwrap().deadline = Some(now + policy.max_queue_wait);
        let id = load.admit_at(&policy, &four, now).unwrap();
        assert_eq!(load.jobs[&id].deadline, Some(now + policy.max_queue_wait));
    }

    #[test]
    fn a_request_too_costly_to_finish_in_time_even_alone_is_refused_on_an_idle_model() {
        let policy = AdmissionPolicy {
            max_request_cost: Duration::from_secs(5),
            ..policy()
        };
        // 64 texts on four rows: 16 groups, far past 5 s at 1000 units a second.
        let mut idle = measured(1000.0);
        let refused = idle.admit(&policy, &vec![text(10, 90); 64]);
        let Err(Refusal::TooCostly { expected, limit }) = refused else {
            panic!("{refused:?}")
        };
        assert_eq!(limit, Duration::from_secs(5));
        let alone = 16.0 * group(4, 90) / 1000.0;
        assert!(
            (expected.as_secs_f64() - alone).abs() < 1e-3,
            "{expected:?}"
        );
        assert!(idle.jobs.is_empty());
        // Longer than --max-queue-wait but within the cost: the idle model takes it, promised
        // its own time, and refuses what would delay it.
        let long = AdmissionPolicy {
            max_request_cost: Duration::from_secs(30),
            ..policy
        };
        let id = idle.admit(&long, &vec![text(10, 90); 64]).unwrap();
        let (at, estimate) = idle.jobs[&id].estimate.unwrap();
        assert!(estimate > long.max_queue_wait, "{estimate:?}");
        let promised = idle.jobs[&id].deadline.unwrap() - at;
        assert!(
            promised.abs_diff(estimate) < Duration::from_micros(1),
            "{promised:?}"
        );
        assert!(matches!(
            idle.admit(&long, &[text(10, 90)]),
            Err(Refusal::Crowded { .. })
        ));
        // Lateness does not count: a refusal for good does not depend on the load.
        let mut late = measured(1000.0);
        late.lateness.factor = 4.0;
        assert!(late.admit(&long, &vec![text(10, 90); 40]).is_ok());
    }

    #[test]
    fn requests_are_refused_for_good_at_the_fastest_speed_lately_not_the_speed_now() {
        // Eight texts on four rows, two groups, allowed between what they take at the
        // calibrated speed and at the prior's.
        let inputs = vec![text(10, 90); 8];
        let units = 2.0 * group(4, 90);
        let policy = AdmissionPolicy {
            max_request_cost: Duration::from_secs_f64(units / 5_000.0),
            ..policy()
        };
        const {
            assert!(cost::PRIOR_UNITS_PER_SECOND < 5_000.0);
            assert!(cost::CALIBRATED_UNITS_PER_SECOND > 5_000.0);
        }
        // Nothing measured yet: taken, at the calibrated speed (the prior, which errs toward
        // refusing for now, would refuse it for good).
        assert!(Load::default().admit(&policy, &inputs).is_ok());
        // A worker slowed to 2,000 units a second by a storm, after going at 12,000: still
        // taken when idle.
        let mut stormy = measured(12_000.0);
        for _ in 0..100 {
            stormy.throughput.record(200.0, Duration::from_millis(100));
        }
        assert!(stormy.throughput.per_second() < 2_100.0);
        assert!(stormy.throughput.peak_per_second() > 11_000.0);
        assert!(stormy.admit(&policy, &inputs).is_ok());
        // One that has gone that slow for the last hour refuses it for good.
        let mut slow = measured(12_000.0);
        for _ in 0..4_000 {
            slow.throughput.record(2_000.0, Duration::from_secs(1));
        }
        let refused = slow.admit(&policy, &inputs);
        assert!(
            matches!(refused, Err(Refusal::TooCostly { .. })),
            "{refused:?}"
        );
    }

    #[test]
    fn an_idle_model_measured_too_slow_a_moment_ago_refuses_for_now_what_it_would_not_finish() {
        let policy = AdmissionPolicy {
            max_request_cost: Duration::from_secs(10),
            ..policy()
        };
        // 40 texts, ten groups: 4.2 s at 2,000 units a second, 0.7 s at 12,000.
        let inputs = vec![text(10, 90); 40];
        // A worker that went at 12,000 units a second and has just been slowed to 2,000 by
        // a storm whose last request left a second ago.
        let mut stormy = measured(12_000.0);
        for _ in 0..100 {
            stormy.throughput.record(200.0, Duration::from_millis(100));
        }
        let now = Instant::now();
        stormy.idle_since = Some(now - Duration::from_secs(1));
        stormy.lateness.factor = 3.0;
        let refused = stormy.admit_at(&policy, &inputs, now);
        let Err(Refusal::SlowNow {
            expected,
            limit,
            retry_after,
        }) = refused
        else {
            panic!("{refused:?}")
        };
        assert!(expected > limit, "{expected:?}");
        assert_eq!(retry_after, Duration::from_secs(9));
        // Idle long enough, what it measured then no longer counts: taken.
        let later = now + MEASUREMENT_STALE_AFTER;
        assert!(stormy.admit_at(&policy, &inputs, later).is_ok());
        assert_eq!(stormy.idle_since, None);
        // Nor does a cold worker refuse it, having measured nothing (its prior, a tenth of
        // the calibrated speed, would say 25 s).
        let mut cold = Load::default();
        cold.lateness.factor = 3.0;
        assert!(cold.admit(&policy, &inputs).is_ok());
    }

    #[test]
    fn a_reservation_counts_in_before_its_lengths_are_known() {
        let policy = policy();
        let mut load = measured(1000.0);
        // Two requests arrive together at an idle model: the first is counted in on the
        // linear fit's lengths before its prediction, so the second is judged with it there
        // and refused, where both used to pass the check on the same empty load.
        let stand_in = vec![text(10, 90); 48];
        let first = load.admit(&policy, &stand_in).unwrap();
        assert!(matches!(
            load.admit(&policy, &stand_in),
            Err(Refusal::TooLong { .. } | Refusal::Crowded { .. })
        ));
        // The predicted lengths replace the stand-in ones: the work shrinks, the promise stays.
        let before = load.work();
        let deadline = load.jobs[&first].deadline;
        load.replace(first, &vec![text(10, 30); 48]);
        assert!(load.work() < before / 2.0, "{} vs {before}", load.work());
        assert_eq!(load.jobs[&first].deadline, deadline);
        assert_eq!(load.jobs[&first].waiting.len(), 48);
        // A request whose client leaves before it reaches the worker is taken back.
        load.withdraw(first);
        assert!(load.jobs.is_empty());
        assert!(load.admit(&policy, &stand_in).is_ok());
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

    /// A job accepted `ago` with an estimate of `estimate`, one text running.
    fn estimated_job(ago: Duration, estimate: Duration) -> JobLoad {
        let mut job = JobLoad::default();
        job.running.insert(0, running_text(1));
        job.estimate = Some((Instant::now() - ago, estimate));
        job
    }

    #[test]
    fn estimates_are_scaled_by_lateness_and_late_requests_measure_it() {
        let policy = policy();
        let mut load = measured(1000.0);
        running_jobs(&mut load, 4, 90);
        waiting_jobs(&mut load, 8, 10, 90);
        // Three groups of four ahead of one more text: taken...
        let id = load.admit(&policy, &[text(10, 90)]).unwrap();
        let (_, estimate) = load.jobs[&id].estimate.unwrap();
        // The batch is taken to stay as full as it is (four rows): the new text's steps alone
        // are priced with three refilled rows like the running ones (source 10, position 0).
        let refilled = 90.0 * 3.0 * (1.0 + 10.0 / cost::PADDED_SCALE);
        let expected =
            cost::padded_steps(4, 10, 0, 90) + 2.0 * group(4, 90) + group(1, 90) + refilled;
        assert!((estimate.as_secs_f64() - expected / 1000.0).abs() < 1e-6);
        // ...unless requests have been finishing several times as late as estimated (then
        // neither it nor the one just taken would be done in time).
        load.lateness.factor = 4.0;
        assert!(matches!(
            load.admit(&policy, &[text(10, 90)]),
            Err(Refusal::TooLong { .. } | Refusal::Crowded { .. })
        ));
        let work = Duration::from_secs_f64(load.work() / 1000.0);
        assert!((load.expected_wait().as_secs_f64() - 4.0 * work.as_secs_f64()).abs() < 1e-6);
        // A request that finishes later than the factor says moves it up...
        load.lateness.factor = 2.0;
        let six_for_two = || estimated_job(Duration::from_secs(6), Duration::from_secs(2));
        load.jobs.insert(1_000, six_for_two());
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
        // ...and so does one that times out that late, which never finishes.
        let factor = load.lateness.factor();
        load.jobs.insert(1_001, six_for_two());
        let removed = Progress {
            removed: vec![1_001],
            ..Progress::default()
        };
        load.apply(&removed, Duration::ZERO);
        assert!(load.lateness.factor() > factor);
        // One that leaves early says nothing: it might have finished late.
        let factor = load.lateness.factor();
        load.jobs
            .insert(1_002, estimated_job(Duration::ZERO, Duration::from_secs(2)));
        load.withdraw(1_002);
        assert_eq!(load.lateness.factor(), factor);
    }

    #[test]
    fn without_batching_a_request_waits_for_all_of_those_ahead() {
        let mut off = policy();
        off.rows.batching = Batching::Off;
        // One request runs alone for 1000 steps: a new one waits for it.
        let mut load = measured(100.0);
        running_jobs(&mut load, 1, 1_000);
        assert!(matches!(
            load.admit(&off, &[text(10, 90)]),
            Err(Refusal::TooLong { .. })
        ));
        let mut load = measured(100.0);
        running_jobs(&mut load, 1, 10);
        let id = load.admit(&off, &[text(10, 90)]).unwrap();
        let (_, estimate) = load.jobs[&id].estimate.unwrap();
        let expected = cost::padded_steps(1, 10, 0, 10) + group(1, 90);
        assert!((estimate.as_secs_f64() - expected / 100.0).abs() < 1e-6);
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
        assert_eq!((load.waiting_texts(), load.queued_requests()), (1, 1));
        assert_eq!(load.jobs.keys().collect::<Vec<_>>(), vec![&second]);
        let full = load.work();
        assert!(close(
            full,
            cost::encode(10) + StepCost::default().row_steps(10, 0, 90)
        ));
        // The worker encodes the text's source and takes 30 steps...
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
        assert_eq!((load.waiting_texts(), load.batch_rows()), (0, 1));
        assert!(close(
            load.work(),
            StepCost::default().row_steps(10, 30, 60)
        ));
        // ...measured in cost units: its encoding, and 30 steps of one row beside its source.
        let units = cost::encode(10) + cost::ENCODE_FIXED + cost::padded_steps(1, 10, 0, 30);
        let busy = 0.001 + 29.0 * 0.0003;
        let measured = Throughput::with_prior(
            cost::PRIOR_UNITS_PER_SECOND,
            cost::CALIBRATED_UNITS_PER_SECOND,
        );
        assert!(load.throughput.per_second() > measured.per_second());
        assert!(load.tokens.per_second() > 1.0);
        let mut expected = measured;
        expected.record(units, Duration::from_secs_f64(busy));
        assert!((load.throughput.per_second() / expected.per_second() - 1.0).abs() < 0.01);
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
            (0.0, 0, 0)
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
        assert_eq!(load.work(), 0.0);
    }

    #[test]
    fn a_step_costs_its_rows_at_the_longest_source_and_output_they_attend_to() {
        let mut load = measured(1000.0);
        let mut job = JobLoad::default();
        job.running.insert(0, running_text(50));
        let mut long = running_text(50);
        long.source = 1000;
        long.position = 7;
        job.running.insert(1, long);
        load.jobs.insert(0, job);
        assert!(close(
            load.step(),
            StepCost::default().step(&StepRows::uniform(2, 1000, 7))
        ));
        // Every running text moved one position on.
        let positions: Vec<u64> = load.jobs[&0].running.values().map(|t| t.position).collect();
        assert_eq!(positions, [1, 8]);
    }
}
