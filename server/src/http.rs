//! The HTTP API: `POST /translate`, `GET /health`.

use std::fmt;
use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, FromRequest, Request, State};
use axum::http::{Method, Uri};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};

use crate::decode::DecodeInput;
use crate::error::ApiError;
use crate::package::TextCodec;
use crate::worker::Translator;

/// Request limits and the decode length bound.
#[derive(Clone, Debug, PartialEq)]
pub struct Limits {
    /// Texts in one request.
    pub max_texts_per_request: usize,
    /// Subword tokens in one text (EOS not counted).
    pub max_input_tokens: usize,
    /// Size of a request body.
    pub max_body_bytes: usize,
    /// A row stops after `min(max_target_tokens, ratio * source_tokens + offset)` tokens.
    pub max_length_ratio: f64,
    pub max_length_offset: usize,
    /// The model's own bound (manifest `limits.max_target_tokens`).
    pub max_target_tokens: usize,
}

impl Limits {
    /// Most tokens generated for a source of `source_tokens` subwords (EOS included).
    pub fn max_output_tokens(&self, source_tokens: usize) -> usize {
        let bound =
            (self.max_length_ratio * source_tokens as f64).ceil() as usize + self.max_length_offset;
        bound.min(self.max_target_tokens).max(1)
    }
}

/// Everything a handler needs; cheap to clone.
#[derive(Clone)]
pub struct AppState {
    inner: Arc<Inner>,
}

struct Inner {
    model_name: String,
    eos_id: u32,
    codec: TextCodec,
    translator: Translator,
    limits: Limits,
}

impl AppState {
    pub fn new(
        model_name: impl Into<String>,
        eos_id: u32,
        codec: TextCodec,
        translator: Translator,
        limits: Limits,
    ) -> Self {
        AppState {
            inner: Arc::new(Inner {
                model_name: model_name.into(),
                eos_id,
                codec,
                translator,
                limits,
            }),
        }
    }

    pub fn model_name(&self) -> &str {
        &self.inner.model_name
    }

    pub fn limits(&self) -> &Limits {
        &self.inner.limits
    }
}

/// The router with all routes, the body limit and JSON fallbacks.
pub fn app(state: AppState) -> Router {
    let body_limit = state.limits().max_body_bytes;
    Router::new()
        .route("/translate", post(translate))
        .route("/health", get(health))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(body_limit))
        .with_state(state)
}

/// `text` is a single string or a list of strings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Texts {
    One(String),
    Many(Vec<String>),
}

impl<'de> Deserialize<'de> for Texts {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct TextsVisitor;
        impl<'de> Visitor<'de> for TextsVisitor {
            type Value = Texts;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string or a list of strings")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Texts, E> {
                Ok(Texts::One(v.to_string()))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Texts, E> {
                Ok(Texts::One(v))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Texts, A::Error> {
                let mut texts = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1024));
                while let Some(text) = seq.next_element::<String>()? {
                    texts.push(text);
                }
                Ok(Texts::Many(texts))
            }
        }
        deserializer.deserialize_any(TextsVisitor)
    }
}

impl Texts {
    fn into_vec(self) -> Vec<String> {
        match self {
            Texts::One(text) => vec![text],
            Texts::Many(texts) => texts,
        }
    }
}

/// Body of `POST /translate`: a JSON object (serde would also accept an array for a
/// derived struct; the API does not).
#[derive(Debug)]
pub struct TranslateRequest {
    pub text: Texts,
    pub model: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TranslateRequestFields {
    text: Texts,
    #[serde(default)]
    model: Option<String>,
}

impl<'de> Deserialize<'de> for TranslateRequest {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ObjectVisitor;
        impl<'de> Visitor<'de> for ObjectVisitor {
            type Value = TranslateRequest;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON object with `text` and optionally `model`")
            }
            fn visit_map<A: de::MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
                let fields = TranslateRequestFields::deserialize(
                    de::value::MapAccessDeserializer::new(map),
                )?;
                Ok(TranslateRequest {
                    text: fields.text,
                    model: fields.model,
                })
            }
        }
        deserializer.deserialize_map(ObjectVisitor)
    }
}

#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Translation {
    pub text: String,
    /// Subword tokens of the input (EOS not counted).
    pub source_tokens: usize,
    /// Tokens generated (EOS not counted).
    pub output_tokens: usize,
}

#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct TranslateResponse {
    pub model: String,
    pub translations: Vec<Translation>,
}

/// `Json<T>` whose rejections come back as [`ApiError`]s.
pub struct ApiJson<T>(pub T);

impl<T> FromRequest<AppState> for ApiJson<T>
where
    T: serde::de::DeserializeOwned,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, Self::Rejection> {
        match Json::<T>::from_request(req, state).await {
            Ok(Json(value)) => Ok(ApiJson(value)),
            Err(rejection) => Err(ApiError::from_json_rejection(
                rejection,
                state.limits().max_body_bytes,
            )),
        }
    }
}

/// Checks the request and turns it into decoder inputs. Returns the source token counts.
fn prepare(
    state: &AppState,
    request: TranslateRequest,
) -> Result<(Vec<DecodeInput>, Vec<usize>), ApiError> {
    if let Some(model) = &request.model {
        if model != state.model_name() {
            return Err(ApiError::ModelNotFound(format!(
                "model `{model}` is not served here; this server serves `{}`",
                state.model_name()
            )));
        }
    }
    let texts = request.text.into_vec();
    let limits = state.limits();
    if texts.is_empty() {
        return Err(ApiError::EmptyText("`text` is an empty list".into()));
    }
    if texts.len() > limits.max_texts_per_request {
        return Err(ApiError::TooManyTexts(format!(
            "{} texts in one request; the limit is {} (max_texts_per_request)",
            texts.len(),
            limits.max_texts_per_request
        )));
    }
    let mut inputs = Vec::with_capacity(texts.len());
    let mut counts = Vec::with_capacity(texts.len());
    for (i, text) in texts.iter().enumerate() {
        if text.trim().is_empty() {
            return Err(ApiError::EmptyText(format!(
                "text {i} is empty or only whitespace"
            )));
        }
        let ids = state
            .inner
            .codec
            .encode(text)
            .map_err(|e| ApiError::Internal(format!("tokenizing text {i}: {e}")))?;
        if ids.len() > limits.max_input_tokens {
            return Err(ApiError::InputTooLong(format!(
                "text {i} has {} subword tokens; the limit is {} (max_input_tokens)",
                ids.len(),
                limits.max_input_tokens
            )));
        }
        let mut source_ids: Vec<i64> = ids.iter().map(|&id| i64::from(id)).collect();
        source_ids.push(i64::from(state.inner.eos_id));
        counts.push(ids.len());
        inputs.push(DecodeInput {
            max_output_tokens: limits.max_output_tokens(source_ids.len()),
            source_ids,
        });
    }
    Ok((inputs, counts))
}

async fn translate(
    State(state): State<AppState>,
    ApiJson(request): ApiJson<TranslateRequest>,
) -> Result<Json<TranslateResponse>, ApiError> {
    let (inputs, source_counts) = prepare(&state, request)?;
    let outputs = state.inner.translator.translate(inputs).await?;
    let translations = outputs
        .into_iter()
        .zip(source_counts)
        .map(|(output, source_tokens)| {
            let text = state
                .inner
                .codec
                .decode(&output.ids)
                .map_err(|e| ApiError::Internal(format!("detokenizing: {e}")))?;
            Ok(Translation {
                text,
                source_tokens,
                output_tokens: output.ids.len(),
            })
        })
        .collect::<Result<Vec<_>, ApiError>>()?;
    Ok(Json(TranslateResponse {
        model: state.model_name().to_string(),
        translations,
    }))
}

async fn health() -> Json<serde_json::Value> {
    Json(serde_json::json!({"status": "ok"}))
}

async fn not_found(uri: Uri) -> ApiError {
    ApiError::NotFound(format!("no route for {}", uri.path()))
}

async fn method_not_allowed(method: Method, uri: Uri) -> ApiError {
    ApiError::MethodNotAllowed(format!("{method} is not allowed on {}", uri.path()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::testing::{tokenizer, CopyBackend, SPECIAL};
    use crate::error::ErrorBody;
    use axum::body::Body;
    use axum::http::{header, Request, StatusCode};
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    fn limits() -> Limits {
        Limits {
            max_texts_per_request: 3,
            max_input_tokens: 5,
            max_body_bytes: 256,
            max_length_ratio: 2.0,
            max_length_offset: 10,
            max_target_tokens: 64,
        }
    }

    fn state_with(backend: CopyBackend) -> AppState {
        let (translator, _handle) = Translator::spawn(backend, SPECIAL, 8).unwrap();
        AppState::new(
            "dev-copy",
            SPECIAL.eos,
            TextCodec::new(tokenizer()),
            translator,
            limits(),
        )
    }

    async fn send(app: Router, request: Request<Body>) -> (StatusCode, serde_json::Value) {
        let response = app.oneshot(request).await.unwrap();
        let status = response.status();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        let json = serde_json::from_slice(&bytes)
            .unwrap_or_else(|e| panic!("body is not JSON ({e}): {bytes:?}"));
        (status, json)
    }

    fn post_json(body: impl Into<String>) -> Request<Body> {
        Request::post("/translate")
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(body.into()))
            .unwrap()
    }

    async fn post(body: &str) -> (StatusCode, serde_json::Value) {
        send(app(state_with(CopyBackend::default())), post_json(body)).await
    }

    fn error_of(status: StatusCode, json: serde_json::Value) -> (StatusCode, String, String) {
        let body: ErrorBody = serde_json::from_value(json).expect("error body shape");
        (status, body.error_type, body.error)
    }

    #[tokio::test]
    async fn translates_one_text_and_a_list_in_order() {
        let (status, json) = post(r#"{"text": "Hello world"}"#).await;
        assert_eq!(status, StatusCode::OK, "{json}");
        let response: TranslateResponse = serde_json::from_value(json).unwrap();
        assert_eq!(response.model, "dev-copy");
        assert_eq!(
            response.translations,
            vec![Translation {
                text: "hello world".into(),
                source_tokens: 2,
                output_tokens: 2
            }]
        );

        let (status, json) =
            post(r#"{"text": ["the red house", "a dog", "one two three four five"], "model": "dev-copy"}"#).await;
        assert_eq!(status, StatusCode::OK, "{json}");
        let response: TranslateResponse = serde_json::from_value(json).unwrap();
        let texts: Vec<_> = response
            .translations
            .iter()
            .map(|t| t.text.as_str())
            .collect();
        assert_eq!(
            texts,
            vec!["the red house", "a dog", "one two three four five"]
        );
        let counts: Vec<_> = response
            .translations
            .iter()
            .map(|t| t.source_tokens)
            .collect();
        assert_eq!(counts, vec![3, 2, 5]);
    }

    #[tokio::test]
    async fn health_is_ok() {
        let request = Request::get("/health").body(Body::empty()).unwrap();
        let (status, json) = send(app(state_with(CopyBackend::default())), request).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(json, serde_json::json!({"status": "ok"}));
    }

    #[tokio::test]
    async fn malformed_json_is_400() {
        let (status, json) = post(r#"{"text": "#).await;
        let (status, ty, _) = error_of(status, json);
        assert_eq!(
            (status, ty.as_str()),
            (StatusCode::BAD_REQUEST, "invalid_json")
        );
    }

    #[tokio::test]
    async fn missing_or_wrong_fields_are_422() {
        for body in [
            r#"{}"#,
            r#"{"txt": "hello"}"#,
            r#"{"text": 5}"#,
            r#"{"text": ["hello", 5]}"#,
            r#"{"text": "hello", "model": 3}"#,
            r#"["hello"]"#,
        ] {
            let (status, json) = post(body).await;
            let (status, ty, message) = error_of(status, json);
            assert_eq!(
                (status, ty.as_str()),
                (StatusCode::UNPROCESSABLE_ENTITY, "invalid_request"),
                "{body}: {message}"
            );
        }
        let (status, json) = post(r#"{"text": 5}"#).await;
        let (_, _, message) = error_of(status, json);
        assert!(
            message.contains("a string or a list of strings"),
            "{message}"
        );
    }

    #[tokio::test]
    async fn empty_texts_are_422() {
        for body in [
            r#"{"text": []}"#,
            r#"{"text": ""}"#,
            r#"{"text": ["hello", "  \n"]}"#,
        ] {
            let (status, json) = post(body).await;
            let (status, ty, message) = error_of(status, json);
            assert_eq!(
                (status, ty.as_str()),
                (StatusCode::UNPROCESSABLE_ENTITY, "empty_text"),
                "{body}: {message}"
            );
        }
    }

    #[tokio::test]
    async fn unknown_model_is_404() {
        let (status, json) = post(r#"{"text": "hello", "model": "other"}"#).await;
        let (status, ty, message) = error_of(status, json);
        assert_eq!(
            (status, ty.as_str()),
            (StatusCode::NOT_FOUND, "model_not_found")
        );
        assert!(message.contains("dev-copy"), "{message}");
    }

    #[tokio::test]
    async fn limits_are_413_and_name_the_limit() {
        let (status, json) = post(r#"{"text": ["a", "a", "a", "a"]}"#).await;
        let (status, ty, message) = error_of(status, json);
        assert_eq!(
            (status, ty.as_str()),
            (StatusCode::PAYLOAD_TOO_LARGE, "too_many_texts")
        );
        assert!(message.contains("limit is 3"), "{message}");

        let (status, json) = post(r#"{"text": ["a", "one two three four five six"]}"#).await;
        let (status, ty, message) = error_of(status, json);
        assert_eq!(
            (status, ty.as_str()),
            (StatusCode::PAYLOAD_TOO_LARGE, "input_too_long")
        );
        assert!(
            message.contains("text 1 has 6 subword tokens; the limit is 5"),
            "{message}"
        );

        let big = format!(r#"{{"text": "{}"}}"#, "a ".repeat(200));
        let (status, json) = post(&big).await;
        let (status, ty, message) = error_of(status, json);
        assert_eq!(
            (status, ty.as_str()),
            (StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large")
        );
        assert!(message.contains("256 bytes"), "{message}");
    }

    #[tokio::test]
    async fn missing_content_type_is_415_in_the_error_shape() {
        let request = Request::post("/translate")
            .body(Body::from(r#"{"text": "hello"}"#))
            .unwrap();
        let (status, json) = send(app(state_with(CopyBackend::default())), request).await;
        let (status, ty, _) = error_of(status, json);
        assert_eq!(
            (status, ty.as_str()),
            (StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type")
        );
    }

    #[tokio::test]
    async fn unknown_routes_and_methods_use_the_error_shape() {
        let request = Request::get("/nope").body(Body::empty()).unwrap();
        let (status, json) = send(app(state_with(CopyBackend::default())), request).await;
        assert_eq!(error_of(status, json).1, "not_found");
        let request = Request::get("/translate").body(Body::empty()).unwrap();
        let (status, json) = send(app(state_with(CopyBackend::default())), request).await;
        let (status, ty, _) = error_of(status, json);
        assert_eq!(
            (status, ty.as_str()),
            (StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed")
        );
    }

    #[tokio::test]
    async fn model_failures_are_500() {
        let backend = CopyBackend {
            fail: true,
            ..Default::default()
        };
        let (status, json) =
            send(app(state_with(backend)), post_json(r#"{"text": "hello"}"#)).await;
        let (status, ty, message) = error_of(status, json);
        assert_eq!(
            (status, ty.as_str()),
            (StatusCode::INTERNAL_SERVER_ERROR, "internal")
        );
        assert!(message.contains("injected failure"), "{message}");
    }

    #[test]
    fn length_bound_follows_the_source_and_the_model_limit() {
        let l = limits();
        assert_eq!(l.max_output_tokens(3), 16);
        assert_eq!(l.max_output_tokens(40), 64);
        let zero = Limits {
            max_length_ratio: 0.0,
            max_length_offset: 0,
            ..l
        };
        assert_eq!(zero.max_output_tokens(5), 1);
    }
}
