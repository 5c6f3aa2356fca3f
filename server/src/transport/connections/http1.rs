//! HTTP/1 connections: hyper's, with a timer of our own for the wait for a request head.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::futures::OwnedNotified;
use tokio::time::{Instant, Sleep};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tokio_util::task::TaskTracker;

use super::forward::forward_writes;
use super::framing::Framing;
use super::gate::{Accepted, ConnectionGate, EVICT_IDLE_AFTER};
use super::host;
use super::hyper_answers::HyperAnswers;
use crate::metrics::Metrics;
use crate::transport::http::body::Draining;

/// How long a connection may wait for a request, in each of its states.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Timeouts {
    /// A connection's first request head must be complete this long after connecting; later
    /// ones this long after their first byte.
    pub header_read: Duration,
    /// From a response to the next request's first byte; `None`: one request per connection.
    pub keep_alive: Option<Duration>,
}

/// Serves `app` over HTTP/1 on `listener` until `shutdown`, then closes the listener and the
/// connections without a request in flight at once, and returns when the requests in flight
/// have been answered. Requests refused before they reach `app` are counted in `metrics`.
pub async fn serve_http(
    listener: TcpListener,
    app: Router,
    gate: ConnectionGate,
    timeouts: Timeouts,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) {
    let connections = TaskTracker::new();
    loop {
        let accepted = tokio::select! {
            accepted = gate.accept(&listener) => accepted,
            () = shutdown.cancelled() => break,
        };
        connections.spawn(serve_http_connection(
            accepted,
            app.clone(),
            gate.clone(),
            timeouts,
            metrics.clone(),
            shutdown.clone(),
        ));
    }
    // New clients are refused from now on instead of waiting in a backlog nobody reads.
    drop(listener);
    connections.close();
    connections.wait().await;
}

async fn serve_http_connection(
    accepted: Accepted,
    app: Router,
    gate: ConnectionGate,
    timeouts: Timeouts,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) {
    let shutdown_for_bodies = shutdown.clone();
    let clock = Arc::new(HeadClock::new());
    let clocked = Clocked {
        stream: accepted.stream,
        clock: clock.clone(),
    };
    let io = TokioIo::new(HyperAnswers::new(clocked, metrics.clone()));
    let timer = HeadTimer {
        clock: clock.clone(),
        timeouts,
        gate,
        shutdown: shutdown.clone(),
    };
    let mut builder = http1::Builder::new();
    builder
        .timer(timer)
        .header_read_timeout(timeouts.header_read)
        .keep_alive(timeouts.keep_alive.is_some());
    let service = hyper::service::service_fn(move |mut request: hyper::Request<Incoming>| {
        // Called as soon as hyper has parsed the head, before it reads on.
        clock.request(hyper::body::Body::size_hint(request.body()).exact());
        request
            .extensions_mut()
            .insert(Draining(shutdown_for_bodies.clone()));
        let refused = host::refusal(&request, &metrics);
        let mut app = app.clone();
        async move {
            match refused {
                Some(refused) => Ok(refused),
                None => tower::Service::call(&mut app, request).await,
            }
        }
    });
    let connection = builder.serve_connection(io, service);
    tokio::pin!(connection);
    let served = tokio::select! {
        served = connection.as_mut() => served,
        () = shutdown.cancelled() => {
            // Idle and half-sent heads close at once (the timer sees the shutdown), and so do
            // bodies still arriving (the app sees it: `Draining`); a request in flight is
            // answered, then the connection closes.
            connection.as_mut().graceful_shutdown();
            connection.await
        }
    };
    // Timeouts and clients that went away: the client's business, not an error of ours.
    if let Err(e) = served {
        tracing::debug!("HTTP connection closed: {e}");
    }
    drop(accepted.permit);
}

/// When the wait for the current request head began, and when its first byte came.
struct HeadClock {
    origin: Instant,
    /// Nanoseconds after `origin`, plus one, of the first byte read since the wait began;
    /// 0: none yet.
    first_byte: AtomicU64,
    waited_before: AtomicBool,
    /// Whether hyper's buffer holds bytes of the next head when the wait for it begins.
    framing: Mutex<Framing>,
}

impl HeadClock {
    fn new() -> Self {
        HeadClock {
            origin: Instant::now(),
            first_byte: AtomicU64::new(0),
            waited_before: AtomicBool::new(false),
            framing: Mutex::new(Framing::default()),
        }
    }

    fn framing(&self) -> MutexGuard<'_, Framing> {
        self.framing.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn now(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX - 1) + 1
    }

    /// Starts the wait for a head; true for the connection's first. A head whose first bytes
    /// came with the request before it (pipelined) has the header timeout from now: the
    /// server was busy with that request until now.
    fn start_head(&self) -> bool {
        let first_byte = if self.framing().head_started() {
            self.now()
        } else {
            0
        };
        self.first_byte.store(first_byte, Ordering::Relaxed);
        !self.waited_before.swap(true, Ordering::Relaxed)
    }

    fn saw_bytes(&self, bytes: &[u8]) {
        self.framing().read(bytes);
        if self.first_byte.load(Ordering::Relaxed) == 0 {
            let _ = self.first_byte.compare_exchange(
                0,
                self.now(),
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
        }
    }

    /// hyper hands a request over, its body `body_length` bytes long (`None`: chunked).
    fn request(&self, body_length: Option<u64>) {
        self.framing().request(body_length);
    }

    fn first_byte(&self) -> Option<Instant> {
        match self.first_byte.load(Ordering::Relaxed) {
            0 => None,
            at => Some(self.origin + Duration::from_nanos(at - 1)),
        }
    }
}

/// A socket that tells its [`HeadClock`] when bytes arrive.
struct Clocked {
    stream: TcpStream,
    clock: Arc<HeadClock>,
}

impl AsyncRead for Clocked {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.stream).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.clock.saw_bytes(&buf.filled()[before..]);
        }
        polled
    }
}

forward_writes!(Clocked);

/// hyper's HTTP/1 server uses its timer only for the header-read timeout, which runs while it
/// waits for a request head: on a new connection, and between keep-alive requests. Its own
/// deadline is a fixed time from the start of that wait, which would make an idle keep-alive
/// connection and a slow head share one timeout; this timer tells them apart.
#[derive(Clone)]
struct HeadTimer {
    clock: Arc<HeadClock>,
    timeouts: Timeouts,
    gate: ConnectionGate,
    shutdown: CancellationToken,
}

impl hyper::rt::Timer for HeadTimer {
    fn sleep(&self, duration: Duration) -> Pin<Box<dyn hyper::rt::Sleep>> {
        TokioTimer::new().sleep(duration)
    }

    fn sleep_until(&self, _deadline: std::time::Instant) -> Pin<Box<dyn hyper::rt::Sleep>> {
        let fresh = self.clock.start_head();
        let started = Instant::now();
        Box::pin(HeadWait {
            sleep: Box::pin(tokio::time::sleep_until(
                started + self.timeouts.header_read,
            )),
            shutdown: Box::pin(self.shutdown.clone().cancelled_owned()),
            pressure: Box::pin(self.gate.pressure_changed()),
            started,
            fresh,
            clock: self.clock.clone(),
            timeouts: self.timeouts,
            gate: self.gate.clone(),
        })
    }
}

/// The wait for one request head; when it completes, hyper closes the connection.
struct HeadWait {
    sleep: Pin<Box<Sleep>>,
    shutdown: Pin<Box<WaitForCancellationFutureOwned>>,
    pressure: Pin<Box<OwnedNotified>>,
    started: Instant,
    fresh: bool,
    clock: Arc<HeadClock>,
    timeouts: Timeouts,
    gate: ConnectionGate,
}

impl HeadWait {
    /// Recomputed on every poll: hyper polls this whenever bytes arrive and the head is still
    /// incomplete, and the gate wakes it when the cap is reached.
    fn deadline(&self) -> Instant {
        let first_byte = self.clock.first_byte();
        let deadline = match first_byte {
            Some(first) if !self.fresh => first + self.timeouts.header_read,
            _ if self.fresh => self.started + self.timeouts.header_read,
            _ => {
                self.started
                    + self
                        .timeouts
                        .keep_alive
                        .unwrap_or(self.timeouts.header_read)
            }
        };
        if first_byte.is_none() && self.gate.under_pressure() {
            deadline.min(self.started + EVICT_IDLE_AFTER)
        } else {
            deadline
        }
    }
}

impl Future for HeadWait {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = &mut *self;
        if this.shutdown.as_mut().poll(cx).is_ready() {
            return Poll::Ready(());
        }
        while this.pressure.as_mut().poll(cx).is_ready() {
            this.pressure = Box::pin(this.gate.pressure_changed());
        }
        let deadline = this.deadline();
        if this.sleep.deadline() != deadline {
            this.sleep.as_mut().reset(deadline);
        }
        this.sleep.as_mut().poll(cx)
    }
}

impl hyper::rt::Sleep for HeadWait {}
