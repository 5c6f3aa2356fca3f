//! hyper's own answers to request heads it cannot parse, put in the API's error shape: the one
//! place that depends on the bytes hyper writes.
//!
//! Checked against hyper 1.12.0 (`Cargo.lock`). hyper answers a head it cannot parse itself,
//! before any service runs and with no hook to change it: 400 (request line or a header field),
//! 414 (a target over 65534 bytes) or 431 (over 100 header fields, or a head of about 400 KB),
//! each as a status line, `connection: close`, `content-length: 0` and a date, and nothing
//! else. [`HyperAnswers`] watches the socket's writes for exactly that answer and sends the
//! API's JSON error in its place, and counts it. Should a later hyper write those answers
//! differently, they go out unchanged and uncounted, and
//! `connections::tests::malformed_heads_are_answered_in_the_error_shape_and_counted` fails.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::metrics::Metrics;
use crate::service::ApiError;
use crate::transport::error::ErrorBody;

/// A connection's socket whose writes are watched for hyper's answers to unparsable heads.
pub struct HyperAnswers<S> {
    inner: S,
    /// The replacement of such an answer, and how much of it has been sent.
    rewritten: Option<(Vec<u8>, usize)>,
    metrics: Arc<Metrics>,
}

impl<S> HyperAnswers<S> {
    pub fn new(inner: S, metrics: Arc<Metrics>) -> Self {
        HyperAnswers {
            inner,
            rewritten: None,
            metrics,
        }
    }
}

/// How every answer that [`framing_error`] may stand for begins.
const CLIENT_ERROR: &[u8] = b"HTTP/1.1 4";

/// The error hyper's automatic answer starting `bytes` stands for, if it is one. hyper answers
/// a head it cannot parse with a status line, `connection: close`, `content-length: 0` and a
/// date, and nothing else; every answer of the app has a body and an `x-request-id`.
fn framing_error(bytes: &[u8]) -> Option<ApiError> {
    let end = bytes.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    let head = std::str::from_utf8(&bytes[..end]).ok()?;
    let status = head.strip_prefix("HTTP/1.1 ")?.get(..3)?;
    let lines: Vec<&str> = head
        .split("\r\n")
        .skip(1)
        .filter(|l| !l.is_empty())
        .collect();
    let automatic = lines.iter().all(|line| {
        let name = line.split(':').next().unwrap_or_default();
        matches!(name, "connection" | "content-length" | "date")
    }) && lines.contains(&"content-length: 0");
    if !automatic {
        return None;
    }
    match status {
        "400" => Some(ApiError::MalformedRequest(
            "the request head is not valid HTTP/1.1 (request line or a header field)".into(),
        )),
        "414" => Some(ApiError::UriTooLong(
            "the request target is longer than 65534 bytes".into(),
        )),
        "431" => Some(ApiError::HeadersTooLarge(
            "the request head has more than 100 header fields or is larger than about 400 KB"
                .into(),
        )),
        _ => None,
    }
}

/// `error` as a complete HTTP/1.1 answer that closes the connection, with hyper's `date`.
fn framing_answer(error: &ApiError, hyper_head: &[u8]) -> Vec<u8> {
    let status = error.status();
    let body = serde_json::to_vec(&ErrorBody {
        error: error.to_string(),
        error_type: error.error_type().to_string(),
    })
    .expect("the error body serializes");
    let date = std::str::from_utf8(hyper_head)
        .ok()
        .and_then(|head| head.split("\r\n").find(|l| l.starts_with("date: ")))
        .map(|line| format!("{line}\r\n"))
        .unwrap_or_default();
    let mut answer = format!(
        "HTTP/1.1 {} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
         connection: close\r\n{date}\r\n",
        status.as_str(),
        status.canonical_reason().unwrap_or_default(),
        body.len()
    )
    .into_bytes();
    answer.extend_from_slice(&body);
    answer
}

impl<S: AsyncWrite + Unpin> HyperAnswers<S> {
    /// Sends what is left of a rewritten answer.
    fn poll_rewritten(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while let Some((answer, sent)) = &mut self.rewritten {
            if *sent == answer.len() {
                self.rewritten = None;
                break;
            }
            match Pin::new(&mut self.inner).poll_write(cx, &answer[*sent..]) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Poll::Ready(Ok(n)) => *sent += n,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
        Poll::Ready(Ok(()))
    }

    /// When `buf` starts hyper's answer to an unparsable head, takes all of it (so hyper
    /// counts it sent) and sends the API's answer instead.
    fn poll_write_head(&mut self, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        std::task::ready!(self.poll_rewritten(cx))?;
        let Some(error) = framing_error(buf) else {
            return Pin::new(&mut self.inner).poll_write(cx, buf);
        };
        tracing::debug!(
            error_type = error.error_type(),
            status = error.status().as_u16(),
            "{error}"
        );
        self.metrics.record_error(error.error_type());
        self.rewritten = Some((framing_answer(&error, buf), 0));
        // Pending here only means the socket is full: flushing finishes the answer.
        if let Poll::Ready(Err(e)) = self.poll_rewritten(cx) {
            return Poll::Ready(Err(e));
        }
        Poll::Ready(Ok(buf.len()))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for HyperAnswers<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if buf.starts_with(CLIENT_ERROR) {
            return self.poll_write_head(cx, buf);
        }
        std::task::ready!(self.poll_rewritten(cx))?;
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        // hyper encodes a head into one buffer: the first non-empty one decides.
        if let Some(first) = bufs.iter().find(|b| !b.is_empty()) {
            if first.starts_with(CLIENT_ERROR) {
                return self.poll_write_head(cx, first);
            }
        }
        std::task::ready!(self.poll_rewritten(cx))?;
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        std::task::ready!(self.poll_rewritten(cx))?;
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        std::task::ready!(self.poll_rewritten(cx))?;
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for HyperAnswers<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}
