//! `nmt-eval`: decodes a test set with model packages through nmt-server's own engine and
//! decode loop, scores it with sacrebleu, and writes report.json, report.md and PNG plots.
//! `nmt-eval --help` explains every flag; docs/evaluation.md what the report holds.

mod cli;
mod data;
mod plot;
mod report;
mod run;
mod sacrebleu;
mod saved;
mod stats;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let args = cli::Args::parse();
    match run::run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("nmt-eval: {e:#}");
            ExitCode::FAILURE
        }
    }
}
