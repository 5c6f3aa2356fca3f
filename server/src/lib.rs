//! The translation server: the engine (`nmt_engine`: ONNX Runtime sessions, a greedy decode
//! loop with a KV cache, one pipeline) driven through a scheduler, behind an HTTP (axum) and
//! a gRPC (tonic) API.
//!
//! Layers, each importing only from those listed after it (`server/tests/module_graph.rs`
//! holds it to that):
//!
//! - [`startup`]: start-up ([`startup::load`]) and serving ([`startup::run`]), from
//!   [`cli`], the command line ([`cli::Args`]).
//! - [`transport`]: the JSON API over axum ([`transport::http::app`], its OpenAPI document
//!   generated from the handlers' types, and the page at `/`), the gRPC API over tonic
//!   (`proto/translate.proto`, [`transport::grpc::serve`]), the connection cap and timeouts
//!   ([`transport::connections`]), the request id, and how each API answers an error.
//! - [`service`]: the service whatever the transport ([`service::Infer`]): validation,
//!   timeouts, metrics; its requests and answers, and the API's one error type
//!   ([`service::ApiError`]).
//! - [`scheduler`]: the model's own threads, continuous batching ([`scheduler::policy`]: which
//!   waiting text gets the next row), and refusing at the door the requests the model would
//!   not finish in time ([`scheduler::admission`]).
//! - [`metrics`]: the Prometheus metrics.
//! - `testing` (the crate's own tests, and the `testing` feature): a backend without ONNX
//!   Runtime and the service around it, for driving [`transport::http::app`] in-process.

pub mod cli;
pub mod metrics;
pub mod scheduler;
pub mod service;
pub mod startup;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod transport;

pub use cli::Args;
pub use service::{
    ApiError, Infer, LengthCandidate, ModelInfo, TranslateRequest, TranslateResponse, Translation,
};
pub use startup::{load, run};
pub use transport::http::app;
