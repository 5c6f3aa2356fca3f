//! The beside-large report: a markdown table (stdout, `--out-md`) and JSON (`--out-json`).

use std::fmt::Write as _;

use serde::Serialize;

use super::{Comparison, Phase, ALONE};
use crate::overload::report::ms;
use crate::report::Document;
use crate::single_server::{example_body, RunHeader};

/// Everything a beside-large run reports.
#[derive(Debug, Clone, Serialize)]
pub struct BesideLargeReport {
    /// Date, command line, machine, server and model.
    #[serde(flatten)]
    pub header: RunHeader,
    pub verses_file: String,
    pub verses: usize,
    /// Fields every request carried beside `text` (`--request-fields`).
    pub request_fields: Option<serde_json::Value>,
    /// Closed-loop clients of one verse per request, in both phases.
    pub small_clients: usize,
    /// Verses in each request of the large client (phase B).
    pub large_texts: usize,
    pub warmup_seconds: f64,
    /// Measured seconds per phase.
    pub seconds: f64,
    /// The bench's own per-request timeout.
    pub client_timeout_seconds: f64,
    /// Small alone (A), then beside large (B); fewer when the run stopped early.
    pub phases: Vec<Phase>,
    /// The small clients in B over A, when both ran.
    pub comparison: Option<Comparison>,
}

impl Document for BesideLargeReport {
    const TABLES: fn(&Self) -> String = tables;
    const MARKDOWN: fn(&Self) -> String = markdown;
}

fn times(x: Option<f64>) -> String {
    x.map_or("-".into(), |v| format!("{v:.2}"))
}

/// The table and the ratios, as printed on stdout.
pub fn tables(report: &BesideLargeReport) -> String {
    let mut s = String::new();
    s.push_str(
        "| phase | small clients | small requests | small errors | small req/s | small p50 ms | small p90 ms | small p99 ms | large requests | large errors | large texts/s | large p50 ms | large p99 ms | target tok/s, all | load average after |\n",
    );
    s.push_str(
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
    );
    for p in &report.phases {
        let label = if p.phase == ALONE {
            format!("A: {}", p.phase)
        } else {
            format!("B: {} ({} texts)", p.phase, report.large_texts)
        };
        let (requests, errors, texts, p50, p99, tokens) = match &p.large {
            Some(l) => (
                l.summary.requests.to_string(),
                l.summary.errors.to_string(),
                format!("{:.1}", l.texts_per_second),
                ms(l.summary.p50_ms),
                ms(l.summary.p99_ms),
                l.summary.tokens_per_second,
            ),
            None => (
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                0.0,
            ),
        };
        let _ = writeln!(
            s,
            "| {label} | {} | {} | {} | {:.2} | {} | {} | {} | {requests} | {errors} | {texts} | {p50} | {p99} | {:.0} | {} |",
            p.small.clients,
            p.small.requests,
            p.small.errors,
            p.small.requests_per_second,
            ms(p.small.p50_ms),
            ms(p.small.p90_ms),
            ms(p.small.p99_ms),
            p.small.tokens_per_second + tokens,
            p.load_average.map_or("-".into(), |v| format!("{v:.2}")),
        );
    }
    let errors = errors_by_kind(report);
    if !errors.is_empty() {
        let _ = writeln!(s, "\nErrors by kind: {}.", errors.join("; "));
    }
    if let Some(c) = &report.comparison {
        let _ = writeln!(
            s,
            "\nSmall clients beside the large one (B) over alone (A): requests/s {}, p50 latency {}, p99 latency {}.",
            times(c.requests_per_second),
            times(c.p50),
            times(c.p99),
        );
    }
    s
}

/// `PHASE, small: N x KIND, ...` (and `PHASE, large: ...`) for every group of clients that
/// had errors.
fn errors_by_kind(report: &BesideLargeReport) -> Vec<String> {
    report
        .phases
        .iter()
        .flat_map(|p| {
            let small = (p.small.errors > 0).then(|| (format!("{}, small", p.phase), &p.small));
            let large = p
                .large
                .as_ref()
                .filter(|l| l.summary.errors > 0)
                .map(|l| (format!("{}, large", p.phase), &l.summary));
            small.into_iter().chain(large)
        })
        .map(|(who, cell)| {
            let kinds: Vec<String> = cell
                .error_kinds
                .iter()
                .map(|(k, n)| format!("{n} x {k}"))
                .collect();
            format!("{who}: {}", kinds.join(", "))
        })
        .collect()
}

/// The markdown document of `--out-md`: how the run was made, then [`tables`].
pub fn markdown(report: &BesideLargeReport) -> String {
    let mut s = String::new();
    s.push_str("# nmt-bench beside-large: small requests beside one client of large requests\n\n");
    report.header.write_markdown(&mut s);
    let with_fields = |text: serde_json::Value| example_body(report.request_fields.as_ref(), text);
    let _ =
        writeln!(
        s,
        "- inputs: {} ({} texts). Small requests: one verse each, body `{}`, verses round-robin \
         from the first in each phase. Large requests: body `{}` with {} consecutive verses, \
         wrapping around at the end of the inputs",
        report.verses_file,
        report.verses,
        with_fields("VERSE".into()),
        with_fields(serde_json::json!(["VERSE 1", "...", format!("VERSE {}", report.large_texts)])),
        report.large_texts,
    );
    let _ = writeln!(
        s,
        "- phases, one after the other against the same server: A, {} closed-loop small clients \
         alone; B, the same clients beside one closed-loop client of large requests, all \
         starting together. Each phase: {} s warm-up (sent, not measured), then {} s measured; \
         a request counts when it completes inside the measured window; at its end no new \
         request is sent and those in flight are waited for (not counted), so B starts against \
         an idle server. Latency percentiles (nearest rank) over successful requests; large \
         texts/s = texts of the large client's answered requests per measured second; target \
         tok/s, all = `output_tokens` of every answered request, small and large, per measured \
         second; client timeout {} s",
        report.small_clients, report.warmup_seconds, report.seconds, report.client_timeout_seconds,
    );
    s.push('\n');
    s.push_str(&tables(report));
    s
}

#[cfg(test)]
mod tests {
    use super::super::{compare, LargeClient, BESIDE};
    use super::*;
    use crate::stats::summarize;
    use std::time::Duration;

    #[test]
    fn markdown_has_the_run_the_table_and_the_ratios() {
        let mut alone = summarize("continuous", 16, &[], Duration::from_secs(20));
        alone.requests = 812;
        alone.requests_per_second = 40.6;
        alone.p50_ms = Some(380.0);
        alone.p99_ms = Some(1400.0);
        let mut beside = alone.clone();
        beside.requests_per_second = 20.3;
        beside.p99_ms = Some(2100.0);
        beside.errors = 2;
        beside.error_kinds.insert("http 429".into(), 2);
        let mut large = summarize("continuous", 1, &[], Duration::from_secs(20));
        large.requests = 10;
        large.p50_ms = Some(1900.0);
        let report = BesideLargeReport {
            header: RunHeader::for_tests(
                "nmt-bench beside-large",
                &["--batching", "continuous"],
                Some("en-es"),
            ),
            verses_file: "v".into(),
            verses: 461,
            request_fields: Some(serde_json::json!({"target_length": "source"})),
            small_clients: 16,
            large_texts: 64,
            warmup_seconds: 3.0,
            seconds: 20.0,
            client_timeout_seconds: 120.0,
            comparison: Some(compare(&alone, &beside)),
            phases: vec![
                Phase {
                    phase: ALONE.into(),
                    small: alone,
                    large: None,
                    load_average: Some(2.0),
                },
                Phase {
                    phase: BESIDE.into(),
                    small: beside,
                    large: Some(LargeClient::new(large, 64)),
                    load_average: None,
                },
            ],
        };
        let md = markdown(&report);
        assert!(
            md.contains("- CPU: AMD EPYC; nproc: 2 (server and clients"),
            "{md}"
        );
        assert!(md.contains("`nmt-server --batching continuous`"), "{md}");
        assert!(
            md.contains(r#"body `{"target_length":"source","text":["VERSE 1","...","VERSE 64"]}`"#),
            "{md}"
        );
        assert!(
            md.contains("| A: small alone | 16 | 812 | 0 | 40.60 | 380 | - | 1400 | - | - | - | - | - | 0 | 2.00 |"),
            "{md}"
        );
        assert!(
            md.contains("| B: beside large (64 texts) | 16 | 812 | 2 | 20.30 | 380 | - | 2100 | 10 | 0 | 32.0 | 1900 | - | 0 | - |"),
            "{md}"
        );
        assert!(
            md.contains("Errors by kind: beside large, small: 2 x http 429."),
            "{md}"
        );
        assert!(
            md.contains("requests/s 0.50, p50 latency 1.00, p99 latency 1.50."),
            "{md}"
        );
    }
}
