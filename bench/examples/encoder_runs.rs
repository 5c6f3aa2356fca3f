//! What an encoder costs a text by how texts are grouped into runs: one text a run (a server
//! whose rows free one at a time, encoding only the text that joins), runs of `k` texts
//! sorted by length (the engine's batches; the server's runs of like length, encoded ahead),
//! and runs of `k` in arrival order padded to the longest (texts joining together as they
//! come). Prints milliseconds of one thread a text for each grouping, per round, and the
//! cost of a run of one 2-token text (the run's fixed part).
//!
//! ```sh
//! source scripts/env.sh
//! cargo run --release -p nmt-bench --example encoder_runs -- runs/pkg-plain-int8 data/corpus/test.en
//! ```
//!
//! Arguments: the model package (default `models/en-es-l10n`), a file of source texts, one a
//! line (default `data/corpus/test.en`), and the number of rounds (default 3). One intra-op
//! thread, on an otherwise idle machine: the server's encoder runs between decoder steps,
//! whose data shares the caches, and costs more there.

use std::time::Instant;

use anyhow::{Context, Result};
use nmt_engine::backend::Backend;
use nmt_engine::onnx::{environment, OrtBackend, SessionOptions};
use nmt_engine::package::ModelPackage;
use nmt_engine::pipeline::source_ids;

/// Texts a run, for the sorted and arrival-order groupings.
const RUN_SIZES: &[usize] = &[2, 4, 8, 16];
/// Runs of the 2-token text timed for the fixed part.
const FIXED_RUNS: usize = 1000;

/// Milliseconds a text over `runs`, each encoded in one call.
fn per_text(backend: &mut OrtBackend, runs: &[Vec<&[i64]>]) -> Result<f64> {
    let texts: usize = runs.iter().map(Vec::len).sum();
    let started = Instant::now();
    for run in runs {
        backend.encode(run)?;
    }
    Ok(started.elapsed().as_secs_f64() * 1e3 / texts as f64)
}

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let dir = args.next().unwrap_or_else(|| "models/en-es-l10n".into());
    let texts = args.next().unwrap_or_else(|| "data/corpus/test.en".into());
    let rounds: usize = args.next().map_or(Ok(3), |r| r.parse())?;
    let package = ModelPackage::load(dir.as_ref()).with_context(|| dir.clone())?;
    let env = environment(None)?;
    let options = SessionOptions::default();
    let mut backend = OrtBackend::load(&env, &package.dir, &package.manifest, &options)?;
    let eos = package.manifest.eos_id;
    let lines = std::fs::read_to_string(&texts).with_context(|| texts.clone())?;
    let mut sources = Vec::new();
    for line in lines.lines().filter(|l| !l.trim().is_empty()) {
        let encoding = package
            .tokenizer
            .encode(line, false)
            .map_err(|e| anyhow::anyhow!("tokenizing {line:?}: {e}"))?;
        sources.push(source_ids(encoding.get_ids(), eos));
    }
    let mean = sources.iter().map(Vec::len).sum::<usize>() as f64 / sources.len() as f64;
    println!(
        "{dir}: {} texts of {texts}, {mean:.1} tokens on average (EOS included)",
        sources.len()
    );

    let arrival: Vec<&[i64]> = sources.iter().map(Vec::as_slice).collect();
    let mut sorted = arrival.clone();
    sorted.sort_by_key(|s| std::cmp::Reverse(s.len()));
    let mut groupings: Vec<(String, Vec<Vec<&[i64]>>)> = vec![(
        "one a run".into(),
        arrival.iter().map(|&s| vec![s]).collect(),
    )];
    for &k in RUN_SIZES {
        groupings.push((
            format!("sorted {k}"),
            sorted.chunks(k).map(<[_]>::to_vec).collect(),
        ));
        groupings.push((
            format!("arrival {k}"),
            arrival.chunks(k).map(<[_]>::to_vec).collect(),
        ));
    }
    // Warm-up: the sessions' first runs allocate what the others reuse.
    for run in groupings.iter().flat_map(|(_, runs)| runs.iter().take(8)) {
        backend.encode(run)?;
    }
    let tiny = source_ids(&[10], eos);
    for round in 1..=rounds {
        let mut line = format!("round {round}, ms a text:");
        for (name, runs) in &groupings {
            line += &format!(" {name} {:.3} |", per_text(&mut backend, runs)?);
        }
        let started = Instant::now();
        for _ in 0..FIXED_RUNS {
            backend.encode(&[tiny.as_slice()])?;
        }
        let fixed = started.elapsed().as_secs_f64() * 1e3 / FIXED_RUNS as f64;
        println!("{line} a 2-token run {fixed:.3} ms");
    }
    Ok(())
}
