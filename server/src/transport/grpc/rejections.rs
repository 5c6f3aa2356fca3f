//! Calls tonic refuses before the handler runs (a message over `--max-body-bytes`, an
//! undecodable message, an unknown method) answered like the handler's own errors.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tonic::codegen::http;
use tonic::{Code, Status};

use super::status::{error_status, ERROR_TYPE};
use crate::service::{ApiError, Infer};
use crate::transport::request_id::RequestId;

/// The error for a call tonic refused before the handler ran, from tonic's own status.
pub fn rejection(status: &Status, path: &str, max_body_bytes: usize) -> ApiError {
    match status.code() {
        // The message is over the decoding limit (or decompresses to more than it).
        Code::OutOfRange | Code::ResourceExhausted => ApiError::PayloadTooLarge(format!(
            "request message is larger than the limit of {max_body_bytes} bytes"
        )),
        // Routing: no such service or method.
        Code::Unimplemented if status.message().is_empty() => ApiError::NotFound(format!(
            "no gRPC method `{path}`; this server has /nmt.v1.Translator/Translate"
        )),
        // E.g. a compression this server does not have.
        Code::Unimplemented => ApiError::Unsupported(status.message().to_string()),
        // The message could not be read or decoded.
        _ => ApiError::InvalidRequest(status.message().to_string()),
    }
}

/// In front of the service: turns calls tonic refused before the handler (their statuses
/// carry no `error-type`) into [`ApiError`]s, logged, counted and answered like the
/// handler's own.
#[derive(Clone)]
pub struct Rejections<S> {
    inner: S,
    infer: Infer,
}

impl Rejections<()> {
    pub fn layer<S>(infer: Infer) -> impl tower::Layer<S, Service = Rejections<S>> + Clone {
        tower::layer::layer_fn(move |inner| Rejections {
            inner,
            infer: infer.clone(),
        })
    }
}

impl<S, ReqBody, ResBody> tower::Service<http::Request<ReqBody>> for Rejections<S>
where
    S: tower::Service<
        http::Request<ReqBody>,
        Response = http::Response<ResBody>,
        Error = Infallible,
    >,
    S::Future: Send + 'static,
    ResBody: Default + Send + 'static,
{
    type Response = http::Response<ResBody>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<ReqBody>) -> Self::Future {
        let id = RequestId::of(request.extensions(), request.headers());
        let path = request.uri().path().to_string();
        let infer = self.infer.clone();
        let answer = self.inner.call(request);
        Box::pin(async move {
            let response = answer.await?;
            if response.headers().contains_key(ERROR_TYPE) {
                return Ok(response);
            }
            // Answers of the handler keep their status for the trailers; only refusals
            // come with it in the headers.
            let refused = Status::from_header_map(response.headers())
                .filter(|status| status.code() != Code::Ok);
            let Some(refused) = refused else {
                return Ok(response);
            };
            let span = tracing::info_span!("request", request_id = %id, method = "grpc", %path);
            let err = rejection(&refused, &path, infer.limits().max_body_bytes);
            let status = span.in_scope(|| {
                tracing::info!(code = ?err.grpc_code(), tonic = %refused.message(), "refused before the handler");
                error_status(&infer, err)
            });
            Ok(status.into_http())
        })
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_before_the_handler_become_api_errors() {
        let path = "/nmt.v1.Translator/Translate";
        for (status, expected) in [
            (
                Status::out_of_range("decoded message length too large"),
                "payload_too_large",
            ),
            (
                Status::resource_exhausted("size limit exceeded"),
                "payload_too_large",
            ),
            (Status::unimplemented(""), "not_found"),
            (
                Status::unimplemented("Content is compressed with `zstd`"),
                "unsupported",
            ),
            (
                Status::internal("failed to decode Protobuf message"),
                "invalid_request",
            ),
        ] {
            let err = rejection(&status, path, 1024);
            assert_eq!(err.error_type(), expected, "{status:?}");
        }
        let err = rejection(&Status::out_of_range(""), path, 1024);
        assert_eq!(err.grpc_code(), Code::ResourceExhausted);
        assert!(err.to_string().contains("1024 bytes"), "{err}");
    }
}
