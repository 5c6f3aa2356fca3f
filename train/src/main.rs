//! `nmt-train`: every step from the Bible modules to a trained checkpoint.

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "nmt-train", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Build the verse-aligned English->Spanish corpus from the SWORD modules via diatheke.
    Corpus(nmt_train::corpus::CorpusArgs),
    /// Train the shared source/target Unigram tokenizer on the training split.
    Tokenizer(nmt_train::tokenizer::TokenizerArgs),
    /// Train a model and write checkpoints.
    Train(nmt_train::train::TrainArgs),
    /// Write a corpus split as JSON lines (placeholder masking decided here) for the PyTorch
    /// trainer that runs where a GPU is.
    Pairs(nmt_train::train::pairs::PairsArgs),
    /// Average the weights of several checkpoints into one (export it like any checkpoint).
    Average(nmt_train::train::checkpoint::AverageArgs),
    /// Train the length predictor (a head on a frozen BERT) and measure it against the
    /// source length and a linear fit.
    LengthPredictor(nmt_train::length::LengthPredictorArgs),
}

fn main() -> anyhow::Result<()> {
    nmt_train::tune_for_training();
    match Cli::parse().command {
        Command::Corpus(mut args) => {
            // Subword statistics need the tokenizer, a later stage than the corpus.
            let tokenizer = args.tokenizer.take();
            let out = args.out.clone();
            nmt_train::corpus::run(args)?;
            match tokenizer {
                Some(path) => nmt_train::tokenizer::add_subword_stats(&out, &path),
                None => Ok(()),
            }
        }
        Command::Tokenizer(args) => nmt_train::tokenizer::run(args),
        Command::Train(args) => nmt_train::train::run(args),
        Command::Pairs(args) => nmt_train::train::pairs::run(args),
        Command::Average(args) => nmt_train::train::checkpoint::run_average(args),
        Command::LengthPredictor(args) => nmt_train::length::run(args),
    }
}
