//! One harness for everything that drives a real `nmt-server` (the end-to-end tests in
//! `tests/`, the benchmarks in `bench/`), so that starting it, reading its ports and stopping
//! it are written once:
//!
//! - [`ServerProcess`]: the server as a child process, started with [`StartOptions`] and
//!   ready once it has printed `listening on http://ADDR` and `grpc listening on ADDR`;
//!   stopped with SIGTERM (then SIGKILL), and on drop.
//! - [`workspace_binary`], [`release_binary`], [`shipped_package`]: where the workspace's
//!   binaries and its default model package are.
//! - [`ApiClient`]: the HTTP API, typed with the server's own wire types
//!   ([`nmt_server::TranslateResponse`], [`nmt_server::ModelInfo`]), and
//!   [`ApiClient::wait_ready`].
//! - [`text_of_subwords`]: an input of a chosen length in a package's subwords.
//!
//! Nothing here stands in for the server: it is always the real binary on loopback ports.

mod binaries;
mod client;
mod process;
mod texts;

pub use binaries::{release_binary, shipped_package, workspace_binary, workspace_root};
pub use client::{ApiClient, TranslateReply};
pub use process::{proc_status_mib, ServerProcess, StartOptions, Stderr};
pub use texts::{distinct_texts_of_subwords, text_of_subwords};
