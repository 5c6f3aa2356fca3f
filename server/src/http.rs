//! The HTTP API: `POST /translate`, `GET /models`, `/health`, `/ready`, `/metrics`,
//! `/openapi.json`.
//!
//! Handlers only convert JSON to and from the transport-neutral types of [`crate::infer`].
//! [`RequestIdLayer`] gives every request its id ([`crate::request_id`]); one middleware runs
//! the request in a span carrying that id and counts errors by type.
//! Another reads the body before the handler, within `--body-read-timeout` and
//! `--max-body-bytes` (`read_body`).

use std::fmt;
use std::time::{Duration, Instant};

use axum::body::{Body, HttpBody};
use axum::extract::{DefaultBodyLimit, FromRequest, Request, State};
use axum::http::{header, HeaderName, HeaderValue, Method, Uri};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::Deserialize;
use tracing::Instrument;

use crate::error::{ApiError, ErrorType};
use crate::infer::{Infer, TranslateRequest, TranslateResponse};
use crate::length::{LengthMode, LengthRequest, TargetLength};
use crate::request_id::{self, RequestId, RequestIdLayer};

/// The request id's header ([`crate::request_id`]).
pub const REQUEST_ID: HeaderName = HeaderName::from_static(request_id::HEADER);

/// The OpenAPI 3.1 description of this API, served at `/openapi.json`.
pub const OPENAPI: &str = include_str!("../openapi.json");

/// `--body-read-timeout`'s default, and what [`app`] uses.
pub const DEFAULT_BODY_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// The router with all routes, the body limits, JSON fallbacks and the request middleware.
pub fn app(infer: Infer) -> Router {
    app_with_body_timeout(infer, DEFAULT_BODY_READ_TIMEOUT)
}

/// [`app`], with bodies due within `body_read_timeout` of their request head.
pub fn app_with_body_timeout(infer: Infer, body_read_timeout: Duration) -> Router {
    let body_limit = infer.limits().max_body_bytes;
    let body = BodyLimits {
        max_bytes: body_limit,
        read_timeout: body_read_timeout,
    };
    Router::new()
        .route("/translate", post(translate))
        .route("/health", get(health))
        .route("/ready", get(ready))
        .route("/models", get(models))
        .route("/metrics", get(metrics))
        .route("/openapi.json", get(openapi))
        .merge(crate::web::routes())
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(body_limit))
        .layer(middleware::from_fn_with_state(body, read_body))
        .layer(middleware::from_fn_with_state(
            infer.clone(),
            request_context,
        ))
        .layer(RequestIdLayer)
        .with_state(infer)
}

async fn request_context(State(infer): State<Infer>, request: Request, next: Next) -> Response {
    let id = RequestId::of(request.extensions(), request.headers());
    let span = tracing::info_span!(
        "request",
        request_id = %id,
        method = %request.method(),
        path = %request.uri().path(),
    );
    let started = Instant::now();
    let quiet = matches!(request.uri().path(), "/health" | "/ready" | "/metrics");
    let response = next.run(request).instrument(span.clone()).await;
    let status = response.status().as_u16();
    if let Some(ErrorType(error_type)) = response.extensions().get::<ErrorType>() {
        infer.metrics().record_error(error_type);
    }
    span.in_scope(|| {
        let elapsed_ms = started.elapsed().as_secs_f64() * 1e3;
        if quiet {
            tracing::debug!(status, elapsed_ms, "answered");
        } else {
            tracing::info!(status, elapsed_ms, "answered");
        }
    });
    response
}

#[derive(Clone, Copy, Debug)]
struct BodyLimits {
    max_bytes: usize,
    read_timeout: Duration,
}

/// Reads the whole body before the handler runs, so that a client sending it slowly or not at
/// all gets a 408 and frees its connection (the request timeout only starts once the request
/// is in), and refuses a body that its `Content-Length` declares over the limit before reading
/// a byte of it.
async fn read_body(State(limits): State<BodyLimits>, request: Request, next: Next) -> Response {
    let too_large = || {
        closing(ApiError::PayloadTooLarge(format!(
            "request body is larger than the limit of {} bytes",
            limits.max_bytes
        )))
    };
    // hyper's lower bound is the declared `Content-Length` (0 for a chunked body).
    if request.body().size_hint().lower() > limits.max_bytes as u64 {
        return too_large();
    }
    let (parts, body) = request.into_parts();
    let body = Limited::new(body, limits.max_bytes).collect();
    match tokio::time::timeout(limits.read_timeout, body).await {
        Ok(Ok(body)) => {
            let request = Request::from_parts(parts, Body::from(body.to_bytes()));
            next.run(request).await
        }
        Ok(Err(e)) if e.downcast_ref::<LengthLimitError>().is_some() => too_large(),
        Ok(Err(e)) => match io_cause(&*e) {
            Some(cause) if client_left(cause) => {
                // Not the request's fault, and nobody left to read an answer: not an error of
                // the API (the answer below only reaches a client that half-closed).
                tracing::debug!("the client closed the connection mid-body: {cause}");
                let mut response = closing(ApiError::MalformedRequest(format!(
                    "the connection closed before the request body was complete: {cause}"
                )));
                response.extensions_mut().remove::<ErrorType>();
                response
            }
            // hyper's body decoder: a chunk size that is not hexadecimal, a missing CRLF.
            cause => closing(ApiError::MalformedRequest(format!(
                "the request body is not well-formed: {}",
                cause.map_or_else(|| e.to_string(), ToString::to_string)
            ))),
        },
        Err(_) => closing(ApiError::BodyTimeout(format!(
            "the request body did not arrive within {} s of the request head",
            limits.read_timeout.as_secs_f64()
        ))),
    }
}

/// The I/O error under a body error (hyper reports its decoder's and the socket's that way).
fn io_cause<'a>(error: &'a (dyn std::error::Error + 'static)) -> Option<&'a std::io::Error> {
    let mut cause = Some(error);
    while let Some(error) = cause {
        if let Some(io) = error.downcast_ref::<std::io::Error>() {
            return Some(io);
        }
        cause = error.source();
    }
    None
}

/// The connection ended before the body did: end of stream mid-body, or a reset.
fn client_left(error: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(
        error.kind(),
        UnexpectedEof | ConnectionReset | ConnectionAborted | BrokenPipe
    )
}

/// The rest of an unread body may still be on its way: only closing the connection after the
/// answer avoids reading it.
fn closing(error: ApiError) -> Response {
    let mut response = error.into_response();
    response
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
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

/// `target_length`: a positive integer, `"source"` or `"auto"`.
struct TargetLengthJson(TargetLength);

impl<'de> Deserialize<'de> for TargetLengthJson {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct LengthVisitor;
        impl Visitor<'_> for LengthVisitor {
            type Value = TargetLengthJson;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str(r#"a number of subword tokens, "source" or "auto""#)
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
                Ok(TargetLengthJson(TargetLength::Tokens(
                    usize::try_from(v).unwrap_or(usize::MAX),
                )))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
                u64::try_from(v)
                    .map_err(|_| E::invalid_value(de::Unexpected::Signed(v), &self))
                    .and_then(|v| self.visit_u64(v))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                match v {
                    "source" => Ok(TargetLengthJson(TargetLength::Source)),
                    "auto" => Ok(TargetLengthJson(TargetLength::Auto)),
                    _ => Err(E::invalid_value(de::Unexpected::Str(v), &self)),
                }
            }
        }
        deserializer.deserialize_any(LengthVisitor)
    }
}

/// Body of `POST /translate`: a JSON object (serde would also accept an array for a
/// derived struct; the API does not).
pub struct TranslateBody(TranslateRequest);

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TranslateFields {
    text: Texts,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    target_length: Option<TargetLengthJson>,
    #[serde(default)]
    length_mode: Option<LengthMode>,
    #[serde(default)]
    max_chars: Option<usize>,
}

impl<'de> Deserialize<'de> for TranslateBody {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ObjectVisitor;
        impl<'de> Visitor<'de> for ObjectVisitor {
            type Value = TranslateBody;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str(
                    "a JSON object with `text` and optionally `model`, `target_length`, \
                     `length_mode` and `max_chars`",
                )
            }
            fn visit_map<A: de::MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
                let fields =
                    TranslateFields::deserialize(de::value::MapAccessDeserializer::new(map))?;
                Ok(TranslateBody(TranslateRequest {
                    texts: fields.text.into_vec(),
                    model: fields.model,
                    length: LengthRequest {
                        target: fields.target_length.map(|t| t.0),
                        mode: fields.length_mode.unwrap_or_default(),
                        max_chars: fields.max_chars,
                    },
                }))
            }
        }
        deserializer.deserialize_map(ObjectVisitor)
    }
}

/// `Json<T>` whose rejections come back as [`ApiError`]s.
pub struct ApiJson<T>(pub T);

impl<T> FromRequest<Infer> for ApiJson<T>
where
    T: serde::de::DeserializeOwned,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &Infer) -> Result<Self, Self::Rejection> {
        match Json::<T>::from_request(req, state).await {
            Ok(Json(value)) => Ok(ApiJson(value)),
            Err(rejection) => Err(ApiError::from_json_rejection(
                rejection,
                state.limits().max_body_bytes,
            )),
        }
    }
}

async fn translate(
    State(infer): State<Infer>,
    ApiJson(TranslateBody(request)): ApiJson<TranslateBody>,
) -> Result<Json<TranslateResponse>, ApiError> {
    infer.translate(request).await.map(Json)
}

async fn health() -> Json<serde_json::Value> {
    Json(serde_json::json!({"status": "ok"}))
}

async fn ready(State(infer): State<Infer>) -> Response {
    if infer.is_ready() {
        return Json(serde_json::json!({"status": "ready"})).into_response();
    }
    let mut response = ApiError::NotReady(
        "not ready: the models are loading or warming up, or the server is shutting down".into(),
    )
    .into_response();
    // A probe asking during warm-up or a drain is the answer working, not an error: counted,
    // every rollout would light up the errors panel.
    response.extensions_mut().remove::<ErrorType>();
    response
}

async fn models(State(infer): State<Infer>) -> Json<serde_json::Value> {
    Json(serde_json::json!({
        "default": infer.default_model(),
        "models": infer.model_infos(),
    }))
}

async fn metrics(State(infer): State<Infer>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
        )],
        infer.metrics().render(),
    )
        .into_response()
}

async fn openapi() -> Response {
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        OPENAPI,
    )
        .into_response()
}

async fn not_found(uri: Uri) -> ApiError {
    ApiError::NotFound(format!("no route for {}", uri.path()))
}

async fn method_not_allowed(method: Method, uri: Uri) -> ApiError {
    ApiError::MethodNotAllowed(format!("{method} is not allowed on {}", uri.path()))
}
