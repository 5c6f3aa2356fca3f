//! Where a training step's time goes: forward, loss, backward, optimizer, for the shipped
//! model size on synthetic ids. `cargo run --release -p nmt-train --example step_profile`
use std::time::Instant;

use candle_core::{DType, Device, Tensor};
use candle_nn::{VarBuilder, VarMap};
use model_package::ModelConfig;
use nmt_train::dropout::Dropout;
use nmt_train::loss::label_smoothed_loss;
use nmt_train::model::Transformer;
use nmt_train::optim::Adam;

fn main() -> anyhow::Result<()> {
    nmt_train::keep_freed_memory_in_heap();
    let preset = std::env::args().nth(1).unwrap_or("transformer".into());
    let rows: usize = std::env::args().nth(2).map_or(100, |s| s.parse().unwrap());
    let len: usize = std::env::args().nth(3).map_or(40, |s| s.parse().unwrap());
    let dev = Device::Cpu;
    let varmap = VarMap::new();
    let config = ModelConfig::preset(&preset, 8000)?;
    let model = Transformer::new(
        config.clone(),
        VarBuilder::from_varmap(&varmap, DType::F32, &dev),
    )?;
    let vars = varmap
        .data()
        .lock()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let mut adam = Adam::new(vars)?;
    let ids = Tensor::rand(0f32, 7990.0, (rows, len), &dev)?.to_dtype(DType::U32)?;
    let mask = Tensor::ones((rows, len), DType::F32, &dev)?;
    for _ in 0..3 {
        let t = Instant::now();
        let dropout = Dropout::new(config.dropout, 1);
        let logits = model.forward(&ids, &mask, &ids, &dropout)?;
        let t_fwd = t.elapsed();
        let (loss, _) = label_smoothed_loss(&logits, &ids, &mask, 0.1)?;
        let t_loss = t.elapsed();
        let grads = loss.backward()?;
        let t_bwd = t.elapsed();
        adam.step(&grads, 1e-4, 1.0)?;
        let t_opt = t.elapsed();
        println!(
            "{rows}x{len}: forward {:.2}s loss {:.2}s backward {:.2}s adam {:.2}s total {:.2}s = {:.0} tgt tok/s",
            t_fwd.as_secs_f64(),
            (t_loss - t_fwd).as_secs_f64(),
            (t_bwd - t_loss).as_secs_f64(),
            (t_opt - t_bwd).as_secs_f64(),
            t_opt.as_secs_f64(),
            (rows * len) as f64 / t_opt.as_secs_f64()
        );
    }
    Ok(())
}
