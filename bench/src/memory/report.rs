//! `nmt-bench memory`'s report: the table (stdout, Markdown), the JSON, and the plot.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Result;
use nmt_eval::chart::{draw, load_font, Chart};
use serde::Serialize;

use super::{MemoryArgs, PackageRun};
use crate::overload::report::cpu_model;
use crate::report::{nproc, shell_join, utc_now, Document};

#[derive(Debug, Serialize)]
pub struct MemoryReport {
    pub command: String,
    pub date: String,
    pub cpu: Option<String>,
    pub cores: usize,
    pub output_subwords: usize,
    pub settle_seconds: f64,
    pub settled_fraction: f64,
    pub packages: Vec<PackageRun>,
}

impl MemoryReport {
    pub fn new(args: &MemoryArgs, packages: Vec<PackageRun>) -> Self {
        MemoryReport {
            command: shell_join(&std::env::args().collect::<Vec<_>>()),
            date: utc_now(),
            cpu: cpu_model(),
            cores: nproc(),
            output_subwords: args.output_subwords,
            settle_seconds: args.settle_seconds,
            settled_fraction: args.settled_fraction,
            packages,
        }
    }
}

impl Document for MemoryReport {
    const TABLES: fn(&Self) -> String = tables;
    const MARKDOWN: fn(&Self) -> String = markdown;
}

/// One row per package and length: the peak over idle, and where the memory settled.
pub fn tables(report: &MemoryReport) -> String {
    let mut out = String::from(
        "| package | idle MiB | subwords | peak above idle MiB | after the answer MiB | back within 10% of idle | latency s |\n\
         | --- | ---: | ---: | ---: | ---: | --- | ---: |\n",
    );
    for run in &report.packages {
        for m in &run.measurements {
            let settled = match m.settled_after_seconds {
                Some(s) => format!("after {s:.1} s"),
                None => format!("no ({} s)", report.settle_seconds),
            };
            let _ = writeln!(
                out,
                "| {} | {:.0} | {} | {:.0} | {:.0} | {settled} | {:.2} |",
                run.name,
                run.idle_mib,
                m.subwords,
                m.peak_above_idle_mib,
                m.settled_mib,
                m.latency_seconds
            );
        }
    }
    out
}

pub fn markdown(report: &MemoryReport) -> String {
    let mut out = String::from("# Resident memory by input length\n\n");
    let _ = writeln!(
        out,
        "`{}` on {} ({} cores), {}. One server per package, one model worker; each text asks \
         for exactly {} target subwords, so what grows with the input is the encoder and the \
         decoder's cross-attention. Peak: `VmHWM` after resetting it (`clear_refs` 5) before \
         the request; afterwards the resident set is watched for {} s (\"back\": within {:.0}% \
         of idle).\n",
        report.command,
        report.cpu.as_deref().unwrap_or("an unknown CPU"),
        report.cores,
        report.date,
        report.output_subwords,
        report.settle_seconds,
        report.settled_fraction * 100.0
    );
    out.push_str("| package | positions |\n| --- | --- |\n");
    for run in &report.packages {
        let _ = writeln!(out, "| {} | {} |", run.name, run.positions);
    }
    out.push('\n');
    out.push_str(&tables(report));
    out
}

/// Peak above idle by input length, one line per package.
pub fn plot(report: &MemoryReport, path: &Path, font: &Path) -> Result<()> {
    load_font(font)?;
    let mut lengths: Vec<usize> = report
        .packages
        .iter()
        .flat_map(|r| r.measurements.iter().map(|m| m.subwords))
        .collect();
    lengths.sort_unstable();
    lengths.dedup();
    // Lengths within a few subwords of each other (tokenizers cut texts differently) share a
    // column: the label is the length asked for, rounded to 8.
    let column = |subwords: usize| subwords.div_ceil(8) * 8;
    let mut columns: Vec<usize> = lengths.iter().map(|&l| column(l)).collect();
    columns.dedup();
    let series = report
        .packages
        .iter()
        .map(|run| {
            let values = columns
                .iter()
                .map(|&c| {
                    run.measurements
                        .iter()
                        .find(|m| column(m.subwords) == c)
                        .map(|m| m.peak_above_idle_mib)
                })
                .collect();
            (run.name.clone(), values)
        })
        .collect();
    let chart = Chart {
        title: "Peak resident memory above idle, one text".into(),
        y_label: "MiB",
        labels: columns.iter().map(|c| c.to_string()).collect(),
        series,
        reference: None,
    };
    draw(&chart, path)
}
