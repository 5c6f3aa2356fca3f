//! `nmt-bench`: throughput and latency of `nmt-server` by concurrency, for each batching mode.
//!
//! It first starts one server per mode in `--modes`, as child processes that all run side by
//! side (`--model-dir DIR --port 0 --grpc-port 0 --batching MODE`, plus `--server-arg`s), and
//! waits for each one's `listening on http://ADDR` line and for `GET /ready` (or `/health`) to
//! answer 200. Then, for every concurrency level in `--clients`, it runs the cell of every mode
//! back to back: closed-loop clients POST one test verse per request to that mode's
//! `/translate` for `--warmup-seconds` (not measured) plus `--seconds`, while the other servers
//! sit idle. The mode order alternates from level to level (`continuous,off`, then
//! `off,continuous`, ...), so that the slow drift of a shared machine's speed hits every mode
//! alike instead of falling between modes measured minutes apart. All servers are stopped at
//! the end, on an error and on Ctrl-C/SIGTERM. A server that fails to start or exits leaves its
//! mode's remaining cells unreported (the run then exits non-zero); the other modes go on.
//!
//! It reports requests, errors, target tokens/s, requests/s and p50/p90/p99 latency per
//! (mode, clients), ordered by mode then clients, as a markdown table on stdout, and
//! optionally as markdown and JSON files.
//!
//! `nmt-bench overload` is the other benchmark: open-loop request rates against one server
//! (started like these, or already running), to see its admission control shed the load it
//! cannot finish (see `overload/mod.rs`). `nmt-bench beside-large` runs closed-loop clients of
//! one verse per request alone, then beside one client of large requests (64 texts each), to
//! see whether the large requests take the small ones' share of the batch (see
//! `beside_large/mod.rs`).
//!
//! This is a benchmark to run by hand on an otherwise idle machine, not a test.

mod beside_large;
mod load;
mod overload;
mod report;
mod server;
mod single_server;
mod stats;
mod verses;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use clap::{Parser, Subcommand};

use crate::load::{cell_bar, run_cell, Cell};
use crate::report::{ModeArgs, Report};
use crate::server::{server_args, wait_ready, Fleet, Server};

/// Concurrency benchmark of nmt-server: starts one server per batching mode, all side by side,
/// then at each concurrency level drives every mode's server in turn with closed-loop HTTP
/// clients (cells interleaved, the mode order alternating from level to level to cancel drift);
/// prints target tokens/s, requests/s and latency percentiles as a markdown table.
/// `nmt-bench overload` instead offers open-loop request rates to one server and reports what
/// its admission control makes of them; `nmt-bench beside-large` measures small requests alone
/// and beside one client of large requests (64 texts each).
///
/// Run it from the workspace root on an otherwise idle machine, after
/// `source scripts/env.sh` (the server needs ORT_DYLIB_PATH) and
/// `cargo build --release -p nmt-server -p nmt-bench`. Extra server flags go in `--server-arg`
/// (repeatable) or after `--`.
#[derive(Debug, Parser)]
#[command(
    name = "nmt-bench",
    version,
    about,
    long_about,
    args_conflicts_with_subcommands = true
)]
struct Args {
    #[command(subcommand)]
    command: Option<Command>,

    /// Server batching modes to compare, comma-separated, each a different name; each mode gets
    /// its own server, passed `--batching MODE`. The mode `default` passes no `--batching` flag at all (the server's
    /// own default, and what works with a server that has no such flag).
    #[arg(
        long,
        env = "NMT_BENCH_MODES",
        value_delimiter = ',',
        default_value = "continuous,off"
    )]
    modes: Vec<String>,

    /// Builds to compare instead of batching modes, comma-separated `NAME=SERVER_BIN@MODEL_DIR`
    /// (e.g. `before=old/nmt-server@old/package,after=target/release/nmt-server@models/en-es-rel-ldpe`):
    /// each NAME is a mode whose server runs SERVER_BIN on MODEL_DIR with its default batching,
    /// side by side with the others and interleaved like modes. Replaces `--modes`.
    #[arg(long, env = "NMT_BENCH_BUILDS", value_delimiter = ',')]
    builds: Vec<String>,

    /// The mode the others' throughput is divided by in the ratio table (skipped when it is not
    /// among `--modes`).
    #[arg(long, env = "NMT_BENCH_BASELINE_MODE", default_value = "off")]
    baseline_mode: String,

    /// Concurrency levels: closed-loop clients, each sending its next request as soon as the
    /// previous one has come back. Comma-separated.
    #[arg(
        long,
        env = "NMT_BENCH_CLIENTS",
        value_delimiter = ',',
        default_value = "1,4,16,64"
    )]
    clients: Vec<usize>,

    /// Measured seconds per (mode, clients) cell.
    #[arg(long, env = "NMT_BENCH_SECONDS", default_value_t = 20.0)]
    seconds: f64,

    /// Seconds of load before each cell's measured window (not measured).
    #[arg(long, env = "NMT_BENCH_WARMUP_SECONDS", default_value_t = 3.0)]
    warmup_seconds: f64,

    #[command(flatten)]
    common: CommonArgs,

    /// Also write the results as JSON here (every cell's numbers, errors by kind, ratios, and
    /// how the run was made).
    #[arg(long, env = "NMT_BENCH_OUT_JSON")]
    out_json: Option<PathBuf>,

    /// Also write a markdown report here: date, command line, server arguments, nproc, the
    /// table, and the throughput ratio of each mode over `--baseline-mode` per concurrency.
    #[arg(long, env = "NMT_BENCH_OUT_MD")]
    out_md: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
enum Command {
    Overload(overload::OverloadArgs),
    BesideLarge(beside_large::BesideLargeArgs),
}

/// What the closed-loop benchmark, `overload` and `beside-large` take: the inputs, the server, the
/// clients.
#[derive(Debug, clap::Args)]
struct CommonArgs {
    /// English inputs, one request each: a `.tsv` file with a header line is read by its `en`
    /// column (e.g. data/corpus/test-concat.tsv, the long-input set), any other file one text
    /// per line. The default is the test split written by
    /// `nmt-train corpus --out data/corpus` (books Daniel and Philippians).
    #[arg(long, env = "NMT_BENCH_VERSES", default_value = "data/corpus/test.en")]
    verses: PathBuf,

    /// The server executable.
    #[arg(
        long,
        env = "NMT_BENCH_SERVER_BIN",
        default_value = "target/release/nmt-server"
    )]
    server_bin: PathBuf,

    /// Model package the server loads (`--model-dir` of nmt-server).
    #[arg(
        long,
        env = "NMT_BENCH_MODEL_DIR",
        default_value = "models/en-es-rel-ldpe"
    )]
    model_dir: PathBuf,

    /// One extra argument for the server, after the ones the bench sets; repeat it for more,
    /// e.g. `--server-arg=--intra-op-threads --server-arg=1`. Arguments after a bare `--` are
    /// passed too.
    #[arg(
        long = "server-arg",
        env = "NMT_BENCH_SERVER_ARG",
        allow_hyphen_values = true,
        value_name = "ARG"
    )]
    server_arg: Vec<String>,

    /// More extra server arguments (after `--`).
    #[arg(last = true, value_name = "SERVER_ARGS")]
    server_args_trailing: Vec<String>,

    /// Seconds to wait for each server to print `listening on` and then to answer 200 on
    /// `/ready` (it answers 503 until its warm-up translation is done).
    #[arg(
        long,
        env = "NMT_BENCH_STARTUP_TIMEOUT_SECONDS",
        default_value_t = 180.0
    )]
    startup_timeout_seconds: f64,

    /// Per-request timeout in seconds; a request that takes longer counts as an error
    /// (`timeout`).
    #[arg(
        long,
        env = "NMT_BENCH_REQUEST_TIMEOUT_SECONDS",
        default_value_t = 120.0
    )]
    request_timeout_seconds: f64,

    /// Worker threads of the clients' async runtime. The clients share the machine with the
    /// server: one thread is plenty for 64 loopback clients and takes the least CPU from it.
    #[arg(long, env = "NMT_BENCH_CLIENT_THREADS", default_value_t = 1)]
    client_threads: usize,

    /// Directory for the servers' logs (their stderr), one file per mode:
    /// `nmt-bench-server-MODE.log`. Default: the system temp directory.
    #[arg(long, env = "NMT_BENCH_SERVER_LOG_DIR")]
    server_log_dir: Option<PathBuf>,
}

impl CommonArgs {
    /// `--server-arg`s, then the arguments after `--`.
    fn extra_server_args(&self) -> Vec<String> {
        self.server_arg
            .iter()
            .chain(&self.server_args_trailing)
            .cloned()
            .collect()
    }

    fn log_dir(&self) -> Result<PathBuf> {
        let dir = self
            .server_log_dir
            .clone()
            .unwrap_or_else(std::env::temp_dir);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(dir)
    }
}

fn main() -> ExitCode {
    let mut args = Args::parse();
    let outcome = match args.command.take() {
        Some(Command::Overload(o)) => overload::run(o),
        Some(Command::BesideLarge(b)) => beside_large::run(b),
        None => run(args),
    };
    match outcome {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("nmt-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// How long a benchmark's parts last, from its arguments.
struct Durations {
    /// The measured window of each cell, phase or rate (`--seconds`).
    measure: Duration,
    /// The load sent before each measured window, not measured (`--warmup-seconds`).
    warmup: Duration,
    /// `--startup-timeout-seconds`.
    startup_timeout: Duration,
    /// `--request-timeout-seconds`.
    request_timeout: Duration,
}

impl CommonArgs {
    /// Checks the arguments every benchmark checks alike (its `--seconds`, `--client-threads`)
    /// and reads its durations: `seconds` and `warmup_seconds` are the command's own.
    fn durations(&self, seconds: f64, warmup_seconds: f64) -> Result<Durations> {
        ensure!(seconds > 0.0, "--seconds must be positive");
        ensure!(self.client_threads > 0, "--client-threads must be positive");
        Ok(Durations {
            measure: secs(seconds, "--seconds")?,
            warmup: secs(warmup_seconds, "--warmup-seconds")?,
            startup_timeout: secs(self.startup_timeout_seconds, "--startup-timeout-seconds")?,
            request_timeout: secs(self.request_timeout_seconds, "--request-timeout-seconds")?,
        })
    }
}

fn secs(s: f64, what: &str) -> Result<Duration> {
    Duration::try_from_secs_f64(s).with_context(|| format!("{what}: bad number of seconds {s}"))
}

/// Runs the benchmark; `Ok(false)` when some mode could not be measured (the report of the
/// others is still written).
fn run(mut args: Args) -> Result<bool> {
    let builds = builds(&args.builds)?;
    if !builds.is_empty() {
        args.modes = builds.iter().map(|b| b.name.clone()).collect();
    }
    ensure!(!args.modes.is_empty(), "--modes is empty");
    ensure!(
        args.modes.iter().all(|m| !m.trim().is_empty()),
        "--modes has an empty name"
    );
    ensure!(
        args.modes
            .iter()
            .enumerate()
            .all(|(i, m)| !args.modes[..i].contains(m)),
        "--modes names a mode twice"
    );
    ensure!(
        !args.clients.is_empty() && args.clients.iter().all(|&c| c > 0),
        "--clients must be positive numbers"
    );
    let Durations {
        measure,
        warmup,
        startup_timeout,
        request_timeout,
    } = args.common.durations(args.seconds, args.warmup_seconds)?;

    let verses = verses::load(&args.common.verses)?;
    let bodies = request_bodies(&verses);
    warn_without_ort();
    let extra = args.common.extra_server_args();
    let log_dir = args.common.log_dir()?;

    let runtime = client_runtime(args.common.client_threads)?;
    let max_clients = args.clients.iter().copied().max().unwrap_or(1);
    let client = http_client(max_clients.max(8), Duration::from_secs(120))?;

    let mut results = Vec::new();
    let mut model = None;
    let mut all_ok = true;
    let mut peak_rss = Vec::new();
    let mode_args: Vec<ModeArgs> = if builds.is_empty() {
        args.modes
            .iter()
            .map(|mode| ModeArgs {
                mode: mode.clone(),
                bin: args.common.server_bin.display().to_string(),
                args: server_args(&args.common.model_dir, mode, &extra),
            })
            .collect()
    } else {
        builds
            .iter()
            .map(|b| ModeArgs {
                mode: b.name.clone(),
                bin: b.bin.display().to_string(),
                args: server_args(&b.model_dir, server::DEFAULT_MODE, &extra),
            })
            .collect()
    };
    let log_paths = log_paths(&log_dir, &args.modes);
    eprintln!(
        "nmt-bench: {} inputs from {}; modes {}; clients {:?}; {} s warm-up + {} s per cell; \
         all servers side by side, cells interleaved by concurrency level",
        verses.len(),
        args.common.verses.display(),
        args.modes.join(","),
        args.clients,
        args.warmup_seconds,
        args.seconds
    );
    let cells = Cells {
        clients: &args.clients,
        warmup,
        measure,
        request_timeout,
        bodies: &bodies,
    };
    let interrupted_run = runtime.block_on(async {
        let bench = async {
            // Dropped on an interruption or a panic, the fleet stops every server it holds.
            let mut fleet = Fleet::default();
            for (m, log_path) in mode_args.iter().zip(&log_paths) {
                let server = start_server(
                    &client,
                    Path::new(&m.bin),
                    &m.args,
                    log_path,
                    startup_timeout,
                )
                .await;
                fleet.servers.push(match server {
                    Ok(server) => Some(server),
                    Err(e) => {
                        all_ok = false;
                        eprintln!("mode `{}` failed: {e:#}", m.mode);
                        None
                    }
                });
            }
            for (level, &clients) in cells.clients.iter().enumerate() {
                for i in mode_order(args.modes.len(), level) {
                    let mode = &args.modes[i];
                    let Some(server) = fleet.servers[i].as_mut() else {
                        continue;
                    };
                    let outcome = run_mode_cell(&client, server, mode, clients, &cells).await;
                    match outcome {
                        Ok((summary, m)) => {
                            results.push(summary);
                            if model.is_none() {
                                model = m;
                            }
                        }
                        Err(e) => {
                            all_ok = false;
                            let left = cells.clients.len() - level - 1;
                            eprintln!(
                                "mode `{mode}` failed at {clients} clients: {e:#}\n\
                                 (mode `{mode}`: this cell and the {left} after it are not \
                                 reported; the other modes go on)"
                            );
                            if let Some(mut dead) = fleet.servers[i].take() {
                                let _ = dead.stop(Duration::from_secs(1));
                            }
                        }
                    }
                }
            }
            for (mode, server) in args.modes.iter().zip(&fleet.servers) {
                peak_rss.push((mode.clone(), server.as_ref().and_then(Server::peak_rss_mib)));
            }
            let stopped =
                tokio::task::spawn_blocking(move || fleet.stop_all(Duration::from_secs(30))).await;
            match stopped {
                Ok(stopped) => {
                    for (i, status) in stopped {
                        match status {
                            Ok(status) => {
                                eprintln!("server (mode {}) stopped: {status}", args.modes[i]);
                            }
                            Err(e) => {
                                eprintln!("server (mode {}) stop failed: {e:#}", args.modes[i]);
                            }
                        }
                    }
                }
                Err(e) => eprintln!("stopping the servers failed: {e}"),
            }
        };
        // On an interruption `bench` is dropped, and with it the fleet: every server gets
        // SIGTERM.
        tokio::select! {
            () = bench => false,
            () = interrupted() => true,
        }
    });
    if interrupted_run {
        eprintln!("nmt-bench: interrupted; partial results follow");
        all_ok = false;
    }
    // Cells ran interleaved; the report lists them by mode, then by concurrency level.
    let position = |r: &stats::CellSummary| {
        (
            args.modes.iter().position(|m| *m == r.mode),
            args.clients.iter().position(|&c| c == r.clients),
        )
    };
    results.sort_by_key(position);

    let ratios = report::ratios(&results, &args.modes, &args.clients, &args.baseline_mode);
    let report = Report {
        date: report::utc_now(),
        command_line: report::shell_join(&std::env::args().collect::<Vec<_>>()),
        server_args: mode_args,
        nproc: nproc(),
        client_threads: args.common.client_threads,
        model,
        verses_file: args.common.verses.display().to_string(),
        verses: verses.len(),
        warmup_seconds: args.warmup_seconds,
        seconds: args.seconds,
        baseline_mode: args.baseline_mode.clone(),
        results,
        ratios,
        peak_rss_mib: peak_rss,
    };
    emit(&report, args.out_md.as_deref(), args.out_json.as_deref())?;
    Ok(all_ok)
}

/// A `--builds` entry.
struct Build {
    name: String,
    bin: PathBuf,
    model_dir: PathBuf,
}

fn builds(specs: &[String]) -> Result<Vec<Build>> {
    specs
        .iter()
        .map(|spec| {
            let parsed = spec.split_once('=').and_then(|(name, rest)| {
                let (bin, model_dir) = rest.split_once('@')?;
                let nonempty = !name.is_empty() && !bin.is_empty() && !model_dir.is_empty();
                nonempty.then(|| Build {
                    name: name.to_string(),
                    bin: PathBuf::from(bin),
                    model_dir: PathBuf::from(model_dir),
                })
            });
            parsed.with_context(|| format!("--builds: `{spec}` is not NAME=SERVER_BIN@MODEL_DIR"))
        })
        .collect()
}

/// One `{"text": verse}` body per input.
fn request_bodies(verses: &[String]) -> Arc<Vec<String>> {
    Arc::new(
        verses
            .iter()
            .map(|v| serde_json::json!({ "text": v }).to_string())
            .collect(),
    )
}

fn warn_without_ort() {
    if std::env::var_os("ORT_DYLIB_PATH").is_none() {
        eprintln!(
            "warning: ORT_DYLIB_PATH is not set; the server may not find ONNX Runtime \
             (`source scripts/env.sh`)"
        );
    }
}

/// The clients' runtime: few threads, since they take CPU from the server on the same machine.
fn client_runtime(threads: usize) -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()?)
}

/// The clients' HTTP client: up to `pool_max_idle_per_host` connections kept open for
/// `pool_idle_timeout` once idle, so that clients reuse them instead of reconnecting; no
/// Nagle delay on the small requests; no proxy between the bench and the server.
fn http_client(
    pool_max_idle_per_host: usize,
    pool_idle_timeout: Duration,
) -> Result<reqwest::Client> {
    Ok(reqwest::Client::builder()
        .pool_max_idle_per_host(pool_max_idle_per_host)
        .pool_idle_timeout(pool_idle_timeout)
        .tcp_nodelay(true)
        .no_proxy()
        .build()?)
}

/// The cells every mode runs.
struct Cells<'a> {
    clients: &'a [usize],
    warmup: Duration,
    measure: Duration,
    request_timeout: Duration,
    bodies: &'a Arc<Vec<String>>,
}

/// The order in which the modes (by index) run their cells at the `level`-th concurrency
/// level: as given on even levels, reversed on odd ones, so that no mode is always measured
/// first (slow drift of the machine's speed cancels out over pairs of levels).
fn mode_order(modes: usize, level: usize) -> Vec<usize> {
    if level.is_multiple_of(2) {
        (0..modes).collect()
    } else {
        (0..modes).rev().collect()
    }
}

/// One server log per mode, `nmt-bench-server-MODE.log` (with `-N` added where two mode names
/// would give the same file name).
fn log_paths(dir: &Path, modes: &[String]) -> Vec<PathBuf> {
    let mut names: Vec<String> = Vec::new();
    for (i, mode) in modes.iter().enumerate() {
        let mut name = format!("nmt-bench-server-{}", file_safe(mode));
        if names.contains(&name) {
            name = format!("{name}-{i}");
        }
        names.push(name);
    }
    names
        .into_iter()
        .map(|n| dir.join(format!("{n}.log")))
        .collect()
}

/// Starts one mode's server and waits until it is ready.
async fn start_server(
    client: &reqwest::Client,
    bin: &Path,
    sargs: &[String],
    log_path: &Path,
    startup_timeout: Duration,
) -> Result<Server> {
    eprintln!(
        "starting {} {} (log: {})",
        bin.display(),
        report::shell_join(sargs),
        log_path.display()
    );
    let mut server = {
        let (bin, sargs, log_path) = (bin.to_path_buf(), sargs.to_vec(), log_path.to_path_buf());
        tokio::task::spawn_blocking(move || Server::start(&bin, &sargs, &log_path, startup_timeout))
            .await??
    };
    let endpoint = wait_ready(client, &mut server, startup_timeout).await?;
    eprintln!("{} ready ({endpoint} answered 200)", server.base_url);
    Ok(server)
}

/// Runs one (mode, clients) cell against the mode's running server: its summary and the
/// model name the server reported. Fails when the server has exited, before or during the
/// cell (the summary of a cell the server died in is not a measurement).
async fn run_mode_cell(
    client: &reqwest::Client,
    server: &mut Server,
    mode: &str,
    clients: usize,
    cells: &Cells<'_>,
) -> Result<(stats::CellSummary, Option<String>)> {
    if let Some(status) = server.try_wait()? {
        anyhow::bail!(
            "the server exited ({status}) before this cell; its log:\n{}",
            server::log_tail(&server.log_path)
        );
    }
    let cell = Cell {
        clients,
        warmup: cells.warmup,
        measure: cells.measure,
        request_timeout: cells.request_timeout,
    };
    let bar = cell_bar(mode, clients);
    let run = run_cell(
        client,
        &server.base_url,
        Arc::clone(cells.bodies),
        &cell,
        &bar,
    )
    .await;
    let s = stats::summarize(mode, clients, &run.samples, run.wall);
    bar.finish_with_message(format!(
        "{} req, {} err, {:.1} tok/s, {:.2} req/s, p50 {} ms, p99 {} ms",
        s.requests,
        s.errors,
        s.tokens_per_second,
        s.requests_per_second,
        s.p50_ms.map_or("-".into(), |v| format!("{v:.0}")),
        s.p99_ms.map_or("-".into(), |v| format!("{v:.0}")),
    ));
    if bar.is_hidden() {
        // No terminal, no bar: say the same on stderr.
        eprintln!(
            "{mode}, {clients} clients: {} req, {} err, {:.1} tok/s",
            s.requests, s.errors, s.tokens_per_second
        );
    }
    if let Some(status) = server.try_wait()? {
        anyhow::bail!(
            "the server exited ({status}) during the cell; its log:\n{}",
            server::log_tail(&server.log_path)
        );
    }
    Ok((s, run.model))
}

/// Ctrl-C or SIGTERM.
async fn interrupted() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = term => {}
    }
}

/// `nproc`, or the parallelism the standard library sees when it is missing.
fn nproc() -> usize {
    std::process::Command::new("nproc")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(0, |n| n.get()))
}

fn file_safe(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// A benchmark's report, as [`emit`] prints and writes it. The renderers are its report
/// module's `tables` and `markdown` functions, which stay free functions for their tests.
trait Document: serde::Serialize {
    /// The tables, as printed on stdout.
    const TABLES: fn(&Self) -> String;
    /// The Markdown document of `--out-md`: how the run was made, then the tables.
    const MARKDOWN: fn(&Self) -> String;
}

/// Prints a report's tables and writes its Markdown (`--out-md`) and JSON (`--out-json`)
/// where asked. The Markdown is only made when it is written.
fn emit<R: Document>(report: &R, out_md: Option<&Path>, out_json: Option<&Path>) -> Result<()> {
    println!("{}", R::TABLES(report));
    if let Some(path) = out_md {
        write(path, &R::MARKDOWN(report))?;
    }
    if let Some(path) = out_json {
        write(path, &(serde_json::to_string_pretty(report)? + "\n"))?;
    }
    Ok(())
}

fn write(path: &Path, text: &str) -> Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    eprintln!("wrote {}", path.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_consistent() {
        Args::command().debug_assert();
    }

    #[test]
    fn defaults_and_server_args() {
        let a = Args::try_parse_from([
            "nmt-bench",
            "--server-arg=--intra-op-threads",
            "--server-arg",
            "1",
            "--",
            "--queue-capacity",
            "512",
        ])
        .unwrap();
        assert_eq!(a.modes, ["continuous", "off"]);
        assert_eq!(a.clients, [1, 4, 16, 64]);
        assert_eq!(a.seconds, 20.0);
        assert_eq!(a.warmup_seconds, 3.0);
        assert_eq!(
            a.common.server_bin,
            PathBuf::from("target/release/nmt-server")
        );
        assert_eq!(a.common.model_dir, PathBuf::from("models/en-es-rel-ldpe"));
        assert_eq!(a.common.server_arg, ["--intra-op-threads", "1"]);
        assert_eq!(a.common.server_args_trailing, ["--queue-capacity", "512"]);
        assert!(a.command.is_none());
    }

    #[test]
    fn durations_check_what_every_benchmark_checks() {
        let a = Args::try_parse_from(["nmt-bench"]).unwrap();
        let d = a.common.durations(20.0, 3.0).unwrap();
        assert_eq!(d.measure, Duration::from_secs(20));
        assert_eq!(d.warmup, Duration::from_secs(3));
        assert_eq!(d.startup_timeout, Duration::from_secs(180));
        assert_eq!(d.request_timeout, Duration::from_secs(120));
        let error = |r: Result<Durations>| r.err().expect("an error").to_string();
        assert_eq!(
            error(a.common.durations(0.0, 3.0)),
            "--seconds must be positive"
        );
        assert!(error(a.common.durations(1.0, -1.0)).starts_with("--warmup-seconds: bad number"));
        let a = Args::try_parse_from(["nmt-bench", "--client-threads", "0"]).unwrap();
        assert_eq!(
            error(a.common.durations(1.0, 0.0)),
            "--client-threads must be positive"
        );
    }

    #[test]
    fn mode_order_alternates_by_level() {
        assert_eq!(mode_order(2, 0), [0, 1]);
        assert_eq!(mode_order(2, 1), [1, 0]);
        assert_eq!(mode_order(2, 2), [0, 1]);
        assert_eq!(mode_order(3, 3), [2, 1, 0]);
        assert_eq!(mode_order(1, 1), [0]);
    }

    #[test]
    fn one_log_file_per_mode() {
        let modes: Vec<String> = ["continuous", "a.b", "a_b"].map(String::from).to_vec();
        assert_eq!(
            log_paths(Path::new("/tmp/x"), &modes),
            [
                PathBuf::from("/tmp/x/nmt-bench-server-continuous.log"),
                PathBuf::from("/tmp/x/nmt-bench-server-a_b.log"),
                PathBuf::from("/tmp/x/nmt-bench-server-a_b-2.log"),
            ]
        );
    }

    #[test]
    fn builds_name_a_binary_and_a_package_each() {
        let parsed = builds(&["a=bin/a@pkg/a".into(), "b=bin/b@pkg/b".into()]).unwrap();
        assert_eq!(parsed[1].name, "b");
        assert_eq!(parsed[1].bin, PathBuf::from("bin/b"));
        assert_eq!(parsed[1].model_dir, PathBuf::from("pkg/b"));
        for bad in ["a=bin", "=bin@pkg", "a=@pkg", "a=bin@", "bin@pkg"] {
            let err = builds(&[bad.into()]).err().expect(bad).to_string();
            assert!(err.contains("NAME=SERVER_BIN@MODEL_DIR"), "{err}");
        }
    }

    #[test]
    fn a_mode_named_twice_is_refused() {
        let a = Args::try_parse_from(["nmt-bench", "--modes", "off,continuous,off"]).unwrap();
        let e = run(a).unwrap_err();
        assert!(e.to_string().contains("twice"), "{e}");
    }
}
