//! Test doubles for the server's own tests and for harnesses that drive [`crate::http::app`]
//! in-process (`server/tests/`): a pure-Rust [`Backend`] and the service around it, without
//! ONNX Runtime.
//!
//! Compiled for the crate's unit tests and with the `testing` feature, which the crate's own
//! dev-dependency on itself turns on for its integration tests; a release build of
//! `nmt-server` has none of it.
//!
//! [`CopyBackend`] has the dev package's semantics: it copies the source (step `p` emits
//! `source[p]`, so EOS comes right after the last word) and checks its own KV cache at every
//! step, failing loudly if the loop fed it the wrong token, position or rows.

use std::path::PathBuf;
use std::sync::Arc;
use std::thread::JoinHandle;

use model_package::ModelConfig;
use ndarray::Array2;
use tokenizers::Tokenizer;

use crate::backend::{Backend, BackendError};
use crate::decode::SpecialIds;
use crate::error::ApiError;
use crate::infer::{Infer, Model, RequestLimits};
use crate::length::LengthModel;
use crate::metrics::Metrics;
use crate::package::TextCodec;
use crate::scheduler::{SchedulerConfig, Translator};

pub const VOCAB: usize = 34;
pub const SPECIAL: SpecialIds = SpecialIds { bos: 1, eos: 2 };

#[derive(Default)]
pub struct CopyRows {
    sources: Vec<Vec<i64>>,
    /// Tokens fed so far, per row (the "KV cache").
    cache: Vec<Vec<i64>>,
    ghost: Vec<bool>,
    /// The loop fed this row something other than the copy (an n-gram ban passed over it).
    off_script: Vec<bool>,
}

pub struct CopyBackend {
    /// Batch size of every step, for asserting that finished rows leave the batch.
    pub step_sizes: Vec<usize>,
    /// The `target_lengths` of every step.
    pub target_lengths: Vec<Vec<i64>>,
    /// Fail every step (error-path tests).
    pub fail: bool,
    /// Fail only the step with this number (1 for the first this backend runs): a session
    /// that errors mid-batch once and then works again.
    pub fail_on_step: Option<usize>,
    /// Steps run so far, failed ones included.
    pub steps: usize,
    /// Time each step takes (timeout and queueing tests).
    pub step_delay: std::time::Duration,
    /// Columns of the logits: at least the tokenizer's vocabulary, since the copy emits
    /// source ids.
    pub vocab: usize,
    /// Rows may be fed something other than the copy, as `no_repeat_ngram_size` makes the
    /// loop do when the text repeats itself; such a row's cache is then no longer checked
    /// against its source. Off, a row fed anything but its copy fails the step's assertion.
    pub follows_bans: bool,
}

impl Default for CopyBackend {
    fn default() -> Self {
        CopyBackend {
            step_sizes: Vec::new(),
            target_lengths: Vec::new(),
            fail: false,
            fail_on_step: None,
            steps: 0,
            step_delay: std::time::Duration::ZERO,
            vocab: VOCAB,
            follows_bans: false,
        }
    }
}

impl Backend for CopyBackend {
    type Rows = CopyRows;
    type Encoded = CopyRows;

    fn encode(&mut self, sources: &[&[i64]]) -> Result<CopyRows, BackendError> {
        Ok(CopyRows {
            sources: sources.iter().map(|s| s.to_vec()).collect(),
            cache: vec![Vec::new(); sources.len()],
            ghost: vec![false; sources.len()],
            off_script: vec![false; sources.len()],
        })
    }

    fn step(
        &mut self,
        rows: &mut CopyRows,
        target_ids: &[i64],
        positions: &[i64],
        target_lengths: &[i64],
    ) -> Result<Array2<f32>, BackendError> {
        self.steps += 1;
        if self.fail {
            return Err(BackendError::Inference("injected failure".into()));
        }
        if self.fail_on_step == Some(self.steps) {
            return Err(BackendError::Inference(format!(
                "injected failure at step {}",
                self.steps
            )));
        }
        std::thread::sleep(self.step_delay);
        let n = rows.sources.len();
        assert_eq!(target_ids.len(), n);
        assert_eq!(positions.len(), n);
        assert_eq!(target_lengths.len(), n);
        self.step_sizes.push(n);
        self.target_lengths.push(target_lengths.to_vec());
        let mut logits = Array2::zeros((n, self.vocab.max(VOCAB)));
        for r in 0..n {
            // A row fed EOS is a ghost (finished, awaiting compaction): nothing to check.
            if target_ids[r] == i64::from(SPECIAL.eos) || rows.ghost[r] {
                rows.ghost[r] = true;
                continue;
            }
            let p = positions[r] as usize;
            let source = &rows.sources[r];
            // The cache holds exactly the tokens fed at positions 0..p; while the row
            // copies its source they are BOS and the source words. (Past the source, a
            // length constraint that bans EOS makes the loop feed other tokens.)
            assert_eq!(rows.cache[r].len(), p, "row {r} cache length");
            if p < source.len() && !rows.off_script[r] {
                let mut expected: Vec<i64> = vec![SPECIAL.bos.into()];
                expected.extend(&source[..p.saturating_sub(1)]);
                expected.truncate(p);
                assert_eq!(rows.cache[r], expected, "row {r} cache at position {p}");
                let fed = if p == 0 {
                    SPECIAL.bos.into()
                } else {
                    source[p - 1]
                };
                if self.follows_bans && target_ids[r] != fed {
                    rows.off_script[r] = true;
                } else {
                    assert_eq!(target_ids[r], fed, "row {r} fed token");
                }
            }
            rows.cache[r].push(target_ids[r]);
            let next = source.get(p).copied().unwrap_or(0) as usize;
            logits[[r, next]] = 10.0;
        }
        Ok(logits)
    }

    fn place(
        &mut self,
        rows: &mut CopyRows,
        new: CopyRows,
        slots: &[usize],
    ) -> Result<(), BackendError> {
        assert_eq!(new.sources.len(), slots.len());
        let width = slots
            .iter()
            .map(|&s| s + 1)
            .max()
            .unwrap_or(0)
            .max(rows.sources.len());
        rows.sources.resize(width, Vec::new());
        rows.cache.resize(width, Vec::new());
        // A slot nobody filled would be a hole the loop does not know about.
        let mut filled = vec![true; width];
        filled[rows.ghost.len()..].fill(false);
        rows.ghost.resize(width, true);
        rows.off_script.resize(width, false);
        for (source, &slot) in new.sources.into_iter().zip(slots) {
            rows.sources[slot] = source;
            rows.cache[slot] = Vec::new();
            rows.ghost[slot] = false;
            rows.off_script[slot] = false;
            filled[slot] = true;
        }
        assert!(filled.iter().all(|&f| f), "slots {slots:?} leave a hole");
        Ok(())
    }

    fn move_row(
        &mut self,
        rows: &mut CopyRows,
        from: usize,
        to: usize,
    ) -> Result<(), BackendError> {
        rows.sources[to] = rows.sources[from].clone();
        rows.cache[to] = rows.cache[from].clone();
        rows.ghost[to] = rows.ghost[from];
        rows.off_script[to] = rows.off_script[from];
        Ok(())
    }

    fn truncate(&mut self, rows: &mut CopyRows, width: usize) -> Result<(), BackendError> {
        rows.sources.truncate(width);
        rows.cache.truncate(width);
        rows.ghost.truncate(width);
        rows.off_script.truncate(width);
        Ok(())
    }
}

/// A manifest describing the dev package (two states: a 4-D KV cache and a 2-D state carried
/// whole).
pub fn manifest() -> model_package::Manifest {
    use model_package::{Dim, Limits, StateSpec};
    model_package::Manifest {
        format_version: model_package::manifest::FORMAT_VERSION,
        name: "dev-copy".into(),
        source_language: "en".into(),
        target_language: "es".into(),
        config: ModelConfig::preset("transformer-tiny", VOCAB).unwrap(),
        pad_id: 0,
        bos_id: SPECIAL.bos,
        eos_id: SPECIAL.eos,
        unk_id: 3,
        decoder_state: vec![
            StateSpec {
                name: "self_key.0".into(),
                dims: vec![Dim::Batch, Dim::Fixed(2), Dim::Time, Dim::Fixed(4)],
            },
            StateSpec {
                name: "position_rnn.h".into(),
                dims: vec![Dim::Batch, Dim::Fixed(4)],
            },
        ],
        limits: Limits {
            max_source_tokens: Some(64),
            max_target_tokens: 64,
        },
        precision: Default::default(),
        quantization: serde_json::Value::Null,
        files: Default::default(),
        training: serde_json::Value::Null,
        evaluation: serde_json::Value::Null,
        domains: Vec::new(),
        length_prediction: None,
    }
}

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
                length: model
                    .length
                    .unwrap_or_else(|| LengthModel::without_prediction(config.is_length_aware())),
                name: model.name,
                config,
                source_language: "en".into(),
                target_language: "es".into(),
                codec: TextCodec::new(model.tokenizer),
                translator,
                eos_id: SPECIAL.eos,
                max_source_tokens: model.max_source_tokens,
                max_target_tokens: 64,
                precision: model_package::Precision::Float32,
                domains: vec!["test words".into()],
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

/// The tokenizer of the shipped model package (`models/en-es-rel-ldpe/tokenizer.json`, an
/// 8000-piece Unigram model).
pub fn shipped_tokenizer() -> Tokenizer {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../models/en-es-rel-ldpe")
        .join(model_package::files::TOKENIZER);
    Tokenizer::from_file(&path)
        .unwrap_or_else(|e| panic!("the shipped tokenizer {}: {e}", path.display()))
}

/// One error of each kind the API has.
pub fn every_api_error() -> Vec<ApiError> {
    // A new variant does not compile here until this match names it: the reminder to add it
    // to the list below too, against which the tests hold `error::ERROR_TYPES` and the
    // OpenAPI document.
    let listed = |error: &ApiError| match error {
        ApiError::InvalidJson(_)
        | ApiError::MalformedRequest(_)
        | ApiError::UriTooLong(_)
        | ApiError::HeadersTooLarge(_)
        | ApiError::InvalidRequest(_)
        | ApiError::EmptyText(_)
        | ApiError::ModelNotFound(_)
        | ApiError::TooManyTexts(_)
        | ApiError::InputTooLong(_)
        | ApiError::PayloadTooLarge(_)
        | ApiError::BodyTimeout(_)
        | ApiError::UnsupportedMediaType(_)
        | ApiError::NotFound(_)
        | ApiError::MethodNotAllowed(_)
        | ApiError::InvalidTargetLength(_)
        | ApiError::Unsupported(_)
        | ApiError::Overloaded { .. }
        | ApiError::NotReady(_)
        | ApiError::Timeout(_)
        | ApiError::Unavailable(_)
        | ApiError::Internal(_) => true,
    };
    let all = vec![
        ApiError::InvalidJson(String::new()),
        ApiError::MalformedRequest(String::new()),
        ApiError::UriTooLong(String::new()),
        ApiError::HeadersTooLarge(String::new()),
        ApiError::InvalidRequest(String::new()),
        ApiError::EmptyText(String::new()),
        ApiError::ModelNotFound(String::new()),
        ApiError::TooManyTexts(String::new()),
        ApiError::InputTooLong(String::new()),
        ApiError::PayloadTooLarge(String::new()),
        ApiError::BodyTimeout(String::new()),
        ApiError::UnsupportedMediaType(String::new()),
        ApiError::NotFound(String::new()),
        ApiError::MethodNotAllowed(String::new()),
        ApiError::InvalidTargetLength(String::new()),
        ApiError::Unsupported(String::new()),
        ApiError::Overloaded {
            message: String::new(),
            retry_after_seconds: 1,
        },
        ApiError::NotReady(String::new()),
        ApiError::Timeout(String::new()),
        ApiError::Unavailable(String::new()),
        ApiError::Internal(String::new()),
    ];
    debug_assert!(all.iter().all(listed));
    all
}

/// Tokenizer matching the copy model's vocabulary (the dev package's `tokenizer.json`).
pub fn tokenizer() -> tokenizers::Tokenizer {
    let words = "hello world the cat sat on mat a dog runs fast slow red blue green house \
                 tree sun moon star one two three four five six seven eight nine ten";
    let specials = ["<pad>", "<s>", "</s>", "<unk>"];
    let vocab: serde_json::Map<String, serde_json::Value> = specials
        .iter()
        .copied()
        .chain(words.split_whitespace())
        .enumerate()
        .map(|(i, t)| (t.to_string(), i.into()))
        .collect();
    assert_eq!(vocab.len(), VOCAB);
    let added: Vec<_> = specials
        .iter()
        .enumerate()
        .map(|(i, t)| {
            serde_json::json!({"id": i, "content": t, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    let json = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": added,
        "normalizer": {"type": "Lowercase"}, "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": null, "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"}
    });
    json.to_string().parse().expect("test tokenizer")
}
