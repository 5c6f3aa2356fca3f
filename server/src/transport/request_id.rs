//! The request id, one rule for HTTP and gRPC: the client's `x-request-id` when it is short
//! printable ASCII, otherwise a new UUID.
//!
//! [`RequestIdLayer`] sits in front of both APIs (the axum router of `http::app` and the
//! tonic server of `grpc::serve_with`): it gives each request its id once, in the
//! request's extensions where the handlers and the other layers read it for their spans, and
//! returns it in the `x-request-id` header of the answer (for gRPC, the response metadata of an
//! answer and of an error status alike).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::http::{self, HeaderMap, HeaderValue};

/// The header (gRPC: metadata key) carrying the id, in requests and answers.
pub const HEADER: &str = "x-request-id";

/// Longest id a client may choose.
pub const MAX_LEN: usize = 128;

/// A request's id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestId(String);

impl RequestId {
    /// `sent` when it is an id a client may choose (1 to [`MAX_LEN`] printable ASCII
    /// characters, no spaces), otherwise a new UUID.
    pub fn from_client(sent: Option<&str>) -> Self {
        let id = sent
            .filter(|id| {
                !id.is_empty() && id.len() <= MAX_LEN && id.bytes().all(|b| b.is_ascii_graphic())
            })
            .map(str::to_string)
            .unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
        RequestId(id)
    }

    /// The id for a request with these headers.
    pub fn from_headers(headers: &HeaderMap) -> Self {
        RequestId::from_client(headers.get(HEADER).and_then(|v| v.to_str().ok()))
    }

    /// The id [`RequestIdLayer`] gave the request; a request that did not pass through it
    /// (a service used without the layer) gets one by the same rule.
    pub fn of(extensions: &http::Extensions, headers: &HeaderMap) -> Self {
        extensions
            .get::<RequestId>()
            .cloned()
            .unwrap_or_else(|| RequestId::from_headers(headers))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Gives every request its [`RequestId`] and puts it in the answer's `x-request-id` header.
#[derive(Clone, Copy, Debug, Default)]
pub struct RequestIdLayer;

impl<S> tower::Layer<S> for RequestIdLayer {
    type Service = RequestIdService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RequestIdService { inner }
    }
}

/// The service [`RequestIdLayer`] wraps around another.
#[derive(Clone, Debug)]
pub struct RequestIdService<S> {
    inner: S,
}

impl<S, ReqBody, ResBody> tower::Service<http::Request<ReqBody>> for RequestIdService<S>
where
    S: tower::Service<http::Request<ReqBody>, Response = http::Response<ResBody>>,
    S::Future: Send + 'static,
{
    type Response = http::Response<ResBody>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<ReqBody>) -> Self::Future {
        let id = RequestId::from_headers(request.headers());
        // The rule admits only visible ASCII, which is always a valid header value.
        let value = HeaderValue::from_str(id.as_str()).ok();
        request.extensions_mut().insert(id);
        let answer = self.inner.call(request);
        Box::pin(async move {
            let mut response = answer.await?;
            if let Some(value) = value {
                response.headers_mut().insert(HEADER, value);
            }
            Ok(response)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clients_id_is_kept_only_when_it_is_short_printable_ascii() {
        assert_eq!(
            RequestId::from_client(Some("client-7")).as_str(),
            "client-7"
        );
        let longest = "x".repeat(MAX_LEN);
        assert_eq!(RequestId::from_client(Some(&longest)).as_str(), longest);
        let too_long = "x".repeat(MAX_LEN + 1);
        for bad in [
            None,
            Some(""),
            Some("has space"),
            Some("tab\t"),
            Some(&*too_long),
        ] {
            let made = RequestId::from_client(bad);
            assert!(
                uuid::Uuid::parse_str(made.as_str()).is_ok(),
                "{bad:?}: {made}"
            );
        }
    }

    #[tokio::test]
    async fn the_layer_gives_the_request_its_id_and_returns_it() {
        use tower::{Layer, ServiceExt};
        let seen = std::sync::Arc::new(std::sync::Mutex::new(None));
        let record = seen.clone();
        let inner = tower::service_fn(move |request: http::Request<()>| {
            let record = record.clone();
            async move {
                *record.lock().unwrap() = request.extensions().get::<RequestId>().cloned();
                Ok::<_, std::convert::Infallible>(http::Response::new(()))
            }
        });
        let service = RequestIdLayer.layer(inner);
        let request = http::Request::builder()
            .header(HEADER, "abc-1")
            .body(())
            .unwrap();
        let response = service.clone().oneshot(request).await.unwrap();
        assert_eq!(response.headers()[HEADER], "abc-1");
        assert_eq!(seen.lock().unwrap().as_ref().unwrap().as_str(), "abc-1");

        let request = http::Request::builder()
            .header(HEADER, "not ok")
            .body(())
            .unwrap();
        let response = service.oneshot(request).await.unwrap();
        let made = response.headers()[HEADER].to_str().unwrap().to_string();
        assert!(uuid::Uuid::parse_str(&made).is_ok(), "{made}");
        assert_eq!(seen.lock().unwrap().as_ref().unwrap().as_str(), made);
    }
}
