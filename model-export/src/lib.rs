//! Checkpoint -> model package: ONNX graphs written from the weights by this crate (no
//! tracer, no Python), the tokenizer, and a manifest with checksums and provenance; and,
//! into a written package, the length predictor ([`length_predictor`]); and from a package,
//! its int8 copy, by ONNX Runtime's Python quantizer ([`quantize`]); and back, from a
//! package to a checkpoint that training can start from ([`checkpoint`]), or to its graphs
//! written again by the current exporter ([`regraph`]); and a Hugging Face Marian (OPUS-MT)
//! directory imported as a package ([`marian`]).

pub mod checkpoint;
pub mod fused;
pub mod graph;
pub mod length_head;
pub mod length_predictor;
pub mod marian;
pub mod proto;
pub mod quantize;
pub mod recurrent;
pub mod regraph;
pub mod rnn_nmt;
pub mod transformer;

use std::path::{Path, PathBuf};

use anyhow::Context;
use candle_core::Device;
use model_package::{files, special, AbsolutePosition, Limits, Manifest, Precision};
use nmt_train::model::{Model, Seq2Seq};
use prost::Message;

#[derive(clap::Args, Clone, Debug)]
pub struct ExportArgs {
    /// Checkpoint directory (e.g. runs/en-es/best) holding config.json and model.safetensors.
    #[arg(long)]
    pub checkpoint: PathBuf,
    /// Tokenizer to ship; defaults to the one recorded in the checkpoint's trainer state.
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// Output directory of the model package (created or overwritten).
    #[arg(long)]
    pub out: PathBuf,
    /// Model name clients use to pick this package (`"model"` in a request). Default:
    /// `<source>-<target>-<preset>`, e.g. `en-es-rel-transformer`.
    #[arg(long)]
    pub name: Option<String>,
    /// Source language code.
    #[arg(long, default_value = "en")]
    pub source_language: String,
    /// Target language code.
    #[arg(long, default_value = "es")]
    pub target_language: String,
    /// Longest source (subwords, EOS included) the package accepts. Defaults, for models with
    /// absolute positions, to the longest training source (--max-len of the run); positions
    /// past it were never seen in training.
    #[arg(long)]
    pub max_source_tokens: Option<usize>,
    /// Decoding stops after this many target subwords. A model without absolute positions
    /// can go past its training lengths, so the default leaves room for long inputs (the
    /// server's `--max-output-tokens` still applies).
    #[arg(long, default_value_t = 1024)]
    pub max_target_tokens: usize,
    /// JSON file with evaluation results to record in the manifest.
    #[arg(long)]
    pub evaluation: Option<PathBuf>,
    /// What the model was trained on, in words its users read (repeat for each domain):
    /// written to the manifest's `domains`, shown by `GET /models` and the page.
    #[arg(long = "domain")]
    pub domains: Vec<String>,
}

impl ExportArgs {
    /// How the tests export a tiny model (`nmt_train::fixture`): named `tiny`, outputs of
    /// at most 64 subwords, nothing else recorded.
    pub fn tiny(checkpoint: &Path, out: &Path) -> Self {
        ExportArgs {
            checkpoint: checkpoint.to_path_buf(),
            tokenizer: None,
            out: out.to_path_buf(),
            name: Some("tiny".into()),
            source_language: "en".into(),
            target_language: "es".into(),
            max_source_tokens: None,
            max_target_tokens: 64,
            evaluation: None,
            domains: Vec::new(),
        }
    }
}

pub fn write_onnx(path: &Path, model: &proto::ModelProto) -> anyhow::Result<()> {
    std::fs::write(path, model.encode_to_vec())
        .with_context(|| format!("writing {}", path.display()))
}

/// The encoder and decoder-step graphs of `model`, and the decoder state they carry.
pub(crate) fn graphs(
    model: &Model,
) -> anyhow::Result<(
    (proto::ModelProto, proto::ModelProto),
    Vec<model_package::StateSpec>,
)> {
    Ok(match model {
        Model::Transformer(m) => (transformer::export(m)?, transformer::decoder_state(m)),
        Model::RnnNmt(m) => (rnn_nmt::export(m)?, rnn_nmt::decoder_state(m)),
    })
}

/// Writes the package and returns its manifest.
pub fn export_package(args: &ExportArgs) -> anyhow::Result<Manifest> {
    let model = nmt_train::train::checkpoint::load_model(&args.checkpoint, &Device::Cpu)?;
    let state = nmt_train::train::checkpoint::load_state(&args.checkpoint).ok();
    let tokenizer = match (&args.tokenizer, &state) {
        (Some(t), _) => t.clone(),
        (None, Some(s)) => PathBuf::from(&s.tokenizer),
        (None, None) => anyhow::bail!("no --tokenizer given and the checkpoint records none"),
    };
    let training_max_len = state
        .as_ref()
        .and_then(|s| s.args.get("max_len"))
        .and_then(|v| v.as_u64())
        .map(|v| v as usize);
    // Absolute positions are only trustworthy up to the training lengths (and a learned
    // table ends at max_positions); relative models declare no limit of their own.
    let config = model.config();
    let max_source_tokens = match config.absolute_position {
        AbsolutePosition::None => args.max_source_tokens,
        AbsolutePosition::Sinusoidal => args.max_source_tokens.or(training_max_len),
        AbsolutePosition::Learned => Some(
            args.max_source_tokens
                .or(training_max_len)
                .map_or(config.max_positions, |m| m.min(config.max_positions)),
        ),
    };

    std::fs::create_dir_all(&args.out)?;
    let ((encoder, decoder), decoder_state) = graphs(&model)?;
    write_onnx(&args.out.join(files::ENCODER), &encoder)?;
    write_onnx(&args.out.join(files::DECODER), &decoder)?;
    std::fs::copy(&tokenizer, args.out.join(files::TOKENIZER))
        .with_context(|| format!("copying {}", tokenizer.display()))?;
    let evaluation = match &args.evaluation {
        Some(p) => serde_json::from_str(&std::fs::read_to_string(p)?)?,
        None => serde_json::Value::Null,
    };
    let mut manifest = Manifest {
        format_version: model_package::manifest::FORMAT_VERSION,
        name: args.name.clone().unwrap_or_else(|| {
            format!(
                "{}-{}-{}",
                args.source_language, args.target_language, config.preset
            )
        }),
        source_language: args.source_language.clone(),
        target_language: args.target_language.clone(),
        config: config.clone(),
        pad_id: special::PAD,
        bos_id: special::BOS,
        eos_id: special::EOS,
        unk_id: special::UNK,
        decoder_state,
        limits: Limits {
            max_source_tokens,
            // A learned table also bounds the decoder's positions (BOS is position 0).
            max_target_tokens: config.position_table().map_or(args.max_target_tokens, |t| {
                args.max_target_tokens.min(t - 1)
            }),
        },
        precision: Precision::Float32,
        quantization: serde_json::Value::Null,
        files: Default::default(),
        training: serde_json::to_value(&state)?,
        evaluation,
        domains: args.domains.clone(),
        length_prediction: None,
        target_tokenizer: None,
    };
    manifest.write(
        &args.out,
        &[files::ENCODER, files::DECODER, files::TOKENIZER],
    )?;
    Ok(manifest)
}
