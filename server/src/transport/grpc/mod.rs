//! The gRPC API: service `nmt.v1.Translator` of `proto/translate.proto`, over tonic.
//!
//! Like the HTTP API, it only converts its wire types to and from those of the service
//! ([`convert`]). Every call gets a request id ([`request_id`], the rule of the HTTP API, from
//! the same layer), runs in a span carrying it, and returns it in the `x-request-id`
//! metadata. Errors are [`ApiError`]s: the status code is
//! [`ApiError::grpc_code`], the message is the JSON API's `error` text, the `error-type`
//! metadata its `error_type`, and each one is counted in `nmt_errors_total`.
//!
//! Requests tonic rejects before the handler (a message over `--max-body-bytes`, an
//! undecodable message, an unknown method) are turned into the same kind of error by the
//! layer [`serve`] puts in front of the service ([`rejections`]).

pub mod convert;
pub mod proto;
pub mod rejections;
pub mod status;

use std::future::Future;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use tokio_util::sync::CancellationToken;
use tonic::{Code, Request, Response, Status};
use tracing::Instrument;

use crate::service::{ApiError, Infer};
use crate::transport::connections::{self, ConnectionGate};
use crate::transport::request_id::{self, RequestId, RequestIdLayer};
use convert::{from_proto, to_proto};
use proto::translator_server::{Translator, TranslatorServer};
use rejections::Rejections;
use status::error_status;

pub use status::ERROR_TYPE;

/// Metadata key of the request id, in requests and responses ([`request_id`]).
pub const REQUEST_ID: &str = request_id::HEADER;

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
