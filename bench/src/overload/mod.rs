//! `nmt-bench overload`: open-loop request rates against one server, to see what its
//! admission control makes of more work than it can do.
//!
//! The closed-loop benchmark cannot overload a server: its clients wait for each answer, so
//! the load falls as latency rises. Real users do not wait for each other. Here requests
//! arrive on a schedule (Poisson or evenly spaced) whatever is outstanding, for each rate in
//! `--rates`. A rate is requests per second, or `Nx`: N times the sustainable rate, which a
//! calibration measures first as closed-loop throughput with the batch full (one client per
//! batch row), beside the unloaded p99 latency (one client). Then the issue's goal is judged
//! at 10x: the requests the server accepts are answered within twice the unloaded p99 plus
//! the wait its admission control aims at (`--max-queue-wait`), and none of them times out.

pub mod driver;
pub mod report;
pub mod schedule;
pub mod storm;
pub mod summary;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};

use self::report::{Calibration, OverloadReport};
use self::schedule::{arrival_offsets, Arrivals, Rate};
use self::summary::{goal_checks, summarize, RateRun, RateSummary};
use crate::cli::{secs, CommonArgs};
use crate::load::{cell_bar, client_runtime, http_client, request_bodies, run_cell, Cell};
use crate::report::emit;
use crate::single_server::{RunHeader, RunNames, ServerSource, SingleServerArgs, StartedServer};
use crate::stats::CellSummary;
use nmt_engine::limits::BatchRows;

/// Open-loop overload: offers each of `--rates` to one server (started here, or `--url`) for
/// `--seconds`, requests sent on schedule however many are outstanding, and reports the
/// share accepted, the share shed with 429 (and their Retry-After), timeouts after
/// acceptance, accepted latency and goodput per rate, with the issue's goal judged at 10x.
#[derive(Debug, clap::Args)]
pub struct OverloadArgs {
    /// Request rates, comma-separated: requests per second (`40`), or multiples of the
    /// sustainable rate (`2x`) that the calibration measures.
    #[arg(
        long,
        env = "NMT_BENCH_RATES",
        value_delimiter = ',',
        default_value = "1x,2x,10x"
    )]
    rates: Vec<Rate>,

    /// How arrivals are spaced: `poisson` (exponential gaps, the bursts of independent users)
    /// or `fixed` (exactly 1/rate apart).
    #[arg(long, env = "NMT_BENCH_ARRIVALS", value_enum, default_value_t = Arrivals::Poisson)]
    arrivals: Arrivals,

    /// Seed of the Poisson schedules; the k-th rate (from 0) uses seed + k.
    #[arg(long, env = "NMT_BENCH_SEED", default_value_t = 1)]
    seed: u64,

    /// Measured seconds per rate.
    #[arg(long, env = "NMT_BENCH_OVERLOAD_SECONDS", default_value_t = 25.0)]
    seconds: f64,

    /// Seconds of arrivals before each rate's measured window, at the same rate (sent, not
    /// measured): the queue fills to where the rate keeps it before anything is counted.
    #[arg(long, env = "NMT_BENCH_OVERLOAD_WARMUP_SECONDS", default_value_t = 3.0)]
    warmup_seconds: f64,

    /// Measured seconds of each calibration cell (one client, then the saturating clients),
    /// each after `--warmup-seconds` of the same load.
    #[arg(long, env = "NMT_BENCH_CALIBRATE_SECONDS", default_value_t = 10.0)]
    calibrate_seconds: f64,

    /// Closed-loop clients whose throughput is the sustainable rate. Default: the server's
    /// `--max-batch-size` (from the server arguments, else its default, `auto`, for the
    /// package's precision): one request in
    /// flight per batch row keeps the batch full, which is where throughput stops growing with
    /// clients (docs/benchmarks/batching.md), while nothing waits beyond it.
    #[arg(long, env = "NMT_BENCH_SATURATION_CLIENTS")]
    saturation_clients: Option<usize>,

    /// The server's `--max-queue-wait` in seconds, for the goal. Default: read from the server
    /// arguments as the server reads them (`--max-queue-wait`, else half of
    /// `--request-timeout`; then NMT_MAX_QUEUE_WAIT, NMT_REQUEST_TIMEOUT; else 15 s).
    #[arg(long, env = "NMT_BENCH_TARGET_WAIT")]
    target_wait: Option<f64>,

    #[command(flatten)]
    server: SingleServerArgs,

    #[command(flatten)]
    common: CommonArgs,

    /// Also write the results as JSON here (calibration, every rate's numbers, errors by
    /// kind, the goal, and how the run was made).
    #[arg(long, env = "NMT_BENCH_OVERLOAD_OUT_JSON")]
    out_json: Option<PathBuf>,

    /// Also write a markdown report here: date, CPU, command line, server arguments, nproc,
    /// calibration, the tables and the goal.
    #[arg(long, env = "NMT_BENCH_OVERLOAD_OUT_MD")]
    out_md: Option<PathBuf>,
}

/// Extra fields of every request body.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestFields(serde_json::Map<String, serde_json::Value>);

impl RequestFields {
    /// A request body: `text` (one text or a list) beside these fields.
    pub fn body(&self, text: serde_json::Value) -> String {
        let mut body = self.0.clone();
        body.insert("text".into(), text);
        serde_json::Value::Object(body).to_string()
    }

    /// The fields as one JSON object (for reports).
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::Value::Object(self.0.clone())
    }
}

/// `--request-fields`: a JSON object without `text`.
pub fn parse_fields(s: &str) -> Result<RequestFields, String> {
    match serde_json::from_str::<serde_json::Value>(s) {
        Ok(serde_json::Value::Object(map)) if map.contains_key("text") => {
            Err("`text` is the verse; give the other fields".into())
        }
        Ok(serde_json::Value::Object(map)) => Ok(RequestFields(map)),
        Ok(_) => Err("not a JSON object".into()),
        Err(e) => Err(format!("not JSON: {e}")),
    }
}

/// One body per verse: `{"text": verse}` plus `fields`.
pub fn bodies_with(verses: &[String], fields: Option<&RequestFields>) -> Arc<Vec<String>> {
    let Some(fields) = fields else {
        return request_bodies(verses);
    };
    Arc::new(
        verses
            .iter()
            .map(|v| fields.body(serde_json::Value::from(v.as_str())))
            .collect(),
    )
}

/// The server's default `--request-timeout`, whose half is its default `--max-queue-wait`.
const SERVER_REQUEST_TIMEOUT: f64 = 30.0;

/// The value of `flag` in a server argument list, as `--flag VALUE` or `--flag=VALUE`.
fn flag_value<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == flag {
            return it.next().map(String::as_str);
        }
        if let Some(v) = a.strip_prefix(flag).and_then(|r| r.strip_prefix('=')) {
            return Some(v);
        }
    }
    None
}

/// A setting as the server would see it: its flag in `args`, else its environment variable.
pub fn setting(
    args: &[String],
    flag: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Option<String> {
    let var = format!(
        "NMT_{}",
        flag.trim_start_matches('-')
            .replace('-', "_")
            .to_uppercase()
    );
    flag_value(args, flag)
        .map(str::to_string)
        .or_else(|| env(&var))
}

/// The server's `--max-queue-wait` in seconds, read from its arguments and environment the
/// way it reads them, and where it came from.
fn target_wait(args: &[String], env: &dyn Fn(&str) -> Option<String>) -> Result<(f64, String)> {
    let number = |v: String, what: &str| -> Result<f64> {
        match v.trim().parse::<f64>() {
            Ok(x) if x.is_finite() && x > 0.0 => Ok(x),
            _ => bail!("{what} `{v}` in the server arguments is not a positive number"),
        }
    };
    if let Some(v) = setting(args, "--max-queue-wait", env) {
        return Ok((
            number(v, "--max-queue-wait")?,
            "the server's --max-queue-wait".into(),
        ));
    }
    match setting(args, "--request-timeout", env) {
        Some(v) => {
            let t = number(v, "--request-timeout")?;
            Ok((
                t / 2.0,
                format!("half of the server's --request-timeout {t} s"),
            ))
        }
        None => Ok((
            SERVER_REQUEST_TIMEOUT / 2.0,
            format!("the server's default: half of --request-timeout {SERVER_REQUEST_TIMEOUT} s"),
        )),
    }
}

/// How many closed-loop clients measure the sustainable rate, and why.
fn saturation_clients(
    given: Option<usize>,
    model_dir: &Path,
    args: &[String],
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<(usize, String)> {
    if let Some(n) = given {
        return Ok((n, "--saturation-clients".into()));
    }
    let rows: BatchRows = match setting(args, "--max-batch-size", env) {
        Some(v) => v
            .parse()
            .map_err(|e| anyhow::anyhow!("--max-batch-size in the server arguments: {e}"))?,
        None => BatchRows::Auto,
    };
    let rows = match rows {
        BatchRows::Most(rows) => rows,
        // `auto` goes by the precision of the package the bench serves.
        BatchRows::Auto => {
            let manifest = model_package::Manifest::load(model_dir).with_context(|| {
                format!("--max-batch-size auto: reading {}", model_dir.display())
            })?;
            rows.rows(manifest.precision)
        }
    };
    Ok((
        rows,
        format!("one per batch row, --max-batch-size {rows}: the batch is full and nothing waits beyond it"),
    ))
}

/// What the run takes from the server's settings (its arguments and environment) unless
/// given: the goal's target wait and the calibration's clients, each with where it came from.
struct ServerSettings {
    target_wait_seconds: f64,
    target_wait_source: String,
    saturation_clients: usize,
    saturation_clients_rule: String,
}

/// This run's [`ServerSettings`]: the arguments that give them, else the server's.
fn server_settings(args: &OverloadArgs) -> Result<ServerSettings> {
    let env = |k: &str| std::env::var(k).ok();
    let extra = args.common.extra_server_args();
    let (target_wait_seconds, target_wait_source) = match args.target_wait {
        Some(w) => (w, "--target-wait".to_string()),
        None => target_wait(&extra, &env)?,
    };
    let (saturation_clients, saturation_clients_rule) = saturation_clients(
        args.saturation_clients,
        &args.common.model_dir,
        &extra,
        &env,
    )?;
    Ok(ServerSettings {
        target_wait_seconds,
        target_wait_source,
        saturation_clients,
        saturation_clients_rule,
    })
}

/// What the run measured, as far as it got.
#[derive(Default)]
struct Measured {
    calibration: Option<Calibration>,
    rates: Vec<RateSummary>,
    /// The model name the server reported.
    model: Option<String>,
}

/// How `overload` names itself and what it measures, in what it says on stderr.
const NAMES: RunNames = RunNames {
    command: "overload",
    parts: "rates",
};

/// Runs the overload benchmark; `Ok(false)` when it could not finish (the report of what
/// ran is still written).
pub fn run(args: OverloadArgs) -> Result<bool> {
    ensure!(!args.rates.is_empty(), "--rates is empty");
    let durations = args.common.durations(args.seconds, args.warmup_seconds)?;
    ensure!(
        args.calibrate_seconds > 0.0,
        "--calibrate-seconds must be positive"
    );
    ensure!(
        args.saturation_clients != Some(0),
        "--saturation-clients must be positive"
    );
    if let Some(w) = args.target_wait {
        ensure!(w.is_finite() && w > 0.0, "--target-wait must be positive");
    }
    let calibrate = secs(args.calibrate_seconds, "--calibrate-seconds")?;
    let settings = server_settings(&args)?;

    let verses = crate::verses::load(&args.common.verses)?;
    let fields = args.server.request_fields.as_ref();
    let bodies = bodies_with(&verses, fields);
    let source = ServerSource::new(&args.server, &args.common, &durations, &args.server.mode)?;

    let runtime = client_runtime(args.common.client_threads)?;
    // Open loop at 10x keeps hundreds of requests outstanding, each on its own connection;
    // kept idle afterwards they are reused instead of reopened at the next burst.
    let client = http_client(4096, Duration::from_secs(60))?;

    announce(&args, verses.len(), &settings);
    let setup = Setup {
        args: &args,
        settings: &settings,
        warmup: durations.warmup,
        measure: durations.measure,
        calibrate,
        request_timeout: durations.request_timeout,
    };
    let mut measured = Measured::default();
    let finished = source.with_server(&runtime, &client, &NAMES, async |base_url, server| {
        let target = Target {
            client: &client,
            base_url,
            bodies: &bodies,
            mode: &args.server.mode,
        };
        measure(&target, &setup, &mut measured, server).await
    });

    let unloaded_p99 = measured
        .calibration
        .as_ref()
        .and_then(|c| c.unloaded_p99_ms);
    let goal = match unloaded_p99 {
        Some(u) => goal_checks(&measured.rates, u, settings.target_wait_seconds),
        None => Vec::new(),
    };
    let report = OverloadReport {
        header: RunHeader::now(&args.common, &source, measured.model),
        verses_file: args.common.verses.display().to_string(),
        verses: verses.len(),
        request_fields: fields.map(RequestFields::to_json),
        arrivals: args.arrivals,
        seed: args.seed,
        warmup_seconds: args.warmup_seconds,
        seconds: args.seconds,
        client_timeout_seconds: args.common.request_timeout_seconds,
        target_wait_seconds: settings.target_wait_seconds,
        target_wait_source: settings.target_wait_source,
        calibration: measured.calibration,
        rates: measured.rates,
        goal,
    };
    emit(&report, args.out_md.as_deref(), args.out_json.as_deref())?;
    Ok(finished)
}

/// Says on stderr what the run will do.
fn announce(args: &OverloadArgs, inputs: usize, settings: &ServerSettings) {
    eprintln!(
        "nmt-bench overload: {} inputs from {}; rates {}; {:?} arrivals; {} s warm-up + {} s per rate; \
         calibration {} s + {} s at 1 and {} clients; target wait {} s ({})",
        inputs,
        args.common.verses.display(),
        args.rates
            .iter()
            .map(Rate::to_string)
            .collect::<Vec<_>>()
            .join(", "),
        args.arrivals,
        args.warmup_seconds,
        args.seconds,
        args.warmup_seconds,
        args.calibrate_seconds,
        settings.saturation_clients,
        settings.target_wait_seconds,
        settings.target_wait_source,
    );
}

/// The calibration, then every rate, into `measured` as each finishes (what ran before a
/// failure is still reported); the started server is checked after each.
async fn measure(
    target: &Target<'_>,
    setup: &Setup<'_>,
    measured: &mut Measured,
    server: &mut StartedServer,
) -> Result<()> {
    let c = run_calibration(target, setup, &mut measured.model, server).await?;
    let known = (c.sustainable_per_second > 0.0).then_some(c.sustainable_per_second);
    measured.calibration = Some(c);
    for (i, &rate) in setup.args.rates.iter().enumerate() {
        let seed = setup.args.seed.wrapping_add(i as u64);
        let (s, m) = run_rate(target, setup, rate, known, seed).await?;
        measured.model = measured.model.take().or(m);
        measured.rates.push(s);
        server.check_alive()?;
    }
    Ok(())
}

/// The server the requests go to, and what they carry.
struct Target<'a> {
    client: &'a reqwest::Client,
    base_url: &'a str,
    bodies: &'a Arc<Vec<String>>,
    /// The batching mode, for the calibration cells' summaries.
    mode: &'a str,
}

/// What the measurements follow: the arguments, the server's settings, and how long each
/// part of the run lasts.
struct Setup<'a> {
    args: &'a OverloadArgs,
    settings: &'a ServerSettings,
    /// Load before each measured window, at the same rate (sent, not measured).
    warmup: Duration,
    /// Measured window of each rate.
    measure: Duration,
    /// Measured window of each calibration cell.
    calibrate: Duration,
    /// The bench's own per-request timeout.
    request_timeout: Duration,
}

/// The calibration: one closed-loop client (the unloaded p99), then the saturation clients,
/// whose throughput is the sustainable rate. The model name the server reported goes into
/// `model` after each cell, and the started server is checked after each, so that what ran
/// before a failure is still reported.
async fn run_calibration(
    target: &Target<'_>,
    setup: &Setup<'_>,
    model: &mut Option<String>,
    server: &mut StartedServer,
) -> Result<Calibration> {
    let closed = |clients: usize| Cell {
        clients,
        warmup: setup.warmup,
        measure: setup.calibrate,
        request_timeout: setup.request_timeout,
    };
    let (unloaded, m) = closed_cell(target, &closed(1)).await;
    *model = model.take().or(m);
    server.check_alive()?;
    let sat_clients = setup.settings.saturation_clients;
    let (saturation, m) = closed_cell(target, &closed(sat_clients)).await;
    *model = model.take().or(m);
    server.check_alive()?;
    let sustainable = saturation.requests_per_second;
    Ok(Calibration {
        warmup_seconds: setup.args.warmup_seconds,
        seconds: setup.args.calibrate_seconds,
        unloaded_p99_ms: unloaded.p99_ms,
        unloaded,
        saturation,
        saturation_clients: sat_clients,
        saturation_clients_rule: setup.settings.saturation_clients_rule.clone(),
        sustainable_per_second: sustainable,
    })
}

/// One rate, open loop: arrivals on schedule (`seed` for Poisson) over the warm-up and the
/// measured window, every request followed to its end. `known` is the sustainable rate
/// (requests/s) that `Nx` multiplies, when the calibration found one. Returns the rate's
/// summary and the model name the server reported.
async fn run_rate(
    target: &Target<'_>,
    setup: &Setup<'_>,
    rate: Rate,
    known: Option<f64>,
    seed: u64,
) -> Result<(RateSummary, Option<String>)> {
    let Some(per_second) = rate.per_second(known) else {
        bail!("{rate}: the calibration answered no request, so there is no sustainable rate to multiply");
    };
    let (warmup, span) = (setup.warmup, setup.warmup + setup.measure);
    let offsets = arrival_offsets(setup.args.arrivals, per_second, span, seed);
    let bar = cell_bar(&rate.to_string(), offsets.len());
    bar.set_prefix(format!("{rate} ({per_second:.1} req/s)"));
    let plan = driver::Plan {
        offsets: &offsets,
        warmup,
        span,
        request_timeout: setup.request_timeout,
    };
    let run = driver::run_open(
        target.client,
        target.base_url,
        Arc::clone(target.bodies),
        plan,
        &bar,
    )
    .await;
    let multiple = match rate {
        Rate::Multiple(m) => Some(m),
        Rate::PerSecond(r) => known.map(|s| r / s),
    };
    let mut s = summarize(&RateRun {
        rate: rate.to_string(),
        multiple,
        target_per_second: per_second,
        warmup,
        span,
        drain: run.drain,
        samples: &run.samples,
    });
    s.load_average = report::load_average();
    let line = format!(
        "offered {:.1} req/s: accepted {:.1}%, shed {:.1}%, {} timed out after acceptance, p99 {} ms, goodput {:.2} req/s",
        s.offered_per_second,
        s.accepted_share * 100.0,
        s.shed_share * 100.0,
        s.timed_out_after_acceptance,
        s.p99_ms.map_or("-".into(), |v| format!("{v:.0}")),
        s.goodput_per_second,
    );
    if bar.is_hidden() {
        eprintln!("{rate}: {line}");
    }
    bar.finish_with_message(line);
    Ok((s, run.model))
}

/// One closed-loop calibration cell: its summary and the model name the server reported.
async fn closed_cell(target: &Target<'_>, cell: &Cell) -> (CellSummary, Option<String>) {
    let bar = cell_bar("calibration", cell.clients);
    let bodies = Arc::clone(target.bodies);
    let run = run_cell(target.client, target.base_url, bodies, cell, &bar).await;
    let s = crate::stats::summarize(target.mode, cell.clients, &run.samples, run.wall);
    let line = format!(
        "{} req, {} err, {:.2} req/s, {:.0} tok/s, p50 {} ms, p99 {} ms",
        s.requests,
        s.errors,
        s.requests_per_second,
        s.tokens_per_second,
        s.p50_ms.map_or("-".into(), |v| format!("{v:.0}")),
        s.p99_ms.map_or("-".into(), |v| format!("{v:.0}")),
    );
    if bar.is_hidden() {
        eprintln!("calibration, {} clients: {line}", cell.clients);
    }
    bar.finish_with_message(line);
    (s, run.model)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    fn no_env(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn flag_values_in_both_spellings() {
        let a = strings(&["--intra-op-threads", "1", "--max-queue-wait=4.5", "--x"]);
        assert_eq!(flag_value(&a, "--max-queue-wait"), Some("4.5"));
        assert_eq!(flag_value(&a, "--intra-op-threads"), Some("1"));
        assert_eq!(flag_value(&a, "--x"), None);
        assert_eq!(flag_value(&a, "--max-queue"), None);
        assert_eq!(flag_value(&a, "--request-timeout"), None);
    }

    #[test]
    fn target_wait_as_the_server_reads_it() {
        let (w, src) = target_wait(&[], &no_env).unwrap();
        assert_eq!(w, 15.0);
        assert!(src.contains("default"), "{src}");
        let (w, _) = target_wait(&strings(&["--request-timeout", "9"]), &no_env).unwrap();
        assert_eq!(w, 4.5);
        let args = strings(&["--request-timeout", "9", "--max-queue-wait", "2"]);
        assert_eq!(target_wait(&args, &no_env).unwrap().0, 2.0);
        let env = |k: &str| (k == "NMT_MAX_QUEUE_WAIT").then(|| "3".to_string());
        assert_eq!(target_wait(&[], &env).unwrap().0, 3.0);
        // A flag wins over the environment, as in clap.
        assert_eq!(
            target_wait(&strings(&["--max-queue-wait=1"]), &env)
                .unwrap()
                .0,
            1.0
        );
        let env = |k: &str| (k == "NMT_REQUEST_TIMEOUT").then(|| "20".to_string());
        assert_eq!(target_wait(&[], &env).unwrap().0, 10.0);
        assert!(target_wait(&strings(&["--max-queue-wait", "soon"]), &no_env).is_err());
        assert!(target_wait(&strings(&["--max-queue-wait", "0"]), &no_env).is_err());
    }

    #[test]
    fn saturation_clients_are_the_batch_rows() {
        // `auto` with the shipped (float32) package.
        let shipped = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../models/en-es-l10n"));
        assert_eq!(
            saturation_clients(None, shipped, &[], &no_env).unwrap().0,
            32
        );
        assert!(saturation_clients(None, Path::new("/nowhere"), &[], &no_env).is_err());
        let args = strings(&["--max-batch-size", "16"]);
        let (n, rule) = saturation_clients(None, shipped, &args, &no_env).unwrap();
        assert_eq!(n, 16);
        assert!(rule.contains("--max-batch-size 16"), "{rule}");
        assert_eq!(
            saturation_clients(Some(5), shipped, &args, &no_env)
                .unwrap()
                .0,
            5
        );
        let env = |k: &str| (k == "NMT_MAX_BATCH_SIZE").then(|| "8".to_string());
        assert_eq!(saturation_clients(None, shipped, &[], &env).unwrap().0, 8);
        assert!(
            saturation_clients(None, shipped, &strings(&["--max-batch-size", "0"]), &no_env)
                .is_err()
        );
    }

    #[test]
    fn request_fields_join_the_text() {
        let f = parse_fields(r#"{"target_length":"source","length_mode":"soft"}"#).unwrap();
        let bodies = bodies_with(&strings(&["Jesus wept."]), Some(&f));
        let body: serde_json::Value = serde_json::from_str(&bodies[0]).unwrap();
        assert_eq!(
            body,
            serde_json::json!({"text": "Jesus wept.", "target_length": "source", "length_mode": "soft"})
        );
        assert_eq!(bodies_with(&strings(&["a"]), None)[0], r#"{"text":"a"}"#);
        assert!(parse_fields(r#"{"text":"x"}"#).is_err());
        assert!(parse_fields("[1]").is_err());
        assert!(parse_fields("{").is_err());
    }

    #[test]
    fn overload_arguments() {
        use clap::Parser;
        let a = crate::cli::Args::try_parse_from([
            "nmt-bench",
            "overload",
            "--rates",
            "1x,40,10x",
            "--arrivals",
            "fixed",
            "--",
            "--max-queue-wait",
            "4",
        ])
        .unwrap();
        let Some(crate::cli::Command::Overload(o)) = a.command else {
            panic!("no overload command");
        };
        assert_eq!(
            o.rates,
            [
                Rate::Multiple(1.0),
                Rate::PerSecond(40.0),
                Rate::Multiple(10.0)
            ]
        );
        assert_eq!(o.arrivals, Arrivals::Fixed);
        assert_eq!((o.seconds, o.warmup_seconds, o.seed), (25.0, 3.0, 1));
        assert_eq!(o.server.mode, "continuous");
        assert_eq!(o.common.server_args_trailing, ["--max-queue-wait", "4"]);
        let d = crate::cli::Args::try_parse_from(["nmt-bench", "overload"]).unwrap();
        let Some(crate::cli::Command::Overload(d)) = d.command else {
            panic!("no overload command");
        };
        assert_eq!(
            d.rates,
            [
                Rate::Multiple(1.0),
                Rate::Multiple(2.0),
                Rate::Multiple(10.0)
            ]
        );
        assert_eq!(d.arrivals, Arrivals::Poisson);
        assert!(
            crate::cli::Args::try_parse_from(["nmt-bench", "overload", "--rates", "fast"]).is_err()
        );
    }
}
