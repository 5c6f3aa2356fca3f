//! `nmt-bench`: the benchmarks of `nmt-server` (the library's documentation, `src/lib.rs`,
//! says which does what).

use std::process::ExitCode;

use clap::Parser;
use nmt_bench::cli::{Args, Command};
use nmt_bench::{batching, beside_large, memory, overload};

fn main() -> ExitCode {
    let mut args = Args::parse();
    let outcome = match args.command.take() {
        Some(Command::Overload(o)) => overload::run(o),
        Some(Command::Storm(s)) => overload::storm::run(s),
        Some(Command::BesideLarge(b)) => beside_large::run(b),
        Some(Command::Memory(m)) => memory::run(m),
        None => batching::run(args.batching),
    };
    match outcome {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("nmt-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}
