//! The int8 product kernel alone (`engine::row_int8`): multiply-adds per second for a decoder
//! step's products at a few row counts, weights as a package has them (256 x 256, 256 x 1024,
//! 1024 x 256, 256 x 12000), so that a change to the kernel is measured apart from the graph.
//!
//! ```sh
//! cargo run --release -p nmt-bench --example int8_kernel
//! ```

use std::time::Instant;

use nmt_engine::row_int8::{PackedWeights, Quantized};

fn numbers(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) - 0.5
        })
        .collect()
}

fn main() {
    if !nmt_engine::row_int8::available() {
        eprintln!("this CPU has no AVX-512 VNNI: the kernel does not run here");
        return;
    }
    for (inner, columns) in [(256, 256), (256, 1024), (1024, 256), (256, 12000)] {
        let weights: Vec<i8> = numbers(inner * columns, 1)
            .iter()
            .map(|v| (v * 250.0) as i8)
            .collect();
        let scales = vec![0.01f32; columns];
        let bias = numbers(columns, 2);
        let packed = PackedWeights::new(&weights, &scales, &bias, inner, columns).unwrap();
        for rows in [1, 4, 8, 16, 32] {
            let x = numbers(rows * inner, 3);
            let mut out = vec![0.0f32; rows * columns];
            let mut scratch = Quantized::default();
            let serial = |chunks: usize, run: &(dyn Fn(usize) + Sync)| (0..chunks).for_each(run);
            let work = rows * inner * columns;
            let repeats = (2_000_000_000 / work).max(3);
            for _ in 0..3 {
                packed.multiply(&x, &mut out, &mut scratch, serial);
            }
            let start = Instant::now();
            for _ in 0..repeats {
                packed.multiply(&x, &mut out, &mut scratch, serial);
            }
            let seconds = start.elapsed().as_secs_f64() / repeats as f64;
            println!(
                "{inner:>5} x {columns:<5} rows {rows:>2}: {:8.2} us, {:6.1} GMAC/s",
                seconds * 1e6,
                work as f64 / seconds / 1e9
            );
        }
    }
}
