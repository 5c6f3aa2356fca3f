//! The gRPC API: service `nmt.v1.Translator` of `proto/translate.proto`, over tonic.
//!
//! Like [`crate::http`], it only converts its wire types to and from those of
//! [`crate::infer`]. Every call gets a request id ([`crate::request_id`], the rule of the HTTP
//! API, from the same layer), runs in a span carrying it, and returns it in the
//! `x-request-id` metadata. Errors are [`ApiError`]s: the status code is
//! [`ApiError::grpc_code`], the message is the JSON API's `error` text, the `error-type`
//! metadata its `error_type`, and each one is counted in `nmt_errors_total`.
//!
//! Requests tonic rejects before the handler (a message over `--max-body-bytes`, an
//! undecodable message, an unknown method) are turned into the same kind of error by the
//! layer [`serve`] puts in front of the service.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use tokio_util::sync::CancellationToken;
use tonic::codegen::http;
use tonic::metadata::AsciiMetadataValue;
use tonic::{Code, Request, Response, Status};
use tracing::Instrument;

use crate::connections::{self, ConnectionGate};
use crate::error::ApiError;
use crate::infer::{Infer, TranslateRequest, TranslateResponse};
use crate::request_id::{self, RequestId, RequestIdLayer};
use nmt_engine::length::{LengthMode, LengthRequest, LengthSource, TargetLength};

/// The types and the server and client generated from `proto/translate.proto`.
pub mod proto {
    tonic::include_proto!("nmt.v1");
}

use proto::translate_request::TargetLength as ProtoTargetLength;
use proto::translator_server::{Translator, TranslatorServer};
use proto::TargetLengthMode;

/// Metadata key of the request id, in requests and responses ([`crate::request_id`]).
pub const REQUEST_ID: &str = request_id::HEADER;
/// Metadata key of the error type (the JSON API's `error_type`) of an error status.
pub const ERROR_TYPE: &str = "error-type";

/// The implementation of `nmt.v1.Translator`.
#[derive(Clone)]
pub struct TranslatorService {
    infer: Infer,
}

/// The service, with messages limited to `--max-body-bytes`.
pub fn service(infer: Infer) -> TranslatorServer<TranslatorService> {
    let limit = infer.limits().max_body_bytes;
    TranslatorServer::new(TranslatorService { infer }).max_decoding_message_size(limit)
}

/// A peer that does not answer an HTTP/2 ping within this long is dead: its connection closes
/// (gRPC's own default for keepalive timeouts).
pub const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);
/// Calls in flight on one connection; more wait for the client to send them. hyper's own
/// default, which tonic otherwise replaces with no limit.
pub const MAX_CONCURRENT_STREAMS: u32 = 200;

/// How gRPC connections are held.
#[derive(Clone, Copy, Debug)]
pub struct GrpcOptions {
    /// The HTTP/2 connection preface is due this long after connecting.
    pub preface_timeout: Duration,
    /// An HTTP/2 ping goes out this long after the last frame received; `None`: never.
    pub keepalive_interval: Option<Duration>,
}

impl Default for GrpcOptions {
    /// The defaults of the command line.
    fn default() -> Self {
        GrpcOptions {
            preface_timeout: Duration::from_secs(10),
            keepalive_interval: Some(Duration::from_secs(60)),
        }
    }
}

/// Serves [`service`] on `listener` until `shutdown` completes, then lets the calls in
/// flight finish: [`serve_with`] with the default options and a connection cap of its own.
pub async fn serve(
    infer: Infer,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let token = CancellationToken::new();
    let cancel = token.clone();
    let signal = async move {
        shutdown.await;
        cancel.cancel();
    };
    let gate = ConnectionGate::new(connections::DEFAULT_MAX_CONNECTIONS);
    let served = serve_with(infer, listener, GrpcOptions::default(), gate, token);
    tokio::pin!(served);
    tokio::select! {
        served = &mut served => return served,
        () = signal => {}
    }
    served.await
}

/// Serves [`service`] on `listener` until `shutdown` is cancelled, then lets the calls in
/// flight finish. Connections count against `gate`. A connection must send the HTTP/2 preface
/// within `options.preface_timeout`; after that, gRPC channels are long-lived by design, so an
/// idle one stays open as long as its peer answers pings (a dead one closes after
/// `options.keepalive_interval` + [`KEEPALIVE_TIMEOUT`]), and every connection has TCP
/// keepalive.
pub async fn serve_with(
    infer: Infer,
    listener: tokio::net::TcpListener,
    options: GrpcOptions,
    gate: ConnectionGate,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let incoming =
        connections::grpc_incoming(listener, gate, options.preface_timeout, shutdown.clone());
    let rejections = Rejections::layer(infer.clone());
    tonic::transport::Server::builder()
        .http2_keepalive_interval(options.keepalive_interval)
        .http2_keepalive_timeout(Some(KEEPALIVE_TIMEOUT))
        .max_concurrent_streams(MAX_CONCURRENT_STREAMS)
        .layer(RequestIdLayer)
        .layer(rejections)
        .add_service(service(infer))
        .serve_with_incoming_shutdown(incoming, shutdown.cancelled_owned())
        .await
        .context("serving gRPC")
}

#[tonic::async_trait]
impl Translator for TranslatorService {
    async fn translate(
        &self,
        request: Request<proto::TranslateRequest>,
    ) -> Result<Response<proto::TranslateResponse>, Status> {
        let id = RequestId::of(request.extensions(), request.metadata().as_ref());
        let span = tracing::info_span!("request", request_id = %id, method = "grpc Translate");
        let started = Instant::now();
        let result = async {
            let request = from_proto(request.into_inner())?;
            self.infer.translate(request).await
        }
        .instrument(span.clone())
        .await;
        let code = result
            .as_ref()
            .map_or_else(ApiError::grpc_code, |_| Code::Ok);
        span.in_scope(|| {
            let elapsed_ms = started.elapsed().as_secs_f64() * 1e3;
            tracing::info!(code = ?code, elapsed_ms, "answered");
        });
        match result {
            Ok(response) => Ok(Response::new(to_proto(response))),
            Err(err) => Err(span.in_scope(|| error_status(&self.infer, err))),
        }
    }
}

/// Logs and counts `err`, and makes it a status with the `error-type` metadata (the
/// `x-request-id` comes from [`RequestIdLayer`]).
fn error_status(infer: &Infer, err: ApiError) -> Status {
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

fn from_proto(request: proto::TranslateRequest) -> Result<TranslateRequest, ApiError> {
    let target_length = match request.target_length {
        None => None,
        Some(ProtoTargetLength::Tokens(n)) => Some(TargetLength::Tokens(n as usize)),
        Some(ProtoTargetLength::Mode(mode)) => match TargetLengthMode::try_from(mode) {
            Ok(TargetLengthMode::Source) => Some(TargetLength::Source),
            Ok(TargetLengthMode::Auto) => Some(TargetLength::Auto),
            Ok(TargetLengthMode::Unspecified) | Err(_) => {
                return Err(ApiError::InvalidRequest(format!(
                    "target_length.mode {mode} is not SOURCE (1) or AUTO (2)"
                )))
            }
        },
    };
    let mode = match proto::LengthMode::try_from(request.length_mode) {
        Ok(proto::LengthMode::Unspecified | proto::LengthMode::Soft) => LengthMode::Soft,
        Ok(proto::LengthMode::Exact) => LengthMode::Exact,
        Err(_) => {
            return Err(ApiError::InvalidRequest(format!(
                "length_mode {} is not SOFT (1) or EXACT (2)",
                request.length_mode
            )))
        }
    };
    Ok(TranslateRequest {
        texts: request.text,
        model: request.model,
        length: LengthRequest {
            target: target_length,
            mode,
            max_chars: request.max_chars.map(|n| n as usize),
        },
        no_repeat_ngram_size: request.no_repeat_ngram_size.map(|n| n as usize),
    })
}

fn to_proto(response: TranslateResponse) -> proto::TranslateResponse {
    // Counts are bounded by the request limits; saturate rather than wrap all the same.
    let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
    proto::TranslateResponse {
        model: response.model,
        translations: response
            .translations
            .into_iter()
            .map(|t| proto::Translation {
                text: t.text,
                source_tokens: count(t.source_tokens),
                output_tokens: count(t.output_tokens),
                target_length: t.target_length.map(count),
                length_source: t
                    .length_source
                    .map_or(proto::LengthSource::Unspecified, |s| match s {
                        LengthSource::Request => proto::LengthSource::Request,
                        LengthSource::Source => proto::LengthSource::Source,
                        LengthSource::Predictor => proto::LengthSource::Predictor,
                        LengthSource::LinearFit => proto::LengthSource::LinearFit,
                        LengthSource::MaxChars => proto::LengthSource::MaxChars,
                    }) as i32,
                predicted_length: t.predicted_length,
                length_mode: t
                    .length_mode
                    .map_or(proto::LengthMode::Unspecified, |m| match m {
                        LengthMode::Soft => proto::LengthMode::Soft,
                        LengthMode::Exact => proto::LengthMode::Exact,
                    }) as i32,
                truncated: t.truncated,
            })
            .collect(),
    }
}

/// The error for a call tonic refused before the handler ran, from tonic's own status.
fn rejection(status: &Status, path: &str, max_body_bytes: usize) -> ApiError {
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
struct Rejections<S> {
    inner: S,
    infer: Infer,
}

impl Rejections<()> {
    fn layer<S>(infer: Infer) -> impl tower::Layer<S, Service = Rejections<S>> + Clone {
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
    fn target_lengths_convert() {
        let request = |target_length| proto::TranslateRequest {
            text: vec!["a".into(), "b".into()],
            model: Some("m".into()),
            target_length,
            ..Default::default()
        };
        for (proto, expected) in [
            (None, None),
            (
                Some(ProtoTargetLength::Tokens(7)),
                Some(TargetLength::Tokens(7)),
            ),
            (
                Some(ProtoTargetLength::Mode(TargetLengthMode::Source as i32)),
                Some(TargetLength::Source),
            ),
            (
                Some(ProtoTargetLength::Mode(TargetLengthMode::Auto as i32)),
                Some(TargetLength::Auto),
            ),
        ] {
            let converted = from_proto(request(proto)).unwrap();
            assert_eq!(converted.texts, ["a", "b"]);
            assert_eq!(converted.model.as_deref(), Some("m"));
            assert_eq!(converted.length.target, expected);
            assert_eq!(converted.length.mode, LengthMode::Soft);
        }
        for mode in [TargetLengthMode::Unspecified as i32, 9] {
            let err = from_proto(request(Some(ProtoTargetLength::Mode(mode)))).unwrap_err();
            assert_eq!(err.error_type(), "invalid_request", "{mode}");
        }
        let exact = proto::TranslateRequest {
            length_mode: proto::LengthMode::Exact as i32,
            max_chars: Some(42),
            ..request(None)
        };
        let converted = from_proto(exact).unwrap().length;
        assert_eq!(
            (converted.mode, converted.max_chars),
            (LengthMode::Exact, Some(42))
        );
        let bad = proto::TranslateRequest {
            length_mode: 7,
            ..request(None)
        };
        assert_eq!(from_proto(bad).unwrap_err().error_type(), "invalid_request");
    }

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
