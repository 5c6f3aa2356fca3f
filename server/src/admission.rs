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
//! seconds. The scheduler shares rows fairly among requests, so the expected finish is that of
//! processor sharing: each request already accepted delays a new one by its remaining work or
//! by the new one's own, whichever is less ([`Load::admit`]).
//!
//! Two cases are never refused by the estimate. A request that can join the running batch at
//! once (nothing waits, and there are rows for all its texts) waits for nobody; admitting it is
//! also what fills the batch and lets throughput be measured at full batch. And a request that
//! finds its model idle is only as slow as its own size, which the request limits bound.
//! `--max-queued-requests` stays as a backstop on the number of waiting requests.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::decode::DecodeInput;
use crate::scheduler::Batching;

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
/// `Retry-After` never says more than this.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(3600);

/// What the door checks requests against.
#[derive(Clone, Debug)]
pub struct AdmissionPolicy {
    pub batching: Batching,
    pub max_batch_size: usize,
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

/// Why a request was refused at the door.
#[derive(Clone, Debug, PartialEq)]
pub enum Refusal {
    /// `--max-queued-requests` requests are waiting already.
    QueueFull {
        queued: usize,
        retry_after: Duration,
    },
    /// The work ahead and its own would take longer than `--max-queue-wait`.
    TooLong {
        expected: Duration,
        limit: Duration,
        retry_after: Duration,
    },
}

/// What the worker did in one turn of its loop, for [`Load::apply`].
#[derive(Clone, Debug, Default)]
pub struct Progress {
    /// Tokens of accepted work that were done, or left with their request, by job.
    pub work_done: BTreeMap<JobId, u64>,
    /// Texts that left the queue: they joined the batch, or their request went away.
    pub texts_dequeued: usize,
    /// Requests that have no text waiting any more.
    pub requests_dequeued: usize,
    /// Tokens processed: sources encoded and rows stepped.
    pub processed: u64,
    /// (produced, output budget) of every text that finished.
    pub outputs: Vec<(usize, usize)>,
}

impl Progress {
    pub fn done(&mut self, job: JobId, tokens: u64) {
        if tokens > 0 {
            *self.work_done.entry(job).or_default() += tokens;
        }
    }
}

/// A request the door accepted, numbered in the order of acceptance.
pub type JobId = u64;

/// What [`Load::admit`] hands the worker with an accepted request.
#[derive(Clone, Debug, PartialEq)]
pub struct Admitted {
    pub id: JobId,
    /// Each text's expected output tokens, which the worker takes off the load as it goes.
    pub expected_outputs: Vec<usize>,
}

/// One model's accepted work and measured speed, shared by the door and the worker.
#[derive(Clone, Debug)]
pub struct Load {
    /// Tokens of accepted work not done yet, by job: sources not encoded, and expected outputs
    /// not produced (a running text counts at least 1 until it finishes). A job leaves when
    /// its count reaches 0.
    pub jobs: BTreeMap<JobId, u64>,
    /// Their sum.
    pub work: u64,
    next_job: JobId,
    /// Accepted texts that have not joined the batch.
    pub waiting_texts: usize,
    /// Accepted requests with texts that have not joined the batch.
    pub queued_requests: usize,
    /// Texts in the batch after the worker's last turn.
    pub batch_rows: usize,
    pub throughput: Throughput,
    pub output: OutputFraction,
}

impl Default for Load {
    fn default() -> Self {
        Load {
            jobs: BTreeMap::new(),
            work: 0,
            next_job: 0,
            waiting_texts: 0,
            queued_requests: 0,
            batch_rows: 0,
            throughput: Throughput::with_prior(PRIOR_TOKENS_PER_SECOND),
            output: OutputFraction::default(),
        }
    }
}

impl Load {
    /// How long the accepted work will take at the measured speed.
    pub fn expected_wait(&self) -> Duration {
        self.seconds(self.work)
    }

    fn seconds(&self, tokens: u64) -> Duration {
        Duration::try_from_secs_f64(tokens as f64 / self.throughput.tokens_per_second())
            .unwrap_or(MAX_RETRY_AFTER)
    }

    /// The tokens `inputs` are expected to cost, given each text's expected output.
    fn work_of(inputs: &[DecodeInput], expected_outputs: &[usize]) -> u64 {
        inputs
            .iter()
            .zip(expected_outputs)
            .map(|(input, &output)| (input.source_ids.len() + output) as u64)
            .sum()
    }

    /// How long a request of `own` tokens is expected to take. The scheduler shares rows
    /// fairly among jobs, so (as in processor sharing) each job already accepted gets about
    /// as much service as this one until either is done: it delays this one by its remaining
    /// work or by this one's own, whichever is less. A small request behind a big one is thus
    /// not charged for all of the big one, and a big request is charged for everything.
    /// Without batching, jobs run one after another: everything accepted comes first.
    fn expected_finish(&self, batching: Batching, own: u64) -> Duration {
        let ahead: u64 = match batching {
            Batching::Continuous => self.jobs.values().map(|&work| work.min(own)).sum(),
            Batching::Off => self.work,
        };
        self.seconds(own + ahead)
    }

    /// Accepts `inputs` and counts them in, or says why not.
    pub fn admit(
        &mut self,
        policy: &AdmissionPolicy,
        inputs: &[DecodeInput],
    ) -> Result<Admitted, Refusal> {
        let expected_outputs: Vec<usize> = inputs
            .iter()
            .map(|input| self.output.expected(input.max_output_tokens))
            .collect();
        let own = Load::work_of(inputs, &expected_outputs);
        let expected = self.expected_finish(policy.batching, own);
        // When the work there is now will be done. Not when just enough of it is done for this
        // request to fit: under a steady overload that is always about now, and would send
        // every refused client back at once into the same full queue.
        let ahead = self.seconds(self.work).as_secs_f64();
        let retry_after =
            Duration::from_secs(ahead.ceil() as u64).clamp(Duration::from_secs(1), MAX_RETRY_AFTER);
        if self.queued_requests >= policy.max_queued_requests.max(1) {
            return Err(Refusal::QueueFull {
                queued: self.queued_requests,
                retry_after,
            });
        }
        let room = match policy.batching {
            Batching::Continuous => self.batch_rows + inputs.len() <= policy.max_batch_size,
            Batching::Off => self.batch_rows == 0,
        };
        let joins_at_once = self.waiting_texts == 0 && room;
        let idle = self.work == 0;
        if !joins_at_once && !idle && expected > policy.max_queue_wait {
            return Err(Refusal::TooLong {
                expected,
                limit: policy.max_queue_wait,
                retry_after,
            });
        }
        let id = self.next_job;
        self.next_job += 1;
        if own > 0 {
            self.jobs.insert(id, own);
        }
        self.work += own;
        self.waiting_texts += inputs.len();
        self.queued_requests += 1;
        Ok(Admitted {
            id,
            expected_outputs,
        })
    }

    /// Takes back a request [`Load::admit`] accepted that never reached the worker.
    pub fn withdraw(&mut self, admitted: &Admitted, texts: usize) {
        if let Some(work) = self.jobs.remove(&admitted.id) {
            self.work = self.work.saturating_sub(work);
        }
        self.waiting_texts = self.waiting_texts.saturating_sub(texts);
        self.queued_requests = self.queued_requests.saturating_sub(1);
    }

    /// Counts what the worker did in a turn that kept it `busy`, with `batch_rows` texts in
    /// the batch after it.
    pub fn apply(&mut self, progress: &Progress, batch_rows: usize, busy: Duration) {
        for (&job, &done) in &progress.work_done {
            let Some(work) = self.jobs.get_mut(&job) else {
                continue;
            };
            let done = done.min(*work);
            *work -= done;
            self.work = self.work.saturating_sub(done);
            if *work == 0 {
                self.jobs.remove(&job);
            }
        }
        self.waiting_texts = self.waiting_texts.saturating_sub(progress.texts_dequeued);
        self.queued_requests = self
            .queued_requests
            .saturating_sub(progress.requests_dequeued);
        self.batch_rows = batch_rows;
        if progress.processed > 0 {
            self.throughput.record(progress.processed, busy);
        }
        for &(produced, budget) in &progress.outputs {
            self.output.record(produced, budget);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> AdmissionPolicy {
        AdmissionPolicy {
            batching: Batching::Continuous,
            max_batch_size: 4,
            max_queued_requests: 100,
            max_queue_wait: Duration::from_secs(10),
        }
    }

    /// A text of `source` tokens (EOS included) with an output budget of `output`.
    fn text(source: usize, output: usize) -> DecodeInput {
        DecodeInput::new(vec![5; source], output)
    }

    /// A load measured at `tokens_per_second` (the prior forgotten), with a full batch and
    /// jobs of `work` tokens accepted.
    fn measured(tokens_per_second: f64, work: &[u64]) -> Load {
        let mut load = Load::default();
        for _ in 0..100 {
            load.throughput
                .record(tokens_per_second as u64, Duration::from_secs(1));
        }
        load.batch_rows = 4;
        for &tokens in work {
            let id = load.next_job;
            load.next_job += 1;
            load.jobs.insert(id, tokens);
            load.work += tokens;
        }
        load
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
    fn requests_are_refused_when_they_would_finish_past_the_limit() {
        let policy = policy();
        // 1000 tokens/s, 10 s limit; every text costs 10 + 90 tokens (outputs fill budgets).
        // 98 requests of one text are ahead.
        let mut load = measured(1000.0, &[100; 98]);
        let request = vec![text(10, 90)];
        // 9.9 s: accepted, and counted.
        let admitted = load.admit(&policy, &request).unwrap();
        assert_eq!(admitted.expected_outputs, vec![90]);
        assert_eq!(
            (load.work, load.waiting_texts, load.queued_requests),
            (9_900, 1, 1)
        );
        assert_eq!(load.jobs[&admitted.id], 100);
        // Three texts: each of the 99 ahead delays it by its 100 tokens, 10.2 s in all.
        let refused = load.admit(&policy, &vec![text(10, 90); 3]);
        let Err(Refusal::TooLong {
            expected,
            limit,
            retry_after,
        }) = refused
        else {
            panic!("{refused:?}")
        };
        assert_eq!(limit, policy.max_queue_wait);
        assert!((expected.as_secs_f64() - 10.2).abs() < 1e-6, "{expected:?}");
        // Retry when the 9.9 s of work there is now are done.
        assert_eq!(retry_after, Duration::from_secs(10));
        // Refusals count nothing in.
        assert_eq!(
            (load.work, load.waiting_texts, load.queued_requests),
            (9_900, 1, 1)
        );
    }

    #[test]
    fn a_big_request_ahead_delays_a_small_one_by_the_small_ones_size_only() {
        let policy = policy();
        // 30 s of work in one request (64 texts, say) and nothing else.
        let mut load = measured(1000.0, &[30_000]);
        load.waiting_texts = 60;
        // A one-text request shares the rows with it: about 0.2 s.
        assert!(load.admit(&policy, &[text(10, 90)]).is_ok());
        // Forty texts (4000 tokens) get as much as the big one until they are done: 8.1 s
        // with the one-text request's 100.
        assert!(load.admit(&policy, &vec![text(10, 90); 40]).is_ok());
        // Another forty wait for all of that: 4000 + 4000 + 4000 + 100 tokens, 12.1 s.
        let refused = load.admit(&policy, &vec![text(10, 90); 40]);
        let Err(Refusal::TooLong { expected, .. }) = refused else {
            panic!("{refused:?}")
        };
        assert!((expected.as_secs_f64() - 12.1).abs() < 1e-6, "{expected:?}");
        // The refusal says to come back when the 34.1 s of work taken are done.
        let Err(Refusal::TooLong { retry_after, .. }) = refused else {
            unreachable!()
        };
        assert_eq!(retry_after, Duration::from_secs(35));
    }

    #[test]
    fn a_request_that_joins_at_once_or_finds_the_model_idle_is_never_refused() {
        let policy = policy();
        // 20 requests of 1 s each ahead, but two of the four rows are free and nothing waits.
        let mut load = measured(100.0, &[100; 20]);
        load.batch_rows = 2;
        assert!(load.admit(&policy, &[text(10, 90), text(10, 90)]).is_ok());
        // Now two texts wait: the next request would have to wait too.
        load.batch_rows = 2;
        assert!(matches!(
            load.admit(&policy, &[text(10, 90)]),
            Err(Refusal::TooLong { .. })
        ));
        // A request larger than the limit alone is taken when nothing else is there.
        let mut idle = measured(100.0, &[]);
        idle.batch_rows = 0;
        assert!(idle.admit(&policy, &vec![text(10, 90); 64]).is_ok());
        // Without batching a request joins at once only into an empty batch.
        let off = AdmissionPolicy {
            batching: Batching::Off,
            ..policy.clone()
        };
        let mut load = measured(100.0, &[100; 20]);
        load.batch_rows = 1;
        assert!(load.admit(&off, &[text(10, 90)]).is_err());
        load.batch_rows = 0;
        assert!(load.admit(&off, &[text(10, 90)]).is_ok());
        // One request at a time: a small one waits for all of a big one.
        let mut load = measured(1000.0, &[30_000]);
        load.waiting_texts = 1;
        assert!(load.admit(&policy, &[text(10, 90)]).is_ok());
        assert!(load.admit(&off, &[text(10, 90)]).is_err());
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
        load.withdraw(&first, request.len());
        assert_eq!(
            (load.work, load.waiting_texts, load.queued_requests),
            (100, 1, 1)
        );
        assert_eq!(load.jobs.keys().collect::<Vec<_>>(), vec![&second.id]);
        // The worker encodes the text's source and decodes 30 tokens in 10 ms...
        let mut progress = Progress {
            texts_dequeued: 1,
            requests_dequeued: 1,
            processed: 40,
            ..Progress::default()
        };
        progress.done(second.id, 40);
        load.apply(&progress, 1, Duration::from_millis(10));
        assert_eq!(load.jobs[&second.id], 60);
        assert!(load.throughput.tokens_per_second() > PRIOR_TOKENS_PER_SECOND);
        // ...and it finishes at 40 of its 90 (the 60 expected tokens left go with it).
        let mut progress = Progress {
            outputs: vec![(40, 90)],
            ..Progress::default()
        };
        progress.done(second.id, 60);
        load.apply(&progress, 0, Duration::ZERO);
        assert_eq!(
            (load.work, load.waiting_texts, load.queued_requests),
            (0, 0, 0)
        );
        assert!(load.jobs.is_empty());
        assert!(load.output.fraction() < 1.0);
    }
}
