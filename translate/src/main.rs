//! `nmt-translate`: translates a text file (line by line), a gettext catalog or a subtitle
//! file with a model package, through the engine nmt-server drives (`nmt_engine`), without a
//! server. `nmt-translate --help` explains every flag; one module per format.

mod po;
mod srt;
mod subtitles;
mod text;
mod translator;
mod vtt;

use std::fs::File;
use std::io::{self, BufRead, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::{Parser, ValueEnum};
use indicatif::ProgressBar;
use model_package::Manifest;
use nmt_engine::length::{LengthMode, LengthRequest, TargetChars, TargetLength};
use nmt_engine::limits::{BatchRows, DecodingArgs};
use nmt_engine::onnx::Device;
use nmt_engine::{Engine, EngineOptions};

use translator::{Totals, Translator};

/// Translates a text file (or standard input) line by line with a model package, through the
/// same tokenizer, limits, length planning, ONNX Runtime engine and greedy decode loop as
/// nmt-server, with no server in between: what CTranslate2's `translate_file` or
/// `marian-decoder` do. One translation per input line, in input order (an empty line stays
/// empty), so the output aligns with the input. Lines are decoded in batches of similar
/// length. A progress bar and the throughput go to standard error.
///
/// A gettext catalog (`.po`, `.pot`) gets its untranslated entries filled and marked fuzzy;
/// a subtitle file (`.srt`, `.vtt`) comes back with the same cues and timings, each cue in
/// at most two lines of `--max-line-chars` (docs/translating-files.md).
///
/// Needs ONNX Runtime (`source scripts/env.sh` sets ORT_DYLIB_PATH). The input limit and output
/// budget are nmt-server's, with the same flags and `NMT_*` variables.
#[derive(Clone, Debug, Parser)]
#[command(name = "nmt-translate", version, about, long_about)]
struct Args {
    /// Text to translate, one sentence (or paragraph) a line, or a catalog or subtitle file
    /// (see `--format`). `-` or nothing reads standard input.
    input: Option<PathBuf>,

    /// What the input is: `text` (one text a line), `po` (a gettext catalog or template),
    /// `srt` (SubRip) or `vtt` (WebVTT). `auto` goes by the input's extension (`.po`, `.pot`,
    /// `.srt`, `.vtt`; anything else and standard input are text).
    #[arg(long, value_enum, default_value_t = Format::Auto)]
    format: Format,

    /// Write the translations to this file instead of standard output.
    #[arg(short, long)]
    output: Option<PathBuf>,

    /// Model package directory (written by `nmt-export`).
    #[arg(long, env = "NMT_MODEL_DIR", default_value = "models/en-es-l10n")]
    model_dir: PathBuf,

    /// The length every translation asks for, as a request's `target_length`: a number of
    /// target subwords (EOS not counted), `source` (the source line's subword count) or
    /// `auto` (the package's length predictor). A length-aware package plans a sentence of
    /// that length; with another package, use `--length-mode exact`. Unset: what a request
    /// without one gets (a length-aware package predicts the length).
    #[arg(long)]
    target_length: Option<TargetLength>,

    /// How a length is met: `soft` (a length-aware model plans it and may end a little early
    /// or late) or `exact` (EOS is forbidden before the length and forced at it).
    #[arg(long, value_enum, default_value_t = LengthMode::Soft)]
    length_mode: LengthMode,

    /// At most this many characters per translation (spaces included): the line is decoded
    /// at a few lengths under the budget and the best candidate that fits is kept (one that
    /// ends as a sentence first), cut at a word boundary only when none fits, as nmt-server
    /// does.
    #[arg(long)]
    max_chars: Option<usize>,

    /// About this many characters per translation (within 10%, spaces counted), or `source`:
    /// isometric, as many characters as the source line, spaces not counted (IWSLT 2022).
    /// The line is decoded at several lengths and the best candidate that complies is kept,
    /// as with a request's `target_chars`. Not with `--target-length`.
    #[arg(long, conflicts_with = "target_length")]
    target_chars: Option<TargetChars>,

    /// Plain text: cut each line into sentences (Wikimedia's segmenter, as a request's
    /// `split_sentences`), translate every sentence as a text of its own, and join the
    /// translations with the line's own spacing: still one line out per line in. A number in
    /// `--target-length` or `--target-chars`, and `--max-chars`, apply to whole lines and
    /// are refused with it.
    #[arg(long)]
    split_sentences: bool,

    /// Catalogs: each translation at most this many times its msgid's characters (spaces
    /// included; at least 10 characters), planned for and cut like `--max-chars`, e.g. 1.3
    /// for UI strings that must fit where the English did.
    #[arg(long, value_parser = positive_ratio)]
    max_chars_ratio: Option<f64>,

    /// Subtitles: the longest line of a cue, in characters. A cue gets at most two lines,
    /// and the model is asked for at most two lines' worth of text a cue.
    #[arg(long, default_value_t = 42, value_parser = clap::value_parser!(u64).range(8..=1000))]
    max_line_chars: u64,

    /// Lines decoded together (1 to 4096), or `auto`: 32 with float32 weights, 8 with int8
    /// (with int8 weights a step's time goes to reading the rows' keys and values, which stay
    /// in the CPU's cache in smaller batches: nmt-server's `--max-batch-size`). Lines are
    /// sorted by length within a chunk of the input first, so a batch wastes little on padding.
    #[arg(long, default_value = "auto")]
    batch_size: BatchRows,

    /// Threads one ONNX Runtime operator may use.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=256))]
    threads: u64,

    /// Batches decoded at once, each by a worker of its own (CTranslate2's `inter_threads`):
    /// as many as cores translates a long file fastest (1.7-1.8x on 2 cores, with `--threads 1`).
    /// The translations are the same whatever the number.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=64))]
    workers: u64,

    /// Where the graphs run: `auto` takes CUDA when it is available, else the CPU.
    #[arg(long, value_enum, default_value_t = Device::Auto)]
    device: Device,

    /// Decode lines longer than the input limit (a package with absolute positions declares
    /// one; nmt-server's `--max-input-tokens` applies to all) instead of leaving them empty
    /// with a warning.
    #[arg(long)]
    beyond_input_limit: bool,

    /// How lines are decoded: nmt-server's flags and defaults.
    #[command(flatten)]
    decoding: DecodingArgs,

    /// No progress bar and no summary; warnings are still printed.
    #[arg(short, long)]
    quiet: bool,

    /// ONNX Runtime shared library (libonnxruntime.so); `source scripts/env.sh` sets it.
    #[arg(long, env = "ORT_DYLIB_PATH")]
    ort_dylib_path: Option<PathBuf>,
}

/// What the input is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Format {
    Auto,
    Text,
    Po,
    Srt,
    Vtt,
}

impl Format {
    /// `Auto` resolved by the input's extension.
    fn of(self, input: Option<&Path>) -> Format {
        if self != Format::Auto {
            return self;
        }
        let extension = input.and_then(Path::extension).and_then(|e| e.to_str());
        match extension.map(str::to_ascii_lowercase).as_deref() {
            Some("po" | "pot") => Format::Po,
            Some("srt") => Format::Srt,
            Some("vtt") => Format::Vtt,
            _ => Format::Text,
        }
    }
}

fn positive_ratio(value: &str) -> Result<f64, String> {
    match value.parse::<f64>() {
        Ok(r) if r.is_finite() && r > 0.0 => Ok(r),
        _ => Err(format!("{value} is not a ratio above 0")),
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("nmt-translate: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> Result<()> {
    let from_file = args.input.as_deref().filter(|p| *p != Path::new("-"));
    let format = args.format.of(from_file);
    check_flags(args, format)?;
    let request = LengthRequest {
        target: args.target_length,
        mode: args.length_mode,
        max_chars: args.max_chars,
        target_chars: args.target_chars,
    };
    let options = EngineOptions {
        device: args.device,
        intra_op_threads: args.threads as usize,
        ort_dylib_path: args.ort_dylib_path.clone(),
        beyond_input_limit: args.beyond_input_limit,
        limits: args.decoding.limits()?,
        placeholder_masking: !args.decoding.no_placeholder_masking,
        workers: args.workers as usize,
    };
    let engine = Engine::load(&args.model_dir, &options)
        .with_context(|| format!("loading {}", args.model_dir.display()))?;
    engine.check_length(&request)?;
    let batch_size = args.batch_size.rows(engine.info.precision);
    let mut translator = Translator {
        engine,
        request,
        batch_size,
        bar: ProgressBar::hidden(),
        totals: Totals::default(),
        quiet: args.quiet,
    };
    let started = Instant::now();
    let (what, unit) = match format {
        Format::Text | Format::Auto => {
            let lines = translate_text(args, from_file, &mut translator)?;
            (format!("{lines} lines"), "lines")
        }
        _ => (
            translate_document(args, format, from_file, &mut translator)?,
            "texts",
        ),
    };
    translator.bar.finish_and_clear();
    if !args.quiet {
        let seconds = started.elapsed().as_secs_f64();
        eprintln!("{}", translator.summary(&what, unit, seconds));
    }
    Ok(())
}

/// Refuses flags that the input's format does not use, rather than ignoring them.
fn check_flags(args: &Args, format: Format) -> Result<()> {
    if args.max_chars_ratio.is_some() && format != Format::Po {
        bail!("--max-chars-ratio applies to gettext catalogs (--format po)");
    }
    if args.max_chars.is_some() && matches!(format, Format::Srt | Format::Vtt) {
        bail!("a subtitle's character budget comes from --max-line-chars, not --max-chars");
    }
    if args.split_sentences {
        if !matches!(format, Format::Text | Format::Auto) {
            bail!("--split-sentences applies to plain text");
        }
        let whole_line = matches!(args.target_length, Some(TargetLength::Tokens(_)))
            || matches!(args.target_chars, Some(TargetChars::Chars(_)))
            || args.max_chars.is_some();
        if whole_line {
            bail!(
                "a number in --target-length or --target-chars, and --max-chars, apply to whole \
                 lines; not with --split-sentences (`source` and `auto` apply to each sentence)"
            );
        }
    }
    Ok(())
}

/// Plain text, streamed line by line.
fn translate_text(
    args: &Args,
    from_file: Option<&Path>,
    translator: &mut Translator,
) -> Result<usize> {
    let input: Box<dyn BufRead> = match from_file {
        Some(path) => Box::new(BufReader::new(
            File::open(path).with_context(|| format!("opening {}", path.display()))?,
        )),
        None => Box::new(io::stdin().lock()),
    };
    let mut output = open_output(args)?;
    let total_lines = match from_file {
        Some(path) => Some(text::count_lines(path)?),
        None => None,
    };
    translator.start_progress(total_lines, "lines");
    text::translate_stream(translator, input, &mut output, args.split_sentences)
}

/// A catalog or subtitle file, read whole (they are small), translated in batches, written
/// whole; returns what the summary line says it did.
fn translate_document(
    args: &Args,
    format: Format,
    from_file: Option<&Path>,
    translator: &mut Translator,
) -> Result<String> {
    let mut bytes = Vec::new();
    match from_file {
        Some(path) => File::open(path)
            .and_then(|mut f| f.read_to_end(&mut bytes))
            .with_context(|| format!("reading {}", path.display()))?,
        None => io::stdin()
            .read_to_end(&mut bytes)
            .context("reading the input")?,
    };
    let input = String::from_utf8(bytes).context("the input is not UTF-8 text")?;
    let line_chars = args.max_line_chars as usize;
    let (translated, what) = match format {
        Format::Po => {
            let options = po::PoOptions {
                max_chars_ratio: args.max_chars_ratio,
                target_language: Manifest::load(&args.model_dir)?.target_language,
            };
            let (text, report) = po::translate_catalog(&input, translator, &options)?;
            (text, report.describe())
        }
        Format::Srt => {
            let (text, report) = srt::translate_srt(&input, translator, line_chars)?;
            (text, report.describe())
        }
        _ => {
            let (text, report) = vtt::translate_vtt(&input, translator, line_chars)?;
            (text, report.describe())
        }
    };
    let mut output = open_output(args)?;
    output
        .write_all(translated.as_bytes())
        .and_then(|()| output.flush())
        .context("writing the translation")?;
    Ok(what)
}

fn open_output(args: &Args) -> Result<Box<dyn Write>> {
    Ok(match &args.output {
        Some(path) => Box::new(BufWriter::new(
            File::create(path).with_context(|| format!("creating {}", path.display()))?,
        )),
        None => Box::new(BufWriter::new(io::stdout().lock())),
    })
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
    }

    #[test]
    fn target_lengths_parse_like_the_api() {
        let parse = |v: &str| Args::try_parse_from(["nmt-translate", "--target-length", v]);
        assert_eq!(
            parse("12").unwrap().target_length,
            Some(TargetLength::Tokens(12))
        );
        assert_eq!(
            parse("source").unwrap().target_length,
            Some(TargetLength::Source)
        );
        assert_eq!(
            parse("auto").unwrap().target_length,
            Some(TargetLength::Auto)
        );
        assert!(parse("twelve").is_err());
        assert!(Args::try_parse_from(["nmt-translate", "--batch-size", "0"]).is_err());
    }

    #[test]
    fn formats_go_by_extension_unless_named() {
        let of = |f: Format, p: &str| f.of(Some(Path::new(p)));
        assert_eq!(of(Format::Auto, "app.po"), Format::Po);
        assert_eq!(of(Format::Auto, "app.POT"), Format::Po);
        assert_eq!(of(Format::Auto, "film.srt"), Format::Srt);
        assert_eq!(of(Format::Auto, "film.vtt"), Format::Vtt);
        assert_eq!(of(Format::Auto, "in.txt"), Format::Text);
        assert_eq!(of(Format::Po, "in.txt"), Format::Po);
        assert_eq!(Format::Auto.of(None), Format::Text);
    }

    #[test]
    fn budgets_belong_to_their_formats() {
        let parse = |a: &[&str]| Args::try_parse_from([&["nmt-translate"], a].concat()).unwrap();
        let args = parse(&["a.txt", "--max-chars-ratio", "1.3"]);
        assert!(check_flags(&args, Format::Text).is_err());
        assert!(check_flags(&args, Format::Po).is_ok());
        let args = parse(&["a.srt", "--max-chars", "40"]);
        assert!(check_flags(&args, Format::Srt).is_err());
        assert!(check_flags(&args, Format::Text).is_ok());
        assert!(Args::try_parse_from(["nmt-translate", "--max-chars-ratio", "0"]).is_err());
        assert!(Args::try_parse_from(["nmt-translate", "--max-line-chars", "4"]).is_err());
        assert_eq!(parse(&[]).max_line_chars, 42);
    }
}
