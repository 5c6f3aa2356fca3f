//! The cap on open connections that HTTP and gRPC share, the accept loop under it, and the
//! open-file limit the cap is sized by.

use std::io;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::futures::OwnedNotified;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

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

    /// Whether an accept loop cannot accept now: idle connections should make room.
    pub(super) fn under_pressure(&self) -> bool {
        self.0.blocked.load(Ordering::Acquire) > 0
    }

    /// Completes when an accept loop next becomes blocked.
    pub(super) fn pressure_changed(&self) -> OwnedNotified {
        self.0.blocked_changed.clone().notified_owned()
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
