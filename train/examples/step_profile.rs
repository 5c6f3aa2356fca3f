//! Where a training step's time goes (forward, loss, backward, optimizer) and how many
//! parameters a preset has, at the given size on synthetic ids.
//!
//! `cargo run --release -p nmt-train --example step_profile -- [PRESET|all] [ROWS] [LEN] [STEPS]`
//! (defaults: `transformer`, 100 rows of 40 tokens, 5 steps, vocabulary 8000). Prints each
//! step's parts and the median step's target tokens/s (the first step, which grows the heap,
//! is a warm-up and not counted). With `all`, prints a markdown table of every preset:
//! parameters and median target tokens/s (threads as configured by `RAYON_NUM_THREADS`).
use std::time::Instant;

use candle_core::{DType, Device, Tensor};
use candle_nn::{VarBuilder, VarMap};
use model_package::ModelConfig;
use nmt_train::model::Dropout;
use nmt_train::model::{Model, Seq2Seq};
use nmt_train::ops::cross_entropy::label_smoothed_loss;
use nmt_train::train::optim::Adam;

const VOCAB: usize = 8000;

/// Parameters and the median step's target tokens/s of `preset`.
fn profile(
    preset: &str,
    rows: usize,
    len: usize,
    steps: usize,
    verbose: bool,
) -> anyhow::Result<(usize, f64)> {
    let dev = Device::Cpu;
    let varmap = VarMap::new();
    let config = ModelConfig::preset(preset, VOCAB)?;
    let model = Model::new(
        config.clone(),
        VarBuilder::from_varmap(&varmap, DType::F32, &dev),
    )?;
    let vars: Vec<_> = varmap
        .data()
        .lock()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let parameters = vars.iter().map(|(_, v)| v.elem_count()).sum();
    let mut adam = Adam::new(vars)?;
    let ids = Tensor::rand(0f32, (VOCAB - 10) as f32, (rows, len), &dev)?.to_dtype(DType::U32)?;
    let mask = Tensor::ones((rows, len), DType::F32, &dev)?;
    let lengths = Tensor::new(vec![len as u32 - 1; rows], &dev)?;
    let mut rates = Vec::new();
    for step in 0..=steps {
        let t = Instant::now();
        let dropout = Dropout::new(config.dropout, 1);
        let logits = model.forward(&ids, &mask, &ids, Some(&lengths), &dropout)?;
        let t_fwd = t.elapsed();
        let (loss, _) = label_smoothed_loss(&logits, &ids, &mask, 0.1)?;
        let t_loss = t.elapsed();
        let grads = loss.backward()?;
        let t_bwd = t.elapsed();
        adam.step(&grads, 1e-4, 1.0)?;
        let t_opt = t.elapsed();
        let tokens_per_second = (rows * len) as f64 / t_opt.as_secs_f64();
        if step > 0 {
            rates.push(tokens_per_second);
        }
        if verbose {
            println!(
                "{rows}x{len}: forward {:.2}s loss {:.2}s backward {:.2}s adam {:.2}s total {:.2}s = {tokens_per_second:.0} tgt tok/s",
                t_fwd.as_secs_f64(),
                (t_loss - t_fwd).as_secs_f64(),
                (t_bwd - t_loss).as_secs_f64(),
                (t_opt - t_bwd).as_secs_f64(),
                t_opt.as_secs_f64(),
            );
        }
    }
    rates.sort_by(f64::total_cmp);
    Ok((parameters, rates[rates.len() / 2]))
}

fn main() -> anyhow::Result<()> {
    nmt_train::tune_for_training();
    let preset = std::env::args().nth(1).unwrap_or("transformer".into());
    let rows: usize = std::env::args().nth(2).map_or(100, |s| s.parse().unwrap());
    let len: usize = std::env::args().nth(3).map_or(40, |s| s.parse().unwrap());
    let steps: usize = std::env::args().nth(4).map_or(5, |s| s.parse().unwrap());
    if preset != "all" {
        let (parameters, median) = profile(&preset, rows, len, steps, true)?;
        println!("{preset}: {parameters} parameters, median {median:.0} tgt tok/s");
        return Ok(());
    }
    println!("| preset | parameters | tgt tok/s ({rows}x{len}) |");
    println!("| --- | ---: | ---: |");
    for name in ModelConfig::PRESETS {
        let (parameters, tokens_per_second) = profile(name, rows, len, steps, false)?;
        println!("| {name} | {parameters} | {tokens_per_second:.0} |");
    }
    Ok(())
}
