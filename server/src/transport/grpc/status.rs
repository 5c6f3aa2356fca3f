//! An [`ApiError`] as a gRPC status: the code of [`ApiError::grpc_code`], the JSON API's
//! `error` text, and its `error_type` in the metadata.

use tonic::metadata::AsciiMetadataValue;
use tonic::Status;

use crate::service::{ApiError, Infer};

/// Metadata key of the error type (the JSON API's `error_type`) of an error status.
pub const ERROR_TYPE: &str = "error-type";

/// Logs and counts `err`, and makes it a status with the `error-type` metadata (the
/// `x-request-id` comes from the request id layer).
pub fn error_status(infer: &Infer, err: ApiError) -> Status {
    let code = err.grpc_code();
    if err.status().is_server_error() {
        tracing::error!(error_type = err.error_type(), code = ?code, "{err}");
    } else {
        tracing::debug!(error_type = err.error_type(), code = ?code, "{err}");
    }
    infer.metrics().record_error(err.error_type());
    let mut status = Status::new(code, err.to_string());
    status.metadata_mut().insert(
        ERROR_TYPE,
        AsciiMetadataValue::from_static(err.error_type()),
    );
    status
}
