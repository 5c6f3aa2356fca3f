//! `nmt-eval`'s plots: BLEU and length ratio by source-length bucket, one line per package,
//! drawn as [`nmt_eval::chart`] draws every chart.

use std::path::Path;

use anyhow::Result;
use nmt_eval::chart::{draw, load_font, Chart};

/// The plots of a report: BLEU and length ratio by source-length bucket, one line per
/// package. Returns how many were written.
pub fn write_plots(report: &crate::report::Report, out: &Path, font: &Path) -> Result<usize> {
    load_font(font)?;
    let labels: Vec<String> = report
        .decoding
        .bucket_edges
        .labels()
        .into_iter()
        .filter(|l| {
            report
                .systems
                .iter()
                .any(|s| s.by_source_length.iter().any(|b| b.bucket == *l))
        })
        .collect();
    let series = |value: fn(&crate::report::Row) -> f64| -> Vec<(String, Vec<Option<f64>>)> {
        report
            .systems
            .iter()
            .map(|s| {
                let values = labels
                    .iter()
                    .map(|l| s.by_source_length.iter().find(|b| &b.bucket == l))
                    .map(|b| b.map(|b| value(&b.row)))
                    .collect();
                (s.label.clone(), values)
            })
            .collect()
    };
    let set = &report.set.name;
    let charts = [
        (
            "bleu_by_length.png",
            Chart {
                title: format!("BLEU by source length ({set})"),
                y_label: "BLEU",
                labels: labels.clone(),
                series: series(|r| r.scores.bleu.score),
                reference: None,
            },
        ),
        (
            "length_ratio_by_length.png",
            Chart {
                title: format!("Output / reference length by source length ({set})"),
                y_label: "length ratio (sacrebleu)",
                labels: labels.clone(),
                series: series(|r| r.scores.length_ratio),
                reference: Some(1.0),
            },
        ),
    ];
    for (file, chart) in &charts {
        draw(chart, &out.join(file))?;
    }
    Ok(charts.len())
}
