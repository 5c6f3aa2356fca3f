//! The request body, read whole before the handler and parsed as JSON, with every way that can
//! fail answered as an [`ApiError`].

use std::time::Duration;

use axum::body::{Body, HttpBody};
use axum::extract::{FromRequest, Request, State};
use axum::http::{header, HeaderValue};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use tokio_util::sync::CancellationToken;

use crate::service::{ApiError, Infer};
use crate::transport::error::ErrorType;

#[derive(Clone, Copy, Debug)]
pub struct BodyLimits {
    pub max_bytes: usize,
    pub read_timeout: Duration,
}

/// Cancelled when the server begins to shut down; the HTTP accept loop puts it on every
/// request it reads. A body still on its way then is not waited for: its request is not in
/// flight yet (a translation only starts once the body is in, and would be refused as the
/// server is no longer ready), and a client that stalls mid-body would hold the shutdown for
/// the whole grace.
#[derive(Clone, Debug)]
pub struct Draining(pub CancellationToken);

/// Reads the whole body before the handler runs, so that a client sending it slowly or not at
/// all gets a 408 and frees its connection (the request timeout only starts once the request
/// is in), and refuses a body that its `Content-Length` declares over the limit before reading
/// a byte of it.
pub async fn read_body(State(limits): State<BodyLimits>, request: Request, next: Next) -> Response {
    let too_large = || {
        closing(ApiError::PayloadTooLarge(format!(
            "request body is larger than the limit of {} bytes",
            limits.max_bytes
        )))
    };
    if let Some(codings) = foreign_transfer_codings(request.headers()) {
        // hyper decodes the chunked framing and hands the rest over as it came: a `gzip`
        // body would be read as JSON and answered `invalid_json`, blaming the client's JSON.
        return closing(ApiError::UnsupportedTransferEncoding(format!(
            "Transfer-Encoding `{codings}` is not supported: send the body as is, with \
             Content-Length or `Transfer-Encoding: chunked`"
        )));
    }
    // hyper's lower bound is the declared `Content-Length` (0 for a chunked body).
    if request.body().size_hint().lower() > limits.max_bytes as u64 {
        return too_large();
    }
    let draining = request.extensions().get::<Draining>().cloned();
    let (parts, body) = request.into_parts();
    let body = Limited::new(body, limits.max_bytes).collect();
    let read = tokio::select! {
        // A body that is in is read, whatever else is happening.
        biased;
        read = tokio::time::timeout(limits.read_timeout, body) => read,
        () = shutting_down(draining) => {
            return closing(ApiError::NotReady(
                "the server is shutting down and the request body was not complete; retry \
                 (another instance, or this one once it is back)"
                    .into(),
            ));
        }
    };
    match read {
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

/// Completes when the server begins to shut down; never for a request that did not come
/// through the accept loop (in-process callers of the app).
async fn shutting_down(draining: Option<Draining>) {
    match draining {
        Some(Draining(token)) => token.cancelled_owned().await,
        None => std::future::pending().await,
    }
}

/// The request's transfer codings, joined, when any is other than `chunked`.
fn foreign_transfer_codings(headers: &axum::http::HeaderMap) -> Option<String> {
    let values: Vec<&str> = headers
        .get_all(header::TRANSFER_ENCODING)
        .iter()
        .map(|v| v.to_str().unwrap_or("?"))
        .collect();
    let foreign = values
        .iter()
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .any(|coding| !coding.is_empty() && !coding.eq_ignore_ascii_case("chunked"));
    foreign.then(|| values.join(", "))
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
pub fn closing(error: ApiError) -> Response {
    let mut response = error.into_response();
    response
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
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
