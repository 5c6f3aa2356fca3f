//! The translation engine, without a transport: what turns text into translations, shared
//! by the server (through its scheduler) and the offline tools (directly).
//!
//! - [`package`]: opening a model package (manifest, tokenizer) and the text codec
//!   (placeholder masking, tokenizing, restoring).
//! - [`contract`]: checking a package's graphs against the decoder-step contract
//!   (`model_package::names`) and its manifest.
//! - [`onnx`]: loading ONNX Runtime, opening the graphs, and [`onnx::OrtBackend`], the
//!   [`backend::Backend`] that runs them; [`slots`], its KV-cache buffers; [`fused`], the
//!   kernels of the graphs' fused operators.
//! - [`decode`]: greedy decoding over a running batch that rows join and leave, written
//!   against [`backend::Backend`] only; [`logits`], the rules applied to each step's logits.
//! - [`length`]: length control (target lengths, modes, `max_chars`) and [`predictor`],
//!   the package's learned length predictor.
//! - [`memory`]: running whole-input graphs in pieces of bounded attention, and handing
//!   what a long input freed back to the system.
//! - [`limits`]: the request limits and the input and output bounds derived from them.
//! - [`pipeline`]: validate → plan → decode input → respond → fit characters, once, around a
//!   per-text [`pipeline::ValidText`]; [`error`], its typed errors.
//! - [`sentences`]: splitting a text into sentences (`split_sentences`) and joining their
//!   translations with its own whitespace.
//! - [`offline`]: the pipeline driven directly ([`offline::Engine`]), for `nmt-translate`,
//!   `nmt-eval` and the benchmarks.
//! - `testing` (the crate's own tests, and the `testing` feature): a backend without ONNX
//!   Runtime, the dev package's manifest and tokenizers.

mod attention_lanes;
pub mod backend;
mod by_cpu;
pub mod char_length;
pub mod contract;
pub mod decode;
pub mod ending;
pub mod error;
pub mod fused;
pub mod length;
pub mod limits;
pub mod logits;
pub mod memory;
pub mod offline;
pub mod onnx;
pub mod package;
pub mod pipeline;
pub mod predictor;
pub mod row_int8;
pub mod sentences;
pub mod slots;
#[cfg(any(test, feature = "testing"))]
pub mod testing;

pub use error::{EngineError, ValidationError};
pub use limits::RequestLimits;
pub use offline::{Engine, EngineOptions, PackageInfo};
pub use pipeline::{Outcome, Pipeline, Translation, ValidText};
