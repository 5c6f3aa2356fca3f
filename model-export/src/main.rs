//! `nmt-export`: checkpoint -> model package.

use clap::Parser;

#[derive(Parser)]
#[command(
    name = "nmt-export",
    version,
    about = "Write a model package (ONNX graphs, tokenizer, manifest) from a checkpoint"
)]
struct Cli {
    #[command(flatten)]
    args: model_export::ExportArgs,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let manifest = model_export::export_package(&cli.args)?;
    println!(
        "wrote {} ({}, {} decoder state tensors) to {}",
        manifest.name,
        manifest.config.preset,
        manifest.decoder_state.len(),
        cli.args.out.display()
    );
    Ok(())
}
