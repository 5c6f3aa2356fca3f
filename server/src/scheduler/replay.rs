//! The door's replay: the scheduler's row policy ([`RowPolicy::fill`]) run forward on the
//! expected sizes of the accepted requests and a new one, to tell when each would finish.
//! Rows end after their expected steps, and free rows go to waiting texts as the worker gives
//! them. Time is counted in cost units ([`cost`]), as the worker's throughput is: every step
//! as the worker's backend prices it ([`StepCost`]: by its rows' own sources and positions
//! where the attention reads them row by row, by the longest among them where it reads padded
//! slots), every source encoded.
//!
//! A closed formula got this wrong. Processor sharing (each job ahead delays a new one by
//! the lesser of their works) assumes every job is served at once; but a job cannot hold
//! more rows than it has texts, so one-text requests beyond the batch's rows wait in line,
//! and under a 10x overload the formula promised about 1.7x too little
//! (`docs/benchmarks/overload-by-wait.md`).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, VecDeque};

use std::time::{Duration, Instant};

use super::cost::{self, StepCost, StepRows};
use super::policy::{JobId, RowPolicy, Rows, Turn};

/// One accepted text, as the door counts it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct TextLoad {
    /// Tokens encoded when it joins the batch.
    pub source: u64,
    /// Decoder steps expected in the batch: its expected output; once running, what is left of
    /// it, at least 1 until it finishes.
    pub steps: u64,
    /// Steps taken in the batch: the position of its next step.
    pub position: u64,
    /// What it counts against `max_batch_tokens`: source plus output budget.
    pub budget: usize,
}

impl TextLoad {
    /// What is left of its work, on its own: its encoding if waiting, and its rows' share of
    /// the steps left (the steps' fixed part and padding to longer rows not included).
    fn work(&self, waiting: bool, cost: &StepCost) -> f64 {
        let encode = if waiting {
            cost::encode(self.source)
        } else {
            0.0
        };
        encode + cost.row_steps(self.source, self.position, self.steps)
    }
}

/// An accepted request's unfinished texts, and what it was promised.
#[derive(Clone, Debug, Default)]
pub(super) struct JobLoad {
    /// Not in the batch yet, in the order they join.
    pub waiting: VecDeque<TextLoad>,
    /// In the batch, by text index.
    pub running: BTreeMap<usize, TextLoad>,
    /// When it was accepted and the replay's estimate of its finish then (before the
    /// lateness factor).
    pub estimate: Option<(Instant, Duration)>,
    /// When the door expects it to be done at the latest: no request is taken that would
    /// make it later. `None`: no promise (the door's tests only).
    pub deadline: Option<Instant>,
}

impl JobLoad {
    /// What is left of its work, its steps priced by `cost`.
    pub fn work(&self, cost: &StepCost) -> f64 {
        let waiting: f64 = self.waiting.iter().map(|text| text.work(true, cost)).sum();
        waiting
            + self
                .running
                .values()
                .map(|t| t.work(false, cost))
                .sum::<f64>()
    }

    pub fn finished(&self) -> bool {
        self.waiting.is_empty() && self.running.is_empty()
    }
}

/// What a replay found.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Verdict {
    /// Every job given an allowance finished within it; the new one after `new_finish` units.
    OnTime { new_finish: f64 },
    /// `job` would finish later than its allowance: at `at` units the replay knew (its finish
    /// is at least that).
    Late { job: JobId, at: f64 },
}

impl Verdict {
    /// The new job's finish, or where the replay stopped.
    pub fn finish(&self) -> f64 {
        match *self {
            Verdict::OnTime { new_finish } => new_finish,
            Verdict::Late { at, .. } => at,
        }
    }
}

/// A running row: the step it ends at and what it is. Ordered by its end first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Row {
    end: i64,
    job: JobId,
    budget: usize,
    source: u64,
    /// The step of its first step (negative for rows running before the replay began).
    joined: i64,
}

/// A multiset of numbers, for the longest source and the earliest join among running rows.
#[derive(Default)]
struct Counts<T: Ord>(BTreeMap<T, usize>);

impl<T: Ord + Copy> Counts<T> {
    fn insert(&mut self, value: T) {
        *self.0.entry(value).or_default() += 1;
    }

    fn remove(&mut self, value: T) {
        if let Some(count) = self.0.get_mut(&value) {
            *count -= 1;
            if *count == 0 {
                self.0.remove(&value);
            }
        }
    }

    fn first(&self) -> Option<T> {
        self.0.keys().next().copied()
    }

    fn last(&self) -> Option<T> {
        self.0.keys().next_back().copied()
    }
}

pub(super) struct Replay<'a> {
    policy: RowPolicy,
    cost: StepCost,
    rows: BinaryHeap<Reverse<Row>>,
    /// The running rows' sources and first steps, and their sums.
    sources: Counts<u64>,
    joins: Counts<i64>,
    source_sum: u64,
    join_sum: i64,
    /// Each job's waiting texts and how many of them have joined.
    waiting: BTreeMap<JobId, (&'a VecDeque<TextLoad>, usize)>,
    /// Rows each job holds.
    held: BTreeMap<JobId, usize>,
    /// Jobs with texts waiting, in the order they take free rows.
    turn: BTreeSet<Turn>,
    /// Texts not finished, by job; a job leaves it when its last text ends.
    left: BTreeMap<JobId, usize>,
    batch_tokens: usize,
    step: i64,
    /// The step of the last encoder run, whose fixed part counts once a step.
    encoded_at: Option<i64>,
    /// Cost units counted so far.
    spent: f64,
    /// The rows whose cost every step keeps ([`KeepFull`]).
    keep_full: Option<KeepFull>,
}

/// A batch kept as full as it is: the rows that finish are refilled by what arrives next,
/// which the replay cannot see. Without this, a long text accepted into a busy batch was
/// replayed running nearly alone once the rows around it finished, at a fraction of what its
/// steps then cost beside later arrivals: under an overload of verses beside inputs of ~630
/// subwords, those inputs took 2.4x their estimates (median and 98th percentile alike,
/// texts waiting for rows at acceptance or not; `docs/benchmarks/admission-own-rows.md`).
/// Each step short of `rows` real rows is priced with the missing ones at the batch's mean
/// source and position when the replay began.
#[derive(Clone, Copy, Debug, PartialEq)]
struct KeepFull {
    rows: u64,
    source: u64,
    position: u64,
}

impl<'a> Replay<'a> {
    /// The new job's id: after every accepted one.
    pub const NEW: JobId = JobId::MAX;

    /// The replay of `jobs` (accepted, in the order they were) and `new` after them.
    pub fn new(
        policy: RowPolicy,
        cost: StepCost,
        jobs: &'a BTreeMap<JobId, JobLoad>,
        new: &'a JobLoad,
    ) -> Self {
        let mut replay = Replay {
            policy,
            cost,
            rows: BinaryHeap::new(),
            sources: Counts::default(),
            joins: Counts::default(),
            source_sum: 0,
            join_sum: 0,
            waiting: BTreeMap::new(),
            held: BTreeMap::new(),
            turn: BTreeSet::new(),
            left: BTreeMap::new(),
            batch_tokens: 0,
            step: 0,
            encoded_at: None,
            spent: 0.0,
            keep_full: None,
        };
        let all = jobs
            .iter()
            .map(|(&id, job)| (id, job))
            .chain([(Self::NEW, new)]);
        for (id, job) in all {
            for text in job.running.values() {
                replay.push(Row {
                    end: text.steps.max(1) as i64,
                    job: id,
                    budget: text.budget,
                    source: text.source,
                    joined: -(text.position as i64),
                });
            }
            let held = job.running.len();
            replay.held.insert(id, held);
            if held + job.waiting.len() > 0 {
                replay.left.insert(id, held + job.waiting.len());
            }
            if !job.waiting.is_empty() {
                replay.waiting.insert(id, (&job.waiting, 0));
                replay.turn.insert(Turn { held, job: id });
            }
        }
        let rows = replay.rows.len() as u64;
        if rows > 0 {
            replay.keep_full = Some(KeepFull {
                rows,
                source: replay.source_sum / rows,
                position: (-replay.join_sum).max(0) as u64 / rows,
            });
        }
        replay
    }

    fn push(&mut self, row: Row) {
        self.batch_tokens += row.budget;
        self.sources.insert(row.source);
        self.joins.insert(row.joined);
        self.source_sum += row.source;
        self.join_sum += row.joined;
        self.rows.push(Reverse(row));
    }

    /// Runs until the new job and every job given an allowance (cost units it may take from
    /// now, sorted ascending) have finished, or one of them would finish past its allowance.
    pub fn run(mut self, allowances: &[(f64, JobId)]) -> Verdict {
        let allowed: BTreeMap<JobId, f64> = allowances.iter().map(|&(a, id)| (id, a)).collect();
        // The first job in `allowances` not finished yet: the next promise that can break.
        let mut next = 0;
        let mut new_finish = None;
        loop {
            let policy = self.policy;
            policy.fill(&mut self);
            while allowances
                .get(next)
                .is_some_and(|(_, id)| !self.left.contains_key(id))
            {
                next += 1;
            }
            match (allowances.get(next), new_finish) {
                (Some(&(allowance, job)), _) if self.spent > allowance => {
                    return Verdict::Late {
                        job,
                        at: self.spent,
                    }
                }
                (None, Some(new_finish)) => return Verdict::OnTime { new_finish },
                _ => {}
            }
            let Some(&Reverse(Row { end, .. })) = self.rows.peek() else {
                // Nothing runs and nothing can join: every job is done.
                let new_finish = new_finish.unwrap_or(self.spent);
                return Verdict::OnTime { new_finish };
            };
            self.advance(end);
            for job in self.end_rows(end) {
                if job == Self::NEW {
                    new_finish = Some(self.spent);
                }
                if allowed.get(&job).is_some_and(|&a| self.spent > a) {
                    return Verdict::Late {
                        job,
                        at: self.spent,
                    };
                }
            }
        }
    }

    /// Steps the running rows up to step `end`.
    fn advance(&mut self, end: i64) {
        let rows = self.rows.len() as i64;
        let first = self.joins.first().unwrap_or(self.step);
        let batch = StepRows {
            rows: rows as u64,
            sources: self.source_sum,
            // Every row joined at or before this step: its position is the steps since.
            positions: (rows * self.step - self.join_sum).max(0) as u64,
            longest_source: self.sources.last().unwrap_or(0),
            furthest_position: (self.step - first).max(0) as u64,
        };
        let count = (end - self.step) as u64;
        self.spent += self.cost.steps(&batch, count);
        if let Some(full) = self.keep_full {
            let missing = full.rows.saturating_sub(batch.rows);
            if missing > 0 {
                let mut kept = batch;
                kept.rows += missing;
                kept.sources += missing * full.source;
                kept.positions += missing * full.position;
                kept.longest_source = kept.longest_source.max(full.source);
                kept.furthest_position = kept.furthest_position.max(full.position);
                // The refilled rows are priced as they stand: newcomers replace finished
                // ones, so their mean position does not grow.
                self.spent += count as f64 * (self.cost.step(&kept) - self.cost.step(&batch));
            }
        }
        self.step = end;
    }

    /// Takes out the rows that end at step `end`; returns the jobs whose last text they were.
    fn end_rows(&mut self, end: i64) -> Vec<JobId> {
        let mut done = Vec::new();
        while let Some(&Reverse(row)) = self.rows.peek() {
            if row.end != end {
                break;
            }
            self.rows.pop();
            self.batch_tokens -= row.budget;
            self.sources.remove(row.source);
            self.joins.remove(row.joined);
            self.source_sum -= row.source;
            self.join_sum -= row.joined;
            let held = self.held.get_mut(&row.job).expect("a job with rows");
            if self.turn.remove(&Turn {
                held: *held,
                job: row.job,
            }) {
                self.turn.insert(Turn {
                    held: *held - 1,
                    job: row.job,
                });
            }
            *held -= 1;
            let left = self.left.get_mut(&row.job).expect("a job with texts");
            *left -= 1;
            if *left == 0 {
                self.left.remove(&row.job);
                done.push(row.job);
            }
        }
        done
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
        self.spent += cost::encode(text.source);
        if self.encoded_at != Some(self.step) {
            self.spent += cost::ENCODE_FIXED;
            self.encoded_at = Some(self.step);
        }
        self.push(Row {
            end: self.step + text.steps.max(1) as i64,
            job,
            budget: text.budget,
            source: text.source,
            joined: self.step,
        });
        more
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::cost::{AttentionReads, ContextReads};
    use crate::scheduler::policy::Batching;

    fn rows(max_batch_size: usize, max_batch_tokens: usize) -> RowPolicy {
        RowPolicy {
            batching: Batching::Continuous,
            max_batch_size,
            max_batch_tokens,
        }
    }

    fn text(source: u64, steps: u64) -> TextLoad {
        TextLoad {
            source,
            steps,
            position: 0,
            budget: (source + steps) as usize,
        }
    }

    fn waiting(texts: &[TextLoad]) -> JobLoad {
        JobLoad {
            waiting: texts.iter().copied().collect(),
            ..JobLoad::default()
        }
    }

    /// `count` texts of `source` tokens joining together and running `steps` steps.
    fn group(count: usize, source: u64, steps: u64) -> f64 {
        count as f64 * cost::encode(source)
            + cost::ENCODE_FIXED
            + cost::padded_steps(count, source, 0, steps)
    }

    /// One job: a text of 1,000 source tokens 200 steps into its output, 50 steps left.
    fn long_text_running() -> BTreeMap<JobId, JobLoad> {
        let mut long = JobLoad::default();
        long.running.insert(
            0,
            TextLoad {
                source: 1000,
                steps: 50,
                position: 200,
                budget: 2000,
            },
        );
        BTreeMap::from([(0, long)])
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-6 * b.abs().max(1.0)
    }

    #[test]
    fn a_text_behind_a_big_request_takes_the_next_free_row() {
        // One request of 60 texts: four run (90 steps left), 56 wait.
        let mut big = waiting(&vec![text(10, 90); 56]);
        for index in 0..4 {
            big.running.insert(index, text(10, 90));
        }
        let jobs = BTreeMap::from([(0, big)]);
        // A one-text request holds no row, so it takes one of the first that free: the four
        // rows end, it joins with three of the big one's and runs 90 steps beside them.
        let one = waiting(&[text(10, 90)]);
        let replayed = Replay::new(rows(4, 10_000), StepCost::default(), &jobs, &one).run(&[]);
        let expected = cost::padded_steps(4, 10, 0, 90) + group(4, 10, 90);
        assert!(close(replayed.finish(), expected), "{replayed:?}");
        // Forty texts alternate with the big one for rows: two in each of 20 rounds after the
        // first, where waiting for all of the big one first would take 24.
        let forty = waiting(&vec![text(10, 90); 40]);
        let replayed = Replay::new(rows(4, 10_000), StepCost::default(), &jobs, &forty).run(&[]);
        let expected = cost::padded_steps(4, 10, 0, 90) + 20.0 * group(4, 10, 90);
        assert!(close(replayed.finish(), expected), "{replayed:?}");
    }

    #[test]
    fn the_batchs_token_limit_holds_texts_back_in_the_replay_too() {
        // Room for 4 rows but only 250 tokens: two texts of budget 100 at a time.
        let jobs: BTreeMap<JobId, JobLoad> =
            (0..3).map(|id| (id, waiting(&[text(10, 90)]))).collect();
        // Two join and run 90 steps, then the third and the new one.
        let new = waiting(&[text(10, 90)]);
        let replayed = Replay::new(rows(4, 250), StepCost::default(), &jobs, &new).run(&[]);
        assert!(close(replayed.finish(), 2.0 * group(2, 10, 90)));
        // A text over the limit runs alone rather than never: after the third, alone.
        let huge = waiting(&[text(10, 500)]);
        let replayed = Replay::new(rows(4, 250), StepCost::default(), &jobs, &huge).run(&[]);
        let expected = group(2, 10, 90) + group(1, 10, 90) + group(1, 10, 500);
        assert!(close(replayed.finish(), expected), "{replayed:?}");
    }

    #[test]
    fn over_padded_slots_every_row_pays_for_the_longest_source_and_output_beside_it() {
        // A text of 1,000 source tokens 200 steps into its output runs, 50 steps left. A short
        // text joining beside it makes its steps two rows at that source and that position:
        // more than three times what it costs alone.
        let jobs = long_text_running();
        let short = waiting(&[text(10, 20)]);
        let replayed = Replay::new(rows(4, 10_000), StepCost::default(), &jobs, &short).run(&[]);
        let beside = cost::encode(10) + cost::ENCODE_FIXED + cost::padded_steps(2, 1000, 200, 20);
        assert!(close(replayed.finish(), beside), "{replayed:?}");
        let alone = Replay::new(
            rows(4, 10_000),
            StepCost::default(),
            &BTreeMap::new(),
            &short,
        )
        .run(&[]);
        assert!(close(alone.finish(), group(1, 10, 20)));
        assert!(beside > 3.0 * alone.finish(), "{beside} vs {alone:?}");
    }

    #[test]
    fn rows_that_read_their_own_context_pay_for_their_own_lengths() {
        // The same long text beside the same short one, on a backend whose attention reads
        // each row's own source and cache (the fused kernels): the short row's steps are
        // priced by its own lengths, step by step as the positions grow, plus the padding's
        // residue.
        let own = StepCost::new(AttentionReads {
            source: ContextReads::OwnRows,
            cache: ContextReads::OwnRows,
        });
        let jobs = long_text_running();
        let short = waiting(&[text(10, 20)]);
        let replayed = Replay::new(rows(4, 10_000), own, &jobs, &short).run(&[]);
        let stepped: f64 = (0..20)
            .map(|i| {
                let mut batch = StepRows::default();
                batch.add(1000, 200 + i);
                batch.add(10, i);
                own.step(&batch)
            })
            .sum();
        let beside = cost::encode(10) + cost::ENCODE_FIXED + stepped;
        assert!(close(replayed.finish(), beside), "{replayed:?} vs {beside}");
        let padded = Replay::new(rows(4, 10_000), StepCost::default(), &jobs, &short).run(&[]);
        assert!(
            replayed.finish() < 0.7 * padded.finish(),
            "{replayed:?} vs {padded:?}"
        );
        // What is left of a job is its rows' own share either way.
        let left = jobs[&0].work(&own);
        assert!(close(left, own.row_steps(1000, 200, 50)));
    }

    #[test]
    fn the_batch_is_replayed_as_full_as_it_is() {
        // Four verses running, 10 steps left, and a long text joining as they end: its 300
        // steps are not replayed alone, since the rows the verses free are refilled by what
        // arrives next; they cost what four rows' do, the three refilled at the verses' mean
        // source (40) and position (20).
        let mut verses = JobLoad::default();
        for index in 0..4 {
            verses.running.insert(
                index,
                TextLoad {
                    source: 40,
                    steps: 10,
                    position: 20,
                    budget: 100,
                },
            );
        }
        let jobs = BTreeMap::from([(0, verses)]);
        let long = waiting(&[text(600, 300)]);
        let own = StepCost::new(AttentionReads {
            source: ContextReads::OwnRows,
            cache: ContextReads::OwnRows,
        });
        let replayed = Replay::new(rows(4, 10_000), own, &jobs, &long).run(&[]);
        let verses_steps: f64 = (0..10)
            .map(|i| own.step(&StepRows::uniform(4, 40, 20 + i)))
            .sum();
        let mut long_steps = 0.0;
        for i in 0..300 {
            let mut batch = StepRows::default();
            batch.add(600, i);
            for _ in 0..3 {
                batch.add(40, 20);
            }
            long_steps += own.step(&batch);
        }
        let stepwise = verses_steps + cost::encode(600) + cost::ENCODE_FIXED + long_steps;
        // In closed form: the long row's steps grow its position, the refilled rows are priced
        // as they stand at the first of them (their share of the padding's residue does not
        // follow the long row's growing cache): within a percent of step by step.
        let mut real = StepRows::default();
        real.add(600, 0);
        let mut kept = real;
        for _ in 0..3 {
            kept.add(40, 20);
        }
        let closed = verses_steps
            + cost::encode(600)
            + cost::ENCODE_FIXED
            + own.steps(&real, 300)
            + 300.0 * (own.step(&kept) - own.step(&real));
        assert!(close(replayed.finish(), closed), "{replayed:?} vs {closed}");
        assert!(
            (replayed.finish() / stepwise - 1.0).abs() < 0.01,
            "{stepwise}"
        );
        // Nothing running: nothing to keep.
        let alone = Replay::new(rows(4, 10_000), own, &BTreeMap::new(), &long).run(&[]);
        let own_steps: f64 = (0..300)
            .map(|i| own.step(&StepRows::uniform(1, 600, i)))
            .sum();
        assert!(close(
            alone.finish(),
            cost::encode(600) + cost::ENCODE_FIXED + own_steps
        ));
    }

    #[test]
    fn the_replay_stops_at_the_first_promise_it_sees_broken() {
        // Two jobs of four texts on four rows: the first (earlier) and the new one share the
        // rows, two each, for two rounds.
        let jobs = BTreeMap::from([(0, waiting(&[text(10, 90); 4]))]);
        let new = waiting(&[text(10, 90); 4]);
        let round = group(4, 10, 90);
        let replay = || Replay::new(rows(4, 10_000), StepCost::default(), &jobs, &new);
        let both = 2.001 * round;
        let on_time = replay().run(&[(both, 0), (both, Replay::NEW)]);
        let Verdict::OnTime { new_finish } = on_time else {
            panic!("{on_time:?}")
        };
        assert!(close(new_finish, 2.0 * round));
        // Promised one round and a half, the first is late, known when it finishes.
        let late = replay().run(&[(1.5 * round, 0), (10.0 * round, Replay::NEW)]);
        let Verdict::Late { job: 0, at } = late else {
            panic!("{late:?}")
        };
        assert!(close(at, 2.0 * round));
        // Promises already past are broken at once.
        let past = replay().run(&[(-1.0, 0), (10.0 * round, Replay::NEW)]);
        assert!(
            matches!(past, Verdict::Late { job: 0, at } if at < round),
            "{past:?}"
        );
    }
}
