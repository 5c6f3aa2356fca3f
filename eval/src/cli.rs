//! The command line.

use std::path::PathBuf;

use clap::Parser;
use nmt_engine::length::{LengthMode, TargetChars, TargetLength};
use nmt_engine::limits::DecodingArgs;
use nmt_engine::onnx::Device;

use crate::stats::BucketEdges;

/// Evaluates model packages the way nmt-server translates: the same tokenizer, length
/// budget, ONNX Runtime engine and greedy decode loop, with no HTTP in between. Scores with
/// sacrebleu's own command line (BLEU, chrF, TER with bootstrap confidence intervals, and the
/// paired bootstrap against a baseline), overall and by source-length bucket (the server's
/// `input_length` buckets, or `--bucket-edges`); counts looping outputs and outputs that hit the length budget;
/// evaluates the long-input set (test-concat.tsv) against the same verses translated one by
/// one. Writes hypotheses, each package's translations (`decoded.json`, to score again
/// without the package), report.json, report.md and PNG plots to `--out`.
///
/// Needs ONNX Runtime (`source scripts/env.sh` sets ORT_DYLIB_PATH) and python3 with
/// sacrebleu 2.6.0 (`scripts/setup.sh` installs both). Server limits (`--max-length-ratio`,
/// `--max-length-offset`, `--max-output-tokens`, `--max-input-tokens`) are nmt-server's
/// defaults, or its `NMT_*` environment variables when set, so the numbers are the server's.
#[derive(Clone, Debug, Parser)]
#[command(name = "nmt-eval", version, about, long_about)]
pub struct Args {
    /// Model package directory to evaluate; repeat the flag to evaluate several on the same
    /// set. Without `--baseline`, the first is the baseline of the paired bootstrap when
    /// several are given. In place of a package: the `decoded.json` an earlier run wrote
    /// beside a package's hypotheses (`<out>/<label>/decoded.json`), scored again without
    /// decoding (same set and length flags; buckets and baseline may differ).
    #[arg(long = "package", required = true)]
    pub packages: Vec<PathBuf>,

    /// Baseline package of the paired bootstrap (sacrebleu `--paired-bs`): every `--package`
    /// is tested against it on the whole set, on each source-length bucket (the sentences the
    /// baseline's tokenizer puts there) and on each long-input group size.
    #[arg(long)]
    pub baseline: Option<PathBuf>,

    /// Corpus directory written by `nmt-train corpus`: `<split>.en`/`<split>.es` are the test
    /// set (unless `--source`/`--reference` are given) and `test-concat.tsv` the long-input set.
    #[arg(long, default_value = "data/corpus")]
    pub corpus: PathBuf,

    /// The corpus split to evaluate: `dev` or `test`.
    #[arg(long, default_value = "test")]
    pub split: String,

    /// Source sentences, one a line (any parallel set; replaces `--split`).
    #[arg(long, requires = "reference")]
    pub source: Option<PathBuf>,

    /// Reference translations, one a line, aligned with `--source`.
    #[arg(long, requires = "source")]
    pub reference: Option<PathBuf>,

    /// Long-input set (columns n_verses, ref, en, es), scored per n_verses group against the
    /// same verses translated one by one, which are looked up in `test.en`/`test.es` beside it.
    /// Default: `<corpus>/test-concat.tsv` when the set is the corpus test split.
    #[arg(long, conflicts_with = "no_concat")]
    pub concat: Option<PathBuf>,

    /// Skip the long-input set.
    #[arg(long)]
    pub no_concat: bool,

    /// Evaluate only the first N sentences, and of the long-input set the first N / n_verses
    /// groups (at least one) of each size: for quick runs and tests.
    #[arg(long)]
    pub limit: Option<usize>,

    /// Sentences decoded together; they are sorted by length first, so a batch wastes little
    /// on padding. Outputs are written in input order.
    #[arg(long, default_value_t = 32)]
    pub batch_size: usize,

    /// Decode inputs longer than the input limit (the model's own `max_source_tokens`, or the
    /// server's `--max-input-tokens`) instead of counting them as refused with an empty
    /// output, as the server refuses them (413). Shows how a model degrades past its limit.
    #[arg(long)]
    pub beyond_input_limit: bool,

    /// The length each test sentence asks for, as a request's `target_length`: a number of
    /// subwords, `source`, `auto` (the package's predictor or linear fit), or `reference` (the reference's
    /// subword count times `--reference-length-scale`: an oracle, to measure how well a
    /// length is met). Unset: what a request without one gets. With a length ask
    /// (`--target-length` or `--max-chars`) the long-input set is skipped.
    #[arg(long)]
    pub target_length: Option<EvalTargetLength>,

    /// Multiplies the reference's length wherever a flag says `reference` (0.8 with
    /// `--max-chars reference`: a subtitle that must be shorter than the natural
    /// translation).
    #[arg(long, default_value_t = 1.0)]
    pub reference_length_scale: f64,

    /// How the target length is met, as a request's `length_mode`: `soft` (the length
    /// encoding guides a length-aware decoder) or `exact` (EOS masked before it and forced
    /// at it).
    #[arg(long, value_enum, default_value_t = LengthMode::Soft)]
    pub length_mode: LengthMode,

    /// At most this many characters per translation, as a request's `max_chars`, or
    /// `reference`: the reference's characters times `--reference-length-scale`.
    #[arg(long, value_parser = char_budget)]
    pub max_chars: Option<EvalChars>,

    /// About this many characters per translation, as a request's `target_chars`: a number,
    /// `source` (isometric: the source's characters, spaces not counted), or `reference`
    /// (the reference's characters, spaces counted, times `--reference-length-scale`).
    #[arg(long, conflicts_with = "target_length")]
    pub target_chars: Option<EvalChars>,

    /// Output directory: per package its hypotheses (`<label>/`), and report.json, report.md,
    /// bleu_by_length.png, length_ratio_by_length.png. Default: `runs/eval-<set>`.
    #[arg(long)]
    pub out: Option<PathBuf>,

    /// Source-length buckets of the scores by length and of the per-bucket paired bootstrap:
    /// comma-separated inclusive upper bounds in source subwords (the package's tokenizer,
    /// EOS not counted), strictly increasing, at least one. Buckets are 1..=E1, E1+1..=E2,
    /// ..., and one open bucket past the last edge: `--bucket-edges 32` gives `1-32` and
    /// `33+`, inputs within and beyond a training length of 32 subwords. Empty buckets are
    /// left out. The default is the server's `input_length` buckets.
    #[arg(long, value_name = "E1,E2,...", default_value_t = BucketEdges::default())]
    pub bucket_edges: BucketEdges,

    /// Bootstrap resamples of sacrebleu's `--confidence-n` and `--paired-bs-n`.
    #[arg(long, default_value_t = 1000)]
    pub bootstrap_samples: usize,

    /// Python interpreter with sacrebleu 2.6.0 installed.
    #[arg(long, env = "NMT_EVAL_PYTHON", default_value = "python3")]
    pub python: PathBuf,

    /// TrueType font for the plots' text (Debian package fonts-dejavu-core).
    #[arg(
        long,
        default_value = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf"
    )]
    pub font: PathBuf,

    /// Where the graphs run, as nmt-server's `--device`: `auto` takes CUDA when available.
    #[arg(long, value_enum, default_value_t = Device::Auto)]
    pub device: Device,

    /// Threads one ONNX Runtime operator may use.
    #[arg(long, default_value_t = 1)]
    pub intra_op_threads: usize,

    /// Batches decoded at once, each by a worker of its own (as `nmt-translate --workers`):
    /// the scores are the same whatever the number; the report's sentences/s are of all the
    /// workers together.
    #[arg(long, default_value_t = 1, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=64))]
    pub workers: usize,

    /// ONNX Runtime shared library (libonnxruntime.so); `source scripts/env.sh` sets it.
    #[arg(long, env = "ORT_DYLIB_PATH")]
    pub ort_dylib_path: Option<PathBuf>,

    /// How sentences are decoded: nmt-server's flags, `NMT_*` variables and defaults, so a
    /// report scores what the server would answer.
    #[command(flatten)]
    pub decoding: DecodingArgs,
}

/// `--target-chars` and `--max-chars`: what a request can ask ([`TargetChars`]), or the
/// reference's characters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EvalChars {
    Ask(TargetChars),
    /// The reference's characters, spaces counted (times `--reference-length-scale`).
    Reference,
}

impl EvalChars {
    /// Characters for a sentence whose reference has `reference_chars`.
    pub fn chars(self, reference_chars: usize, scale: f64) -> TargetChars {
        match self {
            EvalChars::Ask(asked) => asked,
            EvalChars::Reference => {
                TargetChars::Chars((reference_chars as f64 * scale).round().max(1.0) as usize)
            }
        }
    }
}

impl std::str::FromStr for EvalChars {
    type Err = String;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        match value {
            "reference" => Ok(EvalChars::Reference),
            other => other
                .parse()
                .map(EvalChars::Ask)
                .map_err(|e| format!("{e}, or `reference`")),
        }
    }
}

impl std::fmt::Display for EvalChars {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        match self {
            EvalChars::Ask(asked) => write!(f, "{asked}"),
            EvalChars::Reference => f.write_str("reference"),
        }
    }
}

/// `--max-chars`: a number or `reference` (a budget has no `source`).
fn char_budget(value: &str) -> Result<EvalChars, String> {
    match value.parse()? {
        EvalChars::Ask(TargetChars::Source) => {
            Err("a character budget is a number or `reference`".into())
        }
        budget => Ok(budget),
    }
}

/// `--target-length`: what a request can ask ([`TargetLength`], parsed by its own parser),
/// or the reference's length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EvalTargetLength {
    Ask(TargetLength),
    /// The reference's subword count (times `--reference-length-scale`).
    Reference,
}

impl std::str::FromStr for EvalTargetLength {
    type Err = String;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        match value {
            "reference" => Ok(EvalTargetLength::Reference),
            other => other
                .parse()
                .map(EvalTargetLength::Ask)
                .map_err(|e| format!("{e}, or `reference`")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_consistent_and_every_flag_is_documented() {
        Args::command().debug_assert();
        for arg in Args::command().get_arguments() {
            let id = arg.get_id().as_str();
            if id == "help" || id == "version" {
                continue;
            }
            assert!(arg.get_help().is_some(), "--{id} has no help text");
        }
        let args = Args::try_parse_from(["nmt-eval", "--package", "p", "--package", "q"]).unwrap();
        assert_eq!(args.packages.len(), 2);
        assert!(Args::try_parse_from(["nmt-eval", "--package", "p", "--source", "s"]).is_err());
        assert!(Args::try_parse_from(["nmt-eval"]).is_err());
        assert_eq!(args.bucket_edges, BucketEdges::default());
        let args = Args::try_parse_from(["nmt-eval", "--package", "p", "--bucket-edges", "32,64"]);
        assert_eq!(args.unwrap().bucket_edges.edges(), [32, 64]);
        let chars = |flags: &[&str]| {
            let args = [&["nmt-eval", "--package", "p"], flags].concat();
            Args::try_parse_from(args)
        };
        let args = chars(&["--target-chars", "source", "--max-chars", "reference"]).unwrap();
        assert_eq!(args.target_chars, Some(EvalChars::Ask(TargetChars::Source)));
        assert_eq!(args.max_chars, Some(EvalChars::Reference));
        assert!(
            chars(&["--max-chars", "source"]).is_err(),
            "max_chars has no source"
        );
        assert!(chars(&["--target-chars", "40", "--target-length", "9"]).is_err());
        for bad in ["", "0", "64,32", "32,32"] {
            let args = ["nmt-eval", "--package", "p", "--bucket-edges", bad];
            assert!(Args::try_parse_from(args).is_err(), "{bad:?}");
        }
    }
}
