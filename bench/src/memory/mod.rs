//! `nmt-bench memory`: the resident memory of one server against input length, for each
//! package given (one per position family): the peak one text of each length adds to the
//! idle server, and whether that memory goes back once the text is answered. A table
//! (Markdown, JSON) and a plot (PNG) of the peak by length, one line per package.
//!
//! Each text asks for a short exact length (`--output-subwords`), so that what grows with the
//! input is the encoder's work and the decoder's cross-attention, not a long decoding.

mod report;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use model_package::Manifest;
use nmt_engine::package::TextCodec;
use nmt_testkit::ServerProcess;
use serde::Serialize;
use serde_json::json;

use crate::server::{server_args, start_ready};

pub use report::MemoryReport;

/// Resident memory against input length, one server per package (docs/serving.md, "Memory").
#[derive(Debug, clap::Args)]
pub struct MemoryArgs {
    /// A package to measure, as NAME=DIR (repeat for each): one line in the plot. Default:
    /// the shipped package, as `shipped=models/en-es-rel-ldpe`.
    #[arg(long = "package", value_parser = parse_package)]
    pub packages: Vec<(String, PathBuf)>,

    /// Input lengths to measure, in subwords of each package's tokenizer (EOS included).
    /// The server is started with `--max-input-tokens` at the longest.
    #[arg(long, value_delimiter = ',', default_value = "64,128,256,512,768,1024")]
    pub lengths: Vec<usize>,

    /// English prose the texts are cut from: its lines joined, repeated as needed.
    #[arg(long, default_value = "data/corpus/test.en")]
    pub prose: PathBuf,

    /// The exact output length every text asks for (target subwords).
    #[arg(long, default_value_t = 16)]
    pub output_subwords: usize,

    /// Seconds to watch the resident memory after each answer for its return to idle.
    #[arg(long, default_value_t = 10.0)]
    pub settle_seconds: f64,

    /// Within this fraction above idle, the memory counts as returned.
    #[arg(long, default_value_t = 0.10)]
    pub settled_fraction: f64,

    /// The server executable.
    #[arg(long, default_value_os_t = nmt_testkit::release_binary("nmt-server"))]
    pub server_bin: PathBuf,

    /// One extra argument for every server (repeatable), after the bench's own.
    #[arg(long = "server-arg", allow_hyphen_values = true, value_name = "ARG")]
    pub server_arg: Vec<String>,

    /// Write the table as Markdown here.
    #[arg(long)]
    pub out_md: Option<PathBuf>,
    /// Write the measurements as JSON here.
    #[arg(long)]
    pub out_json: Option<PathBuf>,
    /// Write the plot (PNG) here.
    #[arg(long)]
    pub out_png: Option<PathBuf>,
    /// TrueType font for the plot's text (Debian's fonts-dejavu-core).
    #[arg(
        long,
        default_value = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf"
    )]
    pub font: PathBuf,
}

fn parse_package(arg: &str) -> Result<(String, PathBuf), String> {
    match arg.split_once('=') {
        Some((name, dir)) if !name.is_empty() && !dir.is_empty() => {
            Ok((name.to_string(), PathBuf::from(dir)))
        }
        _ => Err(format!("expected NAME=DIR, got `{arg}`")),
    }
}

/// One text's measurement.
#[derive(Debug, Clone, Serialize)]
pub struct Measurement {
    /// Subwords of the text, EOS included (at most the length asked for).
    pub subwords: usize,
    pub peak_above_idle_mib: f64,
    /// Resident memory at the end of the watch, and the seconds it took to come within
    /// `--settled-fraction` of idle (`None`: it did not).
    pub settled_mib: f64,
    pub settled_after_seconds: Option<f64>,
    pub latency_seconds: f64,
}

/// One package's server and its measurements.
#[derive(Debug, Clone, Serialize)]
pub struct PackageRun {
    pub name: String,
    pub dir: String,
    /// The package's position family, in words (its manifest's config).
    pub positions: String,
    pub idle_mib: f64,
    pub measurements: Vec<Measurement>,
}

pub fn run(args: MemoryArgs) -> Result<bool> {
    let packages = if args.packages.is_empty() {
        vec![("shipped".to_string(), nmt_testkit::shipped_package())]
    } else {
        args.packages.clone()
    };
    ensure!(!args.lengths.is_empty(), "no --lengths");
    let prose = std::fs::read_to_string(&args.prose)
        .with_context(|| format!("reading {}", args.prose.display()))?;
    let words: Vec<&str> = prose.split_whitespace().collect();
    ensure!(!words.is_empty(), "{}: no words", args.prose.display());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut runs = Vec::new();
    for (name, dir) in &packages {
        runs.push(runtime.block_on(measure_package(&args, name, dir, &words))?);
    }
    let report = MemoryReport::new(&args, runs);
    crate::report::emit(&report, args.out_md.as_deref(), args.out_json.as_deref())?;
    if let Some(png) = &args.out_png {
        report::plot(&report, png, &args.font)?;
    }
    Ok(true)
}

async fn measure_package(
    args: &MemoryArgs,
    name: &str,
    dir: &Path,
    words: &[&str],
) -> Result<PackageRun> {
    let manifest = Manifest::load(dir).with_context(|| format!("package {}", dir.display()))?;
    let codec = TextCodec::new(
        tokenizers::Tokenizer::from_file(dir.join(model_package::files::TOKENIZER))
            .map_err(|e| anyhow::anyhow!("{}: {e}", dir.display()))?,
    );
    let longest = args.lengths.iter().copied().max().unwrap_or(1);
    let mut extra = vec![
        "--model-workers".to_string(),
        "1".to_string(),
        "--max-input-tokens".to_string(),
        longest.to_string(),
    ];
    extra.extend(args.server_arg.iter().cloned());
    let sargs = server_args(dir, crate::server::DEFAULT_MODE, &extra);
    let log = std::env::temp_dir().join(format!("nmt-bench-memory-{name}.log"));
    let client = reqwest::Client::new();
    let server = start_ready(
        &client,
        &args.server_bin,
        &sargs,
        &log,
        Duration::from_secs(180),
    )
    .await?;
    // A short request first, so that idle includes what serving anything allocates once.
    translate(&client, &server, "Good morning.", args.output_subwords).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let idle = rss(&server, ServerProcess::rss_mib)?;
    let mut measurements = Vec::new();
    for &length in &args.lengths {
        let (text, subwords) = nmt_testkit::text_of_subwords(words, length, |text| {
            // The server counts EOS too.
            codec.encode(text).map(|ids| ids.len() + 1)
        })
        .map_err(anyhow::Error::msg)?;
        server.reset_peak_rss()?;
        let started = Instant::now();
        translate(&client, &server, &text, args.output_subwords).await?;
        let latency_seconds = started.elapsed().as_secs_f64();
        let peak = rss(&server, ServerProcess::peak_rss_mib)?;
        let (settled_mib, settled_after_seconds) = watch_settling(&server, idle, args).await?;
        eprintln!(
            "{name}: {subwords} subwords: peak +{:.0} MiB over {idle:.0}, then {settled_mib:.0} MiB",
            peak - idle
        );
        measurements.push(Measurement {
            subwords,
            peak_above_idle_mib: peak - idle,
            settled_mib,
            settled_after_seconds,
            latency_seconds,
        });
    }
    Ok(PackageRun {
        name: name.to_string(),
        dir: dir.display().to_string(),
        positions: positions(&manifest),
        idle_mib: idle,
        measurements,
    })
}

fn rss(server: &ServerProcess, read: fn(&ServerProcess) -> Option<f64>) -> Result<f64> {
    read(server).context("the server's /proc status (has it exited?)")
}

/// Polls the resident memory for `--settle-seconds`: the last reading, and when it first came
/// within `--settled-fraction` of `idle`.
async fn watch_settling(
    server: &ServerProcess,
    idle: f64,
    args: &MemoryArgs,
) -> Result<(f64, Option<f64>)> {
    let started = Instant::now();
    let mut settled_after = None;
    loop {
        let now = rss(server, ServerProcess::rss_mib)?;
        if settled_after.is_none() && now <= idle * (1.0 + args.settled_fraction) {
            settled_after = Some(started.elapsed().as_secs_f64());
        }
        if started.elapsed().as_secs_f64() >= args.settle_seconds {
            return Ok((now, settled_after));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

async fn translate(
    client: &reqwest::Client,
    server: &ServerProcess,
    text: &str,
    output_subwords: usize,
) -> Result<()> {
    let body = json!({"text": text, "target_length": output_subwords, "length_mode": "exact"});
    let response = server.api(client.clone()).post_translate(&body).await?;
    let status = response.status();
    if !status.is_success() {
        bail!("{status}: {}", response.text().await.unwrap_or_default());
    }
    Ok(())
}

/// The position family of a package, in words: what its encoder's memory depends on.
fn positions(manifest: &Manifest) -> String {
    let c = &manifest.config;
    let mut parts = vec![format!("{} (preset)", c.preset)];
    parts.push(format!("absolute {:?}", c.absolute_position).to_lowercase());
    parts.push(format!("relative {:?}", c.relative_attention).to_lowercase());
    parts.push(format!("recurrent {:?}", c.recurrent_position).to_lowercase());
    parts.push(format!("d_model {}, {} heads", c.d_model, c.num_heads));
    parts.join(", ")
}
