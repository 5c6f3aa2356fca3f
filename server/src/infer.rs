//! The translation service, whatever the transport: validation, the model's queue, timing
//! and metrics. HTTP ([`crate::http`]) and gRPC ([`crate::grpc`]) only convert their wire
//! types to a [`TranslateRequest`] and map [`ApiError`]s to their own status codes.
//!
//! As in text-generation-inference's `validation.rs`, the model only ever sees checked input:
//! [`Infer::validate`] turns a request into a [`ValidRequest`] (texts tokenized and within
//! every limit, a model chosen, a length budget per text) before anything is queued.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tracing::Instrument;
use utoipa::ToSchema;

use crate::decode::{DecodeInput, StopReason};
use crate::error::ApiError;
use crate::length::{self, LengthMode, LengthModel, LengthPlan, LengthRequest, LengthSource};
use crate::logits::MAX_NO_REPEAT_NGRAM_SIZE;
use crate::metrics::{input_length_bucket, Metrics};
use crate::openapi;
use crate::package::{Prepared, Restore, TextCodec};
use crate::scheduler::{Finished, Translator};

/// Limits every request is checked against.
#[derive(Clone, Debug, PartialEq)]
pub struct RequestLimits {
    /// Texts in one request.
    pub max_texts_per_request: usize,
    /// Subword tokens in one text (EOS not counted).
    pub max_input_tokens: usize,
    /// Subword tokens generated for one text (EOS not counted).
    pub max_output_tokens: usize,
    /// Size of a request body (HTTP) or message (gRPC).
    pub max_body_bytes: usize,
    /// Without a target length, a text stops after `ratio * source_tokens + offset` tokens.
    pub max_length_ratio: f64,
    pub max_length_offset: usize,
    /// Soft length mode's pull of EOS toward the target length, in logits per subword of
    /// distance beyond ±1 ([`crate::logits::EosRule::Pull`]); 0 leaves the ending to the
    /// length encoding alone.
    pub length_pull: f32,
    /// Soft mode toward a predicted length: a translation that runs past this many times the
    /// prediction (plus [`crate::length::RUNAWAY_SLACK`]) has its end pulled
    /// ([`crate::logits::EosRule::PullAfter`]); 0 never.
    pub runaway_ratio: f64,
    /// No n-gram of this many subwords is generated twice, unless a request says otherwise
    /// (0: off).
    pub no_repeat_ngram_size: usize,
    /// From arrival to answer; longer gives 504 and the request leaves the batch.
    pub request_timeout: Duration,
}

/// A translation request as every transport delivers it.
#[derive(Clone, Debug, PartialEq)]
pub struct TranslateRequest {
    pub texts: Vec<String>,
    /// The model's name; `None` for the default model.
    pub model: Option<String>,
    pub length: LengthRequest,
    /// `no_repeat_ngram_size`; `None` for the server's default.
    pub no_repeat_ngram_size: Option<usize>,
}

/// One text's translation. Fields that do not apply are left out, never `null`.
// `nullable = false`: utoipa takes an `Option` for `null`, serde here for absent.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Translation {
    /// The translated text.
    pub text: String,
    /// Subword tokens of the input (EOS not counted).
    pub source_tokens: usize,
    /// Subword tokens generated (EOS not counted).
    pub output_tokens: usize,
    /// The target length this text was decoded for, in subword tokens; absent for free
    /// decoding.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub target_length: Option<usize>,
    /// Where `target_length` came from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub length_source: Option<LengthSource>,
    /// The predicted natural length (subwords, unrounded), when a prediction was made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub predicted_length: Option<f64>,
    /// How `target_length` was met; absent for free decoding.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub length_mode: Option<LengthMode>,
    /// The translation was longer than `max_chars` and was cut at the last word boundary that
    /// fits.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    #[schema(default = false)]
    pub truncated: bool,
}

/// The answer to `POST /translate`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct TranslateResponse {
    /// The model that translated.
    pub model: String,
    /// One per input text, in input order.
    pub translations: Vec<Translation>,
}

/// One served model: its tokenizer, its worker and its limits.
pub struct Model {
    pub name: String,
    /// The model's architecture and position switches (the manifest's `config`).
    pub config: model_package::ModelConfig,
    pub source_language: String,
    pub target_language: String,
    pub codec: TextCodec,
    pub translator: Translator,
    pub eos_id: u32,
    /// The model's own input bound (absolute positions), EOS not counted; `None` when it has
    /// none beyond the request limits.
    pub max_source_tokens: Option<usize>,
    /// The model's own output bound (manifest `limits.max_target_tokens`).
    pub max_target_tokens: usize,
    /// Whether its decoder plans a length, and how it predicts one.
    pub length: LengthModel,
    /// The number format of its weights (manifest `precision`).
    pub precision: model_package::Precision,
    /// What it was trained on (manifest `domains`).
    pub domains: Vec<String>,
}

/// One entry of `GET /models`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ModelInfo {
    /// The model's name, as requests give it in `model`.
    pub name: String,
    /// Whether requests that name no model get this one.
    pub default: bool,
    pub source_language: String,
    pub target_language: String,
    pub variant: Variant,
    pub limits: ModelLimits,
    /// Whether the decoder plans a translation of a given length (LDPE/LRPE), so that
    /// `length_mode` `soft` can be used.
    pub length_aware: bool,
    /// What `target_length` `"auto"` uses: the package's learned predictor (the linear fit
    /// for sources too long for it), a linear fit on the source length, or nothing (`"auto"`
    /// refused unless the model is length-aware, which then uses the source length).
    pub length_prediction: PredictionKind,
    /// Number format of the model's weights: `int8` packages (`nmt-export quantize`) are
    /// smaller and faster on CPU, and may translate slightly differently from their `float32`
    /// original.
    #[schema(value_type = openapi::PrecisionSchema)]
    pub precision: model_package::Precision,
    /// What text the model was trained on: it translates these domains well and others
    /// poorly. Empty when the package does not say.
    pub domains: Vec<String>,
}

/// What `target_length` `"auto"` uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum PredictionKind {
    /// The package's learned predictor (with the linear fit for sources too long for it).
    Predictor,
    /// A linear fit on the source length only.
    LinearFit,
    /// None: `"auto"` is refused (or, for a length-aware model, the source length is used).
    None,
}

/// How a model knows positions (the preset and its switches).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Variant {
    /// The named preset the model was configured from.
    pub preset: String,
    #[schema(value_type = openapi::ArchitectureSchema)]
    pub architecture: model_package::Architecture,
    #[schema(value_type = openapi::AbsolutePositionSchema)]
    pub absolute_position: model_package::AbsolutePosition,
    #[schema(value_type = openapi::RelativeAttentionSchema)]
    pub relative_attention: model_package::RelativeAttention,
    #[schema(value_type = openapi::RecurrentPositionSchema)]
    pub recurrent_position: model_package::RecurrentPosition,
    #[schema(value_type = openapi::LengthEncodingSchema)]
    pub length_encoding: model_package::LengthEncoding,
}

/// The limits a request to this model meets.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ModelLimits {
    /// Most subword tokens per input text.
    pub max_input_tokens: usize,
    /// Whether that limit is the model's own (`model`: it has absolute positions and declares
    /// the longest input it can take) or the server's (`--max-input-tokens`).
    pub input_limit_from: LimitSource,
    /// Most subword tokens generated per text.
    pub max_output_tokens: usize,
}

/// Whose limit `max_input_tokens` is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum LimitSource {
    Model,
    Server,
}

impl Model {
    /// The input limit that applies, and where it comes from.
    fn input_limit(&self, limits: &RequestLimits) -> (usize, LimitSource) {
        limits.input_limit(self.max_source_tokens)
    }
}

// The rules that turn a text into decoder input, public so that offline tools (`nmt-eval`)
// decode exactly as a request is decoded here.
impl RequestLimits {
    /// The input limit for a model whose own bound is `model_max` (EOS not counted; `None`
    /// when it has none), and where it comes from.
    pub fn input_limit(&self, model_max: Option<usize>) -> (usize, LimitSource) {
        match model_max {
            Some(m) if m < self.max_input_tokens => (m, LimitSource::Model),
            _ => (self.max_input_tokens, LimitSource::Server),
        }
    }

    /// Most tokens generated per text for a model whose own bound is `model_max`.
    pub fn max_output(&self, model_max: usize) -> usize {
        self.max_output_tokens.min(model_max)
    }

    /// The output budget of a text of `source_tokens` subwords decoded without a target
    /// length: `ratio * source_tokens + offset`, within `1..=max_output`.
    pub fn output_budget(&self, source_tokens: usize, max_output: usize) -> usize {
        let bound =
            (self.max_length_ratio * source_tokens as f64).ceil() as usize + self.max_length_offset;
        bound.clamp(1, max_output)
    }
}

/// The encoder input of a text's subword `ids`: EOS appended, as the model was trained.
pub fn source_ids(ids: &[u32], eos_id: u32) -> Vec<i64> {
    ids.iter()
        .map(|&id| i64::from(id))
        .chain([i64::from(eos_id)])
        .collect()
}

/// A request that passed every check; each text's length is planned after (a prediction
/// may be needed, which runs off the async runtime).
pub struct ValidRequest<'a> {
    pub model: &'a Model,
    pub texts: Vec<String>,
    /// Encoder input per text (EOS appended).
    pub source_ids: Vec<Vec<i64>>,
    pub source_tokens: Vec<usize>,
    /// What each translation gets back after decoding (masked placeholders, edges).
    pub restores: Vec<Restore>,
    pub length: LengthRequest,
    /// The request's `no_repeat_ngram_size`, or the server's.
    pub no_repeat_ngram_size: usize,
}

impl ValidRequest<'_> {
    /// The label of the longest text: a request is as slow as its longest text.
    fn input_length_bucket(&self) -> &'static str {
        input_length_bucket(self.source_tokens.iter().copied().max().unwrap_or(0))
    }
}

/// The service; cheap to clone.
#[derive(Clone)]
pub struct Infer {
    inner: Arc<Inner>,
}

struct Inner {
    models: BTreeMap<String, Model>,
    default_model: String,
    limits: RequestLimits,
    metrics: Arc<Metrics>,
    ready: AtomicBool,
    /// Translation requests between arrival and answer.
    in_flight: AtomicUsize,
}

/// Counts a request in flight while it lives.
struct InFlight<'a>(&'a AtomicUsize);

impl<'a> InFlight<'a> {
    fn enter(count: &'a AtomicUsize) -> Self {
        count.fetch_add(1, Ordering::AcqRel);
        InFlight(count)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// How much of an unknown model's name an error quotes: enough to spot a typo, without
/// echoing a large body back to its sender.
const QUOTED_NAME_CHARS: usize = 64;

/// Texts of one request predicted in one turn at the length predictor (see
/// [`Infer::predict_chunk`]): small enough that others' turns come between a large request's
/// chunks, large enough that BERT still runs batched.
const PREDICTION_CHUNK: usize = 8;

/// `name` in backquotes, cut to [`QUOTED_NAME_CHARS`] with its length in bytes when longer.
fn quoted_name(name: &str) -> String {
    if name.chars().count() <= QUOTED_NAME_CHARS {
        return format!("`{name}`");
    }
    let head: String = name.chars().take(QUOTED_NAME_CHARS).collect();
    format!("`{head}…` ({} bytes)", name.len())
}

impl Infer {
    /// Serves `models` (at least one); `default_model` answers requests that name none.
    pub fn new(
        models: Vec<Model>,
        default_model: &str,
        limits: RequestLimits,
        metrics: Arc<Metrics>,
    ) -> anyhow::Result<Self> {
        let models: BTreeMap<String, Model> =
            models.into_iter().map(|m| (m.name.clone(), m)).collect();
        if !models.contains_key(default_model) {
            anyhow::bail!(
                "the default model `{default_model}` is not among the loaded models {:?}",
                models.keys().collect::<Vec<_>>()
            );
        }
        Ok(Infer {
            inner: Arc::new(Inner {
                models,
                default_model: default_model.to_string(),
                limits,
                metrics,
                ready: AtomicBool::new(false),
                in_flight: AtomicUsize::new(0),
            }),
        })
    }

    pub fn limits(&self) -> &RequestLimits {
        &self.inner.limits
    }

    pub fn metrics(&self) -> &Metrics {
        &self.inner.metrics
    }

    /// The metrics, for what outlives a borrow of the service (the connection tasks).
    pub fn shared_metrics(&self) -> Arc<Metrics> {
        self.inner.metrics.clone()
    }

    /// Translation requests that have arrived and not been answered.
    pub fn requests_in_flight(&self) -> usize {
        self.inner.in_flight.load(Ordering::Acquire)
    }

    pub fn default_model(&self) -> &str {
        &self.inner.default_model
    }

    pub fn models(&self) -> impl Iterator<Item = &Model> {
        self.inner.models.values()
    }

    /// What `GET /models` lists: every model, its variant and the limits its requests meet.
    pub fn model_infos(&self) -> Vec<ModelInfo> {
        let limits = &self.inner.limits;
        self.inner
            .models
            .values()
            .map(|m| {
                let (max_input_tokens, input_limit_from) = m.input_limit(limits);
                let c = &m.config;
                ModelInfo {
                    name: m.name.clone(),
                    default: m.name == self.inner.default_model,
                    source_language: m.source_language.clone(),
                    target_language: m.target_language.clone(),
                    variant: Variant {
                        preset: c.preset.clone(),
                        architecture: c.architecture,
                        absolute_position: c.absolute_position,
                        relative_attention: c.relative_attention,
                        recurrent_position: c.recurrent_position,
                        length_encoding: c.length_encoding,
                    },
                    limits: ModelLimits {
                        max_input_tokens,
                        input_limit_from,
                        max_output_tokens: limits.max_output(m.max_target_tokens),
                    },
                    length_aware: m.length.length_aware,
                    length_prediction: if m.length.predictor.is_some() {
                        PredictionKind::Predictor
                    } else if m.length.linear_fit.is_some() {
                        PredictionKind::LinearFit
                    } else {
                        PredictionKind::None
                    },
                    precision: m.precision,
                    domains: m.domains.clone(),
                }
            })
            .collect()
    }

    /// Ready means every model answered a warm-up translation and the server is not
    /// shutting down.
    pub fn is_ready(&self) -> bool {
        self.inner.ready.load(Ordering::Acquire)
    }

    pub fn set_ready(&self, ready: bool) {
        self.inner.ready.store(ready, Ordering::Release);
    }

    /// Translates one sentence with every model, so that the first real request does not
    /// pay for ONNX Runtime's lazy initialisation, then marks the service ready.
    pub async fn warm_up(&self) -> Result<(), ApiError> {
        for name in self.inner.models.keys() {
            let started = Instant::now();
            self.run(TranslateRequest {
                // Short enough for any model's input limit.
                texts: vec!["Hello.".into()],
                model: Some(name.clone()),
                length: LengthRequest::default(),
                no_repeat_ngram_size: None,
            })
            .await?;
            tracing::info!(model = %name, elapsed_ms = started.elapsed().as_millis() as u64, "warm-up translation done");
        }
        self.set_ready(true);
        Ok(())
    }

    /// Checks `request` against the limits and the model, and tokenizes it.
    pub fn validate(&self, request: TranslateRequest) -> Result<ValidRequest<'_>, ApiError> {
        let name = request
            .model
            .as_deref()
            .unwrap_or(&self.inner.default_model);
        let model = self.inner.models.get(name).ok_or_else(|| {
            ApiError::ModelNotFound(format!(
                "model {} is not served here; models: {}",
                quoted_name(name),
                self.inner
                    .models
                    .keys()
                    .map(|k| format!("`{k}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        })?;
        let limits = &self.inner.limits;
        let texts = request.texts;
        if texts.is_empty() {
            return Err(ApiError::EmptyText("`text` is an empty list".into()));
        }
        if texts.len() > limits.max_texts_per_request {
            return Err(ApiError::TooManyTexts(format!(
                "{} texts in one request; the limit is {} (--max-texts-per-request)",
                texts.len(),
                limits.max_texts_per_request
            )));
        }
        let max_output = limits.max_output(model.max_target_tokens);
        model
            .length
            .check(&request.length, &model.name, max_output)?;
        let no_repeat_ngram_size = match request.no_repeat_ngram_size {
            Some(n) if n > MAX_NO_REPEAT_NGRAM_SIZE => {
                return Err(ApiError::InvalidRequest(format!(
                    "no_repeat_ngram_size is {n}; it must be from 0 (off) to \
                     {MAX_NO_REPEAT_NGRAM_SIZE}"
                )))
            }
            Some(n) => n,
            None => limits.no_repeat_ngram_size,
        };
        let (input_limit, source) = model.input_limit(limits);
        let limit_name = match source {
            LimitSource::Model => format!("the longest input model `{}` can take", model.name),
            LimitSource::Server => "--max-input-tokens".to_string(),
        };
        let mut valid = ValidRequest {
            model,
            texts: Vec::new(),
            source_ids: Vec::with_capacity(texts.len()),
            source_tokens: Vec::with_capacity(texts.len()),
            restores: Vec::with_capacity(texts.len()),
            length: request.length,
            no_repeat_ngram_size,
        };
        let _span = tracing::info_span!("tokenize", texts = texts.len()).entered();
        for (i, text) in texts.iter().enumerate() {
            if text.trim().is_empty() {
                return Err(ApiError::EmptyText(format!(
                    "text {i} is empty or only whitespace"
                )));
            }
            let Prepared { ids, restore } = model
                .codec
                .prepare(text)
                .map_err(|e| ApiError::Internal(format!("tokenizing text {i}: {e}")))?;
            if ids.len() > input_limit {
                return Err(ApiError::InputTooLong(format!(
                    "text {i} has {} subword tokens; the limit is {input_limit} ({limit_name})",
                    ids.len()
                )));
            }
            valid.source_ids.push(source_ids(&ids, model.eos_id));
            valid.source_tokens.push(ids.len());
            valid.restores.push(restore);
        }
        valid.texts = texts;
        Ok(valid)
    }

    /// Validates, queues and decodes `request`, within the request timeout.
    pub async fn translate(
        &self,
        request: TranslateRequest,
    ) -> Result<TranslateResponse, ApiError> {
        let _in_flight = InFlight::enter(&self.inner.in_flight);
        if !self.is_ready() {
            return Err(ApiError::NotReady(
                "the server is starting or shutting down; retry shortly".into(),
            ));
        }
        self.run(request).await
    }

    async fn run(&self, request: TranslateRequest) -> Result<TranslateResponse, ApiError> {
        let arrived = Instant::now();
        let timeout = self.inner.limits.request_timeout;
        let valid = self.validate(request)?;
        let model = valid.model;
        let bucket = valid.input_length_bucket();
        let metrics = &self.inner.metrics;
        let labels = [model.name.as_str(), bucket];
        for &n in &valid.source_tokens {
            metrics
                .input_length
                .with_label_values(&[&model.name])
                .observe(n as f64);
        }
        let work = async {
            let plans = self.plan_lengths(&valid).await?;
            let finished = self.decode(&valid, &plans).await?;
            self.record(&valid, bucket, &finished, &plans);
            let span = tracing::info_span!("detokenize");
            let response = async { self.respond(&valid, &plans, finished) }
                .instrument(span)
                .await?;
            self.fit_chars(&valid, plans, response).await
        };
        let result =
            match tokio::time::timeout(timeout.saturating_sub(arrived.elapsed()), work).await {
                Err(_) => Err(ApiError::Timeout(format!(
                    "no answer within the request timeout of {:.1} s; the request was withdrawn",
                    timeout.as_secs_f64()
                ))),
                Ok(result) => result,
            };
        // Answered requests only: refusals (429 in microseconds) and timeouts would pull the
        // percentiles down exactly when the server is overloaded; nmt_errors_total counts them.
        if result.is_ok() {
            metrics
                .request_duration
                .with_label_values(&labels)
                .observe(arrived.elapsed().as_secs_f64());
        }
        result
    }

    /// Each text's length plan, with predictions where the request needs them.
    async fn plan_lengths(&self, valid: &ValidRequest<'_>) -> Result<Vec<LengthPlan>, ApiError> {
        let model = valid.model;
        let max_output = self.inner.limits.max_output(model.max_target_tokens);
        let plan = |predicted: Vec<Option<(f64, LengthSource)>>| -> Vec<LengthPlan> {
            valid
                .source_tokens
                .iter()
                .zip(predicted)
                .map(|(&n, p)| length::plan(&valid.length, &model.length, n, p, max_output))
                .collect()
        };
        let predicted = if length::needs_prediction(&valid.length, &model.length) {
            // A request the door would refuse anyway is refused before the predictor spends a
            // turn on it: under overload, predictions for refused requests took the CPU the
            // model needed. The linear fit's plans stand in for the predicted ones.
            let fitted = plan(model.length.fit(&valid.source_tokens));
            model
                .translator
                .check(&self.decode_inputs(valid, &fitted))?;
            let span = tracing::info_span!("predict_length", texts = valid.texts.len());
            let mut predicted = Vec::with_capacity(valid.texts.len());
            // A turn per chunk, not per request: the turns are first come, first served, so a
            // request of many texts lets the requests that came meanwhile predict between its
            // chunks instead of waiting for all of it.
            for (texts, tokens) in valid
                .texts
                .chunks(PREDICTION_CHUNK)
                .zip(valid.source_tokens.chunks(PREDICTION_CHUNK))
            {
                predicted.extend(
                    self.predict_chunk(model, texts.to_vec(), tokens.to_vec())
                        .instrument(span.clone())
                        .await?,
                );
            }
            predicted
        } else {
            vec![None; valid.texts.len()]
        };
        Ok(plan(predicted))
    }

    /// The predicted lengths of some of a request's texts, after waiting for a turn at the
    /// predictor (the linear fit at once when too many wait).
    async fn predict_chunk(
        &self,
        model: &Model,
        texts: Vec<String>,
        tokens: Vec<usize>,
    ) -> Result<Vec<Option<(f64, LengthSource)>>, ApiError> {
        // Held by the blocking task, so the next turn comes when this prediction is done even
        // if this request has left by then.
        let turn = match &model.length.predictor {
            Some(predictor) => match predictor.turn_unless_busy().await {
                Some(turn) => Some(turn),
                None => {
                    tracing::debug!("the length predictor is busy: linear fit");
                    return Ok(model.length.fit(&tokens));
                }
            },
            None => None,
        };
        // The predictor is a neural network: keep it off the async runtime's threads.
        let (infer, name) = (self.clone(), model.name.clone());
        tokio::task::spawn_blocking(move || {
            let _turn = turn;
            let texts: Vec<&str> = texts.iter().map(String::as_str).collect();
            infer.inner.models[&name].length.predict(&texts, &tokens)
        })
        .await
        .map_err(|e| ApiError::Internal(format!("the length predictor task failed: {e}")))?
        .map_err(|e| ApiError::Internal(format!("predicting lengths: {e:#}")))
    }

    /// Queues the texts under `plans` and waits for the model.
    async fn decode(
        &self,
        valid: &ValidRequest<'_>,
        plans: &[LengthPlan],
    ) -> Result<Finished, ApiError> {
        let inputs = self.decode_inputs(valid, plans);
        Ok(valid.model.translator.translate(inputs).await?)
    }

    /// What the model's queue takes: each text's source under its plan.
    fn decode_inputs(&self, valid: &ValidRequest<'_>, plans: &[LengthPlan]) -> Vec<DecodeInput> {
        let model = valid.model;
        let limits = &self.inner.limits;
        let max_output = limits.max_output(model.max_target_tokens);
        valid
            .source_ids
            .iter()
            .zip(&valid.source_tokens)
            .zip(plans)
            .map(|((ids, &tokens), plan)| DecodeInput {
                no_repeat_ngram_size: valid.no_repeat_ngram_size,
                ..length::decode_input(
                    ids.clone(),
                    tokens,
                    plan,
                    valid.length.mode,
                    model.length.length_aware,
                    limits,
                    max_output,
                )
            })
            .collect()
    }

    /// Meets `max_chars`: texts over it are decoded once more for proportionally fewer
    /// subwords, and whatever is still over is cut at the last word boundary that fits.
    async fn fit_chars(
        &self,
        valid: &ValidRequest<'_>,
        plans: Vec<LengthPlan>,
        mut response: TranslateResponse,
    ) -> Result<TranslateResponse, ApiError> {
        let Some(max_chars) = valid.length.max_chars else {
            return Ok(response);
        };
        let chars = |t: &Translation| t.text.chars().count();
        let over: Vec<usize> = (0..response.translations.len())
            .filter(|&i| chars(&response.translations[i]) > max_chars)
            .collect();
        if !over.is_empty() {
            let retry = ValidRequest {
                model: valid.model,
                texts: over.iter().map(|&i| valid.texts[i].clone()).collect(),
                source_ids: over.iter().map(|&i| valid.source_ids[i].clone()).collect(),
                source_tokens: over.iter().map(|&i| valid.source_tokens[i]).collect(),
                restores: over.iter().map(|&i| valid.restores[i].clone()).collect(),
                length: valid.length,
                no_repeat_ngram_size: valid.no_repeat_ngram_size,
            };
            let retry_plans: Vec<LengthPlan> = over
                .iter()
                .map(|&i| {
                    let t = &response.translations[i];
                    length::shorter_plan(&plans[i], t.output_tokens, chars(t), max_chars)
                })
                .collect();
            let finished = self.decode(&retry, &retry_plans).await?;
            let retried = self.respond(&retry, &retry_plans, finished)?;
            for (&i, t) in over.iter().zip(retried.translations) {
                if chars(&t) < chars(&response.translations[i]) {
                    response.translations[i] = t;
                }
            }
        }
        for (i, t) in response.translations.iter_mut().enumerate() {
            if let Some(cut) = length::cut_to_chars(&t.text, max_chars) {
                // The client is told the length of what it gets, not of what was decoded.
                t.output_tokens = valid
                    .model
                    .codec
                    .encode(&cut)
                    .map_err(|e| ApiError::Internal(format!("tokenizing the cut text {i}: {e}")))?
                    .len();
                t.text = cut;
                t.truncated = true;
            }
        }
        Ok(response)
    }

    fn record(
        &self,
        valid: &ValidRequest<'_>,
        bucket: &str,
        finished: &Finished,
        plans: &[LengthPlan],
    ) {
        let metrics = &self.inner.metrics;
        let name = valid.model.name.as_str();
        metrics
            .queue_duration
            .with_label_values(&[name, bucket])
            .observe(finished.queue_time.as_secs_f64());
        metrics
            .inference_duration
            .with_label_values(&[name, bucket])
            .observe(finished.inference_time.as_secs_f64());
        for ((sequence, &source), plan) in finished
            .sequences
            .iter()
            .zip(&valid.source_tokens)
            .zip(plans)
        {
            let produced = sequence.output.ids.len();
            metrics
                .output_length
                .with_label_values(&[name])
                .observe(produced as f64);
            if produced > 0 {
                metrics
                    .time_per_output_token
                    .with_label_values(&[name, input_length_bucket(source)])
                    .observe(sequence.decode_time.as_secs_f64() / produced as f64);
            }
            if let Some(asked) = plan.target {
                metrics
                    .length_deviation
                    .with_label_values(&[name])
                    .observe(produced as f64 - asked as f64);
            }
        }
    }

    fn respond(
        &self,
        valid: &ValidRequest<'_>,
        plans: &[LengthPlan],
        finished: Finished,
    ) -> Result<TranslateResponse, ApiError> {
        let translations = finished
            .sequences
            .into_iter()
            .zip(&valid.source_tokens)
            .zip(plans)
            .enumerate()
            .map(|(i, ((sequence, &source_tokens), plan))| {
                let text = valid
                    .model
                    .codec
                    .finish(&sequence.output.ids, &valid.restores[i])
                    .map_err(|e| ApiError::Internal(format!("detokenizing text {i}: {e}")))?;
                if sequence.output.stop == StopReason::MaxLength && plan.target.is_none() {
                    tracing::debug!(text = i, "stopped at the length bound without EOS");
                }
                Ok(Translation {
                    text,
                    source_tokens,
                    output_tokens: sequence.output.ids.len(),
                    target_length: plan.target,
                    length_source: plan.source,
                    predicted_length: plan.predicted,
                    length_mode: plan.target.map(|_| valid.length.mode),
                    truncated: false,
                })
            })
            .collect::<Result<Vec<_>, ApiError>>()?;
        Ok(TranslateResponse {
            model: valid.model.name.clone(),
            translations,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> RequestLimits {
        RequestLimits {
            max_texts_per_request: 64,
            max_input_tokens: 256,
            max_output_tokens: 100,
            max_body_bytes: 1 << 20,
            max_length_ratio: 1.5,
            max_length_offset: 10,
            length_pull: crate::length::DEFAULT_LENGTH_PULL,
            runaway_ratio: crate::length::DEFAULT_RUNAWAY_RATIO,
            no_repeat_ngram_size: crate::logits::DEFAULT_NO_REPEAT_NGRAM_SIZE,
            request_timeout: Duration::from_secs(30),
        }
    }

    fn scheduler() -> crate::scheduler::SchedulerConfig {
        crate::scheduler::SchedulerConfig {
            batching: crate::scheduler::Batching::Continuous,
            max_batch_size: 8,
            max_batch_tokens: 1000,
            max_queued_requests: 8,
            max_queue_wait: Duration::from_secs(60),
        }
    }

    #[test]
    fn decoding_rules_for_a_text_without_a_target_length() {
        let limits = limits();
        // ceil(1.5 * 7) + 10 = 21; capped by the model's bound and kept at least 1.
        assert_eq!(limits.output_budget(7, 100), 21);
        assert_eq!(limits.output_budget(200, limits.max_output(64)), 64);
        assert_eq!(
            RequestLimits {
                max_length_offset: 0,
                ..limits.clone()
            }
            .output_budget(0, 64),
            1
        );
        assert_eq!(limits.input_limit(Some(127)), (127, LimitSource::Model));
        assert_eq!(limits.input_limit(Some(300)), (256, LimitSource::Server));
        assert_eq!(limits.input_limit(None), (256, LimitSource::Server));
        assert_eq!(source_ids(&[5, 9], 2), vec![5, 9, 2]);
    }

    #[tokio::test]
    async fn an_unknown_model_name_is_not_echoed_in_full() {
        use crate::testing::{self, CopyBackend};
        let infer = testing::infer(CopyBackend::default(), limits(), scheduler());
        let name = format!("{}-tail", "m".repeat(10_000));
        let err = infer
            .translate(TranslateRequest {
                texts: vec!["hello".into()],
                model: Some(name),
                length: LengthRequest::default(),
                no_repeat_ngram_size: None,
            })
            .await
            .expect_err("an unknown model is refused");
        let message = err.to_string();
        assert_eq!(err.error_type(), "model_not_found");
        assert!(message.len() < 300, "{} bytes: {message}", message.len());
        assert!(message.contains("mmmm"), "{message}");
        assert!(message.contains("10005 bytes"), "{message}");
        assert!(message.contains("`dev-copy`"), "{message}");
    }

    #[tokio::test]
    async fn a_request_chooses_its_ngram_ban_within_the_limit_or_gets_the_servers() {
        use crate::testing::{self, CopyBackend};
        let server_default = RequestLimits {
            no_repeat_ngram_size: 6,
            ..limits()
        };
        let infer = testing::infer(CopyBackend::default(), server_default, scheduler());
        let asking = |n| TranslateRequest {
            texts: vec!["hello".into()],
            model: None,
            length: LengthRequest::default(),
            no_repeat_ngram_size: n,
        };
        let ban = |n| infer.validate(asking(n)).map(|v| v.no_repeat_ngram_size);
        assert_eq!(ban(None).unwrap(), 6);
        assert_eq!(ban(Some(0)).unwrap(), 0);
        assert_eq!(ban(Some(MAX_NO_REPEAT_NGRAM_SIZE)).unwrap(), 64);
        let err = ban(Some(65)).expect_err("past the maximum");
        assert_eq!(err.error_type(), "invalid_request");
        assert!(err.to_string().contains("from 0 (off) to 64"), "{err}");
    }
}
