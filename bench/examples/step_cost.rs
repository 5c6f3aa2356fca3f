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
//! A decoder step of `rows` rows is timed as `fixed + rows * (row + source * max_source +
//! position * max_position)`: every row of the batch attends over the longest source's room
//! and the longest output's cache (the slots are padded to them), so the maxima count, not
//! each row's own lengths. An encoder run of `texts` texts padded to `length` tokens is
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

/// Steps a batch of `rows` sources of `length` tokens through `positions` positions, timing
/// each step after the first few (which allocate): regressors `[1, rows, rows * length,
/// rows * position]`.
fn decoder_samples(
    backend: &mut OrtBackend,
    eos: i64,
    (rows, length, positions): (usize, usize, usize),
    samples: &mut Vec<Sample>,
) -> Result<()> {
    let sources: Vec<Vec<i64>> = (0..rows).map(|row| source(row, length, eos)).collect();
    let refs: Vec<&[i64]> = sources.iter().map(Vec::as_slice).collect();
    let mut batch = <OrtBackend as Backend>::Rows::default();
    let encoded = backend.encode(&refs)?;
    let slots: Vec<usize> = (0..rows).collect();
    backend.place(&mut batch, encoded, &slots)?;
    let target_lengths = vec![positions as i64; rows];
    for position in 0..positions {
        let ids = vec![if position == 0 { 1 } else { 40 }; rows];
        let at = vec![position as i64; rows];
        let started = Instant::now();
        backend.step(&mut batch, &ids, &at, &target_lengths)?;
        let seconds = started.elapsed().as_secs_f64();
        if position >= 2 {
            let r = rows as f64;
            samples.push(Sample {
                x: vec![1.0, r, r * length as f64, r * position as f64],
                seconds,
                run: format!("{rows} rows, source {length}, positions 2-{positions}"),
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

/// (rows, source length, positions) of the decoder runs: short and long sources at the row
/// counts a server's batch holds, and long outputs.
const DECODER_RUNS: &[(usize, usize, usize)] = &[
    (1, 16, 160),
    (4, 16, 160),
    (16, 16, 160),
    (32, 16, 160),
    (1, 64, 96),
    (8, 64, 96),
    (32, 64, 96),
    (1, 256, 64),
    (8, 256, 64),
    (32, 256, 48),
    (1, 1024, 48),
    (4, 1024, 48),
    (16, 1024, 32),
    (1, 16, 1024),
    (4, 32, 640),
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

/// Prints the fits in seconds and in cost units (a row of a step being 1).
fn report(dir: &str, steps: &[Sample], encodes: &[Sample]) {
    let d = fit(steps);
    let e = fit(encodes);
    let (d50, d90) = relative_errors(steps, &d);
    let (e50, e90) = relative_errors(encodes, &e);
    let row = d[1];
    println!("package {dir}");
    println!(
        "decoder step s = {:.3e} + rows * ({:.3e} + {:.3e} * max_source + {:.3e} * max_position); \
         |error| median {:.0}%, p90 {:.0}% over {} steps",
        d[0],
        d[1],
        d[2],
        d[3],
        d50 * 100.0,
        d90 * 100.0,
        steps.len()
    );
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
    by_run("step", steps, &d);
    by_run("encode", encodes, &e);
    println!("in cost units (one row of a decoder step = 1):");
    println!("  STEP_FIXED = {:.2}", d[0] / row);
    println!(
        "  SOURCE_SCALE = {:.0} (tokens of source per unit)",
        row / d[2]
    );
    println!("  POSITION_SCALE = {:.0} (positions per unit)", row / d[3]);
    println!("  ENCODE_FIXED = {:.2}", e[0] / row);
    println!("  ENCODE_TOKEN = {:.4}", e[1] / row);
    println!("  ENCODE_PAIR = {:.3e}", e[2] / row);
    println!("  units per second = {:.0}", 1.0 / row);
}
