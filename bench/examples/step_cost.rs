//! Calibrates the admission door's cost units (`server/src/scheduler/cost.rs`): times real
//! encoder runs and decoder steps of a model package at several sizes, fits how their time
//! grows with rows and attention length, and prints the constants in cost units (one unit:
//! one row of a decoder step, beyond the step's fixed part, with nothing to attend to).
//!
//! ```sh
//! source scripts/env.sh
//! cargo run --release -p nmt-bench --example step_cost [-- MODEL_DIR]
//! ```
//!
//! A decoder step is timed three ways: `fixed + rows * row + source * S + position * P` where
//! S and P are the rows' sources and positions summed (what the fused attention kernels read,
//! `engine::fused`: a row's own source and cache), or `rows` times the batch's longest source
//! and furthest position (what attention over padded slots reads: the unfused graphs, the
//! CUDA path), or both, which tells how much of the padding a fused package still pays for
//! (the cache and memory slots are still padded, and copied as such). Mixed batches (a long
//! source among verses, rows joining a batch whose cache is long) are what separate the two.
//! An encoder run of `texts` texts padded to `length` tokens is
//! timed as `fixed + texts * (token * length + pair * length^2)`: projections grow with the
//! tokens, attention scores with their pairs. Both fits weigh each sample by its relative
//! error, so that the short steps, which are most of a server's work, count as much as the
//! long ones.

use std::time::Instant;

use anyhow::{Context, Result};
use nmt_engine::backend::Backend;
use nmt_engine::onnx::{environment, OrtBackend, SessionOptions};
use nmt_engine::package::ModelPackage;

/// One timed run: its regressors, its seconds, and the configuration it came from.
struct Sample {
    x: Vec<f64>,
    seconds: f64,
    run: String,
}

/// Source `row` of `length` token ids, EOS last: ordinary ids, so that nothing is
/// special-cased, and different for every row: the backend encodes a source repeated in a
/// batch once (a character goal's candidate rows), so identical rows would time one text.
fn source(row: usize, length: usize, eos: i64) -> Vec<i64> {
    let mut ids: Vec<i64> = (0..length.saturating_sub(1))
        .map(|i| 10 + (i as i64 * 7 + row as i64 * 13) % 500)
        .collect();
    ids.push(eos);
    ids
}

/// Rows of a decoder run that join together: how many, their sources' length, and the step
/// of the run at which they join (their position 0).
#[derive(Clone, Copy, Debug)]
struct Group {
    rows: usize,
    source: usize,
    joins_at: usize,
}

/// A decoder run: its groups of rows and how many steps it takes.
#[derive(Clone, Copy, Debug)]
struct DecoderRun {
    groups: &'static [Group],
    steps: usize,
}

const fn run(groups: &'static [Group], steps: usize) -> DecoderRun {
    DecoderRun { groups, steps }
}

const fn group(rows: usize, source: usize, joins_at: usize) -> Group {
    Group {
        rows,
        source,
        joins_at,
    }
}

/// The regressors of one step over rows of `(source, position)`: `[1, rows, sum of sources,
/// sum of positions, rows * longest source, rows * furthest position]`. A row reads its own
/// source and cache in the fused attention kernels (`engine::fused`) and the batch's padded
/// ones elsewhere; uniform batches cannot tell the two apart, mixed ones can.
fn step_regressors(rows: &[(usize, usize)]) -> Vec<f64> {
    let n = rows.len() as f64;
    let sum = |f: fn(&(usize, usize)) -> usize| rows.iter().map(f).sum::<usize>() as f64;
    let max = |f: fn(&(usize, usize)) -> usize| rows.iter().map(f).max().unwrap_or(0) as f64;
    vec![
        1.0,
        n,
        sum(|r| r.0),
        sum(|r| r.1),
        n * max(|r| r.0),
        n * max(|r| r.1),
    ]
}

/// Steps `run` through its steps, placing each group at its step, timing each step after a
/// group's first two (which allocate).
fn decoder_samples(
    backend: &mut OrtBackend,
    eos: i64,
    run: DecoderRun,
    samples: &mut Vec<Sample>,
) -> Result<()> {
    let label = run
        .groups
        .iter()
        .map(|g| format!("{}x{} from {}", g.rows, g.source, g.joins_at))
        .collect::<Vec<_>>()
        .join(" + ");
    let mut batch = <OrtBackend as Backend>::Rows::default();
    // (source length, step joined) of every placed row, by slot.
    let mut placed: Vec<(usize, usize)> = Vec::new();
    let mut last_join = 0;
    for step in 0..run.steps {
        for g in run.groups.iter().filter(|g| g.joins_at == step) {
            let first = placed.len();
            let sources: Vec<Vec<i64>> = (first..first + g.rows)
                .map(|row| source(row, g.source, eos))
                .collect();
            let refs: Vec<&[i64]> = sources.iter().map(Vec::as_slice).collect();
            let encoded = backend.encode(&refs)?;
            let slots: Vec<usize> = (first..first + g.rows).collect();
            backend.place(&mut batch, encoded, &slots)?;
            placed.extend((0..g.rows).map(|_| (g.source, step)));
            last_join = step;
        }
        let rows: Vec<(usize, usize)> = placed.iter().map(|&(s, j)| (s, step - j)).collect();
        let ids: Vec<i64> = rows.iter().map(|r| if r.1 == 0 { 1 } else { 40 }).collect();
        let at: Vec<i64> = rows.iter().map(|r| r.1 as i64).collect();
        let target_lengths = vec![run.steps as i64; rows.len()];
        let started = Instant::now();
        backend.step(&mut batch, &ids, &at, &target_lengths)?;
        let seconds = started.elapsed().as_secs_f64();
        if step >= last_join + 2 {
            samples.push(Sample {
                x: step_regressors(&rows),
                seconds,
                run: label.clone(),
            });
        }
    }
    Ok(())
}

/// Encodes `texts` sources of `length` tokens `repeats` times: regressors `[1, texts *
/// length, texts * length^2]`.
fn encoder_samples(
    backend: &mut OrtBackend,
    eos: i64,
    (texts, length, repeats): (usize, usize, usize),
    samples: &mut Vec<Sample>,
) -> Result<()> {
    let sources: Vec<Vec<i64>> = (0..texts).map(|row| source(row, length, eos)).collect();
    let refs: Vec<&[i64]> = sources.iter().map(Vec::as_slice).collect();
    backend.encode(&refs)?;
    for _ in 0..repeats {
        let started = Instant::now();
        backend.encode(&refs)?;
        let seconds = started.elapsed().as_secs_f64();
        let (t, n) = (texts as f64, length as f64);
        samples.push(Sample {
            x: vec![1.0, t * n, t * n * n],
            seconds,
            run: format!("{texts} texts of {length}"),
        });
    }
    Ok(())
}

/// Least squares of `seconds` on `x`, each sample weighted by 1 / seconds (relative error).
fn fit(samples: &[Sample]) -> Vec<f64> {
    let k = samples[0].x.len();
    let mut a = vec![vec![0.0; k + 1]; k];
    for sample in samples {
        let w = 1.0 / (sample.seconds * sample.seconds);
        for (row, xi) in a.iter_mut().zip(&sample.x) {
            for (cell, xj) in row.iter_mut().zip(&sample.x) {
                *cell += w * xi * xj;
            }
            row[k] += w * xi * sample.seconds;
        }
    }
    solve(a)
}

/// Gauss-Jordan elimination with partial pivoting of the augmented matrix `a` (k x k+1).
fn solve(mut a: Vec<Vec<f64>>) -> Vec<f64> {
    let k = a.len();
    for col in 0..k {
        let pivot = (col..k)
            .max_by(|&i, &j| a[i][col].abs().total_cmp(&a[j][col].abs()))
            .expect("a row");
        a.swap(col, pivot);
        let p = a[col][col];
        for value in a[col].iter_mut() {
            *value /= p;
        }
        for row in 0..k {
            if row != col {
                let f = a[row][col];
                let pivot_row = a[col].clone();
                for (value, pv) in a[row].iter_mut().zip(pivot_row) {
                    *value -= f * pv;
                }
            }
        }
    }
    a.iter().map(|row| row[k]).collect()
}

fn predicted(sample: &Sample, coefficients: &[f64]) -> f64 {
    sample.x.iter().zip(coefficients).map(|(x, c)| x * c).sum()
}

/// The median and 90th percentile of |predicted / measured - 1| over `samples`.
fn relative_errors(samples: &[Sample], coefficients: &[f64]) -> (f64, f64) {
    let mut errors: Vec<f64> = samples
        .iter()
        .map(|s| (predicted(s, coefficients) / s.seconds - 1.0).abs())
        .collect();
    errors.sort_by(f64::total_cmp);
    let at = |q: f64| errors[((errors.len() as f64 * q) as usize).min(errors.len() - 1)];
    (at(0.5), at(0.9))
}

/// The decoder runs: uniform batches (short and long sources at the row counts a server's
/// batch holds, long outputs), then mixed ones: one long source among verses, and rows that
/// join a batch whose cache is already long.
const DECODER_RUNS: &[DecoderRun] = &[
    run(&[group(1, 16, 0)], 160),
    run(&[group(4, 16, 0)], 160),
    run(&[group(16, 16, 0)], 160),
    run(&[group(32, 16, 0)], 160),
    run(&[group(1, 64, 0)], 96),
    run(&[group(8, 64, 0)], 96),
    run(&[group(32, 64, 0)], 96),
    run(&[group(1, 256, 0)], 64),
    run(&[group(8, 256, 0)], 64),
    run(&[group(32, 256, 0)], 48),
    run(&[group(1, 1024, 0)], 48),
    run(&[group(4, 1024, 0)], 48),
    run(&[group(16, 1024, 0)], 32),
    run(&[group(1, 16, 0)], 1024),
    run(&[group(4, 32, 0)], 640),
    run(&[group(1, 1024, 0), group(15, 16, 0)], 48),
    run(&[group(1, 512, 0), group(31, 32, 0)], 48),
    run(&[group(2, 256, 0), group(30, 16, 0)], 64),
    run(&[group(1, 16, 0), group(15, 16, 400)], 460),
    run(&[group(4, 32, 0), group(28, 32, 200)], 260),
    run(
        &[group(1, 1024, 0), group(7, 16, 0), group(8, 16, 160)],
        200,
    ),
];

/// (texts, length, repeats) of the encoder runs, within the pieces the engine runs
/// (`memory::PAIRS_PER_RUN`).
const ENCODER_RUNS: &[(usize, usize, usize)] = &[
    (1, 16, 20),
    (8, 16, 20),
    (32, 16, 10),
    (1, 64, 20),
    (8, 64, 10),
    (32, 64, 5),
    (1, 256, 10),
    (8, 256, 5),
    (1, 512, 5),
    (4, 512, 3),
    (1, 1024, 3),
];

fn main() -> Result<()> {
    let dir = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "models/en-es-rel-ldpe".into());
    let package = ModelPackage::load(dir.as_ref()).with_context(|| dir.clone())?;
    let env = environment(None)?;
    let mut backend = OrtBackend::load(
        &env,
        &package.dir,
        &package.manifest,
        &SessionOptions::default(),
    )?;
    let eos = i64::from(package.manifest.eos_id);
    let mut steps = Vec::new();
    for &run in DECODER_RUNS {
        decoder_samples(&mut backend, eos, run, &mut steps)?;
        eprintln!("decoder {run:?}: {} samples", steps.len());
    }
    let mut encodes = Vec::new();
    for &run in ENCODER_RUNS {
        encoder_samples(&mut backend, eos, run, &mut encodes)?;
        eprintln!("encoder {run:?}: {} samples", encodes.len());
    }
    report(&dir, &steps, &encodes);
    Ok(())
}

/// Prints each run's measured and predicted seconds, summed over its samples.
fn by_run(what: &str, samples: &[Sample], coefficients: &[f64]) {
    let mut runs: Vec<(&str, f64, f64, usize)> = Vec::new();
    for s in samples {
        match runs.last_mut() {
            Some(last) if last.0 == s.run => {
                last.1 += s.seconds;
                last.2 += predicted(s, coefficients);
                last.3 += 1;
            }
            _ => runs.push((&s.run, s.seconds, predicted(s, coefficients), 1)),
        }
    }
    for (run, measured, predicted, n) in runs {
        println!(
            "  {what} {run}: {:.3} ms measured, {:.3} ms fitted (x{:.2})",
            measured / n as f64 * 1e3,
            predicted / n as f64 * 1e3,
            predicted / measured
        );
    }
}

/// `samples` with only the regressors at `keep`.
fn select(samples: &[Sample], keep: &[usize]) -> Vec<Sample> {
    samples
        .iter()
        .map(|s| Sample {
            x: keep.iter().map(|&i| s.x[i]).collect(),
            seconds: s.seconds,
            run: s.run.clone(),
        })
        .collect()
}

/// The step fits: what a row attends to priced by the batch's longest source and cache
/// (padded), by its own (own rows), and by both; each with its errors.
fn report_steps(steps: &[Sample]) -> Vec<f64> {
    let models: [(&str, &[usize]); 3] = [
        ("padded: rows * (max_source, max_position)", &[0, 1, 4, 5]),
        ("own rows: sum of sources, sum of positions", &[0, 1, 2, 3]),
        ("both", &[0, 1, 2, 3, 4, 5]),
    ];
    let mut both = Vec::new();
    for (name, keep) in models {
        let samples = select(steps, keep);
        let c = fit(&samples);
        let (e50, e90) = relative_errors(&samples, &c);
        let row = c[1];
        let scales: Vec<String> = c[2..].iter().map(|v| format!("{:.0}", row / v)).collect();
        println!(
            "decoder step, {name}: fixed {:.2} rows, row {:.3e} s, tokens per row-unit {}; \
             |error| median {:.0}%, p90 {:.0}% over {} steps",
            c[0] / row,
            row,
            scales.join(" / "),
            e50 * 100.0,
            e90 * 100.0,
            samples.len()
        );
        by_run("step", &samples, &c);
        both = c;
    }
    both
}

/// Prints the fits in seconds and in cost units (a row of a step being 1).
fn report(dir: &str, steps: &[Sample], encodes: &[Sample]) {
    println!("package {dir}");
    let d = report_steps(steps);
    let e = fit(encodes);
    let (e50, e90) = relative_errors(encodes, &e);
    let row = d[1];
    println!(
        "encoder run s = {:.3e} + texts * ({:.3e} * length + {:.3e} * length^2); \
         |error| median {:.0}%, p90 {:.0}% over {} runs",
        e[0],
        e[1],
        e[2],
        e50 * 100.0,
        e90 * 100.0,
        encodes.len()
    );
    by_run("encode", encodes, &e);
    println!("in cost units (one row of a decoder step = 1; the fit with both):");
    println!("  STEP_FIXED = {:.2}", d[0] / row);
    println!("  own source tokens per unit = {:.0}", row / d[2]);
    println!("  own positions per unit = {:.0}", row / d[3]);
    println!("  padded source tokens per unit = {:.0}", row / d[4]);
    println!("  padded positions per unit = {:.0}", row / d[5]);
    println!("  ENCODE_FIXED = {:.2}", e[0] / row);
    println!("  ENCODE_TOKEN = {:.4}", e[1] / row);
    println!("  ENCODE_PAIR = {:.3e}", e[2] / row);
    println!("  units per second = {:.0}", 1.0 / row);
}
