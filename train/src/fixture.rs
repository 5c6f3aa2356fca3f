//! A real pipeline run in seconds, for the tests of every crate: a corpus of a few real
//! books (dev and test books held out as always), a small Unigram tokenizer, and a tiny
//! Transformer trained for a few hundred steps.

use std::path::{Path, PathBuf};

use crate::corpus::{self, CorpusArgs};
use crate::train::{self as trainer, TrainArgs, TrainReport};

pub struct TinyRun {
    pub corpus: PathBuf,
    pub tokenizer: PathBuf,
    /// The best checkpoint (lowest dev loss).
    pub checkpoint: PathBuf,
    pub report: TrainReport,
}

/// Training books of the tiny corpus: short, plain narrative.
pub const TINY_BOOKS: [&str; 2] = ["Ruth", "Jonah"];
/// 4 special tokens, 32 placeholder sentinels and 256 byte pieces, and about 390 learnt
/// pieces, of which the digits and ASCII symbols the tokenizer always keeps take ~50 the
/// Bible books never use: the ~340 useful pieces the tiny models were tuned with.
pub const TINY_VOCAB: usize = 680;

/// Builds the tiny corpus and tokenizer under `dir` and trains `preset` for `steps` steps.
pub fn tiny_run_with(dir: &Path, preset: &str, steps: usize) -> anyhow::Result<TinyRun> {
    let corpus_dir = dir.join("corpus");
    corpus::run(CorpusArgs {
        out: corpus_dir.clone(),
        books: TINY_BOOKS.iter().map(|b| b.to_string()).collect(),
        concat_sizes: vec![2, 4],
        tokenizer: None,
        diatheke: PathBuf::from("diatheke"),
        jobs: 0,
        catalogs: None,
        catalog_cache: PathBuf::from("data/debian-cache"),
    })?;
    let train = corpus::read_parallel(&corpus_dir, "train")?;
    let texts: Vec<String> = train
        .iter()
        .flat_map(|(en, es)| [en.clone(), es.clone()])
        .collect();
    let tokenizer = crate::tokenizer::train_tokenizer(&texts, TINY_VOCAB)?;
    let tokenizer_path = dir.join("tokenizer.json");
    tokenizer
        .save(&tokenizer_path, false)
        .map_err(|e| anyhow::anyhow!("writing {}: {e}", tokenizer_path.display()))?;
    let out = dir.join("run");
    let report = trainer::train(&TrainArgs {
        corpus: corpus_dir.clone(),
        tokenizer: tokenizer_path.clone(),
        preset: preset.to_string(),
        out: out.clone(),
        resume: false,
        batch_tokens: 1024,
        lr: 3e-3,
        warmup_steps: 50,
        label_smoothing: 0.1,
        clip_norm: 1.0,
        dropout: None,
        max_steps: Some(steps),
        max_epochs: 1000,
        max_minutes: None,
        eval_every: steps,
        save_every: steps,
        snapshot_every: 0,
        keep_snapshots: 0,
        max_len: 96,
        train_limit: None,
        min_source_len: None,
        max_source_len: None,
        joined_fraction: 0.0,
        joined_max_verses: crate::train::DEFAULT_JOINED_MAX_VERSES,
        init_from: None,
        mask_fraction: 0.0,
        dev_splits: vec!["dev".into()],
        dev_limit: 64,
        oversample: Vec::new(),
        seed: 1,
        quiet: true,
    })?;
    Ok(TinyRun {
        corpus: corpus_dir,
        tokenizer: tokenizer_path,
        checkpoint: out.join("best"),
        report,
    })
}

/// [`tiny_run_with`] with the `transformer-tiny` preset.
pub fn tiny_run(dir: &Path) -> anyhow::Result<TinyRun> {
    tiny_run_with(dir, "transformer-tiny", 300)
}
