//! The one error type of the API, whatever the transport: every way a request can fail, its
//! stable name, and how the engine's and the scheduler's errors become it. How each transport
//! answers with it (HTTP status and JSON body, gRPC code) is the transport's
//! (`transport::error`).

use strum::{EnumIter, IntoStaticStr, VariantNames};

use crate::scheduler::TranslateError;
use nmt_engine::{EngineError, ValidationError};

/// Every way a request can fail. Handlers and extractors return this; nothing else builds
/// an error response.
///
/// The variant's name in snake case is its `error_type` ([`ApiError::error_type`]), which
/// clients and the metrics key on: renaming a variant renames it on the wire.
#[derive(Clone, Debug, thiserror::Error, IntoStaticStr, VariantNames, EnumIter)]
#[strum(serialize_all = "snake_case")]
pub enum ApiError {
    /// The body is not syntactically valid JSON.
    #[error("{0}")]
    InvalidJson(String),
    /// The request is not well-formed HTTP/1.1: its head (hyper refuses it before any handler
    /// runs; the HTTP accept loop puts it in this shape), or the chunked framing of its body.
    #[error("{0}")]
    MalformedRequest(String),
    /// An HTTP/1.1 request without a `Host` header, or any request with more than one or with
    /// a value that is not `host[:port]` (RFC 9112 3.2; the HTTP accept loop checks it).
    #[error("{0}")]
    InvalidHost(String),
    /// The request target is longer than hyper takes (65534 bytes).
    #[error("{0}")]
    UriTooLong(String),
    /// The request head has more header fields or bytes than hyper takes.
    #[error("{0}")]
    HeadersTooLarge(String),
    /// The body is JSON but a field is missing, unknown or has the wrong type.
    #[error("{0}")]
    InvalidRequest(String),
    /// The text list is empty, or one text is empty or only whitespace and invisible
    /// characters.
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
    /// The request's own work is expected to take longer than the request timeout allows,
    /// even on an idle model: it could only time out.
    #[error("{0}")]
    RequestTooCostly(String),
    /// The body is larger than `--max-body-bytes`, or declares so in its `Content-Length`.
    #[error("{0}")]
    PayloadTooLarge(String),
    /// The body did not arrive within `--body-read-timeout` of the request head.
    #[error("{0}")]
    BodyTimeout(String),
    /// The body was sent without `Content-Type: application/json`.
    #[error("{0}")]
    UnsupportedMediaType(String),
    /// The body was sent with a transfer coding other than `chunked` (`gzip, chunked`): the
    /// server would read compressed bytes as JSON.
    #[error("{0}")]
    UnsupportedTransferEncoding(String),
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

/// Every [`ApiError::error_type`], in the order of the variants: what the OpenAPI document
/// lists.
pub const ERROR_TYPES: &[&str] = ApiError::VARIANTS;

impl ApiError {
    /// Machine-readable type, stable across releases (clients and metrics key on it).
    pub fn error_type(&self) -> &'static str {
        self.into()
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
                TranslateError::TooCostly { .. } => ApiError::RequestTooCostly(err.to_string()),
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
            | ValidationError::CharsOutOfRange { .. }
            | ValidationError::TwoTargets => ApiError::InvalidTargetLength(message),
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
