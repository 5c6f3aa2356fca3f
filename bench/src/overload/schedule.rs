//! Request rates and the arrival schedules that realise them.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// One entry of `--rates`: requests per second, or a multiple of the sustainable rate that
/// the calibration measures.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Rate {
    /// `40`, `12.5`: requests per second.
    PerSecond(f64),
    /// `2x`, `0.5x`: that many times the sustainable rate.
    Multiple(f64),
}

impl FromStr for Rate {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        let (number, multiple) = match s.strip_suffix(['x', 'X']) {
            Some(n) => (n, true),
            None => (s, false),
        };
        let value: f64 = number
            .trim()
            .parse()
            .map_err(|_| format!("`{s}` is neither requests per second (`40`) nor a multiple of the sustainable rate (`2x`)"))?;
        if !(value.is_finite() && value > 0.0) {
            return Err(format!("`{s}`: a rate must be a positive number"));
        }
        Ok(if multiple {
            Rate::Multiple(value)
        } else {
            Rate::PerSecond(value)
        })
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Rate::PerSecond(r) => write!(f, "{r} req/s"),
            Rate::Multiple(m) => write!(f, "{m}x"),
        }
    }
}

impl Rate {
    /// Requests per second, given the sustainable rate (needed for multiples only).
    pub fn per_second(self, sustainable: Option<f64>) -> Option<f64> {
        match self {
            Rate::PerSecond(r) => Some(r),
            Rate::Multiple(m) => sustainable.map(|s| m * s),
        }
    }
}

/// How arrivals are spaced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Arrivals {
    /// Exponential gaps (a Poisson process): the bursts that independent users make.
    Poisson,
    /// Exactly `1/rate` apart: the same mean load without its bursts.
    Fixed,
}

/// When each request is sent, as offsets from the start, ascending and all below `span`:
/// `rate` per second on average. `seed` makes a Poisson schedule reproducible; a fixed one
/// ignores it. Empty for a rate that is not a positive finite number.
pub fn arrival_offsets(arrivals: Arrivals, rate: f64, span: Duration, seed: u64) -> Vec<Duration> {
    if !(rate.is_finite() && rate > 0.0) {
        return Vec::new();
    }
    let span = span.as_secs_f64();
    let mut out = Vec::with_capacity((rate * span).ceil() as usize + 1);
    match arrivals {
        Arrivals::Fixed => {
            // k / rate, not a running sum, so that rounding does not drift over long spans.
            let mut k = 0u64;
            loop {
                let t = k as f64 / rate;
                if t >= span {
                    break;
                }
                out.push(Duration::from_secs_f64(t));
                k += 1;
            }
        }
        Arrivals::Poisson => {
            let mut rng = SplitMix64(seed);
            let mut t = 0.0;
            loop {
                // 1 - u lies in (0, 1], so the logarithm is finite.
                let u = rng.next_f64();
                t += -(1.0 - u).ln() / rate;
                if t >= span {
                    break;
                }
                out.push(Duration::from_secs_f64(t));
            }
        }
    }
    out
}

/// SplitMix64 (Steele, Lea and Flood 2014): a schedule needs uniform numbers, not secrecy,
/// and this one gives the same schedule for a seed on every platform and for good.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1), from the top 53 bits.
    fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_parse_as_per_second_or_multiples() {
        assert_eq!("40".parse::<Rate>(), Ok(Rate::PerSecond(40.0)));
        assert_eq!(" 12.5 ".parse::<Rate>(), Ok(Rate::PerSecond(12.5)));
        assert_eq!("2x".parse::<Rate>(), Ok(Rate::Multiple(2.0)));
        assert_eq!("0.5X".parse::<Rate>(), Ok(Rate::Multiple(0.5)));
        for bad in ["", "x", "0", "0x", "-1", "-2x", "inf", "NaNx", "ten", "2xx"] {
            assert!(bad.parse::<Rate>().is_err(), "{bad:?} parsed");
        }
        assert_eq!(Rate::Multiple(10.0).to_string(), "10x");
        assert_eq!(Rate::PerSecond(2.5).to_string(), "2.5 req/s");
    }

    #[test]
    fn multiples_need_the_sustainable_rate() {
        assert_eq!(Rate::PerSecond(7.0).per_second(None), Some(7.0));
        assert_eq!(Rate::PerSecond(7.0).per_second(Some(50.0)), Some(7.0));
        assert_eq!(Rate::Multiple(2.0).per_second(None), None);
        assert_eq!(Rate::Multiple(2.0).per_second(Some(25.5)), Some(51.0));
    }

    #[test]
    fn fixed_arrivals_are_evenly_spaced() {
        let t = arrival_offsets(Arrivals::Fixed, 4.0, Duration::from_secs(2), 0);
        let ms: Vec<u128> = t.iter().map(Duration::as_millis).collect();
        assert_eq!(ms, [0, 250, 500, 750, 1000, 1250, 1500, 1750]);
        // No drift: the 100,000th arrival at 300 req/s is where it should be.
        let t = arrival_offsets(Arrivals::Fixed, 300.0, Duration::from_secs(1000), 0);
        assert_eq!(t.len(), 300_000);
        assert!((t[100_000].as_secs_f64() - 100_000.0 / 300.0).abs() < 1e-6);
        assert!(*t.last().unwrap() < Duration::from_secs(1000));
    }

    #[test]
    fn poisson_arrivals_have_the_rate_and_exponential_gaps() {
        let rate = 50.0;
        let span = 2000.0;
        let t = arrival_offsets(Arrivals::Poisson, rate, Duration::from_secs_f64(span), 7);
        assert!(t.windows(2).all(|w| w[0] <= w[1]), "not ascending");
        assert!(*t.last().unwrap() < Duration::from_secs_f64(span));
        // 100,000 expected arrivals: the count's standard deviation is about 316.
        let n = t.len() as f64;
        assert!((n - rate * span).abs() < 1500.0, "{n} arrivals");
        let gaps: Vec<f64> = t.windows(2).map(|w| (w[1] - w[0]).as_secs_f64()).collect();
        let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
        let var = gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / gaps.len() as f64;
        // An exponential's standard deviation equals its mean (fixed gaps would give 0).
        assert!((mean * rate - 1.0).abs() < 0.02, "mean gap {mean}");
        assert!(
            (var.sqrt() / mean - 1.0).abs() < 0.03,
            "cv {}",
            var.sqrt() / mean
        );
        // P(gap > mean) = 1/e for an exponential.
        let above = gaps.iter().filter(|&&g| g > 1.0 / rate).count() as f64 / gaps.len() as f64;
        assert!((above - (-1.0f64).exp()).abs() < 0.01, "{above}");
    }

    #[test]
    fn splitmix64_matches_the_reference_and_is_uniform() {
        // The published first outputs for seed 1234567: this is SplitMix64, not a lookalike.
        let mut r = SplitMix64(1_234_567);
        assert_eq!(r.next_u64(), 6_457_827_717_110_365_317);
        assert_eq!(r.next_u64(), 3_203_168_211_198_807_973);
        let mut r = SplitMix64(0);
        let n = 100_000;
        let mut buckets = [0u32; 10];
        for _ in 0..n {
            let u = r.next_f64();
            assert!((0.0..1.0).contains(&u));
            buckets[(u * 10.0) as usize] += 1;
        }
        // Each tenth expects 10,000 with a standard deviation of 95.
        assert!(
            buckets.iter().all(|&b| b.abs_diff(10_000) < 500),
            "{buckets:?}"
        );
    }

    #[test]
    fn poisson_arrivals_are_reproducible_by_seed() {
        let span = Duration::from_secs(10);
        let a = arrival_offsets(Arrivals::Poisson, 20.0, span, 1);
        assert_eq!(a, arrival_offsets(Arrivals::Poisson, 20.0, span, 1));
        assert_ne!(a, arrival_offsets(Arrivals::Poisson, 20.0, span, 2));
    }

    #[test]
    fn no_arrivals_for_a_bad_rate_or_an_empty_span() {
        for rate in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            assert!(arrival_offsets(Arrivals::Poisson, rate, Duration::from_secs(1), 0).is_empty());
            assert!(arrival_offsets(Arrivals::Fixed, rate, Duration::from_secs(1), 0).is_empty());
        }
        assert!(arrival_offsets(Arrivals::Fixed, 10.0, Duration::ZERO, 0).is_empty());
        assert!(arrival_offsets(Arrivals::Poisson, 10.0, Duration::ZERO, 0).is_empty());
    }
}
