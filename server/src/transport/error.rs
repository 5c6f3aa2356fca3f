//! How the API's one error type ([`ApiError`]) answers on the wire: the HTTP status of each
//! error in exactly one place ([`ApiError::status`]), the gRPC code in one other
//! ([`ApiError::grpc_code`]), and the JSON body `{"error": "...", "error_type": "..."}`.

use axum::extract::rejection::JsonRejection;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use utoipa::openapi::schema::{ObjectBuilder, Schema, SchemaType, Type};
use utoipa::openapi::RefOr;
use utoipa::ToSchema;

use crate::service::error::{ApiError, ERROR_TYPES};

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

fn error_type_schema() -> RefOr<Schema> {
    ObjectBuilder::new()
        .schema_type(SchemaType::new(Type::String))
        .enum_values(Some(ERROR_TYPES.iter().copied()))
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
            ApiError::InvalidJson(_) | ApiError::MalformedRequest(_) | ApiError::InvalidHost(_) => {
                StatusCode::BAD_REQUEST
            }
            ApiError::UriTooLong(_) => StatusCode::URI_TOO_LONG,
            ApiError::HeadersTooLarge(_) => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            ApiError::InvalidRequest(_)
            | ApiError::EmptyText(_)
            | ApiError::InvalidTargetLength(_)
            | ApiError::Unsupported(_) => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::ModelNotFound(_) | ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::TooManyTexts(_)
            | ApiError::InputTooLong(_)
            | ApiError::RequestTooCostly(_)
            | ApiError::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            // RFC 9112 §6.1: a transfer coding the server does not understand is 501.
            ApiError::UnsupportedTransferEncoding(_) => StatusCode::NOT_IMPLEMENTED,
            ApiError::BodyTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            ApiError::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::Overloaded { .. } => StatusCode::TOO_MANY_REQUESTS,
            ApiError::Unavailable(_) | ApiError::NotReady(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Timeout(_) => StatusCode::GATEWAY_TIMEOUT,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The gRPC status code of each error (the gRPC API's): the only place where that
    /// mapping lives. Requests the client must change are `INVALID_ARGUMENT`; the
    /// transport-only variants map to what gRPC says for them (no such method:
    /// `UNIMPLEMENTED`; message or head too large: `RESOURCE_EXHAUSTED`; a body too slow to
    /// arrive, which tonic never reports to us: `DEADLINE_EXCEEDED`; malformed HTTP/1.1 and
    /// its `Host` header, which gRPC never sees: `INVALID_ARGUMENT`).
    pub fn grpc_code(&self) -> tonic::Code {
        use tonic::Code;
        match self {
            ApiError::InvalidJson(_)
            | ApiError::MalformedRequest(_)
            | ApiError::InvalidHost(_)
            | ApiError::InvalidRequest(_)
            | ApiError::EmptyText(_)
            | ApiError::InvalidTargetLength(_)
            | ApiError::UnsupportedMediaType(_)
            | ApiError::TooManyTexts(_)
            | ApiError::InputTooLong(_)
            | ApiError::RequestTooCostly(_) => Code::InvalidArgument,
            ApiError::ModelNotFound(_) => Code::NotFound,
            ApiError::NotFound(_)
            | ApiError::MethodNotAllowed(_)
            | ApiError::Unsupported(_)
            | ApiError::UnsupportedTransferEncoding(_) => Code::Unimplemented,
            ApiError::PayloadTooLarge(_)
            | ApiError::UriTooLong(_)
            | ApiError::HeadersTooLarge(_)
            | ApiError::Overloaded { .. } => Code::ResourceExhausted,
            ApiError::NotReady(_) | ApiError::Unavailable(_) => Code::Unavailable,
            ApiError::Timeout(_) | ApiError::BodyTimeout(_) => Code::DeadlineExceeded,
            ApiError::Internal(_) => Code::Internal,
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
        // The metrics layer counts errors by this type (see `http::app`), and the compatible
        // APIs answer the error itself in their own shape (`http::compat::in_their_shape`).
        response
            .extensions_mut()
            .insert(ErrorType(self.error_type()));
        response.extensions_mut().insert(self);
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::TranslateError;
    use strum::IntoEnumIterator;

    fn every_variant() -> Vec<ApiError> {
        ApiError::iter().collect()
    }

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
                | "invalid_host"
                | "invalid_request"
                | "empty_text"
                | "invalid_target_length"
                | "unsupported_media_type"
                | "too_many_texts"
                | "input_too_long"
                | "request_too_costly" => Code::InvalidArgument,
                "model_not_found" => Code::NotFound,
                "not_found"
                | "method_not_allowed"
                | "unsupported"
                | "unsupported_transfer_encoding" => Code::Unimplemented,
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
            // And HTTP's 501 for a transfer coding the server lacks is its own: HTTP/2 has
            // no transfer codings, so gRPC never meets it.
            let server_side = matches!(
                expected,
                Code::Unavailable | Code::DeadlineExceeded | Code::Internal
            ) && error.error_type() != "body_timeout"
                || error.error_type() == "unsupported_transfer_encoding";
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
