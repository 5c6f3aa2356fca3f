//! The translation service, whatever the transport: validation, the model's queue, timing
//! and metrics. HTTP ([`crate::http`]) and gRPC ([`crate::grpc`]) only convert their wire
//! types to a [`TranslateRequest`] and map [`ApiError`]s to their own status codes.
//!
//! As in text-generation-inference's `validation.rs`, the model only ever sees checked input:
//! [`Infer::validate`] turns a request into a [`ValidRequest`] (texts tokenized and within
//! every limit, a model chosen, a length budget per text) before anything is queued.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tracing::Instrument;

use crate::decode::{DecodeInput, StopReason};
use crate::error::ApiError;
use crate::metrics::{input_length_bucket, Metrics};
use crate::package::TextCodec;
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
    /// From arrival to answer; longer gives 504 and the request leaves the batch.
    pub request_timeout: Duration,
}

/// The length a request asks for: a number of subword tokens, the source's length, or a
/// predicted natural length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TargetLength {
    Tokens(usize),
    Source,
    Auto,
}

/// A translation request as every transport delivers it.
#[derive(Clone, Debug, PartialEq)]
pub struct TranslateRequest {
    pub texts: Vec<String>,
    /// The model's name; `None` for the default model.
    pub model: Option<String>,
    pub target_length: Option<TargetLength>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Translation {
    /// The translated text.
    pub text: String,
    /// Subword tokens of the input (EOS not counted).
    pub source_tokens: usize,
    /// Subword tokens generated (EOS not counted).
    pub output_tokens: usize,
    /// The target length used for this text, in subword tokens: the request's, or for a
    /// length-aware model asked for none, the source's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_length: Option<usize>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
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
}

/// One entry of `GET /models`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelInfo {
    pub name: String,
    pub default: bool,
    pub source_language: String,
    pub target_language: String,
    pub variant: Variant,
    pub limits: ModelLimits,
}

/// How a model knows positions (the preset and its switches).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Variant {
    pub preset: String,
    pub architecture: model_package::Architecture,
    pub absolute_position: model_package::AbsolutePosition,
    pub relative_attention: model_package::RelativeAttention,
    pub recurrent_position: model_package::RecurrentPosition,
    pub length_encoding: model_package::LengthEncoding,
}

/// The limits a request to this model meets.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelLimits {
    /// Most subword tokens per input text.
    pub max_input_tokens: usize,
    /// Whether that limit is the model's own (absolute positions) or the server's.
    pub input_limit_from: LimitSource,
    /// Most subword tokens generated per text.
    pub max_output_tokens: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
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

/// A request that passed every check.
pub struct ValidRequest<'a> {
    pub model: &'a Model,
    pub inputs: Vec<DecodeInput>,
    pub source_tokens: Vec<usize>,
    /// Target length per text, when asked.
    pub targets: Vec<Option<usize>>,
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
            }),
        })
    }

    pub fn limits(&self) -> &RequestLimits {
        &self.inner.limits
    }

    pub fn metrics(&self) -> &Metrics {
        &self.inner.metrics
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
                target_length: None,
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
                "model `{name}` is not served here; models: {}",
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
        if let Some(TargetLength::Tokens(n)) = request.target_length {
            if n == 0 || n > max_output {
                return Err(ApiError::InvalidTargetLength(format!(
                    "target_length {n} is outside 1..={max_output} (the output limit of model `{}`)",
                    model.name
                )));
            }
        }
        if request.target_length == Some(TargetLength::Auto) {
            return Err(ApiError::Unsupported(format!(
                "target_length \"auto\" needs a length predictor, and model `{}` has none; \
                 give a number of subword tokens or \"source\"",
                model.name
            )));
        }
        let (input_limit, source) = model.input_limit(limits);
        let limit_name = match source {
            LimitSource::Model => format!("the longest input model `{}` can take", model.name),
            LimitSource::Server => "--max-input-tokens".to_string(),
        };
        let mut valid = ValidRequest {
            model,
            inputs: Vec::with_capacity(texts.len()),
            source_tokens: Vec::with_capacity(texts.len()),
            targets: Vec::with_capacity(texts.len()),
        };
        let _span = tracing::info_span!("tokenize", texts = texts.len()).entered();
        for (i, text) in texts.iter().enumerate() {
            if text.trim().is_empty() {
                return Err(ApiError::EmptyText(format!(
                    "text {i} is empty or only whitespace"
                )));
            }
            let ids = model
                .codec
                .encode(text)
                .map_err(|e| ApiError::Internal(format!("tokenizing text {i}: {e}")))?;
            if ids.len() > input_limit {
                return Err(ApiError::InputTooLong(format!(
                    "text {i} has {} subword tokens; the limit is {input_limit} ({limit_name})",
                    ids.len()
                )));
            }
            let source_ids = source_ids(&ids, model.eos_id);
            let source_length = ids.len().clamp(1, max_output);
            let target = match request.target_length {
                None if model.config.is_length_aware() => Some(source_length),
                None => None,
                Some(TargetLength::Tokens(n)) => Some(n),
                Some(TargetLength::Source) => Some(source_length),
                Some(TargetLength::Auto) => unreachable!("refused above"),
            };
            let free_budget = limits.output_budget(ids.len(), max_output);
            let input = match target {
                // A length-aware decoder plans the length itself (its length encoding is
                // fed the target); the budget only stops a runaway row.
                Some(n) if model.config.is_length_aware() => DecodeInput {
                    target_length: Some(n),
                    ..DecodeInput::new(
                        source_ids,
                        free_budget
                            .max(n + limits.max_length_offset)
                            .min(max_output),
                    )
                },
                // A model without length encodings meets the target by decoding: EOS is
                // banned before it and the row stops at it.
                Some(n) => DecodeInput {
                    source_ids,
                    min_output_tokens: n,
                    max_output_tokens: n,
                    target_length: None,
                },
                None => DecodeInput::new(source_ids, free_budget),
            };
            valid.inputs.push(input);
            valid.source_tokens.push(ids.len());
            valid.targets.push(target);
        }
        Ok(valid)
    }

    /// Validates, queues and decodes `request`, within the request timeout.
    pub async fn translate(
        &self,
        request: TranslateRequest,
    ) -> Result<TranslateResponse, ApiError> {
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
        let labels = [model.name.as_str(), bucket];
        for &n in &valid.source_tokens {
            metrics
                .input_length
                .with_label_values(&[&model.name])
                .observe(n as f64);
        }
        // The worker owns the inputs; the answer needs only the counts and targets.
        let inputs = std::mem::take(&mut valid.inputs);
        let remaining = timeout.saturating_sub(arrived.elapsed());
        let outcome = tokio::time::timeout(remaining, model.translator.translate(inputs)).await;
        let result = match outcome {
            Err(_) => Err(ApiError::Timeout(format!(
                "no answer within the request timeout of {:.1} s; the request was withdrawn",
                timeout.as_secs_f64()
            ))),
            Ok(Err(e)) => Err(ApiError::from(e)),
            Ok(Ok(finished)) => {
                self.record(&valid, bucket, &finished);
                let span = tracing::info_span!("detokenize");
                async { self.respond(&valid, finished) }
                    .instrument(span)
                    .await
            }
        };
        metrics
            .request_duration
            .with_label_values(&labels)
            .observe(arrived.elapsed().as_secs_f64());
        result
    }

    fn record(&self, valid: &ValidRequest<'_>, bucket: &str, finished: &Finished) {
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
        for ((sequence, &source), target) in finished
            .sequences
            .iter()
            .zip(&valid.source_tokens)
            .zip(&valid.targets)
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
            if let Some(asked) = target {
                metrics
                    .length_deviation
                    .with_label_values(&[name])
                    .observe(produced as f64 - *asked as f64);
            }
        }
    }

    fn respond(
        &self,
        valid: &ValidRequest<'_>,
        finished: Finished,
    ) -> Result<TranslateResponse, ApiError> {
        let translations = finished
            .sequences
            .into_iter()
            .zip(&valid.source_tokens)
            .zip(&valid.targets)
            .enumerate()
            .map(|(i, ((sequence, &source_tokens), &target_length))| {
                let text = valid
                    .model
                    .codec
                    .decode(&sequence.output.ids)
                    .map_err(|e| ApiError::Internal(format!("detokenizing text {i}: {e}")))?;
                if sequence.output.stop == StopReason::MaxLength && target_length.is_none() {
                    tracing::debug!(text = i, "stopped at the length bound without EOS");
                }
                Ok(Translation {
                    text,
                    source_tokens,
                    output_tokens: sequence.output.ids.len(),
                    target_length,
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
            request_timeout: Duration::from_secs(30),
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
}
