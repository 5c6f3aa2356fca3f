//! Latency percentiles and the summary of one benchmark cell.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

/// The `p`-th percentile (0 < p <= 100) of `sorted` (ascending) by the nearest-rank method:
/// the smallest value with at least `p`% of the values at or below it. Always one of the
/// values, never an interpolation. `None` for no values or a `p` outside (0, 100].
pub fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() || !(p > 0.0 && p <= 100.0) {
        return None;
    }
    debug_assert!(sorted.windows(2).all(|w| w[0] <= w[1]), "not sorted");
    // Rank in 1..=n; the epsilon keeps e.g. 0.9 * 10 = 9.000000000000002 at rank 9.
    let rank = ((p / 100.0) * sorted.len() as f64 - 1e-9).ceil().max(1.0) as usize;
    Some(sorted[rank.min(sorted.len()) - 1])
}

/// What one request came back with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// HTTP 200 with a well-formed body: the sum of `output_tokens` over its translations.
    Ok { output_tokens: u64 },
    /// Anything else, with a short kind used to count errors by type
    /// (`http 503`, `timeout`, `connect`, `bad body`, ...).
    Error(String),
}

/// One request that completed inside the measured window.
#[derive(Debug, Clone)]
pub struct Sample {
    /// From just before sending to the whole body being read.
    pub latency: Duration,
    pub outcome: Outcome,
}

/// The numbers reported for one (mode, clients) cell.
#[derive(Debug, Clone, Serialize)]
pub struct CellSummary {
    pub mode: String,
    pub clients: usize,
    /// Requests that completed with HTTP 200 inside the measured window.
    pub requests: u64,
    /// Requests that completed with anything else inside the measured window.
    pub errors: u64,
    /// Errors by kind.
    pub error_kinds: BTreeMap<String, u64>,
    /// Sum of `output_tokens` over the successful requests.
    pub output_tokens: u64,
    /// Length of the measured window.
    pub wall_seconds: f64,
    /// `output_tokens / wall_seconds`.
    pub tokens_per_second: f64,
    /// `requests / wall_seconds` (successful requests only).
    pub requests_per_second: f64,
    /// Latency percentiles of the successful requests, in milliseconds (nearest rank).
    pub p50_ms: Option<f64>,
    pub p90_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub mean_ms: Option<f64>,
    pub max_ms: Option<f64>,
}

/// Sums up the samples of one cell measured over `wall`.
pub fn summarize(mode: &str, clients: usize, samples: &[Sample], wall: Duration) -> CellSummary {
    let mut latencies_ms = Vec::with_capacity(samples.len());
    let mut output_tokens = 0u64;
    let mut error_kinds: BTreeMap<String, u64> = BTreeMap::new();
    for sample in samples {
        match &sample.outcome {
            Outcome::Ok { output_tokens: n } => {
                output_tokens += n;
                latencies_ms.push(sample.latency.as_secs_f64() * 1e3);
            }
            Outcome::Error(kind) => *error_kinds.entry(kind.clone()).or_default() += 1,
        }
    }
    latencies_ms.sort_by(f64::total_cmp);
    let requests = latencies_ms.len() as u64;
    let errors = error_kinds.values().sum();
    let secs = wall.as_secs_f64();
    let per_second = |x: f64| if secs > 0.0 { x / secs } else { 0.0 };
    let mean_ms = (!latencies_ms.is_empty())
        .then(|| latencies_ms.iter().sum::<f64>() / latencies_ms.len() as f64);
    CellSummary {
        mode: mode.to_string(),
        clients,
        requests,
        errors,
        error_kinds,
        output_tokens,
        wall_seconds: secs,
        tokens_per_second: per_second(output_tokens as f64),
        requests_per_second: per_second(requests as f64),
        p50_ms: percentile(&latencies_ms, 50.0),
        p90_ms: percentile(&latencies_ms, 90.0),
        p99_ms: percentile(&latencies_ms, 99.0),
        mean_ms,
        max_ms: latencies_ms.last().copied(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentile_of_nothing_or_a_bad_p_is_none() {
        assert_eq!(percentile(&[], 50.0), None);
        assert_eq!(percentile(&[1.0], 0.0), None);
        assert_eq!(percentile(&[1.0], 100.5), None);
        assert_eq!(percentile(&[1.0], f64::NAN), None);
    }

    #[test]
    fn percentile_of_one_value_is_that_value() {
        for p in [0.1, 50.0, 90.0, 99.0, 100.0] {
            assert_eq!(percentile(&[7.5], p), Some(7.5));
        }
    }

    #[test]
    fn percentile_uses_nearest_rank() {
        let v: Vec<f64> = (1..=10).map(f64::from).collect();
        assert_eq!(percentile(&v, 10.0), Some(1.0));
        assert_eq!(percentile(&v, 11.0), Some(2.0));
        assert_eq!(percentile(&v, 50.0), Some(5.0));
        assert_eq!(percentile(&v, 90.0), Some(9.0));
        assert_eq!(percentile(&v, 99.0), Some(10.0));
        assert_eq!(percentile(&v, 100.0), Some(10.0));

        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), Some(50.0));
        assert_eq!(percentile(&v, 90.0), Some(90.0));
        assert_eq!(percentile(&v, 99.0), Some(99.0));

        let v: Vec<f64> = (1..=1000).map(f64::from).collect();
        assert_eq!(percentile(&v, 99.0), Some(990.0));
        assert_eq!(percentile(&v, 99.9), Some(999.0));
    }

    #[test]
    fn percentile_with_two_values_and_ties() {
        assert_eq!(percentile(&[1.0, 2.0], 50.0), Some(1.0));
        assert_eq!(percentile(&[1.0, 2.0], 50.1), Some(2.0));
        assert_eq!(percentile(&[3.0, 3.0, 3.0, 8.0], 75.0), Some(3.0));
        assert_eq!(percentile(&[3.0, 3.0, 3.0, 8.0], 90.0), Some(8.0));
    }

    #[test]
    fn summarize_counts_tokens_errors_and_rates() {
        let ok = |ms: u64, n: u64| Sample {
            latency: Duration::from_millis(ms),
            outcome: Outcome::Ok { output_tokens: n },
        };
        let err = |kind: &str| Sample {
            latency: Duration::from_millis(1),
            outcome: Outcome::Error(kind.to_string()),
        };
        let samples = vec![
            ok(30, 10),
            ok(10, 20),
            err("http 503"),
            ok(20, 30),
            err("http 503"),
            err("timeout"),
        ];
        let s = summarize("off", 4, &samples, Duration::from_secs(2));
        assert_eq!((s.mode.as_str(), s.clients), ("off", 4));
        assert_eq!((s.requests, s.errors, s.output_tokens), (3, 3, 60));
        assert_eq!(s.error_kinds["http 503"], 2);
        assert_eq!(s.error_kinds["timeout"], 1);
        assert_eq!(s.tokens_per_second, 30.0);
        assert_eq!(s.requests_per_second, 1.5);
        assert_eq!(s.p50_ms, Some(20.0));
        assert_eq!(s.p90_ms, Some(30.0));
        assert_eq!(s.p99_ms, Some(30.0));
        assert_eq!(s.mean_ms, Some(20.0));
        assert_eq!(s.max_ms, Some(30.0));
    }

    #[test]
    fn summarize_of_nothing_has_no_percentiles() {
        let s = summarize("continuous", 1, &[], Duration::from_secs(1));
        assert_eq!((s.requests, s.errors, s.output_tokens), (0, 0, 0));
        assert_eq!(s.tokens_per_second, 0.0);
        assert_eq!((s.p50_ms, s.p99_ms, s.mean_ms), (None, None, None));
    }
}
