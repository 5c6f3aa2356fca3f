//! The default benchmark (`nmt-bench` without a subcommand): throughput and latency of
//! `nmt-server` by concurrency, for each batching mode.
//!
//! It first starts one server per mode in `--modes`, as child processes that all run side by
//! side (`--model-dir DIR --port 0 --grpc-port 0 --batching MODE`, plus `--server-arg`s), and
//! waits for each one's `listening on` lines and for `GET /ready` (or `/health`) to
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
//! optionally as markdown and JSON files ([`report`]).

pub mod report;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use nmt_testkit::ServerProcess;

use crate::cli::{interrupted, CommonArgs, Durations};
use crate::load::{cell_bar, client_runtime, http_client, request_bodies, run_cell, Cell};
use crate::overload::{bodies_with, parse_fields, RequestFields};
use crate::report::{emit, nproc, shell_join, utc_now};
use crate::server::{log_paths, server_args, start_ready, warn_without_ort, Fleet, DEFAULT_MODE};
use crate::{stats, verses};
use report::{ModeArgs, Report};

/// The default benchmark's own arguments: `nmt-bench`'s, beside its subcommands.
#[derive(Debug, clap::Args)]
pub struct BatchingArgs {
    /// Server batching modes to compare, comma-separated, each a different name; each mode gets
    /// its own server, passed `--batching MODE`. The mode `default` passes no `--batching` flag at all (the server's
    /// own default, and what works with a server that has no such flag).
    #[arg(
        long,
        env = "NMT_BENCH_MODES",
        value_delimiter = ',',
        default_value = "continuous,off"
    )]
    pub modes: Vec<String>,

    /// Builds to compare instead of batching modes, comma-separated `NAME=SERVER_BIN@MODEL_DIR`
    /// (e.g. `before=old/nmt-server@old/package,after=target/release/nmt-server@models/en-es-rel-ldpe`):
    /// each NAME is a mode whose server runs SERVER_BIN on MODEL_DIR with its default batching,
    /// side by side with the others and interleaved like modes. Replaces `--modes`.
    #[arg(long, env = "NMT_BENCH_BUILDS", value_delimiter = ',')]
    pub builds: Vec<String>,

    /// Request kinds to compare instead of batching modes: a file of `NAME JSON` lines, JSON
    /// being the fields every request of that kind carries beside `text` (e.g. `isometric
    /// {"target_chars": "source"}`; `{}` for the default request). Each NAME is a mode whose
    /// server runs `--model-dir` with its default batching, side by side with the others and
    /// interleaved like modes, so the kinds' throughputs compare on one machine state.
    /// Replaces `--modes`.
    #[arg(long, env = "NMT_BENCH_REQUEST_KINDS", conflicts_with = "builds")]
    pub request_kinds: Option<PathBuf>,

    /// The mode the others' throughput is divided by in the ratio table (skipped when it is not
    /// among `--modes`).
    #[arg(long, env = "NMT_BENCH_BASELINE_MODE", default_value = "off")]
    pub baseline_mode: String,

    /// Concurrency levels: closed-loop clients, each sending its next request as soon as the
    /// previous one has come back. Comma-separated.
    #[arg(
        long,
        env = "NMT_BENCH_CLIENTS",
        value_delimiter = ',',
        default_value = "1,4,16,64"
    )]
    pub clients: Vec<usize>,

    /// Measured seconds per (mode, clients) cell.
    #[arg(long, env = "NMT_BENCH_SECONDS", default_value_t = 20.0)]
    pub seconds: f64,

    /// Seconds of load before each cell's measured window (not measured).
    #[arg(long, env = "NMT_BENCH_WARMUP_SECONDS", default_value_t = 3.0)]
    pub warmup_seconds: f64,

    #[command(flatten)]
    pub common: CommonArgs,

    /// Also write the results as JSON here (every cell's numbers, errors by kind, ratios, and
    /// how the run was made).
    #[arg(long, env = "NMT_BENCH_OUT_JSON")]
    pub out_json: Option<PathBuf>,

    /// Also write a markdown report here: date, command line, server arguments, nproc, the
    /// table, and the throughput ratio of each mode over `--baseline-mode` per concurrency.
    #[arg(long, env = "NMT_BENCH_OUT_MD")]
    pub out_md: Option<PathBuf>,
}

/// Runs the benchmark; `Ok(false)` when some mode could not be measured (the report of the
/// others is still written).
pub fn run(mut args: BatchingArgs) -> Result<bool> {
    let builds = builds(&args.builds)?;
    if !builds.is_empty() {
        args.modes = builds.iter().map(|b| b.name.clone()).collect();
    }
    let kinds = match &args.request_kinds {
        Some(path) => request_kinds(path)?,
        None => Vec::new(),
    };
    if !kinds.is_empty() {
        args.modes = kinds.iter().map(|k| k.name.clone()).collect();
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
    // Every mode's request bodies: its kind's fields beside each verse, or the verse alone.
    let bodies: Vec<Arc<Vec<String>>> = if kinds.is_empty() {
        vec![request_bodies(&verses); args.modes.len()]
    } else {
        kinds
            .iter()
            .map(|k| bodies_with(&verses, Some(&k.fields)))
            .collect()
    };
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
    let mode_args: Vec<ModeArgs> = if !builds.is_empty() {
        builds
            .iter()
            .map(|b| ModeArgs {
                mode: b.name.clone(),
                bin: b.bin.display().to_string(),
                args: server_args(&b.model_dir, DEFAULT_MODE, &extra),
                request_fields: None,
            })
            .collect()
    } else if !kinds.is_empty() {
        kinds
            .iter()
            .map(|k| ModeArgs {
                mode: k.name.clone(),
                bin: args.common.server_bin.display().to_string(),
                args: server_args(&args.common.model_dir, DEFAULT_MODE, &extra),
                request_fields: Some(k.fields.to_json()),
            })
            .collect()
    } else {
        args.modes
            .iter()
            .map(|mode| ModeArgs {
                mode: mode.clone(),
                bin: args.common.server_bin.display().to_string(),
                args: server_args(&args.common.model_dir, mode, &extra),
                request_fields: None,
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
    };
    let interrupted_run = runtime.block_on(async {
        let bench = async {
            // Dropped on an interruption or a panic, the fleet stops every server it holds.
            let mut fleet = Fleet::default();
            for (m, log_path) in mode_args.iter().zip(&log_paths) {
                let server = start_ready(
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
                    let Some(server) = fleet.servers[i].as_ref() else {
                        continue;
                    };
                    let outcome =
                        run_mode_cell(&client, server, mode, clients, &cells, &bodies[i]).await;
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
                            if let Some(dead) = fleet.servers[i].take() {
                                let _ = dead.stop(Duration::from_secs(1));
                            }
                        }
                    }
                }
            }
            for (mode, server) in args.modes.iter().zip(&fleet.servers) {
                peak_rss.push((
                    mode.clone(),
                    server.as_ref().and_then(ServerProcess::peak_rss_mib),
                ));
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
        date: utc_now(),
        command_line: shell_join(&std::env::args().collect::<Vec<_>>()),
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

/// A `--request-kinds` line.
struct RequestKind {
    name: String,
    fields: RequestFields,
}

/// `--request-kinds`: `NAME JSON` lines; blank lines and `#` comments skipped.
fn request_kinds(path: &Path) -> Result<Vec<RequestKind>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("--request-kinds: reading {}", path.display()))?;
    parse_request_kinds(&text).with_context(|| format!("--request-kinds {}", path.display()))
}

fn parse_request_kinds(text: &str) -> Result<Vec<RequestKind>> {
    let mut kinds = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (name, json) = line
            .split_once(char::is_whitespace)
            .with_context(|| format!("line {}: not `NAME JSON`", n + 1))?;
        let fields =
            parse_fields(json.trim()).map_err(|e| anyhow::anyhow!("line {}: {e}", n + 1))?;
        kinds.push(RequestKind {
            name: name.to_string(),
            fields,
        });
    }
    ensure!(!kinds.is_empty(), "no request kinds");
    Ok(kinds)
}

/// The cells every mode runs.
struct Cells<'a> {
    clients: &'a [usize],
    warmup: Duration,
    measure: Duration,
    request_timeout: Duration,
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

/// Runs one (mode, clients) cell against the mode's running server: its summary and the
/// model name the server reported. Fails when the server has exited, before or during the
/// cell (the summary of a cell the server died in is not a measurement).
async fn run_mode_cell(
    client: &reqwest::Client,
    server: &ServerProcess,
    mode: &str,
    clients: usize,
    cells: &Cells<'_>,
    bodies: &Arc<Vec<String>>,
) -> Result<(stats::CellSummary, Option<String>)> {
    server.ensure_running("before this cell")?;
    let cell = Cell {
        clients,
        warmup: cells.warmup,
        measure: cells.measure,
        request_timeout: cells.request_timeout,
    };
    let bar = cell_bar(mode, clients);
    let run = run_cell(client, server.base_url(), Arc::clone(bodies), &cell, &bar).await;
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
    server.ensure_running("during the cell")?;
    Ok((s, run.model))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[test]
    fn mode_order_alternates_by_level() {
        assert_eq!(mode_order(2, 0), [0, 1]);
        assert_eq!(mode_order(2, 1), [1, 0]);
        assert_eq!(mode_order(2, 2), [0, 1]);
        assert_eq!(mode_order(3, 3), [2, 1, 0]);
        assert_eq!(mode_order(1, 1), [0]);
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
    fn request_kinds_name_the_fields_each_request_carries() {
        let kinds = parse_request_kinds(
            "# kinds\ndefault {}\n\nisometric {\"target_chars\": \"source\"}\n",
        )
        .unwrap();
        assert_eq!(kinds.len(), 2);
        assert_eq!(kinds[0].fields.body("v".into()), r#"{"text":"v"}"#);
        assert_eq!(
            kinds[1].fields.body("v".into()),
            r#"{"target_chars":"source","text":"v"}"#
        );
        for bad in ["lonely", "a [1]", r#"a {"text": "x"}"#, "# only a comment"] {
            assert!(parse_request_kinds(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_mode_named_twice_is_refused() {
        let a = crate::cli::Args::try_parse_from(["nmt-bench", "--modes", "off,continuous,off"])
            .unwrap();
        let e = run(a.batching).unwrap_err();
        assert!(e.to_string().contains("twice"), "{e}");
    }
}
