//! The overload report: a markdown table (stdout, `--out-md`) and JSON (`--out-json`).

use std::fmt::Write as _;

use serde::Serialize;

use super::schedule::Arrivals;
use super::summary::{GoalCheck, RateSummary, GOAL_MULTIPLE};
use crate::report::Document;
use crate::single_server::{example_body, RunHeader};
use crate::stats::CellSummary;

/// Everything an overload run reports.
#[derive(Debug, Clone, Serialize)]
pub struct OverloadReport {
    /// Date, command line, machine, server and model.
    #[serde(flatten)]
    pub header: RunHeader,
    pub verses_file: String,
    pub verses: usize,
    /// Fields every request carried beside `text` (`--request-fields`).
    pub request_fields: Option<serde_json::Value>,
    pub arrivals: Arrivals,
    pub seed: u64,
    pub warmup_seconds: f64,
    /// Measured seconds per rate.
    pub seconds: f64,
    /// The bench's own per-request timeout.
    pub client_timeout_seconds: f64,
    /// The server's `--max-queue-wait`: the wait its admission control aims to keep under.
    pub target_wait_seconds: f64,
    /// Where [`Self::target_wait_seconds`] came from.
    pub target_wait_source: String,
    pub calibration: Option<Calibration>,
    pub rates: Vec<RateSummary>,
    /// The goal at every rate of 10x or more.
    pub goal: Vec<GoalCheck>,
}

impl Document for OverloadReport {
    const TABLES: fn(&Self) -> String = tables;
    const MARKDOWN: fn(&Self) -> String = markdown;
}

/// The closed-loop cells the rates are scaled by and the goal is judged against.
#[derive(Debug, Clone, Serialize)]
pub struct Calibration {
    pub warmup_seconds: f64,
    pub seconds: f64,
    /// One closed-loop client.
    pub unloaded: CellSummary,
    /// `saturation_clients` closed-loop clients.
    pub saturation: CellSummary,
    pub saturation_clients: usize,
    /// Why that many clients.
    pub saturation_clients_rule: String,
    /// Requests per second answered in the saturation cell: what `1x` means.
    pub sustainable_per_second: f64,
    pub unloaded_p99_ms: Option<f64>,
}

/// Milliseconds, rounded; `-` for none.
pub fn ms(x: Option<f64>) -> String {
    x.map_or("-".into(), |v| format!("{v:.0}"))
}

fn pct(share: f64) -> String {
    format!("{:.1}%", share * 100.0)
}

/// Errors other than the timeouts after acceptance, which have a column of their own.
fn other_errors(r: &RateSummary) -> u64 {
    r.errors
        .iter()
        .filter(|(k, _)| *k != "http 504" && *k != "timeout")
        .map(|(_, n)| n)
        .sum()
}

/// The tables and the goal, as printed on stdout.
pub fn tables(report: &OverloadReport) -> String {
    let mut s = String::new();
    s.push_str(
        "| rate | target req/s | offered req/s | sent | accepted | shed (429) | 429 with Retry-After | Retry-After median s | timed out after acceptance | other errors | p50 ms | p90 ms | p99 ms | goodput req/s | goodput tok/s |\n",
    );
    s.push_str(
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
    );
    for r in &report.rates {
        let with_retry_after = if r.shed > 0 {
            pct(r.shed_with_retry_after as f64 / r.shed as f64)
        } else {
            "-".into()
        };
        let _ = writeln!(
            s,
            "| {} | {:.1} | {:.1} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.2} | {:.0} |",
            r.rate,
            r.target_per_second,
            r.offered_per_second,
            r.sent,
            pct(r.accepted_share),
            pct(r.shed_share),
            with_retry_after,
            r.retry_after_median_seconds
                .map_or("-".into(), |v| format!("{v}")),
            r.timed_out_after_acceptance,
            other_errors(r),
            ms(r.p50_ms),
            ms(r.p90_ms),
            ms(r.p99_ms),
            r.goodput_per_second,
            r.goodput_tokens_per_second,
        );
    }
    let errors: Vec<String> = report
        .rates
        .iter()
        .filter(|r| !r.errors.is_empty())
        .map(|r| {
            let kinds: Vec<String> = r.errors.iter().map(|(k, n)| format!("{n} x {k}")).collect();
            format!("{}: {}", r.rate, kinds.join(", "))
        })
        .collect();
    if !errors.is_empty() {
        let _ = writeln!(s, "\nErrors by kind: {}.", errors.join("; "));
    }
    s.push_str(
        "\n| rate | accepted max ms | 429 p50 / p99 ms | Retry-After max s | client send lag p99 / max ms | drain s | load average after |\n",
    );
    s.push_str("| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    for r in &report.rates {
        let _ = writeln!(
            s,
            "| {} | {} | {} / {} | {} | {} / {} | {:.1} | {} |",
            r.rate,
            ms(r.max_ms),
            ms(r.shed_p50_ms),
            ms(r.shed_p99_ms),
            r.retry_after_max_seconds
                .map_or("-".into(), |v| format!("{v}")),
            ms(r.send_lag_p99_ms),
            ms(r.send_lag_max_ms),
            r.drain_seconds,
            r.load_average.map_or("-".into(), |v| format!("{v:.2}")),
        );
    }
    s.push('\n');
    s.push_str(&goal(report));
    s
}

/// The goal, judged.
fn goal(report: &OverloadReport) -> String {
    let mut s = String::new();
    let unloaded = report.calibration.as_ref().and_then(|c| c.unloaded_p99_ms);
    let _ = writeln!(
        s,
        "Goal (issue 12): at {GOAL_MULTIPLE}x the sustainable rate, accepted p99 <= 2 x unloaded p99 + target wait{}, and no request timed out after being accepted.\n",
        match unloaded {
            Some(u) => format!(
                " (2 x {u:.0} ms + {:.0} ms = {:.0} ms)",
                report.target_wait_seconds * 1e3,
                2.0 * u + report.target_wait_seconds * 1e3
            ),
            None => String::new(),
        }
    );
    if unloaded.is_none() {
        s.push_str("- not judged: the unloaded cell answered no request\n");
    } else if report.goal.is_empty() {
        let _ = writeln!(s, "- not judged: no rate was {GOAL_MULTIPLE}x or more");
    }
    for g in &report.goal {
        let _ = writeln!(
            s,
            "- {} ({:.1}x): accepted p99 {} ms, bound {:.0} ms; {} timed out after acceptance: **{}**{}",
            g.rate,
            g.multiple,
            ms(g.p99_ms),
            g.bound_ms,
            g.timed_out_after_acceptance,
            if g.met { "met" } else { "not met" },
            if g.reasons.is_empty() {
                String::new()
            } else {
                format!(" ({})", g.reasons.join("; "))
            }
        );
    }
    s
}

/// The markdown document of `--out-md`: how the run was made, then [`tables`].
pub fn markdown(report: &OverloadReport) -> String {
    let mut s = String::new();
    s.push_str("# nmt-bench overload: open-loop request rates against admission control\n\n");
    report.header.write_markdown(&mut s);
    let _ = writeln!(
        s,
        "- inputs: {} ({} texts, one per request, round-robin from the first at every rate); body `{}`",
        report.verses_file,
        report.verses,
        example_body(report.request_fields.as_ref(), "VERSE".into())
    );
    let _ = writeln!(
        s,
        "- target wait (the server's `--max-queue-wait`): {} s ({})",
        report.target_wait_seconds, report.target_wait_source
    );
    if let Some(c) = &report.calibration {
        let _ = writeln!(
            s,
            "- calibration, closed loop, {} s warm-up then {} s each: unloaded (1 client) {:.2} req/s, p50 {} ms, p99 {} ms; \
             sustainable ({} clients: {}) {:.2} req/s, {:.0} target tok/s, p99 {} ms. `Nx` is N times that sustainable rate",
            c.warmup_seconds,
            c.seconds,
            c.unloaded.requests_per_second,
            ms(c.unloaded.p50_ms),
            ms(c.unloaded.p99_ms),
            c.saturation_clients,
            c.saturation_clients_rule,
            c.sustainable_per_second,
            c.saturation.tokens_per_second,
            ms(c.saturation.p99_ms),
        );
    }
    let _ = writeln!(
        s,
        "- per rate: {} arrivals{} sent on schedule whatever is outstanding (open loop), {} s warm-up (sent, not measured), \
         then {} s measured, then every request followed to its end. A request counts when its scheduled send time falls in \
         the measured window; latency runs from that scheduled time to the whole body. Accepted: not refused at the door \
         (429, another 4xx, 503) nor lost connecting. Percentiles (nearest rank) are over the accepted requests. \
         Timed out after acceptance: the server's 504, or no answer within the bench's {} s. Goodput: answers (200) that \
         came back inside the measured window, whenever sent, and their target tokens, per measured second",
        match report.arrivals {
            Arrivals::Poisson => "Poisson",
            Arrivals::Fixed => "evenly spaced",
        },
        match report.arrivals {
            Arrivals::Poisson => format!(" (seed {}, plus the rate's index)", report.seed),
            Arrivals::Fixed => String::new(),
        },
        report.warmup_seconds,
        report.seconds,
        report.client_timeout_seconds,
    );
    s.push('\n');
    s.push_str(&tables(report));
    s
}

/// The 1-minute load average (/proc/loadavg).
pub fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The CPU's model name: /proc/cpuinfo's `model name`, else lscpu's `Model name`.
pub fn cpu_model() -> Option<String> {
    let from_cpuinfo = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| field(&t, "model name"));
    from_cpuinfo.or_else(|| {
        let out = std::process::Command::new("lscpu").output().ok()?;
        field(&String::from_utf8_lossy(&out.stdout), "Model name")
    })
}

/// The instruction sets that decide which kernels ONNX Runtime picks, as
/// `tools/nmt_tools/machine.py` lists them: those this CPU has (/proc/cpuinfo's `flags`, or
/// `Features` on Arm), in that order.
pub fn isa_flags() -> Vec<String> {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    isa_flags_of(&cpuinfo)
}

/// The flags of [`ISA_FLAGS`] in `cpuinfo`.
fn isa_flags_of(cpuinfo: &str) -> Vec<String> {
    let present = field(cpuinfo, "flags")
        .or_else(|| field(cpuinfo, "Features"))
        .unwrap_or_default();
    let present: Vec<&str> = present.split_whitespace().collect();
    ISA_FLAGS
        .iter()
        .filter(|flag| present.contains(flag))
        .map(|flag| flag.to_string())
        .collect()
}

/// The instruction sets a report names (x86 `flags`, Arm `Features`): float32 speed turns on
/// AVX-512, int8 on VNNI.
const ISA_FLAGS: &[&str] = &[
    "avx",
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512bw",
    "avx512_vnni",
    "avx_vnni",
    "avx512_bf16",
    "amx_int8",
    "amx_bf16",
    "asimd",
    "asimddp",
    "sve",
    "sve2",
    "i8mm",
    "bf16",
];

/// The value of the first `key: value` line (key compared trimmed).
fn field(text: &str, key: &str) -> Option<String> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k.trim() == key && !v.trim().is_empty()).then(|| v.trim().to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::overload::summary::{goal_checks, summarize, RateRun};
    use std::time::Duration;

    #[test]
    fn isa_flags_in_the_order_of_the_list() {
        let cpuinfo = "model name\t: X\nflags\t\t: fpu avx2 sse avx avx512_vnni fma\n";
        assert_eq!(isa_flags_of(cpuinfo), ["avx", "avx2", "fma", "avx512_vnni"]);
        assert_eq!(
            isa_flags_of("Features\t: fp asimd asimddp\n"),
            ["asimd", "asimddp"]
        );
        assert!(isa_flags_of("").is_empty());
    }

    #[test]
    fn cpu_model_fields() {
        let cpuinfo = "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7B13\nflags\t: fpu\n";
        assert_eq!(
            field(cpuinfo, "model name").as_deref(),
            Some("AMD EPYC 7B13")
        );
        let lscpu = "Architecture:  x86_64\nModel name:    Intel(R) Xeon(R)\n";
        assert_eq!(
            field(lscpu, "Model name").as_deref(),
            Some("Intel(R) Xeon(R)")
        );
        assert_eq!(field("model name\t:\n", "model name"), None);
    }

    #[test]
    fn markdown_has_the_run_the_table_and_the_goal() {
        let mut rate = summarize(&RateRun {
            rate: "10x".into(),
            multiple: Some(10.0),
            target_per_second: 250.0,
            warmup: Duration::from_secs(3),
            span: Duration::from_secs(23),
            drain: Duration::ZERO,
            samples: &[],
        });
        rate.p99_ms = Some(9_000.0);
        rate.errors.insert("http 504".into(), 3);
        rate.timed_out_after_acceptance = 3;
        let unloaded = crate::stats::summarize("continuous", 1, &[], Duration::from_secs(1));
        let report = OverloadReport {
            header: RunHeader::for_tests("nmt-bench overload", &["--max-queue-wait", "4"], None),
            verses_file: "v".into(),
            verses: 1,
            request_fields: None,
            arrivals: Arrivals::Poisson,
            seed: 1,
            warmup_seconds: 3.0,
            seconds: 20.0,
            client_timeout_seconds: 120.0,
            target_wait_seconds: 4.0,
            target_wait_source: "--max-queue-wait in the server arguments".into(),
            calibration: Some(Calibration {
                warmup_seconds: 2.0,
                seconds: 10.0,
                unloaded: unloaded.clone(),
                saturation: unloaded,
                saturation_clients: 32,
                saturation_clients_rule: "rule".into(),
                sustainable_per_second: 25.0,
                unloaded_p99_ms: Some(150.0),
            }),
            goal: goal_checks(std::slice::from_ref(&rate), 150.0, 4.0),
            rates: vec![rate],
        };
        let md = markdown(&report);
        assert!(
            md.contains("- CPU: AMD EPYC; nproc: 2 (server and clients"),
            "{md}"
        );
        assert!(md.contains("`nmt-server --max-queue-wait 4`"), "{md}");
        assert!(md.contains("| 10x | 250.0 | 0.0 | 0 |"), "{md}");
        assert!(md.contains("Errors by kind: 10x: 3 x http 504."), "{md}");
        assert!(md.contains("(2 x 150 ms + 4000 ms = 4300 ms)"), "{md}");
        assert!(md.contains("**not met** (accepted p99 9000 ms is over the bound 4300 ms by 4700 ms; 3 request(s) timed out after being accepted)"), "{md}");
    }
}
