//! Connections: accepted under a cap that HTTP and gRPC share, and never held open without a
//! request in flight for longer than the timeouts allow.
//!
//! - [`ConnectionGate`]: at most `--max-connections` open connections. Beyond the cap the
//!   accept loop holds the one connection it has just accepted and waits for a slot (the rest
//!   wait in the kernel's backlog); meanwhile HTTP connections that are waiting for a request
//!   and have not sent a byte of one for [`EVICT_IDLE_AFTER`] are closed to make room. Accept
//!   errors other than a client's own (out of file descriptors above all) back off instead of
//!   spinning, and evict idle connections the same way.
//! - HTTP/1 ([`serve_http`]): hyper's connection, with a timer of our own (`HeadTimer`) for
//!   hyper's header-read timeout, which is the only time hyper waits for a client without a
//!   request in flight. The timer ends the wait after `--header-read-timeout` from a head's
//!   first byte (from connecting, for a connection's first request) or after
//!   `--keep-alive-timeout` without a byte, at once on shutdown, and early under the cap as
//!   above. Bodies have their own deadline (`--body-read-timeout`, [`crate::http`]). A request
//!   head hyper cannot parse never reaches the app: hyper answers it itself (400, 414 or 431,
//!   empty body) with no hook to change that, so the socket wrapper replaces that answer with
//!   the API's JSON error and counts it (`framing_error`).
//! - gRPC ([`grpc_incoming`]): tonic's HTTP/2 connections under the same cap, with the
//!   connection preface due within `--header-read-timeout` (and at once on shutdown); once
//!   the connection is up, HTTP/2 pings ([`crate::grpc::serve_with`]) find dead peers.
//! - [`raise_open_file_limit`]: the soft `RLIMIT_NOFILE` up to the hard one, so the cap and
//!   not the descriptor table is what runs out first.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::futures::OwnedNotified;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tokio_util::task::TaskTracker;
use tonic::transport::server::{Connected, TcpConnectInfo};

use crate::error::{ApiError, ErrorBody};
use crate::metrics::Metrics;

/// Under the connection cap, a connection waiting for a request that has not sent a byte of it
/// for this long is closed to make room. Not at once: a client that has just connected, or just
/// read its response, is usually about to send.
pub const EVICT_IDLE_AFTER: Duration = Duration::from_millis(250);

/// `--max-connections` when not given: this many below the open-file limit, for the model
/// files, the listeners and the runtime's own descriptors...
pub const RESERVED_FILE_DESCRIPTORS: u64 = 128;
/// ...and no more than this many.
pub const DEFAULT_MAX_CONNECTIONS: usize = 10_000;

const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(5);
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);
/// Dead peers of connections with a request in flight are found by the kernel after this much
/// silence (plus its probes), rather than when the request times out.
const TCP_KEEPALIVE: Duration = Duration::from_secs(60);
const TCP_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
/// The client's HTTP/2 connection preface, `PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n`.
const HTTP2_PREFACE_BYTES: usize = 24;

/// How long a connection may wait for a request, in each of its states.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Timeouts {
    /// A connection's first request head must be complete this long after connecting; later
    /// ones this long after their first byte.
    pub header_read: Duration,
    /// From a response to the next request's first byte; `None`: one request per connection.
    pub keep_alive: Option<Duration>,
}

/// The open-file limits, before and after [`raise_open_file_limit`].
#[derive(Clone, Copy, Debug)]
pub struct FileLimits {
    pub soft_before: u64,
    pub soft: u64,
    pub hard: u64,
}

/// Raises the soft limit on open files to the hard one: service managers commonly leave the
/// soft limit at 1024, which a few hundred idle clients exhaust. A limit that cannot be
/// raised is kept, with a warning.
pub fn raise_open_file_limit() -> io::Result<FileLimits> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let soft_before = limit.rlim_cur;
    if limit.rlim_cur < limit.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: limit.rlim_max,
            rlim_max: limit.rlim_max,
        };
        // SAFETY: setrlimit reads the struct we own.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            limit.rlim_cur = limit.rlim_max;
        } else {
            tracing::warn!(
                soft = limit.rlim_cur,
                hard = limit.rlim_max,
                "cannot raise the open-file limit: {}",
                io::Error::last_os_error()
            );
        }
    }
    Ok(FileLimits {
        soft_before,
        soft: limit.rlim_cur,
        hard: limit.rlim_max,
    })
}

/// `--max-connections` when not given, for a soft open-file limit of `soft`.
pub fn default_max_connections(soft: u64) -> usize {
    let room = soft.saturating_sub(RESERVED_FILE_DESCRIPTORS).max(16);
    usize::try_from(room).map_or(DEFAULT_MAX_CONNECTIONS, |room| {
        room.min(DEFAULT_MAX_CONNECTIONS)
    })
}

/// The cap on open connections, shared by the HTTP and gRPC listeners.
#[derive(Clone)]
pub struct ConnectionGate(Arc<Gate>);

struct Gate {
    permits: Arc<Semaphore>,
    max: usize,
    /// Accept loops that cannot accept now (at the cap, or failing to accept).
    blocked: AtomicUsize,
    /// Wakes the connections waiting for a request when an accept loop becomes blocked.
    blocked_changed: Arc<Notify>,
    created: Instant,
    /// Seconds after `created` of the last warning about the cap (`u64::MAX`: none yet).
    last_cap_warning: AtomicU64,
}

/// An accepted connection and its slot under the cap (freed when dropped).
pub struct Accepted {
    pub stream: TcpStream,
    pub permit: OwnedSemaphorePermit,
}

impl ConnectionGate {
    pub fn new(max_connections: usize) -> Self {
        let max = max_connections.max(1);
        ConnectionGate(Arc::new(Gate {
            permits: Arc::new(Semaphore::new(max)),
            max,
            blocked: AtomicUsize::new(0),
            blocked_changed: Arc::new(Notify::new()),
            created: Instant::now(),
            last_cap_warning: AtomicU64::new(u64::MAX),
        }))
    }

    pub fn max_connections(&self) -> usize {
        self.0.max
    }

    /// Connections open now, HTTP and gRPC.
    pub fn open_connections(&self) -> usize {
        self.0.max - self.0.permits.available_permits()
    }

    fn under_pressure(&self) -> bool {
        self.0.blocked.load(Ordering::Acquire) > 0
    }

    /// Marks an accept loop as blocked until the guard drops, and wakes the idle connections
    /// so they see it.
    fn pressure(&self) -> PressureGuard<'_> {
        self.0.blocked.fetch_add(1, Ordering::AcqRel);
        self.0.blocked_changed.notify_waiters();
        PressureGuard(self)
    }

    /// The next connection, once it has a slot under the cap; never fails (errors back off).
    pub async fn accept(&self, listener: &TcpListener) -> Accepted {
        let stream = self.accept_socket(listener).await;
        let permit = match self.0.permits.clone().try_acquire_owned() {
            Ok(permit) => permit,
            Err(_) => {
                self.warn_at_cap();
                let _pressure = self.pressure();
                self.0
                    .permits
                    .clone()
                    .acquire_owned()
                    .await
                    .expect("the connection semaphore is never closed")
            }
        };
        configure_socket(&stream);
        Accepted { stream, permit }
    }

    async fn accept_socket(&self, listener: &TcpListener) -> TcpStream {
        let mut delay = Duration::ZERO;
        let mut failures = 0u64;
        loop {
            match listener.accept().await {
                Ok((stream, _)) => {
                    if failures > 0 {
                        tracing::warn!(failures, "accepting connections again");
                    }
                    return stream;
                }
                // The client's own failure (it reset before we accepted): nothing to wait for.
                Err(e) if is_per_connection(&e) => continue,
                Err(e) => {
                    failures += 1;
                    delay = (delay * 2).clamp(ACCEPT_BACKOFF_MIN, ACCEPT_BACKOFF_MAX);
                    if failures == 1 {
                        tracing::warn!(
                            open_connections = self.open_connections(),
                            "accept failed ({e}); backing off and closing idle connections"
                        );
                    } else {
                        tracing::debug!(failures, ?delay, "accept failed again ({e})");
                    }
                    // Out of descriptors, the ones idle connections hold are the ones to free.
                    let _pressure = self.pressure();
                    tokio::time::sleep(delay).await;
                }
            }
        }
    }

    /// Warns when the cap is reached, at most once a minute.
    fn warn_at_cap(&self) {
        let now = self.0.created.elapsed().as_secs();
        let last = self.0.last_cap_warning.load(Ordering::Relaxed);
        if last != u64::MAX && now < last + 60 {
            return;
        }
        if self
            .0
            .last_cap_warning
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            tracing::warn!(
                max_connections = self.0.max,
                "at --max-connections: new connections wait, idle ones are closed to make room"
            );
        }
    }
}

struct PressureGuard<'a>(&'a ConnectionGate);

impl Drop for PressureGuard<'_> {
    fn drop(&mut self) {
        self.0 .0.blocked.fetch_sub(1, Ordering::AcqRel);
    }
}

fn is_per_connection(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionRefused
            | io::ErrorKind::Interrupted
    )
}

fn configure_socket(stream: &TcpStream) {
    // Requests and answers are small JSON documents: Nagle would only delay them.
    let _ = stream.set_nodelay(true);
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(TCP_KEEPALIVE)
        .with_interval(TCP_KEEPALIVE_INTERVAL);
    let _ = socket2::SockRef::from(stream).set_tcp_keepalive(&keepalive);
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
    let clock = Arc::new(HeadClock::new());
    let io = TokioIo::new(Watched {
        stream: accepted.stream,
        clock: clock.clone(),
        rewritten: None,
        metrics,
    });
    let timer = HeadTimer {
        clock,
        timeouts,
        gate,
        shutdown: shutdown.clone(),
    };
    let mut builder = http1::Builder::new();
    builder
        .timer(timer)
        .header_read_timeout(timeouts.header_read)
        .keep_alive(timeouts.keep_alive.is_some());
    let service = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
        tower::Service::call(&mut app.clone(), request)
    });
    let connection = builder.serve_connection(io, service);
    tokio::pin!(connection);
    let served = tokio::select! {
        served = connection.as_mut() => served,
        () = shutdown.cancelled() => {
            // Idle and half-sent heads close at once (the timer sees the shutdown); a request
            // in flight is answered, then the connection closes.
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
}

impl HeadClock {
    fn new() -> Self {
        HeadClock {
            origin: Instant::now(),
            first_byte: AtomicU64::new(0),
            waited_before: AtomicBool::new(false),
        }
    }

    /// Starts the wait for a head; true for the connection's first.
    fn start_head(&self) -> bool {
        self.first_byte.store(0, Ordering::Relaxed);
        !self.waited_before.swap(true, Ordering::Relaxed)
    }

    fn saw_bytes(&self) {
        if self.first_byte.load(Ordering::Relaxed) == 0 {
            let at = u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX - 1) + 1;
            let _ = self
                .first_byte
                .compare_exchange(0, at, Ordering::Relaxed, Ordering::Relaxed);
        }
    }

    fn first_byte(&self) -> Option<Instant> {
        match self.first_byte.load(Ordering::Relaxed) {
            0 => None,
            at => Some(self.origin + Duration::from_nanos(at - 1)),
        }
    }
}

/// A socket that tells its [`HeadClock`] when bytes arrive, and puts hyper's own answers to
/// unparsable heads in the API's error shape.
struct Watched {
    stream: TcpStream,
    clock: Arc<HeadClock>,
    /// The replacement of such an answer, and how much of it has been sent.
    rewritten: Option<(Vec<u8>, usize)>,
    metrics: Arc<Metrics>,
}

/// How every answer that [`framing_error`] may stand for begins.
const CLIENT_ERROR: &[u8] = b"HTTP/1.1 4";

/// The error hyper's automatic answer starting `bytes` stands for, if it is one. hyper answers
/// a head it cannot parse with a status line, `connection: close`, `content-length: 0` and a
/// date, and nothing else; every answer of the app has a body and an `x-request-id`.
fn framing_error(bytes: &[u8]) -> Option<ApiError> {
    let end = bytes.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    let head = std::str::from_utf8(&bytes[..end]).ok()?;
    let status = head.strip_prefix("HTTP/1.1 ")?.get(..3)?;
    let lines: Vec<&str> = head
        .split("\r\n")
        .skip(1)
        .filter(|l| !l.is_empty())
        .collect();
    let automatic = lines.iter().all(|line| {
        let name = line.split(':').next().unwrap_or_default();
        matches!(name, "connection" | "content-length" | "date")
    }) && lines.contains(&"content-length: 0");
    if !automatic {
        return None;
    }
    match status {
        "400" => Some(ApiError::MalformedRequest(
            "the request head is not valid HTTP/1.1 (request line or a header field)".into(),
        )),
        "414" => Some(ApiError::UriTooLong(
            "the request target is longer than 65534 bytes".into(),
        )),
        "431" => Some(ApiError::HeadersTooLarge(
            "the request head has more than 100 header fields or is larger than about 400 KB"
                .into(),
        )),
        _ => None,
    }
}

/// `error` as a complete HTTP/1.1 answer that closes the connection, with hyper's `date`.
fn framing_answer(error: &ApiError, hyper_head: &[u8]) -> Vec<u8> {
    let status = error.status();
    let body = serde_json::to_vec(&ErrorBody {
        error: error.to_string(),
        error_type: error.error_type().to_string(),
    })
    .expect("the error body serializes");
    let date = std::str::from_utf8(hyper_head)
        .ok()
        .and_then(|head| head.split("\r\n").find(|l| l.starts_with("date: ")))
        .map(|line| format!("{line}\r\n"))
        .unwrap_or_default();
    let mut answer = format!(
        "HTTP/1.1 {} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
         connection: close\r\n{date}\r\n",
        status.as_str(),
        status.canonical_reason().unwrap_or_default(),
        body.len()
    )
    .into_bytes();
    answer.extend_from_slice(&body);
    answer
}

impl Watched {
    /// Sends what is left of a rewritten answer.
    fn poll_rewritten(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while let Some((answer, sent)) = &mut self.rewritten {
            if *sent == answer.len() {
                self.rewritten = None;
                break;
            }
            match Pin::new(&mut self.stream).poll_write(cx, &answer[*sent..]) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Poll::Ready(Ok(n)) => *sent += n,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
        Poll::Ready(Ok(()))
    }

    /// When `buf` starts hyper's answer to an unparsable head, takes all of it (so hyper
    /// counts it sent) and sends the API's answer instead.
    fn poll_write_head(&mut self, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        std::task::ready!(self.poll_rewritten(cx))?;
        let Some(error) = framing_error(buf) else {
            return Pin::new(&mut self.stream).poll_write(cx, buf);
        };
        tracing::debug!(
            error_type = error.error_type(),
            status = error.status().as_u16(),
            "{error}"
        );
        self.metrics.record_error(error.error_type());
        self.rewritten = Some((framing_answer(&error, buf), 0));
        // Pending here only means the socket is full: flushing finishes the answer.
        if let Poll::Ready(Err(e)) = self.poll_rewritten(cx) {
            return Poll::Ready(Err(e));
        }
        Poll::Ready(Ok(buf.len()))
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if buf.starts_with(CLIENT_ERROR) {
            return self.poll_write_head(cx, buf);
        }
        std::task::ready!(self.poll_rewritten(cx))?;
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        // hyper encodes a head into one buffer: the first non-empty one decides.
        if let Some(first) = bufs.iter().find(|b| !b.is_empty()) {
            if first.starts_with(CLIENT_ERROR) {
                return self.poll_write_head(cx, first);
            }
        }
        std::task::ready!(self.poll_rewritten(cx))?;
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        std::task::ready!(self.poll_rewritten(cx))?;
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        std::task::ready!(self.poll_rewritten(cx))?;
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// Writes go straight to the socket: the wrapper below only times reads.
macro_rules! forward_writes {
    ($wrapper:ty) => {
        impl AsyncWrite for $wrapper {
            fn poll_write(
                mut self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                buf: &[u8],
            ) -> Poll<io::Result<usize>> {
                Pin::new(&mut self.stream).poll_write(cx, buf)
            }

            fn poll_write_vectored(
                mut self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                bufs: &[io::IoSlice<'_>],
            ) -> Poll<io::Result<usize>> {
                Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
            }

            fn is_write_vectored(&self) -> bool {
                self.stream.is_write_vectored()
            }

            fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                Pin::new(&mut self.stream).poll_flush(cx)
            }

            fn poll_shutdown(
                mut self: Pin<&mut Self>,
                cx: &mut Context<'_>,
            ) -> Poll<io::Result<()>> {
                Pin::new(&mut self.stream).poll_shutdown(cx)
            }
        }
    };
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.stream).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.clock.saw_bytes();
        }
        polled
    }
}

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
            pressure: Box::pin(self.gate.0.blocked_changed.clone().notified_owned()),
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
            this.pressure = Box::pin(this.gate.0.blocked_changed.clone().notified_owned());
        }
        let deadline = this.deadline();
        if this.sleep.deadline() != deadline {
            this.sleep.as_mut().reset(deadline);
        }
        this.sleep.as_mut().poll(cx)
    }
}

impl hyper::rt::Sleep for HeadWait {}

/// gRPC connections for tonic's `serve_with_incoming_shutdown`, accepted under `gate`. The
/// listener closes when tonic drops the stream (it stops accepting on shutdown).
pub fn grpc_incoming(
    listener: TcpListener,
    gate: ConnectionGate,
    preface_timeout: Duration,
    shutdown: CancellationToken,
) -> ReceiverStream<io::Result<GrpcConnection>> {
    let (sender, receiver) = tokio::sync::mpsc::channel(1);
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                accepted = gate.accept(&listener) => accepted,
                () = sender.closed() => break,
            };
            let connection = GrpcConnection::new(accepted, preface_timeout, shutdown.clone());
            if sender.send(Ok(connection)).await.is_err() {
                break;
            }
        }
    });
    ReceiverStream::new(receiver)
}

/// A gRPC connection: its slot under the cap, and until the HTTP/2 preface is in, a deadline
/// for it (HTTP/2 has no header-read timeout of its own, and tonic's graceful shutdown waits
/// for a connection's handshake to finish).
pub struct GrpcConnection {
    stream: TcpStream,
    preface: Option<PrefaceDeadline>,
    _permit: OwnedSemaphorePermit,
}

struct PrefaceDeadline {
    left: usize,
    sleep: Pin<Box<Sleep>>,
    shutdown: Pin<Box<WaitForCancellationFutureOwned>>,
}

impl GrpcConnection {
    fn new(accepted: Accepted, timeout: Duration, shutdown: CancellationToken) -> Self {
        GrpcConnection {
            stream: accepted.stream,
            preface: Some(PrefaceDeadline {
                left: HTTP2_PREFACE_BYTES,
                sleep: Box::pin(tokio::time::sleep(timeout)),
                shutdown: Box::pin(shutdown.cancelled_owned()),
            }),
            _permit: accepted.permit,
        }
    }
}

impl Connected for GrpcConnection {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.stream.connect_info()
    }
}

impl AsyncRead for GrpcConnection {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.stream).poll_read(cx, buf);
        let Some(preface) = &mut this.preface else {
            return polled;
        };
        match polled {
            Poll::Ready(Ok(())) => {
                preface.left = preface.left.saturating_sub(buf.filled().len() - before);
                if preface.left == 0 {
                    this.preface = None;
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending
                if preface.sleep.as_mut().poll(cx).is_ready()
                    || preface.shutdown.as_mut().poll(cx).is_ready() =>
            {
                Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "no HTTP/2 connection preface within the header read timeout",
                )))
            }
            other => other,
        }
    }
}

forward_writes!(GrpcConnection);

#[cfg(test)]
mod tests;
