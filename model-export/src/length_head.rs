//! `nmt-export length-predictor --head states|subwords`: a length predictor that reads what
//! the translation model reads, no second model and no other tokenizer. Either a head on the
//! model's own final encoder states (Yang et al. 2020), added to the encoder graph as one more
//! output, `predicted_lengths`; or a learned target length per source subword, a graph of
//! its own fed the encoder's inputs.
//!
//! Both are sums over the source's positions, linear, fitted in closed form by
//! `python/length_head.py` (which says why). This side picks and tokenizes the data (the
//! package's tokenizer, EOS appended, as the engine feeds the encoder), runs the script,
//! measures the graph's predictions against the two baselines (the source length and the
//! linear fit) with the measures of the BERT predictor
//! ([`nmt_train::length::stats::Measures`]), and records the predictor in the manifest.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use anyhow::{ensure, Context};
use model_package::{files, LengthPrediction, LengthPredictorSpec, Manifest, Precision};
use model_package::{LinearFit, PredictorGraph};
use nmt_train::length::stats::Measures;
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use serde::{Deserialize, Serialize};
use tokenizers::Tokenizer;

use crate::length_predictor::GRAPH;
use crate::quantize::Python;

const SCRIPT: &str = include_str!("../python/length_head.py");

/// Longest source a head takes, in subwords with EOS: it has no position table, so only the
/// server's own input limit applies; this is the figure the manifest records.
pub const HEAD_MAX_INPUT_TOKENS: usize = 65_536;

/// Evaluation splits, when the corpus has them: the Bible's dev and test books, their
/// multi-verse groups, and the held-out localization packages.
const SPLITS: [&str; 5] = ["dev", "test", "test_concat", "l10n-dev", "l10n-test"];

/// `--train-limit`'s default: the shipped head's draw.
pub const DEFAULT_TRAIN_LIMIT: usize = 200_000;
/// What a head reads.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeadFeatures {
    /// The encoder's final states: an output added to encoder.onnx, one encoder pass a text.
    States,
    /// The source's subwords: a table in length_predictor.onnx, no encoder pass.
    Subwords,
}

impl HeadFeatures {
    fn name(self) -> &'static str {
        match self {
            HeadFeatures::States => "states",
            HeadFeatures::Subwords => "subwords",
        }
    }

    /// The ridge penalty picked on the Bible dev book and l10n-dev: 256 dense features need
    /// little, 12,000 sparse ones (most seen a few times) more.
    fn default_ridge(self) -> f64 {
        match self {
            HeadFeatures::States => 1.0,
            HeadFeatures::Subwords => 10.0,
        }
    }
}

#[derive(clap::Args, Clone, Debug)]
pub struct LengthHeadArgs {
    /// Corpus directory written by `nmt-train corpus`: the head is fitted on its training
    /// pairs and measured on its dev, test, test-concat and (where present) l10n-dev and
    /// l10n-test splits.
    #[arg(long, default_value = "data/corpus-l10n")]
    pub corpus: PathBuf,
    /// Fit on this many training pairs drawn at random (0: all). Nearly all the time goes
    /// into the encoder's pass over them: about a millisecond a pair on one core.
    #[arg(long, default_value_t = DEFAULT_TRAIN_LIMIT)]
    pub train_limit: usize,
    /// Seed of that draw.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// L2 penalty of the ridge fit on the weights (default: 1 for states, 10 for subwords).
    #[arg(long)]
    pub ridge: Option<f64>,
    /// Record that soft mode pulls the decoder toward the predicted length from both sides
    /// beyond this share of it (`prediction_pull` in the manifest), e.g. 0.15: for a model
    /// that stops long inputs early when only its runaways are pulled.
    #[arg(long)]
    pub prediction_pull: Option<f64>,
    /// ONNX Runtime threads of the encoder pass.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    #[command(flatten)]
    pub python: Python,
}

impl Default for LengthHeadArgs {
    fn default() -> Self {
        LengthHeadArgs {
            corpus: PathBuf::from("data/corpus-l10n"),
            train_limit: DEFAULT_TRAIN_LIMIT,
            seed: 1,
            ridge: None,
            prediction_pull: None,
            threads: 1,
            python: Python::default(),
        }
    }
}

/// What `python/length_head.py` is given: encoder inputs and target lengths of the training
/// pairs, and each evaluation split's encoder inputs.
#[derive(Serialize)]
struct Work<'a> {
    train: &'a Tokenized,
    splits: BTreeMap<&'a str, &'a [Vec<u32>]>,
}

#[derive(Deserialize)]
struct ScriptReport {
    head: serde_json::Value,
    fitted_on: serde_json::Value,
    graph_minus_numpy_max: f64,
    graph_seconds_per_source: f64,
    predictions: BTreeMap<String, Vec<f64>>,
}

/// One split's measures: the head beside the two baselines.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct HeadEvaluation {
    pub predictor: Measures,
    pub source_length: Measures,
    pub linear_fit: Measures,
    pub mean_reference_length: f64,
}

/// A split's pairs as subword ids: sources with EOS (encoder inputs), target lengths.
#[derive(Serialize)]
struct Tokenized {
    sources: Vec<Vec<u32>>,
    targets: Vec<u32>,
}

/// The package's two tokenizers (one and the same file unless the manifest names a target
/// tokenizer) and the EOS its encoder inputs end with.
struct Tokenizers {
    source: Tokenizer,
    target: Tokenizer,
    eos: u32,
}

impl Tokenizers {
    fn load(package: &Path, manifest: &Manifest) -> anyhow::Result<Self> {
        let source = nmt_train::tokenizer::load(&package.join(files::TOKENIZER))?;
        let target = match &manifest.target_tokenizer {
            Some(file) => nmt_train::tokenizer::load(&package.join(file))?,
            None => source.clone(),
        };
        Ok(Tokenizers {
            source,
            target,
            eos: manifest.eos_id,
        })
    }

    fn tokenize<'a>(
        &self,
        pairs: impl IntoIterator<Item = &'a (String, String)>,
    ) -> anyhow::Result<Tokenized> {
        let mut sources = Vec::new();
        let mut targets = Vec::new();
        for (en, es) in pairs {
            let mut ids = nmt_train::tokenizer::encode_ids(&self.source, en)?;
            ids.push(self.eos);
            sources.push(ids);
            targets.push(nmt_train::tokenizer::encode_ids(&self.target, es)?.len() as u32);
        }
        Ok(Tokenized { sources, targets })
    }
}

fn split_pairs(corpus: &Path, split: &str) -> anyhow::Result<Option<Vec<(String, String)>>> {
    if split == "test_concat" {
        return Ok(Some(
            nmt_train::corpus::read_concat(corpus)?
                .into_iter()
                .map(|e| (e.en, e.es))
                .collect(),
        ));
    }
    if !corpus.join(format!("{split}.en")).is_file() {
        return Ok(None);
    }
    nmt_train::corpus::read_parallel(corpus, split).map(Some)
}

fn evaluate(split: &Tokenized, predicted: &[f64], line: &LinearFit) -> HeadEvaluation {
    let references: Vec<f64> = split.targets.iter().map(|&t| f64::from(t)).collect();
    let sources: Vec<f64> = split.sources.iter().map(|s| (s.len() - 1) as f64).collect();
    let fitted: Vec<f64> = split
        .sources
        .iter()
        .map(|s| line.predict(s.len() - 1))
        .collect();
    HeadEvaluation {
        predictor: Measures::of(predicted, &references),
        source_length: Measures::of(&sources, &references),
        linear_fit: Measures::of(&fitted, &references),
        mean_reference_length: references.iter().sum::<f64>() / references.len().max(1) as f64,
    }
}

/// Fits the head, writes its graph (the encoder's with the head added, or a table of its own)
/// and records it in the manifest.
pub fn export_length_head(
    package: &Path,
    features: HeadFeatures,
    args: &LengthHeadArgs,
) -> anyhow::Result<LengthPrediction> {
    let mut manifest = Manifest::load(package)?;
    ensure!(
        manifest.precision == Precision::Float32,
        "{} is {:?}: fit the head on the float32 package, then quantize it",
        package.display(),
        manifest.precision
    );
    let tokenizers = Tokenizers::load(package, &manifest)?;

    let all = nmt_train::corpus::read_parallel(&args.corpus, "train")?;
    let (linear_fit, chars_per_target_subword) =
        nmt_train::length::fit_line(&all, &tokenizers.source)?;
    let mut order: Vec<usize> = (0..all.len()).collect();
    order.shuffle(&mut SmallRng::seed_from_u64(args.seed));
    if args.train_limit > 0 {
        order.truncate(args.train_limit);
    }
    let train = tokenizers.tokenize(order.iter().map(|&i| &all[i]))?;
    let mut splits = BTreeMap::new();
    for split in SPLITS {
        if let Some(pairs) = split_pairs(&args.corpus, split)? {
            splits.insert(split, tokenizers.tokenize(&pairs)?);
        }
    }

    let work = Work {
        train: &train,
        splits: splits
            .iter()
            .map(|(&name, s)| (name, s.sources.as_slice()))
            .collect(),
    };
    let dir = tempfile::tempdir()?;
    let work_path = dir.path().join("work.json");
    std::fs::write(&work_path, serde_json::to_vec(&work)?)?;
    let encoder = package.join(files::ENCODER);
    let graph = match features {
        HeadFeatures::States => files::ENCODER,
        HeadFeatures::Subwords => GRAPH,
    };
    let written = dir.path().join(graph);
    let ridge = args.ridge.unwrap_or(features.default_ridge()).to_string();
    let threads = args.threads.to_string();
    let vocab_size = manifest.config.vocab_size.to_string();
    let script_args: [&OsStr; 11] = [
        encoder.as_os_str(),
        written.as_os_str(),
        work_path.as_os_str(),
        "--features".as_ref(),
        features.name().as_ref(),
        "--vocab-size".as_ref(),
        vocab_size.as_ref(),
        "--ridge".as_ref(),
        ridge.as_ref(),
        "--threads".as_ref(),
        threads.as_ref(),
    ];
    let report: ScriptReport = args
        .python
        .run_json(SCRIPT, &script_args)
        .context("fitting the length head")?;

    let mut evaluation = BTreeMap::new();
    for (name, split) in &splits {
        let predicted = report
            .predictions
            .get(*name)
            .with_context(|| format!("the script returned no predictions for {name}"))?;
        evaluation.insert(*name, evaluate(split, predicted, &linear_fit));
    }
    let target = package.join(graph);
    std::fs::copy(&written, &target).with_context(|| format!("writing {}", target.display()))?;

    let training = serde_json::json!({
        "tool": format!(
            "nmt-export length-predictor --head {} (model-export/python/length_head.py)",
            features.name()
        ),
        "head": report.head,
        "fitted_on": report.fitted_on,
        "corpus": args.corpus,
        "train_limit": args.train_limit,
        "seed": args.seed,
        "graph_minus_numpy_max": report.graph_minus_numpy_max,
        "graph_seconds_per_source": report.graph_seconds_per_source,
    });
    let prediction = LengthPrediction {
        linear_fit,
        prediction_pull: args.prediction_pull,
        chars_per_target_subword: Some(chars_per_target_subword),
        predictor: Some(LengthPredictorSpec {
            graph: graph.into(),
            computes: match features {
                HeadFeatures::States => PredictorGraph::Encoder,
                HeadFeatures::Subwords => PredictorGraph::SubwordTable,
            },
            tokenizer: files::TOKENIZER.into(),
            max_input_tokens: HEAD_MAX_INPUT_TOKENS,
            external_files: Vec::new(),
            training,
            evaluation: serde_json::to_value(&evaluation)?,
        }),
    };
    manifest.length_prediction = Some(prediction.clone());
    manifest.write(package, &[graph])?;
    Ok(prediction)
}
