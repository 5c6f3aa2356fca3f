//! Open-loop load: every request goes out at its scheduled time, however many are still
//! outstanding, so a slow server faces the queue its users would build instead of the
//! politely waiting clients of the closed loop.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use indicatif::ProgressBar;

use super::summary::{Outcome, Sample};
use crate::load::{post_translate, Reply};

/// What one rate produced.
#[derive(Debug)]
pub struct OpenRun {
    /// Every request of the schedule, warm-up included, each followed to its end.
    pub samples: Vec<Sample>,
    /// From the end of the schedule to the last answer.
    pub drain: Duration,
    /// The model name the server reported.
    pub model: Option<String>,
}

/// What a request task hands back: its sample, the model name, and when it ended.
type Done = (Sample, Option<String>, Instant);

#[derive(Default)]
struct Live {
    sent: AtomicU64,
    done: AtomicU64,
    answered: AtomicU64,
    shed: AtomicU64,
    failed: AtomicU64,
}

/// One rate's schedule.
#[derive(Debug, Clone, Copy)]
pub struct Plan<'a> {
    /// When to send each request, from the start (ascending, below `span`).
    pub offsets: &'a [Duration],
    /// Requests scheduled before this load the server but are not measured.
    pub warmup: Duration,
    /// The schedule's length: the measured window is `warmup..span`.
    pub span: Duration,
    pub request_timeout: Duration,
}

/// Sends `{"text": verse}` to `{base_url}/translate` at every offset of the plan (from a
/// start just after the call), verses round-robin from the first. After the last offset
/// nothing more is sent, and every request is waited for (up to the plan's
/// `request_timeout`), so the next rate starts against an idle server. Dropping the future
/// (Ctrl-C) aborts the requests.
pub async fn run_open(
    client: &reqwest::Client,
    base_url: &str,
    bodies: Arc<Vec<String>>,
    plan: Plan<'_>,
    bar: &ProgressBar,
) -> OpenRun {
    let Plan {
        offsets,
        warmup,
        span,
        request_timeout,
    } = plan;
    let url = Arc::new(format!("{base_url}/translate"));
    let live = Arc::new(Live::default());
    // A little lead, so that the first arrivals are not late already.
    let start = Instant::now() + Duration::from_millis(100);
    let end = start + span;

    let stop_ticker = Arc::new(AtomicBool::new(false));
    // In a JoinSet, so that an interrupted rate does not leave it ticking.
    let mut ticker = tokio::task::JoinSet::new();
    {
        let (bar, live, stop) = (bar.clone(), Arc::clone(&live), Arc::clone(&stop_ticker));
        bar.set_length(span.as_millis() as u64);
        ticker.spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let now = Instant::now();
                bar.set_position(now.saturating_duration_since(start).as_millis() as u64);
                let sent = live.sent.load(Ordering::Relaxed);
                let done = live.done.load(Ordering::Relaxed);
                bar.set_message(format!(
                    "{}{sent} sent, {} answered, {} shed, {} failed, {} outstanding",
                    if now < start + warmup {
                        "warm-up: "
                    } else {
                        ""
                    },
                    live.answered.load(Ordering::Relaxed),
                    live.shed.load(Ordering::Relaxed),
                    live.failed.load(Ordering::Relaxed),
                    sent.saturating_sub(done),
                ));
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
    }

    // A JoinSet aborts its tasks when dropped: an interrupted rate stops at once.
    let mut tasks = tokio::task::JoinSet::new();
    let mut model = None;
    let mut samples = Vec::new();
    let mut last_done = end;
    let mut collect = |res: Result<Done, tokio::task::JoinError>| match res {
        Ok((sample, m, done)) => {
            samples.push(sample);
            if model.is_none() {
                model = m;
            }
            last_done = last_done.max(done);
        }
        Err(e) => eprintln!("a request task failed: {e}"),
    };
    for (i, &offset) in offsets.iter().enumerate() {
        let scheduled = start + offset;
        tokio::time::sleep_until(scheduled.into()).await;
        // Reaped as they finish, so that the set holds only the requests still outstanding.
        while let Some(res) = tasks.try_join_next() {
            collect(res);
        }
        let (client, url, bodies, live) = (
            client.clone(),
            Arc::clone(&url),
            Arc::clone(&bodies),
            Arc::clone(&live),
        );
        tasks.spawn(async move {
            let sent = Instant::now();
            live.sent.fetch_add(1, Ordering::Relaxed);
            let body = &bodies[i % bodies.len()];
            let (outcome, m) = one_request(&client, &url, body, request_timeout).await;
            let done = Instant::now();
            live.done.fetch_add(1, Ordering::Relaxed);
            let counter = match outcome {
                Outcome::Answered { .. } => &live.answered,
                Outcome::Shed { .. } => &live.shed,
                Outcome::Failed(_) => &live.failed,
            };
            counter.fetch_add(1, Ordering::Relaxed);
            let sample = Sample {
                scheduled: offset,
                latency: done - scheduled,
                send_lag: sent.saturating_duration_since(scheduled),
                outcome,
            };
            (sample, m, done)
        });
    }
    while let Some(res) = tasks.join_next().await {
        collect(res);
    }
    stop_ticker.store(true, Ordering::Relaxed);
    while ticker.join_next().await.is_some() {}
    bar.set_position(span.as_millis() as u64);
    OpenRun {
        samples,
        drain: last_done - end,
        model,
    }
}

/// Sends one request; its outcome and, on success, the model name.
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
        } => (Outcome::Answered { output_tokens }, Some(model)),
        Reply::Status {
            status: 429,
            retry_after,
        } => (Outcome::Shed { retry_after }, None),
        Reply::Status { status, .. } => (Outcome::Failed(format!("http {status}")), None),
        Reply::Failed(kind) => (Outcome::Failed(kind), None),
    }
}
