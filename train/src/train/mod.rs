//! The training loop: label-smoothed cross-entropy, Adam with warm-up, dropout, token-count
//! batches, gradient clipping, periodic dev loss, checkpoints that resume exactly.
//!
//! A run directory holds `last/` (written every `--save-every` steps and at the end) and
//! `best/` (lowest dev loss so far); each is a checkpoint (see [`checkpoint`]).

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, ensure, Context};
use candle_core::{DType, Device, Tensor, Var};
use candle_nn::{VarBuilder, VarMap};
use indicatif::{ProgressBar, ProgressStyle};
use model_package::{placeholders, ModelConfig};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::model::{Dropout, Model, Seq2Seq};
use crate::ops::cross_entropy::label_smoothed_loss;
use batch::{token_batches, Batch, Example};
use checkpoint::TrainerState;
use optim::{learning_rate, Adam};

pub mod batch;
pub mod checkpoint;
pub mod optim;
pub mod pairs;

/// Without a progress bar (`--quiet`), a status line every this many steps.
const QUIET_LOG_EVERY: usize = 50;

#[derive(clap::Args, Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct TrainArgs {
    /// Corpus directory written by `nmt-train corpus` (reads train.* and dev.*).
    #[arg(long, default_value = "data/corpus")]
    pub corpus: PathBuf,
    /// Tokenizer written by `nmt-train tokenizer`.
    #[arg(long, default_value = "data/tokenizer.json")]
    pub tokenizer: PathBuf,
    /// Model preset: transformer, transformer-learned, rel-transformer, rel-keys,
    /// rel-sinusoidal, rel-absolute, rnn-transformer, rr-transformer, lstm-pe, rpe-head,
    /// mpr-head, rnn-nmt, or a length-aware decoder: ldpe, ldpe-noise2, ldpe-noise4, lrpe,
    /// lrpe-noise2, lrpe-noise4, rel-ldpe (docs/model-package.md, "Variants"); each also as
    /// `<name>-small` (d_model 128, for studies of many models) and `<name>-tiny` (d_model 32,
    /// for tests).
    #[arg(long, default_value = "transformer")]
    pub preset: String,
    /// Run directory: checkpoints go to OUT/last and OUT/best.
    #[arg(long)]
    pub out: PathBuf,
    /// Continue from OUT/last (weights, optimizer moments, position in the epoch).
    #[arg(long)]
    pub resume: bool,
    /// Upper bound on padded tokens (rows x longest side) per batch.
    #[arg(long, default_value_t = 4096)]
    pub batch_tokens: usize,
    /// Peak learning rate, reached at the end of warm-up.
    #[arg(long, default_value_t = 7e-4)]
    pub lr: f64,
    /// Linear warm-up steps before the 1/sqrt(step) decay.
    #[arg(long, default_value_t = 2000)]
    pub warmup_steps: usize,
    /// Label smoothing epsilon.
    #[arg(long, default_value_t = 0.1)]
    pub label_smoothing: f64,
    /// Clip gradients to this global L2 norm.
    #[arg(long, default_value_t = 1.0)]
    pub clip_norm: f64,
    /// Override the preset's dropout.
    #[arg(long)]
    pub dropout: Option<f32>,
    /// Stop after this many optimizer steps (in total, counting resumed ones).
    #[arg(long)]
    pub max_steps: Option<usize>,
    /// Stop after this many passes over the training data.
    #[arg(long, default_value_t = 1000)]
    pub max_epochs: usize,
    /// Stop after this many minutes of training in this invocation.
    #[arg(long)]
    pub max_minutes: Option<f64>,
    /// Compute dev loss (and update OUT/best) every N steps.
    #[arg(long, default_value_t = 500)]
    pub eval_every: usize,
    /// Write OUT/last every N steps.
    #[arg(long, default_value_t = 500)]
    pub save_every: usize,
    /// Keep the weights every N steps in OUT/snapshots/step-N (for `nmt-train average`);
    /// 0 keeps none.
    #[arg(long, default_value_t = 1000)]
    pub snapshot_every: usize,
    /// How many of the newest snapshots to keep.
    #[arg(long, default_value_t = 5)]
    pub keep_snapshots: usize,
    /// Drop training pairs with a side longer than this many subwords.
    #[arg(long, default_value_t = 128)]
    pub max_len: usize,
    /// Train only on pairs whose source has at least this many subwords (EOS not counted):
    /// with `--max-source-len`, a length band of the data, as in Neishi & Yoshinaga's
    /// experiment of training on the short, middle or long third. The dev loss keeps every
    /// dev pair.
    #[arg(long)]
    #[serde(default)]
    pub min_source_len: Option<usize>,
    /// Train only on pairs whose source has at most this many subwords (EOS not counted), to
    /// test a model on inputs longer than any it saw. Unlike `--max-len`, which bounds both
    /// sides to bound memory, it filters by the source alone and applies after the joined
    /// examples are made.
    #[arg(long)]
    #[serde(default)]
    pub max_source_len: Option<usize>,
    /// Use only the first N training pairs (tests, quick experiments).
    #[arg(long)]
    pub train_limit: Option<usize>,
    /// Add this fraction (of the training pairs) of long examples, each 2 to
    /// `--joined-max-verses` training pairs joined into one (sources and targets joined
    /// alike), so the model sees inputs longer than one verse. Pairs two lines apart are
    /// joined: the corpus alternates its two English versions, so these are consecutive
    /// verses of one version. Raise `--max-len` with it, or the joined pairs are dropped.
    #[arg(long, default_value_t = 0.0)]
    #[serde(default)]
    pub joined_fraction: f64,
    /// The most training pairs one long example joins (at least 2); the count is uniform
    /// in 2..=this. Inputs longer than any seen in training are where a model loses its
    /// place in the source, so this should reach the longest inputs it will be asked.
    #[arg(long, default_value_t = DEFAULT_JOINED_MAX_VERSES, value_parser = clap::value_parser!(u32).range(2..))]
    #[serde(default = "default_joined_max_verses")]
    pub joined_max_verses: u32,
    /// Mask this fraction of the training pairs that carry placeholders, numbers, URLs or
    /// markup on both sides (the same spans, see `model_package::placeholders`): each span
    /// becomes a sentinel `｟k｠` in the source and the target alike, so the model learns to
    /// copy sentinels, which the server puts back. The rest stay as they are, so the model
    /// also copies placeholders it is shown raw. Chosen per pair from `--seed`.
    #[arg(long, default_value_t = 0.0)]
    #[serde(default)]
    pub mask_fraction: f64,
    /// The splits of the corpus the dev loss is computed on (each cut to `--dev-limit`),
    /// e.g. `dev,l10n-dev` for the Bible and the held-out catalogs.
    #[arg(long, value_delimiter = ',', default_value = "dev")]
    #[serde(default = "default_dev_splits")]
    pub dev_splits: Vec<String>,
    /// Start a new run (fresh optimizer, step 0) from the weights of this checkpoint
    /// directory instead of random ones: fine-tuning with other data or a decoder that reads
    /// the same weights differently (e.g. `rel-transformer` weights into `rel-ldpe`, whose
    /// length encoding has no parameters).
    #[arg(long, conflicts_with = "resume")]
    #[serde(default)]
    pub init_from: Option<PathBuf>,
    /// Use only the first N dev pairs for the dev loss.
    #[arg(long, default_value_t = 1000)]
    pub dev_limit: usize,
    /// Repeat the training pairs whose provenance (`train.origin`) starts with PREFIX this
    /// many times in all, e.g. `bible/=2`: a small domain is otherwise outweighed by a large
    /// one (the Bible is a fifth of the catalogs-plus-Bible corpus by characters). Applied
    /// before joining and masking, so each copy is masked on its own. Repeatable.
    #[arg(long = "oversample", value_name = "PREFIX=TIMES")]
    #[serde(default)]
    pub oversample: Vec<Oversample>,
    /// Seed for initialisation, dropout and batch order.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Hide the progress bar (logs a line per evaluation instead).
    #[arg(long)]
    pub quiet: bool,
}

impl TrainArgs {
    /// Whether a source of `subwords` (EOS not counted) is within the training band.
    pub fn keeps_source_length(&self, subwords: usize) -> bool {
        self.min_source_len.is_none_or(|min| subwords >= min)
            && self.max_source_len.is_none_or(|max| subwords <= max)
    }
}

/// What a finished run reports.
#[derive(Debug, Clone, serde::Serialize)]
pub struct TrainReport {
    pub state: TrainerState,
    /// Target tokens per second over this invocation.
    pub target_tokens_per_second: f64,
    pub source_tokens_per_second: f64,
    pub parameters: usize,
}

pub fn run(args: TrainArgs) -> anyhow::Result<()> {
    let report = train(&args)?;
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}

/// `--oversample PREFIX=TIMES`: the pairs whose origin starts with `prefix` appear `times`
/// times in the training set.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Oversample {
    pub prefix: String,
    pub times: usize,
}

impl std::str::FromStr for Oversample {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (prefix, times) = s
            .rsplit_once('=')
            .ok_or_else(|| format!("expected PREFIX=TIMES, got {s:?}"))?;
        let times: usize = times.parse().map_err(|e| format!("TIMES in {s:?}: {e}"))?;
        if prefix.is_empty() || times == 0 {
            return Err(format!(
                "expected a non-empty PREFIX and TIMES >= 1, got {s:?}"
            ));
        }
        Ok(Self {
            prefix: prefix.to_owned(),
            times,
        })
    }
}

/// Appends, for each rule, `times - 1` more copies of the pairs whose origin starts with its
/// prefix, in corpus order (so `joined_pairs`, which joins lines two apart, still joins
/// consecutive verses of one version inside a copy). Returns how many pairs were added.
pub fn oversample(
    pairs: &mut Vec<(String, String)>,
    origins: &[String],
    rules: &[Oversample],
) -> usize {
    let before = pairs.len();
    for rule in rules {
        let chosen: Vec<(String, String)> = pairs[..origins.len().min(before)]
            .iter()
            .zip(origins)
            .filter(|(_, origin)| origin.starts_with(&rule.prefix))
            .map(|(pair, _)| pair.clone())
            .collect();
        for _ in 1..rule.times {
            pairs.extend(chosen.iter().cloned());
        }
    }
    pairs.len() - before
}

/// What runs before `--joined-max-verses` existed joined.
pub const DEFAULT_JOINED_MAX_VERSES: u32 = 4;

fn default_joined_max_verses() -> u32 {
    DEFAULT_JOINED_MAX_VERSES
}

fn default_dev_splits() -> Vec<String> {
    vec!["dev".into()]
}

/// Masks `fraction` of the pairs that [`placeholders::mask_pair`] can mask, chosen by a
/// hash of (`seed`, index): the same pairs on every resume.
pub fn mask_pairs(pairs: &mut [(String, String)], fraction: f64, seed: u64) -> usize {
    if fraction <= 0.0 {
        return 0;
    }
    let mut masked = 0;
    for (i, pair) in pairs.iter_mut().enumerate() {
        if let Some(masked_pair) = masked_variant(i, pair, fraction, seed) {
            *pair = masked_pair;
            masked += 1;
        }
    }
    masked
}

/// The masked form of the pair at `index` if [`mask_pairs`] masks it: drawn with
/// probability `fraction` from (`seed`, `index`), and only where the two sides carry the
/// same spans.
pub fn masked_variant(
    index: usize,
    pair: &(String, String),
    fraction: f64,
    seed: u64,
) -> Option<(String, String)> {
    let mut rng = SmallRng::seed_from_u64(seed ^ 0xBB67_AE85_84CA_A73B ^ (index as u64) << 1);
    if fraction <= 0.0 || rng.gen::<f64>() >= fraction {
        return None;
    }
    placeholders::mask_pair(&pair.0, &pair.1)
}

/// `round(fraction * n)` long pairs, each 2 to `max_verses` of `pairs` two lines apart joined
/// with a space, drawn from `seed` (the same on every resume).
pub fn joined_pairs(
    pairs: &[(String, String)],
    fraction: f64,
    max_verses: u32,
    seed: u64,
) -> Vec<(String, String)> {
    let count = (fraction * pairs.len() as f64).round() as usize;
    let mut rng = SmallRng::seed_from_u64(seed ^ 0x6A09_E667_F3BC_C908);
    (0..count)
        .filter_map(|_| {
            let parts = rng.gen_range(2..=max_verses.max(2) as usize);
            let span = 2 * (parts - 1);
            if pairs.len() <= span {
                return None;
            }
            let start = rng.gen_range(0..pairs.len() - span);
            let chosen = (0..parts).map(|i| &pairs[start + 2 * i]);
            let (en, es): (Vec<&str>, Vec<&str>) =
                chosen.map(|(en, es)| (en.as_str(), es.as_str())).unzip();
            Some((en.join(" "), es.join(" ")))
        })
        .collect()
}

/// Tokenizes a split into examples, dropping pairs longer than `max_len` subwords.
pub fn encode_pairs(
    tokenizer: &tokenizers::Tokenizer,
    pairs: &[(String, String)],
    max_len: usize,
) -> anyhow::Result<Vec<Example>> {
    let encode = |text: &str| -> anyhow::Result<Vec<u32>> {
        Ok(tokenizer
            .encode(text, false)
            .map_err(|e| anyhow::anyhow!("tokenizing {text:?}: {e}"))?
            .get_ids()
            .to_vec())
    };
    let mut examples = Vec::with_capacity(pairs.len());
    for (src, tgt) in pairs {
        let example = Example::new(encode(src)?, encode(tgt)?);
        if example.source.len() <= max_len && example.target_len() <= max_len {
            examples.push(example);
        }
    }
    Ok(examples)
}

/// Deterministic initialisation from `seed` (candle's CPU generator cannot be seeded):
/// embeddings N(0, d^-1/2), matrices Xavier-uniform, biases 0, norm gains 1.
fn initialise(varmap: &VarMap, d_model: usize, seed: u64) -> anyhow::Result<()> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let data = varmap.data().lock().unwrap();
    let mut names: Vec<&String> = data.keys().collect();
    names.sort();
    for name in names {
        let var = &data[name];
        let dims = var.dims().to_vec();
        let n: usize = dims.iter().product();
        let values: Vec<f32> = if name == "embed.weight" {
            let std = (d_model as f64).powf(-0.5);
            (0..n)
                .map(|_| (standard_normal(&mut rng) * std) as f32)
                .collect()
        } else if dims.len() == 2 {
            let bound = (6.0 / (dims[0] + dims[1]) as f64).sqrt();
            (0..n)
                .map(|_| rng.gen_range(-bound..bound) as f32)
                .collect()
        } else if name.ends_with("norm.weight") {
            vec![1.0; n]
        } else {
            vec![0.0; n]
        };
        var.set(&Tensor::from_vec(values, dims, var.device())?)?;
    }
    Ok(())
}

fn standard_normal(rng: &mut impl Rng) -> f64 {
    // Box-Muller; `1 - u` keeps the logarithm finite.
    let u: f64 = rng.gen();
    let v: f64 = rng.gen();
    (-2.0 * (1.0 - u).ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
}

fn named_vars(varmap: &VarMap) -> Vec<(String, Var)> {
    let data = varmap.data().lock().unwrap();
    data.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
}

/// Mean per-token NLL on `examples` without dropout.
pub fn dev_loss(
    model: &Model,
    examples: &[Example],
    batch_tokens: usize,
    device: &Device,
) -> anyhow::Result<f64> {
    let mut rng = SmallRng::seed_from_u64(0);
    let off = Dropout::off();
    let (mut nll, mut tokens) = (0f64, 0usize);
    for indices in token_batches(examples, batch_tokens, &mut rng) {
        let rows: Vec<&Example> = indices.iter().map(|&i| &examples[i]).collect();
        let batch = Batch::new(&rows, device)?;
        let logits = model.forward(
            &batch.source_ids,
            &batch.source_mask,
            &batch.decoder_input,
            Some(&batch.target_lengths),
            &off,
        )?;
        let (_, sum) =
            label_smoothed_loss(&logits, &batch.decoder_output, &batch.target_mask, 0.0)?;
        nll += sum;
        tokens += batch.target_tokens;
    }
    Ok(nll / tokens.max(1) as f64)
}

/// A checkpoint; without `adam` (snapshots) it can be exported and averaged, not resumed.
fn save(
    dir: &Path,
    config: &ModelConfig,
    varmap: &VarMap,
    adam: Option<&Adam>,
    state: &TrainerState,
) -> anyhow::Result<()> {
    checkpoint::write_atomically(dir, |tmp| {
        varmap.save(tmp.join(checkpoint::WEIGHTS_FILE))?;
        if let Some(adam) = adam {
            adam.save(&tmp.join(checkpoint::OPTIMIZER_FILE))?;
        }
        std::fs::write(
            tmp.join(checkpoint::CONFIG_FILE),
            serde_json::to_string_pretty(config)?,
        )?;
        std::fs::write(
            tmp.join(checkpoint::STATE_FILE),
            serde_json::to_string_pretty(state)?,
        )?;
        Ok(())
    })
}

/// Writes `OUT/snapshots/step-N` and deletes all but the newest `keep`.
fn snapshot(
    out: &Path,
    config: &ModelConfig,
    varmap: &VarMap,
    state: &TrainerState,
    keep: usize,
) -> anyhow::Result<()> {
    let dir = out.join("snapshots");
    save(
        &dir.join(format!("step-{:07}", state.step)),
        config,
        varmap,
        None,
        state,
    )?;
    let mut snapshots: Vec<PathBuf> = std::fs::read_dir(&dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("step-"))
        })
        .filter(|p| p.extension().is_none())
        .collect();
    snapshots.sort();
    for old in &snapshots[..snapshots.len().saturating_sub(keep)] {
        std::fs::remove_dir_all(old)?;
    }
    Ok(())
}

pub fn train(args: &TrainArgs) -> anyhow::Result<TrainReport> {
    let device = Device::Cpu;
    let tokenizer = tokenizers::Tokenizer::from_file(&args.tokenizer)
        .map_err(|e| anyhow::anyhow!("loading tokenizer {}: {e}", args.tokenizer.display()))?;
    let mut train_pairs = crate::corpus::read_parallel(&args.corpus, "train")?;
    if let Some(limit) = args.train_limit {
        train_pairs.truncate(limit);
    }
    if !args.oversample.is_empty() {
        let origins = crate::corpus::read_origins(&args.corpus, "train")?;
        let added = oversample(&mut train_pairs, &origins, &args.oversample);
        ensure!(
            added > 0 || args.oversample.iter().all(|r| r.times == 1),
            "--oversample matched no training pair (prefixes are matched against train.origin)"
        );
        if !args.quiet {
            eprintln!("train: {added} training pairs added by --oversample");
        }
    }
    let joined = joined_pairs(
        &train_pairs,
        args.joined_fraction,
        args.joined_max_verses,
        args.seed,
    );
    train_pairs.extend(joined);
    let masked = mask_pairs(&mut train_pairs, args.mask_fraction, args.seed);
    if args.mask_fraction > 0.0 && !args.quiet {
        eprintln!("train: {masked} training pairs masked with placeholder sentinels");
    }
    let mut dev_pairs = Vec::new();
    for split in &args.dev_splits {
        let mut pairs = crate::corpus::read_parallel(&args.corpus, split)?;
        pairs.truncate(args.dev_limit);
        dev_pairs.extend(pairs);
    }
    let mut train_set = encode_pairs(&tokenizer, &train_pairs, args.max_len)?;
    train_set.retain(|e| args.keeps_source_length(e.source.len() - 1));
    let dev_set = encode_pairs(&tokenizer, &dev_pairs, args.max_len)?;
    if train_set.is_empty() {
        bail!(
            "no training pairs within --max-len {} and the source-length band {:?}..={:?}",
            args.max_len,
            args.min_source_len,
            args.max_source_len
        );
    }

    let last_dir = args.out.join("last");
    let best_dir = args.out.join("best");
    checkpoint::recover(&last_dir)?;
    let resuming = args.resume && last_dir.join(checkpoint::STATE_FILE).exists();
    let config = if resuming {
        checkpoint::load_config(&last_dir)?
    } else {
        let mut config = ModelConfig::preset(&args.preset, tokenizer.get_vocab_size(true))?;
        if let Some(p) = args.dropout {
            config.dropout = p;
        }
        config.validate()?;
        config
    };
    let mut varmap = VarMap::new();
    let model = Model::new(
        config.clone(),
        VarBuilder::from_varmap(&varmap, DType::F32, &device),
    )?;
    let parameters: usize = named_vars(&varmap)
        .iter()
        .map(|(_, v)| v.elem_count())
        .sum();
    let mut adam = Adam::new(named_vars(&varmap))?;
    let mut state = if resuming {
        let state = checkpoint::load_state(&last_dir)?;
        varmap.load(last_dir.join(checkpoint::WEIGHTS_FILE))?;
        adam.load(
            &last_dir.join(checkpoint::OPTIMIZER_FILE),
            state.step,
            &device,
        )?;
        state
    } else {
        match &args.init_from {
            Some(dir) => varmap
                .load(dir.join(checkpoint::WEIGHTS_FILE))
                .with_context(|| format!("--init-from {}", dir.display()))?,
            None => initialise(&varmap, config.d_model, args.seed)?,
        }
        TrainerState {
            seed: args.seed,
            corpus: args.corpus.display().to_string(),
            tokenizer: args.tokenizer.display().to_string(),
            ..Default::default()
        }
    };
    if resuming && state.train_pairs != train_set.len() && state.batch_in_epoch > 0 {
        // The saved position indexes batches of another training set (other data, other
        // --oversample): replaying it would skip an arbitrary part of the new one, so the
        // run goes on at the next epoch, keeping its step, schedule and optimizer moments.
        eprintln!(
            "train: the training set changed ({} pairs, was {}): resuming at the start of epoch {}",
            train_set.len(),
            state.train_pairs,
            state.epoch + 1
        );
        state.epoch += 1;
        state.batch_in_epoch = 0;
    }
    state.train_pairs = train_set.len();
    state.args = serde_json::to_value(args)?;

    let bar = if args.quiet {
        ProgressBar::hidden()
    } else {
        let bar = ProgressBar::new(args.max_steps.map_or(0, |m| m as u64));
        bar.set_style(ProgressStyle::with_template(
            "{elapsed_precise} step {pos}/{len} {wide_bar} {msg}",
        )?);
        bar.set_position(state.step as u64);
        bar
    };
    let started = Instant::now();
    let seconds_before = state.train_seconds;
    let (mut run_src_tokens, mut run_tgt_tokens) = (0u64, 0u64);
    let out_of_time = |started: &Instant| {
        args.max_minutes
            .is_some_and(|m| started.elapsed().as_secs_f64() > m * 60.0)
    };
    let mut last_eval_step = state.step;
    'epochs: while state.epoch < args.max_epochs {
        // The batch order of an epoch depends only on (seed, epoch): resume replays it and
        // skips what was already consumed.
        let mut epoch_rng =
            SmallRng::seed_from_u64(state.seed ^ (state.epoch as u64).wrapping_mul(0x9E37_79B9));
        let batches = token_batches(&train_set, args.batch_tokens, &mut epoch_rng);
        while state.batch_in_epoch < batches.len() {
            if args.max_steps.is_some_and(|m| state.step >= m) || out_of_time(&started) {
                break 'epochs;
            }
            let rows: Vec<&Example> = batches[state.batch_in_epoch]
                .iter()
                .map(|&i| &train_set[i])
                .collect();
            let mut batch = Batch::new(&rows, &device)?;
            // Drawn from (seed, step) like the dropout masks, so a resumed run replays.
            let mut noise_rng = SmallRng::seed_from_u64(
                state.seed ^ (state.step as u64).wrapping_mul(0xD1B5_4A32_D192_ED03),
            );
            batch.add_length_noise(config.length_noise, &mut noise_rng)?;
            let dropout = Dropout::new(config.dropout, state.seed.wrapping_add(state.step as u64));
            let logits = model.forward(
                &batch.source_ids,
                &batch.source_mask,
                &batch.decoder_input,
                Some(&batch.target_lengths),
                &dropout,
            )?;
            let (loss, nll_sum) = label_smoothed_loss(
                &logits,
                &batch.decoder_output,
                &batch.target_mask,
                args.label_smoothing,
            )?;
            let grads = loss.backward()?;
            let lr = learning_rate(state.step + 1, args.lr, args.warmup_steps);
            let grad_norm = adam.step(&grads, lr, args.clip_norm)?;
            state.step += 1;
            state.batch_in_epoch += 1;
            state.source_tokens_seen += batch.source_tokens as u64;
            state.target_tokens_seen += batch.target_tokens as u64;
            run_src_tokens += batch.source_tokens as u64;
            run_tgt_tokens += batch.target_tokens as u64;
            let elapsed = started.elapsed().as_secs_f64();
            bar.set_position(state.step as u64);
            let status = format!(
                "epoch {} nll {:.3} |g| {:.2} lr {:.1e} {:.0} tgt tok/s dev {}",
                state.epoch,
                nll_sum / batch.target_tokens as f64,
                grad_norm,
                lr,
                run_tgt_tokens as f64 / elapsed,
                state
                    .last_dev_loss
                    .map_or("-".into(), |l| format!("{l:.3}")),
            );
            if bar.is_hidden() && state.step % QUIET_LOG_EVERY == 0 {
                eprintln!("step {} {status}", state.step);
            }
            bar.set_message(status);
            if state.step % args.eval_every == 0 {
                evaluate(
                    &model, &dev_set, args, &device, &mut state, &config, &varmap, &adam,
                    &best_dir, &bar,
                )?;
                last_eval_step = state.step;
            }
            if state.step % args.save_every == 0 {
                state.train_seconds = seconds_before + started.elapsed().as_secs_f64();
                save(&last_dir, &config, &varmap, Some(&adam), &state)?;
            }
            if args.snapshot_every > 0 && state.step % args.snapshot_every == 0 {
                snapshot(&args.out, &config, &varmap, &state, args.keep_snapshots)?;
            }
        }
        state.epoch += 1;
        state.batch_in_epoch = 0;
    }
    if state.step != last_eval_step || !best_dir.exists() {
        evaluate(
            &model, &dev_set, args, &device, &mut state, &config, &varmap, &adam, &best_dir, &bar,
        )?;
    }
    let elapsed = started.elapsed().as_secs_f64();
    state.train_seconds = seconds_before + elapsed;
    save(&last_dir, &config, &varmap, Some(&adam), &state)?;
    bar.finish();
    Ok(TrainReport {
        state,
        target_tokens_per_second: run_tgt_tokens as f64 / elapsed,
        source_tokens_per_second: run_src_tokens as f64 / elapsed,
        parameters,
    })
}

#[allow(clippy::too_many_arguments)]
fn evaluate(
    model: &Model,
    dev_set: &[Example],
    args: &TrainArgs,
    device: &Device,
    state: &mut TrainerState,
    config: &ModelConfig,
    varmap: &VarMap,
    adam: &Adam,
    best_dir: &Path,
    bar: &ProgressBar,
) -> anyhow::Result<()> {
    if dev_set.is_empty() {
        return Ok(());
    }
    let loss = dev_loss(model, dev_set, args.batch_tokens, device).context("dev loss")?;
    state.last_dev_loss = Some(loss);
    if state.best_dev_loss.is_none_or(|best| loss < best) {
        state.best_dev_loss = Some(loss);
        save(best_dir, config, varmap, Some(adam), state)?;
    }
    if args.quiet || bar.is_hidden() {
        eprintln!(
            "step {} epoch {} dev nll {loss:.4}",
            state.step, state.epoch
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Args;

    #[test]
    fn oversample_repeats_only_the_named_origins_in_order() {
        let mut pairs: Vec<(String, String)> = (0..5)
            .map(|i| (format!("en{i}"), format!("es{i}")))
            .collect();
        let origins: Vec<String> = ["bible/a", "debian/x", "bible/b", "debian/y", "bible/a"]
            .map(String::from)
            .to_vec();
        let rule: Oversample = "bible/=3".parse().unwrap();
        assert_eq!(oversample(&mut pairs, &origins, &[rule]), 6);
        let added: Vec<&str> = pairs[5..].iter().map(|p| p.0.as_str()).collect();
        assert_eq!(added, ["en0", "en2", "en4", "en0", "en2", "en4"]);
        let once: Oversample = "debian/=1".parse().unwrap();
        assert_eq!(oversample(&mut pairs, &origins, &[once]), 0);
        for bad in ["bible", "=2", "bible/=0", "bible/=x"] {
            assert!(bad.parse::<Oversample>().is_err(), "{bad}");
        }
    }

    #[test]
    fn the_pairs_file_masks_what_training_masks() {
        let pairs: Vec<(String, String)> = (0..200)
            .map(|i| {
                (
                    format!("Open %s in {i} ways"),
                    format!("Abrir %s de {i} maneras"),
                )
            })
            .collect();
        let mut trained = pairs.clone();
        let count = mask_pairs(&mut trained, 0.5, 9);
        assert!(count > 60 && count < 140, "{count}");
        for (i, (pair, trained)) in pairs.iter().zip(&trained).enumerate() {
            let written = masked_variant(i, pair, 0.5, 9);
            assert_eq!(written.as_ref().unwrap_or(pair), trained, "pair {i}");
        }
        assert!(masked_variant(3, &pairs[3], 0.0, 9).is_none());
    }

    #[test]
    fn joined_pairs_join_aligned_pairs_two_lines_apart() {
        let pairs: Vec<(String, String)> = (0..40)
            .map(|i| (format!("e{i}"), format!("s{i}")))
            .collect();
        let joined = joined_pairs(&pairs, 0.5, 4, 7);
        assert_eq!(joined.len(), 20);
        assert_eq!(joined, joined_pairs(&pairs, 0.5, 4, 7), "seeded");
        for (en, es) in &joined {
            let en: Vec<usize> = en.split(' ').map(|w| w[1..].parse().unwrap()).collect();
            let es: Vec<usize> = es.split(' ').map(|w| w[1..].parse().unwrap()).collect();
            assert_eq!(en, es, "sources and targets joined alike");
            assert!((2..=4).contains(&en.len()), "{en:?}");
            assert!(en.windows(2).all(|w| w[1] == w[0] + 2), "{en:?}");
        }
        assert!(joined_pairs(&pairs, 0.0, 4, 7).is_empty());
        let longest = joined_pairs(&pairs, 0.5, 8, 7)
            .iter()
            .map(|(en, _)| en.split(' ').count())
            .max();
        assert_eq!(longest, Some(8), "--joined-max-verses reaches its bound");
    }

    #[test]
    fn preset_help_names_every_preset() {
        let command = TrainArgs::augment_args(clap::Command::new("train"));
        let help = command
            .get_arguments()
            .find(|a| a.get_id() == "preset")
            .and_then(|a| a.get_help())
            .map(|h| h.to_string())
            .unwrap();
        for name in ModelConfig::PRESETS {
            assert!(help.contains(name), "--preset help lacks {name}: {help}");
        }
    }

    #[test]
    fn the_source_length_band_keeps_what_it_names() {
        use clap::FromArgMatches;
        let parse = |flags: &[&str]| {
            let command = TrainArgs::augment_args(clap::Command::new("train"));
            let matches = command
                .try_get_matches_from(["train", "--out", "x"].iter().chain(flags))
                .unwrap();
            TrainArgs::from_arg_matches(&matches).unwrap()
        };
        let all = parse(&[]);
        assert!(all.keeps_source_length(1) && all.keeps_source_length(500));
        let short = parse(&["--max-source-len", "32"]);
        assert!(short.keeps_source_length(32) && !short.keeps_source_length(33));
        let middle = parse(&["--min-source-len", "20", "--max-source-len", "40"]);
        let kept: Vec<usize> = (0..60).filter(|&n| middle.keeps_source_length(n)).collect();
        assert_eq!(kept, (20..=40).collect::<Vec<_>>());
    }
}
