//! `nmt-translate`: translates a text file or standard input line by line with a model
//! package, through the engine nmt-server drives (`nmt_engine`), without a server. `nmt-translate --help` explains
//! every flag.

use std::fs::File;
use std::io::{self, BufRead, BufReader, BufWriter, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::Parser;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use nmt_engine::length::{LengthMode, LengthRequest, TargetLength};
use nmt_engine::limits::DecodingArgs;
use nmt_engine::onnx::Device;
use nmt_engine::{Engine, EngineOptions, Outcome, Translation};

/// Translates a text file (or standard input) line by line with a model package, through the
/// same tokenizer, limits, length planning, ONNX Runtime engine and greedy decode loop as
/// nmt-server, with no server in between: what CTranslate2's `translate_file` or
/// `marian-decoder` do. One translation per input line, in input order (an empty line stays
/// empty), so the output aligns with the input. Lines are decoded in batches of similar
/// length. A progress bar and the throughput go to standard error.
///
/// Needs ONNX Runtime (`source scripts/env.sh` sets ORT_DYLIB_PATH). The input limit and output
/// budget are nmt-server's, with the same flags and `NMT_*` variables.
#[derive(Clone, Debug, Parser)]
#[command(name = "nmt-translate", version, about, long_about)]
struct Args {
    /// Text to translate, one sentence (or paragraph) a line. `-` or nothing reads standard
    /// input.
    input: Option<PathBuf>,

    /// Write the translations to this file instead of standard output.
    #[arg(short, long)]
    output: Option<PathBuf>,

    /// Model package directory (written by `nmt-export`).
    #[arg(long, env = "NMT_MODEL_DIR", default_value = "models/en-es-rel-ldpe")]
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

    /// At most this many characters per translation (spaces included): a shorter length is
    /// planned, the line is decoded once more if it is still too long, then cut at a word
    /// boundary, as nmt-server does.
    #[arg(long)]
    max_chars: Option<usize>,

    /// Lines decoded together. They are sorted by length within a chunk of the input first,
    /// so a batch wastes little on padding.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u64).range(1..=1024))]
    batch_size: u64,

    /// Threads one ONNX Runtime operator may use.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=256))]
    threads: u64,

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

/// Lines read and decoded at a time: enough batches to sort by length, few enough that the
/// output streams and memory stays flat on any input size.
const CHUNK_BATCHES: usize = 16;

/// What a run did, for the summary line.
#[derive(Default)]
struct Totals {
    lines: usize,
    source_tokens: usize,
    output_tokens: usize,
    refused: usize,
    budget: usize,
    truncated: usize,
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
    let request = LengthRequest {
        target: args.target_length,
        mode: args.length_mode,
        max_chars: args.max_chars,
    };
    let options = EngineOptions {
        device: args.device,
        intra_op_threads: args.threads as usize,
        ort_dylib_path: args.ort_dylib_path.clone(),
        beyond_input_limit: args.beyond_input_limit,
        limits: args.decoding.limits()?,
        placeholder_masking: !args.decoding.no_placeholder_masking,
    };
    let mut engine = Engine::load(&args.model_dir, &options)
        .with_context(|| format!("loading {}", args.model_dir.display()))?;
    engine.check_length(&request)?;

    let from_file = args.input.as_deref().filter(|p| *p != Path::new("-"));
    let input: Box<dyn BufRead> = match from_file {
        Some(path) => Box::new(BufReader::new(
            File::open(path).with_context(|| format!("opening {}", path.display()))?,
        )),
        None => Box::new(io::stdin().lock()),
    };
    let mut output: Box<dyn Write> = match &args.output {
        Some(path) => Box::new(BufWriter::new(
            File::create(path).with_context(|| format!("creating {}", path.display()))?,
        )),
        None => Box::new(BufWriter::new(io::stdout().lock())),
    };
    let total_lines = match from_file {
        Some(path) => Some(count_lines(path)?),
        None => None,
    };
    let bar = progress_bar(total_lines, args.quiet);
    let started = Instant::now();
    let totals = translate_stream(
        &mut engine,
        input,
        &mut output,
        &request,
        args.batch_size as usize,
        &bar,
    )?;
    bar.finish_and_clear();
    if !args.quiet {
        eprintln!(
            "{}",
            summary(&engine, &totals, started.elapsed().as_secs_f64())
        );
    }
    Ok(())
}

/// Reads, translates and writes chunk by chunk, flushing each, so output streams.
fn translate_stream(
    engine: &mut Engine,
    mut input: Box<dyn BufRead>,
    output: &mut dyn Write,
    request: &LengthRequest,
    batch_size: usize,
    bar: &ProgressBar,
) -> Result<Totals> {
    let mut totals = Totals::default();
    let chunk_size = batch_size * CHUNK_BATCHES;
    loop {
        let first_line = totals.lines + 1;
        let chunk = read_chunk(&mut input, chunk_size, first_line)?;
        if chunk.is_empty() {
            return Ok(totals);
        }
        let lengths = vec![*request; chunk.len()];
        let translations =
            engine.translate(&chunk, &lengths, batch_size, &mut |n| bar.inc(n as u64))?;
        for (i, (line, translation)) in chunk.iter().zip(&translations).enumerate() {
            if translation.outcome == Outcome::Refused && !line.trim().is_empty() {
                bar.suspend(|| {
                    eprintln!(
                        "nmt-translate: line {}: {} subwords is over the input limit of {}; \
                         its translation is left empty (--beyond-input-limit decodes it)",
                        first_line + i,
                        translation.source_tokens,
                        engine.info.input_limit
                    )
                });
                totals.refused += 1;
            }
            // One translation a line, so the output aligns with the input.
            let line = translation.text.replace(['\n', '\r'], " ");
            writeln!(output, "{line}").context("writing the translations")?;
            add(&mut totals, translation);
        }
        output.flush().context("writing the translations")?;
        totals.lines += chunk.len();
    }
}

/// Up to `n` lines without their line endings; a line that is not UTF-8 is an error that names
/// it rather than a silently changed text.
fn read_chunk(input: &mut dyn BufRead, n: usize, first_line: usize) -> Result<Vec<String>> {
    let mut lines = Vec::with_capacity(n);
    let mut buffer = Vec::new();
    while lines.len() < n {
        buffer.clear();
        if input
            .read_until(b'\n', &mut buffer)
            .context("reading the input")?
            == 0
        {
            break;
        }
        while matches!(buffer.last(), Some(b'\n' | b'\r')) {
            buffer.pop();
        }
        let line = String::from_utf8(std::mem::take(&mut buffer))
            .map_err(|_| anyhow::anyhow!("line {} is not UTF-8 text", first_line + lines.len()))?;
        lines.push(line);
    }
    Ok(lines)
}

fn add(totals: &mut Totals, t: &Translation) {
    totals.source_tokens += t.source_tokens;
    totals.output_tokens += t.output_tokens;
    totals.budget += usize::from(t.outcome == Outcome::Budget);
    totals.truncated += usize::from(t.truncated);
}

fn count_lines(path: &Path) -> Result<usize> {
    let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut count = 0;
    for line in BufReader::new(file).split(b'\n') {
        line.with_context(|| format!("reading {}", path.display()))?;
        count += 1;
    }
    Ok(count)
}

fn progress_bar(total: Option<usize>, quiet: bool) -> ProgressBar {
    if quiet || !io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let (bar, template) = match total {
        Some(n) => (
            ProgressBar::new(n as u64),
            "[{elapsed_precise}] {wide_bar} {pos}/{len} lines ({per_sec}, eta {eta})",
        ),
        None => (
            ProgressBar::new_spinner(),
            "{spinner} [{elapsed_precise}] {pos} lines ({per_sec})",
        ),
    };
    bar.set_style(ProgressStyle::with_template(template).expect("a valid template"));
    bar.set_draw_target(ProgressDrawTarget::stderr());
    bar
}

fn summary(engine: &Engine, totals: &Totals, seconds: f64) -> String {
    let seconds = seconds.max(1e-9);
    let mut line = format!(
        "nmt-translate: {} lines, {} -> {} subwords in {:.1} s: {:.0} target tokens/s, \
         {:.1} lines/s ({}, {})",
        totals.lines,
        totals.source_tokens,
        totals.output_tokens,
        seconds,
        totals.output_tokens as f64 / seconds,
        totals.lines as f64 / seconds,
        engine.info.name,
        engine.info.execution_provider,
    );
    for (count, what) in [
        (totals.refused, "left empty over the input limit"),
        (totals.budget, "stopped at the length budget"),
        (totals.truncated, "cut to --max-chars"),
    ] {
        if count > 0 {
            line.push_str(&format!("; {count} {what}"));
        }
    }
    line
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
    fn chunks_keep_empty_lines_and_drop_line_endings() {
        let mut input: &[u8] = b"one\r\n\ntwo\nthree";
        let lines = read_chunk(&mut input, 2, 1).unwrap();
        assert_eq!(lines, ["one", ""]);
        let rest = read_chunk(&mut input, 5, 3).unwrap();
        assert_eq!(rest, ["two", "three"]);
        assert!(read_chunk(&mut input, 5, 5).unwrap().is_empty());
        let mut bad: &[u8] = b"ok\n\xff\xfe\n";
        let err = read_chunk(&mut bad, 5, 1).unwrap_err().to_string();
        assert!(err.contains("line 2"), "{err}");
    }
}
