//! What one open-loop rate comes to, and the goal judged on it.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

use crate::stats::percentile;

/// What one open-loop request came back with.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// HTTP 200 with a well-formed body: the sum of `output_tokens` over its translations.
    Answered { output_tokens: u64 },
    /// HTTP 429: refused at the door. `retry_after` is the header as sent, if any.
    Shed { retry_after: Option<String> },
    /// Anything else, by kind: `http 504` (the server's request timeout, which only an
    /// accepted request reaches), `http 503`, `timeout` (the bench gave up waiting),
    /// `connect`, `transport`, `body`, `bad body`.
    Failed(String),
}

impl Outcome {
    /// Whether the server took the request in: not shed, not refused with another 4xx or a
    /// 503 (not ready, shutting down), and not lost before it reached the server.
    pub fn accepted(&self) -> bool {
        match self {
            Outcome::Answered { .. } => true,
            Outcome::Shed { .. } => false,
            Outcome::Failed(kind) => !refused_before_acceptance(kind),
        }
    }

    /// Whether it timed out after the server took it: the server's 504, or no answer at all
    /// within the bench's own timeout.
    pub fn timed_out_after_acceptance(&self) -> bool {
        matches!(self, Outcome::Failed(kind) if kind == "http 504" || kind == "timeout")
    }
}

fn refused_before_acceptance(kind: &str) -> bool {
    if kind == "connect" {
        return true;
    }
    match kind
        .strip_prefix("http ")
        .and_then(|c| c.parse::<u16>().ok())
    {
        Some(code) => (400..500).contains(&code) || code == 503,
        None => false,
    }
}

/// One request, warm-up or measured.
#[derive(Debug, Clone)]
pub struct Sample {
    /// When the schedule said to send it, from the start of the schedule.
    pub scheduled: Duration,
    /// From the time the schedule said to send it to the whole body being read: a request the
    /// client sent late is charged for the lateness, as its user would be.
    pub latency: Duration,
    /// How late the client actually sent it (its own CPU, shared with the server).
    pub send_lag: Duration,
    pub outcome: Outcome,
}

/// The numbers reported for one rate.
#[derive(Debug, Clone, Serialize)]
pub struct RateSummary {
    /// As given in `--rates`: `10x`, `40 req/s`.
    pub rate: String,
    /// The multiple of the sustainable rate, given (`10x`) or worked out (`40`).
    pub multiple: Option<f64>,
    /// The schedule's mean rate.
    pub target_per_second: f64,
    /// Length of the measured window.
    pub wall_seconds: f64,
    /// Requests the schedule put in the measured window (all were sent). Every count and
    /// latency below is over these, followed to their end, except goodput.
    pub sent: u64,
    /// `sent / wall_seconds`: the target rate as this schedule realised it.
    pub offered_per_second: f64,
    /// Taken in by the server ([`Outcome::accepted`]).
    pub accepted: u64,
    pub accepted_share: f64,
    /// HTTP 429.
    pub shed: u64,
    pub shed_share: f64,
    /// 429s that carried `Retry-After`.
    pub shed_with_retry_after: u64,
    /// Median `Retry-After` in seconds, over the 429s whose header is a number of seconds.
    pub retry_after_median_seconds: Option<f64>,
    pub retry_after_max_seconds: Option<f64>,
    /// Accepted, then timed out: the server's 504, or the bench's own timeout.
    pub timed_out_after_acceptance: u64,
    /// Every outcome other than 200 and 429, by kind.
    pub errors: BTreeMap<String, u64>,
    /// HTTP 200.
    pub answered: u64,
    /// Latency of the accepted requests (answered or failed after acceptance) in
    /// milliseconds, nearest rank.
    pub p50_ms: Option<f64>,
    pub p90_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub max_ms: Option<f64>,
    /// How fast a 429 came back.
    pub shed_p50_ms: Option<f64>,
    pub shed_p99_ms: Option<f64>,
    /// Answers (HTTP 200) that came back inside the measured window, whenever they were sent,
    /// per second of it: the rate the server got work done at under this load. (Counting the
    /// window's own requests instead would credit it with answers given long after it, while
    /// the queue it built drains.)
    pub goodput_per_second: f64,
    /// Target tokens of those answers per second.
    pub goodput_tokens_per_second: f64,
    /// How late the client sent requests (a loaded client offers less than the schedule).
    pub send_lag_p99_ms: Option<f64>,
    pub send_lag_max_ms: Option<f64>,
    /// From the end of the schedule to the last answer.
    pub drain_seconds: f64,
    /// The machine's 1-minute load average when the rate was over. Server and clients account
    /// for up to about 2 of it; more says something else wanted the CPU too.
    pub load_average: Option<f64>,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn sorted(mut v: Vec<f64>) -> Vec<f64> {
    v.sort_by(f64::total_cmp);
    v
}

/// `Retry-After` as a number of seconds; `None` for an HTTP date or garbage.
pub fn retry_after_seconds(header: &str) -> Option<f64> {
    let s = header.trim();
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return None;
    }
    s.parse().ok()
}

/// One rate as it ran.
#[derive(Debug, Clone)]
pub struct RateRun<'a> {
    pub rate: String,
    pub multiple: Option<f64>,
    pub target_per_second: f64,
    /// The measured window, from the start of the schedule: `warmup..span`.
    pub warmup: Duration,
    pub span: Duration,
    pub drain: Duration,
    /// Every request of the schedule, warm-up included.
    pub samples: &'a [Sample],
}

/// Sums up the measured window of one rate.
pub fn summarize(run: &RateRun<'_>) -> RateSummary {
    let window = run.warmup..=run.span;
    let (mut good, mut good_tokens) = (0u64, 0u64);
    for s in run.samples {
        if let Outcome::Answered { output_tokens } = s.outcome {
            if window.contains(&(s.scheduled + s.latency)) {
                good += 1;
                good_tokens += output_tokens;
            }
        }
    }
    let measured: Vec<&Sample> = run
        .samples
        .iter()
        .filter(|s| s.scheduled >= run.warmup && s.scheduled < run.span)
        .collect();
    let mut accepted_ms = Vec::new();
    let mut shed_ms = Vec::new();
    let mut lag_ms = Vec::with_capacity(run.samples.len());
    let mut retry_after = Vec::new();
    let mut errors: BTreeMap<String, u64> = BTreeMap::new();
    let (mut answered, mut shed, mut with_retry_after, mut timed_out) = (0u64, 0u64, 0u64, 0u64);
    for s in &measured {
        lag_ms.push(ms(s.send_lag));
        if s.outcome.accepted() {
            accepted_ms.push(ms(s.latency));
        }
        if s.outcome.timed_out_after_acceptance() {
            timed_out += 1;
        }
        match &s.outcome {
            Outcome::Answered { .. } => answered += 1,
            Outcome::Shed {
                retry_after: header,
            } => {
                shed += 1;
                shed_ms.push(ms(s.latency));
                if let Some(h) = header {
                    with_retry_after += 1;
                    retry_after.extend(retry_after_seconds(h));
                }
            }
            Outcome::Failed(kind) => *errors.entry(kind.clone()).or_default() += 1,
        }
    }
    let accepted_ms = sorted(accepted_ms);
    let shed_ms = sorted(shed_ms);
    let lag_ms = sorted(lag_ms);
    let retry_after = sorted(retry_after);
    let sent = measured.len() as u64;
    let secs = run.span.saturating_sub(run.warmup).as_secs_f64();
    let per_second = |x: u64| if secs > 0.0 { x as f64 / secs } else { 0.0 };
    let share = |x: u64| {
        if sent > 0 {
            x as f64 / sent as f64
        } else {
            0.0
        }
    };
    let accepted = accepted_ms.len() as u64;
    RateSummary {
        rate: run.rate.clone(),
        multiple: run.multiple,
        target_per_second: run.target_per_second,
        wall_seconds: secs,
        sent,
        offered_per_second: per_second(sent),
        accepted,
        accepted_share: share(accepted),
        shed,
        shed_share: share(shed),
        shed_with_retry_after: with_retry_after,
        retry_after_median_seconds: percentile(&retry_after, 50.0),
        retry_after_max_seconds: retry_after.last().copied(),
        timed_out_after_acceptance: timed_out,
        errors,
        answered,
        p50_ms: percentile(&accepted_ms, 50.0),
        p90_ms: percentile(&accepted_ms, 90.0),
        p99_ms: percentile(&accepted_ms, 99.0),
        max_ms: accepted_ms.last().copied(),
        shed_p50_ms: percentile(&shed_ms, 50.0),
        shed_p99_ms: percentile(&shed_ms, 99.0),
        goodput_per_second: per_second(good),
        goodput_tokens_per_second: per_second(good_tokens),
        send_lag_p99_ms: percentile(&lag_ms, 99.0),
        send_lag_max_ms: lag_ms.last().copied(),
        drain_seconds: run.drain.as_secs_f64(),
        load_average: None,
    }
}

/// The rates the goal is judged at: at least this many times the sustainable rate.
pub const GOAL_MULTIPLE: f64 = 10.0;

/// The goal at one rate of 10x or more: accepted p99 within twice the unloaded p99
/// plus the target wait, and no request timed out after it was accepted.
#[derive(Debug, Clone, Serialize)]
pub struct GoalCheck {
    pub rate: String,
    pub multiple: f64,
    pub p99_ms: Option<f64>,
    /// `2 × unloaded p99 + target wait`.
    pub bound_ms: f64,
    pub timed_out_after_acceptance: u64,
    pub met: bool,
    /// Why not, in words; empty when met.
    pub reasons: Vec<String>,
}

/// Judges every rate of at least [`GOAL_MULTIPLE`] times the sustainable rate.
pub fn goal_checks(
    rates: &[RateSummary],
    unloaded_p99_ms: f64,
    target_wait_seconds: f64,
) -> Vec<GoalCheck> {
    let bound_ms = 2.0 * unloaded_p99_ms + target_wait_seconds * 1e3;
    rates
        .iter()
        // The epsilon admits a `10` req/s rate against a sustainable 1.0000000001.
        .filter_map(|r| {
            r.multiple
                .filter(|&m| m >= GOAL_MULTIPLE - 1e-9)
                .map(|m| (r, m))
        })
        .map(|(r, multiple)| {
            let mut reasons = Vec::new();
            match r.p99_ms {
                Some(p99) if p99 <= bound_ms => {}
                Some(p99) => reasons.push(format!(
                    "accepted p99 {p99:.0} ms is over the bound {bound_ms:.0} ms by {:.0} ms",
                    p99 - bound_ms
                )),
                None => reasons.push("no request was accepted".to_string()),
            }
            if r.timed_out_after_acceptance > 0 {
                reasons.push(format!(
                    "{} request(s) timed out after being accepted",
                    r.timed_out_after_acceptance
                ));
            }
            GoalCheck {
                rate: r.rate.clone(),
                multiple,
                p99_ms: r.p99_ms,
                bound_ms,
                timed_out_after_acceptance: r.timed_out_after_acceptance,
                met: reasons.is_empty(),
                reasons,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Scheduled at 1 s, inside the window of [`run`].
    fn sample(latency_ms: u64, outcome: Outcome) -> Sample {
        Sample {
            scheduled: Duration::from_secs(1),
            latency: Duration::from_millis(latency_ms),
            send_lag: Duration::from_millis(latency_ms / 100),
            outcome,
        }
    }

    fn ok(ms: u64, tokens: u64) -> Sample {
        sample(
            ms,
            Outcome::Answered {
                output_tokens: tokens,
            },
        )
    }

    fn shed(ms: u64, retry_after: Option<&str>) -> Sample {
        sample(
            ms,
            Outcome::Shed {
                retry_after: retry_after.map(str::to_string),
            },
        )
    }

    fn failed(ms: u64, kind: &str) -> Sample {
        sample(ms, Outcome::Failed(kind.to_string()))
    }

    /// A window from 0.5 s to 2.5 s.
    fn run(samples: &[Sample]) -> RateSummary {
        summarize(&RateRun {
            rate: "10x".into(),
            multiple: Some(10.0),
            target_per_second: 5.0,
            warmup: Duration::from_millis(500),
            span: Duration::from_millis(2500),
            drain: Duration::from_millis(1500),
            samples,
        })
    }

    #[test]
    fn acceptance_by_outcome() {
        assert!(Outcome::Answered { output_tokens: 1 }.accepted());
        assert!(!Outcome::Shed { retry_after: None }.accepted());
        for kind in [
            "http 504",
            "http 500",
            "timeout",
            "transport",
            "body",
            "bad body",
        ] {
            assert!(Outcome::Failed(kind.into()).accepted(), "{kind}");
        }
        for kind in ["http 503", "http 413", "http 422", "connect"] {
            assert!(!Outcome::Failed(kind.into()).accepted(), "{kind}");
        }
        assert!(Outcome::Failed("http 504".into()).timed_out_after_acceptance());
        assert!(Outcome::Failed("timeout".into()).timed_out_after_acceptance());
        assert!(!Outcome::Failed("http 500".into()).timed_out_after_acceptance());
        assert!(!Outcome::Shed { retry_after: None }.timed_out_after_acceptance());
    }

    #[test]
    fn retry_after_is_read_as_seconds_only() {
        assert_eq!(retry_after_seconds("7"), Some(7.0));
        assert_eq!(retry_after_seconds(" 12 "), Some(12.0));
        assert_eq!(retry_after_seconds("1.5"), Some(1.5));
        assert_eq!(retry_after_seconds("Wed, 21 Oct 2015 07:28:00 GMT"), None);
        assert_eq!(retry_after_seconds("-3"), None);
        assert_eq!(retry_after_seconds(""), None);
    }

    #[test]
    fn summary_counts_shares_errors_and_goodput() {
        let samples = vec![
            ok(100, 10),
            ok(300, 20),
            shed(2, Some("4")),
            ok(200, 30),
            shed(4, Some("2")),
            shed(6, None),
            shed(3, Some("9")),
            failed(30_000, "http 504"),
            failed(1, "connect"),
            failed(500, "http 500"),
        ];
        let s = run(&samples);
        assert_eq!(s.sent, 10);
        assert_eq!(s.offered_per_second, 5.0);
        // 3 answered, the 504 and the 500 were accepted; 4 shed and the connect error not.
        assert_eq!((s.accepted, s.answered, s.shed), (5, 3, 4));
        assert_eq!((s.accepted_share, s.shed_share), (0.5, 0.4));
        assert_eq!(s.shed_with_retry_after, 3);
        assert_eq!(s.retry_after_median_seconds, Some(4.0));
        assert_eq!(s.retry_after_max_seconds, Some(9.0));
        assert_eq!(s.timed_out_after_acceptance, 1);
        assert_eq!(
            s.errors,
            BTreeMap::from([
                ("connect".to_string(), 1),
                ("http 500".to_string(), 1),
                ("http 504".to_string(), 1),
            ])
        );
        // Accepted latencies: 100, 200, 300, 500, 30000.
        assert_eq!(s.p50_ms, Some(300.0));
        assert_eq!(s.p90_ms, Some(30_000.0));
        assert_eq!(s.p99_ms, Some(30_000.0));
        assert_eq!(s.max_ms, Some(30_000.0));
        assert_eq!((s.shed_p50_ms, s.shed_p99_ms), (Some(3.0), Some(6.0)));
        // All three answers came back inside the window (at 1.1 to 1.3 s).
        assert_eq!(s.goodput_per_second, 1.5);
        assert_eq!(s.goodput_tokens_per_second, 30.0);
        assert_eq!(s.send_lag_max_ms, Some(300.0));
        assert_eq!(s.drain_seconds, 1.5);
    }

    #[test]
    fn the_window_counts_requests_by_schedule_and_goodput_by_answer() {
        let at = |scheduled_ms: u64, latency_ms: u64, outcome: Outcome| Sample {
            scheduled: Duration::from_millis(scheduled_ms),
            latency: Duration::from_millis(latency_ms),
            send_lag: Duration::ZERO,
            outcome,
        };
        let ok = |n| Outcome::Answered { output_tokens: n };
        let samples = vec![
            // Warm-up: not counted, but its answer at 0.7 s is goodput.
            at(200, 500, ok(7)),
            // Warm-up, answered before the window: nothing.
            at(100, 100, ok(100)),
            // In the window, answered inside it.
            at(600, 400, ok(5)),
            // In the window, answered after it (at 4.4 s): counted, latency and all, but no
            // goodput.
            at(2400, 2000, ok(100)),
            // Shed in the window.
            at(1000, 3, Outcome::Shed { retry_after: None }),
        ];
        let s = run(&samples);
        assert_eq!((s.sent, s.answered, s.accepted, s.shed), (3, 2, 2, 1));
        assert_eq!(s.wall_seconds, 2.0);
        assert_eq!(s.offered_per_second, 1.5);
        assert_eq!((s.p50_ms, s.p99_ms), (Some(400.0), Some(2000.0)));
        assert_eq!(s.goodput_per_second, 1.0);
        assert_eq!(s.goodput_tokens_per_second, 6.0);
    }

    #[test]
    fn summary_of_nothing_has_no_percentiles() {
        let s = run(&[]);
        assert_eq!((s.sent, s.accepted, s.shed, s.answered), (0, 0, 0, 0));
        assert_eq!(
            (s.accepted_share, s.shed_share, s.goodput_per_second),
            (0.0, 0.0, 0.0)
        );
        assert_eq!(
            (s.p50_ms, s.p99_ms, s.retry_after_median_seconds),
            (None, None, None)
        );
    }

    #[test]
    fn goal_is_judged_at_ten_times_and_above() {
        let mut rates = Vec::new();
        for (label, multiple, p99, timeouts) in [
            ("1x", Some(1.0), 900.0, 0),
            ("10x", Some(10.0), 2_500.0, 0),
            ("20x", Some(20.0), 2_700.0, 2),
            ("500 req/s", None, 9_000.0, 0),
        ] {
            let mut s = run(&[]);
            s.rate = label.into();
            s.multiple = multiple;
            s.p99_ms = Some(p99);
            s.timed_out_after_acceptance = timeouts;
            rates.push(s);
        }
        // Bound: 2 × 100 ms + 2.4 s = 2.6 s.
        let checks = goal_checks(&rates, 100.0, 2.4);
        assert_eq!(checks.len(), 2);
        assert_eq!(checks[0].rate, "10x");
        assert_eq!(checks[0].bound_ms, 2_600.0);
        assert!(checks[0].met, "{:?}", checks[0].reasons);
        assert!(!checks[1].met);
        assert_eq!(checks[1].reasons.len(), 2, "{:?}", checks[1].reasons);
        assert!(checks[1].reasons[0].contains("over the bound 2600 ms by 100 ms"));
        assert!(checks[1].reasons[1].contains("2 request(s) timed out"));

        rates[1].p99_ms = None;
        let checks = goal_checks(&rates, 100.0, 2.4);
        assert_eq!(checks[0].reasons, ["no request was accepted"]);
    }
}
