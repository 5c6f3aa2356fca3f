//! The translation server: the engine (`nmt_engine`: ONNX Runtime sessions, a greedy decode
//! loop with a KV cache, one pipeline) driven through a scheduler, behind an HTTP (axum) and
//! a gRPC (tonic) API.
//!
//! - [`scheduler`]: the model's own thread, its queue, and continuous batching.
//! - [`admission`]: refusing at the door the requests the model would not finish in time.
//! - [`infer`]: the service whatever the transport: validation, timeouts, metrics.
//! - [`http`]: the JSON API over axum, [`http::app`], its OpenAPI document generated from the
//!   handlers' types ([`http::ApiDoc`], with [`openapi`] for the model package's enums), and
//!   [`web`], the page at `/` to try it.
//! - [`grpc`]: the gRPC API over tonic (`proto/translate.proto`), [`grpc::serve`].
//! - [`connections`]: accepting connections under a cap, and the timeouts that keep slow or
//!   idle clients from holding them.
//! - [`request_id`]: the request id, one rule and one layer for HTTP and gRPC.
//! - [`metrics`]: the Prometheus metrics.
//! - [`error`]: the one error type of the API and its status codes.
//! - [`server`]: command line, start-up ([`server::load`]) and serving ([`server::run`]).
//! - `testing` (the crate's own tests, and the `testing` feature): a backend without ONNX
//!   Runtime and the service around it, for driving [`http::app`] in-process.

pub mod admission;
pub mod connections;
pub mod error;
pub mod grpc;
pub mod http;
pub mod infer;
pub mod metrics;
pub mod openapi;
pub mod request_id;
pub mod scheduler;
pub mod server;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod web;

pub use error::ApiError;
pub use http::app;
pub use infer::{Infer, ModelInfo, TranslateRequest, TranslateResponse, Translation};
pub use server::{load, run, Args};
