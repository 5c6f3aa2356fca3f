//! `nmt-bench-worker`: this server's side of `python3 -m nmt_tools.ct2.compare`, the benchmark
//! against CTranslate2.
//!
//! compare keeps every configuration it measures loaded in its own worker process for the
//! whole run (CTranslate2's in Python workers, this server's in this one), so that passes of
//! different configurations can alternate without a model load between them. A worker loads,
//! warms up, prints one JSON line `{"ready": true, ...}` on stdout, then answers each line
//! `run [PATH]` on stdin with one JSON line: the pass's `sentences`, `output_tokens`,
//! `seconds` and `errors` (one pass = every verse translated once; with PATH, the
//! translations, one a line in input order, are written there after the clock stops). It exits
//! at the end of stdin; an `http` worker stops its server then.
//!
//! - `engine`: nmt-server's engine in-process (`nmt_engine::Engine`, what nmt-eval and
//!   nmt-translate run): tokenizer, limits, length planning, ONNX Runtime, greedy decode loop
//!   and detokenization, in batches of `--batch-size` sorted longest first.
//! - `http`: starts `nmt-server` (as nmt-bench does, with nmt-bench's library) and sends every
//!   verse as one `POST /translate` from `--clients` closed-loop clients; the pass ends when
//!   the last reply is in.

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use nmt_bench::load::request_bodies;
use nmt_bench::{server, verses};
use nmt_engine::length::LengthRequest;
use nmt_engine::onnx::Device;
use nmt_engine::{Engine, EngineOptions, Outcome, RequestLimits};
use nmt_server::TranslateResponse;
use nmt_testkit::release_binary;
use serde::Serialize;
use serde_json::json;

/// One side of `python3 -m nmt_tools.ct2.compare`: loads this server's engine (or starts the
/// server), then translates the verses once per `run` line on stdin and answers with one JSON
/// line per pass on stdout. Not meant to be run by hand.
#[derive(Debug, Parser)]
#[command(name = "nmt-bench-worker", version, about, long_about)]
struct Args {
    #[command(subcommand)]
    side: Side,

    /// English inputs, one a line (a `.tsv` file by its `en` column), as nmt-bench reads them.
    #[arg(long, global = true, default_value = "data/corpus/test.en")]
    verses: PathBuf,

    /// Sentences translated before `ready` and not measured, so that the first pass does not
    /// pay for ONNX Runtime's first runs.
    #[arg(long, global = true, default_value_t = 16)]
    warmup: usize,
}

#[derive(Debug, Subcommand)]
enum Side {
    /// nmt-server's engine in this process, no HTTP.
    Engine {
        /// Model package directory.
        #[arg(long)]
        package: PathBuf,
        /// Sentences decoded together, sorted longest first (nmt-eval's order).
        #[arg(long, default_value_t = 1)]
        batch_size: usize,
        /// ONNX Runtime intra-op threads.
        #[arg(long, default_value_t = 1)]
        threads: usize,
        /// Batches decoded at once, each by a worker of its own (CTranslate2's
        /// `inter_threads`).
        #[arg(long, default_value_t = 1)]
        workers: usize,
        /// ONNX Runtime shared library.
        #[arg(long, env = "ORT_DYLIB_PATH")]
        ort_dylib_path: Option<PathBuf>,
    },
    /// nmt-server over HTTP, closed-loop clients.
    Http {
        /// Model package directory (the server's `--model-dir`).
        #[arg(long)]
        package: PathBuf,
        /// Concurrent closed-loop clients.
        #[arg(long, default_value_t = 1)]
        clients: usize,
        /// The server executable.
        #[arg(long, default_value_os_t = release_binary("nmt-server"))]
        server_bin: PathBuf,
        /// One extra server argument; repeat for more.
        #[arg(long = "server-arg", allow_hyphen_values = true)]
        server_arg: Vec<String>,
        /// The server's stderr goes here.
        #[arg(long)]
        server_log: PathBuf,
        /// Seconds to wait for the server to listen and then to be ready.
        #[arg(long, default_value_t = 180.0)]
        startup_timeout_seconds: f64,
        /// Per-request timeout in seconds (a timeout counts as an error).
        #[arg(long, default_value_t = 120.0)]
        request_timeout_seconds: f64,
    },
}

/// The answer to one `run`.
#[derive(Debug, Serialize)]
struct Pass {
    sentences: usize,
    output_tokens: u64,
    seconds: f64,
    errors: usize,
    /// The first error, to say what went wrong.
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
    /// Sentences that stopped at the output budget rather than at EOS (engine only).
    #[serde(skip_serializing_if = "Option::is_none")]
    hit_budget: Option<usize>,
    /// Peak resident memory since the start (`VmHWM`), in MiB: this process's for `engine`,
    /// the server's for `http`.
    #[serde(skip_serializing_if = "Option::is_none")]
    peak_rss_mib: Option<f64>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("nmt-bench-worker: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: Args) -> Result<()> {
    let verses = verses::load(&args.verses)?;
    let warmup: Vec<String> = verses.iter().take(args.warmup).cloned().collect();
    match args.side {
        Side::Engine {
            package,
            batch_size,
            threads,
            workers,
            ort_dylib_path,
        } => {
            let options = EngineOptions {
                device: Device::Cpu,
                intra_op_threads: threads,
                ort_dylib_path,
                beyond_input_limit: false,
                limits: RequestLimits::default(),
                placeholder_masking: true,
                workers,
            };
            let mut engine = Engine::load(&package, &options)
                .with_context(|| format!("loading {}", package.display()))?;
            let lengths = vec![LengthRequest::default(); verses.len()];
            engine.translate(&warmup, &lengths[..warmup.len()], batch_size, &mut |_| {})?;
            ready(json!({
                "name": engine.info.name,
                "preset": engine.info.preset,
                "execution_provider": engine.info.execution_provider,
                "sentences": verses.len(),
            }))?;
            serve(|| {
                let start = Instant::now();
                let out = engine.translate(&verses, &lengths, batch_size, &mut |_| {})?;
                let seconds = start.elapsed().as_secs_f64();
                let refused = out.iter().filter(|t| t.outcome == Outcome::Refused).count();
                let pass = Pass {
                    sentences: out.len(),
                    output_tokens: out.iter().map(|t| t.output_tokens as u64).sum(),
                    seconds,
                    errors: refused,
                    error: (refused > 0).then(|| format!("{refused} inputs refused")),
                    hit_budget: Some(out.iter().filter(|t| t.outcome == Outcome::Budget).count()),
                    peak_rss_mib: nmt_testkit::proc_status_mib("self", "VmHWM:"),
                };
                Ok((pass, out.into_iter().map(|t| t.text).collect()))
            })
        }
        Side::Http {
            package,
            clients,
            server_bin,
            server_arg,
            server_log,
            startup_timeout_seconds,
            request_timeout_seconds,
        } => {
            if clients == 0 {
                bail!("--clients must be positive");
            }
            // Like nmt-bench: one client thread is plenty for loopback requests and takes the
            // least CPU from the server it shares the machine with.
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()?;
            let client = reqwest::Client::builder()
                .pool_max_idle_per_host(clients.max(8))
                .pool_idle_timeout(None)
                .tcp_nodelay(true)
                .no_proxy()
                .build()?;
            let sargs = server::server_args(&package, "continuous", &server_arg);
            let startup = Duration::from_secs_f64(startup_timeout_seconds);
            let timeout = Duration::from_secs_f64(request_timeout_seconds);
            // Dropped at the end (or on an error), it stops the server.
            let srv = server::start(&server_bin, &sargs, &server_log, startup)?;
            runtime.block_on(srv.wait_ready(&client, startup))?;
            let url = format!("{}/translate", srv.base_url());
            let bodies = request_bodies(&verses);
            let warm: Arc<Vec<String>> = Arc::new(bodies[..warmup.len()].to_vec());
            runtime.block_on(http_pass(&client, &url, &warm, clients, timeout));
            ready(json!({
                "base_url": srv.base_url(),
                "server_args": sargs,
                "sentences": verses.len(),
            }))?;
            serve(|| {
                srv.ensure_running("")?;
                let (mut pass, texts) =
                    runtime.block_on(http_pass(&client, &url, &bodies, clients, timeout));
                pass.peak_rss_mib = srv.peak_rss_mib();
                Ok((pass, texts))
            })
        }
    }
}

fn ready(info: serde_json::Value) -> Result<()> {
    let mut line = json!({ "ready": true });
    line.as_object_mut()
        .expect("an object")
        .extend(info.as_object().cloned().unwrap_or_default());
    say(&line)
}

fn say(value: &impl Serialize) -> Result<()> {
    let mut out = std::io::stdout().lock();
    serde_json::to_writer(&mut out, value)?;
    out.write_all(b"\n")?;
    out.flush()?;
    Ok(())
}

/// Answers `run [PATH]` lines until stdin ends.
fn serve(mut pass: impl FnMut() -> Result<(Pass, Vec<String>)>) -> Result<()> {
    for line in std::io::stdin().lock().lines() {
        let line = line?;
        let mut words = line.split_whitespace();
        match words.next() {
            Some("run") => {}
            None => continue,
            Some(other) => bail!("unknown command `{other}` (expected `run [PATH]`)"),
        }
        let (result, texts) = pass()?;
        if let Some(path) = words.next() {
            write_lines(Path::new(path), &texts)?;
        }
        say(&result)?;
    }
    Ok(())
}

fn write_lines(path: &Path, texts: &[String]) -> Result<()> {
    let mut text = String::new();
    for t in texts {
        // One translation a line, whatever it holds.
        text.push_str(&t.replace(['\n', '\r'], " "));
        text.push('\n');
    }
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

/// Every body POSTed once by `clients` closed-loop clients that take the next body as soon as
/// their previous reply is in; the clock runs from the first send to the last reply.
async fn http_pass(
    client: &reqwest::Client,
    url: &str,
    bodies: &Arc<Vec<String>>,
    clients: usize,
    timeout: Duration,
) -> (Pass, Vec<String>) {
    let next = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..clients.min(bodies.len()) {
        let (client, url, bodies, next) = (
            client.clone(),
            url.to_string(),
            Arc::clone(bodies),
            Arc::clone(&next),
        );
        tasks.spawn(async move {
            let mut done = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= bodies.len() {
                    return done;
                }
                done.push((i, post(&client, &url, &bodies[i], timeout).await));
            }
        });
    }
    let mut results: Vec<Option<Result<(String, u64), String>>> = vec![None; bodies.len()];
    while let Some(task) = tasks.join_next().await {
        match task {
            Ok(done) => {
                for (i, r) in done {
                    results[i] = Some(r);
                }
            }
            Err(e) => eprintln!("nmt-bench-worker: a client task failed: {e}"),
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    let mut pass = Pass {
        sentences: bodies.len(),
        output_tokens: 0,
        seconds,
        errors: 0,
        error: None,
        hit_budget: None,
        peak_rss_mib: None,
    };
    let mut texts = Vec::with_capacity(bodies.len());
    for r in results {
        match r.unwrap_or_else(|| Err("no reply".to_string())) {
            Ok((text, tokens)) => {
                pass.output_tokens += tokens;
                texts.push(text);
            }
            Err(e) => {
                pass.errors += 1;
                pass.error.get_or_insert(e);
                texts.push(String::new());
            }
        }
    }
    (pass, texts)
}

async fn post(
    client: &reqwest::Client,
    url: &str,
    body: &str,
    timeout: Duration,
) -> Result<(String, u64), String> {
    let resp = client
        .post(url)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(body.to_string())
        .timeout(timeout)
        .send()
        .await
        .map_err(|e| format!("request: {e}"))?;
    let status = resp.status();
    let bytes = resp.bytes().await.map_err(|e| format!("body: {e}"))?;
    if status != reqwest::StatusCode::OK {
        return Err(format!(
            "HTTP {}: {}",
            status.as_u16(),
            String::from_utf8_lossy(&bytes)
        ));
    }
    let reply: TranslateResponse =
        serde_json::from_slice(&bytes).map_err(|e| format!("reply: {e}"))?;
    let mut text = String::new();
    let mut tokens = 0;
    for t in reply.translations {
        text.push_str(&t.text);
        tokens += t.output_tokens as u64;
    }
    Ok((text, tokens))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_consistent() {
        Args::command().debug_assert();
        let a = Args::try_parse_from([
            "nmt-bench-worker",
            "http",
            "--package",
            "p",
            "--clients",
            "64",
            "--server-log",
            "/tmp/l",
            "--server-arg=--intra-op-threads",
            "--server-arg",
            "2",
        ])
        .unwrap();
        match a.side {
            Side::Http {
                clients,
                server_arg,
                ..
            } => {
                assert_eq!(clients, 64);
                assert_eq!(server_arg, ["--intra-op-threads", "2"]);
            }
            Side::Engine { .. } => panic!("parsed as engine"),
        }
    }
}
