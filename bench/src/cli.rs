//! The command line: `nmt-bench`'s arguments, those every benchmark shares, and the signals
//! that interrupt a run.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use clap::{Parser, Subcommand};
use nmt_testkit::release_binary;

use crate::batching::BatchingArgs;
use crate::beside_large::BesideLargeArgs;
use crate::memory::MemoryArgs;
use crate::overload::storm::StormArgs;
use crate::overload::OverloadArgs;

/// Concurrency benchmark of nmt-server: starts one server per batching mode, all side by side,
/// then at each concurrency level drives every mode's server in turn with closed-loop HTTP
/// clients (cells interleaved, the mode order alternating from level to level to cancel drift);
/// prints target tokens/s, requests/s and latency percentiles as a markdown table.
/// `nmt-bench overload` instead offers open-loop request rates to one server and reports what
/// its admission control makes of them; `nmt-bench beside-large` measures small requests alone
/// and beside one client of large requests (64 texts each); `nmt-bench storm` runs closed-loop
/// clients of maximal requests and counts the accepted ones that time out.
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
pub struct Args {
    #[command(subcommand)]
    pub command: Option<Command>,

    #[command(flatten)]
    pub batching: BatchingArgs,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    Overload(OverloadArgs),
    Storm(StormArgs),
    BesideLarge(BesideLargeArgs),
    Memory(MemoryArgs),
}

/// What the closed-loop benchmark, `overload` and `beside-large` take: the inputs, the server, the
/// clients.
#[derive(Debug, clap::Args)]
pub struct CommonArgs {
    /// English inputs, one request each: a `.tsv` file with a header line is read by its `en`
    /// column (e.g. data/corpus/test-concat.tsv, the long-input set), any other file one text
    /// per line. The default is the test split written by
    /// `nmt-train corpus --out data/corpus` (books Daniel and Philippians).
    #[arg(long, env = "NMT_BENCH_VERSES", default_value = "data/corpus/test.en")]
    pub verses: PathBuf,

    /// The server executable.
    #[arg(
        long,
        env = "NMT_BENCH_SERVER_BIN",
        default_value_os_t = release_binary("nmt-server")
    )]
    pub server_bin: PathBuf,

    /// Model package the server loads (`--model-dir` of nmt-server).
    #[arg(
        long,
        env = "NMT_BENCH_MODEL_DIR",
        default_value = "models/en-es-rel-ldpe"
    )]
    pub model_dir: PathBuf,

    /// One extra argument for the server, after the ones the bench sets; repeat it for more,
    /// e.g. `--server-arg=--intra-op-threads --server-arg=1`. Arguments after a bare `--` are
    /// passed too.
    #[arg(
        long = "server-arg",
        env = "NMT_BENCH_SERVER_ARG",
        allow_hyphen_values = true,
        value_name = "ARG"
    )]
    pub server_arg: Vec<String>,

    /// More extra server arguments (after `--`).
    #[arg(last = true, value_name = "SERVER_ARGS")]
    pub server_args_trailing: Vec<String>,

    /// Seconds to wait for each server to print `listening on` and then to answer 200 on
    /// `/ready` (it answers 503 until its warm-up translation is done).
    #[arg(
        long,
        env = "NMT_BENCH_STARTUP_TIMEOUT_SECONDS",
        default_value_t = 180.0
    )]
    pub startup_timeout_seconds: f64,

    /// Per-request timeout in seconds; a request that takes longer counts as an error
    /// (`timeout`).
    #[arg(
        long,
        env = "NMT_BENCH_REQUEST_TIMEOUT_SECONDS",
        default_value_t = 120.0
    )]
    pub request_timeout_seconds: f64,

    /// Worker threads of the clients' async runtime. The clients share the machine with the
    /// server: one thread is plenty for 64 loopback clients and takes the least CPU from it.
    #[arg(long, env = "NMT_BENCH_CLIENT_THREADS", default_value_t = 1)]
    pub client_threads: usize,

    /// Directory for the servers' logs (their stderr), one file per mode:
    /// `nmt-bench-server-MODE.log`. Default: the system temp directory.
    #[arg(long, env = "NMT_BENCH_SERVER_LOG_DIR")]
    pub server_log_dir: Option<PathBuf>,
}

impl CommonArgs {
    /// `--server-arg`s, then the arguments after `--`.
    pub fn extra_server_args(&self) -> Vec<String> {
        self.server_arg
            .iter()
            .chain(&self.server_args_trailing)
            .cloned()
            .collect()
    }

    pub fn log_dir(&self) -> Result<PathBuf> {
        let dir = self
            .server_log_dir
            .clone()
            .unwrap_or_else(std::env::temp_dir);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(dir)
    }
}

/// How long a benchmark's parts last, from its arguments.
pub struct Durations {
    /// The measured window of each cell, phase or rate (`--seconds`).
    pub measure: Duration,
    /// The load sent before each measured window, not measured (`--warmup-seconds`).
    pub warmup: Duration,
    /// `--startup-timeout-seconds`.
    pub startup_timeout: Duration,
    /// `--request-timeout-seconds`.
    pub request_timeout: Duration,
}

impl CommonArgs {
    /// Checks the arguments every benchmark checks alike (its `--seconds`, `--client-threads`)
    /// and reads its durations: `seconds` and `warmup_seconds` are the command's own.
    pub fn durations(&self, seconds: f64, warmup_seconds: f64) -> Result<Durations> {
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

pub fn secs(s: f64, what: &str) -> Result<Duration> {
    Duration::try_from_secs_f64(s).with_context(|| format!("{what}: bad number of seconds {s}"))
}

/// Ctrl-C or SIGTERM.
pub async fn interrupted() {
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
        let b = &a.batching;
        assert_eq!(b.modes, ["continuous", "off"]);
        assert_eq!(b.clients, [1, 4, 16, 64]);
        assert_eq!(b.seconds, 20.0);
        assert_eq!(b.warmup_seconds, 3.0);
        assert_eq!(
            b.common.server_bin,
            PathBuf::from("target/release/nmt-server")
        );
        assert_eq!(b.common.model_dir, PathBuf::from("models/en-es-rel-ldpe"));
        assert_eq!(b.common.server_arg, ["--intra-op-threads", "1"]);
        assert_eq!(b.common.server_args_trailing, ["--queue-capacity", "512"]);
        assert!(a.command.is_none());
    }

    #[test]
    fn durations_check_what_every_benchmark_checks() {
        let a = Args::try_parse_from(["nmt-bench"]).unwrap();
        let common = &a.batching.common;
        let d = common.durations(20.0, 3.0).unwrap();
        assert_eq!(d.measure, Duration::from_secs(20));
        assert_eq!(d.warmup, Duration::from_secs(3));
        assert_eq!(d.startup_timeout, Duration::from_secs(180));
        assert_eq!(d.request_timeout, Duration::from_secs(120));
        let error = |r: Result<Durations>| r.err().expect("an error").to_string();
        assert_eq!(
            error(common.durations(0.0, 3.0)),
            "--seconds must be positive"
        );
        assert!(error(common.durations(1.0, -1.0)).starts_with("--warmup-seconds: bad number"));
        let a = Args::try_parse_from(["nmt-bench", "--client-threads", "0"]).unwrap();
        assert_eq!(
            error(a.batching.common.durations(1.0, 0.0)),
            "--client-threads must be positive"
        );
    }
}
