//! The translation server: ONNX Runtime sessions driven by a greedy decode loop with a KV
//! cache, behind an axum HTTP API.
//!
//! - [`package`]: opening a model package (manifest, tokenizer) and checking them together.
//! - [`contract`]: checking a package's graphs against the decoder-step contract
//!   (`model_package::names`) and its manifest.
//! - [`onnx`]: loading ONNX Runtime, opening the graphs, and [`onnx::OrtBackend`], the
//!   [`backend::Backend`] that runs them.
//! - [`decode`]: greedy decoding over a running batch that rows join and leave, written
//!   against [`backend::Backend`] only.
//! - [`scheduler`]: the model's own thread, its queue, and continuous batching.
//! - [`admission`]: refusing at the door the requests the model would not finish in time.
//! - [`infer`]: the service whatever the transport: validation, timeouts, metrics.
//! - [`length`]: length control (target lengths, modes, `max_chars`) and
//!   [`predictor`], the package's learned length predictor.
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
pub mod backend;
pub mod connections;
pub mod contract;
pub mod decode;
pub mod error;
pub mod grpc;
pub mod http;
pub mod infer;
pub mod length;
pub mod logits;
pub mod metrics;
pub mod onnx;
pub mod openapi;
pub mod package;
pub mod predictor;
pub mod request_id;
pub mod scheduler;
pub mod server;
pub mod slots;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod web;

pub use error::ApiError;
pub use http::app;
pub use infer::Infer;
pub use server::{load, run, Args};
