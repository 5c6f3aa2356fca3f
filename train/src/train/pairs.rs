//! `nmt-train pairs`: a corpus split as JSON lines for a trainer outside this crate (the
//! PyTorch trainer that runs where a GPU is, `nmt_tools.training.torch_train`).
//!
//! Placeholder masking is decided here, by the same rule and seed as `nmt-train train
//! --mask-fraction`, so that both trainers teach the sentinels the server puts in; the
//! steps that only reorder or repeat pairs (`--oversample`, joined examples, batching) are
//! the other trainer's, since they are cheap to redo and would multiply the file's size.

use std::io::{BufWriter, Write};
use std::path::PathBuf;

use anyhow::Context;

#[derive(clap::Args, Clone, Debug)]
pub struct PairsArgs {
    /// Corpus directory written by `nmt-train corpus`.
    #[arg(long, default_value = "data/corpus")]
    pub corpus: PathBuf,
    /// The split to write (`train`, `dev`, `l10n-dev`, ...).
    #[arg(long, default_value = "train")]
    pub split: String,
    /// As `nmt-train train --mask-fraction`: the share of maskable pairs that also carry
    /// their masked form (`"masked": [source, target]`).
    #[arg(long, default_value_t = 0.0)]
    pub mask_fraction: f64,
    /// As `nmt-train train --seed`: chooses the masked pairs.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// The JSON-lines file to write: one `{"origin", "source", "target", "masked"}` per
    /// pair, in corpus order (`origin` empty where the corpus records none).
    #[arg(long)]
    pub out: PathBuf,
}

#[derive(serde::Serialize)]
struct PairLine<'a> {
    origin: &'a str,
    source: &'a str,
    target: &'a str,
    masked: Option<(String, String)>,
}

pub fn run(args: PairsArgs) -> anyhow::Result<()> {
    let pairs = crate::corpus::read_parallel(&args.corpus, &args.split)?;
    // A Bible-only corpus records no origins (`nmt-train corpus` without --catalogs): its
    // pairs get none, and an `--oversample` rule of the other trainer matches none of them.
    let origins = if args.corpus.join(format!("{}.origin", args.split)).exists() {
        crate::corpus::read_origins(&args.corpus, &args.split)?
    } else {
        vec![String::new(); pairs.len()]
    };
    anyhow::ensure!(
        origins.len() == pairs.len(),
        "{}: {} pairs but {} origins",
        args.corpus.display(),
        pairs.len(),
        origins.len()
    );
    let file = std::fs::File::create(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let mut out = BufWriter::new(file);
    let mut masked_count = 0;
    for (i, (pair, origin)) in pairs.iter().zip(&origins).enumerate() {
        let masked = super::masked_variant(i, pair, args.mask_fraction, args.seed);
        masked_count += usize::from(masked.is_some());
        let line = PairLine {
            origin,
            source: &pair.0,
            target: &pair.1,
            masked,
        };
        serde_json::to_writer(&mut out, &line)?;
        out.write_all(b"\n")?;
    }
    out.flush()?;
    eprintln!(
        "pairs: {} pairs of {}/{} ({masked_count} with a masked form) -> {}",
        pairs.len(),
        args.corpus.display(),
        args.split,
        args.out.display()
    );
    Ok(())
}
