//! `nmt-bench beside-large`: how small requests fare beside one client of large ones.
//!
//! A request of 64 texts (within every limit) is larger than the server's 32-row batch. While
//! the scheduler admitted whole jobs, such a request ran alone once the batch had drained, and
//! everyone behind it waited for all of it: 16 clients sending one verse each fell from 40.6 to
//! 9.0 requests/s (p99 1.4 s to 4.6 s) while one client sent such requests. Now texts, not
//! jobs, join the running batch as rows free up (docs/serving.md, "Large requests share the
//! batch"). This measures it against one server (started here, or `--url`), in two phases of
//! closed-loop load:
//!
//! - A, small alone: `--small-clients` clients, each request one verse;
//! - B, beside large: the same clients, plus one client whose every request is a list of
//!   `--large-texts` verses.
//!
//! It reports both phases, and the small clients' throughput and latency in B over A.

pub mod report;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, ensure, Result};
use indicatif::{MultiProgress, ProgressBar};
use serde::Serialize;

use self::report::BesideLargeReport;
use crate::cli::CommonArgs;
use crate::load::{cell_bar, client_runtime, http_client, run_cell, Cell, CellRun};
use crate::overload::report::{load_average, ms};
use crate::overload::{bodies_with, setting, RequestFields};
use crate::report::emit;
use crate::single_server::{RunHeader, RunNames, ServerSource, SingleServerArgs};
use crate::stats::{summarize, CellSummary};

/// Fairness between small requests and one client of large ones: runs `--small-clients`
/// closed-loop clients of one verse per request alone (phase A), then the same clients beside
/// one closed-loop client whose every request holds `--large-texts` verses (phase B), each
/// phase `--warmup-seconds` plus `--seconds` against one server (started here, or `--url`).
/// Reports the small clients' requests/s, p50/p90/p99 latency and errors, the large client's
/// requests, texts/s and latency, and the small clients' requests/s and p99 in B over A.
#[derive(Debug, clap::Args)]
pub struct BesideLargeArgs {
    /// Closed-loop clients of small requests, in both phases: each sends one verse per request
    /// (`{"text": "VERSE"}`), verses round-robin from the first through one shared index.
    #[arg(long, env = "NMT_BENCH_SMALL_CLIENTS", default_value_t = 16)]
    small_clients: usize,

    /// Verses in every request of the large client of phase B, sent as a list
    /// (`{"text": ["VERSE", ...]}`): consecutive verses, wrapping around at the end of the
    /// inputs. The server answers more than its `--max-texts-per-request` (default 64) with
    /// 413: a count over that limit, as read from the server arguments (or
    /// NMT_MAX_TEXTS_PER_REQUEST), is refused before anything runs; raise it with
    /// `-- --max-texts-per-request N`.
    #[arg(long, env = "NMT_BENCH_LARGE_TEXTS", default_value_t = 64)]
    large_texts: usize,

    /// Measured seconds per phase.
    #[arg(long, env = "NMT_BENCH_BESIDE_LARGE_SECONDS", default_value_t = 20.0)]
    seconds: f64,

    /// Seconds of each phase's load before its measured window (sent, not measured).
    #[arg(
        long,
        env = "NMT_BENCH_BESIDE_LARGE_WARMUP_SECONDS",
        default_value_t = 3.0
    )]
    warmup_seconds: f64,

    #[command(flatten)]
    server: SingleServerArgs,

    #[command(flatten)]
    common: CommonArgs,

    /// Also write the results as JSON here (both phases' numbers, errors by kind, the ratios,
    /// and how the run was made).
    #[arg(long, env = "NMT_BENCH_BESIDE_LARGE_OUT_JSON")]
    out_json: Option<PathBuf>,

    /// Also write a markdown report here: date, CPU, command line, server arguments, nproc,
    /// model, the table and the ratios.
    #[arg(long, env = "NMT_BENCH_BESIDE_LARGE_OUT_MD")]
    out_md: Option<PathBuf>,
}

/// The server's default `--max-texts-per-request`.
const SERVER_MAX_TEXTS_PER_REQUEST: usize = 64;

/// The server's `--max-texts-per-request`, read from its arguments and environment the way
/// it reads them.
fn max_texts_per_request(args: &[String], env: &dyn Fn(&str) -> Option<String>) -> Result<usize> {
    match setting(args, "--max-texts-per-request", env) {
        Some(v) => match v.trim().parse::<usize>() {
            Ok(n) if n > 0 => Ok(n),
            _ => bail!(
                "--max-texts-per-request `{v}` in the server arguments is not a positive number"
            ),
        },
        None => Ok(SERVER_MAX_TEXTS_PER_REQUEST),
    }
}

/// The large client's bodies: `{"text": [n verses]}` plus `fields`. Body k holds verses
/// k·n .. k·n + n − 1, wrapping around at the end of the inputs; there are ⌈len / n⌉ of them,
/// so every input is sent once before the client starts over from the first body.
fn large_bodies(verses: &[String], n: usize, fields: Option<&RequestFields>) -> Arc<Vec<String>> {
    assert!(n > 0 && !verses.is_empty(), "no texts to group");
    Arc::new(
        (0..verses.len().div_ceil(n))
            .map(|k| {
                let texts: Vec<serde_json::Value> = (0..n)
                    .map(|j| verses[(k * n + j) % verses.len()].as_str().into())
                    .collect();
                let text = serde_json::Value::Array(texts);
                match fields {
                    Some(f) => f.body(text),
                    None => serde_json::json!({ "text": text }).to_string(),
                }
            })
            .collect(),
    )
}

/// The large client of phase B.
#[derive(Debug, Clone, Serialize)]
pub struct LargeClient {
    /// Texts in each of its requests.
    pub texts_per_request: usize,
    /// Texts of its answered requests per measured second.
    pub texts_per_second: f64,
    /// Its requests, as a closed-loop cell of one client.
    pub summary: CellSummary,
}

impl LargeClient {
    pub fn new(summary: CellSummary, texts_per_request: usize) -> Self {
        let secs = summary.wall_seconds;
        let texts = (summary.requests as usize * texts_per_request) as f64;
        LargeClient {
            texts_per_request,
            texts_per_second: if secs > 0.0 { texts / secs } else { 0.0 },
            summary,
        }
    }
}

/// One phase's numbers.
#[derive(Debug, Clone, Serialize)]
pub struct Phase {
    /// `small alone` (A) or `beside large` (B).
    pub phase: String,
    /// The small clients, as one closed-loop cell.
    pub small: CellSummary,
    /// Phase B's large client.
    pub large: Option<LargeClient>,
    /// The machine's 1-minute load average when the phase was over. Server and clients
    /// account for up to about 2 of it; more says something else wanted the CPU too.
    pub load_average: Option<f64>,
}

/// The small clients beside the large one (B) over alone (A).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Comparison {
    /// Requests/s, B over A: 1 when the large client takes nothing from them.
    pub requests_per_second: Option<f64>,
    /// p50 latency, B over A.
    pub p50: Option<f64>,
    /// p99 latency, B over A.
    pub p99: Option<f64>,
}

/// `beside / alone`, where both exist and `alone` is positive.
fn ratio(alone: Option<f64>, beside: Option<f64>) -> Option<f64> {
    match (alone, beside) {
        (Some(a), Some(b)) if a > 0.0 => Some(b / a),
        _ => None,
    }
}

/// The small clients of phase B over those of phase A.
pub fn compare(alone: &CellSummary, beside: &CellSummary) -> Comparison {
    Comparison {
        requests_per_second: ratio(
            Some(alone.requests_per_second),
            Some(beside.requests_per_second),
        ),
        p50: ratio(alone.p50_ms, beside.p50_ms),
        p99: ratio(alone.p99_ms, beside.p99_ms),
    }
}

/// Phase names, in the report and the JSON.
pub const ALONE: &str = "small alone";
pub const BESIDE: &str = "beside large";

/// What both phases send.
struct Load<'a> {
    base_url: &'a str,
    mode: &'a str,
    small_clients: usize,
    small: &'a Arc<Vec<String>>,
    large_texts: usize,
    large: &'a Arc<Vec<String>>,
    warmup: Duration,
    measure: Duration,
    request_timeout: Duration,
}

impl Load<'_> {
    /// One closed-loop cell of the phase: `clients` clients sending `bodies` over the phase's
    /// warm-up and measured window.
    async fn run_clients(
        &self,
        client: &reqwest::Client,
        bodies: &Arc<Vec<String>>,
        clients: usize,
        bar: &ProgressBar,
    ) -> CellRun {
        let cell = Cell {
            clients,
            warmup: self.warmup,
            measure: self.measure,
            request_timeout: self.request_timeout,
        };
        run_cell(client, self.base_url, Arc::clone(bodies), &cell, bar).await
    }
}

/// Runs one phase: the small clients, and in phase B (`with_large`) the large client beside
/// them, both starting together and measured over the same window. Returns the phase and
/// the model name the server reported.
async fn run_phase(
    client: &reqwest::Client,
    load: &Load<'_>,
    with_large: bool,
) -> (Phase, Option<String>) {
    let name = if with_large { BESIDE } else { ALONE };
    let bars = MultiProgress::new();
    let small_bar = bars.add(cell_bar(name, load.small_clients));
    let small_run = load.run_clients(client, load.small, load.small_clients, &small_bar);
    let (small_run, large_run): (CellRun, Option<(CellRun, ProgressBar)>) = if with_large {
        let large_bar = bars.add(cell_bar("large", 1));
        large_bar.set_prefix(format!("large client, {} texts", load.large_texts));
        let large_run = load.run_clients(client, load.large, 1, &large_bar);
        let (s, l) = tokio::join!(small_run, large_run);
        (s, Some((l, large_bar)))
    } else {
        (small_run.await, None)
    };
    let small = summarize(
        load.mode,
        load.small_clients,
        &small_run.samples,
        small_run.wall,
    );
    let line = format!(
        "{} req, {} err, {:.2} req/s, p50 {} ms, p99 {} ms",
        small.requests,
        small.errors,
        small.requests_per_second,
        ms(small.p50_ms),
        ms(small.p99_ms),
    );
    if small_bar.is_hidden() {
        eprintln!("{name}, {} small clients: {line}", load.small_clients);
    }
    small_bar.finish_with_message(line);
    let mut model = small_run.model;
    let large = large_run.map(|(run, bar)| {
        let large = large_client(name, load, &run, &bar);
        model = model.take().or(run.model);
        large
    });
    let phase = Phase {
        phase: name.to_string(),
        small,
        large,
        load_average: load_average(),
    };
    (phase, model)
}

/// The large client's numbers in phase `name`, also said on its bar (or on stderr without
/// one).
fn large_client(name: &str, load: &Load<'_>, run: &CellRun, bar: &ProgressBar) -> LargeClient {
    let l = LargeClient::new(
        summarize(load.mode, 1, &run.samples, run.wall),
        load.large_texts,
    );
    let line = format!(
        "{} req, {} err, {:.1} texts/s, p50 {} ms, p99 {} ms",
        l.summary.requests,
        l.summary.errors,
        l.texts_per_second,
        ms(l.summary.p50_ms),
        ms(l.summary.p99_ms),
    );
    if bar.is_hidden() {
        eprintln!("{name}, large client ({} texts): {line}", load.large_texts);
    }
    bar.finish_with_message(line);
    l
}

/// How `beside-large` names itself and what it measures, in what it says on stderr.
const NAMES: RunNames = RunNames {
    command: "beside-large",
    parts: "phases",
};

/// Runs both phases; `Ok(false)` when it could not finish (the report of what ran is still
/// written).
pub fn run(args: BesideLargeArgs) -> Result<bool> {
    ensure!(args.small_clients > 0, "--small-clients must be positive");
    ensure!(args.large_texts > 0, "--large-texts must be positive");
    let durations = args.common.durations(args.seconds, args.warmup_seconds)?;
    let env = |k: &str| std::env::var(k).ok();
    let limit = max_texts_per_request(&args.common.extra_server_args(), &env)?;
    ensure!(
        args.large_texts <= limit,
        "--large-texts {} is over the server's --max-texts-per-request {limit}, which answers \
         such requests 413; give the server a higher limit (`-- --max-texts-per-request {}`)",
        args.large_texts,
        args.large_texts
    );

    let verses = crate::verses::load(&args.common.verses)?;
    let fields = args.server.request_fields.as_ref();
    let small = bodies_with(&verses, fields);
    let large = large_bodies(&verses, args.large_texts, fields);
    let log_name = format!("beside-large-{}", args.server.mode);
    let source = ServerSource::new(&args.server, &args.common, &durations, &log_name)?;

    let runtime = client_runtime(args.common.client_threads)?;
    let client = http_client((args.small_clients + 1).max(8), Duration::from_secs(120))?;
    announce(&args, verses.len());

    let mut alone: Option<Phase> = None;
    let mut beside: Option<Phase> = None;
    let mut model: Option<String> = None;
    let finished = source.with_server(&runtime, &client, &NAMES, async |base_url, server| {
        let load = Load {
            base_url,
            mode: &args.server.mode,
            small_clients: args.small_clients,
            small: &small,
            large_texts: args.large_texts,
            large: &large,
            warmup: durations.warmup,
            measure: durations.measure,
            request_timeout: durations.request_timeout,
        };
        let (a, m) = run_phase(&client, &load, false).await;
        alone = Some(a);
        model = model.take().or(m);
        server.check_alive()?;
        let (b, m) = run_phase(&client, &load, true).await;
        beside = Some(b);
        model = model.take().or(m);
        server.check_alive()
    });

    let comparison = match (&alone, &beside) {
        (Some(a), Some(b)) => Some(compare(&a.small, &b.small)),
        _ => None,
    };
    let report = BesideLargeReport {
        header: RunHeader::now(&args.common, &source, model),
        verses_file: args.common.verses.display().to_string(),
        verses: verses.len(),
        request_fields: fields.map(RequestFields::to_json),
        small_clients: args.small_clients,
        large_texts: args.large_texts,
        warmup_seconds: args.warmup_seconds,
        seconds: args.seconds,
        client_timeout_seconds: args.common.request_timeout_seconds,
        phases: alone.into_iter().chain(beside).collect(),
        comparison,
    };
    emit(&report, args.out_md.as_deref(), args.out_json.as_deref())?;
    Ok(finished)
}

/// Says on stderr what the run will do.
fn announce(args: &BesideLargeArgs, inputs: usize) {
    eprintln!(
        "nmt-bench beside-large: {} inputs from {}; {} small clients (one verse per request), \
         alone and then beside one client of {} verses per request; {} s warm-up + {} s per phase",
        inputs,
        args.common.verses.display(),
        args.small_clients,
        args.large_texts,
        args.warmup_seconds,
        args.seconds,
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::overload::parse_fields;
    use crate::stats::{Outcome, Sample};

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    fn body(s: &str) -> serde_json::Value {
        serde_json::from_str(s).unwrap()
    }

    #[test]
    fn large_bodies_are_lists_of_consecutive_verses_wrapping_around() {
        let verses = strings(&["a", "b", "c", "d", "e"]);
        let bodies = large_bodies(&verses, 2, None);
        let texts: Vec<serde_json::Value> = bodies.iter().map(|b| body(b)).collect();
        assert_eq!(
            texts,
            [
                serde_json::json!({"text": ["a", "b"]}),
                serde_json::json!({"text": ["c", "d"]}),
                serde_json::json!({"text": ["e", "a"]}),
            ]
        );
        // More texts per request than inputs: one body, the inputs over and over.
        let bodies = large_bodies(&verses[..2], 5, None);
        assert_eq!(
            body(&bodies[0]),
            serde_json::json!({"text": ["a", "b", "a", "b", "a"]})
        );
        assert_eq!(bodies.len(), 1);
        // Request fields go beside the list.
        let f = parse_fields(r#"{"target_length":"source"}"#).unwrap();
        let bodies = large_bodies(&verses, 5, Some(&f));
        assert_eq!(
            body(&bodies[0]),
            serde_json::json!({"text": ["a", "b", "c", "d", "e"], "target_length": "source"})
        );
    }

    #[test]
    fn the_text_limit_is_read_as_the_server_reads_it() {
        let no_env = |_: &str| None;
        assert_eq!(max_texts_per_request(&[], &no_env).unwrap(), 64);
        let args = strings(&["--max-texts-per-request", "128"]);
        assert_eq!(max_texts_per_request(&args, &no_env).unwrap(), 128);
        let env = |k: &str| (k == "NMT_MAX_TEXTS_PER_REQUEST").then(|| "8".to_string());
        assert_eq!(max_texts_per_request(&[], &env).unwrap(), 8);
        let args = strings(&["--max-texts-per-request=0"]);
        assert!(max_texts_per_request(&args, &no_env).is_err());
    }

    fn cell(ms: &[u64], wall_seconds: u64) -> CellSummary {
        let samples: Vec<Sample> = ms
            .iter()
            .map(|&m| Sample {
                latency: Duration::from_millis(m),
                outcome: Outcome::Ok { output_tokens: 10 },
            })
            .collect();
        summarize(
            "continuous",
            16,
            &samples,
            Duration::from_secs(wall_seconds),
        )
    }

    #[test]
    fn small_clients_beside_large_over_alone() {
        // Alone: 4 req/s, p50 100, p99 400. Beside: 3 req/s, p50 150, p99 1000.
        let alone = cell(&[100, 100, 300, 400], 1);
        let beside = cell(&[150, 150, 1000], 1);
        let c = compare(&alone, &beside);
        assert_eq!(
            c,
            Comparison {
                requests_per_second: Some(0.75),
                p50: Some(1.5),
                p99: Some(2.5),
            }
        );
        // Nothing answered alone: no ratio.
        let c = compare(&cell(&[], 1), &beside);
        assert_eq!((c.requests_per_second, c.p50, c.p99), (None, None, None));
        // Nothing answered beside: 0 req/s, no latency ratio.
        let c = compare(&alone, &cell(&[], 1));
        assert_eq!((c.requests_per_second, c.p99), (Some(0.0), None));
    }

    #[test]
    fn large_client_texts_per_second() {
        let l = LargeClient::new(cell(&[2000, 2000, 2500], 2), 64);
        assert_eq!(l.texts_per_second, 96.0);
        assert_eq!(l.texts_per_request, 64);
        assert_eq!(LargeClient::new(cell(&[], 0), 64).texts_per_second, 0.0);
    }

    #[test]
    fn beside_large_arguments() {
        use clap::Parser;
        let a = crate::cli::Args::try_parse_from(["nmt-bench", "beside-large"]).unwrap();
        let Some(crate::cli::Command::BesideLarge(a)) = a.command else {
            panic!("no beside-large command");
        };
        assert_eq!((a.small_clients, a.large_texts), (16, 64));
        assert_eq!((a.seconds, a.warmup_seconds), (20.0, 3.0));
        assert_eq!(a.server.mode, "continuous");
        assert!(a.server.url.is_none() && a.server.request_fields.is_none());
        let a = crate::cli::Args::try_parse_from([
            "nmt-bench",
            "beside-large",
            "--small-clients",
            "4",
            "--large-texts",
            "16",
            "--request-fields",
            r#"{"target_length":"source"}"#,
            "--",
            "--max-texts-per-request",
            "16",
        ])
        .unwrap();
        let Some(crate::cli::Command::BesideLarge(a)) = a.command else {
            panic!("no beside-large command");
        };
        assert_eq!((a.small_clients, a.large_texts), (4, 16));
        assert!(a.server.request_fields.is_some());
        assert_eq!(
            a.common.server_args_trailing,
            ["--max-texts-per-request", "16"]
        );
    }
}
