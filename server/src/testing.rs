//! Test doubles for the server's own tests and for harnesses that drive the HTTP API's `app`
//! in-process (`server/tests/`): the service around the engine's [`CopyBackend`], without
//! ONNX Runtime.
//!
//! Compiled for the crate's unit tests and with the `testing` feature, which the crate's own
//! dev-dependency on itself turns on for its integration tests; a release build of
//! `nmt-server` has none of it.

use std::sync::Arc;
use std::thread::JoinHandle;

use model_package::ModelConfig;
use strum::IntoEnumIterator;
use tokenizers::Tokenizer;

use nmt_engine::length::LengthModel;
use nmt_engine::package::TextCodec;
use nmt_engine::pipeline::Pipeline;
pub use nmt_engine::testing::*;

use crate::metrics::Metrics;
use crate::scheduler::{SchedulerConfig, Translator};
use crate::service::{ApiError, Infer, Model, RequestLimits};

/// One model of a test service.
pub struct TestModel {
    pub name: String,
    pub backend: CopyBackend,
    pub tokenizer: Tokenizer,
    /// A `ModelConfig` preset: whether it is length-aware, and its variant for `/models`.
    pub preset: &'static str,
    /// The model's own input limit (EOS not counted), like a model with absolute positions.
    pub max_source_tokens: Option<usize>,
    pub length: Option<LengthModel>,
}

impl TestModel {
    /// A copy model named `name` with the dev tokenizer, no length encoding and no input
    /// limit of its own.
    pub fn copy(name: &str, backend: CopyBackend) -> Self {
        TestModel {
            name: name.into(),
            backend,
            tokenizer: tokenizer(),
            preset: "rel-transformer-tiny",
            max_source_tokens: None,
            length: None,
        }
    }
}

/// The service and the worker threads of its models, in the order given.
pub struct TestService {
    pub infer: Infer,
    pub workers: Vec<JoinHandle<()>>,
}

/// The service around `models`, as `nmt-server` builds it, marked ready.
pub fn service(
    models: Vec<TestModel>,
    default_model: &str,
    limits: RequestLimits,
    scheduler: SchedulerConfig,
) -> TestService {
    let metrics = Arc::new(Metrics::new());
    let mut workers = Vec::new();
    let models = models
        .into_iter()
        .map(|mut model| {
            let vocab = model.tokenizer.get_vocab_size(true).max(VOCAB);
            model.backend.vocab = vocab;
            let (translator, worker) = Translator::spawn(
                model.backend,
                SPECIAL,
                scheduler.clone(),
                metrics.worker(&model.name),
            )
            .expect("worker thread");
            workers.push(worker);
            let config = ModelConfig::preset(model.preset, vocab).expect("a preset");
            Model {
                pipeline: Pipeline {
                    length: model.length.unwrap_or_else(|| {
                        LengthModel::without_prediction(config.is_length_aware())
                    }),
                    name: model.name,
                    codec: TextCodec::new(model.tokenizer),
                    eos_id: SPECIAL.eos,
                    max_source_tokens: model.max_source_tokens,
                    max_target_tokens: 64,
                    limits: limits.clone(),
                },
                config,
                source_language: "en".into(),
                target_language: "es".into(),
                translator,
                precision: model_package::Precision::Float32,
                domains: vec!["test words".into()],
                origin: model_package::manifest::TRAINED_HERE.into(),
            }
        })
        .collect();
    let infer = Infer::new(models, default_model, limits, metrics).expect("a valid service");
    infer.set_ready(true);
    TestService { infer, workers }
}

/// The service around two copy models, marked ready: `dev-copy` (the default, running
/// `backend`, no input limit of its own) and `dev-copy-abs`, which declares that it takes at
/// most 3 subword tokens (like a model with absolute positions).
pub fn infer(backend: CopyBackend, limits: RequestLimits, scheduler: SchedulerConfig) -> Infer {
    let models = vec![
        TestModel::copy("dev-copy", backend),
        TestModel {
            preset: "transformer-tiny",
            max_source_tokens: Some(3),
            ..TestModel::copy("dev-copy-abs", CopyBackend::default())
        },
    ];
    service(models, "dev-copy", limits, scheduler).infer
}

/// One error of each kind the API has, its fields empty.
pub fn every_api_error() -> Vec<ApiError> {
    ApiError::iter().collect()
}
