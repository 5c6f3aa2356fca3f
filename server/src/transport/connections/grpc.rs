//! gRPC connections: tonic's HTTP/2, under the same cap, with a deadline for the preface.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Sleep;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tonic::transport::server::{Connected, TcpConnectInfo};

use super::forward::forward_writes;
use super::gate::{Accepted, ConnectionGate};

/// The client's HTTP/2 connection preface, `PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n`.
const HTTP2_PREFACE_BYTES: usize = 24;

/// gRPC connections for tonic's `serve_with_incoming_shutdown`, accepted under `gate`. The
/// listener closes when tonic drops the stream (it stops accepting on shutdown).
pub fn grpc_incoming(
    listener: TcpListener,
    gate: ConnectionGate,
    preface_timeout: Duration,
    shutdown: CancellationToken,
) -> ReceiverStream<io::Result<GrpcConnection>> {
    let (sender, receiver) = tokio::sync::mpsc::channel(1);
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                accepted = gate.accept(&listener) => accepted,
                () = sender.closed() => break,
            };
            let connection = GrpcConnection::new(accepted, preface_timeout, shutdown.clone());
            if sender.send(Ok(connection)).await.is_err() {
                break;
            }
        }
    });
    ReceiverStream::new(receiver)
}

/// A gRPC connection: its slot under the cap, and until the HTTP/2 preface is in, a deadline
/// for it (HTTP/2 has no header-read timeout of its own, and tonic's graceful shutdown waits
/// for a connection's handshake to finish).
pub struct GrpcConnection {
    stream: TcpStream,
    preface: Option<PrefaceDeadline>,
    _permit: OwnedSemaphorePermit,
}

struct PrefaceDeadline {
    left: usize,
    sleep: Pin<Box<Sleep>>,
    shutdown: Pin<Box<WaitForCancellationFutureOwned>>,
}

impl GrpcConnection {
    fn new(accepted: Accepted, timeout: Duration, shutdown: CancellationToken) -> Self {
        GrpcConnection {
            stream: accepted.stream,
            preface: Some(PrefaceDeadline {
                left: HTTP2_PREFACE_BYTES,
                sleep: Box::pin(tokio::time::sleep(timeout)),
                shutdown: Box::pin(shutdown.cancelled_owned()),
            }),
            _permit: accepted.permit,
        }
    }
}

impl Connected for GrpcConnection {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.stream.connect_info()
    }
}

impl AsyncRead for GrpcConnection {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.stream).poll_read(cx, buf);
        let Some(preface) = &mut this.preface else {
            return polled;
        };
        match polled {
            Poll::Ready(Ok(())) => {
                preface.left = preface.left.saturating_sub(buf.filled().len() - before);
                if preface.left == 0 {
                    this.preface = None;
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending
                if preface.sleep.as_mut().poll(cx).is_ready()
                    || preface.shutdown.as_mut().poll(cx).is_ready() =>
            {
                Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "no HTTP/2 connection preface within the header read timeout",
                )))
            }
            other => other,
        }
    }
}

forward_writes!(GrpcConnection);
