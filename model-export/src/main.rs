//! `nmt-export`: checkpoint -> model package; `nmt-export length-predictor`: a trained
//! length predictor -> an existing package.

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "nmt-export",
    version,
    about = "Write a model package (ONNX graphs, tokenizer, manifest) from a checkpoint",
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    args: Option<model_export::ExportArgs>,
}

#[derive(Subcommand)]
enum Command {
    /// Add the length predictor of `nmt-train length-predictor` to a package: its ONNX graph
    /// (BERT weights as external data in the pretrained file, copied beside it), and its
    /// manifest entry with the linear fit.
    LengthPredictor(model_export::length_predictor::LengthPredictorExportArgs),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match (cli.command, cli.args) {
        (Some(Command::LengthPredictor(args)), _) => {
            let prediction = model_export::length_predictor::export_length_predictor(&args)?;
            let fit = prediction.linear_fit;
            println!(
                "wrote {} to {} (linear fit: target = {:.4} * source + {:.4})",
                model_export::length_predictor::GRAPH,
                args.package.display(),
                fit.slope,
                fit.intercept
            );
        }
        (None, Some(args)) => {
            let manifest = model_export::export_package(&args)?;
            println!(
                "wrote {} ({}, {} decoder state tensors) to {}",
                manifest.name,
                manifest.config.preset,
                manifest.decoder_state.len(),
                args.out.display()
            );
        }
        (None, None) => anyhow::bail!("nothing to do: give --checkpoint and --out (see --help)"),
    }
    Ok(())
}
