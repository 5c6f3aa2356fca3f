//! `nmt-export`: checkpoint -> model package; `nmt-export length-predictor`: a trained
//! length predictor -> an existing package; `nmt-export quantize`: a package -> its int8
//! copy; `nmt-export checkpoint`: a package -> a checkpoint to train on from;
//! `nmt-export regraph`: a package's graphs written again, in place; `nmt-export
//! import-marian`: a Hugging Face Marian (OPUS-MT) directory -> a package.

use clap::{Parser, Subcommand};
use model_export::quantize::{Int8Options, QuantizeTo, Quantized};

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
    /// Write the package with int8 weights: the float32 export, quantized as `nmt-export
    /// quantize` does it (see its --help). Smaller and faster on CPU; translations may differ
    /// slightly from float32. Needs python3 with onnxruntime and onnx.
    #[arg(long, value_enum)]
    quantize: Option<QuantizeTo>,
    #[command(flatten)]
    int8: Int8Options,
}

#[derive(Subcommand)]
enum Command {
    /// Add the length predictor of `nmt-train length-predictor` to a package: its ONNX graph
    /// (BERT weights as external data in the pretrained file, copied beside it), and its
    /// manifest entry with the linear fit.
    LengthPredictor(model_export::length_predictor::LengthPredictorExportArgs),
    /// Write an int8 copy of a float32 package: every matrix product of the encoder and
    /// decoder, the tied output projection included (given its own transposed copy of the
    /// embedding table), gets int8 weights with one scale per output channel; activations
    /// are quantized one row (one token of one sentence) at a time as the graphs run, so a
    /// translation does not depend on its batch-mates. Run by python3 (numpy, onnx,
    /// onnxruntime). Embedding tables of 1,024 rows or more become int8 rows with a scale
    /// each (a quarter of the memory in every session that loads them); GRU/LSTM layers and
    /// the length predictor stay float32. The package contract is unchanged, so nmt-server
    /// serves it as any other.
    Quantize(model_export::quantize::QuantizeArgs),
    /// Read a float32 Transformer-family package back into a checkpoint (config.json,
    /// model.safetensors, trainer_state.json with the package's provenance), so that
    /// `nmt-train train --init-from` can go on training a shipped model whose run's
    /// checkpoints are gone. Exporting the result writes the same weights again.
    Checkpoint(model_export::checkpoint::CheckpointArgs),
    /// Write a float32 Transformer-family package's encoder and decoder graphs again with
    /// this exporter, in place, keeping its weights (read back as `checkpoint` does), name,
    /// domains, evaluation, provenance and length predictor; the manifest gets the new
    /// checksums. For shipped packages when the graph writer changes how it computes, e.g.
    /// the encoder's relative attention in O(length x clip) memory instead of a table row
    /// per (query, key) pair.
    Regraph(model_export::regraph::RegraphArgs),
    /// Import a Hugging Face Marian (OPUS-MT) model: its weights written as this project's
    /// encoder and decoder-step graphs (the same contract and KV-cache slots as every
    /// package), its SentencePiece models converted to tokenizer.json (source) and
    /// target_tokenizer.json (target) by transformers' converter. Config fields and values
    /// it does not implement are refused, naming the field (docs/model-package.md,
    /// "Importing a model").
    ImportMarian(model_export::marian::ImportMarianArgs),
}

fn report_quantized(quantized: &Quantized, out: &std::path::Path) {
    let (enc, dec) = (&quantized.encoder, &quantized.decoder);
    println!(
        "wrote {} (int8, {}-bit weights: {} + {} weight MatMuls as integer products, output projection {}) to {}",
        quantized.manifest.name,
        model_package::int8::weight_bits_of(&quantized.manifest.quantization),
        enc.matmul_integer,
        dec.matmul_integer,
        if enc.untied_logits || dec.untied_logits {
            "untied"
        } else {
            "already untied"
        },
        out.display()
    );
    for path in &quantized.not_installed {
        println!("note: {path} was not installed beside the float32 package; install it beside this one too");
    }
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match (cli.command, cli.args) {
        (Some(Command::LengthPredictor(args)), _) => {
            let prediction = model_export::length_predictor::export_length_predictor(&args)?;
            let fit = prediction.linear_fit;
            let wrote = match &prediction.predictor {
                Some(spec) if spec.computes == model_package::PredictorGraph::Encoder => {
                    format!("added the length head to {}", spec.graph)
                }
                Some(spec) => format!("wrote {}", spec.graph),
                None => "recorded no predictor graph".to_owned(),
            };
            println!(
                "{wrote} in {} (linear fit: target = {:.4} * source + {:.4})",
                args.package.display(),
                fit.slope,
                fit.intercept
            );
        }
        (Some(Command::Checkpoint(args)), _) => {
            let weights = model_export::checkpoint::checkpoint_from_package(&args)?;
            println!(
                "wrote {} ({weights} weights from {})",
                args.out.display(),
                args.package.display()
            );
        }
        (Some(Command::Regraph(args)), _) => {
            let manifest = model_export::regraph::regraph_package(&args)?;
            println!(
                "rewrote the graphs of {} in {}",
                manifest.name,
                args.package.display()
            );
        }
        (Some(Command::ImportMarian(args)), _) => {
            let manifest = model_export::marian::import_marian(&args)?;
            println!(
                "wrote {} (Marian: {}+{} layers, d_model {}, vocabulary {}) to {}",
                manifest.name,
                manifest.config.encoder_layers,
                manifest.config.decoder_layers,
                manifest.config.d_model,
                manifest.config.vocab_size,
                args.out.display()
            );
        }
        (Some(Command::Quantize(args)), _) => {
            let quantized = model_export::quantize::quantize_package(&args)?;
            report_quantized(&quantized, &args.out);
        }
        (None, Some(args)) => match cli.quantize {
            Some(QuantizeTo::Int8) => {
                let quantized = model_export::quantize::export_quantized(&args, &cli.int8)?;
                report_quantized(&quantized, &args.out);
            }
            None => {
                let manifest = model_export::export_package(&args)?;
                println!(
                    "wrote {} ({}, {} decoder state tensors) to {}",
                    manifest.name,
                    manifest.config.preset,
                    manifest.decoder_state.len(),
                    args.out.display()
                );
            }
        },
        (None, None) => anyhow::bail!("nothing to do: give --checkpoint and --out (see --help)"),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn every_flag_is_documented() {
        let cli = Cli::command();
        cli.clone().debug_assert();
        let commands = std::iter::once(&cli).chain(cli.get_subcommands());
        for command in commands {
            for arg in command.get_arguments() {
                let id = arg.get_id().as_str();
                if id == "help" || id == "version" {
                    continue;
                }
                assert!(
                    arg.get_help().is_some(),
                    "{} --{id} has no help text",
                    command.get_name()
                );
            }
        }
    }

    #[test]
    fn quantize_parses_as_a_flag_and_as_a_subcommand() {
        let cli = Cli::try_parse_from([
            "nmt-export",
            "--checkpoint",
            "c",
            "--out",
            "o",
            "--quantize",
            "int8",
        ])
        .unwrap();
        assert_eq!(cli.quantize, Some(QuantizeTo::Int8));
        let cli = Cli::try_parse_from(["nmt-export", "quantize", "--package", "p", "--out", "q"])
            .unwrap();
        assert!(matches!(cli.command, Some(Command::Quantize(_))));
        assert!(Cli::try_parse_from(["nmt-export", "quantize", "--package", "p"]).is_err());
        assert!(Cli::try_parse_from([
            "nmt-export",
            "--checkpoint",
            "c",
            "--out",
            "o",
            "--quantize",
            "int4"
        ])
        .is_err());
    }
}
