//! The translation service, whatever the transport: validation, the model's queue, timing
//! and metrics. The HTTP and gRPC APIs only convert their wire types to a [`TranslateRequest`]
//! and map [`ApiError`]s to their own status codes.
//!
//! As in text-generation-inference's `validation.rs`, the model only ever sees checked input:
//! [`Infer::validate`] turns a request into a [`ValidRequest`] (texts tokenized and within
//! every limit, a model chosen, a length budget per text) before anything is queued.

pub mod error;
pub mod schema;
pub mod types;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use nmt_engine::decode::{DecodeOutput, StopReason};
use nmt_engine::length::{LengthPlan, LengthRequest, TargetChars, TargetLength};
use nmt_engine::limits::LimitSource;
use nmt_engine::pipeline::{Attempts, Pipeline, Prediction, ValidText, PREDICTION_CHUNK};
use nmt_engine::sentences::{self, Sentences};
use nmt_engine::{EngineError, ValidationError};
use tokio::sync::Notify;
use tracing::Instrument;

pub use nmt_engine::limits::RequestLimits;

use crate::metrics::{input_length_bucket, Metrics};
use crate::scheduler::{Finished, Reservation, SequenceResult, Translator};

pub use error::ApiError;
pub use types::{
    LengthCandidate, ModelInfo, ModelLimits, PredictionKind, TranslateRequest, TranslateResponse,
    Translation, Variant,
};

/// One served model: the engine's pipeline for it, its worker, and what `/models` says.
pub struct Model {
    /// Validation, length planning and detokenizing, as every driver of the engine does them.
    pub pipeline: Pipeline,
    pub translator: Translator,
    /// The model's architecture and position switches (the manifest's `config`).
    pub config: model_package::ModelConfig,
    pub source_language: String,
    pub target_language: String,
    /// The number format of its weights (manifest `precision`).
    pub precision: model_package::Precision,
    /// What it was trained on (manifest `domains`).
    pub domains: Vec<String>,
    /// Where its weights came from ([`model_package::Manifest::origin`]).
    pub origin: String,
}

impl Model {
    pub fn name(&self) -> &str {
        &self.pipeline.name
    }
}

/// A request that passed every check: its model and its texts, each planned before it is
/// decoded (a prediction may be needed, which runs off the async runtime).
pub struct ValidRequest<'a> {
    pub model: &'a Model,
    /// What the model translates: the request's texts, or with `split_sentences` their
    /// sentences, text after text.
    pub texts: Vec<ValidText>,
    /// With `split_sentences`, each request text's sentences and the whitespace around them,
    /// to join `texts`' translations back into one per request text.
    pub split: Option<Vec<Sentences>>,
}

impl ValidRequest<'_> {
    /// The label of the longest text: a request is as slow as its longest text.
    fn input_length_bucket(&self) -> &'static str {
        input_length_bucket(
            self.texts
                .iter()
                .map(|t| t.source_tokens)
                .max()
                .unwrap_or(0),
        )
    }
}

/// With `split_sentences`, a request may hold this many sentences per text it may hold
/// (`--max-texts-per-request`).
pub const SENTENCES_PER_TEXT: usize = 16;

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
    /// Woken when the last request in flight is answered.
    none_in_flight: Notify,
}

/// Counts a request in flight while it lives.
struct InFlight<'a>(&'a Inner);

impl<'a> InFlight<'a> {
    fn enter(inner: &'a Inner) -> Self {
        inner.in_flight.fetch_add(1, Ordering::AcqRel);
        InFlight(inner)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if self.0.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.none_in_flight.notify_waiters();
        }
    }
}

/// How much of an unknown model's name an error quotes: enough to spot a typo, without
/// echoing a large body back to its sender.
const QUOTED_NAME_CHARS: usize = 64;

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
        // One set of limits for the whole service: each model's pipeline checks against it.
        let models: BTreeMap<String, Model> = models
            .into_iter()
            .map(|mut m| {
                m.pipeline.limits = limits.clone();
                (m.name().to_string(), m)
            })
            .collect();
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
                none_in_flight: Notify::new(),
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

    /// Completes once no translation request is in flight (at once if none is).
    pub async fn requests_answered(&self) {
        loop {
            let answered = self.inner.none_in_flight.notified();
            tokio::pin!(answered);
            // Registered before the count is read, so that a last answer in between wakes it.
            answered.as_mut().enable();
            if self.requests_in_flight() == 0 {
                return;
            }
            answered.await;
        }
    }

    pub fn default_model(&self) -> &str {
        &self.inner.default_model
    }

    pub fn models(&self) -> impl Iterator<Item = &Model> {
        self.inner.models.values()
    }

    /// What `GET /models` lists: every model, its variant and the limits its requests meet.
    pub fn model_infos(&self) -> Vec<ModelInfo> {
        self.inner
            .models
            .values()
            .map(|m| {
                let (max_input_tokens, input_limit_from) = m.pipeline.input_limit();
                let c = &m.config;
                let length = &m.pipeline.length;
                ModelInfo {
                    name: m.name().to_string(),
                    default: m.name() == self.inner.default_model,
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
                        max_output_tokens: m.pipeline.max_output(),
                    },
                    length_aware: length.length_aware,
                    length_prediction: if length.predictor.is_some() {
                        PredictionKind::Predictor
                    } else if length.linear_fit.is_some() {
                        PredictionKind::LinearFit
                    } else {
                        PredictionKind::None
                    },
                    precision: m.precision,
                    domains: m.domains.clone(),
                    origin: m.origin.clone(),
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
                split_sentences: false,
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
        let _span = tracing::info_span!("tokenize", texts = request.texts.len()).entered();
        if request.split_sentences {
            return self.validate_sentences(model, request);
        }
        let texts =
            model
                .pipeline
                .validate(request.texts, request.length, request.no_repeat_ngram_size)?;
        Ok(ValidRequest {
            model,
            texts,
            split: None,
        })
    }

    /// [`Infer::validate`] with `split_sentences`: the request's texts are checked as
    /// texts (count, emptiness), then cut into sentences, each checked and tokenized as a
    /// text of its own.
    fn validate_sentences<'a>(
        &self,
        model: &'a Model,
        request: TranslateRequest,
    ) -> Result<ValidRequest<'a>, ApiError> {
        let length = request.length;
        let whole_text_length = matches!(length.target, Some(TargetLength::Tokens(_)))
            || matches!(length.target_chars, Some(TargetChars::Chars(_)))
            || length.max_chars.is_some();
        if whole_text_length {
            return Err(ApiError::InvalidRequest(
                "a numeric target_length or target_chars and max_chars apply to whole texts; \
                 not with split_sentences (target_length \"source\" and \"auto\", and \
                 target_chars \"source\", apply to each sentence)"
                    .into(),
            ));
        }
        let pipeline = &model.pipeline;
        let ban =
            pipeline.check_request(request.texts.len(), &length, request.no_repeat_ngram_size)?;
        let limit = self.inner.limits.max_texts_per_request * SENTENCES_PER_TEXT;
        let mut split = Vec::with_capacity(request.texts.len());
        let mut count = 0;
        for (index, text) in request.texts.iter().enumerate() {
            let sentences = sentences::split(&model.source_language, text);
            if sentences.sentences.is_empty() {
                return Err(ValidationError::EmptyText { index }.into());
            }
            count += sentences.sentences.len();
            if count > limit {
                return Err(ApiError::TooManyTexts(format!(
                    "split_sentences cut the request's texts into more than {limit} sentences; \
                     the limit is {SENTENCES_PER_TEXT} times --max-texts-per-request \
                     ({}): send fewer or shorter texts",
                    self.inner.limits.max_texts_per_request
                )));
            }
            split.push(sentences);
        }
        let mut texts = Vec::with_capacity(count);
        for (index, sentences) in split.iter().enumerate() {
            for (number, sentence) in sentences.sentences.iter().enumerate() {
                let valid = pipeline
                    .validate_text(index, sentence.clone(), length, ban)
                    .map_err(|err| match err {
                        EngineError::Invalid(ValidationError::InputTooLong {
                            tokens,
                            limit,
                            limit_source,
                            model,
                            ..
                        }) => ApiError::InputTooLong(format!(
                            "sentence {number} of text {index} has {tokens} subword tokens; \
                             the limit is {limit} per sentence with split_sentences ({})",
                            match limit_source {
                                LimitSource::Server => "--max-input-tokens".to_string(),
                                LimitSource::Model =>
                                    format!("the longest input model `{model}` can take"),
                            }
                        )),
                        err => err.into(),
                    })?;
                texts.push(valid);
            }
        }
        Ok(ValidRequest {
            model,
            texts,
            split: Some(split),
        })
    }

    /// Validates, queues and decodes `request`, within the request timeout.
    pub async fn translate(
        &self,
        request: TranslateRequest,
    ) -> Result<TranslateResponse, ApiError> {
        let _in_flight = InFlight::enter(&self.inner);
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
        let mut valid = self.validate(request)?;
        let model = valid.model;
        let bucket = valid.input_length_bucket();
        let metrics = &self.inner.metrics;
        let labels = [model.name(), bucket];
        for text in &valid.texts {
            metrics
                .input_length
                .with_label_values(&[model.name()])
                .observe(text.source_tokens as f64);
        }
        let work = async {
            // Counted in at the door before the lengths are predicted, so that requests
            // arriving together are judged one after the other (a timeout drops it).
            let reservation = self.reserve(&valid)?;
            self.plan_lengths(&mut valid).await?;
            let decoded = self
                .decode_reserved(model, reservation, &valid.texts)
                .await?;
            self.record(&valid, bucket, &decoded);
            let mut attempts = decoded.into_attempts();
            self.second_round(model, &valid.texts, &mut attempts)
                .await?;
            let span = tracing::info_span!("detokenize");
            let translations = async { self.respond(model, &valid.texts, &attempts) }
                .instrument(span)
                .await?;
            let translations = match &valid.split {
                None => translations.into_iter().map(Translation::from).collect(),
                Some(split) => sentences::join_translations(split, translations)
                    .into_iter()
                    .zip(split)
                    .map(|(t, s)| Translation {
                        sentences: Some(s.sentences.len()),
                        ..Translation::from(t)
                    })
                    .collect(),
            };
            Ok(TranslateResponse {
                model: model.name().to_string(),
                translations,
            })
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

    /// Plans each text's length, with predictions where the request needs them.
    async fn plan_lengths(&self, valid: &mut ValidRequest<'_>) -> Result<(), ApiError> {
        let model = valid.model;
        let pipeline = &model.pipeline;
        let predicted = if valid.texts.iter().any(|t| pipeline.needs_prediction(t)) {
            let span = tracing::info_span!("predict_length", texts = valid.texts.len());
            let mut predicted = Vec::with_capacity(valid.texts.len());
            // A turn per chunk, not per request: the turns are first come, first served, so a
            // request of many texts lets the requests that came meanwhile predict between its
            // chunks instead of waiting for all of it.
            for chunk in valid.texts.chunks(PREDICTION_CHUNK) {
                predicted.extend(
                    self.predict_chunk(model, chunk.to_vec())
                        .instrument(span.clone())
                        .await?,
                );
            }
            predicted
        } else {
            vec![None; valid.texts.len()]
        };
        pipeline.set_plans(&mut valid.texts, predicted);
        Ok(())
    }

    /// The predicted lengths of some of a request's texts, after waiting for a turn at the
    /// predictor (429 at once when too many wait).
    async fn predict_chunk(
        &self,
        model: &Model,
        texts: Vec<ValidText>,
    ) -> Result<Vec<Prediction>, ApiError> {
        // Held by the blocking task, so the next turn comes when this prediction is done even
        // if this request has left by then.
        let turn = match &model.pipeline.length.predictor {
            Some(predictor) => match predictor.turn_unless_busy().await {
                Some(turn) => Some(turn),
                // Refused, not planned with the linear fit instead: a text's length plan (so
                // its translation) must not depend on what else the server is doing.
                None => {
                    return Err(ApiError::Overloaded {
                        message: format!(
                            "{} requests are waiting for the length predictor; retry shortly, \
                             or send target_length \"source\"",
                            predictor.queue_limit()
                        ),
                        retry_after_seconds: 1,
                    })
                }
            },
            None => None,
        };
        // The predictor is a neural network: keep it off the async runtime's threads.
        let (infer, name) = (self.clone(), model.name().to_string());
        tokio::task::spawn_blocking(move || {
            let _turn = turn;
            infer.inner.models[&name].pipeline.predict(&texts)
        })
        .await
        .map_err(|e| ApiError::Internal(format!("the length predictor task failed: {e}")))?
        .map_err(ApiError::from)
    }

    /// Counts the request in at its model's door, its texts under their plans, or under the
    /// linear fit's where a length is still to be predicted. A request the door refuses is
    /// refused before the predictor spends a turn on it: under overload, predictions for
    /// refused requests took the CPU the model needed.
    fn reserve(&self, valid: &ValidRequest<'_>) -> Result<Reservation, ApiError> {
        let pipeline = &valid.model.pipeline;
        let stand_in: Vec<_> = valid
            .texts
            .iter()
            .zip(pipeline.fit(&valid.texts))
            .flat_map(|(t, fit)| pipeline.rows_for(t, &pipeline.plan(t, fit)))
            .collect();
        Ok(valid.model.translator.reserve(&stand_in)?)
    }

    /// Sends the first rows of reserved `texts` to the model and waits for it.
    async fn decode_reserved(
        &self,
        model: &Model,
        reservation: Reservation,
        texts: &[ValidText],
    ) -> Result<Decoded, ApiError> {
        let plans: Vec<Vec<LengthPlan>> = texts
            .iter()
            .map(|t| model.pipeline.first_plans(t))
            .collect();
        let inputs = texts
            .iter()
            .zip(&plans)
            .flat_map(|(t, p)| model.pipeline.rows_of(t, p))
            .collect();
        let finished = model.translator.decode(reservation, inputs).await?;
        Ok(Decoded { finished, plans })
    }

    /// Decodes a second round for the texts none of whose candidates met their character
    /// goal, and adds it to their attempts. Past the door's reservation, as a request's
    /// own follow-up: only texts with a character goal ever have one.
    async fn second_round(
        &self,
        model: &Model,
        texts: &[ValidText],
        attempts: &mut [Attempts],
    ) -> Result<(), ApiError> {
        let pipeline = &model.pipeline;
        let second = texts
            .iter()
            .zip(attempts.iter())
            .enumerate()
            .map(|(i, (t, a))| pipeline.second_round(i, t, a))
            .collect::<Result<Vec<_>, _>>()?;
        if second.iter().all(Vec::is_empty) {
            return Ok(());
        }
        let inputs = texts
            .iter()
            .zip(&second)
            .flat_map(|(t, p)| pipeline.rows_of(t, p))
            .collect();
        let finished = model.translator.translate(inputs).await?;
        let mut outputs = finished.sequences.into_iter().map(|s| s.output);
        for (a, plans) in attempts.iter_mut().zip(second) {
            a.outputs.extend(outputs.by_ref().take(plans.len()));
            a.plans.extend(plans);
        }
        Ok(())
    }

    fn record(&self, valid: &ValidRequest<'_>, bucket: &str, decoded: &Decoded) {
        let metrics = &self.inner.metrics;
        let name = valid.model.name();
        let finished = &decoded.finished;
        metrics
            .queue_duration
            .with_label_values(&[name, bucket])
            .observe(finished.queue_time.as_secs_f64());
        metrics
            .inference_duration
            .with_label_values(&[name, bucket])
            .observe(finished.inference_time.as_secs_f64());
        for (text, rows) in valid.texts.iter().zip(decoded.per_text()) {
            for sequence in rows {
                let produced = sequence.output.ids.len();
                metrics
                    .output_length
                    .with_label_values(&[name])
                    .observe(produced as f64);
                if produced > 0 {
                    metrics
                        .time_per_output_token
                        .with_label_values(&[name, input_length_bucket(text.source_tokens)])
                        .observe(sequence.decode_time.as_secs_f64() / produced as f64);
                }
            }
            // A text decoded at several lengths has no one length asked.
            if let ([sequence], Some(asked)) = (rows, text.plan.target) {
                metrics
                    .length_deviation
                    .with_label_values(&[name])
                    .observe(sequence.output.ids.len() as f64 - asked as f64);
            }
        }
    }

    /// Each text's translation from what its rows gave.
    fn respond(
        &self,
        model: &Model,
        texts: &[ValidText],
        attempts: &[Attempts],
    ) -> Result<Vec<nmt_engine::Translation>, ApiError> {
        texts
            .iter()
            .zip(attempts)
            .enumerate()
            .map(|(i, (text, a))| {
                let budget = |o: &DecodeOutput| o.stop == StopReason::MaxLength;
                if a.outputs.len() == 1 && budget(&a.outputs[0]) && text.plan.target.is_none() {
                    tracing::debug!(text = i, "stopped at the length bound without EOS");
                }
                Ok(model.pipeline.finish(i, text, a)?)
            })
            .collect()
    }
}

/// What the model produced for a request: a row per text, or per candidate length of a text
/// with a character goal.
struct Decoded {
    finished: Finished,
    /// Each text's plans, one per row, in row order.
    plans: Vec<Vec<LengthPlan>>,
}

impl Decoded {
    /// Each text's rows, in text order.
    fn per_text(&self) -> impl Iterator<Item = &[SequenceResult]> {
        let mut rest = self.finished.sequences.as_slice();
        self.plans.iter().map(move |plans| {
            let (mine, after) = rest.split_at(plans.len().min(rest.len()));
            rest = after;
            mine
        })
    }

    /// Each text's attempts: its plans and what they gave.
    fn into_attempts(self) -> Vec<Attempts> {
        let mut outputs = self.finished.sequences.into_iter().map(|s| s.output);
        self.plans
            .into_iter()
            .map(|plans| Attempts {
                outputs: outputs.by_ref().take(plans.len()).collect(),
                plans,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nmt_engine::logits::MAX_NO_REPEAT_NGRAM_SIZE;
    use std::time::Duration;

    fn limits() -> RequestLimits {
        RequestLimits {
            max_texts_per_request: 64,
            max_input_tokens: 256,
            max_output_tokens: 100,
            max_body_bytes: 1 << 20,
            max_length_ratio: 1.5,
            max_length_offset: 10,
            length_pull: nmt_engine::length::DEFAULT_LENGTH_PULL,
            runaway_ratio: nmt_engine::length::DEFAULT_RUNAWAY_RATIO,
            exact_plans: nmt_engine::limits::DEFAULT_EXACT_PLANS,
            no_repeat_ngram_size: nmt_engine::logits::DEFAULT_NO_REPEAT_NGRAM_SIZE,
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
            request_timeout: Duration::from_secs(60),
        }
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
                split_sentences: false,
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
            split_sentences: false,
        };
        let ban = |n| {
            infer
                .validate(asking(n))
                .map(|v| v.texts[0].no_repeat_ngram_size)
        };
        assert_eq!(ban(None).unwrap(), 6);
        assert_eq!(ban(Some(0)).unwrap(), 0);
        assert_eq!(ban(Some(MAX_NO_REPEAT_NGRAM_SIZE)).unwrap(), 64);
        let err = ban(Some(65)).expect_err("past the maximum");
        assert_eq!(err.error_type(), "invalid_request");
        assert!(err.to_string().contains("from 0 (off) to 64"), "{err}");
    }
}
