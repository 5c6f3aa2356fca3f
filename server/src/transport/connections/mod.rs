//! Connections: accepted under a cap that HTTP and gRPC share, and never held open without a
//! request in flight for longer than the timeouts allow.
//!
//! - [`ConnectionGate`] ([`gate`]): at most `--max-connections` open connections. Beyond the
//!   cap the accept loop holds the one connection it has just accepted and waits for a slot
//!   (the rest wait in the kernel's backlog); meanwhile HTTP connections that are waiting for a
//!   request and have not sent a byte of one for [`EVICT_IDLE_AFTER`] are closed to make room.
//!   Accept errors other than a client's own (out of file descriptors above all) back off
//!   instead of spinning, and evict idle connections the same way.
//! - HTTP/1 ([`serve_http`], [`http1`]): hyper's connection, with a timer of our own
//!   (`HeadTimer`) for hyper's header-read timeout, which is the only time hyper waits for a
//!   client without a request in flight. The timer ends the wait after `--header-read-timeout`
//!   from a head's first byte (from connecting, for a connection's first request; from the
//!   start of the wait when hyper already holds the head's first bytes, read with the request
//!   before it, which [`framing`] tells) or after `--keep-alive-timeout` without a byte, at
//!   once on shutdown, and early under the cap as above. Bodies have their own deadline
//!   (`--body-read-timeout`, the HTTP API's), and are not waited for on shutdown (the app
//!   sees it in `http::body::Draining`). A request head hyper cannot parse never reaches the
//!   app: hyper answers it itself (400, 414 or 431, empty body) with no hook to change that,
//!   so the socket wrapper replaces that answer with the API's JSON error and counts it
//!   ([`hyper_answers`]). A `Host` header that RFC 9112 refuses is answered 400 before the
//!   app ([`host`]).
//! - gRPC ([`grpc_incoming`], [`grpc`]): tonic's HTTP/2 connections under the same cap, with
//!   the connection preface due within `--header-read-timeout` (and at once on shutdown); once
//!   the connection is up, HTTP/2 pings (the gRPC server's) find dead peers.
//! - [`raise_open_file_limit`]: the soft `RLIMIT_NOFILE` up to the hard one, so the cap and
//!   not the descriptor table is what runs out first.

mod forward;
mod framing;
pub mod gate;
pub mod grpc;
mod host;
pub mod http1;
pub mod hyper_answers;

pub use gate::{
    default_max_connections, raise_open_file_limit, Accepted, ConnectionGate, FileLimits,
    DEFAULT_MAX_CONNECTIONS, EVICT_IDLE_AFTER, RESERVED_FILE_DESCRIPTORS,
};
pub use grpc::{grpc_incoming, GrpcConnection};
pub use http1::{serve_http, Timeouts};

#[cfg(test)]
mod tests;
