//! The default benchmark's report: a markdown table (stdout, `--out-md`) and JSON
//! (`--out-json`).

use std::fmt::Write as _;

use serde::Serialize;

use crate::report::{shell_join, Document};
use crate::stats::CellSummary;

/// Everything a run reports.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// UTC, `YYYY-MM-DD HH:MM:SS UTC`.
    pub date: String,
    /// How `nmt-bench` was invoked.
    pub command_line: String,
    /// The full server argument list of every mode.
    pub server_args: Vec<ModeArgs>,
    /// `nproc` on the machine that ran both the server and the clients.
    pub nproc: usize,
    /// Worker threads of the clients' tokio runtime.
    pub client_threads: usize,
    /// The model name the server reported.
    pub model: Option<String>,
    pub verses_file: String,
    pub verses: usize,
    pub warmup_seconds: f64,
    pub seconds: f64,
    pub baseline_mode: String,
    pub results: Vec<CellSummary>,
    /// Throughput (target tokens/s) of every other mode over the baseline mode's.
    pub ratios: Vec<Ratio>,
    /// Each mode's server's peak resident memory (MiB) over the whole run, read just before
    /// it was stopped.
    pub peak_rss_mib: Vec<(String, Option<f64>)>,
}

impl Document for Report {
    const TABLES: fn(&Self) -> String = tables;
    const MARKDOWN: fn(&Self) -> String = markdown;
}

/// The server arguments of one mode.
#[derive(Debug, Clone, Serialize)]
pub struct ModeArgs {
    pub mode: String,
    /// The server executable.
    pub bin: String,
    pub args: Vec<String>,
    /// The fields every request of this mode carries beside `text` (`--request-kinds`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_fields: Option<serde_json::Value>,
}

/// `mode` throughput over `baseline` throughput at `clients`.
#[derive(Debug, Clone, Serialize)]
pub struct Ratio {
    pub clients: usize,
    pub mode: String,
    pub baseline: String,
    pub ratio: Option<f64>,
}

/// Throughput ratios of every mode other than `baseline` over `baseline`, per concurrency
/// level, in the order of `clients` and `modes`. Empty when `baseline` is not among `modes`.
pub fn ratios(
    results: &[CellSummary],
    modes: &[String],
    clients: &[usize],
    baseline: &str,
) -> Vec<Ratio> {
    let find = |mode: &str, c: usize| {
        results
            .iter()
            .find(|r| r.mode == mode && r.clients == c)
            .map(|r| r.tokens_per_second)
    };
    if !modes.iter().any(|m| m == baseline) {
        return Vec::new();
    }
    let mut out = Vec::new();
    for &c in clients {
        for mode in modes.iter().filter(|m| *m != baseline) {
            let ratio = match (find(mode, c), find(baseline, c)) {
                (Some(a), Some(b)) if b > 0.0 => Some(a / b),
                _ => None,
            };
            out.push(Ratio {
                clients: c,
                mode: mode.clone(),
                baseline: baseline.to_string(),
                ratio,
            });
        }
    }
    out
}

fn ms(x: Option<f64>) -> String {
    x.map_or("-".into(), |v| format!("{v:.1}"))
}

/// The results table (and the ratio table when there are ratios), as printed on stdout.
pub fn tables(report: &Report) -> String {
    let mut s = String::new();
    s.push_str(
        "| mode | clients | requests | errors | target tok/s | req/s | p50 ms | p90 ms | p99 ms |\n",
    );
    s.push_str("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    for r in &report.results {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {:.1} | {:.2} | {} | {} | {} |",
            r.mode,
            r.clients,
            r.requests,
            r.errors,
            r.tokens_per_second,
            r.requests_per_second,
            ms(r.p50_ms),
            ms(r.p90_ms),
            ms(r.p99_ms)
        );
    }
    let errors: Vec<String> = report
        .results
        .iter()
        .filter(|r| r.errors > 0)
        .map(|r| {
            let kinds: Vec<String> = r
                .error_kinds
                .iter()
                .map(|(k, n)| format!("{n} x {k}"))
                .collect();
            format!("{} at {} clients: {}", r.mode, r.clients, kinds.join(", "))
        })
        .collect();
    if !errors.is_empty() {
        let _ = writeln!(s, "\nErrors: {}.", errors.join("; "));
    }
    let rss: Vec<String> = report
        .peak_rss_mib
        .iter()
        .filter_map(|(mode, mib)| mib.map(|m| format!("{mode} {m:.0} MiB")))
        .collect();
    if !rss.is_empty() {
        let _ = writeln!(
            s,
            "\nPeak RSS of each server over the run: {}.",
            rss.join(", ")
        );
    }
    if !report.ratios.is_empty() {
        let mut others: Vec<&str> = Vec::new();
        for r in &report.ratios {
            if !others.contains(&r.mode.as_str()) {
                others.push(&r.mode);
            }
        }
        let _ = writeln!(
            s,
            "\nThroughput ratio (target tokens/s) over `{}`:\n",
            report.baseline_mode
        );
        s.push_str("| clients |");
        for m in &others {
            let _ = write!(s, " {m}/{} |", report.baseline_mode);
        }
        s.push_str("\n| ---: |");
        s.push_str(&" ---: |".repeat(others.len()));
        s.push('\n');
        let mut levels: Vec<usize> = report.ratios.iter().map(|r| r.clients).collect();
        levels.dedup();
        for c in levels {
            let _ = write!(s, "| {c} |");
            for m in &others {
                let ratio = report
                    .ratios
                    .iter()
                    .find(|r| r.clients == c && r.mode == *m)
                    .and_then(|r| r.ratio);
                let _ = write!(s, " {} |", ratio.map_or("-".into(), |v| format!("{v:.2}")));
            }
            s.push('\n');
        }
    }
    s
}

/// The markdown document of `--out-md`: how the run was made, then [`tables`].
pub fn markdown(report: &Report) -> String {
    let mut s = String::new();
    s.push_str("# nmt-bench: throughput and latency by concurrency\n\n");
    let _ = writeln!(s, "- date: {}", report.date);
    let _ = writeln!(s, "- command: `{}`", report.command_line);
    for m in &report.server_args {
        let _ = write!(
            s,
            "- server, mode `{}`: `{} {}`",
            m.mode,
            m.bin,
            shell_join(&m.args)
        );
        match &m.request_fields {
            Some(fields) => {
                let _ = writeln!(s, "; every request `{fields}` beside `text`");
            }
            None => s.push('\n'),
        }
    }
    let _ = writeln!(
        s,
        "- nproc: {} (server and clients on the same machine; clients on {} tokio worker thread{})",
        report.nproc,
        report.client_threads,
        if report.client_threads == 1 { "" } else { "s" }
    );
    if let Some(model) = &report.model {
        let _ = writeln!(s, "- model: {model}");
    }
    let _ = writeln!(
        s,
        "- inputs: {} ({} texts, one per request, round-robin from the first in every cell)",
        report.verses_file, report.verses
    );
    let _ = writeln!(
        s,
        "- per cell: {} s warm-up (not measured), then {} s measured; closed-loop clients; a request \
         counts when it completes inside the measured window; throughput = sum of `output_tokens` / \
         measured seconds; latency percentiles by nearest rank over successful requests",
        report.warmup_seconds, report.seconds
    );
    let modes: Vec<&str> = report.server_args.iter().map(|m| m.mode.as_str()).collect();
    let order = |m: &[&str]| {
        m.iter()
            .map(|m| format!("`{m}`"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let reversed: Vec<&str> = modes.iter().rev().copied().collect();
    if modes.len() > 1 {
        let _ = writeln!(
        s,
        "- cells interleaved: the servers of all modes ran side by side for the whole run (each \
         idle while the others were measured); at each concurrency level every mode's cell ran \
         back to back, in the order {} at the 1st, 3rd, ... level and {} at the 2nd, 4th, ..., \
         so that drift in the machine's speed hits all modes alike",
        order(&modes),
        order(&reversed)
    );
    }
    s.push('\n');
    s.push_str(&tables(report));
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::utc_string;
    use crate::stats::summarize;
    use std::time::Duration;

    #[test]
    fn ratios_over_the_baseline() {
        let cell = |mode: &str, clients: usize, tokens: u64| {
            let mut s = summarize(mode, clients, &[], Duration::from_secs(1));
            s.tokens_per_second = tokens as f64;
            s
        };
        let results = vec![
            cell("continuous", 1, 100),
            cell("continuous", 4, 300),
            cell("off", 1, 100),
            cell("off", 4, 0),
        ];
        let modes = vec!["continuous".to_string(), "off".to_string()];
        let r = ratios(&results, &modes, &[1, 4], "off");
        assert_eq!(r.len(), 2);
        assert_eq!(
            (r[0].clients, r[0].mode.as_str(), r[0].ratio),
            (1, "continuous", Some(1.0))
        );
        assert_eq!((r[1].clients, r[1].ratio), (4, None));
        assert!(ratios(&results, &modes, &[1, 4], "default").is_empty());
    }

    #[test]
    fn markdown_says_the_cells_were_interleaved() {
        let mode = |m: &str| ModeArgs {
            mode: m.to_string(),
            bin: "nmt-server".into(),
            args: vec!["--batching".to_string(), m.to_string()],
            request_fields: None,
        };
        let mut report = Report {
            date: utc_string(0),
            command_line: "nmt-bench".into(),
            server_args: vec![mode("continuous"), mode("off")],
            nproc: 2,
            client_threads: 1,
            model: None,
            verses_file: "v".into(),
            verses: 1,
            warmup_seconds: 1.0,
            seconds: 2.0,
            baseline_mode: "off".into(),
            results: Vec::new(),
            ratios: Vec::new(),
            peak_rss_mib: vec![("continuous".into(), Some(123.4))],
        };
        let md = markdown(&report);
        assert!(
            md.contains("in the order `continuous`, `off` at the 1st, 3rd, ... level and `off`, `continuous` at the 2nd"),
            "{md}"
        );
        assert!(
            md.contains("Peak RSS of each server over the run: continuous 123 MiB."),
            "{md}"
        );
        report.server_args.truncate(1);
        assert!(!markdown(&report).contains("interleaved"));
    }
}
