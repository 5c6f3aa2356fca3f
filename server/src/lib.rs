//! The translation server: ONNX Runtime sessions driven by a greedy decode loop with a KV
//! cache, behind an axum HTTP API.
//!
//! - [`package`]: opening a model package (manifest, tokenizer) and checking them together.
//! - [`onnx`]: loading ONNX Runtime, checking the graphs against the decoder-step contract
//!   (`model_package::names`), and [`onnx::OrtBackend`], the [`backend::Backend`] that runs
//!   them.
//! - [`decode`]: the greedy loop, written against [`backend::Backend`] only.
//! - [`worker`]: the model's own thread and the channel handlers use to reach it.
//! - [`http`]: routes, request validation, [`http::app`].
//! - [`error`]: the one error type of the API and its status codes.
//! - [`server`]: command line, start-up ([`server::load`]) and serving ([`server::run`]).

pub mod backend;
pub mod decode;
pub mod error;
pub mod http;
pub mod onnx;
pub mod package;
pub mod server;
pub mod tensor;
pub mod worker;

pub use error::ApiError;
pub use http::{app, AppState, Limits};
pub use server::{load, run, Args};
