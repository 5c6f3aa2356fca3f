//! The one error type of the HTTP API, mapped to a status code in exactly one place
//! ([`ApiError::status`]) and rendered as `{"error": "...", "error_type": "..."}`.

use axum::extract::rejection::JsonRejection;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use utoipa::openapi::schema::{ObjectBuilder, Schema, SchemaType, Type};
use utoipa::openapi::RefOr;
use utoipa::ToSchema;

use nmt_engine::{EngineError, ValidationError};

use crate::scheduler::TranslateError;

/// Every way a request can fail. Handlers and extractors return this; nothing else builds
/// an error response.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The body is not syntactically valid JSON.
    #[error("{0}")]
    InvalidJson(String),
    /// The request is not well-formed HTTP/1.1: its head (hyper refuses it before any handler
    /// runs; [`crate::connections`] puts it in this shape), or the chunked framing of its body.
    #[error("{0}")]
    MalformedRequest(String),
    /// The request target is longer than hyper takes (65534 bytes).
    #[error("{0}")]
    UriTooLong(String),
    /// The request head has more header fields or bytes than hyper takes.
    #[error("{0}")]
    HeadersTooLarge(String),
    /// The body is JSON but a field is missing, unknown or has the wrong type.
    #[error("{0}")]
    InvalidRequest(String),
    /// The text list is empty, or one text is empty or only whitespace.
    #[error("{0}")]
    EmptyText(String),
    /// The request names a model this server does not serve.
    #[error("{0}")]
    ModelNotFound(String),
    /// More texts in one request than `--max-texts-per-request`.
    #[error("{0}")]
    TooManyTexts(String),
    /// One text has more subword tokens than the configured limit.
    #[error("{0}")]
    InputTooLong(String),
    /// The body is larger than `--max-body-bytes`, or declares so in its `Content-Length`.
    #[error("{0}")]
    PayloadTooLarge(String),
    /// The body did not arrive within `--body-read-timeout` of the request head.
    #[error("{0}")]
    BodyTimeout(String),
    /// The body was sent without `Content-Type: application/json`.
    #[error("{0}")]
    UnsupportedMediaType(String),
    /// No route for this path.
    #[error("{0}")]
    NotFound(String),
    /// The path exists but not for this method.
    #[error("{0}")]
    MethodNotAllowed(String),
    /// `target_length` is not a positive number within the model's output limit.
    #[error("{0}")]
    InvalidTargetLength(String),
    /// The request asks for something the chosen model cannot do.
    #[error("{0}")]
    Unsupported(String),
    /// The model's queue is full, or would not finish the request within `--max-queue-wait`;
    /// `retry_after_seconds` is when the work it has accepted should be done.
    #[error("{message}")]
    Overloaded {
        message: String,
        retry_after_seconds: u64,
    },
    /// The server is warming up or shutting down.
    #[error("{0}")]
    NotReady(String),
    /// No answer within the request timeout.
    #[error("{0}")]
    Timeout(String),
    /// The model worker is not running (it stopped or failed).
    #[error("{0}")]
    Unavailable(String),
    /// The model or the tokenizer failed on a valid request.
    #[error("{0}")]
    Internal(String),
}

/// Set on every error response, for the layer that counts errors by type.
#[derive(Clone, Copy, Debug)]
pub struct ErrorType(pub &'static str);

/// The JSON body of every error response.
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
#[schema(as = Error)]
pub struct ErrorBody {
    /// What went wrong, naming the limit where one was hit.
    pub error: String,
    #[schema(schema_with = error_type_schema)]
    pub error_type: String,
}

/// Every [`ApiError::error_type`], in the order of the variants: what the OpenAPI document
/// lists (a test checks it against the variants).
pub const ERROR_TYPES: [&str; 21] = [
    "invalid_json",
    "malformed_request",
    "uri_too_long",
    "headers_too_large",
    "invalid_request",
    "empty_text",
    "model_not_found",
    "too_many_texts",
    "input_too_long",
    "payload_too_large",
    "body_timeout",
    "unsupported_media_type",
    "not_found",
    "method_not_allowed",
    "invalid_target_length",
    "unsupported",
    "overloaded",
    "not_ready",
    "timeout",
    "unavailable",
    "internal",
];

fn error_type_schema() -> RefOr<Schema> {
    ObjectBuilder::new()
        .schema_type(SchemaType::new(Type::String))
        .enum_values(Some(ERROR_TYPES))
        .description(Some(
            "Machine-readable type of the error, stable across releases: clients and the \
             metrics (`nmt_errors_total{type}`) key on it.",
        ))
        .into()
}

impl ApiError {
    /// The HTTP status of each error: the only place where that mapping lives.
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::InvalidJson(_) | ApiError::MalformedRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::UriTooLong(_) => StatusCode::URI_TOO_LONG,
            ApiError::HeadersTooLarge(_) => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            ApiError::InvalidRequest(_)
            | ApiError::EmptyText(_)
            | ApiError::InvalidTargetLength(_)
            | ApiError::Unsupported(_) => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::ModelNotFound(_) | ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::TooManyTexts(_)
            | ApiError::InputTooLong(_)
            | ApiError::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::BodyTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            ApiError::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::Overloaded { .. } => StatusCode::TOO_MANY_REQUESTS,
            ApiError::Unavailable(_) | ApiError::NotReady(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Timeout(_) => StatusCode::GATEWAY_TIMEOUT,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The gRPC status code of each error ([`crate::grpc`]): the only place where that
    /// mapping lives. Requests the client must change are `INVALID_ARGUMENT`; the
    /// transport-only variants map to what gRPC says for them (no such method:
    /// `UNIMPLEMENTED`; message or head too large: `RESOURCE_EXHAUSTED`; a body too slow to
    /// arrive, which tonic never reports to us: `DEADLINE_EXCEEDED`; malformed HTTP/1.1,
    /// which gRPC never sees: `INVALID_ARGUMENT`).
    pub fn grpc_code(&self) -> tonic::Code {
        use tonic::Code;
        match self {
            ApiError::InvalidJson(_)
            | ApiError::MalformedRequest(_)
            | ApiError::InvalidRequest(_)
            | ApiError::EmptyText(_)
            | ApiError::InvalidTargetLength(_)
            | ApiError::UnsupportedMediaType(_)
            | ApiError::TooManyTexts(_)
            | ApiError::InputTooLong(_) => Code::InvalidArgument,
            ApiError::ModelNotFound(_) => Code::NotFound,
            ApiError::NotFound(_) | ApiError::MethodNotAllowed(_) | ApiError::Unsupported(_) => {
                Code::Unimplemented
            }
            ApiError::PayloadTooLarge(_)
            | ApiError::UriTooLong(_)
            | ApiError::HeadersTooLarge(_)
            | ApiError::Overloaded { .. } => Code::ResourceExhausted,
            ApiError::NotReady(_) | ApiError::Unavailable(_) => Code::Unavailable,
            ApiError::Timeout(_) | ApiError::BodyTimeout(_) => Code::DeadlineExceeded,
            ApiError::Internal(_) => Code::Internal,
        }
    }

    /// Machine-readable type, stable across releases (clients and metrics key on it).
    pub fn error_type(&self) -> &'static str {
        match self {
            ApiError::InvalidJson(_) => "invalid_json",
            ApiError::MalformedRequest(_) => "malformed_request",
            ApiError::UriTooLong(_) => "uri_too_long",
            ApiError::HeadersTooLarge(_) => "headers_too_large",
            ApiError::InvalidRequest(_) => "invalid_request",
            ApiError::EmptyText(_) => "empty_text",
            ApiError::ModelNotFound(_) => "model_not_found",
            ApiError::TooManyTexts(_) => "too_many_texts",
            ApiError::InputTooLong(_) => "input_too_long",
            ApiError::PayloadTooLarge(_) => "payload_too_large",
            ApiError::BodyTimeout(_) => "body_timeout",
            ApiError::UnsupportedMediaType(_) => "unsupported_media_type",
            ApiError::NotFound(_) => "not_found",
            ApiError::MethodNotAllowed(_) => "method_not_allowed",
            ApiError::InvalidTargetLength(_) => "invalid_target_length",
            ApiError::Unsupported(_) => "unsupported",
            ApiError::Overloaded { .. } => "overloaded",
            ApiError::NotReady(_) => "not_ready",
            ApiError::Timeout(_) => "timeout",
            ApiError::Unavailable(_) => "unavailable",
            ApiError::Internal(_) => "internal",
        }
    }

    /// Maps a rejection of axum's `Json` extractor. `max_body_bytes` is only used to name
    /// the limit in the message when the body was too large.
    pub fn from_json_rejection(rejection: JsonRejection, max_body_bytes: usize) -> Self {
        match rejection {
            JsonRejection::JsonSyntaxError(e) => ApiError::InvalidJson(e.body_text()),
            JsonRejection::JsonDataError(e) => ApiError::InvalidRequest(e.body_text()),
            JsonRejection::MissingJsonContentType(e) => {
                ApiError::UnsupportedMediaType(e.body_text())
            }
            other if other.status() == StatusCode::PAYLOAD_TOO_LARGE => ApiError::PayloadTooLarge(
                format!("request body is larger than the limit of {max_body_bytes} bytes"),
            ),
            other if other.status().is_client_error() => {
                ApiError::InvalidRequest(other.body_text())
            }
            other => ApiError::Internal(other.body_text()),
        }
    }
}

impl From<TranslateError> for ApiError {
    fn from(err: TranslateError) -> Self {
        match err.retry_after() {
            Some(retry_after) => ApiError::Overloaded {
                message: err.to_string(),
                retry_after_seconds: retry_after.as_secs().max(1),
            },
            None => match err {
                TranslateError::Backend(_) => ApiError::Internal(err.to_string()),
                _ => ApiError::Unavailable(err.to_string()),
            },
        }
    }
}

/// The engine's refusals keep the types clients already key on.
impl From<ValidationError> for ApiError {
    fn from(err: ValidationError) -> Self {
        let message = err.to_string();
        match err {
            ValidationError::NoTexts | ValidationError::EmptyText { .. } => {
                ApiError::EmptyText(message)
            }
            ValidationError::TooManyTexts { .. } => ApiError::TooManyTexts(message),
            ValidationError::InputTooLong { .. } => ApiError::InputTooLong(message),
            ValidationError::TargetLengthOutOfRange { .. }
            | ValidationError::MaxCharsOutOfRange { .. } => ApiError::InvalidTargetLength(message),
            ValidationError::NoLengthEncoding { .. } | ValidationError::NoPredictor { .. } => {
                ApiError::Unsupported(message)
            }
            ValidationError::NgramSizeTooLarge { .. } => ApiError::InvalidRequest(message),
        }
    }
}

impl From<EngineError> for ApiError {
    fn from(err: EngineError) -> Self {
        match err {
            EngineError::Invalid(invalid) => invalid.into(),
            other => ApiError::Internal(other.to_string()),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        let (error_type, code) = (self.error_type(), status.as_u16());
        match self {
            ApiError::Internal(_) => tracing::error!(error_type, status = code, "{self}"),
            // Load shedding and slow requests: worth a look when frequent (the metrics count
            // them), not a fault of the server.
            ApiError::Overloaded { .. } | ApiError::Timeout(_) => {
                tracing::warn!(error_type, status = code, "{self}")
            }
            // Bad input, and 503s while warming up or draining (readiness probes poll
            // through start-up): expected, so only at debug level.
            _ => tracing::debug!(error_type, status = code, "{self}"),
        }
        let body = ErrorBody {
            error: self.to_string(),
            error_type: self.error_type().to_string(),
        };
        let mut response = (status, Json(body)).into_response();
        let retry_after = match self {
            ApiError::Overloaded {
                retry_after_seconds,
                ..
            } => Some(retry_after_seconds),
            ApiError::NotReady(_) => Some(1),
            _ => None,
        };
        if let Some(seconds) = retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        // The metrics layer counts errors by this type (see `http::app`).
        response
            .extensions_mut()
            .insert(ErrorType(self.error_type()));
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::every_api_error as every_variant;

    #[test]
    fn every_variant_has_a_distinct_type_and_an_error_status() {
        let all = every_variant();
        let mut types: Vec<_> = all.iter().map(|e| e.error_type()).collect();
        assert_eq!(types, ERROR_TYPES);
        types.sort();
        types.dedup();
        assert_eq!(types.len(), all.len());
        assert!(all
            .iter()
            .all(|e| e.status().is_client_error() || e.status().is_server_error()));
    }

    #[test]
    fn every_variant_has_a_grpc_code() {
        use tonic::Code;
        for error in every_variant() {
            let expected = match error.error_type() {
                "invalid_json"
                | "malformed_request"
                | "invalid_request"
                | "empty_text"
                | "invalid_target_length"
                | "unsupported_media_type"
                | "too_many_texts"
                | "input_too_long" => Code::InvalidArgument,
                "model_not_found" => Code::NotFound,
                "not_found" | "method_not_allowed" | "unsupported" => Code::Unimplemented,
                "payload_too_large" | "uri_too_long" | "headers_too_large" | "overloaded" => {
                    Code::ResourceExhausted
                }
                "not_ready" | "unavailable" => Code::Unavailable,
                "timeout" | "body_timeout" => Code::DeadlineExceeded,
                "internal" => Code::Internal,
                other => panic!("no gRPC code expected for `{other}`"),
            };
            assert_eq!(error.grpc_code(), expected, "{}", error.error_type());
            // The server's faults in HTTP are the server's faults in gRPC. gRPC has one code
            // for deadlines, whoever was slow: a body that did not arrive is the client's.
            let server_side = matches!(
                expected,
                Code::Unavailable | Code::DeadlineExceeded | Code::Internal
            ) && error.error_type() != "body_timeout";
            assert_eq!(
                error.status().is_server_error(),
                server_side,
                "{}",
                error.error_type()
            );
        }
    }

    #[test]
    fn overloaded_carries_its_retry_after() {
        let response = ApiError::Overloaded {
            message: "busy".into(),
            retry_after_seconds: 7,
        }
        .into_response();
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(response.headers()[header::RETRY_AFTER], "7");
        let refused = TranslateError::Busy {
            expected: std::time::Duration::from_secs_f64(40.5),
            limit: std::time::Duration::from_secs(15),
            retry_after: std::time::Duration::from_secs(26),
        };
        let response = ApiError::from(refused).into_response();
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(response.headers()[header::RETRY_AFTER], "26");
    }
}
