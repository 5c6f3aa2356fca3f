//! The clients: their runtime and HTTP client, the request bodies, and closed-loop load
//! (`clients` tasks, each sending its next request as soon as the previous one has come back).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use indicatif::{ProgressBar, ProgressStyle};
use nmt_server::TranslateResponse;

use crate::stats::{Outcome, Sample};

/// One `{"text": verse}` body per input.
pub fn request_bodies(verses: &[String]) -> Arc<Vec<String>> {
    Arc::new(
        verses
            .iter()
            .map(|v| serde_json::json!({ "text": v }).to_string())
            .collect(),
    )
}

/// The clients' runtime: few threads, since they take CPU from the server on the same machine.
pub fn client_runtime(threads: usize) -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()?)
}

/// The clients' HTTP client: up to `pool_max_idle_per_host` connections kept open for
/// `pool_idle_timeout` once idle, so that clients reuse them instead of reconnecting; no
/// Nagle delay on the small requests; no proxy between the bench and the server.
pub fn http_client(
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

/// One (mode, clients) cell to run.
#[derive(Debug, Clone)]
pub struct Cell {
    pub clients: usize,
    pub warmup: Duration,
    pub measure: Duration,
    pub request_timeout: Duration,
}

/// What a cell produced: the samples completed inside the measured window, its exact
/// length, and the model name the server reported.
#[derive(Debug)]
pub struct CellRun {
    pub samples: Vec<Sample>,
    pub wall: Duration,
    pub model: Option<String>,
}

/// Live counters for the progress bar (measured window only).
#[derive(Default)]
struct Live {
    ok: AtomicU64,
    errors: AtomicU64,
    tokens: AtomicU64,
}

/// Runs one cell: `cell.clients` closed-loop clients POST `{"text": verse}` to
/// `{base_url}/translate`, verses taken round-robin (from the first one) through one shared
/// index. The first `cell.warmup` is not measured; a request counts when it completes inside
/// the `cell.measure` window after it. At the end of the window no new request is sent, and
/// the requests still in flight are waited for (not counted), so the next cell starts
/// against an idle server. Dropping the future (Ctrl-C) aborts the clients.
pub async fn run_cell(
    client: &reqwest::Client,
    base_url: &str,
    bodies: Arc<Vec<String>>,
    cell: &Cell,
    bar: &ProgressBar,
) -> CellRun {
    let url = Arc::new(format!("{base_url}/translate"));
    let next = Arc::new(AtomicUsize::new(0));
    let live = Arc::new(Live::default());
    let start = Instant::now();
    let measure_start = start + cell.warmup;
    let measure_end = measure_start + cell.measure;

    // A JoinSet aborts its tasks when dropped: an interrupted cell sends no more requests.
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..cell.clients {
        let client = client.clone();
        let url = Arc::clone(&url);
        let bodies = Arc::clone(&bodies);
        let next = Arc::clone(&next);
        let live = Arc::clone(&live);
        let timeout = cell.request_timeout;
        tasks.spawn(async move {
            let mut samples = Vec::new();
            let mut model = None;
            while Instant::now() < measure_end {
                let i = next.fetch_add(1, Ordering::Relaxed) % bodies.len();
                let sent = Instant::now();
                let (outcome, m) = one_request(&client, &url, &bodies[i], timeout).await;
                let done = Instant::now();
                if model.is_none() {
                    model = m;
                }
                if done >= measure_start && done <= measure_end {
                    match &outcome {
                        Outcome::Ok { output_tokens } => {
                            live.ok.fetch_add(1, Ordering::Relaxed);
                            live.tokens.fetch_add(*output_tokens, Ordering::Relaxed);
                        }
                        Outcome::Error(_) => {
                            live.errors.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    samples.push(Sample {
                        latency: done - sent,
                        outcome,
                    });
                }
            }
            (samples, model)
        });
    }

    // Progress: position in milliseconds over warm-up + measured window.
    let total_ms = (cell.warmup + cell.measure).as_millis() as u64;
    bar.set_length(total_ms);
    let stop_ticker = Arc::new(AtomicBool::new(false));
    let mut ticker = tokio::task::JoinSet::new();
    {
        let bar = bar.clone();
        let live = Arc::clone(&live);
        let stop = Arc::clone(&stop_ticker);
        ticker.spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let now = Instant::now();
                bar.set_position((now - start).as_millis().min(u128::from(total_ms)) as u64);
                if now < measure_start {
                    bar.set_message(format!(
                        "warm-up, {:.0} s left",
                        (measure_start - now).as_secs_f64().ceil()
                    ));
                } else if now < measure_end {
                    let secs = (now - measure_start).as_secs_f64().max(1e-3);
                    bar.set_message(format!(
                        "{} req, {} err, {:.0} tok/s",
                        live.ok.load(Ordering::Relaxed),
                        live.errors.load(Ordering::Relaxed),
                        live.tokens.load(Ordering::Relaxed) as f64 / secs
                    ));
                } else {
                    bar.set_message("waiting for requests in flight");
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
    }

    let mut samples = Vec::new();
    let mut model = None;
    while let Some(task) = tasks.join_next().await {
        match task {
            Ok((s, m)) => {
                samples.extend(s);
                if model.is_none() {
                    model = m;
                }
            }
            Err(e) => eprintln!("a client task failed: {e}"),
        }
    }
    stop_ticker.store(true, Ordering::Relaxed);
    while ticker.join_next().await.is_some() {}
    bar.set_position(total_ms);
    CellRun {
        samples,
        wall: measure_end - measure_start,
        model,
    }
}

/// Sends one request; the outcome and, on success, the model name.
async fn one_request(
    client: &reqwest::Client,
    url: &str,
    body: &str,
    timeout: Duration,
) -> (Outcome, Option<String>) {
    match post_translate(client, url, body, timeout).await {
        Reply::Translated {
            output_tokens,
            model,
        } => (Outcome::Ok { output_tokens }, Some(model)),
        Reply::Status { status, .. } => (Outcome::Error(format!("http {status}")), None),
        Reply::Failed(kind) => (Outcome::Error(kind), None),
    }
}

/// What one `POST /translate` came back with.
pub enum Reply {
    /// HTTP 200 with a well-formed body: the sum of `output_tokens` over its translations.
    Translated { output_tokens: u64, model: String },
    /// Any other status, with its `Retry-After` header as sent.
    Status {
        status: u16,
        retry_after: Option<String>,
    },
    /// No well-formed answer, by kind: `timeout`, `connect`, `body`, `transport`, `bad body`.
    Failed(String),
}

/// Posts `body` to `url` and reads the whole answer (latency includes it, and the connection
/// is reused).
pub async fn post_translate(
    client: &reqwest::Client,
    url: &str,
    body: &str,
    timeout: Duration,
) -> Reply {
    let resp = client
        .post(url)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(body.to_string())
        .timeout(timeout)
        .send()
        .await;
    let resp = match resp {
        Ok(resp) => resp,
        Err(e) => return Reply::Failed(transport_error_kind(&e)),
    };
    let status = resp.status();
    let retry_after = resp
        .headers()
        .get(reqwest::header::RETRY_AFTER)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    let bytes = match resp.bytes().await {
        Ok(b) => b,
        Err(e) => return Reply::Failed(transport_error_kind(&e)),
    };
    if status != reqwest::StatusCode::OK {
        return Reply::Status {
            status: status.as_u16(),
            retry_after,
        };
    }
    match serde_json::from_slice::<TranslateResponse>(&bytes) {
        Ok(r) => Reply::Translated {
            output_tokens: r.translations.iter().map(|t| t.output_tokens as u64).sum(),
            model: r.model,
        },
        Err(_) => Reply::Failed("bad body".to_string()),
    }
}

pub fn transport_error_kind(e: &reqwest::Error) -> String {
    if e.is_timeout() {
        "timeout".into()
    } else if e.is_connect() {
        "connect".into()
    } else if e.is_body() || e.is_decode() {
        "body".into()
    } else {
        "transport".into()
    }
}

/// The bar of one cell (drawn on stderr, hidden when stderr is not a terminal).
pub fn cell_bar(mode: &str, clients: usize) -> ProgressBar {
    let bar = ProgressBar::new(1);
    bar.set_style(
        ProgressStyle::with_template("{prefix:>24} [{bar:30.cyan/blue}] {msg}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    bar.set_prefix(format!("{mode}, {clients} clients"));
    bar
}
