//! The one error type of the HTTP API, mapped to a status code in exactly one place
//! ([`ApiError::status`]) and rendered as `{"error": "...", "error_type": "..."}`.

use axum::extract::rejection::JsonRejection;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};

use crate::worker::TranslateError;

/// Every way a request can fail. Handlers and extractors return this; nothing else builds
/// an error response.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The body is not syntactically valid JSON.
    #[error("{0}")]
    InvalidJson(String),
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
    /// The body is larger than `--max-body-bytes`.
    #[error("{0}")]
    PayloadTooLarge(String),
    /// The body was sent without `Content-Type: application/json`.
    #[error("{0}")]
    UnsupportedMediaType(String),
    /// No route for this path.
    #[error("{0}")]
    NotFound(String),
    /// The path exists but not for this method.
    #[error("{0}")]
    MethodNotAllowed(String),
    /// The model's queue is full.
    #[error("{0}")]
    Overloaded(String),
    /// The model worker is not running (it stopped or failed).
    #[error("{0}")]
    Unavailable(String),
    /// The model or the tokenizer failed on a valid request.
    #[error("{0}")]
    Internal(String),
}

/// The JSON body of every error response.
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ErrorBody {
    pub error: String,
    pub error_type: String,
}

impl ApiError {
    /// The HTTP status of each error: the only place where that mapping lives.
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::InvalidJson(_) => StatusCode::BAD_REQUEST,
            ApiError::InvalidRequest(_) | ApiError::EmptyText(_) => {
                StatusCode::UNPROCESSABLE_ENTITY
            }
            ApiError::ModelNotFound(_) | ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::TooManyTexts(_)
            | ApiError::InputTooLong(_)
            | ApiError::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::Overloaded(_) => StatusCode::TOO_MANY_REQUESTS,
            ApiError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// Machine-readable type, stable across releases (clients and metrics key on it).
    pub fn error_type(&self) -> &'static str {
        match self {
            ApiError::InvalidJson(_) => "invalid_json",
            ApiError::InvalidRequest(_) => "invalid_request",
            ApiError::EmptyText(_) => "empty_text",
            ApiError::ModelNotFound(_) => "model_not_found",
            ApiError::TooManyTexts(_) => "too_many_texts",
            ApiError::InputTooLong(_) => "input_too_long",
            ApiError::PayloadTooLarge(_) => "payload_too_large",
            ApiError::UnsupportedMediaType(_) => "unsupported_media_type",
            ApiError::NotFound(_) => "not_found",
            ApiError::MethodNotAllowed(_) => "method_not_allowed",
            ApiError::Overloaded(_) => "overloaded",
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
        match err {
            TranslateError::Overloaded => ApiError::Overloaded(err.to_string()),
            TranslateError::Stopped => ApiError::Unavailable(err.to_string()),
            TranslateError::Backend(_) => ApiError::Internal(err.to_string()),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        if status.is_server_error() {
            tracing::error!(error_type = self.error_type(), "{self}");
        } else {
            tracing::debug!(
                error_type = self.error_type(),
                status = status.as_u16(),
                "{self}"
            );
        }
        let body = ErrorBody {
            error: self.to_string(),
            error_type: self.error_type().to_string(),
        };
        let mut response = (status, Json(body)).into_response();
        if let ApiError::Overloaded(_) = self {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_variant_has_a_distinct_type_and_an_error_status() {
        let all = [
            ApiError::InvalidJson(String::new()),
            ApiError::InvalidRequest(String::new()),
            ApiError::EmptyText(String::new()),
            ApiError::ModelNotFound(String::new()),
            ApiError::TooManyTexts(String::new()),
            ApiError::InputTooLong(String::new()),
            ApiError::PayloadTooLarge(String::new()),
            ApiError::UnsupportedMediaType(String::new()),
            ApiError::NotFound(String::new()),
            ApiError::MethodNotAllowed(String::new()),
            ApiError::Overloaded(String::new()),
            ApiError::Unavailable(String::new()),
            ApiError::Internal(String::new()),
        ];
        let mut types: Vec<_> = all.iter().map(|e| e.error_type()).collect();
        types.sort();
        types.dedup();
        assert_eq!(types.len(), all.len());
        assert!(all
            .iter()
            .all(|e| e.status().is_client_error() || e.status().is_server_error()));
    }

    #[test]
    fn overloaded_carries_retry_after() {
        let response = ApiError::Overloaded("busy".into()).into_response();
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(response.headers()[header::RETRY_AFTER], "1");
    }
}
