//! `nmt-bench storm`: closed-loop clients of maximal requests against one server, to see that
//! every request its admission control accepts is answered within its timeout.
//!
//! `overload` offers many small requests on a schedule; here every client sends large ones
//! (`--texts` verses, the longest of `--verses`, or `--texts` texts of `--subwords` subwords
//! each) and sends the next as soon as the last is answered or refused, like impatient users,
//! or, with `--polite`, after the `Retry-After` of a 429. What matters is how the requests the
//! server accepted ended: answered, or timed out (504) after the server spent their time. Each
//! run is one row of the report; `--append` adds it to the runs already in `--out-json`, so
//! that builds or loads can be compared in one table.

pub mod report;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};

use self::report::{Outcome, Sample, StormLoad, StormReport, StormRun};
use crate::cli::CommonArgs;
use crate::load::{client_runtime, http_client, transport_error_kind};
use crate::report::emit;
use crate::single_server::{RunHeader, RunNames, ServerSource, SingleServerArgs};

/// Closed-loop clients of maximal requests: `--clients` clients each send requests of
/// `--texts` texts for `--seconds`, every request followed to its end, and the report counts
/// the accepted ones that were answered and those that timed out, the refusals (429, 413), the
/// answered requests' latency and the goodput.
#[derive(Debug, clap::Args)]
pub struct StormArgs {
    /// Closed-loop clients.
    #[arg(long, env = "NMT_BENCH_STORM_CLIENTS", default_value_t = 48)]
    clients: usize,

    /// Texts in every request.
    #[arg(long, env = "NMT_BENCH_STORM_TEXTS", default_value_t = 64)]
    texts: usize,

    /// 0: the texts are verses of `--verses`, longest first (request k holds verses k·T to
    /// k·T + T − 1 of that order, wrapping around). N: every text is N subwords of the
    /// model package's tokenizer, EOS included, made of the verses' words
    /// (`nmt_testkit::text_of_subwords`).
    #[arg(long, env = "NMT_BENCH_STORM_SUBWORDS", default_value_t = 0)]
    subwords: usize,

    /// Seconds during which the clients send; the requests still in flight then are followed
    /// to their end.
    #[arg(long, env = "NMT_BENCH_STORM_SECONDS", default_value_t = 60.0)]
    seconds: f64,

    /// Wait the `Retry-After` of a 429 before sending again (without it, a refused client
    /// sends again at once).
    #[arg(long, env = "NMT_BENCH_STORM_POLITE")]
    polite: bool,

    /// This run's name in the report's table (e.g. `before`, `after`).
    #[arg(long, env = "NMT_BENCH_STORM_LABEL", default_value = "storm")]
    label: String,

    /// Add this run to those in `--out-json` (when it exists) instead of replacing them; the
    /// Markdown then shows them all.
    #[arg(long)]
    append: bool,

    /// Run nothing: print the table of the runs in `--out-json` and write `--out-md` from
    /// them (after a change to how the report reads).
    #[arg(long, requires = "out_json")]
    render_only: bool,

    #[command(flatten)]
    server: SingleServerArgs,

    #[command(flatten)]
    common: CommonArgs,

    /// Write the report as JSON here (every run, its outcomes and how it was made).
    #[arg(long, env = "NMT_BENCH_STORM_OUT_JSON")]
    out_json: Option<PathBuf>,

    /// Write a Markdown report here: the runs' table, then how each was made.
    #[arg(long, env = "NMT_BENCH_STORM_OUT_MD")]
    out_md: Option<PathBuf>,
}

/// How `storm` names itself and what it measures, in what it says on stderr.
const NAMES: RunNames = RunNames {
    command: "storm",
    parts: "requests",
};

/// Runs the storm; `Ok(false)` when it could not finish (what ran is still reported).
pub fn run(args: StormArgs) -> Result<bool> {
    if args.render_only {
        let report = StormReport {
            runs: previous_runs(&args)?,
        };
        emit(&report, args.out_md.as_deref(), None)?;
        return Ok(true);
    }
    ensure!(args.clients > 0, "--clients must be positive");
    ensure!(args.texts > 0, "--texts must be positive");
    let durations = args.common.durations(args.seconds, 0.0)?;
    let verses = crate::verses::load(&args.common.verses)?;
    let (bodies, load) = request_bodies(&args, &verses)?;
    let log_name = format!("storm-{}", args.label);
    let source = ServerSource::new(&args.server, &args.common, &durations, &log_name)?;
    let runtime = client_runtime(args.common.client_threads)?;
    let client = http_client(args.clients.max(8), Duration::from_secs(120))?;
    eprintln!(
        "nmt-bench storm ({}): {} clients, {}; {} s of sending{}",
        args.label,
        args.clients,
        load.describe(),
        args.seconds,
        if args.polite {
            ", honouring Retry-After"
        } else {
            ""
        }
    );
    let plan = Plan {
        clients: args.clients,
        bodies: Arc::new(bodies),
        send_for: durations.measure,
        polite: args.polite,
        timeout: durations.request_timeout,
    };
    let mut samples = Vec::new();
    let mut wall = Duration::ZERO;
    let finished = source.with_server(&runtime, &client, &NAMES, async |base_url, server| {
        let started = Instant::now();
        samples = storm(&client, base_url, &plan).await;
        wall = started.elapsed();
        server.check_alive()
    });
    let run = StormRun::summarize(
        &args.label,
        RunHeader::now(&args.common, &source, None),
        load,
        &samples,
        (args.seconds, wall.as_secs_f64()),
    );
    eprintln!("{}", run.line());
    let report = StormReport::with_run(previous_runs(&args)?, run);
    emit(&report, args.out_md.as_deref(), args.out_json.as_deref())?;
    Ok(finished)
}

/// The runs already in `--out-json`, with `--append`.
fn previous_runs(args: &StormArgs) -> Result<Vec<StormRun>> {
    let Some(path) = args
        .out_json
        .as_deref()
        .filter(|_| args.append || args.render_only)
    else {
        return Ok(Vec::new());
    };
    if !path.exists() {
        return Ok(Vec::new());
    }
    let text = std::fs::read_to_string(path).with_context(|| path.display().to_string())?;
    let report: StormReport = serde_json::from_str(&text)
        .with_context(|| format!("{}: not a storm report", path.display()))?;
    Ok(report.runs)
}

/// The bodies the clients cycle through, and the load as the report names it.
fn request_bodies(args: &StormArgs, verses: &[String]) -> Result<(Vec<String>, StormLoad)> {
    let fields = args.server.request_fields.as_ref();
    let body = |texts: Vec<String>| {
        let text = serde_json::Value::from(texts);
        match fields {
            Some(f) => f.body(text),
            None => serde_json::json!({ "text": text }).to_string(),
        }
    };
    let load = StormLoad {
        clients: args.clients,
        texts: args.texts,
        subwords: (args.subwords > 0).then_some(args.subwords),
        polite: args.polite,
        verses_file: args.common.verses.display().to_string(),
        request_fields: fields.map(|f| f.to_json()),
    };
    if args.subwords > 0 {
        let tokenizer = args.common.model_dir.join("tokenizer.json");
        let texts = texts_of_subwords(&tokenizer, verses, args.texts, args.subwords)?;
        return Ok((vec![body(texts)], load));
    }
    let mut longest = verses.to_vec();
    longest.sort_by_key(|v| std::cmp::Reverse(v.chars().count()));
    let bodies = (0..longest.len().div_ceil(args.texts))
        .map(|k| {
            let texts =
                (0..args.texts).map(|j| longest[(k * args.texts + j) % longest.len()].clone());
            body(texts.collect())
        })
        .collect();
    Ok((bodies, load))
}

/// `count` texts of `subwords` subwords each (EOS included) by the tokenizer at `path`: runs of
/// the verses' words, each starting a little further into them so that no two are alike.
fn texts_of_subwords(
    path: &Path,
    verses: &[String],
    count: usize,
    subwords: usize,
) -> Result<Vec<String>> {
    let tokenizer = tokenizers::Tokenizer::from_file(path)
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    let words: Vec<&str> = verses.iter().flat_map(|v| v.split_whitespace()).collect();
    ensure!(!words.is_empty(), "no words in the verses");
    let texts = nmt_testkit::distinct_texts_of_subwords(&words, count, subwords, |text| {
        tokenizer
            .encode(text, false)
            .map(|encoding| encoding.get_ids().len() + 1)
    })
    .map_err(|e| anyhow::anyhow!("tokenizing: {e}"))?;
    Ok(texts.into_iter().map(|(text, _)| text).collect())
}

/// What the clients do.
struct Plan {
    clients: usize,
    bodies: Arc<Vec<String>>,
    /// How long they send.
    send_for: Duration,
    polite: bool,
    /// The bench's own timeout per request.
    timeout: Duration,
}

/// Runs the clients: each sends its next request as soon as the last came back (after its
/// `Retry-After`, when polite and refused with 429) until the sending time is over, and waits
/// for the one in flight. Dropping the future (Ctrl-C) aborts them.
async fn storm(client: &reqwest::Client, base_url: &str, plan: &Plan) -> Vec<Sample> {
    let url = Arc::new(format!("{base_url}/translate"));
    let started = Instant::now();
    let stop = started + plan.send_for;
    let mut tasks = tokio::task::JoinSet::new();
    for index in 0..plan.clients {
        let (client, url, bodies) = (client.clone(), Arc::clone(&url), Arc::clone(&plan.bodies));
        let (polite, timeout) = (plan.polite, plan.timeout);
        tasks.spawn(async move {
            let mut samples = Vec::new();
            let mut next = index;
            while Instant::now() < stop {
                let body = &bodies[next % bodies.len()];
                next += 1;
                let sent = Instant::now();
                let outcome = send(&client, &url, body, timeout).await;
                let pause = match &outcome {
                    Outcome::Refused { retry_after, .. } if polite => *retry_after,
                    _ => None,
                };
                samples.push(Sample {
                    sent_at: (sent - started).as_secs_f64(),
                    latency: sent.elapsed().as_secs_f64(),
                    outcome,
                });
                if let Some(pause) = pause {
                    tokio::time::sleep_until(stop.min(Instant::now() + pause).into()).await;
                }
            }
            samples
        });
    }
    let mut samples = Vec::new();
    while let Some(task) = tasks.join_next().await {
        match task {
            Ok(s) => samples.extend(s),
            Err(e) => eprintln!("a client task failed: {e}"),
        }
    }
    samples
}

/// Sends one request and reads the whole answer: its outcome.
async fn send(client: &reqwest::Client, url: &str, body: &str, timeout: Duration) -> Outcome {
    let response = client
        .post(url)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(body.to_string())
        .timeout(timeout)
        .send()
        .await;
    let response = match response {
        Ok(response) => response,
        Err(e) => return Outcome::Failed(transport_error_kind(&e)),
    };
    let status = response.status().as_u16();
    let retry_after = response
        .headers()
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok()?.trim().parse().ok())
        .map(Duration::from_secs);
    let bytes = match response.bytes().await {
        Ok(bytes) => bytes,
        Err(e) => return Outcome::Failed(transport_error_kind(&e)),
    };
    Outcome::of(status, retry_after, &bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn storm_args(argv: &[&str]) -> StormArgs {
        let args = crate::cli::Args::try_parse_from(argv).unwrap();
        let Some(crate::cli::Command::Storm(storm)) = args.command else {
            panic!("no storm command");
        };
        storm
    }

    #[test]
    fn storm_arguments_and_their_defaults() {
        let d = storm_args(&["nmt-bench", "storm"]);
        assert_eq!((d.clients, d.texts, d.subwords), (48, 64, 0));
        assert_eq!((d.seconds, d.polite, d.append), (60.0, false, false));
        let a = storm_args(&[
            "nmt-bench",
            "storm",
            "--texts",
            "3",
            "--subwords",
            "1024",
            "--polite",
            "--label",
            "after",
            "--",
            "--max-queue-wait",
            "4",
        ]);
        assert_eq!((a.texts, a.subwords, a.polite), (3, 1024, true));
        assert_eq!(a.label, "after");
        assert_eq!(a.common.server_args_trailing, ["--max-queue-wait", "4"]);
    }

    #[test]
    fn verse_requests_take_the_longest_verses_first() {
        let mut args = storm_args(&["nmt-bench", "storm", "--texts", "2"]);
        args.clients = 3;
        let verses: Vec<String> = ["a b", "a b c d", "a", "a b c"]
            .iter()
            .map(|v| v.to_string())
            .collect();
        let (bodies, load) = request_bodies(&args, &verses).unwrap();
        assert_eq!(
            bodies,
            [r#"{"text":["a b c d","a b c"]}"#, r#"{"text":["a b","a"]}"#]
        );
        assert_eq!(load.describe(), "2 texts of test.en (longest first)");
        assert_eq!(load.clients, 3);
    }
}
