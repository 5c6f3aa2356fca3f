//! Which waiting text gets the next row of the batch: the scheduler's one rule, which the
//! worker fills its batch by and the door runs forward on expected sizes to tell when a new
//! request would finish (`admission::Replay`). Both go through [`RowPolicy::fill`], so the
//! estimate cannot drift from what the worker does.
//!
//! Texts, not whole jobs, take rows: a request larger than the free rows does not wait for the
//! batch to drain, and does not hold the rows of everyone behind it. Each free row goes to the
//! waiting job that holds the fewest rows, the earliest of those on a tie ([`Turn`]), and a
//! job's own texts join in order. So a request behind a big one gets the next free row, since
//! the big one holds rows and it holds none; the big one keeps the rows it has and takes more as
//! they free up, and when it holds none it is the earliest of those that hold none, so it always
//! advances. With FIFO by arrival instead, a small request waited for every text of the requests
//! ahead of it. Without batching a job joins whole, alone.

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Batching {
    /// Requests join the running decoder batch between steps.
    Continuous,
    /// One request at a time (its own texts still decode together): the baseline the
    /// benchmark compares against.
    Off,
}

/// A request the door accepted, numbered in the order of acceptance: the order in which jobs
/// holding as many rows take free ones.
pub type JobId = u64;

/// A job's text by its place among the job's texts: what the worker tags its rows with.
pub type Tag = (JobId, usize);

/// A waiting job's place in line for the next free row: the least goes first. The fields are
/// compared in order, so fewest rows held first, then the earliest accepted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Turn {
    /// Rows the job holds in the batch.
    pub held: usize,
    pub job: JobId,
}

/// The batch and the jobs waiting for it, as [`RowPolicy::fill`] sees them: the worker's real
/// ones, or the door's replay of them on expected sizes.
pub trait Rows {
    /// Rows in the batch (texts taken this fill included), and the token budgets they count.
    fn batch(&self) -> (usize, usize);
    /// The waiting job whose [`Turn`] is least, and the token budget of its next text.
    fn next_in_turn(&self) -> Option<(JobId, usize)>;
    /// Job `job`'s next waiting text takes a row; whether it has more texts waiting.
    fn take(&mut self, job: JobId) -> bool;
}

/// The running batch's limits, and whether requests share it at all.
#[derive(Clone, Copy, Debug)]
pub struct RowPolicy {
    pub batching: Batching,
    /// Most rows (texts) in the decoder batch.
    pub max_batch_size: usize,
    /// Most tokens the rows of the batch may reach: source plus output budget, summed.
    pub max_batch_tokens: usize,
}

impl RowPolicy {
    /// Whether a text counting `budget` tokens joins a batch of `rows` rows counting `tokens`.
    pub fn fits(&self, rows: usize, tokens: usize, budget: usize) -> bool {
        // Alone, any text runs: one larger than the token limit must not starve.
        rows == 0 || (rows < self.max_batch_size && tokens + budget <= self.max_batch_tokens)
    }

    /// Moves waiting texts into the batch while they fit, one row at a time to the job whose
    /// turn it is; without batching, the job whose turn it is joins whole, and only an empty
    /// batch (every job then holds no row, so that is the earliest waiting one).
    pub fn fill(&self, rows: &mut impl Rows) {
        match self.batching {
            Batching::Continuous => {
                while let Some((job, budget)) = rows.next_in_turn() {
                    let (held, tokens) = rows.batch();
                    if !self.fits(held, tokens, budget) {
                        return;
                    }
                    rows.take(job);
                }
            }
            Batching::Off => {
                if rows.batch().0 > 0 {
                    return;
                }
                if let Some((job, _)) = rows.next_in_turn() {
                    while rows.take(job) {}
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// Jobs of waiting texts (their budgets, in order) over an empty batch.
    #[derive(Default)]
    struct Queue {
        waiting: BTreeMap<JobId, Vec<usize>>,
        held: BTreeMap<JobId, usize>,
        tokens: usize,
        taken: Vec<JobId>,
    }

    impl Rows for Queue {
        fn batch(&self) -> (usize, usize) {
            (self.taken.len(), self.tokens)
        }

        fn next_in_turn(&self) -> Option<(JobId, usize)> {
            self.waiting
                .iter()
                .filter(|(_, texts)| !texts.is_empty())
                .min_by_key(|(&job, _)| Turn {
                    held: self.held.get(&job).copied().unwrap_or(0),
                    job,
                })
                .map(|(&job, texts)| (job, texts[0]))
        }

        fn take(&mut self, job: JobId) -> bool {
            let texts = self.waiting.get_mut(&job).unwrap();
            self.tokens += texts.remove(0);
            *self.held.entry(job).or_default() += 1;
            self.taken.push(job);
            !texts.is_empty()
        }
    }

    fn queue(jobs: &[&[usize]]) -> Queue {
        Queue {
            waiting: (0..).zip(jobs.iter().map(|texts| texts.to_vec())).collect(),
            ..Queue::default()
        }
    }

    fn policy(batching: Batching, max_batch_size: usize, max_batch_tokens: usize) -> RowPolicy {
        RowPolicy {
            batching,
            max_batch_size,
            max_batch_tokens,
        }
    }

    #[test]
    fn rows_alternate_between_the_jobs_holding_the_fewest() {
        let mut rows = queue(&[&[10; 5], &[10; 2], &[10]]);
        policy(Batching::Continuous, 6, 1000).fill(&mut rows);
        assert_eq!(rows.taken, [0, 1, 2, 0, 1, 0]);
    }

    #[test]
    fn the_token_limit_stops_the_fill_except_for_a_text_alone() {
        let mut rows = queue(&[&[60, 60], &[30]]);
        policy(Batching::Continuous, 8, 100).fill(&mut rows);
        // Job 1 holds none after job 0's first text, so it goes next; job 0's second text
        // would pass the limit.
        assert_eq!(rows.taken, [0, 1]);
        let mut huge = queue(&[&[500, 10]]);
        policy(Batching::Continuous, 8, 100).fill(&mut huge);
        assert_eq!(huge.taken, [0]);
    }

    #[test]
    fn without_batching_the_first_job_joins_whole_into_an_empty_batch_only() {
        let mut rows = queue(&[&[10; 3], &[10]]);
        let off = policy(Batching::Off, 2, 10);
        off.fill(&mut rows);
        assert_eq!(rows.taken, [0, 0, 0], "over both limits: whole, alone");
        off.fill(&mut rows);
        assert_eq!(rows.taken.len(), 3, "the batch is not empty");
    }
}
